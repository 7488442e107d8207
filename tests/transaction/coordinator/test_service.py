"""TransactionCoordinatorService: ending on participants, idempotency, concurrency, timeouts,
restarts, malformed input."""

from __future__ import annotations

import asyncio

import pytest

from pyengine.errors import (
    InvalidTxnStatusError,
    NotAllowedError,
    PersistenceError,
    ServiceNotReadyError,
    SubscriptionNotFoundError,
    TopicNotFoundError,
    TransactionCoordinatorNotFoundError,
    TransactionNotFoundError,
)
from pyengine.storage import StorageEnvironment
from pyengine.storage.errors import CorruptRecordError, StorageError
from pyengine.transaction import TxnAction, TxnStatus
from pyengine.transaction.coordinator import log_records as records
from pyengine.transaction.coordinator.retry import Backoff
from pyengine.transaction.coordinator.service import DEFAULT_MAX_TIMEOUT_MS, TransactionCoordinatorService
from pyengine_kernels import TxnId
from tests.clocks import PausedWallClock
from tests.transaction.coordinator.fakes import RecordingParticipants, StartingParticipants
from tests.transaction.coordinator.helpers import FAST_BACKOFF, ServiceHarness
from tests.waiting import eventually

S, A = TxnStatus, TxnAction


@pytest.fixture
async def harness(data_dir, participants, clock):
    h = ServiceHarness(data_dir, participants, clock)
    await h.start()
    yield h
    await h.stop()


async def new_txn(service, cid=0, timeout_ms=60_000, partitions=("p1", "p2"), subscriptions=(("p1", "s"),)):
    txn = await service.new_transaction(cid, timeout_ms)
    if partitions:
        await service.add_produced_partitions(txn, list(partitions))
    if subscriptions:
        await service.add_acked_subscriptions(txn, list(subscriptions))
    return txn


# --- ending ------------------------------------------------------------------------------

@pytest.mark.parametrize("action,final", [(A.COMMIT, S.COMMITTED), (A.ABORT, S.ABORTED)])
async def test_end_tells_every_participant_then_ends(harness, participants, action, final):
    service = harness.service
    txn = await new_txn(service, cid=1)
    assert await service.end_transaction(txn, action) == final
    assert participants.told(txn) == {"p1": {action}, "p2": {action}, ("p1", "s"): {action}}
    meta = service.get(txn)
    assert meta.status == final and not meta.timed_out


async def test_the_decision_is_durable_before_any_participant_hears_of_it(harness, data_dir):
    service, env = harness.service, harness.env
    seen = []

    class Inspecting(RecordingParticipants):
        async def end_txn_on_partition(self, topic, txn, action, low_watermark, *, after=None):
            if after is not None:       # a participant outside the coordinator's storage waits for it
                await asyncio.shield(after)
            with env.read() as rtxn:
                raw = [records.TxnLogRecord.FromString(v) for k, v in rtxn.cursor(db=env.db("txn_log"))
                       if records.log_sequence(k) != records.HEADER_SEQUENCE]
            seen.append([(r.op, r.new_status) for r in raw if r.op == records.UPDATE])

    service.participants = Inspecting()
    txn = await new_txn(service, subscriptions=())
    await service.end_transaction(txn, A.COMMIT)
    assert seen == [[(records.UPDATE, S.COMMITTING)]] * 2


async def test_end_answers_only_after_every_participant_confirmed(harness, participants):
    service = harness.service
    txn = await new_txn(service)
    release = participants.block(("p1", "s"))
    ending = asyncio.ensure_future(service.end_transaction(txn, A.COMMIT))
    await participants.reached(("p1", "s"))
    await eventually(lambda: len(participants.told(txn)) == 2)
    assert not ending.done() and service.get(txn).status == S.COMMITTING
    assert participants.told(txn) == {"p1": {A.COMMIT}, "p2": {A.COMMIT}}
    with pytest.raises(InvalidTxnStatusError, match="expected OPEN but is COMMITTING"):
        await service.add_produced_partitions(txn, ["p3"])
    release.set()
    assert await ending == S.COMMITTED


