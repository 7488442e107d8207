"""Transaction-state kernels of pyengine (compiled Rust, PyO3).

Pulsar semantics reimplemented for columnar reads:

* ``Position`` / ``TxnId``: Pulsar's ``PositionImpl`` and ``TxnID`` value types.
* ``OngoingTxnMap``: first position of every ongoing txn -> the transaction buffer's
  max read position.
* ``AbortedTxnSet``: aborted txns as one 64-bit roaring bitmap per coordinator.
* ``ackset_*``: batch-index ack sets (Java ``BitSet`` words, a SET bit = still unacked).
* ``visibility_mask``: the READ_COMMITTED row filter.
* ``crc32c``: the checksum of Pulsar payload frames.

Bulk inputs ("columns") are 1-D NumPy arrays (contiguous or strided; int64 for ids,
positions, offsets, words and sizes, bool for flags; an array NumPy flags as not aligned, such
as a field of a packed structured array, is read through a contiguous copy) or Arrow arrays
passed through the Arrow PyCapsule interface (any object with ``__arrow_c_array__``, e.g. ``pyarrow.Array``), imported
without a copy. A ``pyarrow.ChunkedArray`` is rejected: call ``combine_chunks()`` first.
A wrong dtype or type raises ``TypeError`` naming the expected one; wrong shapes, lengths or
values raise ``ValueError``. Bulk work runs with the GIL released.
"""

from typing import ClassVar, Final, Protocol, Sequence, SupportsIndex, final

import numpy as np
import numpy.typing as npt
import pyarrow as pa
from typing_extensions import Buffer

__version__: str

class _ArrowArrayExportable(Protocol):
    def __arrow_c_array__(self, requested_schema: object | None = None) -> tuple[object, object]: ...

Int64Column = npt.NDArray[np.int64] | _ArrowArrayExportable
BoolColumn = npt.NDArray[np.bool_] | _ArrowArrayExportable
AckSet = Sequence[int] | npt.NDArray[np.int64]
"""Words of a Java ``BitSet`` as signed 64-bit ints; bit i is in word i // 64, LSB first."""

@final
class Position:
    """A managed-ledger position ``(ledger_id, entry_id)``, ordered lexicographically.

    Both ids are signed 64-bit and ``>= -1`` (``ValueError`` otherwise); ``-1`` means
    "before the first", as in ``EARLIEST`` and ``(L, -1)``. Immutable, hashable, picklable.
    ``repr`` is ``Position(1, 2)``, ``str`` is ``1:2``.
    """

    EARLIEST: ClassVar[Position]
    """``(-1, -1)``."""
    LATEST: ClassVar[Position]
    """``(2**63 - 1, 2**63 - 1)``."""

    def __new__(cls, ledger_id: SupportsIndex, entry_id: SupportsIndex) -> Position: ...
    @property
    def ledger_id(self) -> int: ...
    @property
    def entry_id(self) -> int: ...
    def prev(self) -> Position:
        """``(L, e - 1)``; ``(L, 0)`` gives ``(L, -1)``. ``ValueError`` for ``(L, -1)``."""
    def next(self) -> Position:
        """``(L, e + 1)``; ``ValueError`` past ``2**63 - 1``."""
    def __eq__(self, other: object) -> bool: ...
    def __lt__(self, other: Position) -> bool: ...
    def __le__(self, other: Position) -> bool: ...
    def __gt__(self, other: Position) -> bool: ...
    def __ge__(self, other: Position) -> bool: ...
    def __hash__(self) -> int: ...
    def __reduce__(self) -> tuple[type[Position], tuple[int, int]]: ...

@final
class TxnId:
    """Pulsar's ``TxnID``: ``most_bits`` is the coordinator id, ``least_bits`` its sequence.

    Both are signed 64-bit and ``>= 0`` (``ValueError`` otherwise). Ordered by
    ``(most_bits, least_bits)``; immutable, hashable, picklable. ``repr`` is ``TxnId(1, 2)``,
    ``str`` is ``(1,2)`` like Java's ``TxnID.toString()``.
    """

    def __new__(cls, most_bits: SupportsIndex, least_bits: SupportsIndex) -> TxnId: ...
    @property
    def most_bits(self) -> int: ...
    @property
    def least_bits(self) -> int: ...
    def __eq__(self, other: object) -> bool: ...
    def __lt__(self, other: TxnId) -> bool: ...
    def __le__(self, other: TxnId) -> bool: ...
    def __gt__(self, other: TxnId) -> bool: ...
    def __ge__(self, other: TxnId) -> bool: ...
    def __hash__(self) -> int: ...
    def __reduce__(self) -> tuple[type[TxnId], tuple[int, int]]: ...

