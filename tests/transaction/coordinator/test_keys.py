"""Transaction keys on the coordinator service: epochs, fencing, persistence, one open
transaction per key, deletion, and a stateful comparison with a small reference model."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from pyengine.errors import (
    ExpiredTransactionError,
    InvalidTransactionKeyError,
    InvalidTxnStatusError,
    NotAllowedError,
)
from pyengine.transaction import TxnAction, TxnStatus
from pyengine.transaction.coordinator.keys import (
    ANONYMOUS,
    HISTORY,
    RECORD_PREFIX,
    KeyNotFoundError,
    check_transaction_key,
    coordinator_for,
)
from tests.transaction.coordinator.fakes import FakeClock, RecordingParticipants
from tests.transaction.coordinator.helpers import ServiceHarness
from tests.waiting import eventually

N = 4


def tc(key: str, owner: str = ANONYMOUS) -> int:
    return coordinator_for(owner, key, N)


@pytest.fixture
async def harness(data_dir, participants, clock):
    h = ServiceHarness(data_dir, participants, clock, num_coordinators=N)
    await h.start()
    yield h
    await h.stop()


class Holder:
    """Stands for a connection: records that the fence closed it."""

    def __init__(self) -> None:
        self.closed = False

    def close(self) -> None:
        self.closed = True


async def connect(service, key: str, presented: int = -1, holder: Holder | None = None) -> int:
    holder = holder or Holder()
    return await service.keys.connect(ANONYMOUS, key, tc(key), presented, holder=holder, on_fenced=holder.close)


async def test_a_refused_connect_of_an_unknown_key_leaves_nothing_behind(harness):
    """An epoch presented for a key that never had one is refused (as any fenced epoch), and
    no state is kept for it: before, each such connect left an entry in memory."""
    service = harness.service
    for n in range(50):
        with pytest.raises(NotAllowedError, match="was never given"):
            await connect(service, f"unknown-{n}", presented=3)
    assert list(service.keys.keys()) == []
    assert await connect(service, "unknown-0") == 0           # a new task still connects


async def test_epochs_count_up_from_zero_and_fence_the_previous_holder(harness):
    service = harness.service
    first, second = Holder(), Holder()
    assert await connect(service, "k", holder=first) == 0
    assert await connect(service, "k", holder=second) == 1
    assert first.closed and not second.closed
    with pytest.raises(NotAllowedError, match="epoch 0 was fenced"):
        await connect(service, "k", presented=0)                  # the zombie reconnecting
    assert await connect(service, "k", presented=1, holder=second) == 2   # the holder reconnecting
    assert not second.closed                                       # it is not fenced by itself
    with pytest.raises(NotAllowedError):
        await connect(service, "k", presented=7)                   # an epoch never handed out


async def test_a_new_epoch_aborts_the_open_transaction_and_expires_its_requests(harness, participants):
    service = harness.service
    await connect(service, "job")
    txn = await service.keys.new_transaction(ANONYMOUS, "job", 0, tc("job"), 60_000)
    await service.add_produced_partitions(txn, ["persistent://t/n/out"])
    await service.add_acked_subscriptions(txn, [("persistent://t/n/in", "sub")])
    await connect(service, "job")
    assert service.get(txn).status == TxnStatus.ABORTED          # at once, not after 60 s
    assert participants.told(txn) == {"persistent://t/n/out": {TxnAction.ABORT},
                                      ("persistent://t/n/in", "sub"): {TxnAction.ABORT}}
    with pytest.raises(ExpiredTransactionError):
        service.register_produced_partitions(txn, ["persistent://t/n/other"])
    with pytest.raises(ExpiredTransactionError):
        service.register_acked_subscriptions(txn, [("persistent://t/n/in", "sub")])
    for action in (TxnAction.COMMIT, TxnAction.ABORT):
        with pytest.raises(ExpiredTransactionError):
            await service.end_transaction(txn, action)
    assert await service.end_transaction(txn, TxnAction.ABORT, check_epoch=False) == TxnStatus.ABORTED
    with pytest.raises(NotAllowedError):
        await service.keys.new_transaction(ANONYMOUS, "job", 0, tc("job"), 60_000)   # old epoch


async def test_the_holder_reconnecting_keeps_its_transaction_and_a_new_task_takes_it_over(harness, participants):
    service = harness.service
    holder = Holder()
    await connect(service, "job", holder=holder)
    txn = await service.keys.new_transaction(ANONYMOUS, "job", 0, tc("job"), 60_000)
    await service.add_produced_partitions(txn, ["persistent://t/n/out"])
    assert await connect(service, "job", presented=0, holder=holder) == 1     # its connection dropped
    assert service.get(txn).status == TxnStatus.OPEN
    service.keys.check_txn(txn)                                  # not expired: bound to epoch 1 now
    await service.add_produced_partitions(txn, ["persistent://t/n/other"])
    with pytest.raises(NotAllowedError, match="already has an open transaction"):
        await service.keys.new_transaction(ANONYMOUS, "job", 1, tc("job"), 60_000)
    await harness.restart()                                      # and after a restart, as the records say
    service = harness.service
    assert await connect(service, "job", presented=1) == 2
    assert service.get(txn).status == TxnStatus.OPEN
    await connect(service, "job")                                # a new task: the one that fences
    assert service.get(txn).status == TxnStatus.ABORTED
    with pytest.raises(ExpiredTransactionError, match="it was aborted"):
        await service.end_transaction(txn, TxnAction.COMMIT)


async def test_a_transaction_committed_before_the_fence_stays_committed(harness, participants):
    service = harness.service
    await connect(service, "job")
    txn = await service.keys.new_transaction(ANONYMOUS, "job", 0, tc("job"), 60_000)
    await service.add_produced_partitions(txn, ["persistent://t/n/out"])
    await service.end_transaction(txn, TxnAction.COMMIT)
    await connect(service, "job")
    assert service.get(txn).status == TxnStatus.COMMITTED
    # Its COMMIT sent again (the answer was lost) is told the truth: not "expired, aborted",
    # which would have the task redo committed work.
    assert await service.end_transaction(txn, TxnAction.COMMIT) == TxnStatus.COMMITTED
    with pytest.raises(ExpiredTransactionError, match="commit was decided before the fence"):
        await service.end_transaction(txn, TxnAction.ABORT)            # the other decision: still bound


async def test_a_commit_under_way_at_the_fence_is_answered_committed_when_repeated(harness, participants):
    service = harness.service
    await connect(service, "job")
    txn = await service.keys.new_transaction(ANONYMOUS, "job", 0, tc("job"), 60_000)
    await service.add_produced_partitions(txn, ["persistent://t/n/out"])
    held = participants.block("persistent://t/n/out")     # its ending waits at the participant
    committing = asyncio.ensure_future(service.end_transaction(txn, TxnAction.COMMIT))
    await participants.reached("persistent://t/n/out")      # the commit is decided
    fencing = asyncio.ensure_future(connect(service, "job"))
    await eventually(lambda: service.keys.fenced(txn))
    repeated = asyncio.ensure_future(service.end_transaction(txn, TxnAction.COMMIT))
    held.set()
    assert await committing == TxnStatus.COMMITTED and await repeated == TxnStatus.COMMITTED
    assert await fencing == 1


async def test_one_open_transaction_per_key(harness):
    service = harness.service
    await connect(service, "k")
    txn = await service.keys.new_transaction(ANONYMOUS, "k", 0, tc("k"), 60_000)
    with pytest.raises(NotAllowedError, match="already has an open transaction"):
        await service.keys.new_transaction(ANONYMOUS, "k", 0, tc("k"), 60_000)
    await service.end_transaction(txn, TxnAction.ABORT)
    await service.keys.new_transaction(ANONYMOUS, "k", 0, tc("k"), 60_000)


async def test_concurrent_new_transactions_of_one_key_give_one(harness):
    service = harness.service
    await connect(service, "k")
    results = await asyncio.gather(*(service.keys.new_transaction(ANONYMOUS, "k", 0, tc("k"), 60_000)
                                     for _ in range(5)), return_exceptions=True)
    assert sum(not isinstance(r, BaseException) for r in results) == 1
    assert all(isinstance(r, NotAllowedError) for r in results if isinstance(r, BaseException))


async def test_concurrent_connects_each_get_their_own_epoch(harness):
    service = harness.service
    holders = [Holder() for _ in range(8)]
    epochs = await asyncio.gather(*(connect(service, "race", holder=h) for h in holders))
    assert sorted(epochs) == list(range(8))
    winners = [h for h, e in zip(holders, epochs) if not h.closed]
    assert len(winners) == 1 and epochs[holders.index(winners[0])] == 7


async def test_epochs_and_fencing_survive_a_restart(harness):
    service = harness.service
    for _ in range(3):
        await connect(service, "k")
    txn = await service.keys.new_transaction(ANONYMOUS, "k", 2, tc("k"), 60_000)
    await connect(service, "k")                                  # epoch 3 fences txn
    service = await harness.restart()
    with pytest.raises(ExpiredTransactionError):
        await service.end_transaction(txn, TxnAction.COMMIT)
    assert await connect(service, "k") == 4


async def test_an_open_transaction_of_a_key_is_aborted_by_a_connect_after_a_restart(harness):
    service = harness.service
    await connect(service, "k")
    txn = await service.keys.new_transaction(ANONYMOUS, "k", 0, tc("k"), 60_000)
    service = await harness.restart()
    assert service.get(txn).status == TxnStatus.OPEN
    assert await connect(service, "k") == 1
    assert service.get(txn).status == TxnStatus.ABORTED


async def test_delete_fences_the_key_and_keeps_its_epoch(harness):
    service = harness.service
    holder = Holder()
    await connect(service, "gone", holder=holder)
    txn = await service.keys.new_transaction(ANONYMOUS, "gone", 0, tc("gone"), 60_000)
    await service.keys.delete(ANONYMOUS, "gone")
    assert holder.closed and service.get(txn).status == TxnStatus.ABORTED
    assert [s.key for s in service.keys.keys()] == []
    with pytest.raises(KeyNotFoundError):
        service.keys.find(ANONYMOUS, "gone")
    with pytest.raises(KeyNotFoundError):
        await service.keys.delete(ANONYMOUS, "gone")
    with pytest.raises(NotAllowedError):
        await connect(service, "gone", presented=0)               # its holder cannot come back
    service = await harness.restart()
    assert await connect(service, "gone") == 2                    # above the tombstone's epoch 1


async def test_the_key_must_be_on_its_own_coordinator(harness):
    wrong = (tc("k") + 1) % N
    with pytest.raises(NotAllowedError, match=f"belongs to coordinator {tc('k')}"):
        await harness.service.keys.connect(ANONYMOUS, "k", wrong, -1)


# Counted in UTF-8 bytes (found by an audit: 200 CJK characters passed a count of characters,
# and their record, an LMDB key over 511 bytes, failed a group commit other clients shared).
@pytest.mark.parametrize("key", ["", "x" * 257, "a&b", "漢" * 86, "é" * 129, "\ud800"])
async def test_bad_keys_are_refused(harness, key):
    with pytest.raises(InvalidTransactionKeyError):
        await harness.service.keys.connect(ANONYMOUS, key, 0, -1)
    with pytest.raises(InvalidTransactionKeyError):
        check_transaction_key(key)


def test_key_checks():
    assert check_transaction_key("x" * 256) == "x" * 256
    assert check_transaction_key("é" * 128) == "é" * 128            # 256 bytes
    with pytest.raises(TypeError):
        check_transaction_key(None)
    assert coordinator_for("a", "b", 0) == 0                     # an un-partitioned assign topic
    assert coordinator_for("a", "b", 16) == coordinator_for("a", "b", 16)


async def test_old_bindings_beyond_the_history_are_forgotten(harness):
    service = harness.service
    await connect(service, "k")
    txns = []
    for _ in range(HISTORY + 3):
        txn = await service.keys.new_transaction(ANONYMOUS, "k", 0, tc("k"), 60_000)
        await service.end_transaction(txn, TxnAction.COMMIT)
        txns.append(txn)
    await connect(service, "k")
    with pytest.raises(ExpiredTransactionError):
        service.keys.check_txn(txns[-HISTORY - 1])
    service.keys.check_txn(txns[0])                                # forgotten: no longer checked
    assert len(service.keys.find(ANONYMOUS, "k").history) == HISTORY


class KeyMachine(RuleBasedStateMachine):
    """Random connects, transactions, deletes and purges of deleted keys, of a few keys, against
    a model: the current epoch per key, the epoch of each txn, which txns must be expired, and
    the epoch floor of the forgotten keys."""

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()

    @initialize(data_dir=st.just(None))
    def start(self, data_dir) -> None:
        import tempfile
        from pathlib import Path
        self.tmp = tempfile.TemporaryDirectory()
        self.harness = ServiceHarness(Path(self.tmp.name), RecordingParticipants(), FakeClock(), num_coordinators=N,
                                      sync=False)
        self.loop.run_until_complete(self.harness.start())
        self.epoch: dict[str, int] = {}            # model: current epoch (tombstones included)
        self.deleted: set[str] = set()
        self.forgotten: dict[str, int] = {}        # deleted keys purged: their last epoch
        self.floor = -1                            # the highest of those: new keys start above
        self.txns: list[tuple[str, int, object]] = []
        self.committed: set[object] = set()

    def run(self, coro):
        return self.loop.run_until_complete(coro)

    @rule(key=st.sampled_from(["a", "b"]), reconnect=st.booleans())
    def connect(self, key, reconnect) -> None:
        current = self.epoch.get(key, self.forgotten.get(key, -1))
        presented = current if reconnect and current >= 0 else -1
        if presented >= 0 and (key in self.deleted or key in self.forgotten):
            with pytest.raises(NotAllowedError):
                self.run(connect(self.harness.service, key, presented))
            return
        got = self.run(connect(self.harness.service, key, presented))
        assert got == (current if key in self.epoch else self.floor) + 1
        self.epoch[key] = got
        self.deleted.discard(key)
        self.forgotten.pop(key, None)
        latest = next((i for i in reversed(range(len(self.txns))) if self.txns[i][0] == key), None)
        if presented >= 0 and latest is not None and self.txns[latest][1] == presented:
            self.txns[latest] = (key, got, self.txns[latest][2])     # the holder's goes on with it

    @rule(key=st.sampled_from(["a", "b"]), stale=st.booleans())
    def new_transaction(self, key, stale) -> None:
        if key not in self.epoch or key in self.deleted:
            return
        epoch = self.epoch[key] - 1 if stale else self.epoch[key]
        service = self.harness.service
        open_txns = [t for k, e, t in self.txns if k == key and service.get(t).status == TxnStatus.OPEN]
        if stale or open_txns:
            with pytest.raises(NotAllowedError):
                self.run(service.keys.new_transaction(ANONYMOUS, key, epoch, tc(key), 60_000))
            return
        txn = self.run(service.keys.new_transaction(ANONYMOUS, key, epoch, tc(key), 60_000))
        self.txns.append((key, epoch, txn))

    @rule(commit=st.booleans())
    def end_latest(self, commit) -> None:
        if not self.txns:
            return
        key, epoch, txn = self.txns[-1]
        service = self.harness.service
        action = TxnAction.COMMIT if commit else TxnAction.ABORT
        if epoch < self.epoch[key]:
            if commit and txn in self.committed:          # a repeat of its decision: the truth
                assert self.run(service.end_transaction(txn, action)) == TxnStatus.COMMITTED
                return
            with pytest.raises(ExpiredTransactionError):
                self.run(service.end_transaction(txn, action))
        elif service.get(txn).status == TxnStatus.OPEN:
            self.run(service.end_transaction(txn, action))
            if commit:
                self.committed.add(txn)

    @rule(key=st.sampled_from(["a", "b"]))
    def delete(self, key) -> None:
        if key not in self.epoch or key in self.deleted:
            with pytest.raises(KeyNotFoundError):
                self.run(self.harness.service.keys.delete(ANONYMOUS, key))
            return
        self.run(self.harness.service.keys.delete(ANONYMOUS, key))
        self.epoch[key] += 1
        self.deleted.add(key)

    @rule()
    def purge_deleted(self) -> None:
        """Every deleted key's transactions have ended here (its deletion waited for them)."""
        service = self.harness.service
        assert all(service.get(txn).status.is_terminal for key, _, txn in self.txns if key in self.deleted)
        assert self.run(service.keys.purge_deleted(0)) == len(self.deleted)
        for key in self.deleted:
            self.forgotten[key] = self.epoch.pop(key)
            self.floor = max(self.floor, self.forgotten[key])
        self.txns = [entry for entry in self.txns if entry[0] not in self.deleted]
        self.deleted.clear()

    @rule()
    def restart(self) -> None:
        self.run(self.harness.restart())

    @invariant()
    def fenced_txns_are_expired_and_not_open(self) -> None:
        if not hasattr(self, "harness"):
            return
        service = self.harness.service
        for key, epoch, txn in self.txns[-HISTORY:]:
            if epoch < self.epoch[key]:
                with pytest.raises(ExpiredTransactionError):
                    service.keys.check_txn(txn)
                assert service.get(txn).status != TxnStatus.OPEN
            else:
                service.keys.check_txn(txn)
        listed = {state.key: state.epoch for state in service.keys.keys()}
        assert listed == {k: e for k, e in self.epoch.items() if k not in self.deleted}

    def teardown(self) -> None:
        if hasattr(self, "harness"):
            self.run(self.harness.stop())
            self.tmp.cleanup()
        self.loop.close()


