"""The transaction state READ_COMMITTED needs, captured read-only from a data dir.

Per topic: the read horizon (max read position: nothing after it is visible, it stops before
the first entry of the oldest open transaction) and the aborted transactions (a roaring bitmap
per coordinator, `AbortedTxnSet.to_bytes()`). It is computed exactly as the broker's v4
transaction buffer recovers it (`pyengine.transaction.buffer.replay`): the topic's snapshot,
then a replay of the entry headers after it, all inside one LMDB read transaction, so the
state, the ledger ranges and the last position are one consistent snapshot. Nothing is written.

A `TxnState` is captured once, on the driver, and shipped to the workers as bytes (a Spark
broadcast for `committed_filter`, inside the planned reader for the data source). Workers
decode it once per process (`prepared()`), never per batch.

Ledger ids are unique within a data dir (one counter for all topics), so a row's ledger id
names its topic: `PreparedState.mask` needs no topic column.

v5 topics (PIP-473: `segment://` topics, or any topic of a namespace whose policy says
`transaction_version` 5) keep no transaction state in their stream: no markers, no snapshots.
Their state is read from the metadata store in the data dir (the LMDB backend's `metadata`
database), in the same LMDB read transaction as the entries, exactly as a recovering
`MetadataTransactionBuffer` reads it, with the decisions of the headers applied at once:

* aborted = the segment's stored aborted set (`/txn-buffer/<segment>`) plus every txn with a
  write record here whose header is ABORTED or gone (a decision not materialised yet);
* ongoing = the txns with a write record here whose header is OPEN (first entry = lowest
  position): the horizon stops before the oldest, as the v4 one does;
* hidden = the late writes (a write whose op record came after its txn's decision, refused
  to the sender): the positions the buffer stored in the ledger property, plus those whose
  op record has a higher store revision than a COMMITTED header (the live buffer hides them
  before the decision is applied: it waits for that append).

So a v5 state is an aborted set and a horizon, as v4's, plus (rarely non-empty) hidden
positions. A broker with another metadata store (etcd, memory) keeps none of it in the data
dir: reading its v5 topics READ_COMMITTED is refused (`MetadataBackendError`).
"""

from __future__ import annotations

import hashlib
import json
import struct
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from pyengine.metadata.keys import index_range
from pyengine.metadata.lmdb_store import LmdbKV
from pyengine.metadata.local import current_revision, read_index, read_record
from pyengine.naming import TopicName
from pyengine.storage.reader import ReadView, StoreReader, TopicInfo
from pyengine.transaction import TxnAction
from pyengine.transaction.buffer.ended import EndedTxns
from pyengine.transaction.buffer.replay import below_low_watermark, load_snapshot, read_horizon, replay_entry
from pyengine.transaction.buffer.snapshot import TransactionBufferSnapshot
from pyengine.transaction.buffer.metadata_buffer import HIDDEN_PROPERTY, _parse_positions
from pyengine.transaction.buffer.topic_buffer import TXN_PROPERTY
from pyengine.transaction.coordinator.metadata_records import (
    IDX_WRITES,
    V5_COORDINATOR_ID,
    HeaderState,
    OpRecord,
    TxnHeader,
    buffer_path,
    header_path,
    txn_of_path,
)
from pyengine_kernels import AbortedTxnSet, OngoingTxnMap, Position, TxnId, visibility_mask

_MAGIC = b"PETS"
_VERSION = 3
_HEAD = struct.Struct("<4sBI")


@dataclass(frozen=True)
class TopicState:
    """One topic's READ_COMMITTED state at capture time."""

    topic: str
    topic_id: int
    last_position: Position          # the last entry stored (LAC)
    max_read_position: Position      # readers see nothing after it
    aborted: bytes                   # AbortedTxnSet.to_bytes()
    ongoing: tuple[tuple[TxnId, Position], ...] = ()     # open txns and their first entries
    ledgers: tuple[int, ...] = ()    # ids of the topic's ledgers (empty ones too: see _ledger_ids)
    design: int = 4                  # 4: PIP-31 (markers in the stream), 5: PIP-473 (metadata store)
    hidden: tuple[Position, ...] = ()  # v5: late writes of committed txns, never visible

    def aborted_set(self) -> AbortedTxnSet:
        return AbortedTxnSet.from_bytes(self.aborted)