async def test_failed_participant_calls_are_retried_until_confirmed(harness, participants):
    service = harness.service
    txn = await new_txn(service)
    participants.fail("p1", RuntimeError("broker busy"), ConnectionError("down"), TimeoutError())
    participants.fail(("p1", "s"), PersistenceError("disk"))
    assert await service.end_transaction(txn, A.ABORT) == S.ABORTED
    assert [c.confirmed for c in participants.calls_for(txn) if c.target == "p1"] == [False, False, False, True]
    assert participants.told(txn) == {"p1": {A.ABORT}, "p2": {A.ABORT}, ("p1", "s"): {A.ABORT}}


async def test_a_participant_that_is_gone_counts_as_confirmed(harness, participants):
    service = harness.service
    txn = await new_txn(service)
    participants.fail("p2", TopicNotFoundError("deleted"))
    participants.fail(("p1", "s"), SubscriptionNotFoundError("deleted"))
    assert await service.end_transaction(txn, A.COMMIT) == S.COMMITTED
    assert len(participants.calls_for(txn)) == 3


async def test_a_hung_participant_call_is_abandoned_and_repeated(data_dir, participants, clock):
    harness = ServiceHarness(data_dir, participants, clock,
                             backoff=Backoff(initial_ms=1, max_ms=2, call_timeout_ms=50))
    service = await harness.start()
    txn = await new_txn(service, subscriptions=())
    release = participants.block("p1")
    ending = asyncio.ensure_future(service.end_transaction(txn, A.COMMIT))
    await asyncio.sleep(0.2)
    assert not ending.done()
    release.set()
    assert await ending == S.COMMITTED
    await harness.stop()


async def test_partitions_started_at_once_are_told_before_the_decision_is_durable(data_dir, clock):
    """A participant that can start a partition's end at once (a loaded topic queues its
    marker) is asked in the turn the decision is queued, so both share a group commit; the
    others are awaited as coroutines. Both confirm, and the txn ends."""
    participants = StartingParticipants(at_once={"p1"})
    harness = ServiceHarness(data_dir, participants, clock)
    service = await harness.start()
    txn = await new_txn(service)
    assert await service.end_transaction(txn, A.COMMIT) == S.COMMITTED
    assert participants.started == [("p1", True)]
    assert participants.told(txn) == {"p1": {A.COMMIT}, "p2": {A.COMMIT}, ("p1", "s"): {A.COMMIT}}
    await harness.stop()


async def test_a_partition_end_started_at_once_that_fails_is_repeated_until_it_lands(data_dir, clock):
    participants = StartingParticipants(at_once={"p1", "p2"})
    participants.fail("p1", PersistenceError("disk"), RuntimeError("busy"))
    participants.fail("p2", TopicNotFoundError("deleted"))       # gone: counts as confirmed
    harness = ServiceHarness(data_dir, participants, clock)
    service = await harness.start()
    txn = await new_txn(service, subscriptions=())
    assert await service.end_transaction(txn, A.ABORT) == S.ABORTED
    assert [c.confirmed for c in participants.calls_for(txn) if c.target == "p1"] == [False, False, True]
    assert [c.confirmed for c in participants.calls_for(txn) if c.target == "p2"] == [False]
    assert [topic for topic, _ in participants.started] == ["p1", "p2"]   # the repeats are coroutines
    await harness.stop()


async def test_a_partition_end_that_cannot_start_at_once_is_told_the_usual_way(data_dir, clock):
    class Refusing(StartingParticipants):
        def end_txn_on_partition_now(self, topic, txn, action, low_watermark, *, after=None):
            raise RuntimeError("not now")

    participants = Refusing(at_once={"p1"})
    harness = ServiceHarness(data_dir, participants, clock)
    service = await harness.start()
    txn = await new_txn(service, subscriptions=())
    assert await service.end_transaction(txn, A.COMMIT) == S.COMMITTED
    assert participants.told(txn) == {"p1": {A.COMMIT}, "p2": {A.COMMIT}}
    await harness.stop()


