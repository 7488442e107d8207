"""C heap settings of the long-running processes pyengine starts itself (`pyengine serve`,
`pyengine perf`); an embedding application owns its own allocator, as it owns its collector."""

from __future__ import annotations

import ctypes
import ctypes.util
import os

M_TRIM_THRESHOLD = -1      # glibc's mallopt parameter (malloc.h)

# Freed memory at the top of the heap that glibc keeps instead of giving it back to the kernel.
# Its default (128 KiB, moved with the sizes it sees) suits a process whose heap grows once;
# a broker's heap rises and falls with every transaction (entries of ~100 KiB, their frames,
# futures and records), so it gave pages back and faulted them in again: ~28 page faults per
# transaction of 100 messages in the broker (and ~15 in the load generator), ~50 us of kernel
# time each transaction, against ~1 with the memory kept.
HEAP_TRIM_THRESHOLD = 128 * 1024 * 1024


def keep_freed_heap(threshold: int = HEAP_TRIM_THRESHOLD) -> bool:
    """Keep up to `threshold` bytes of freed heap for reuse; True if it took effect (glibc,
    and GLIBC_TUNABLES does not set the threshold itself: the operator's setting wins)."""
    if type(threshold) is not int or not 0 < threshold < 2**31:
        raise ValueError(f"threshold must be an int of 1 .. 2**31-1 bytes, not {threshold!r}")
    if "glibc.malloc.trim_threshold" in os.environ.get("GLIBC_TUNABLES", ""):
        return False
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        mallopt = ctypes.CDLL(name).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return bool(mallopt(M_TRIM_THRESHOLD, threshold))