KeyMachine.TestCase.settings = settings(max_examples=15, stateful_step_count=20, deadline=None)
test_key_model = KeyMachine.TestCase


# --- a fenced transaction's abort that a participant never confirms ----------------------------

OUT, IN = "persistent://t/n/out", ("persistent://t/n/in", "sub")
ANSWERED_WITHIN_S = 3          # far above the fence's wait for the participants, far below "never"


async def open_transaction_of(service, key: str, epoch: int):
    txn = await service.keys.new_transaction(ANONYMOUS, key, epoch, tc(key), 60_000)
    await service.add_produced_partitions(txn, [OUT])
    await service.add_acked_subscriptions(txn, [IN])
    return txn


async def test_a_connect_is_answered_while_a_participant_never_confirms_the_fenced_abort(harness, participants):
    """The connect waits for the abort's decision to be durable and the zombie's epoch fenced,
    and for the participants only a bounded time: their fan-out goes on in the background,
    retried until each confirms, as for any ending."""
    service = harness.service
    service.keys.fence_wait_ms = 100
    zombie, task2, task3 = Holder(), Holder(), Holder()
    await connect(service, "job", holder=zombie)
    txn = await open_transaction_of(service, "job", 0)
    release = participants.block(IN)                              # never confirms (until released)

    assert await asyncio.wait_for(connect(service, "job", holder=task2), ANSWERED_WITHIN_S) == 1
    assert service.get(txn).status == TxnStatus.ABORTING           # decided, not confirmed everywhere
    assert zombie.closed and not task2.closed
    with pytest.raises(ExpiredTransactionError):                   # the zombie is fenced
        service.register_produced_partitions(txn, ["persistent://t/n/other"])
    with pytest.raises(ExpiredTransactionError):
        await service.end_transaction(txn, TxnAction.COMMIT)
    with pytest.raises(InvalidTxnStatusError):                     # and can only end aborted
        await service.end_transaction(txn, TxnAction.COMMIT, check_epoch=False)

    # Another connect of the key does not queue behind the pending fan-out either.
    assert await asyncio.wait_for(connect(service, "job", holder=task3), ANSWERED_WITHIN_S) == 2
    assert task2.closed and not task3.closed
    assert service.get(txn).status == TxnStatus.ABORTING
    # The new task works meanwhile: the zombie's transaction is no longer open.
    mine = await asyncio.wait_for(service.keys.new_transaction(ANONYMOUS, "job", 2, tc("job"), 60_000),
                                  ANSWERED_WITHIN_S)

    release.set()
    await eventually(lambda: service.get(txn).status == TxnStatus.ABORTED)
    assert participants.told(txn) == {OUT: {TxnAction.ABORT}, IN: {TxnAction.ABORT}}
    assert service.get(mine).status == TxnStatus.OPEN


