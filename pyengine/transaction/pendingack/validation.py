"""Checks of what callers hand to a pending-ack handle: a clear TypeError / ValueError for
malformed input, and private immutable copies of what is kept (an ack set the caller mutates
later must not change a reservation: Pulsar #16032)."""

from __future__ import annotations

import operator
from collections.abc import Sequence

from pyengine.transaction.pendingack import IndividualAck
from pyengine_kernels import Position, TxnId, ackset_and, ackset_unacked_count

MAX_BATCH_SIZE = 2**31 - 1          # a Java int, as in Pulsar's batch size
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_WORD_MASK = 2**64 - 1


def check_txn(txn: object) -> TxnId:
    if not isinstance(txn, TxnId):
        raise TypeError(f"txn must be a TxnId, not {type(txn).__name__}")
    return txn


def check_entry_position(position: object, what: str = "position") -> Position:
    """A position that names an entry (ledger and entry ids >= 0)."""
    if not isinstance(position, Position):
        raise TypeError(f"{what} must be a Position, not {type(position).__name__}")
    if position.ledger_id < 0 or position.entry_id < 0:
        raise ValueError(f"{what} {position} does not name an entry (ids must be >= 0)")
    return position


def check_batch_size(batch_size: object) -> int:
    if isinstance(batch_size, bool) or not isinstance(batch_size, int):
        raise TypeError(f"batch_size must be an int, not {type(batch_size).__name__}")
    if not 1 <= batch_size <= MAX_BATCH_SIZE:
        raise ValueError(f"batch_size must be between 1 and {MAX_BATCH_SIZE}, not {batch_size}")
    return batch_size


def check_ack_set(ack_set: object, batch_size: int) -> tuple[int, ...]:
    """An ack set (set bit = index left unacknowledged) that acknowledges at least one index of
    a batch of `batch_size` and has no word or set bit beyond the batch."""
    if isinstance(ack_set, (str, bytes)) or not isinstance(ack_set, Sequence):
        raise TypeError(f"ack_set must be a sequence of int64 words, not {type(ack_set).__name__}")
    words = []
    for index, word in enumerate(ack_set):
        if isinstance(word, bool):
            raise TypeError(f"ack_set[{index}] must be an int, not bool")
        try:
            value = operator.index(word)
        except TypeError:
            raise TypeError(f"ack_set[{index}] must be an int, not {type(word).__name__}") from None
        if not _INT64_MIN <= value <= _INT64_MAX:
            raise ValueError(f"ack_set[{index}]={value} is outside the signed 64-bit range")
        words.append(value)
    needed = (batch_size + 63) // 64
    if len(words) > needed:
        raise ValueError(f"ack_set has {len(words)} words, a batch of {batch_size} needs at most {needed}")
    tail_bits = batch_size % 64
    if tail_bits and len(words) == needed and (words[-1] & _WORD_MASK) >> tail_bits:
        raise ValueError(f"ack_set has bits set at indexes >= the batch size {batch_size}")
    if ackset_unacked_count(words, batch_size) == batch_size:
        raise ValueError(f"ack_set acknowledges no index of the batch of {batch_size}")
    return tuple(ackset_and(words, words))       # trimmed of trailing zero words, as Java's


def check_individual_acks(acks: object) -> list[IndividualAck]:
    """Validated private copies of the acks of one request (at least one)."""
    if isinstance(acks, (str, bytes)) or not isinstance(acks, Sequence):
        raise TypeError(f"acks must be a list of IndividualAck, not {type(acks).__name__}")
    if not acks:
        raise ValueError("acks must name at least one position")
    checked = []
    for index, ack in enumerate(acks):
        if not isinstance(ack, IndividualAck):
            raise TypeError(f"acks[{index}] must be an IndividualAck, not {type(ack).__name__}")
        position = check_entry_position(ack.position, f"acks[{index}].position")
        batch_size = check_batch_size(ack.batch_size)
        ack_set = None if ack.ack_set is None else check_ack_set(ack.ack_set, batch_size)
        checked.append(IndividualAck(position, batch_size, ack_set))
    return checked


def check_low_watermark(low_watermark: object) -> int:
    """A coordinator's low watermark: -1 (none yet) or a txn sequence."""
    if isinstance(low_watermark, bool) or not isinstance(low_watermark, int):
        raise TypeError(f"low_watermark must be an int, not {type(low_watermark).__name__}")
    if not -1 <= low_watermark <= _INT64_MAX:
        raise ValueError(f"low_watermark must be -1 or a txn sequence >= 0, not {low_watermark}")
    return low_watermark
