"""How many CPU threads torch may use for a run, chosen so that it does not oversubscribe.

torch starts as many intra-op threads as the machine has cores, whoever else is using them.
On a shared machine that is the slow choice: the threads of one operation wait for each other
at every barrier, and a thread whose core is taken waits for the scheduler. Measured on a
2-core machine with another job running: a non-private run took 243.6 s with torch's default
and 32.4 s with one thread (7.3x), 100 Adam steps at batch 1,024 26x, and WALR's release
13-20 s instead of 0.7-0.85 s. The models trained here are small (embeddings and a few
hundred hidden units), so an extra thread buys little even on an idle machine.

``"auto"`` (the default of every training command and entry point):

1. ``OMP_NUM_THREADS``, when the environment sets it: the operator's choice;
2. otherwise the CPUs this process may run on (its affinity mask, and a cgroup CPU quota,
   as containers set) less the threads other work is running on them now (the kernel's
   count of runnable threads, median of 10 readings over 0.1 s, less this one), and at
   least one. Not the load averages: they remember the last minute, this process's own
   work included, and kept ``auto`` at one thread on an idle 2-core machine right after a
   run.

An explicit count is used as given. Threads change only speed (and, through the order of
floating-point sums, the last bits of a model): never what a plan accounts.
"""

from __future__ import annotations

import os
from contextlib import contextmanager

import torch

from budgetplan.errors import InvalidParameterError
from budgetplan.limits import MAX_THREADS
from budgetplan.util.cpus import available_cpus, busy_elsewhere, free_cpus

__all__ = ["available_cpus", "auto_threads", "busy_elsewhere", "resolve_threads", "torch_threads"]


def auto_threads(*, cpus: int | None = None, busy: float | None = None, environ=os.environ) -> int:
    """The ``"auto"`` rule (module docstring); ``cpus`` and ``busy`` (threads runnable besides
    this one) default to this machine's now."""
    given = environ.get("OMP_NUM_THREADS", "").strip()
    if given.isdigit() and int(given) >= 1:
        return min(int(given), MAX_THREADS)
    return free_cpus(cpus=cpus, busy=busy)


def resolve_threads(threads: int | str | None) -> int:
    """An explicit thread count, or ``"auto"`` (None too) resolved by ``auto_threads``."""
    if threads is None or threads == "auto":
        return auto_threads()
    if isinstance(threads, str):
        if not threads.strip().isdigit():
            raise InvalidParameterError(f'threads must be a positive integer or "auto", got {threads!r}')
        threads = int(threads)
    if isinstance(threads, bool) or not isinstance(threads, int) or not 1 <= threads <= MAX_THREADS:
        raise InvalidParameterError(f'threads must be an integer in [1, {MAX_THREADS}] or "auto", got {threads!r}')
    return threads


@contextmanager
def torch_threads(threads: int | str | None):
    """Run the block with torch's intra-op threads set to ``threads`` (resolved); restore after.

    Yields the count used. A library call leaves the caller's process as it found it.
    """
    count = resolve_threads(threads)
    before = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield count
    finally:
        torch.set_num_threads(before)
