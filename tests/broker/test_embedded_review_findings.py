"""Findings of a review of the embedded API against pyengine.client for the same calls: each
test failed on the code as reviewed (a transaction committed though one of its operations had
failed, or an end that failed could not be asked again)."""

import asyncio
import datetime
import time

import pytest

from pyengine.broker import Broker
from pyengine.client.errors import AlreadyClosedError
from pyengine.errors import NotAllowedError, PersistenceError, PulsarError
from tests.broker.helpers import drain
from tests.broker.test_embedded_retries_on_a_closed_topic import hold_deletion

T = "persistent://public/default/review-findings"


@pytest.mark.parametrize("ack, topics", [("acknowledge", T), ("acknowledge_cumulative", T),
                                         ("acknowledge", [T, T + "-2"])],
                         ids=["individual", "cumulative", "multi-topic"])
async def test_ack_in_a_txn_on_a_closed_consumer_fails_the_commit(tmp_path, ack, topics):
    # pyengine.client: an ack refused by a closed consumer calls txn._refused, so the commit
    # aborts and raises (as a closed producer's send does here too). A list's consumer is the
    # client's MultiTopicsConsumer, which recorded the refusal only for the client's transactions.
    async with Broker.embedded(tmp_path, sync=False) as broker:
        producer = await broker.create_producer(T)
        consumer = await broker.subscribe(topics, "s", initial_position="earliest")
        await producer.send(b"m")
        message = await consumer.receive(timeout=2)
        await consumer.close()
        txn = await broker.new_transaction()
        await producer.send(b"out", txn=txn)
        with pytest.raises(AlreadyClosedError):
            await getattr(consumer, ack)(message, txn=txn)
        with pytest.raises(PulsarError):
            await txn.commit()          # the ack of the processed input failed: must not commit
        assert txn.state == "aborted"


async def test_send_in_a_txn_refused_by_the_topic_fails_the_commit(tmp_path):
    # pyengine.client: a send of the transaction that fails (the broker's SEND_ERROR, or a
    # refusal before it is sent: _track_failure) makes the commit abort and raise.
    async with Broker.embedded(tmp_path, sync=False) as broker:
        producer = await broker.create_producer(T)
        await broker.service.policies.set_topic_policy(
            T, "delayedDeliveryPolicies", {"active": True, "tickTime": 1000, "maxDeliveryDelayInMillis": 1000})
        txn = await broker.new_transaction()
        await producer.send(b"kept", txn=txn)
        with pytest.raises(NotAllowedError):
            await producer.send(b"refused", txn=txn, deliver_at=int(time.time() * 1000) + 60_000)
        with pytest.raises(PulsarError):
            await txn.commit()          # half of the transaction's output is missing
        assert txn.state == "aborted"


async def test_v5_txn_send_on_a_v4_topic_fails_the_commit(tmp_path):
    async with Broker.embedded(tmp_path, sync=False) as broker:
        producer = await broker.create_producer(T)
        txn = await broker.new_transaction(version=5)
        with pytest.raises(NotAllowedError):
            await producer.send(b"refused", txn=txn)
        with pytest.raises(PulsarError):
            await txn.commit()


def _failing_end_once(broker, error):
    coordinator = broker.service.coordinator
    real = coordinator.end_transaction
    calls = []

    async def end_transaction(txn_id, action, **kwargs):
        calls.append(action)
        if len(calls) == 1:
            raise error
        return await real(txn_id, action, **kwargs)

    coordinator.end_transaction = end_transaction
    return calls


async def test_commit_that_failed_to_write_its_decision_can_be_asked_again(tmp_path):
    # pyengine.client (transaction._end / _refusal): an END_TXN failure other than the
    # coordinator's refusal (PersistenceError...) leaves COMMITTING, and commit() may be called
    # again; only InvalidTxnStatus / TransactionNotFound / ... put it in ERROR for good.
    async with Broker.embedded(tmp_path, sync=False) as broker:
        producer = await broker.create_producer(T)
        consumer = await broker.subscribe(T, "s", initial_position="earliest")
        txn = await broker.new_transaction()
        await producer.send(b"m", txn=txn)
        _failing_end_once(broker, PersistenceError("the decision was not written"))
        with pytest.raises(PersistenceError):
            await txn.commit()
        await txn.commit()              # asked again: the coordinator commits it
        assert txn.state == "committed"
        assert [m.data for m in await drain(consumer, 0.3)] == [b"m"]


async def test_abort_that_failed_to_write_its_decision_can_be_asked_again(tmp_path):
    async with Broker.embedded(tmp_path, sync=False) as broker:
        producer = await broker.create_producer(T)
        txn = await broker.new_transaction()
        await producer.send(b"m", txn=txn)
        _failing_end_once(broker, PersistenceError("the decision was not written"))
        with pytest.raises(PersistenceError):
            await txn.abort()
        await txn.abort()
        assert txn.state == "aborted"


async def test_a_held_send_of_a_txn_committed_meanwhile_is_committed_or_fails_the_commit(tmp_path, monkeypatch):
    # The producer's topic was deleted: its next send waits for the topic created again (as a
    # network producer reconnects). The commit asked meanwhile waits for that send (it counts in
    # _in_flight), but once let go the send finds the transaction "committing" and raises
    # InvalidTxnStatusError without failing it: the commit succeeds without the message the
    # application sent before it committed. (pyengine.client: a send made before the commit is
    # tracked and goes on while COMMITTING - _submit_in_txn - or fails the commit.)
    async with Broker.embedded(tmp_path, sync=False) as broker:
        producer = await broker.create_producer(T)
        txn = await broker.new_transaction()
        await producer.send(b"first", txn=txn)
        closed, release = hold_deletion(monkeypatch)
        deleting = asyncio.ensure_future(broker.service.delete_topic(T))
        await closed.wait()                         # the topic closed, its deletion held
        sending = asyncio.ensure_future(producer.send(b"second", txn=txn))
        await asyncio.sleep(0.05)                   # held: waiting for the topic created again
        assert not sending.done() and txn._in_flight == 1
        committing = asyncio.ensure_future(txn.commit())
        await asyncio.sleep(0.05)
        assert txn.state == "committing" and not committing.done()     # waiting for the send
        release.set()
        await deleting
        send_result, commit_result = await asyncio.wait_for(
            asyncio.gather(sending, committing, return_exceptions=True), 5)
        assert not (isinstance(send_result, BaseException) and commit_result is None), (
            f"the send failed ({send_result!r}) but the commit succeeded")