async def test_a_second_connect_is_not_blocked_by_a_first_waiting_for_the_participants(harness, participants):
    service = harness.service
    service.keys.fence_wait_ms = 100
    await connect(service, "job")
    txn = await open_transaction_of(service, "job", 0)
    release = participants.block(IN)
    first, second = Holder(), Holder()
    epochs = await asyncio.wait_for(asyncio.gather(connect(service, "job", holder=first),
                                                   connect(service, "job", holder=second)), ANSWERED_WITHIN_S)
    assert epochs == [1, 2] and first.closed and not second.closed
    release.set()
    await eventually(lambda: service.get(txn).status == TxnStatus.ABORTED)


async def test_a_fenced_abort_answered_before_its_participants_confirmed_is_resumed_after_a_restart(
        harness, participants):
    service = harness.service
    service.keys.fence_wait_ms = 100
    await connect(service, "job")
    txn = await open_transaction_of(service, "job", 0)
    release = participants.block(IN)
    assert await asyncio.wait_for(connect(service, "job"), ANSWERED_WITHIN_S) == 1
    service = await harness.restart()                              # the ABORTING decision was durable
    await participants.reached(IN)
    assert service.get(txn).status == TxnStatus.ABORTING
    release.set()
    await eventually(lambda: service.get(txn).status == TxnStatus.ABORTED)
    assert TxnAction.COMMIT not in {call.action for call in participants.calls_for(txn)}
    with pytest.raises(ExpiredTransactionError):
        await service.end_transaction(txn, TxnAction.COMMIT)


