"""One regression test per known Apache Pulsar coordinator bug this coordinator avoids
(reference/anchors-and-failure-modes.md, B4). The SIGKILL variant of #20150 is in test_crash."""

from __future__ import annotations

import asyncio
import re

import pytest

from pyengine.errors import InvalidTxnStatusError, ServiceNotReadyError, TransactionNotFoundError
from pyengine.transaction import TxnAction, TxnStatus
from tests.transaction.coordinator.fakes import RecordingParticipants
from tests.transaction.coordinator.helpers import ServiceHarness
from tests.waiting import eventually

S, A = TxnStatus, TxnAction
HOUR = 3_600_000


@pytest.fixture
def harness(data_dir, participants, clock):
    return ServiceHarness(data_dir, participants, clock)


async def test_a_committed_txn_never_reverts_to_open_after_restarts_pulsar_20150(harness):
    service = await harness.start()
    committed = await service.new_transaction(0, 60_000)
    await service.add_produced_partitions(committed, ["t"])
    await service.end_transaction(committed, A.COMMIT)
    committing = await service.new_transaction(0, 60_000)
    await service.add_produced_partitions(committing, ["t"])
    blocked = harness.participants
    blocked.block("t")
    ending = asyncio.ensure_future(service.end_transaction(committing, A.COMMIT))
    await blocked.reached("t")
    harness.participants = RecordingParticipants()
    for _ in range(3):
        service = await harness.restart()
        assert service.get(committed).status == S.COMMITTED
        assert service.get(committing).status in (S.COMMITTING, S.COMMITTED)
        await service.wait_for_endings()
        assert service.get(committing).status == S.COMMITTED
    with pytest.raises(ServiceNotReadyError):
        await ending                      # its broker went away; the commit itself completed
    await harness.stop()


async def test_a_repeated_commit_after_a_restart_succeeds_pulsar_19629(harness, clock):
    """Pulsar #19629: the commit succeeded, the broker restarted, the client's retry got
    "expect COMMITTING but is COMMITTED" and resent everything: duplicates. The FINISHED
    record answers the repeat with success for `finished_retention_ms` (Pulsar's 1 h).
    Also PIP-254 (#19744): commit and abort are idempotent (the abort's repeat below)."""
    service = await harness.start()
    txn = await service.new_transaction(2, 60_000)
    await service.add_produced_partitions(txn, ["t"])
    assert await service.end_transaction(txn, A.COMMIT) == S.COMMITTED
    service = await harness.restart()
    assert await service.end_transaction(txn, A.COMMIT) == S.COMMITTED
    with pytest.raises(InvalidTxnStatusError):
        await service.end_transaction(txn, A.ABORT)
    clock.advance(HOUR - 1)
    service = await harness.restart()
    assert await service.end_transaction(txn, A.COMMIT) == S.COMMITTED
    clock.advance(1)
    with pytest.raises(TransactionNotFoundError):       # as in Pulsar once the ended status is gone
        await service.end_transaction(txn, A.COMMIT)
    aborted = await service.new_transaction(2, 60_000)
    await service.add_produced_partitions(aborted, ["t"])
    assert await service.end_transaction(aborted, A.ABORT) == S.ABORTED
    service = await harness.restart()
    assert await service.end_transaction(aborted, A.ABORT) == S.ABORTED
    with pytest.raises(InvalidTxnStatusError, match="expected COMMITTING but is ABORTED"):
        await service.end_transaction(aborted, A.COMMIT)
    await harness.stop()


async def test_a_timed_out_txn_is_aborted_on_its_participants_pulsar_10306(harness, participants, clock):
    """Pulsar #10306: after the timeout the txn was not aborted, its pending acks stayed and
    reprocessing failed with TransactionConflict. The timeout must send ABORT to every
    partition and subscription (releasing pending acks), also when it expired while down."""
    service = await harness.start()
    live = await service.new_transaction(1, 1000)
    while_down = await service.new_transaction(1, 1000)
    for txn in (live, while_down):
        await service.add_produced_partitions(txn, ["t"])
        await service.add_acked_subscriptions(txn, [("t", "sub")])
    clock.advance(500)
    service = await harness.restart()
    clock.advance(500)
    service.poll_timeouts()
    await service.wait_for_endings()
    for txn in (live, while_down):
        assert service.get(txn).status == S.TIME_OUT
        assert participants.told(txn) == {"t": {A.ABORT}, ("t", "sub"): {A.ABORT}}
    await harness.stop()


@pytest.mark.parametrize("action", [A.COMMIT, A.ABORT])
async def test_ending_a_txn_cancels_its_timeout_pulsar_14166(harness, participants, clock, action):
    """Pulsar #14166: the timeout was not cancelled on commit or abort."""
    service = await harness.start()
    txn = await service.new_transaction(0, 1000)
    await service.add_produced_partitions(txn, ["t"])
    assert service.stats().pending_timeouts == 1
    await service.end_transaction(txn, action)
    assert service.stats().pending_timeouts == 0
    clock.advance(1000)
    assert service.poll_timeouts() == 0
    await service.wait_for_endings()
    assert service.stats().timed_out_total == 0
    assert participants.told(txn) == {"t": {action}}
    await harness.stop()


