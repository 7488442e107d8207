"""Pure-Python reference of ``core_ext.records``, the oracle of its differential tests.

Built on what a consumer receives: `Entry.decode` (the stored header) and
`pyengine.client.message.decode_entry` (Pulsar metadata, batches, ZLIB), so the compiled
decoder is checked against the consumer's own view of every message, one dict per row.
"""

from __future__ import annotations

import numpy as np

from pyengine.client.message import decode_entry
from pyengine.protocol.pulsar_api_pb2 import MessageMetadata
from pyengine.storage.entry import Entry, split_headers_and_payload
from pyengine_kernels import Position

_U64 = 1 << 64


def _signed(value: int) -> int:
    return value - _U64 if value >= 1 << 63 else value


def entry_headers(values):
    entries = [Entry.decode(Position(0, 0), value) for value in values]
    return (np.array([e.marker_type for e in entries], np.int32),
            np.array([e.txn_most for e in entries], np.int64),
            np.array([e.txn_least for e in entries], np.int64),
            np.array([e.num_messages for e in entries], np.int32),
            np.array([e.publish_time for e in entries], np.int64))


def _is_chunk(entry: Entry) -> bool:
    """One chunk of a chunked message: left to the caller (no row). Malformed metadata is not
    (the consumer's decoder then says what is wrong)."""
    try:
        metadata, _payload = split_headers_and_payload(entry.data)
        return MessageMetadata.FromString(metadata).num_chunks_from_msg > 1
    except Exception:
        return False


def chunk_indices(values, keep=None) -> list[int]:
    return [i for i, value in enumerate(values)
            if (keep is None or keep[i]) and _is_chunk(Entry.decode(Position(0, 0), value))]


def decode_entries(ledger_ids, entry_ids, values, keep=None) -> list[dict]:
    rows = []
    for i, (ledger, entry_id, value) in enumerate(zip(ledger_ids, entry_ids, values)):
        if keep is not None and not keep[i]:
            continue
        position = Position(int(ledger), int(entry_id))
        entry = Entry.decode(position, value)
        if _is_chunk(entry):
            continue
        transactional = entry.txn_most >= 0 and entry.txn_least >= 0
        for message in decode_entry("t", position, entry.data):
            rows.append({
                "ledger_id": position.ledger_id,
                "entry_id": position.entry_id,
                "batch_index": message.message_id.batch_index,
                "publish_time": message.publish_time * 1000,
                "event_time": message.event_time * 1000 if message.event_time else None,
                "key": message.partition_key,
                "value": message.data,
                "properties": message.properties,
                "producer_name": message.producer_name,
                "sequence_id": _signed(message.sequence_id),
                "txnid_most": entry.txn_most if transactional else None,
                "txnid_least": entry.txn_least if transactional else None,
                "is_marker": entry.is_marker,
            })
    return rows