@dataclass(frozen=True)
class TxnState:
    """The READ_COMMITTED state of some topics of a data dir, captured in one snapshot."""

    data_dir: str
    topics: dict[str, TopicState] = field(default_factory=dict)
    # The highest ledger id the data dir had allocated: a ledger above it is newer than the
    # capture (invisible). One at or below it that no captured topic owns is a stored topic's
    # left out of the capture (`other_ledgers`: an error, its rows cannot be judged), else a
    # ledger gone by then (trimmed by retention, or its topic deleted): no consumer can
    # receive its rows, they are not visible.
    max_ledger_id: int = -1
    other_ledgers: tuple[int, ...] = ()

    def __getitem__(self, topic: str) -> TopicState:
        return self.topics[topic]

    def select(self, topics: Iterable[str]) -> TxnState:
        kept = {name: self.topics[name] for name in topics}
        dropped = [ledger for name, state in self.topics.items() if name not in kept for ledger in state.ledgers]
        return TxnState(self.data_dir, kept, self.max_ledger_id, tuple(sorted({*self.other_ledgers, *dropped})))

    # --- bytes ----------------------------------------------------------------------------

    def to_bytes(self) -> bytes:
        """A self-contained encoding (what is broadcast): a JSON head and the aborted sets."""
        head: dict[str, Any] = {"data_dir": self.data_dir, "max_ledger_id": self.max_ledger_id,
                                "other_ledgers": list(self.other_ledgers), "topics": []}
        blobs = []
        for state in self.topics.values():
            head["topics"].append({
                "topic": state.topic, "topic_id": state.topic_id,
                "last": [state.last_position.ledger_id, state.last_position.entry_id],
                "horizon": [state.max_read_position.ledger_id, state.max_read_position.entry_id],
                "ongoing": [[t.most_bits, t.least_bits, p.ledger_id, p.entry_id] for t, p in state.ongoing],
                "ledgers": list(state.ledgers), "aborted_bytes": len(state.aborted), "design": state.design,
                "hidden": [[p.ledger_id, p.entry_id] for p in state.hidden],
            })
            blobs.append(state.aborted)
        raw_head = json.dumps(head, separators=(",", ":")).encode()
        return _HEAD.pack(_MAGIC, _VERSION, len(raw_head)) + raw_head + b"".join(blobs)

    @classmethod
    def from_bytes(cls, data: bytes) -> TxnState:
        try:
            magic, version, size = _HEAD.unpack_from(data)
            if magic != _MAGIC or version != _VERSION:
                raise ValueError(f"not a pyengine transaction state (magic {magic!r}, version {version})")
            offset = _HEAD.size + size
            head = json.loads(bytes(data[_HEAD.size:offset]))
            topics = {}
            for item in head["topics"]:
                aborted = bytes(data[offset:offset + item["aborted_bytes"]])
                offset += item["aborted_bytes"]
                topics[item["topic"]] = TopicState(
                    item["topic"], item["topic_id"], Position(*item["last"]), Position(*item["horizon"]), aborted,
                    tuple((TxnId(m, s), Position(lg, e)) for m, s, lg, e in item["ongoing"]),
                    tuple(item["ledgers"]), item["design"], tuple(Position(lg, e) for lg, e in item["hidden"]))
            if offset != len(data):
                raise ValueError(f"{len(data) - offset} bytes follow the transaction state")
        except (struct.error, KeyError, TypeError, json.JSONDecodeError) as exc:
            raise ValueError(f"not a pyengine transaction state: {exc}") from exc
        return cls(head["data_dir"], topics, head["max_ledger_id"], tuple(head["other_ledgers"]))

    @property
    def fingerprint(self) -> str:
        return hashlib.blake2b(self.to_bytes(), digest_size=16).hexdigest()

    def prepared(self) -> PreparedState:
        """The decoded form the filters use (cached per process by fingerprint)."""
        return PreparedState.of(self)