async def test_resumed_endings_find_every_coordinator_registered_pulsar_18923(data_dir, participants, clock):
    """Pulsar #18923: after TC recovery, ending COMMITTING txns ran before the coordinator was
    registered ("Transaction coordinator with id N not found"). Here a participant asked by a
    resumed ending can already reach every coordinator, even when recovering the later
    coordinators has to wait for writes (expired FINISHED records to purge)."""
    harness = ServiceHarness(data_dir, participants, clock, finished_retention_ms=1000)
    service = await harness.start()
    txns = []
    for cid in range(4):
        txn = await service.new_transaction(cid, 60_000)
        await service.add_produced_partitions(txn, ["t"])
        txns.append(txn)
    for cid in range(1, 4):
        await service.end_transaction(await service.new_transaction(cid, 60_000), A.ABORT)
    participants.block("t")
    endings = [asyncio.ensure_future(service.end_transaction(txn, A.COMMIT)) for txn in txns]
    await eventually(lambda: all(service.get(txn).status == S.COMMITTING for txn in txns))
    await participants.reached("t")
    seen = []

    class AskingParticipants(RecordingParticipants):
        async def end_txn_on_partition(self, topic, txn, action, low_watermark, *, after=None):
            if after is not None:
                await asyncio.shield(after)
            try:
                seen.append([harness.service.get(t).status for t in txns])
            except Exception as exc:
                seen.append(exc)
                raise

    harness.participants = AskingParticipants()
    clock.advance(1000)
    service = await harness.restart()
    for ending in endings:
        with pytest.raises(ServiceNotReadyError):
            await ending
    await service.wait_for_endings()
    assert len(seen) == 4 and all(isinstance(s, list) and S.OPEN not in s for s in seen), seen
    await harness.stop()


async def test_an_end_retried_at_once_after_its_request_timed_out_completes_pulsar_15039(harness, participants, clock):
    """Pulsar #15039: after a failed or unanswered end, users wanted to retry at once rather
    than wait for the transaction's timeout. Here the client's end request gives up while a
    participant is slow; the retry, sent at once, joins the same ending and answers COMMITTED
    as soon as the participant confirms; the txn never times out, nothing is told twice."""
    service = await harness.start()
    txn = await service.new_transaction(0, 60_000)
    await service.add_produced_partitions(txn, ["t"])
    release = participants.block("t")
    with pytest.raises(TimeoutError):                   # the client's request timeout
        await asyncio.wait_for(service.end_transaction(txn, A.COMMIT), 0.05)
    retry = asyncio.ensure_future(service.end_transaction(txn, A.COMMIT))
    await asyncio.sleep(0)
    assert not retry.done() and service.get(txn).status == S.COMMITTING
    release.set()
    assert await asyncio.wait_for(retry, 5) == S.COMMITTED
    clock.advance(60_000)
    assert service.poll_timeouts() == 0
    await service.wait_for_endings()
    assert service.get(txn).status == S.COMMITTED and service.stats().timed_out_total == 0
    assert [c.action for c in participants.calls_for(txn)] == [A.COMMIT]
    await harness.stop()


async def test_a_commit_after_the_timeout_says_so_flink_17452(harness, participants, clock):
    """apache/flink #17452: a two-phase commit whose gap exceeded the transaction timeout got
    TransactionNotFoundException on commit, with nothing telling whether it had timed out or
    even committed. Here the deadline passes while the coordinator is down; the commit that
    follows is refused with the txn's status (TIME_OUT), its participants were told to abort,
    an abort is answered with TIME_OUT again, and only once the ended status is gone (1 h
    later) is the txn not found, by its id."""
    service = await harness.start()
    txn = await service.new_transaction(0, 1000)
    await service.add_produced_partitions(txn, ["t"])
    await service.add_acked_subscriptions(txn, [("t", "sub")])
    clock.advance(1000)
    service = await harness.restart()
    service.poll_timeouts()
    await service.wait_for_endings()
    with pytest.raises(InvalidTxnStatusError, match=r"transaction .*: expected COMMITTING but is TIME_OUT"):
        await service.end_transaction(txn, A.COMMIT)
    assert participants.told(txn) == {"t": {A.ABORT}, ("t", "sub"): {A.ABORT}}
    assert await service.end_transaction(txn, A.ABORT) == S.TIME_OUT
    clock.advance(HOUR)
    service = await harness.restart()
    # Its outcome is no longer kept: said so, and not in the words of an id never handed out.
    with pytest.raises(TransactionNotFoundError, match=re.escape(f"transaction {txn} not found: it ended and its "
                                                                 "outcome is no longer kept")):
        await service.end_transaction(txn, A.COMMIT)
    never = type(txn)(txn.most_bits, txn.least_bits + 1000)
    with pytest.raises(TransactionNotFoundError, match=re.escape(f"transaction {never} not found: coordinator "
                                                                 f"{txn.most_bits} never handed it out")):
        await service.end_transaction(never, A.COMMIT)
    await harness.stop()
