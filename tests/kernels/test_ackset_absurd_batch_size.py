"""Ack-set results that grow with the batch size refuse a size no batch can have.

A batch is one entry, which Pulsar's maxMessageSize (a Java int) keeps under 2 GiB, and each of
its messages takes 6 bytes at least: a batch holds (2**31 - 1) // 6 messages at most. The
kernels took any Java int, so `ackset_acked_indexes([], 2**31 - 1)` (every index of an empty
ack set is acked) collected 2**31 ints: under a memory limit the failed allocation aborted the
process (the broker's, for a batch_size a client sent in an ack).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import pyengine_kernels as k

MAX_BATCH_SIZE = (2**31 - 1) // 6


@pytest.mark.parametrize("call", [lambda size: k.ackset_acked_indexes([], size), k.ackset_new],
                         ids=["ackset_acked_indexes", "ackset_new"])
def test_a_batch_size_no_batch_can_have_is_a_value_error(call):
    for size in (MAX_BATCH_SIZE + 1, 2**31 - 1):
        with pytest.raises(ValueError, match=f"batch_size {size} .*at most {MAX_BATCH_SIZE}"):
            call(size)


def test_the_largest_batch_is_taken():
    unacked = k.ackset_new(MAX_BATCH_SIZE)
    assert len(unacked) == -(-MAX_BATCH_SIZE // 64)
    assert k.ackset_acked_indexes(unacked, MAX_BATCH_SIZE) == []
    assert k.ackset_acked_indexes(unacked[:-1], MAX_BATCH_SIZE) == list(range(64 * (len(unacked) - 1), MAX_BATCH_SIZE))


# A child whose address space is capped at 1 GiB: there the old kernels aborted (SIGABRT).
_CHILD = """
import resource
resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))
import pyengine_kernels as k
for call, size in [(k.ackset_acked_indexes, 2**31 - 1), (k.ackset_new, 2**31 - 1),
                   (k.ackset_acked_indexes, (2**31 - 1) // 6)]:
    try:
        call(*([[], size] if call is k.ackset_acked_indexes else [size]))
        print("allocated")
    except (ValueError, MemoryError) as exc:
        print(type(exc).__name__)
"""


def test_absurd_batch_sizes_raise_instead_of_aborting_under_a_memory_limit():
    """Up to the bound, acked indexes that do not fit in memory are a MemoryError too."""
    child = subprocess.run([sys.executable, "-c", _CHILD], capture_output=True, text=True, timeout=120,
                           cwd=Path(__file__).resolve().parents[2])
    assert child.returncode == 0, child.stderr[-2000:]
    assert child.stdout.split() == ["ValueError", "ValueError", "MemoryError"]
