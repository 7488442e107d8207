"""Transaction keys through `pyengine.client` (pip-transaction-key-fencing): the PIP's motivating
scenario end to end, epochs, concurrent connects, one open transaction per key, bad keys."""

from __future__ import annotations

import asyncio
import time

import pytest

from pyengine.client import Client, ExpiredTransactionError, InvalidTransactionKeyError
from pyengine.errors import ConsumerBusyError, NotAllowedError

IN = "persistent://public/default/keys-in"
SIDE = "persistent://public/default/keys-side"
OUT = "persistent://public/default/keys-out"


async def _subscribe_when_free(client: Client, topic: str, subscription: str):
    """The fenced task's consumer is disconnected by the fence; take the subscription over."""
    deadline = time.monotonic() + 5
    while True:
        try:
            return await client.subscribe(topic, subscription, consumer_type="exclusive", initial_position="earliest")
        except ConsumerBusyError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.05)


async def test_a_new_task_fences_the_hung_one(broker, client):
    source = await client.create_producer(IN)
    for i in range(6):
        await source.send(b"%d" % i)
    side = await client.create_producer(SIDE)
    await side.send(b"side")
    other = await client.create_producer(OUT)        # an unrelated writer of the output topic
    watcher = await client.subscribe(OUT, "watch", initial_position="earliest")

    # Task 1: consumes 0..2, produces their results and acks cumulatively in txn1, then hangs.
    task1 = Client(broker.url, operation_timeout_seconds=5, transaction_key="job-7")
    try:
        txn1 = await task1.new_transaction(timeout_ms=60_000)
        assert task1.transaction_epoch == 0
        consumer1 = await task1.subscribe(IN, "job", consumer_type="exclusive", initial_position="earliest")
        side1 = await task1.subscribe(SIDE, "side", consumer_type="exclusive", initial_position="earliest")
        producer1 = await task1.create_producer(OUT)
        taken = [await consumer1.receive(timeout=5) for _ in range(3)]
        for message in taken:
            await producer1.send(b"t1-" + message.data, txn=txn1)
        await consumer1.acknowledge_cumulative(taken[-1], txn=txn1)
        side_message = await side1.receive(timeout=5)
        await side1.acknowledge_cumulative(side_message, txn=txn1)

        # Someone else's committed output, queued behind txn1's open entries: invisible.
        other_txn = await client.new_transaction()
        await other.send(b"other-committed", txn=other_txn)
        await other_txn.commit()
        with pytest.raises(TimeoutError):
            await watcher.receive(timeout=0.2)

        # Task 2 starts with the same key: txn1 is aborted at once, the queued output shows.
        async with Client(broker.url, operation_timeout_seconds=5, transaction_key="job-7") as task2:
            started = time.perf_counter()
            assert await task2.connect_transaction_key() == 1
            visible = await watcher.receive(timeout=30)
            assert visible.data == b"other-committed"
            # Not the 60 s transaction timeout (a bound of 1 s left no room for a loaded machine).
            assert time.perf_counter() - started < 30

            consumer2 = await _subscribe_when_free(task2, IN, "job")
            producer2 = await task2.create_producer(OUT)
            txn2 = await task2.new_transaction()
            redone = []
            for _ in range(6):
                try:
                    redone.append(await consumer2.receive(timeout=2))
                except TimeoutError:
                    raise AssertionError([m.data for m in redone]) from None
            assert [m.data for m in redone] == [b"%d" % i for i in range(6)]   # txn1's ack was released
            for message in redone:
                await producer2.send(b"t2-" + message.data, txn=txn2)
            await consumer2.acknowledge_cumulative(redone[-1], txn=txn2)
            await txn2.commit()
            outputs = [(await watcher.receive(timeout=5)).data for _ in range(6)]
            assert outputs == [b"t2-%d" % i for i in range(6)]       # each input once, none of task 1
            with pytest.raises(TimeoutError):
                await watcher.receive(timeout=0.2)

            # The zombie wakes up: everything of txn1 is refused as expired.
            with pytest.raises(ExpiredTransactionError):
                await producer1.send(b"late", txn=txn1)
            with pytest.raises(ExpiredTransactionError):
                await side1.acknowledge_cumulative(side_message, txn=txn1)
            with pytest.raises(ExpiredTransactionError):
                await txn1.commit()
            with pytest.raises(NotAllowedError):
                await task1.new_transaction()          # its epoch is gone for good
            assert task2.transaction_epoch == 1
    finally:
        await task1.close()
    with pytest.raises(TimeoutError):
        await watcher.receive(timeout=0.2)            # nothing of task 1 ever appeared


async def test_one_open_transaction_per_key(broker):
    async with Client(broker.url, operation_timeout_seconds=5, transaction_key="single") as task:
        first = await task.new_transaction()
        with pytest.raises(NotAllowedError, match="already has an open transaction"):
            await task.new_transaction()
        await first.commit()
        second = await task.new_transaction()          # allowed once the first ended
        await second.abort()


async def test_each_new_client_takes_the_next_epoch(broker):
    epochs = []
    for _ in range(3):
        async with Client(broker.url, operation_timeout_seconds=5, transaction_key="epochs") as task:
            epochs.append(await task.connect_transaction_key())
    assert epochs == [0, 1, 2]
    await broker.restart()
    async with Client(broker.url, operation_timeout_seconds=5, transaction_key="epochs") as task:
        assert await task.connect_transaction_key() == 3


