"""`pyengine serve` / `perf` keep freed heap memory instead of returning it to the kernel and
faulting it in again (checked in fresh interpreters: the setting is process-wide)."""

import os
import subprocess
import sys

import pytest

from pyengine.cli.malloc_tuning import keep_freed_heap

# Allocates ~20 MB in 100 kB blocks (below glibc's mmap threshold: from the heap), frees them,
# and prints how much free memory is left at the top of the heap (glibc's keepcost) and in the
# whole heap (fordblks: where the heap's top lies depends on the address-space layout, which
# differs between machines; in CI, once, a mapping above the heap left only 9 MB on top).
PROBE = """
import ctypes, sys
from pyengine.cli.malloc_tuning import keep_freed_heap
applied = keep_freed_heap() if sys.argv[1] == "kept" else None
class Info(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in
                "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()]
libc = ctypes.CDLL(None)
libc.mallinfo2.restype = Info
blocks = [bytes(100_000) for _ in range(200)]
del blocks
info = libc.mallinfo2()
print(applied, info.keepcost, info.fordblks)
"""


def heap_after_free(mode: str, **env: str) -> tuple[str, int, int]:
    """(applied, free bytes at the heap's top, free bytes in the whole heap)"""
    done = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, check=True,
                          env={**os.environ, **env})
    applied, top, free = done.stdout.split()
    return applied, int(top), int(free)


def test_freed_heap_is_kept_for_reuse():
    _, default_top, _ = heap_after_free("default")
    applied, _, kept_free = heap_after_free("kept")
    assert applied == "True"
    assert default_top < 4_000_000 and kept_free > 16_000_000     # given back vs kept


def test_the_operators_glibc_tunable_wins():
    tunables = "glibc.malloc.trim_threshold=1000000"
    applied, top, _ = heap_after_free("kept", GLIBC_TUNABLES=tunables)
    assert applied == "False" and top < 4_000_000


@pytest.mark.parametrize("threshold", [0, -1, 2**31, 1.5, "1", True, None])
def test_a_threshold_out_of_range_is_refused(threshold):
    with pytest.raises(ValueError, match="threshold"):
        keep_freed_heap(threshold)
