"""`decode_entries` trusts an entry's contents, not the message count in its stored header.

That count is what the producer claimed in its CommandSend (`num_messages`), which the broker
stores unchecked (as Pulsar does). A consumer decodes such an entry from the message itself;
the Spark data source's decoder used the claim to size its column buffers up front, so one
entry claiming 2**31 - 1 messages made every read of its topic try to allocate hundreds of GiB
(MemoryError, or the OOM killer) before the entry was even parsed.
"""

from __future__ import annotations

import subprocess
import sys
import tracemalloc
from pathlib import Path

import numpy as np

from core_ext.records import decode_entries
from pyengine.protocol.commands import message_metadata
from pyengine.storage.entry import encode_entry, headers_and_payload
from tests.reference import records as ref


def _entry(claimed: int) -> bytes:
    message = headers_and_payload(message_metadata("producer", 7, 1_700_000_000_000).SerializeToString(), b"payload")
    return encode_entry(message, num_messages=claimed)


# Run in a child whose address space is capped at 3 GiB: without the fix it fails there with a
# MemoryError instead of taking the machine's memory.
_CHILD = """
import resource, sys
resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))
import numpy as np
from core_ext.records import decode_entries
from tests.core_ext.test_records_claimed_message_count import _entry
ids = np.array([3], np.int64)
columns = decode_entries(ids, ids, [_entry(2**31 - 1)])
offsets, data = columns["value"]
print(columns["rows"], bytes(data[offsets[0]:offsets[1]]).decode())
"""


def test_an_entry_claiming_a_huge_message_count_decodes_as_its_consumer_reads_it():
    value = _entry(2**31 - 1)
    ids = np.array([3], np.int64)
    assert [m["value"] for m in ref.decode_entries(ids, ids, [value])] == [b"payload"]
    child = subprocess.run([sys.executable, "-c", _CHILD], capture_output=True, text=True, timeout=120,
                           cwd=Path(__file__).resolve().parents[2])
    assert child.returncode == 0, child.stderr[-2000:]
    assert child.stdout.split() == ["1", "payload"]


def test_buffers_follow_the_entry_sizes_not_the_claimed_counts():
    """A million claimed messages in a 100-byte entry: the buffers stay small (sized by
    100 // 6 rows at most), where the claim alone sized them at about 100 MiB."""
    values = [_entry(1_000_000), _entry(1)]
    ids = np.arange(2, dtype=np.int64)
    tracemalloc.start()
    try:
        columns = decode_entries(ids, ids, values)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert columns["rows"] == 2
    assert peak < 1 << 20, f"{peak} bytes allocated to decode two small entries"
