"""The CPUs a process may use and how many other threads are running on them now.

Read by ``trainers.threads`` (torch's thread count) and ``budgetplan.planning.sweep`` (how many
calibrations run at once): never more workers than free cores.
"""

from __future__ import annotations

import math
import os
import statistics
import time
from pathlib import Path

__all__ = ["available_cpus", "busy_elsewhere", "free_cpus"]


def _cgroup_quota(root: Path = Path("/sys/fs/cgroup")) -> float | None:
    """CPUs allowed by a cgroup quota (v2 ``cpu.max``, v1 ``cpu.cfs_quota_us``), None if unlimited."""
    try:
        quota, period = (root / "cpu.max").read_text().split()[:2]
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        pass
    try:
        v1_quota = int((root / "cpu" / "cpu.cfs_quota_us").read_text())
        v1_period = int((root / "cpu" / "cpu.cfs_period_us").read_text())
        return None if v1_quota <= 0 else v1_quota / v1_period
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
    counts: list[int] = []
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


def free_cpus(*, cpus: int | None = None, busy: float | None = None) -> int:
    """The CPUs this process may use less the threads other work runs on them now, at least one;
    ``cpus`` and ``busy`` default to this machine's now (a NaN or negative ``busy`` counts as 0)."""
    cpus = available_cpus() if cpus is None else cpus
    busy = busy_elsewhere() if busy is None else busy
    if not math.isfinite(busy) or busy < 0:
        busy = 0.0
    return max(1, min(cpus, cpus - round(busy)))