# --- capture --------------------------------------------------------------------------------

def compute_topic_state(view: ReadView, info: TopicInfo) -> TopicState:
    """The state a recovered v4 transaction buffer of this topic holds, computed read-only
    from one consistent view: snapshot, replay of the headers after it, then the txns its
    coordinator already ended below the low watermark counted as aborted (recovery aborts
    them; their abort markers would follow the last entry)."""
    last = info.last_position
    ongoing, aborted, ended = OngoingTxnMap(), AbortedTxnSet(), EndedTxns()
    # A topic that never held a transactional entry has nothing to recover (PIP-373).
    if info.properties.get(TXN_PROPERTY) == "true":
        first = info.first_position or last.next()
        raw = view.transaction_buffer_snapshot(info.topic_id)
        snapshot = (TransactionBufferSnapshot.decode(
            raw, lambda last: view.transaction_buffer_snapshot_segment(info.topic_id, last), first)
            if raw is not None else None)
        aborted, ended, start = load_snapshot(snapshot, first)
        if start <= last:
            for chunk in view.iter_headers(info.topic_id, start, last):
                for ledger, entry, marker, most, least, _count in chunk:
                    if most >= 0:
                        replay_entry(ongoing, aborted, ended, Position(ledger, entry), most, least, marker)
        for txn in below_low_watermark(ongoing, ended):
            ongoing.remove(txn)
            aborted.add(txn, last.next())
            ended.add(txn, TxnAction.ABORT)
    horizon = read_horizon(ongoing, last, info.previous_position)
    return TopicState(info.name, info.topic_id, last, horizon, aborted.to_bytes(), tuple(ongoing.items()),
                      _ledger_ids(info))


def _ledger_ids(info: TopicInfo) -> tuple[int, ...]:
    """Every ledger of the topic at capture time, empty ones included: the ledger a running
    broker writes to is often still empty (a new one after each restart or roll-over), and the
    rows it gets after the capture are this topic's rows, not visible yet (past the horizon),
    rather than rows of a topic the capture does not know."""
    return tuple(ledger.ledger_id for ledger in info.ledgers)


class MetadataBackendError(ValueError):
    """The v5 transaction state of a data dir's topics is not in the data dir: its broker kept
    it in another metadata store (etcd, memory)."""


def compute_v5_topic_state(view: ReadView, kv: LmdbKV, info: TopicInfo) -> TopicState:
    """The state of a v5 (PIP-473) topic: what a `MetadataTransactionBuffer` recovering from
    this snapshot of the metadata store holds once it has applied the decisions of the headers
    (module doc). `kv` must read the same LMDB transaction as `view`."""
    last = info.last_position
    stored = read_record(kv, buffer_path(info.name))
    aborted = AbortedTxnSet.from_bytes(stored.value) if stored is not None else AbortedTxnSet()
    ongoing = OngoingTxnMap()
    hidden = set(_parse_positions(info.properties.get(HIDDEN_PROPERTY, "")))
    headers: dict[TxnId, Any] = {}
    undecided_aborts: dict[TxnId, Position] = {}
    # Write records in index order (segment, ledger, entry): a txn's first one is its first entry.
    for record in read_index(kv, IDX_WRITES, index_range(None, None, (info.name,))):
        txn = txn_of_path(record.path)
        position = OpRecord.decode(record.value, record.path).position
        if txn not in headers:
            header_record = read_record(kv, header_path(txn))
            headers[txn] = None if header_record is None else (
                TxnHeader.decode(header_record.value, header_record.path), header_record.mod_revision)
        found = headers[txn]
        state = HeaderState.ABORTED if found is None else found[0].state
        if state is HeaderState.OPEN:
            if txn not in aborted:
                ongoing.add(txn, position)
        elif state is HeaderState.COMMITTED:
            if record.mod_revision > found[1]:
                hidden.add(position)           # written after the commit: refused to its sender
        elif txn not in aborted:
            undecided_aborts[txn] = position   # the last one wins: aborted at its last entry here
    for txn, position in undecided_aborts.items():
        aborted.add(txn, position)
    horizon = read_horizon(ongoing, last, info.previous_position)
    return TopicState(info.name, info.topic_id, last, horizon, aborted.to_bytes(), tuple(ongoing.items()),
                      _ledger_ids(info), 5,
                      tuple(sorted(p for p in hidden if p <= last)))


