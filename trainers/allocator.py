"""glibc's malloc set for training: a step's large tensors reuse freed memory instead of fresh pages.

torch's CPU tensors come from ``malloc``. glibc serves a request above its mmap threshold
(128 KiB at first, raised to the size of the largest mapped block freed, at most 32 MiB)
with a fresh ``mmap`` and returns it to the kernel on ``free``; the heap above 2x that
threshold is returned too (trimmed). A training step allocates and frees the same few
large activations and gradients every step, so every step touches fresh pages: each
4 KiB page is a page fault and a zeroed page. Measured on the attribution shape at batch
16,384 (one thread, 2-core machine, three fresh processes per setting): 8,800-16,300 page
faults per DP-SGD step and 2,100-4,800 per non-private step with glibc's defaults, 0-190 and
11-84 with the settings below; the DP-SGD step's median went from 82-100 ms to 66-70 ms, the
non-private step's from 63-67 ms to 58-63 ms.

``tune_allocator`` sets the mmap threshold to glibc's largest (32 MiB: blocks up to it come
from the heap and are reused) and the trim threshold to 1 GiB (up to 1 GiB of freed heap
stays with the process instead of going back to the kernel at every step's end). The cost:
the process keeps the memory of its largest step until it exits, where glibc would have
given some of it back between steps (in the step benchmark, the DP-SGD process's peak over the
non-private one's rose from 1.03-1.07x to 1.20-1.25x at the attribution shape, tens of MiB).

``budgetplan train``, ``budgetplan demo`` and ``budgetplan split --proxy`` call it: those
processes are ours. A Python caller opts in by calling it; library calls (``execute_plan``)
leave the allocator as they find it, since the setting lasts as long as the process. It does
nothing where ``BUDGETPLAN_ALLOCATOR=system`` (the opt-out), where the C library is not glibc,
or where the environment already sets one of glibc's threshold variables or another allocator
(glibc applied those at start: the operator's choice, as ``OMP_NUM_THREADS`` is for threads).
It also writes the two settings into the environment, so that processes started from this
one (``--nproc``'s ranks, a benchmark's children) start with them. Allocator settings change
only speed and memory, never a result.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import platform
from collections.abc import MutableMapping

from budgetplan.errors import InvalidParameterError

__all__ = ["MMAP_THRESHOLD", "TRIM_THRESHOLD", "tune_allocator"]

MMAP_THRESHOLD = 32 << 20  # glibc's largest (DEFAULT_MMAP_THRESHOLD_MAX on 64-bit)
TRIM_THRESHOLD = 1 << 30

# mallopt's parameter numbers (malloc.h) and the environment variables glibc reads at start
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
_ENV = {"MALLOC_MMAP_THRESHOLD_": MMAP_THRESHOLD, "MALLOC_TRIM_THRESHOLD_": TRIM_THRESHOLD}
_OPERATOR = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_", "MALLOC_MMAP_MAX_", "MALLOC_CONF",
             "LD_PRELOAD")


def _glibc() -> ctypes.CDLL | None:
    """The process's C library through ctypes when it is glibc, else None."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return None
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None


def tune_allocator(environ: MutableMapping[str, str] = os.environ) -> bool:
    """Set glibc's mmap and trim thresholds for training (module docstring); True when they were set.

    False, with nothing changed, where ``BUDGETPLAN_ALLOCATOR`` is ``system`` (the opt-out; any
    value but ``tuned`` and ``system`` is refused), where the C library is not glibc, or where
    ``environ`` already holds one of glibc's threshold variables (``MALLOC_MMAP_THRESHOLD_``,
    ``MALLOC_TRIM_THRESHOLD_``, ``MALLOC_TOP_PAD_``, ``MALLOC_MMAP_MAX_``) with a value other than
    ours, ``MALLOC_CONF`` or ``LD_PRELOAD`` (another allocator, or the operator's own settings).
    Calling it again is harmless.
    """
    choice = environ.get("BUDGETPLAN_ALLOCATOR", "tuned")
    if choice not in ("tuned", "system"):
        raise InvalidParameterError(f'BUDGETPLAN_ALLOCATOR must be "tuned" or "system", got {choice!r}')
    operator = any(name in environ and environ[name] != str(_ENV.get(name)) for name in _OPERATOR)
    if choice == "system" or operator:
        return False
    libc = _glibc()
    if libc is None:
        return False
    ok = bool(libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1
              and libc.mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1)
    if ok:
        for name, value in _ENV.items():
            environ[name] = str(value)
    return ok