@final
class OngoingTxnMap:
    """Ongoing txn -> position of its first entry. O(log n) per operation.

    Positions must be entry positions (``ledger_id >= 0`` and ``entry_id >= 0``,
    ``ValueError`` otherwise).
    """

    def __new__(cls) -> OngoingTxnMap: ...
    def add(self, txn: TxnId, position: Position) -> bool:
        """Record ``txn``'s first position; ``False`` (and no change) if already ongoing."""
    def remove(self, txn: TxnId) -> Position | None:
        """Forget ``txn`` (committed or aborted); its first position, or ``None``."""
    def first_position(self, txn: TxnId) -> Position | None: ...
    def lowest(self) -> tuple[TxnId, Position] | None:
        """The txn with the smallest first position (ties: smallest txn)."""
    def max_read_position(self, lac: Position) -> Position:
        """``lac`` when no txn is ongoing, else ``lowest()`` position's ``prev()``."""
    def items(self) -> list[tuple[TxnId, Position]]:
        """Ordered by position, then txn."""
    def clear(self) -> None: ...
    def __contains__(self, txn: TxnId) -> bool: ...
    def __len__(self) -> int: ...

@final
class AbortedTxnSet:
    """Aborted txns: one 64-bit roaring bitmap of ``least_bits`` per coordinator
    (``most_bits``), plus each abort marker's position so that aborts whose marker ledger
    was deleted can be trimmed. Picklable (through ``to_bytes``); equal when they hold the
    same txns with the same marker positions.

    ``to_bytes`` format, version 1, integers little-endian::

        magic b"PEAB" | version u8 = 1 | coordinator count u64
        then per coordinator, by increasing id:
          most_bits i64 | bitmap length u64 | bitmap (as bitmap_bytes: roaring 64-bit
          portable format) | one marker position (ledger_id i64, entry_id i64) per bitmap
          member, in increasing least_bits order

    ``from_bytes`` rejects anything ``to_bytes`` would not produce (bad magic or version,
    truncation, trailing bytes, unordered coordinators, empty, corrupt or non-canonical
    bitmaps, ids above ``2**63 - 1``, non-entry marker positions) with ``ValueError``.

    Bulk probes (``contains_many``, ``visibility_mask``) read, per coordinator, a dense bit
    array over the span of its aborted ``least_bits`` when that span is at most ``2**26``
    (8 MiB), and the roaring bitmap otherwise; the arrays, 64 MiB at most per set (narrower
    spans first), are built by the first bulk probe after a change and kept until the next
    change.

    Bulk calls (``contains_many``, ``trim_before``, ``visibility_mask``...) release the GIL
    while they hold the set: mutating it from another thread meanwhile raises
    ``RuntimeError`` (PyO3's borrow check) instead of racing.
    """

    def __new__(cls) -> AbortedTxnSet: ...
    def add(self, txn: TxnId, marker_position: Position) -> bool:
        """Record an abort; ``False`` (keeping the first marker) if already recorded.
        ``marker_position`` must be an entry position."""
    def remove(self, txn: TxnId) -> bool: ...
    def contains(self, most: int, least: int) -> bool:
        """Negative ids mean "not transactional": ``False``."""
    def contains_many(self, most: Int64Column, least: Int64Column) -> npt.NDArray[np.bool_]:
        """Vectorised ``contains``; negative or null ids give ``False``. Probes once per run
        of rows with equal ids, over the rayon thread pool."""
    def trim_before(self, position: Position) -> int:
        """Drop every abort whose marker position is ``< position``; how many were dropped."""
    def since(self, position: Position) -> AbortedTxnSet:
        """A new set of the aborts whose marker position is ``>= position`` (what
        ``trim_before(position)`` would keep), this one unchanged."""
    def update(self, other: AbortedTxnSet) -> int:
        """Add every abort of ``other`` (a txn already recorded keeps its first marker); how
        many were new. ``other`` must not be this set."""
    def last_marker_position(self) -> Position | None:
        """The highest abort marker position; ``None`` when empty."""
    def items(self) -> list[tuple[TxnId, Position]]:
        """Ordered by marker position, then txn."""
    def coordinator_ids(self) -> list[int]:
        """Coordinators with at least one abort, increasing."""
    def bitmap_bytes(self, most: int) -> bytes:
        """That coordinator's bitmap in CRoaring's portable 64-bit format (what
        ``pyroaring.BitMap64.deserialize`` reads); an empty bitmap for an unknown
        coordinator."""
    def to_bytes(self) -> bytes: ...
    @classmethod
    def from_bytes(cls, data: bytes) -> AbortedTxnSet: ...
    def __contains__(self, txn: TxnId) -> bool: ...
    def __len__(self) -> int: ...
    def __eq__(self, other: object) -> bool: ...
    def __reduce__(self) -> tuple[object, tuple[bytes]]: ...

# Ack sets. Results are trimmed of trailing zero words like Java's BitSet.toLongArray(), so
# a fully acked set is []. batch_size is a Java int: 0 <= batch_size <= 2**31 - 1; where the result
# grows with it (ackset_new, ackset_acked_indexes), at most (2**31 - 1) // 6, the most messages a
# batch holds (6 bytes each in an entry under 2 GiB): ValueError past that, before allocating.

