"""Rust transaction-state kernels of pyengine.

Typed façade over the compiled ``pyengine_kernels._kernels`` module; see ``_kernels.pyi``
for the documented API.
"""

from pyengine_kernels._kernels import (
    AbortedTxnSet,
    OngoingTxnMap,
    Position,
    TxnId,
    __version__,
    ackset_acked_indexes,
    ackset_and,
    ackset_andnot,
    ackset_conflicts,
    ackset_conflicts_many,
    ackset_fully_acked_many,
    ackset_is_fully_acked,
    ackset_merge_many,
    ackset_new,
    ackset_or,
    ackset_unacked_count,
    crc32c,
    visibility_mask,
)

__all__ = [
    "AbortedTxnSet",
    "OngoingTxnMap",
    "Position",
    "TxnId",
    "__version__",
    "ackset_acked_indexes",
    "ackset_and",
    "ackset_andnot",
    "ackset_conflicts",
    "ackset_conflicts_many",
    "ackset_fully_acked_many",
    "ackset_is_fully_acked",
    "ackset_merge_many",
    "ackset_new",
    "ackset_or",
    "ackset_unacked_count",
    "crc32c",
    "visibility_mask",
]
