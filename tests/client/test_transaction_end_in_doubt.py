"""Ending a transaction when the coordinator's answer does not come, and when one of its
operations was cancelled.

An END_TXN that got no answer may have been applied (Pulsar #19629: the commit succeeded, the
client saw an error and produced everything again). The outcome is then unknown, so the same
decision must be askable again, as the Java client allows (it stays COMMITTING / ABORTING) and
the coordinator answers a repeated decision with success. A send or ack the caller cancelled
fails the commit (it aborts instead) with an error, not with CancelledError, which would end
a task that nobody cancelled.
"""

import asyncio

import pytest

from pyengine.client import Client
from pyengine.client import AlreadyClosedError, TransactionHasOperationFailedError
from pyengine.client.transaction import ABORTED, ABORTING, COMMITTED, COMMITTING
from pyengine.errors import InvalidTxnStatusError
from pyengine.protocol import pulsar_api_pb2 as pb
from pyengine.protocol.commands import command_body
from tests.client.conftest import answer_registrations_when_set, record_sends

IN = "persistent://public/default/in-doubt-in"
OUT = "persistent://public/default/in-doubt-out"


def lose_end_txn_answers(client, txn, monkeypatch) -> list:
    """END_TXN_RESPONSEs of `txn`'s coordinator connection are dropped (and collected)."""
    connection = client._core.coordinator._handler(txn.txn_id).connection
    settle = connection._settle
    lost = []

    def dropping(cmd):
        if cmd.type == pb.BaseCommand.END_TXN_RESPONSE:
            lost.append(command_body(cmd))
            return
        settle(cmd)
    monkeypatch.setattr(connection, "_settle", dropping)
    return lost


async def receive_all(consumer, timeout: float = 0.5) -> list[bytes]:
    got = []
    while True:
        try:
            got.append((await consumer.receive(timeout=timeout)).data)
        except TimeoutError:
            return got


async def test_a_commit_whose_answer_was_lost_can_be_asked_again(broker, monkeypatch):
    async with Client(broker.url, operation_timeout_seconds=1) as client:
        producer = await client.create_producer(OUT)
        watcher = await client.subscribe(OUT, "watch", initial_position="earliest")
        txn = await client.new_transaction()
        await producer.send(b"once", txn=txn)
        lost = lose_end_txn_answers(client, txn, monkeypatch)
        with pytest.raises(TimeoutError):
            await txn.commit()
        assert len(lost) == 1 and not lost[0].HasField("error")     # the coordinator did commit it
        assert txn.state == COMMITTING                               # the outcome is unknown here
        monkeypatch.undo()
        await txn.commit()                       # the same decision again: the coordinator confirms it
        assert txn.state == COMMITTED
        assert await receive_all(watcher) == [b"once"]
        with pytest.raises(InvalidTxnStatusError):
            await txn.abort()


async def test_an_abort_whose_answer_was_lost_can_be_asked_again(broker, monkeypatch):
    async with Client(broker.url, operation_timeout_seconds=1) as client:
        producer = await client.create_producer(OUT)
        txn = await client.new_transaction()
        await producer.send(b"dropped", txn=txn)
        lose_end_txn_answers(client, txn, monkeypatch)
        with pytest.raises(TimeoutError):
            await txn.abort()
        assert txn.state == ABORTING
        with pytest.raises(InvalidTxnStatusError):
            await txn.commit()                   # the other decision stays refused locally
        monkeypatch.undo()
        await txn.abort()
        assert txn.state == ABORTED
        await producer.send(b"plain")
        watcher = await client.subscribe(OUT, "watch", initial_position="earliest")
        assert await receive_all(watcher) == [b"plain"]


async def test_a_commit_cancelled_while_it_waits_for_its_sends_can_be_called_again(client, monkeypatch):
    registered = answer_registrations_when_set(client, monkeypatch)
    producer = await client.create_producer(OUT)
    txn = await client.new_transaction()
    sent = producer.send_async(b"late", txn=txn)
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(txn.commit(), 0.1)       # still waiting for the send
    assert txn.state == COMMITTING
    registered.set()
    await sent
    await txn.commit()
    assert txn.state == COMMITTED
    watcher = await client.subscribe(OUT, "watch", initial_position="earliest")
    assert await receive_all(watcher) == [b"late"]


async def test_a_cancelled_send_makes_commit_abort_and_raise_an_error_not_a_cancellation(client, monkeypatch):
    registered = answer_registrations_when_set(client, monkeypatch)
    producer = await client.create_producer(OUT)
    written = record_sends(producer._partitions[0].connection, monkeypatch)
    txn = await client.new_transaction()
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(producer.send(b"given up", txn=txn), 0.1)
    registered.set()
    with pytest.raises(TransactionHasOperationFailedError):
        await txn.commit()
    assert txn.state == ABORTED
    assert asyncio.current_task().cancelling() == 0
    await producer.send(b"plain")
    # given up while it waited for its registration: never written (the commit aborts all the same)
    assert len(written) == 1 and written[0].endswith(b"plain")
    watcher = await client.subscribe(OUT, "watch", initial_position="earliest")
    assert await receive_all(watcher) == [b"plain"]


async def test_a_cancelled_ack_makes_commit_abort_and_raise_an_error_not_a_cancellation(client, monkeypatch):
    source = await client.create_producer(IN)
    await source.send(b"input")
    consumer = await client.subscribe(IN, "sub", initial_position="earliest")
    message = await consumer.receive(timeout=5)
    coordinator = client._core.coordinator
    registered = asyncio.Event()
    add_subscription = coordinator.add_subscription

    async def held(*args):
        await registered.wait()
        return await add_subscription(*args)
    monkeypatch.setattr(coordinator, "add_subscription", lambda *args: asyncio.ensure_future(held(*args)))
    txn = await client.new_transaction()
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(consumer.acknowledge(message, txn=txn), 0.1)
    registered.set()
    with pytest.raises(TransactionHasOperationFailedError):
        await txn.commit()
    assert txn.state == ABORTED
    await consumer.redeliver_unacknowledged_messages()       # the ack was not taken
    assert (await consumer.receive(timeout=5)).data == b"input"


async def test_a_commit_cut_short_by_client_close_stays_in_doubt(broker, monkeypatch):
    """END_TXN was written, then the client closed before its answer: the commit may have been
    applied, so the transaction stays COMMITTING, not ERROR (as the Java client, which goes to
    ERROR only on the coordinator's refusal)."""
    client = Client(broker.url, operation_timeout_seconds=5)
    txn = await client.new_transaction()
    lose_end_txn_answers(client, txn, monkeypatch)
    committing = asyncio.ensure_future(txn.commit())
    await asyncio.sleep(0.1)
    await client.close()
    with pytest.raises(AlreadyClosedError):
        await asyncio.wait_for(committing, 2)
    assert txn.state == COMMITTING
