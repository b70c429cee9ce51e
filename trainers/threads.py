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

import math
import os
from contextlib import contextmanager
from pathlib import Path

from budgetplan.errors import InvalidParameterError
from budgetplan.limits import MAX_THREADS

__all__ = ["available_cpus", "auto_threads", "resolve_threads", "torch_threads"]


def _cgroup_quota(root: Path = Path("/sys/fs/cgroup")) -> float | None:
    """CPUs allowed by a cgroup quota (v2 ``cpu.max``, v1 ``cpu.cfs_quota_us``), None if unlimited."""
    try:
        quota, period = (root / "cpu.max").read_text().split()[:2]
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        pass
    try:
        quota = int((root / "cpu" / "cpu.cfs_quota_us").read_text())
        period = int((root / "cpu" / "cpu.cfs_period_us").read_text())
        return None if quota <= 0 else quota / period
    except (OSError, ValueError):
        return None


def available_cpus(cgroup_root: Path = Path("/sys/fs/cgroup")) -> int:
    """CPUs this process may run on: its affinity mask, capped by a cgroup CPU quota."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cpus = os.cpu_count() or 1
    quota = _cgroup_quota(cgroup_root)
    if quota is not None:
        cpus = min(cpus, max(1, math.floor(quota)))
    return max(1, cpus)


def busy_elsewhere(samples: int = 10, interval: float = 0.01, path: Path = Path("/proc/loadavg")) -> float:
    """How many other threads are runnable now: the median over ``samples`` readings of the
    kernel's count of runnable threads (``/proc/loadavg``'s fourth field) less this one.

    An instantaneous count, unlike the load averages, which remember the last minute, this
    process's own work included. Without ``/proc`` (not Linux): the 1-minute load average.
    """
    import statistics
    import time

    counts = []
    for i in range(samples):
        try:
            counts.append(int(path.read_text().split()[3].split("/")[0]) - 1)
        except (OSError, ValueError, IndexError):
            break
        if i + 1 < samples:
            time.sleep(interval)
    if counts:
        return max(0.0, float(statistics.median(counts)))
    try:
        return max(0.0, os.getloadavg()[0])
    except OSError:
        return 0.0


def auto_threads(*, cpus: int | None = None, busy: float | None = None, environ=os.environ) -> int:
    """The ``"auto"`` rule (module docstring); ``cpus`` and ``busy`` (threads runnable besides
    this one) default to this machine's now."""
    given = environ.get("OMP_NUM_THREADS", "").strip()
    if given.isdigit() and int(given) >= 1:
        return min(int(given), MAX_THREADS)
    cpus = available_cpus() if cpus is None else cpus
    busy = busy_elsewhere() if busy is None else busy
    if not math.isfinite(busy) or busy < 0:
        busy = 0.0
    return max(1, min(cpus, cpus - round(busy)))


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
    import torch

    count = resolve_threads(threads)
    before = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield count
    finally:
        torch.set_num_threads(before)