async def test_delete_is_answered_while_a_participant_never_confirms_the_abort(harness, participants):
    service = harness.service
    service.keys.fence_wait_ms = 100
    await connect(service, "gone")
    txn = await open_transaction_of(service, "gone", 0)
    release = participants.block(IN)
    await asyncio.wait_for(service.keys.delete(ANONYMOUS, "gone"), ANSWERED_WITHIN_S)
    assert service.get(txn).status == TxnStatus.ABORTING
    assert await asyncio.wait_for(connect(service, "gone"), ANSWERED_WITHIN_S) == 2
    release.set()
    await eventually(lambda: service.get(txn).status == TxnStatus.ABORTED)


async def test_a_connect_whose_record_cannot_be_written_fences_nobody(harness, monkeypatch):
    """Found by an audit: the epoch and the connection were taken in memory before the record
    was written, and kept when it failed: the holder's connection was closed and its commit
    refused, its transaction left open until its timeout, and after a restart the fence was
    gone. Now nothing of the failed connect stays; the holder goes on."""
    service = harness.service
    holder = Holder()
    epoch = await connect(service, "k", holder=holder)
    txn = await service.keys.new_transaction(ANONYMOUS, "k", epoch, tc("k"), 60_000)
    keys, persist = service.keys, service.keys._persist

    async def disk_full(state):
        raise OSError("no space left on device")
    monkeypatch.setattr(keys, "_persist", disk_full)
    with pytest.raises(OSError):
        await connect(service, "k")
    with pytest.raises(OSError):
        await keys.delete(ANONYMOUS, "k")
    monkeypatch.setattr(keys, "_persist", persist)
    assert not holder.closed and keys.find(ANONYMOUS, "k").epoch == epoch
    keys.check_epoch(ANONYMOUS, "k", epoch)                        # the holder is not fenced
    assert await service.end_transaction(txn, TxnAction.COMMIT) is TxnStatus.COMMITTED