async def test_a_failed_decision_fails_the_partition_ends_started_with_it(data_dir, clock):
    """Their markers are conditional on the decision: nothing is applied anywhere, the txn
    stays OPEN, and a later end starts them again."""
    env = FailingEnvironment(data_dir)
    participants = StartingParticipants(at_once={"p1"})
    service = TransactionCoordinatorService(env, participants, clock=clock, num_coordinators=1, backoff=FAST_BACKOFF)
    await service.start()
    txn = await new_txn(service, partitions=("p1",), subscriptions=())
    env.failing = 1
    with pytest.raises(PersistenceError):
        await service.end_transaction(txn, A.COMMIT)
    assert service.get(txn).status == S.OPEN and participants.told(txn) == {}
    assert await service.end_transaction(txn, A.COMMIT) == S.COMMITTED
    assert participants.told(txn) == {"p1": {A.COMMIT}} and len(participants.started) == 2
    await service.close()
    env.close()


async def test_low_watermark_is_passed_with_every_call(harness, participants):
    service = harness.service
    first = await new_txn(service, partitions=("a",), subscriptions=())
    second = await new_txn(service, partitions=("b",), subscriptions=())
    await service.end_transaction(second, A.COMMIT)
    await service.end_transaction(first, A.ABORT)
    third = await new_txn(service, partitions=("c",), subscriptions=())
    await service.end_transaction(third, A.COMMIT)
    assert [(c.target, c.low_watermark) for c in participants.calls] == [("b", -1), ("a", -1), ("c", 1)]
    assert service.stats().low_watermarks[0] == 2


# --- idempotency and concurrency ---------------------------------------------------------

async def test_repeating_the_decision_succeeds_and_the_other_one_fails(harness):
    service = harness.service
    committed, aborted = await new_txn(service), await new_txn(service)
    await service.end_transaction(committed, A.COMMIT)
    await service.end_transaction(aborted, A.ABORT)
    assert await service.end_transaction(committed, A.COMMIT) == S.COMMITTED
    assert await service.end_transaction(aborted, A.ABORT) == S.ABORTED
    with pytest.raises(InvalidTxnStatusError, match="expected ABORTING but is COMMITTED"):
        await service.end_transaction(committed, A.ABORT)
    with pytest.raises(InvalidTxnStatusError, match="expected COMMITTING but is ABORTED"):
        await service.end_transaction(aborted, A.COMMIT)


async def test_concurrent_end_calls_share_one_completion(harness, participants):
    service = harness.service
    txn = await new_txn(service)
    release = participants.block("p2")
    calls = [asyncio.ensure_future(service.end_transaction(txn, A.COMMIT)) for _ in range(5)]
    await participants.reached("p2")
    with pytest.raises(InvalidTxnStatusError, match="expected ABORTING but is COMMITTING"):
        await service.end_transaction(txn, A.ABORT)
    release.set()
    assert await asyncio.gather(*calls) == [S.COMMITTED] * 5
    assert sorted(map(str, (c.target for c in participants.calls_for(txn)))) == ["('p1', 's')", "p1", "p2"]


async def test_commit_and_abort_racing_in_the_same_turn(harness, participants):
    service = harness.service
    txn = await new_txn(service)
    results = await asyncio.gather(service.end_transaction(txn, A.ABORT), service.end_transaction(txn, A.COMMIT),
                                   return_exceptions=True)
    assert results[0] == S.ABORTED
    assert isinstance(results[1], InvalidTxnStatusError) and "expected COMMITTING but is ABORTING" in str(results[1])
    assert set().union(*participants.told(txn).values()) == {A.ABORT}


