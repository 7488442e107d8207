"""Transaction keys: connection epochs that fence zombie tasks (pip-transaction-key-fencing).

A client may name a transaction key. With its owner (the authenticated role, `anonymous`
without authentication) it forms the key id `owner&key`, which one coordinator owns
(`coordinator_for`: CRC-32 of the UTF-8 key id modulo the number of coordinators, so that a
client computes the same coordinator the broker checks).

Each key has an epoch, -1 before its first connection. A TC_CLIENT_CONNECT presenting the key
and the epoch of the client's previous connection (-1 for a new task, the current epoch for the
holder reconnecting) is given the next epoch; one presenting an older epoch is a zombie and is
refused (NotAllowed). The new epoch is written to the coordinator's `__transaction_key` records
(LMDB, fsynced) before it is answered, so an epoch is never handed out twice, also after a
crash. The holder reconnecting (a dropped connection, a broker restart) keeps its transaction:
the epoch it presents proves that it holds the key, so its transaction is bound to the new epoch
and goes on, as one without a key survives a reconnect (and as a Kafka producer keeps its epoch
across reconnects). A new task (-1) takes the key over; taking the epoch that way fences the
previous one at once, in this order:

1. the epoch is raised in memory: from this moment every request of a transaction started
   under an older epoch (send, ack, ADD_PARTITION/ADD_SUBSCRIPTION, END_TXN) raises
   `ExpiredTransactionError`, and TC requests over the older epoch's connection NotAllowed;
2. the record is made durable, and the abort of the key's open transaction (if any) is decided
   through the coordinator, durably: from then on it can only end aborted, also after a
   restart. The key's lock is held up to here only;
3. the coordinator tells the transaction's participants (the read horizon of the topics it
   wrote to moves on, its acks are released); the connect waits for that `fence_wait_ms` at
   most. A participant that does not confirm by then (unreachable, slow to load) is told in the
   background, each call repeated until it confirms, as for any ending: the connect is not held
   for it, nor are the key's other connects (which would otherwise queue behind it without
   bound). The spec asks the TC to "abort the old transaction as soon as a new connection is
   established" and to "reject all requests coming from that transaction": the fence (1) and
   the durable decision (2) are that; the participants' confirmation only makes the new task's
   start clean in the common case (the zombie's entries no longer hold back the read horizon,
   its acks no longer conflict), which its abort markers then bring about a little later;
4. the connection holding the older epoch is closed (after the wait: its consumers' messages
   then usually return to their subscriptions with nothing of them still pending; a later abort
   gives back what it held, also to a consumer that came since), and the connect is answered.

One open transaction per key: NEW_TXN while the key's transaction is still open is refused
(NotAllowed) rather than aborting it, so a task never silently loses its own work; a new task
takes over by connecting (which aborts the old one), not by starting a transaction. A
transaction whose end is decided (ABORTING, COMMITTING) is no longer open: it can neither
register, send, ack nor end otherwise.

Transactions are bound to the epoch they were started under; the records keep the bindings of
the key's recent transactions (`HISTORY`), so a fenced transaction is reported as expired also
after a restart. Deleting a key (admin) raises its epoch once more (nobody holds the new one),
aborts its transaction and hides it from the listings; the record stays as a tombstone so that
the epoch never goes backwards and a later connect continues above it. Once its transactions
have all ended and the coordinators' retention of finished transactions has passed, the
coordinators' purge forgets the tombstone (`purge_deleted`): its record goes, and the epoch
floor (one record) rises to its epoch in the same write, so that a key created from then on,
of that name or another, starts above every forgotten one. Deleted keys would otherwise each
keep a record and their transactions' bindings for good (Kafka, likewise, expires transactional
ids; a new one starts from a fresh producer id rather than at epoch 0).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import zlib
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from pyengine.errors import (
    ExpiredTransactionError,
    InvalidTransactionKeyError,
    NotAllowedError,
    TransactionNotFoundError,
)
from pyengine.transaction import TxnStatus
from pyengine_kernels import TxnId

if TYPE_CHECKING:
    from pyengine.storage import StorageEnvironment
    from pyengine.transaction.coordinator.clock import Clock
    from pyengine.transaction.coordinator.service import TransactionCoordinatorService

log = logging.getLogger(__name__)

MAX_KEY_BYTES = 256
ANONYMOUS = "anonymous"
NO_EPOCH = -1
HISTORY = 32                    # bindings of earlier transactions kept per key
# How long a connect (or a key's deletion) waits for the participants of the transaction it
# fenced, once that abort is durably decided (well below a client's 30 s operation timeout).
FENCE_WAIT_MS = 5_000
RECORD_PREFIX = b"__transaction_key/"
# The epoch of the forgotten keys (the highest): outside RECORD_PREFIX, so that `recover`'s scan
# of the key records never meets it.
FLOOR_RECORD = b"__transaction_key_floor"


def check_transaction_key(key: Any) -> str:
    """The key itself, or InvalidTransactionKeyError (TypeError for a non-string)."""
    if not isinstance(key, str):
        raise TypeError(f"a transaction key must be a str, not {type(key).__name__}")
    if not key:
        raise InvalidTransactionKeyError("a transaction key must not be empty")
    try:
        size = len(key.encode())
    except UnicodeEncodeError:
        raise InvalidTransactionKeyError(f"a transaction key must be valid text (UTF-8): {key!r}") from None
    # Counted in bytes: the key is stored in an LMDB key (at most 511 bytes) with its owner.
    if size > MAX_KEY_BYTES:
        raise InvalidTransactionKeyError(f"a transaction key has at most {MAX_KEY_BYTES} bytes (UTF-8), not {size}")
    if "&" in key:
        raise InvalidTransactionKeyError(f"a transaction key must not contain '&' (it separates owner and key): {key!r}")
    return key


def key_id(owner: str, key: str) -> str:
    return f"{owner}&{key}"


def coordinator_for(owner: str, key: str, num_coordinators: int) -> int:
    """The coordinator that owns (owner, key) among `num_coordinators` (0 counts as 1: an
    un-partitioned assign topic)."""
    return zlib.crc32(key_id(owner, key).encode()) % max(num_coordinators, 1)


@dataclass
class KeyState:
    owner: str
    key: str
    coordinator_id: int
    epoch: int = NO_EPOCH
    txn: TxnId | None = None                # the latest transaction started under the key
    txn_epoch: int = NO_EPOCH
    history: list[tuple[TxnId, int]] = field(default_factory=list)   # earlier (txn, epoch), oldest first
    created_ms: int = 0
    epoch_ms: int = 0                       # when the current epoch was taken
    deleted: bool = False
    # Not persisted: the connection holding the current epoch (closed when it is fenced).
    holder: Any = None
    on_fenced: Callable[[], None] | None = None
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    # Connects, transactions and deletions holding or waiting for the lock (`_holding`): a
    # released lock looks free before its next waiter runs, so `locked()` alone does not tell.
    users: int = 0

    @property
    def id(self) -> str:
        return key_id(self.owner, self.key)

    def to_json(self) -> bytes:
        return json.dumps({
            "owner": self.owner, "key": self.key, "coordinator_id": self.coordinator_id, "epoch": self.epoch,
            "txn": _txn_json(self.txn), "txn_epoch": self.txn_epoch,
            "history": [[*_txn_json(txn), epoch] for txn, epoch in self.history],
            "created_ms": self.created_ms, "epoch_ms": self.epoch_ms, "deleted": self.deleted,
        }, separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> KeyState:
        data = json.loads(raw)
        txn = TxnId(*data["txn"]) if data["txn"] is not None else None
        return cls(owner=data["owner"], key=data["key"], coordinator_id=data["coordinator_id"], epoch=data["epoch"],
                   txn=txn, txn_epoch=data["txn_epoch"],
                   history=[(TxnId(most, least), epoch) for most, least, epoch in data["history"]],
                   created_ms=data["created_ms"], epoch_ms=data["epoch_ms"], deleted=data["deleted"])


def _txn_json(txn: TxnId | None) -> list[int] | None:
    return None if txn is None else [txn.most_bits, txn.least_bits]


@dataclass(frozen=True)
class KeyInfo:
    """What the admin API shows of one key."""

    owner: str
    key: str
    coordinator_id: int
    epoch: int
    txn: TxnId | None
    txn_status: str | None
    created_ms: int
    epoch_ms: int
    age_ms: int                 # since the current epoch was taken
    connected: bool


class TransactionKeys:
    """The transaction keys of one broker's coordinators, and the epoch checks."""

    def __init__(self, env: StorageEnvironment, service: TransactionCoordinatorService, clock: Clock) -> None:
        self.env = env
        self.service = service
        self._clock = clock
        self._keys: dict[str, KeyState] = {}
        self._bindings: dict[TxnId, tuple[KeyState, int]] = {}     # txn -> (its key, the epoch it began under)
        self._floor = NO_EPOCH                  # a new key's first epoch is above it (purge_deleted)
        self.fence_wait_ms = FENCE_WAIT_MS
        self._holds = 0                         # connects_held() in progress
        self._connects_open = asyncio.Event()   # set while none is
        self._connects_open.set()

    # --- recovery -------------------------------------------------------------------------

    def recover(self) -> None:
        """Load the records (before the coordinators serve)."""
        db = self.env.db("meta")
        with self.env.read() as txn:
            floor = txn.get(FLOOR_RECORD, db=db)
            if floor is not None:
                self._floor = int(floor)
            cursor = txn.cursor(db=db)
            if cursor.set_range(RECORD_PREFIX):
                for raw_key, value in cursor:
                    if not raw_key.startswith(RECORD_PREFIX):
                        break
                    state = KeyState.from_json(value)
                    self._keys[state.id] = state
                    for bound, epoch in state.history:
                        self._bindings[bound] = (state, epoch)
                    if state.txn is not None:
                        self._bindings[state.txn] = (state, state.txn_epoch)

    # --- checks ---------------------------------------------------------------------------

    def check_txn(self, txn: TxnId) -> None:
        """ExpiredTransactionError when `txn` began under an epoch its key has left."""
        bound = self._bindings.get(txn)
        if bound is not None and bound[1] < bound[0].epoch:
            state, epoch = bound
            raise ExpiredTransactionError(
                f"transaction {txn} began under epoch {epoch} of transaction key {state.key!r}, which "
                f"{'was deleted' if state.deleted else f'is now at epoch {state.epoch}'}: {self._fate(txn)}")

    def _fate(self, txn: TxnId) -> str:
        """What became of a fenced transaction, as its expiry tells it (never "aborted" for one
        whose commit was decided before the fence: that would have its task redo work that is in)."""
        try:
            status = self.service.get(txn).status
        except TransactionNotFoundError:
            return "it has ended"
        if status in (TxnStatus.COMMITTING, TxnStatus.COMMITTED):
            return "its commit was decided before the fence; it ends committed"
        return "it was aborted"

    def fenced(self, txn: TxnId) -> bool:
        """Whether `txn` began under an epoch its key has left (`check_txn` would refuse it)."""
        bound = self._bindings.get(txn)
        return bound is not None and bound[1] < bound[0].epoch

    def check_epoch(self, owner: str, key: str, epoch: int) -> KeyState:
        """The key's state if `epoch` is its current one; NotAllowed for an older epoch."""
        state = self._keys.get(key_id(owner, key))
        if state is None or state.epoch != epoch:
            current = "deleted" if state is None or state.deleted else f"at epoch {state.epoch}"
            raise NotAllowedError(f"transaction key {key!r}: epoch {epoch} was fenced (the key is {current})")
        return state

    # --- connections ----------------------------------------------------------------------

    @contextlib.contextmanager
    def connects_held(self) -> Iterator[None]:
        """Hold new key connects while the number of coordinators changes: a connect checks its
        coordinator against that number, so one checked against the old number just before the
        new one takes effect would own a key that then belongs to another coordinator (its
        holder's reconnects refused). Entered in the same event-loop turn as the caller's
        check of the keys that exist; the held connects go on, checked against the number
        then running, when the last hold is released."""
        self._holds += 1
        self._connects_open.clear()
        try:
            yield
        finally:
            self._holds -= 1
            if not self._holds:
                self._connects_open.set()

    async def connect(self, owner: str, key: str, coordinator_id: int, presented: int, *,
                      holder: Any = None, on_fenced: Callable[[], None] | None = None) -> int:
        """Give the next epoch of (owner, key) to a connection that presented `presented` (the
        epoch of its previous connection, -1 for none); fence the previous epoch."""
        check_transaction_key(key)
        while not self._connects_open.is_set():
            await self._connects_open.wait()
        expected = coordinator_for(owner, key, len(self.service.coordinator_ids))
        if coordinator_id != expected:
            raise NotAllowedError(f"transaction key {key!r} of {owner!r} belongs to coordinator {expected}, "
                                  f"not {coordinator_id} (CRC-32 of 'owner&key' modulo the coordinators)")
        state = self._keys.get(key_id(owner, key))
        if state is None:
            if presented != NO_EPOCH:
                # Refused before any state is made: refused connects of unknown keys must not
                # fill the coordinator's memory.
                if 0 <= presented <= self._floor:
                    raise NotAllowedError(f"transaction key {key!r}: epoch {presented} is not the key's (it has "
                                          "none: deleted, or never given); only a new task (epoch -1) may connect")
                raise NotAllowedError(f"transaction key {key!r}: epoch {presented} was never given (the key has "
                                      f"none yet); only a new task (epoch -1) may connect")
            now = self._clock()
            state = self._keys[key_id(owner, key)] = KeyState(owner, key, coordinator_id, created_ms=now, epoch_ms=now)
        previous_holder = previous_close = None
        try:
            async with self._holding(state):
                if presented != NO_EPOCH and (presented != state.epoch or state.deleted):
                    raise NotAllowedError(f"transaction key {key!r}: epoch {presented} was fenced (the key is at "
                                          f"epoch {state.epoch}); only a new task (epoch -1) may connect")
                before = self._snapshot(state)
                if state.deleted:
                    state.deleted = False
                    state.created_ms = self._clock()
                if state.epoch == NO_EPOCH:
                    state.epoch = self._floor      # a new key starts above every forgotten one
                state.epoch += 1                   # 1. fences the older epoch's requests at once
                state.epoch_ms = self._clock()
                epoch = state.epoch
                if presented != NO_EPOCH and state.txn is not None and state.txn_epoch == presented:
                    # The holder reconnecting (it presented the current epoch): its transaction
                    # goes on under the new epoch, as a transaction without a key survives a
                    # reconnect. Only a new task (-1) takes over, aborting it.
                    state.txn_epoch = epoch
                    self._bindings[state.txn] = (state, epoch)
                try:
                    await self._persist(state)     # 2. durable before it is answered,
                except BaseException:
                    # Not fenced after all: nothing of this connect stays (the holder keeps its
                    # connection and transaction; a restart would not know this epoch either).
                    self._restore(state, before)
                    raise
                # The holder changes once the record is durable: one that disconnected meanwhile
                # is gone, not put back by a failed write's undo.
                previous_holder, previous_close = state.holder, state.on_fenced
                state.holder, state.on_fenced = holder, on_fenced
                try:
                    fenced, ending = state.txn, await self._abort_open(state)   # and so is the abort's decision
                except BaseException:
                    # The epoch stays taken (its record is durable) but the caller is refused and
                    # never learns it: its connection does not hold the key, nor release it later.
                    if state.holder is holder:
                        state.holder, state.on_fenced = None, None
                    raise
            await self._wait_for_participants(state, fenced, ending)       # 3. bounded
        finally:
            # 4. the zombie's connection, once its txn's acks are (as a rule) released: its
            # consumers' unacknowledged messages then go back to the subscription in full.
            if previous_close is not None and previous_holder is not holder:
                previous_close()
        log.info("transaction key %s: epoch %d", state.id, epoch)
        return epoch

    def disconnected(self, owner: str, key: str, holder: Any) -> None:
        """The connection `holder` closed: it no longer holds the key's epoch."""
        state = self._keys.get(key_id(owner, key))
        if state is not None and state.holder is holder:
            state.holder, state.on_fenced = None, None

    # --- transactions ---------------------------------------------------------------------

    async def new_transaction(self, owner: str, key: str, epoch: int, coordinator_id: int, timeout_ms: int) -> TxnId:
        """A transaction of the key, under its current `epoch` (NotAllowed if fenced, or if the
        key's previous transaction is still open)."""
        state = self.check_epoch(owner, key, epoch)
        async with self._holding(state):
            self.check_epoch(owner, key, epoch)    # fenced while waiting for the lock
            if state.txn is not None:
                # Its end submitted but not yet durable: should that write fail, it is OPEN
                # again, and the key would have two open transactions.
                await self.service.decision_written(state.txn)
            if state.txn is not None and self._is_open(state.txn):
                raise NotAllowedError(f"transaction key {key!r} already has an open transaction {state.txn}: "
                                      "commit or abort it first (one open transaction per key)")
            txn = await self.service.new_transaction(coordinator_id, timeout_ms)
            history = [*state.history, (state.txn, state.txn_epoch)] if state.txn is not None else state.history
            # The record first, memory once it is durable: bound in memory only, a transaction
            # the client never got (the request failed) would hold the key as its open one
            # until its timeout, and a restart would not know it. Unbound, it just times out.
            await self._persist(replace(state, txn=txn, txn_epoch=epoch, history=history[-HISTORY:]))
            for dropped, _ in history[:-HISTORY]:
                self._bindings.pop(dropped, None)
            state.history = history[-HISTORY:]
            state.txn, state.txn_epoch = txn, epoch
            self._bindings[txn] = (state, epoch)
            return txn

    # --- admin ----------------------------------------------------------------------------

    def keys(self) -> Iterator[KeyState]:
        return (state for state in self._keys.values() if not state.deleted and state.epoch > NO_EPOCH)

    def keys_that_may_connect(self) -> Iterator[KeyState]:
        """The keys, and those whose lock is held or waited for (a deletion or a connect under
        way): a connect waiting for it checked its coordinator already, against the number of coordinators then,
        and would take the key back (deleted or new) under that number (see connects_held)."""
        return (state for state in self._keys.values()
                if (not state.deleted and state.epoch > NO_EPOCH) or state.users)

    def info(self, state: KeyState) -> KeyInfo:
        status = None
        if state.txn is not None:
            try:
                status = self.service.get(state.txn).status.name
            except TransactionNotFoundError:
                status = None                      # ended and no longer retained
        return KeyInfo(state.owner, state.key, state.coordinator_id, state.epoch, state.txn, status,
                       state.created_ms, state.epoch_ms, max(self._clock() - state.epoch_ms, 0),
                       state.holder is not None)

    def find(self, owner: str, key: str) -> KeyState:
        check_transaction_key(key)
        state = self._keys.get(key_id(owner, key))
        if state is None or state.deleted or state.epoch == NO_EPOCH:
            raise KeyNotFoundError(f"transaction key {key!r} of {owner!r} does not exist")
        return state

    async def delete(self, owner: str, key: str) -> None:
        """Fence the key's holder, abort its transaction and remove the key (a tombstone keeps
        its epoch so that it never goes backwards)."""
        state = self.find(owner, key)
        async with self._holding(state):
            if state.deleted:
                raise KeyNotFoundError(f"transaction key {key!r} of {owner!r} does not exist")
            before = self._snapshot(state)
            state.epoch += 1
            state.epoch_ms = self._clock()
            state.deleted = True
            try:
                await self._persist(state)
            except BaseException:
                self._restore(state, before)       # not deleted: its holder keeps it
                raise
            previous_close = state.on_fenced       # (the holder as of now: see connect)
            state.holder, state.on_fenced = None, None
            if previous_close is not None:
                previous_close()
            fenced, ending = state.txn, await self._abort_open(state)
        await self._wait_for_participants(state, fenced, ending)

    async def purge_deleted(self, older_than_ms: int) -> int:
        """Forget the keys deleted at least `older_than_ms` ago whose transactions have all
        ended, and those whose first connect failed (never given an epoch); returns how many.
        Their records are deleted and the epoch floor raised to their epochs in one write."""
        now = self._clock()
        gone = [state for state in self._keys.values() if self._forgettable(state, now, older_than_ms)]
        if not gone:
            return 0
        # Forgotten in memory in this event-loop turn, with the floor raised: a connect from now
        # on makes a new state above it, and its record's write is queued after this one.
        self._floor = max([self._floor, *(state.epoch for state in gone)])
        for state in gone:
            self._forget(state)
        db = self.env.db("meta")
        records = [RECORD_PREFIX + state.id.encode() for state in gone]
        floor = str(self._floor).encode()

        def write(txn) -> None:
            for record in records:
                txn.delete(record, db=db)
            txn.put(FLOOR_RECORD, floor, db=db)

        # (Should this write fail, the records are back after a restart, still below the
        # floor in memory until then: either way no epoch is given twice.)
        await self.env.submit(write)
        log.info("forgot %d transaction key(s) (deleted, or never given an epoch); new keys start above epoch %d",
                 len(gone), self._floor)
        return len(gone)

    def _forgettable(self, state: KeyState, now: int, older_than_ms: int) -> bool:
        if state.users:
            return False                           # a connect, transaction or deletion under way or waiting
        if state.epoch == NO_EPOCH:
            return True
        if not state.deleted or now - state.epoch_ms < older_than_ms:
            return False
        return all(self._has_ended(txn) for txn in (state.txn, *(bound for bound, _ in state.history))
                   if txn is not None)

    def _forget(self, state: KeyState) -> None:
        if self._keys.get(state.id) is state:
            del self._keys[state.id]
        for txn in (state.txn, *(bound for bound, _ in state.history)):
            if txn is not None and self._bindings.get(txn, (None,))[0] is state:
                del self._bindings[txn]

    # --- helpers --------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def _holding(self, state: KeyState) -> AsyncIterator[None]:
        """The key's lock, counted in `state.users` from before it is waited for: a state with
        users is never forgotten (a connect that waited would give an epoch on a state no longer
        the key's, and the next connect the same epoch again)."""
        state.users += 1
        try:
            async with state.lock:
                yield
        finally:
            state.users -= 1

    def _has_ended(self, txn: TxnId) -> bool:
        try:
            return self.service.get(txn).status.is_terminal
        except TransactionNotFoundError:
            return True                            # ended, and past its retention

    def _is_open(self, txn: TxnId) -> bool:
        try:
            return self.service.get(txn).status == TxnStatus.OPEN
        except TransactionNotFoundError:
            return False

    async def _abort_open(self, state: KeyState) -> asyncio.Future[TxnStatus] | None:
        """Decide the abort of the key's transaction if a fence left it unended (open, or its
        ending still under way, e.g. that of an earlier fence); returns once the decision is
        durable, with the ending's future (None: nothing left to end)."""
        if state.txn is None or state.txn_epoch >= state.epoch:
            return None
        try:
            status = self.service.get(state.txn).status
        except TransactionNotFoundError:
            return None
        if status.is_terminal:
            return None
        return await self.service.abort_fenced(state.txn)

    async def _wait_for_participants(self, state: KeyState, txn: TxnId | None,
                                     ending: asyncio.Future[TxnStatus] | None) -> None:
        """Wait `fence_wait_ms` at most for the ending of `txn`, the fenced txn (its decision
        is durable: the participants are told in the background regardless, until each
        confirms)."""
        if ending is None:
            return
        try:
            await asyncio.wait({ending}, timeout=self.fence_wait_ms / 1000)
        finally:
            if not ending.done():
                ending.cancel()                    # this caller's waiter only, not the ending
        if ending.cancelled():
            log.warning("transaction key %s: the end of fenced transaction %s is durably decided but not yet "
                        "confirmed by all its participants after %d ms; answering, they are told in the background",
                        state.id, txn, self.fence_wait_ms)
        elif ending.exception() is not None:
            log.warning("transaction key %s: the ending of fenced transaction %s stopped (its decision is "
                        "durable: a restart, or the key's next fence, resumes it): %r",
                        state.id, txn, ending.exception())

    def _snapshot(self, state: KeyState) -> tuple:
        binding = self._bindings.get(state.txn) if state.txn is not None else None
        return state.epoch, state.epoch_ms, state.deleted, state.created_ms, state.txn_epoch, binding

    def _restore(self, state: KeyState, snapshot: tuple) -> None:
        """Undo a change of `state` whose record could not be written."""
        state.epoch, state.epoch_ms, state.deleted, state.created_ms, state.txn_epoch, binding = snapshot
        if state.txn is not None and binding is not None:
            self._bindings[state.txn] = binding

    async def _persist(self, state: KeyState) -> None:
        db = self.env.db("meta")
        record_key = RECORD_PREFIX + state.id.encode()
        value = state.to_json()
        await self.env.submit(lambda txn: txn.put(record_key, value, db=db), key=("txnkey", record_key))


class KeyNotFoundError(TransactionNotFoundError):
    """No such transaction key (the admin API answers 404)."""