# --- deleted keys forgotten (purge_deleted) ------------------------------------------------------

RETENTION_MS = 60_000


def key_record(service, key: str) -> bytes | None:
    env = service.keys.env
    with env.read() as txn:
        return txn.get(RECORD_PREFIX + f"{ANONYMOUS}&{key}".encode(), db=env.db("meta"))


async def test_a_deleted_key_is_forgotten_once_its_transactions_ended_and_the_retention_passed(harness, clock):
    """Before, every deleted key stayed as a tombstone record (and its transactions' bindings)
    for good. Its epoch must still never be given again: the floor takes it over."""
    service = harness.service
    await connect(service, "gone")
    txn = await service.keys.new_transaction(ANONYMOUS, "gone", 0, tc("gone"), 60_000)
    await service.keys.delete(ANONYMOUS, "gone")                  # epoch 1, the txn aborted
    assert await service.keys.purge_deleted(RETENTION_MS) == 0    # within the retention
    with pytest.raises(ExpiredTransactionError):
        service.keys.check_txn(txn)
    clock.advance(RETENTION_MS)
    assert await service.keys.purge_deleted(RETENTION_MS) == 1
    assert key_record(service, "gone") is None
    assert await service.keys.purge_deleted(RETENTION_MS) == 0
    with pytest.raises(NotAllowedError, match="deleted, or never given"):  # its holder still cannot come back
        await connect(service, "gone", presented=0)
    service = await harness.restart()
    assert key_record(service, "gone") is None
    assert await connect(service, "gone") == 2                    # above the forgotten epoch 1
    assert await connect(service, "new") == 2                     # the floor holds for every new key
    assert await connect(service, "new") == 3
    service = await harness.restart()
    assert await connect(service, "gone") == 3