class Snapshot:
    """One LMDB read transaction over a data dir: its topics (`view`), and the records of the
    LMDB metadata store and the broker's admin policies in it, all of the same instant."""

    def __init__(self, store: StoreReader, txn: Any) -> None:
        self.store = store
        self.view = ReadView(store, txn)
        self._txn = txn
        self._metadata_db = store.env.db("metadata")
        self.kv = LmdbKV(txn, self._metadata_db)

    def topic_names(self) -> list[str]:
        return self.view.topic_names()

    def transaction_version(self, name: str) -> int:
        """4 or 5, as the broker decides it: the namespace policy, else the topic's domain."""
        topic = TopicName.parse(name)
        raw = self._txn.get(f"/admin/namespaces/{topic.namespace_name}".encode(), db=self._metadata_db)
        override = json.loads(raw).get("transaction_version") if raw is not None else None
        # The domain's default is pyengine.broker.transactions.default_transaction_version's
        # rule, not imported: that would load the whole broker into every Spark worker.
        return override or (5 if topic.is_segment else 4)

    def topic_version(self, info: TopicInfo) -> int:
        """4 or 5 for a stored topic: the version the broker pinned in its properties at its
        first load (pyengine.broker.service's TXN_VERSION_PROPERTY), else as `transaction_version`."""
        pinned = info.properties.get("txnVersion")
        return int(pinned) if pinned in ("4", "5") else self.transaction_version(info.name)

    def topic_state(self, info: TopicInfo) -> TopicState:
        if self.topic_version(info) == 4:
            return compute_topic_state(self.view, info)
        if current_revision(self.kv) == 0 and self._has_v5_entries(info):
            raise MetadataBackendError(
                f"{info.name} holds v5 (PIP-473) transactions, whose state lives in the broker's metadata "
                f"store, and the LMDB metadata store of {self.store.path} has never been written: the broker "
                "ran with another metadata store (--metadata-store etcd://... or memory). READ_COMMITTED over "
                "v5 topics reads that state only from the data dir's own store (--metadata-store lmdb, the "
                "default); read these topics with isolation=read_uncommitted, or through a consumer")
        return compute_v5_topic_state(self.view, self.kv, info)

    def _has_v5_entries(self, info: TopicInfo) -> bool:
        if not info.ledgers:
            return False
        first = info.first_position or info.last_position.next()
        for chunk in self.view.iter_headers(info.topic_id, first, info.last_position):
            if any(most == V5_COORDINATOR_ID for _l, _e, _m, most, _least, _c in chunk):
                return True
        return False

    def state(self, names: Iterable[str]) -> TxnState:
        names = list(names)
        captured = set(names)
        others = [ledger.ledger_id for name in self.topic_names() if name not in captured
                  for ledger in self.view.topic(name).ledgers]
        return TxnState(str(self.store.path.resolve()), {name: self.topic_state(self.view.topic(name))
                                                         for name in names}, self.view.counter("ledger"),
                        tuple(sorted(others)))


@contextmanager
def open_snapshot(data_dir: str | Path) -> Iterator[Snapshot]:
    """The data dir opened read-only, one consistent snapshot for the block."""
    with StoreReader(data_dir) as store, store.env.read() as txn:
        yield Snapshot(store, txn)