async def test_a_cancelled_caller_does_not_cancel_the_ending(harness, participants):
    service = harness.service
    txn = await new_txn(service)
    release = participants.block("p1")
    caller = asyncio.ensure_future(service.end_transaction(txn, A.COMMIT))
    await participants.reached("p1")
    caller.cancel()
    release.set()
    await service.wait_for_endings()
    assert service.get(txn).status == S.COMMITTED


# --- timeouts ----------------------------------------------------------------------------

async def test_an_open_txn_times_out_and_is_aborted_everywhere(harness, participants, clock):
    service = harness.service
    txn = await new_txn(service, timeout_ms=1000)
    clock.advance(999)
    assert service.poll_timeouts() == 0
    clock.advance(1)
    assert service.poll_timeouts() == 1
    await service.wait_for_endings()
    meta = service.get(txn)
    assert meta.status == S.TIME_OUT and meta.timed_out
    assert participants.told(txn) == {"p1": {A.ABORT}, "p2": {A.ABORT}, ("p1", "s"): {A.ABORT}}
    with pytest.raises(InvalidTxnStatusError, match="expected COMMITTING but is TIME_OUT"):
        await service.end_transaction(txn, A.COMMIT)
    assert await service.end_transaction(txn, A.ABORT) == S.TIME_OUT
    stats = service.stats()
    assert (stats.timed_out_total, stats.aborted_total, stats.by_status[S.TIME_OUT]) == (1, 0, 1)


async def test_commit_while_the_timeout_abort_is_under_way_fails(harness, participants, clock):
    service = harness.service
    txn = await new_txn(service, timeout_ms=10)
    release = participants.block("p1")
    clock.advance(10)
    service.poll_timeouts()
    await participants.reached("p1")
    with pytest.raises(InvalidTxnStatusError, match="expected COMMITTING but is ABORTING"):
        await service.end_transaction(txn, A.COMMIT)
    joined = asyncio.ensure_future(service.end_transaction(txn, A.ABORT))
    release.set()
    assert await joined == S.TIME_OUT


async def test_a_deadline_passing_while_a_commit_is_being_ended_changes_nothing(harness, participants, clock):
    service = harness.service
    txn = await new_txn(service, timeout_ms=10)
    release = participants.block("p1")
    ending = asyncio.ensure_future(service.end_transaction(txn, A.COMMIT))
    await participants.reached("p1")
    clock.advance(10)
    assert service.poll_timeouts() == 0          # the commit cancelled the deadline
    release.set()
    assert await ending == S.COMMITTED
    assert set().union(*participants.told(txn).values()) == {A.COMMIT}


async def test_the_service_timer_fires_on_its_own(data_dir, participants):
    clock = PausedWallClock()
    harness = ServiceHarness(data_dir, participants, clock=clock)
    service = await harness.start()
    txn = await new_txn(service, timeout_ms=100)
    clock.resume()
    assert service.get(txn).status == S.OPEN
    await eventually(lambda: service.get(txn).status == S.TIME_OUT)
    assert participants.told(txn) == {"p1": {A.ABORT}, "p2": {A.ABORT}, ("p1", "s"): {A.ABORT}}
    await harness.stop()


async def test_one_timer_for_many_txns(harness, clock):
    service = harness.service
    txns = [await service.new_transaction(i % 4, 100 + i) for i in range(50)]
    loop_timers = [h for h in asyncio.get_running_loop()._scheduled if not h.cancelled()]
    assert len(loop_timers) <= 2                  # the timeout timer and the purge timer
    clock.advance(124)
    assert service.poll_timeouts() == 25
    await service.wait_for_endings()
    assert [service.get(t).status for t in txns] == [S.TIME_OUT] * 25 + [S.OPEN] * 25


# --- restarts ----------------------------------------------------------------------------

