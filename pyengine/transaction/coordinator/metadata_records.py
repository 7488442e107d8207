"""The v5 (PIP-473) data model: transaction headers, operation records and their four
secondary indexes in the metadata store. Shared by the v5 coordinator, the metadata
transaction buffer and the metadata pending-ack store.

    /txn/<txnId>               header, partition key = txnId
        {"state": "OPEN" | "COMMITTED" | "ABORTED", "timeout_ms", "created_ms", "finalized_ms"}
    /txn-op/<txnId>/<seq>      one per transactional write or ack, partition key = txnId,
                               <seq> assigned by the store (sequential key)
        {"kind": "write" | "ack", "segment", "position": [ledger, entry]}
        acks add "subscription", "cumulative", "batch_size", "ack_set"; the records of an ack
        request of several add "request" (an id they share) and "parts" (how many it has)

    idx:writes-by-segment              op records of kind write, key (segment, ledger, entry)
    idx:acks-by-segment-subscription   op records of kind ack, key (segment, subscription)
    idx:txn-by-deadline                OPEN headers, key timeout_ms
    idx:txn-by-final-state             COMMITTED/ABORTED headers, key (state, finalized_ms)

The backends write index entries in the same atomic write as their record, so the indexes
can never disagree with the records. `<txnId>` is `<most>-<least>` (decimal): the header
path and the op-record prefix of a transaction can be derived from its id alone.

v5 transactions have their own coordinator id (`V5_COORDINATOR_ID`, the most significant half
of their ids), far above the v4 coordinators' 0..N-1: every component tells a v5 transaction
from a v4 one by its id, and a v4 client (which discovers coordinators 0..N-1) never gets one.
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass
from urllib.parse import quote

from pyengine.errors import MetadataError
from pyengine.metadata import MetadataStore, Record
from pyengine.transaction import TxnStatus
from pyengine_kernels import Position, TxnId

V5_COORDINATOR_ID = 5 << 32

HEADER_PREFIX = "/txn/"
OP_PREFIX = "/txn-op/"
ID_BLOCK_PATH = "/txn-coordinator/v5/next-id"      # the id allocator (blocks of ids, by CAS)
BUFFER_PREFIX = "/txn-buffer/"                      # per segment: its aborted txns

IDX_WRITES = "idx:writes-by-segment"
IDX_ACKS = "idx:acks-by-segment-subscription"
IDX_DEADLINE = "idx:txn-by-deadline"
IDX_FINAL = "idx:txn-by-final-state"


class CorruptTxnRecordError(MetadataError):
    """A v5 record in the metadata store cannot be decoded (names the path)."""


class HeaderState(str, enum.Enum):
    OPEN = "OPEN"
    COMMITTED = "COMMITTED"
    ABORTED = "ABORTED"

    @property
    def final(self) -> bool:
        return self is not HeaderState.OPEN

    @property
    def status(self) -> TxnStatus:
        return {HeaderState.OPEN: TxnStatus.OPEN, HeaderState.COMMITTED: TxnStatus.COMMITTED,
                HeaderState.ABORTED: TxnStatus.ABORTED}[self]


def is_v5(txn: TxnId) -> bool:
    return txn.most_bits == V5_COORDINATOR_ID


def txn_key(txn: TxnId) -> str:
    return f"{txn.most_bits}-{txn.least_bits}"


def parse_txn_key(key: str) -> TxnId:
    most, sep, least = key.partition("-")
    if not sep or not most.isdigit() or not least.isdigit():
        raise CorruptTxnRecordError(f"{key!r} is not a transaction key (<most>-<least>)")
    return TxnId(int(most), int(least))


def header_path(txn: TxnId) -> str:
    return HEADER_PREFIX + txn_key(txn)


def op_prefix(txn: TxnId) -> str:
    """The op records of `txn` are the sequential children of this path."""
    return OP_PREFIX + txn_key(txn) + "/"


def txn_of_path(path: str) -> TxnId:
    """The txn of a header or op-record path."""
    for prefix in (HEADER_PREFIX, OP_PREFIX):
        if path.startswith(prefix):
            return parse_txn_key(path[len(prefix):].split("/", 1)[0])
    raise CorruptTxnRecordError(f"{path!r} is neither a txn header nor an op record")


def buffer_path(segment: str) -> str:
    """Where the buffer of `segment` keeps its aborted txns (one path segment per topic)."""
    return BUFFER_PREFIX + quote(segment, safe="")


@dataclass(frozen=True, slots=True)
class TxnHeader:
    state: HeaderState
    timeout_ms: int             # absolute deadline, epoch ms
    created_ms: int
    finalized_ms: int | None = None

    def encode(self) -> bytes:
        return json.dumps({"state": self.state.value, "timeout_ms": self.timeout_ms,
                           "created_ms": self.created_ms, "finalized_ms": self.finalized_ms},
                          separators=(",", ":")).encode()

    @classmethod
    def decode(cls, value: bytes, path: str = "?") -> TxnHeader:
        try:
            raw = _json_object(value)
            finalized = raw.get("finalized_ms")
            header = cls(HeaderState(raw["state"]), _int(raw["timeout_ms"]), _int(raw["created_ms"]),
                         None if finalized is None else _int(finalized))
        except (ValueError, KeyError, TypeError) as exc:
            raise CorruptTxnRecordError(f"txn header {path} cannot be decoded: {exc}") from None
        return header


@dataclass(frozen=True, slots=True)
class OpRecord:
    kind: str                          # "write" | "ack"
    segment: str
    position: Position
    subscription: str | None = None
    cumulative: bool = False
    batch_size: int = 1
    ack_set: tuple[int, ...] | None = None
    # An ack request of several records (the store has no multi-record write): its id and its
    # number of records. A request found with fewer was written in part: it was refused.
    request: str | None = None
    parts: int = 1

    def encode(self) -> bytes:
        raw: dict = {"kind": self.kind, "segment": self.segment,
                     "position": [self.position.ledger_id, self.position.entry_id]}
        if self.kind == "ack":
            raw.update(subscription=self.subscription, cumulative=self.cumulative,
                       batch_size=self.batch_size,
                       ack_set=None if self.ack_set is None else list(self.ack_set))
            if self.parts > 1:
                raw.update(request=self.request, parts=self.parts)
        return json.dumps(raw, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, value: bytes, path: str = "?") -> OpRecord:
        try:
            raw = _json_object(value)
            kind = raw["kind"]
            if kind not in ("write", "ack"):
                raise ValueError(f"unknown kind {kind!r}")
            ledger, entry = raw["position"]
            segment = raw["segment"]
            if not isinstance(segment, str):
                raise TypeError("segment is not a string")
            if kind == "write":
                return cls(kind, segment, Position(_int(ledger), _int(entry)))
            ack_set = raw.get("ack_set")
            subscription = raw["subscription"]
            if not isinstance(subscription, str):
                raise TypeError("subscription is not a string")
            parts, request = _int(raw.get("parts", 1)), raw.get("request")
            if parts < 1 or (parts > 1 and not isinstance(request, str)):
                raise ValueError(f"a request of {parts} records with id {request!r}")
            return cls(kind, segment, Position(_int(ledger), _int(entry)), subscription,
                       bool(raw.get("cumulative", False)), _int(raw.get("batch_size", 1)),
                       None if ack_set is None else tuple(_int(w) for w in ack_set),
                       request if parts > 1 else None, parts)
        except (ValueError, KeyError, TypeError, OverflowError) as exc:
            raise CorruptTxnRecordError(f"txn op record {path} cannot be decoded: {exc}") from None


def _json_object(value: bytes) -> dict:
    raw = json.loads(value)
    if not isinstance(raw, dict):
        raise TypeError("not a JSON object")
    return raw


def _int(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{value!r} is not an integer")
    return value


# --- indexes --------------------------------------------------------------------------------

def _op(record: Record) -> OpRecord | None:
    try:
        return OpRecord.decode(record.value, record.path)
    except CorruptTxnRecordError:
        return None             # not indexed; readers of the prefix report it


def _writes_key(record: Record):
    op = _op(record)
    if op is None or op.kind != "write":
        return None
    return (op.segment, op.position.ledger_id, op.position.entry_id)


def _acks_key(record: Record):
    op = _op(record)
    if op is None or op.kind != "ack":
        return None
    return (op.segment, op.subscription)


def _header(record: Record) -> TxnHeader | None:
    try:
        return TxnHeader.decode(record.value, record.path)
    except CorruptTxnRecordError:
        return None


def _deadline_key(record: Record):
    header = _header(record)
    return header.timeout_ms if header is not None and header.state is HeaderState.OPEN else None


def _final_key(record: Record):
    header = _header(record)
    if header is None or not header.state.final:
        return None
    return (header.state.value, header.finalized_ms if header.finalized_ms is not None else 0)


def declare_indexes(store: MetadataStore) -> None:
    """Declare the four PIP-473 indexes (idempotent; every process writing v5 records must)."""
    store.declare_index(IDX_WRITES, OP_PREFIX, _writes_key)
    store.declare_index(IDX_ACKS, OP_PREFIX, _acks_key)
    store.declare_index(IDX_DEADLINE, HEADER_PREFIX, _deadline_key)
    store.declare_index(IDX_FINAL, HEADER_PREFIX, _final_key)