def ackset_new(batch_size: int) -> list[int]:
    """A set with indexes ``0 .. batch_size - 1`` unacked (all bits set)."""

def ackset_and(a: AckSet, b: AckSet) -> list[int]:
    """``a & b`` (merging two acks of one entry): as long as the shorter, trimmed."""

def ackset_or(a: AckSet, b: AckSet) -> list[int]:
    """``a | b``: as long as the longer, trimmed."""

def ackset_andnot(a: AckSet, b: AckSet) -> list[int]:
    """``a & ~b``: missing words of ``b`` are zero, trimmed."""

def ackset_is_fully_acked(a: AckSet, batch_size: int | None = None) -> bool:
    """No bit set; with ``batch_size``, bits at indexes ``>= batch_size`` are ignored."""

def ackset_conflicts(a: AckSet, b: AckSet, batch_size: int) -> bool:
    """Whether some index ``< batch_size`` is acked (bit clear, or word missing) in both.

    Differs from Pulsar's ``PositionAckSetUtil.isAckSetOverlap``, which flips both word arrays
    over their whole length and ANDs them: that reports false conflicts on the padding bits
    above a batch size that is not a multiple of 64, and misses conflicts with a fully acked
    set trimmed to ``[]``. Here only real indexes count and missing words are acked.
    """

def ackset_acked_indexes(a: AckSet, batch_size: int) -> list[int]:
    """Indexes ``< batch_size`` whose bit is clear, increasing."""

def ackset_unacked_count(a: AckSet, batch_size: int) -> int:
    """Number of set bits at indexes ``< batch_size``."""

# Ragged layout for many ack sets: set i is words[offsets[i]:offsets[i + 1]]; offsets is
# int64 of length n + 1, starts at 0, is non-decreasing and ends at len(words).

def ackset_merge_many(
    op: str,
    a_offsets: Int64Column,
    a_words: Int64Column,
    b_offsets: Int64Column,
    b_words: Int64Column,
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """Row-wise ``ackset_and`` / ``ackset_or`` / ``ackset_andnot`` (``op`` is ``"and"``,
    ``"or"`` or ``"andnot"``); returns ``(offsets, words)`` in the same ragged layout."""

def ackset_fully_acked_many(
    offsets: Int64Column,
    words: Int64Column,
    batch_sizes: Int64Column | None = None,
) -> npt.NDArray[np.bool_]:
    """Row-wise ``ackset_is_fully_acked``; ``batch_sizes`` has one entry per set."""

def ackset_conflicts_many(
    a_offsets: Int64Column,
    a_words: Int64Column,
    b_offsets: Int64Column,
    b_words: Int64Column,
    batch_sizes: Int64Column,
) -> npt.NDArray[np.bool_]:
    """Row-wise ``ackset_conflicts``."""

def visibility_mask(
    ledger_id: Int64Column,
    entry_id: Int64Column,
    txnid_most: Int64Column,
    txnid_least: Int64Column,
    is_marker: BoolColumn,
    max_read_position: Position,
    aborted: AbortedTxnSet,
) -> npt.NDArray[np.bool_] | pa.BooleanArray:
    """READ_COMMITTED visibility of each row.

    A row is visible iff it is not a marker, ``(ledger_id, entry_id) <= max_read_position``,
    and it is not in an aborted txn. A row is transactional when both txn ids are non-null
    and ``>= 0``; Arrow nulls in ``is_marker`` mean ``True`` (a row that may be a marker is
    not visible); position columns must not
    hold nulls. All columns must have the same length (``ValueError``).

    Returns a NumPy bool array when every column is a NumPy array, otherwise a
    ``pyarrow.BooleanArray`` (bit-packed in Rust, handed over without a copy; this needs
    pyarrow installed).
    """

def crc32c(data: Buffer, value: int = 0) -> int:
    """Extend the running CRC32C (Castagnoli) ``value`` (0 to start) with ``data``, any
    contiguous buffer, read in place: google-crc32c's ``extend(value, data)``.
    ``0 <= value < 2**32`` (``OverflowError`` otherwise).

    Computed by the Rust ``crc32c`` crate, not google-crc32c: both use the SSE 4.2 CRC
    instruction, but the crate runs three interleaved streams over every 768-byte block,
    where google-crc32c interleaves only on large buffers, so a 1 KiB message takes about
    half the time. google-crc32c remains the oracle of the tests.
    """

_crc32c_capi: Final[object]
"""A ``PyCapsule`` named ``"pyengine_kernels._kernels._crc32c_capi"`` whose pointer is the
C function ``uint32_t crc32c_extend(uint32_t crc, const uint8_t *data, size_t len)``
(what ``crc32c`` computes; callable without the GIL). ``core_ext.frames`` takes it once at
import and checks every frame through it."""