async def test_concurrent_connects_with_one_key_get_distinct_epochs(broker):
    clients = [Client(broker.url, operation_timeout_seconds=5, transaction_key="race") for _ in range(4)]
    try:
        epochs = await asyncio.gather(*(c.connect_transaction_key() for c in clients))
        assert sorted(epochs) == [0, 1, 2, 3]
        winner = clients[epochs.index(3)]
        txn = await winner.new_transaction()
        await txn.commit()
        for loser in (c for c, e in zip(clients, epochs) if e != 3):
            with pytest.raises(NotAllowedError):
                await loser.new_transaction()
    finally:
        await asyncio.gather(*(c.close() for c in clients))


async def test_clients_without_a_key_are_not_affected(broker, client):
    async with Client(broker.url, operation_timeout_seconds=5, transaction_key="k") as keyed:
        await keyed.connect_transaction_key()
        plain_txns = [await client.new_transaction() for _ in range(3)]   # several open at once
        for txn in plain_txns:
            await txn.commit()
    assert client.transaction_epoch == -1


@pytest.mark.parametrize("key", ["", "x" * 257, "a&b"])
def test_bad_keys_are_refused_by_the_client(key):
    with pytest.raises(InvalidTransactionKeyError):
        Client("pulsar://127.0.0.1:6650", transaction_key=key)


def test_a_key_must_be_a_string():
    with pytest.raises(TypeError):
        Client("pulsar://127.0.0.1:6650", transaction_key=7)


async def test_a_client_without_a_key_cannot_connect_one(client):
    with pytest.raises(NotAllowedError):
        await client.connect_transaction_key()


@pytest.mark.parametrize("close_first", [True, False])
async def test_an_aborted_cumulative_ack_delivers_every_message_it_reserved_again(client, close_first):
    """What fencing relies on (and a fix it brought): the messages up to an aborted cumulative
    ack come back in full, whether their consumer is still there or already gone."""
    topic = "persistent://public/default/keys-reserved"
    producer = await client.create_producer(topic)
    for i in range(6):
        await producer.send(b"%d" % i)
    consumer = await client.subscribe(topic, "s", initial_position="earliest")
    taken = [await consumer.receive(timeout=5) for _ in range(3)]
    txn = await client.new_transaction()
    await consumer.acknowledge_cumulative(taken[-1], txn=txn)
    if close_first:
        await consumer.close()
        await txn.abort()
    else:
        await txn.abort()
        await consumer.close()
    again = await client.subscribe(topic, "s", initial_position="earliest")
    assert [(await again.receive(timeout=5)).data for _ in range(6)] == [b"%d" % i for i in range(6)]


async def reconnected(task: Client, epoch: int) -> None:
    """Wait until the task's coordinator connection is back, under `epoch`."""
    deadline = time.monotonic() + 10
    while task.transaction_epoch != epoch:
        assert time.monotonic() < deadline, f"still at epoch {task.transaction_epoch}"
        await asyncio.sleep(0.02)


async def test_the_holders_transaction_survives_a_dropped_connection_and_a_broker_restart(broker, client):
    # The epoch the holder presents on reconnecting proves that it holds the key: its open
    # transaction goes on under the new epoch, as one without a key would. (Aborting it, as the
    # first version did, lost the work of every keyed task at each network blip or restart.)
    watcher = await client.subscribe(OUT, "watch", initial_position="earliest")
    async with Client(broker.url, operation_timeout_seconds=5, transaction_key="steady") as task:
        txn = await task.new_transaction(timeout_ms=60_000)
        producer = await task.create_producer(OUT)
        await producer.send(b"before-the-drop", txn=txn)
        for connection in list(broker.server.connections):
            connection.close()                          # the network drops every connection
        await reconnected(task, epoch=1)
        await producer.send(b"after-the-drop", txn=txn)
        await broker.restart()
        await reconnected(task, epoch=2)
        await producer.send(b"after-the-restart", txn=txn)
        await txn.commit()
    assert [(await watcher.receive(timeout=5)).data for _ in range(3)] == \
        [b"before-the-drop", b"after-the-drop", b"after-the-restart"]


async def test_a_commit_whose_answer_was_lost_is_answered_committed_when_sent_again(broker, client, monkeypatch):
    # The coordinator commits, then the connection drops before the answer: the client sends
    # END_TXN again once reconnected (under the next epoch) and must hear "committed", not
    # "expired, it was aborted" (which would have the task redo work that is in).
    from pyengine.protocol import connection as server_connection
    from pyengine.protocol.transactions import TransactionCommands, txn_id
    from pyengine.transaction import TxnAction

    answered = TransactionCommands.end_txn

    async def end_then_drop(self, body):
        monkeypatch.setitem(server_connection._HANDLERS, server_connection.BaseCommand.END_TXN,
                            server_connection._txn_handler(answered))
        await self.coordinator.end_transaction(txn_id(body.txnid_most_bits, body.txnid_least_bits),
                                               TxnAction(body.txn_action))
        self.connection.close()                         # the answer is lost

    monkeypatch.setitem(server_connection._HANDLERS, server_connection.BaseCommand.END_TXN,
                        server_connection._txn_handler(end_then_drop))
    watcher = await client.subscribe(OUT, "watch", initial_position="earliest")
    async with Client(broker.url, operation_timeout_seconds=5, transaction_key="lost-answer") as task:
        txn = await task.new_transaction(timeout_ms=60_000)
        producer = await task.create_producer(OUT)
        await producer.send(b"once", txn=txn)
        await txn.commit()
        assert task.transaction_epoch == 1              # it did reconnect
    assert (await watcher.receive(timeout=5)).data == b"once"