async def test_the_coordinators_sweep_forgets_deleted_keys(data_dir, participants, clock):
    harness = ServiceHarness(data_dir, participants, clock, num_coordinators=N, purge_interval_ms=20,
                             finished_retention_ms=RETENTION_MS)
    service = await harness.start()
    try:
        await connect(service, "gone")
        await service.keys.delete(ANONYMOUS, "gone")
        sweeps, purge = [], service.keys.purge_deleted

        async def counted(older_than_ms):
            sweeps.append(older_than_ms)
            return await purge(older_than_ms)
        service.keys.purge_deleted = counted
        await eventually(lambda: len(sweeps) >= 2)
        assert sweeps[0] == RETENTION_MS and key_record(service, "gone") is not None   # within the retention
        clock.advance(RETENTION_MS)
        await eventually(lambda: key_record(service, "gone") is None)
        assert await connect(service, "gone") == 2
    finally:
        await harness.stop()


async def test_a_deleted_key_whose_transaction_is_still_ending_is_kept(harness, participants, clock):
    service = harness.service
    service.keys.fence_wait_ms = 100
    await connect(service, "gone")
    txn = await open_transaction_of(service, "gone", 0)
    release = participants.block(IN)
    await service.keys.delete(ANONYMOUS, "gone")
    clock.advance(RETENTION_MS)
    assert service.get(txn).status == TxnStatus.ABORTING
    assert await service.keys.purge_deleted(RETENTION_MS) == 0
    with pytest.raises(ExpiredTransactionError):                   # its requests are still told why
        await service.end_transaction(txn, TxnAction.COMMIT)
    release.set()
    await eventually(lambda: service.get(txn).status == TxnStatus.ABORTED)
    assert await service.keys.purge_deleted(RETENTION_MS) == 1
    assert key_record(service, "gone") is None


