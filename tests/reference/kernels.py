"""Obviously-correct pure-Python models of the Rust kernels in ``pyengine_kernels``.

Used only by tests: speed is irrelevant, every rule is spelled out once, directly from the
Pulsar semantics. Positions and txn ids are plain ``(int, int)`` tuples; ack sets are Python
ints used as bitsets (bit i set = index i still unacked).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

INT64_MAX = 2**63 - 1
WORD_BITS = 64

Pos = tuple[int, int]
Txn = tuple[int, int]


def prev(position: Pos) -> Pos:
    ledger, entry = position
    if entry == -1:
        raise ValueError("no previous position")
    return (ledger, entry - 1)


class OngoingTxnMap:
    """txn -> first position; the lowest found by scanning in sorted order."""

    def __init__(self) -> None:
        self.first: dict[Txn, Pos] = {}

    def add(self, txn: Txn, position: Pos) -> bool:
        if txn in self.first:
            return False
        self.first[txn] = position
        return True

    def remove(self, txn: Txn) -> Pos | None:
        return self.first.pop(txn, None)

    def items(self) -> list[tuple[Txn, Pos]]:
        return sorted(self.first.items(), key=lambda item: (item[1], item[0]))

    def lowest(self) -> tuple[Txn, Pos] | None:
        items = self.items()
        return items[0] if items else None

    def max_read_position(self, lac: Pos) -> Pos:
        lowest = self.lowest()
        return lac if lowest is None else prev(lowest[1])


class AbortedTxnSet:
    """txn -> abort marker position."""

    def __init__(self) -> None:
        self.markers: dict[Txn, Pos] = {}

    def add(self, txn: Txn, marker: Pos) -> bool:
        if txn in self.markers:
            return False
        self.markers[txn] = marker
        return True

    def remove(self, txn: Txn) -> bool:
        return self.markers.pop(txn, None) is not None

    def contains(self, most: int | None, least: int | None) -> bool:
        return most is not None and least is not None and (most, least) in self.markers

    def trim_before(self, position: Pos) -> int:
        doomed = [txn for txn, marker in self.markers.items() if marker < position]
        for txn in doomed:
            del self.markers[txn]
        return len(doomed)

    def items(self) -> list[tuple[Txn, Pos]]:
        return sorted(self.markers.items(), key=lambda item: (item[1], item[0]))

    def since(self, position: Pos) -> AbortedTxnSet:
        kept = AbortedTxnSet()
        kept.markers = {txn: marker for txn, marker in self.markers.items() if marker >= position}
        return kept

    def update(self, other: AbortedTxnSet) -> int:
        return sum(self.add(txn, marker) for txn, marker in other.items())

    def last_marker_position(self) -> Pos | None:
        return max(self.markers.values(), default=None)

    def coordinator_ids(self) -> list[int]:
        return sorted({most for most, _ in self.markers})

    def members(self, most: int) -> list[int]:
        return sorted(least for m, least in self.markers if m == most)


# Ack sets: a Java long[] <-> a Python int (bit i of the int = bit i % 64 of word i // 64).


def words_to_int(words: Iterable[int]) -> int:
    value = 0
    for i, word in enumerate(words):
        value |= (word & (2**WORD_BITS - 1)) << (WORD_BITS * i)
    return value


def int_to_words(value: int) -> list[int]:
    """Like BitSet.toLongArray(): as many words as the highest set bit needs."""
    words = []
    while value:
        word = value & (2**WORD_BITS - 1)
        words.append(word - 2**WORD_BITS if word > INT64_MAX else word)
        value >>= WORD_BITS
    return words


def all_ones(bits: int) -> int:
    return (1 << bits) - 1


def ackset_new(batch_size: int) -> list[int]:
    return int_to_words(all_ones(batch_size))


def ackset_and(a: Sequence[int], b: Sequence[int]) -> list[int]:
    return int_to_words(words_to_int(a) & words_to_int(b))


def ackset_or(a: Sequence[int], b: Sequence[int]) -> list[int]:
    return int_to_words(words_to_int(a) | words_to_int(b))


def ackset_andnot(a: Sequence[int], b: Sequence[int]) -> list[int]:
    return int_to_words(words_to_int(a) & ~words_to_int(b))


def ackset_is_fully_acked(a: Sequence[int], batch_size: int | None = None) -> bool:
    value = words_to_int(a)
    if batch_size is not None:
        value &= all_ones(batch_size)
    return value == 0


def ackset_acked_indexes(a: Sequence[int], batch_size: int) -> list[int]:
    value = words_to_int(a)
    return [i for i in range(batch_size) if not (value >> i) & 1]


def ackset_unacked_count(a: Sequence[int], batch_size: int) -> int:
    value = words_to_int(a)
    return sum((value >> i) & 1 for i in range(batch_size))


def ackset_conflicts(a: Sequence[int], b: Sequence[int], batch_size: int) -> bool:
    return bool(set(ackset_acked_indexes(a, batch_size)) & set(ackset_acked_indexes(b, batch_size)))


def ragged_rows(offsets: Sequence[int], words: Sequence[int]) -> list[list[int]]:
    return [list(words[offsets[i] : offsets[i + 1]]) for i in range(len(offsets) - 1)]


def ragged(rows: Sequence[Sequence[int]]) -> tuple[list[int], list[int]]:
    offsets, words = [0], []
    for row in rows:
        words.extend(row)
        offsets.append(len(words))
    return offsets, words


def visibility_mask(
    ledger_id: Sequence[int],
    entry_id: Sequence[int],
    txnid_most: Sequence[int | None],
    txnid_least: Sequence[int | None],
    is_marker: Sequence[bool | None],
    max_read_position: Pos,
    aborted: AbortedTxnSet,
) -> list[bool]:
    """READ_COMMITTED: not a marker (a null marker flag may be one), at or before max read,
    not in an aborted txn."""
    mask = []
    for ledger, entry, most, least, marker in zip(
        ledger_id, entry_id, txnid_most, txnid_least, is_marker, strict=True
    ):
        transactional = most is not None and least is not None and most >= 0 and least >= 0
        mask.append(
            marker is not None and not marker
            and (ledger, entry) <= max_read_position
            and not (transactional and aborted.contains(most, least))
        )
    return mask
