"""keep_freed_memory: large blocks come from the heap, and freeing them keeps the heap's pages."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest

from seqrec.training import cpu_allocator

GLIBC_LINUX = platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"

# In a fresh process: allocates a 20 MiB block and prints glibc's mallinfo2 counts in MiB:
# memory in blocks mapped on their own, the heap while the block is held, the heap after it
# is freed.
_ALLOCATE_AND_FREE = """
import ctypes, sys
import numpy as np
if sys.argv[1] == "keep":
    from seqrec.training.cpu_allocator import keep_freed_memory
    assert keep_freed_memory()

class MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]

mallinfo2 = ctypes.CDLL("libc.so.6").mallinfo2
mallinfo2.restype = MallInfo2
block = np.ones(5 << 20, np.float32)
held = mallinfo2()
del block
print(held.hblkhd >> 20, held.arena >> 20, mallinfo2().arena >> 20)
"""


def _allocate_and_free(mode: str) -> tuple[int, int, int]:
    env = {k: v for k, v in os.environ.items() if k not in cpu_allocator._USER_SETTINGS}
    done = subprocess.run(
        [sys.executable, "-c", _ALLOCATE_AND_FREE, mode],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    mapped, heap_held, heap_freed = (int(n) for n in done.stdout.split())
    return mapped, heap_held, heap_freed


@pytest.mark.skipif(not GLIBC_LINUX, reason="mallopt and mallinfo2 are glibc's")
def test_large_blocks_come_from_the_heap_and_stay_there() -> None:
    mapped, heap_held, _ = _allocate_and_free("default")
    assert mapped >= 20  # glibc's default: the block is mapped on its own
    assert heap_held < 20
    mapped, heap_held, heap_freed = _allocate_and_free("keep")
    assert mapped < 20  # from the heap ...
    assert heap_held >= 20
    assert heap_freed == heap_held  # ... which keeps its pages when the block is freed


def test_user_malloc_settings_are_left_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in cpu_allocator._USER_SETTINGS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "65536")
    assert cpu_allocator._apply() is False
    monkeypatch.delenv("MALLOC_MMAP_THRESHOLD_")
    assert cpu_allocator._apply() is GLIBC_LINUX