async def test_keys_in_use_and_a_deletion_under_way_are_not_forgotten(harness, monkeypatch):
    service = harness.service
    keys = service.keys
    await connect(service, "live")
    await connect(service, "gone")
    persist, written = keys._persist, asyncio.Event()

    async def slow_persist(state):
        await written.wait()
        await persist(state)
    monkeypatch.setattr(keys, "_persist", slow_persist)
    deleting = asyncio.create_task(keys.delete(ANONYMOUS, "gone"))
    await asyncio.sleep(0.05)                                     # its tombstone is being written
    assert await keys.purge_deleted(0) == 0
    written.set()
    await deleting
    assert await keys.purge_deleted(0) == 1
    assert [state.key for state in keys.keys()] == ["live"]
    assert key_record(service, "live") is not None


async def test_a_first_connect_whose_record_failed_leaves_nothing_for_good(harness, monkeypatch):
    service = harness.service
    keys = service.keys

    async def disk_full(state):
        raise OSError("no space left on device")
    monkeypatch.setattr(keys, "_persist", disk_full)
    with pytest.raises(OSError):
        await connect(service, "k")
    monkeypatch.undo()
    assert await keys.purge_deleted(RETENTION_MS) == 1             # its state in memory, never given
    assert await keys.purge_deleted(RETENTION_MS) == 0
    assert await connect(service, "k") == 0


@pytest.mark.parametrize("deleted_before", [False, True])
async def test_a_connect_waiting_for_the_key_keeps_it_from_being_forgotten(harness, clock, deleted_before):
    """Found by a review: a released lock looks free before its next waiter runs. A connect whose
    record failed (its state back to never-given, or to an old tombstone) released the lock; the
    purge ran before the waiting connect, forgot the state, and that connect then took an epoch
    on a state no longer the key's: the next connect was given the same epoch."""
    keys = harness.service.keys
    if deleted_before:
        await connect(harness.service, "k")
        await keys.delete(ANONYMOUS, "k")
        clock.advance(RETENTION_MS)
    persist, written, calls = keys._persist, asyncio.Event(), []

    async def first_write_fails(state):
        calls.append(state.epoch)
        if len(calls) == 1:
            await written.wait()
            asyncio.get_running_loop().create_task(keys.purge_deleted(RETENTION_MS))   # the sweep, due first
            raise OSError("no space left on device")
        await persist(state)
    keys._persist = first_write_fails
    failing = asyncio.create_task(connect(harness.service, "k"))
    await asyncio.sleep(0)                                        # it holds the lock, its write under way
    waiting = asyncio.create_task(connect(harness.service, "k"))
    await asyncio.sleep(0)                                        # this one waits for the lock
    written.set()
    with pytest.raises(OSError):
        await failing
    first = await waiting
    assert await connect(harness.service, "k") == first + 1