async def test_start_resumes_decided_txns_and_rearms_open_ones(data_dir, participants, clock):
    harness = ServiceHarness(data_dir, participants, clock)
    service = await harness.start()
    committing = await new_txn(service, cid=1)
    aborting = await new_txn(service, cid=2)
    expired = await new_txn(service, cid=3, timeout_ms=1000)
    later = await new_txn(service, cid=3, timeout_ms=5000)
    participants.block("p1")
    ends = [asyncio.ensure_future(service.end_transaction(t, a)) for t, a in
            ((committing, A.COMMIT), (aborting, A.ABORT))]
    await eventually(lambda: len([c for c in participants.calls if c.target == "p2"]) == 2)
    await harness.stop()
    for end in ends:
        with pytest.raises(ServiceNotReadyError, match="resumes on restart"):
            await end
    fresh = RecordingParticipants()
    harness.participants = fresh
    clock.advance(1000)
    service = await harness.start()
    assert service.get(committing).status == S.COMMITTING
    assert await service.end_transaction(committing, A.COMMIT) == S.COMMITTED
    await service.wait_for_endings()
    assert service.get(aborting).status == S.ABORTED
    assert service.get(expired).status == S.TIME_OUT
    assert service.get(later).status == S.OPEN
    assert fresh.told(committing) == {"p1": {A.COMMIT}, "p2": {A.COMMIT}, ("p1", "s"): {A.COMMIT}}
    assert fresh.told(expired) == {"p1": {A.ABORT}, "p2": {A.ABORT}, ("p1", "s"): {A.ABORT}}
    clock.advance(4000)
    assert service.poll_timeouts() == 1
    await harness.stop()


async def test_stats(harness, participants, clock):
    service = harness.service
    a, b, c, d = [await new_txn(service, timeout_ms=100) for _ in range(4)]
    await service.end_transaction(a, A.COMMIT)
    await service.end_transaction(a, A.COMMIT)
    await service.end_transaction(b, A.ABORT)
    participants.block("p1")
    ending = asyncio.ensure_future(service.end_transaction(c, A.COMMIT))
    await participants.reached("p1")
    stats = service.stats()
    assert (stats.created_total, stats.committed_total, stats.aborted_total, stats.timed_out_total) == (4, 1, 1, 0)
    assert {s: n for s, n in stats.by_status.items() if n} == {S.COMMITTED: 1, S.ABORTED: 1, S.COMMITTING: 1,
                                                               S.OPEN: 1}
    assert stats.open == 1 and stats.ending == 1 and stats.pending_timeouts == 1
    assert stats.end_txn_count == 3 and len(stats.end_txn_latency_ms) == 3
    assert stats.end_txn_latency_sum_ms == pytest.approx(sum(stats.end_txn_latency_ms))
    assert d == TxnId(0, 3)
    await harness.stop()
    with pytest.raises(ServiceNotReadyError):
        await ending


async def test_the_purge_runs_periodically(data_dir, participants, clock):
    harness = ServiceHarness(data_dir, participants, clock, finished_retention_ms=1000, purge_interval_ms=10)
    service = await harness.start()
    txn = await new_txn(service)
    await service.end_transaction(txn, A.COMMIT)
    clock.advance(1000)

    def purged():
        with harness.env.read() as rtxn:
            return [records.log_sequence(k) for k, _ in rtxn.cursor(db=harness.env.db("txn_log"))] == [-1]

    await eventually(purged)
    with pytest.raises(TransactionNotFoundError):
        service.get(txn)
    await harness.stop()


# --- storage failures --------------------------------------------------------------------

class FailingEnvironment(StorageEnvironment):
    failing = 0          # how many group commits still fail

    def _write_batch(self, writes):
        if self.failing:
            self.failing -= 1
            raise StorageError("injected write failure")
        return super()._write_batch(writes)


