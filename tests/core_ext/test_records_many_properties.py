"""A message's properties are put in its row in time linear in their number.

A key given twice keeps its last value (`test_records.test_a_property_key_given_twice_keeps_its_last_value`);
each pair was compared with every later one for that, so a message of 50,000 properties
(a 1 MB metadata, well under the broker's 5 MiB) took seconds to decode, at every read of its
topic.
"""

from __future__ import annotations

import time

from core_ext.batch import build_batch
from core_ext.records import decode_entries
from pyengine.protocol.commands import message_metadata
from pyengine.protocol.pulsar_api_pb2 import KeyValue, SingleMessageMetadata
from pyengine.storage.entry import encode_entry, headers_and_payload
from tests.core_ext.test_records import column_rows
from tests.reference import records as ref

COUNT = 50_000


def _pairs(columns, row=0) -> list[tuple[str, str]]:
    first, last = columns["property_offsets"][row], columns["property_offsets"][row + 1]
    (key_offsets, keys), (value_offsets, values) = columns["property_keys"], columns["property_values"]
    return [(bytes(keys[key_offsets[j]:key_offsets[j + 1]]).decode(),
             bytes(values[value_offsets[j]:value_offsets[j + 1]]).decode()) for j in range(first, last)]


def _last_of_each_key(properties: list[KeyValue]) -> list[tuple[str, str]]:
    """Each key once, with its last value, where its last pair is."""
    last = {kv.key: i for i, kv in enumerate(properties)}
    return [(kv.key, kv.value) for i, kv in enumerate(properties) if last[kv.key] == i]


def test_fifty_thousand_properties_decode_at_once():
    # Distinct keys, then some of them again: the later value wins, at the later place.
    properties = [KeyValue(key=f"key-{i}", value=f"v{i}") for i in range(COUNT)]
    properties += [KeyValue(key=f"key-{i}", value=f"again-{i}") for i in range(0, COUNT, 1000)]
    md = message_metadata("p", 1, 5, properties=properties).SerializeToString()
    single = encode_entry(headers_and_payload(md, b"v"))
    singles = [(SingleMessageMetadata(payload_size=1, properties=properties).SerializeToString(), b"x")]
    md = message_metadata("p", 1, 5, num_messages_in_batch=1).SerializeToString()
    batched = encode_entry(headers_and_payload(md, build_batch(singles)), num_messages=1)
    for value in (single, batched):
        # This thread's CPU time: ~0.1 s here, but 1.2 s of wall time on a loaded machine.
        start = time.thread_time()
        columns = decode_entries([1], [0], [value])
        elapsed = time.thread_time() - start
        assert _pairs(columns) == _last_of_each_key(properties)
        assert elapsed < 1.0, f"{elapsed:.1f} s to decode one message of {len(properties)} properties"
    assert column_rows(decode_entries([1], [0], [single])) == ref.decode_entries([1], [0], [single])