def capture_state(data_dir: str | Path, topics: Iterable[str] | None = None) -> TxnState:
    """Capture the READ_COMMITTED state of `topics` (full names; default every stored topic)
    from `data_dir`, read-only, in one snapshot. The environment is open only meanwhile."""
    with open_snapshot(data_dir) as snapshot:
        return snapshot.state(list(topics) if topics is not None else snapshot.topic_names())


# --- applying it ----------------------------------------------------------------------------

_PREPARED: dict[str, PreparedState] = {}
_PREPARED_LIMIT = 16
_OTHER_TOPIC = -2


class PreparedState:
    """A TxnState decoded for filtering: aborted sets as kernel objects, a ledger -> topic
    table. Built once per process per state."""

    def __init__(self, state: TxnState) -> None:
        self.state = state
        self.names = list(state.topics)
        self.horizons = [state.topics[name].max_read_position for name in self.names]
        self.aborted = [state.topics[name].aborted_set() for name in self.names]
        # v5 late writes: per topic, ledger -> its hidden entry ids (almost always empty)
        self.hidden: list[dict[int, np.ndarray]] = []
        for name in self.names:
            by_ledger: dict[int, list[int]] = {}
            for position in state.topics[name].hidden:
                by_ledger.setdefault(position.ledger_id, []).append(position.entry_id)
            self.hidden.append({ledger: np.array(entries, dtype=np.int64) for ledger, entries in by_ledger.items()})
        ledgers = [(ledger, index) for index, name in enumerate(self.names) for ledger in state.topics[name].ledgers]
        top = max([state.max_ledger_id, *(ledger for ledger, _ in ledgers)], default=-1)
        self.max_ledger_id = top
        # Dense: ledger ids are small counters. -1: no captured topic owns the ledger (gone by
        # the capture, or newer); OTHER_TOPIC: a stored topic left out of the capture owns it.
        self.topic_of_ledger = np.full(top + 2, -1, dtype=np.int32)
        for ledger in state.other_ledgers:
            if ledger <= top:
                self.topic_of_ledger[ledger] = _OTHER_TOPIC
        for ledger, index in ledgers:
            self.topic_of_ledger[ledger] = index
        self.index = {name: i for i, name in enumerate(self.names)}

    @classmethod
    def of(cls, state: TxnState) -> PreparedState:
        key = state.fingerprint
        prepared = _PREPARED.get(key)
        if prepared is None:
            if len(_PREPARED) >= _PREPARED_LIMIT:
                _PREPARED.pop(next(iter(_PREPARED)))
            prepared = _PREPARED[key] = cls(state)
        return prepared

    def topic_mask(self, topic: str, ledger_id, entry_id, txnid_most, txnid_least, is_marker):
        """Visibility of rows all of one topic: the Rust kernel, one pass (NumPy in -> NumPy
        out, Arrow in -> Arrow out)."""
        i = self.index[topic]
        visible = visibility_mask(ledger_id, entry_id, txnid_most, txnid_least, is_marker,
                                  self.horizons[i], self.aborted[i])
        if self.hidden[i]:
            hidden = self.hidden_rows(i, ledger_id, entry_id)
            if hidden.any():
                mask = _bool_numpy(visible) & ~hidden
                visible = mask if isinstance(visible, np.ndarray) else pa.array(mask)
        return visible

    def hidden_rows(self, index: int, ledger_id, entry_id) -> np.ndarray:
        """The rows at the hidden positions (v5 late writes) of topic `index`."""
        ledgers, entries = _int64_numpy(ledger_id, "ledger ids"), _int64_numpy(entry_id, "entry ids")
        hidden = np.zeros(len(ledgers), dtype=np.bool_)
        for ledger, hidden_entries in self.hidden[index].items():
            rows = ledgers == ledger
            if rows.any():
                hidden[rows] = np.isin(entries[rows], hidden_entries)
        return hidden

    def _owners(self, ledger_id) -> np.ndarray:
        """Index of the captured topic of each row's ledger; -1 for ledgers no captured topic
        holds: newer than the capture (not visible yet) or gone by then (trimmed by retention,
        or of a deleted topic: not visible). Raises for a ledger of a stored topic the capture
        left out (its rows cannot be judged)."""
        ledgers = _int64_numpy(ledger_id, "ledger ids")
        top = self.max_ledger_id
        owner = self.topic_of_ledger[np.clip(ledgers, -1, top + 1)]   # -1 wraps to the "none" slot
        if self.state.other_ledgers:
            stray = ledgers[owner == _OTHER_TOPIC]
            if stray.size:
                raise ValueError(
                    f"rows of ledger {int(stray[0])}, which a stored topic the captured state leaves out "
                    "holds: capture the state of every topic the DataFrame holds")
        return owner

    def mask(self, ledger_id: pa.Array, entry_id: pa.Array, txnid_most: pa.Array, txnid_least: pa.Array,
             is_marker: pa.Array) -> pa.BooleanArray:
        """READ_COMMITTED visibility of arbitrary rows (any mix of the captured topics): one
        kernel pass per topic present (usually one: a batch comes from one ledger)."""
        if len(ledger_id) == 0:
            return pa.array([], pa.bool_())
        owner = self._owners(ledger_id)
        first = int(owner[0])
        if first >= 0 and (owner == first).all():
            return self.topic_mask(self.names[first], ledger_id, entry_id, txnid_most, txnid_least, is_marker)
        result = np.zeros(len(owner), dtype=np.bool_)
        for index in np.unique(owner[owner >= 0]).tolist():
            visible = self.topic_mask(self.names[index], ledger_id, entry_id, txnid_most, txnid_least, is_marker)
            rows = owner == index
            result[rows] = _bool_numpy(visible)[rows]
        return pa.array(result)

    def classify(self, ledger_id, entry_id, txnid_most, txnid_least, is_marker) -> tuple[np.ndarray, dict[str, int]]:
        """Visibility of the rows, and why the others are not visible: counts of `marker`
        rows, `aborted` rows (of aborted transactions, and v5 late writes refused to their
        sender) and `uncommitted` rows (of open transactions, or behind the read horizon, or
        newer than the capture, or of ledgers gone by then). A row whose marker flag is null counts as a marker, as the
        kernel takes it: one that may be a marker is not visible."""
        visible = _bool_numpy(self.mask(ledger_id, entry_id, txnid_most, txnid_least, is_marker))
        markers = flags_numpy(is_marker)
        aborted = np.zeros(len(visible), dtype=np.bool_)
        if len(visible):
            owner = self._owners(ledger_id)
            for index in np.unique(owner[owner >= 0]).tolist():
                rows = owner == index
                aborted[rows] = self.aborted[index].contains_many(txnid_most, txnid_least)[rows]
                if self.hidden[index]:
                    aborted[rows] |= self.hidden_rows(index, ledger_id, entry_id)[rows]
        aborted &= ~markers
        counts = {"visible": int(visible.sum()), "marker": int(markers.sum()), "aborted": int(aborted.sum())}
        counts["uncommitted"] = len(visible) - counts["visible"] - counts["marker"] - counts["aborted"]
        return visible, counts


def _int64_numpy(array, what: str) -> np.ndarray:
    if isinstance(array, np.ndarray):
        return array
    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks()
    if array.null_count:
        raise ValueError(f"{what} must not be null")
    return array.to_numpy(zero_copy_only=False)


def _bool_numpy(array) -> np.ndarray:
    return array if isinstance(array, np.ndarray) else array.to_numpy(zero_copy_only=False)


def flags_numpy(array) -> np.ndarray:
    """Row flags as NumPy bools, a null (Arrow) taken as set."""
    if isinstance(array, np.ndarray):
        return array
    if array.null_count:
        array = array.fill_null(True)
    return array.to_numpy(zero_copy_only=False)


__all__ = ["MetadataBackendError", "PreparedState", "Snapshot", "TopicState", "TxnState", "capture_state",
           "compute_topic_state", "compute_v5_topic_state", "open_snapshot"]
