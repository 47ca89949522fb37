"""Keep freed heap memory for reuse on CPU, so that tensors stop paying for page faults.

With glibc's defaults, a freed block of more than 128 KiB (the threshold then grows with what is
freed, up to 32 MiB) goes back to the operating system, by ``munmap`` or by trimming the top of
the heap. A training step allocates and frees the same few-MiB activations hundreds of times, so
the next allocation of each faults its pages in again and the kernel zeroes them: on ML-1M with
the paper's SASRec settings, one thread, a process that loads the data and trains 42 steps had
110,000 to 408,000 page faults (the count moves from one process to the next) against about
100,000 with this setting, which takes about 5% off a step's CPU time (no measurable change on
two threads; see docs/results/speed.md). Here blocks up to 32 MiB come from the heap and
freed memory stays in it: a step reuses the pages it faulted in once. (PyTorch's CPU tuning
guide gets the same by preloading jemalloc or tcmalloc.) The price is that the process keeps
its peak heap until it exits.

Nothing is changed when the C library is not glibc, or when the user has chosen glibc's
settings through ``MALLOC_MMAP_THRESHOLD_``, ``MALLOC_TRIM_THRESHOLD_`` or ``GLIBC_TUNABLES``
(the memory benchmarks set them to measure live tensors).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import platform

logger = logging.getLogger(__name__)

# mallopt's parameter numbers, from glibc's malloc.h
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
# The largest mmap threshold glibc accepts on 64-bit systems (DEFAULT_MMAP_THRESHOLD_MAX).
_MMAP_THRESHOLD = 32 << 20
# Free memory at the top of the heap is returned only beyond this much.
_TRIM_THRESHOLD = 1 << 30

_USER_SETTINGS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "GLIBC_TUNABLES")

_applied: bool | None = None


def keep_freed_memory() -> bool:
    """Tell glibc's malloc to keep freed blocks for reuse; True when it is in effect.

    Idempotent; the first call decides for the process.
    """
    global _applied
    if _applied is None:
        _applied = _apply()
    return _applied


def _apply() -> bool:
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    chosen = [name for name in _USER_SETTINGS if name in os.environ]
    if chosen:
        logger.debug("malloc left as configured by %s", ", ".join(chosen))
        return False
    path = ctypes.util.find_library("c")
    if path is None:
        return False
    mallopt = ctypes.CDLL(path).mallopt
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    # mallopt returns 1 on success, 0 on error
    applied = bool(mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD)) and bool(
        mallopt(_M_TRIM_THRESHOLD, _TRIM_THRESHOLD)
    )
    if not applied:
        logger.debug("glibc refused the malloc settings; left at its defaults")
    return applied
