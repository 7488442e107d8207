"""Findings of a review of the network client's transactions: each test failed on the code as
reviewed (the last two of the ack tests pin the behaviour the consumer was missing)."""

import asyncio

import pytest

from pyengine.client import AlreadyClosedError, Client
from pyengine.client.transaction import ABORTED, COMMITTED

T_IN = "persistent://public/default/review-txn-in"
T_OUT = "persistent://public/default/review-txn-out"


@pytest.mark.parametrize("topics", [T_IN, [T_IN, T_OUT]], ids=["one-topic", "multi-topic"])
async def test_an_ack_refused_by_a_closed_consumer_fails_the_commit(client, topics):
    """As a send refused by a closed producer does (and the Java client, which registers the
    ack op before the consumer's state check fails it): the commit must not succeed."""
    producer = await client.create_producer(T_IN)
    consumer = await client.subscribe(topics, "s", initial_position="earliest")
    await producer.send(b"m")
    message = await consumer.receive(timeout=5)
    txn = await client.new_transaction()
    await consumer.close()
    with pytest.raises(AlreadyClosedError):
        await consumer.acknowledge_cumulative(message, txn=txn)
    with pytest.raises(AlreadyClosedError):
        await txn.commit()              # the ack of the transaction failed: it must abort
    assert txn.state == ABORTED


async def test_a_send_refused_by_a_closed_producer_fails_the_commit(client):
    """The producer side, for comparison (passes)."""
    producer = await client.create_producer(T_OUT)
    txn = await client.new_transaction()
    await producer.close()
    with pytest.raises(AlreadyClosedError):
        await producer.send(b"x", txn=txn)
    with pytest.raises(AlreadyClosedError):
        await txn.commit()
    assert txn.state == ABORTED


async def test_a_commit_the_coordinator_failed_to_persist_can_be_asked_again(client, monkeypatch):
    """END_TXN answered with a coordinator failure that is no refusal of the decision
    (PersistenceError: the coordinator could not write it) leaves the outcome to be asked
    again, as the Java client's TransactionImpl (ERROR only for TransactionNotFound /
    InvalidTxnStatus; otherwise it stays COMMITTING and commit() may be called again)."""
    from pyengine.errors import PersistenceError
    from pyengine.protocol import pulsar_api_pb2 as pb

    producer = await client.create_producer(T_OUT)
    watcher = await client.subscribe(T_OUT, "watch", initial_position="earliest")
    txn = await client.new_transaction()
    await producer.send(b"once", txn=txn)
    connection = client._core.coordinator._handler(txn.txn_id).connection
    send_request = connection.send_request

    def failing(cmd):
        if cmd.type == pb.BaseCommand.END_TXN:
            failed = asyncio.get_running_loop().create_future()
            failed.set_exception(PersistenceError("the coordinator's log could not be written"))
            return failed
        return send_request(cmd)
    monkeypatch.setattr(connection, "send_request", failing)
    with pytest.raises(PersistenceError):
        await txn.commit()
    monkeypatch.undo()
    await txn.commit()                   # ERROR on the code reviewed: InvalidTxnStatusError
    assert txn.state == COMMITTED
    assert (await watcher.receive(timeout=5)).data == b"once"


async def test_a_coordinator_connection_lost_right_after_tc_client_connect_is_reconnected(broker, monkeypatch):
    """The connection closes once TC_CLIENT_CONNECT is answered, before the handler resumes
    (a broker restart, a network drop): the handler must not become READY on the dead
    connection. On the code reviewed it does (its close listener is added after the request,
    to a connection already closed): it never reconnects, and each request on it spins
    without yielding (send_request raises ConnectError at once, `request` loops) until the
    operation timeout, blocking the event loop, then fails with TimeoutError."""
    from pyengine.client.connection import ClientConnection
    from pyengine.client.errors import ConnectError
    from pyengine.protocol import pulsar_api_pb2 as pb

    original = ClientConnection.request
    dropped = []

    async def request(self, cmd, timeout):
        response = await original(self, cmd, timeout)
        if cmd.type == pb.BaseCommand.TC_CLIENT_CONNECT_REQUEST and not dropped:
            dropped.append(self)
            self.close(ConnectError("dropped right after TC_CLIENT_CONNECT was answered"))
            await self.closed                  # connection_lost has run
        return response
    monkeypatch.setattr(ClientConnection, "request", request)
    async with Client(broker.url, operation_timeout_seconds=2) as client:
        await client._core.coordinator.start()
        assert dropped
        loop = asyncio.get_running_loop()
        for _ in range(4):                      # round robin: each coordinator once
            started = loop.time()
            txn = await client.new_transaction()
            assert loop.time() - started < 1.5
            await txn.abort()