async def test_a_decision_that_cannot_be_written_fails_and_the_txn_still_times_out(data_dir, participants, clock):
    env = FailingEnvironment(data_dir)
    service = TransactionCoordinatorService(env, participants, clock=clock, num_coordinators=1, backoff=FAST_BACKOFF)
    await service.start()
    txn = await new_txn(service, timeout_ms=100)
    env.failing = 1
    with pytest.raises(PersistenceError):
        await service.end_transaction(txn, A.COMMIT)
    assert service.get(txn).status == S.OPEN and participants.calls == []
    clock.advance(100)
    env.failing = 1                                   # the timeout's first decision write fails too
    service.poll_timeouts()
    await service.wait_for_endings()
    assert service.get(txn).status == S.OPEN
    clock.advance(FAST_BACKOFF.initial_ms)
    service.poll_timeouts()
    await service.wait_for_endings()
    assert service.get(txn).status == S.TIME_OUT
    await service.close()
    env.close()


async def test_a_final_status_that_cannot_be_written_is_retried(data_dir, participants, clock):
    env = FailingEnvironment(data_dir)
    service = TransactionCoordinatorService(env, participants, clock=clock, num_coordinators=1, backoff=FAST_BACKOFF)
    await service.start()
    txn = await new_txn(service)

    class FailAfterTelling(RecordingParticipants):
        async def end_txn_on_partition(self, topic, txn, action, low_watermark, *, after=None):
            if after is not None:
                await asyncio.shield(after)
            env.failing = 3

    service.participants = FailAfterTelling()
    # The caller is answered once every participant applied the commit (the outcome is final);
    # the terminal record is written after that, retried until it lands.
    assert await service.end_transaction(txn, A.COMMIT) == S.COMMITTED
    await service.wait_for_endings()
    assert env.failing == 0
    assert service.store(0).get(txn).status == S.COMMITTED
    await service.close()
    env.close()


# --- malformed input and lifecycle ---------------------------------------------------------

async def test_malformed_input(harness):
    service = harness.service
    txn = await new_txn(service)
    for cid in (-1, 4, 1 << 40):
        with pytest.raises(TransactionCoordinatorNotFoundError, match="0..3"):
            await service.new_transaction(cid, 1000)
    for cid in ("0", 0.0, None, True):
        with pytest.raises(TypeError, match="coordinator_id"):
            await service.new_transaction(cid, 1000)
    for timeout in (0, -1, DEFAULT_MAX_TIMEOUT_MS + 1, 1 << 63):
        with pytest.raises(NotAllowedError, match="between 1 and"):
            await service.new_transaction(0, timeout)
    assert await service.new_transaction(0, DEFAULT_MAX_TIMEOUT_MS)
    for timeout in ("60s", 1.0, None, False):
        with pytest.raises(TypeError, match="timeout_ms"):
            await service.new_transaction(0, timeout)
    with pytest.raises(TransactionNotFoundError):
        await service.end_transaction(TxnId(0, 999), A.COMMIT)
    with pytest.raises(TransactionCoordinatorNotFoundError):
        await service.end_transaction(TxnId(9, 0), A.COMMIT)
    with pytest.raises(TransactionCoordinatorNotFoundError):
        service.get(TxnId(9, 0))
    with pytest.raises(TransactionNotFoundError):
        await service.add_produced_partitions(TxnId(1, 5), ["t"])
    with pytest.raises(TypeError, match="TxnId"):
        await service.end_transaction("(0,0)", A.COMMIT)
    with pytest.raises(ValueError, match="unknown transaction action"):
        await service.end_transaction(txn, 2)
    with pytest.raises(TypeError, match="TxnAction"):
        await service.end_transaction(txn, "COMMIT")
    with pytest.raises(TypeError, match="partitions"):
        await service.add_produced_partitions(txn, None)
    with pytest.raises(TypeError, match="pair"):
        await service.add_acked_subscriptions(txn, [("t",)])
    assert service.get(txn).status == S.OPEN
    assert await service.end_transaction(txn, 0) == S.COMMITTED      # the wire's int works too
    with pytest.raises(ValueError, match="num_coordinators"):
        TransactionCoordinatorService(harness.env, None, num_coordinators=0)
    with pytest.raises(ValueError, match="initial_ms"):
        Backoff(initial_ms=0)


