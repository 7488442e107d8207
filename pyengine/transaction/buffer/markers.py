"""Commit and abort markers: the entries that end a txn in a topic's stream (PIP-31).

A marker is stored like any message (headers and payload, metadata as Apache writes it, no
payload); the entry header repeats the marker type and txn id, which is all that recovery and
dispatch read. Markers are never delivered to consumers.
"""

from __future__ import annotations

import time

from pyengine.protocol.commands import marker_metadata
from pyengine.storage.entry import MARKER_TXN_ABORT, MARKER_TXN_COMMIT, headers_and_payload
from pyengine.transaction import TxnAction
from pyengine_kernels import TxnId

MARKER_TYPES: dict[TxnAction, int] = {TxnAction.COMMIT: MARKER_TXN_COMMIT, TxnAction.ABORT: MARKER_TXN_ABORT}


def marker_entry(action: TxnAction, txn: TxnId, publish_time: int | None = None) -> tuple[bytes, int, int]:
    """(stored message, marker type, publish time) of the marker that ends `txn` with `action`."""
    if publish_time is None:
        publish_time = time.time_ns() // 1_000_000
    marker_type = MARKER_TYPES[action]
    metadata = marker_metadata(marker_type, txn.most_bits, txn.least_bits, publish_time=publish_time)
    return headers_and_payload(metadata.SerializeToString(), b""), marker_type, publish_time