async def test_not_started_and_closed(data_dir, participants, clock, env):
    service = TransactionCoordinatorService(env, participants, clock=clock)
    with pytest.raises(ServiceNotReadyError):
        await service.new_transaction(0, 1000)
    await service.start()
    assert service.coordinator_ids == list(range(16))
    with pytest.raises(ServiceNotReadyError):
        await service.start()
    await service.close()
    await service.close()
    with pytest.raises(ServiceNotReadyError):
        await service.new_transaction(0, 1000)
    with pytest.raises(ServiceNotReadyError):
        service.get(TxnId(0, 0))


async def test_a_decided_txn_whose_ending_failed_is_resumed_by_the_next_end(harness, participants, monkeypatch):
    service = harness.service
    txn = await new_txn(service)
    store = service.store(0)
    real_final_write = store.submit_final_status

    def broken_final_write(txn, new, expected):
        raise RuntimeError("unexpected bug")

    monkeypatch.setattr(store, "submit_final_status", broken_final_write)
    # Every participant applied the commit, so the caller hears COMMITTED; the terminal record
    # then fails with a bug: the ending stops, the txn stays COMMITTING in the log.
    assert await service.end_transaction(txn, A.COMMIT) == S.COMMITTED
    await service.wait_for_endings()
    assert service.get(txn).status == S.COMMITTING and service.stats().ending == 0
    monkeypatch.setattr(store, "submit_final_status", real_final_write)
    with pytest.raises(InvalidTxnStatusError, match="expected ABORTING but is COMMITTING"):
        await service.end_transaction(txn, A.ABORT)
    await service.wait_for_endings()
    assert service.get(txn).status == S.COMMITTED          # the abort attempt resumed the commit
    assert await service.end_transaction(txn, A.COMMIT) == S.COMMITTED


async def test_a_failed_start_leaves_nothing_running(data_dir, participants, clock):
    harness = ServiceHarness(data_dir, participants, clock)
    service = await harness.start()
    decided = await new_txn(service, cid=0)
    participants.block("p1")
    ending = asyncio.ensure_future(service.end_transaction(decided, A.COMMIT))
    await participants.reached("p1")
    await harness.stop()
    with pytest.raises(ServiceNotReadyError):
        await ending
    env = StorageEnvironment(data_dir)
    key = records.log_key(records.coordinator_prefix(3), 0)
    env.write_now(lambda txn: txn.put(key, b"\x08\x07garbage", db=env.db("txn_log")))
    service = TransactionCoordinatorService(env, participants, clock=clock, num_coordinators=4)
    with pytest.raises(CorruptRecordError):
        await service.start()
    assert service.stats().ending == 0
    with pytest.raises(ServiceNotReadyError):
        await service.new_transaction(0, 1000)
    env.close()


async def test_closing_while_partitions_and_subscriptions_are_told_stops_telling_them(data_dir, participants, clock):
    """Partitions are told while the decision is still being written, in a task of their own:
    closing the coordinator must stop it too, not leave it calling participants afterwards."""
    harness = ServiceHarness(data_dir, participants, clock)
    service = await harness.start()
    txn = await new_txn(service, partitions=("p1",), subscriptions=(("p2", "s"),))
    partition, subscription = participants.block("p1"), participants.block(("p2", "s"))
    ending = asyncio.ensure_future(service.end_transaction(txn, A.COMMIT))
    await participants.reached("p1")
    await participants.reached(("p2", "s"))
    await harness.stop()
    with pytest.raises(ServiceNotReadyError):
        await ending
    partition.set()
    subscription.set()
    for _ in range(20):
        await asyncio.sleep(0)
    assert participants.told(txn) == {}                  # nothing confirmed after the close
