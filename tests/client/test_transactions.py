"""Transactions over the network: coordinator discovery, visibility, acks, commit and abort."""

import asyncio

import pytest

from pyengine.client import Client
from pyengine.client.errors import ConnectError
from pyengine.client.transaction import ABORTED, COMMITTED, TIMED_OUT, Transaction
from pyengine.errors import (InvalidTxnStatusError, TransactionConflictError, TransactionCoordinatorNotFoundError,
                             TransactionNotFoundError)
from pyengine.protocol import pulsar_api_pb2 as pb
from pyengine_kernels import TxnId
from tests.client.conftest import answer_registrations_when_set, record_sends
from tests.waiting import eventually

IN = "persistent://public/default/txn-in"
OUT = "persistent://public/default/txn-out"


async def test_readme_example_consume_transform_produce(broker):
    async with Client(broker.url) as client:
        setup = await client.create_producer(IN)
        await setup.send(b"hello")

        txn = await client.new_transaction(timeout_ms=60_000)
        producer = await client.create_producer(OUT)
        consumer = await client.subscribe(IN, "sub", consumer_type="exclusive", initial_position="earliest")
        msg = await consumer.receive()
        await producer.send(msg.data.upper(), txn=txn)
        await consumer.acknowledge(msg, txn=txn)
        await txn.commit()

        watcher = await client.subscribe(OUT, "watch", initial_position="earliest")
        assert (await watcher.receive(timeout=5)).data == b"HELLO"
        assert txn.state == COMMITTED
    # the input is consumed for good: a new consumer of the subscription gets nothing
    async with Client(broker.url) as client:
        consumer = await client.subscribe(IN, "sub")
        with pytest.raises(TimeoutError):
            await consumer.receive(timeout=0.3)


async def test_transactions_go_round_robin_over_the_coordinators(client):
    txns = [await client.new_transaction() for _ in range(8)]
    assert sorted({t.txn_id.most_bits for t in txns}) == [0, 1, 2, 3]
    for txn in txns:
        await txn.abort()


async def test_messages_are_visible_only_after_commit(client):
    producer = await client.create_producer(OUT)
    watcher = await client.subscribe(OUT, "watch", initial_position="earliest")
    txn = await client.new_transaction()
    for i in range(5):
        await producer.send(b"%d" % i, txn=txn)
    with pytest.raises(TimeoutError):
        await watcher.receive(timeout=0.3)
    await txn.commit()
    assert [int((await watcher.receive(timeout=5)).data) for _ in range(5)] == list(range(5))


async def test_aborted_messages_never_appear_and_acks_are_released(client):
    producer = await client.create_producer(OUT)
    source = await client.create_producer(IN)
    await source.send(b"input")
    consumer = await client.subscribe(IN, "sub", initial_position="earliest")
    watcher = await client.subscribe(OUT, "watch", initial_position="earliest")
    message = await consumer.receive(timeout=5)
    txn = await client.new_transaction()
    await producer.send(b"aborted", txn=txn)
    await consumer.acknowledge(message, txn=txn)
    await txn.abort()
    assert txn.state == ABORTED
    await producer.send(b"plain")
    assert (await watcher.receive(timeout=5)).data == b"plain"
    await consumer.redeliver_unacknowledged_messages()
    again = await consumer.receive(timeout=5)
    assert again.message_id == message.message_id and again.data == b"input"


async def test_a_plain_message_behind_an_open_transaction_waits_for_it(client):
    producer = await client.create_producer(OUT)
    watcher = await client.subscribe(OUT, "watch", initial_position="earliest")
    txn = await client.new_transaction()
    await producer.send(b"in-txn", txn=txn)
    await producer.send(b"plain")
    with pytest.raises(TimeoutError):
        await watcher.receive(timeout=0.3)
    await txn.abort()
    assert (await watcher.receive(timeout=5)).data == b"plain"


async def test_cumulative_acknowledgement_in_a_transaction(client):
    source = await client.create_producer(IN)
    for i in range(5):
        await source.send(b"%d" % i)
    consumer = await client.subscribe(IN, "cumulative", initial_position="earliest")
    messages = [await consumer.receive(timeout=5) for _ in range(5)]
    txn = await client.new_transaction()
    await consumer.acknowledge_cumulative(messages[2], txn=txn)
    await txn.commit()
    await consumer.close()
    again = await client.subscribe(IN, "cumulative")
    assert [int((await again.receive(timeout=5)).data) for _ in range(2)] == [3, 4]


async def test_consecutive_transactions_each_cumulatively_ack_a_slice_of_one_batch(client):
    """Regression: a transactional cumulative ack inside a batch acked the entry before the
    batch, so the next transaction's ack in the same batch conflicted with the mark-delete
    position (TransactionConflictError). Now it carries the batch's ack set (the Java form)
    and the broker reserves only the indexes not acked yet."""
    source = await client.create_producer(IN, batching_enabled=True, batching_max_messages=10,
                                          batching_max_publish_delay_ms=1000)
    await asyncio.gather(*(source.send(b"%d" % i) for i in range(10)))
    consumer = await client.subscribe(IN, "slices", initial_position="earliest")
    messages = [await consumer.receive(timeout=5) for _ in range(10)]
    assert len({(m.message_id.ledger_id, m.message_id.entry_id) for m in messages}) == 1
    for last in (2, 5):
        txn = await client.new_transaction()
        await consumer.acknowledge_cumulative(messages[last], txn=txn)
        await txn.commit()
    again_txn = await client.new_transaction()             # taking an acked message again fails:
    with pytest.raises(TransactionConflictError):          # its outputs would be committed twice
        await consumer.acknowledge_cumulative(messages[4], txn=again_txn)
    await again_txn.abort()
    twice = await client.new_transaction()                 # two slices in one transaction
    await consumer.acknowledge_cumulative(messages[6], txn=twice)
    await consumer.acknowledge_cumulative(messages[7], txn=twice)
    await twice.commit()
    aborted = await client.new_transaction()
    await consumer.acknowledge_cumulative(messages[8], txn=aborted)
    await aborted.abort()
    await consumer.close()
    again = await client.subscribe(IN, "slices")
    assert [int((await again.receive(timeout=5)).data) for _ in range(2)] == [8, 9]
    with pytest.raises(TimeoutError):
        await again.receive(timeout=0.3)


async def test_the_rest_of_a_batch_a_transaction_acked_part_of_is_still_redelivered(client):
    """Regression: committing a transaction that acked some indexes of a batch dropped the
    whole entry from the consumer's in-flight messages, so a redelivery request skipped the
    rest of the batch and a later cumulative ack took it unprocessed."""
    source = await client.create_producer(IN, batching_enabled=True, batching_max_messages=10,
                                          batching_max_publish_delay_ms=1000)
    await asyncio.gather(*(source.send(b"%d" % i) for i in range(10)))
    consumer = await client.subscribe(IN, "rest", initial_position="earliest")
    messages = [await consumer.receive(timeout=5) for _ in range(10)]
    txn = await client.new_transaction()
    await consumer.acknowledge_cumulative(messages[4], txn=txn)
    await txn.commit()
    await consumer.redeliver_unacknowledged_messages()
    assert [int((await consumer.receive(timeout=5)).data) for _ in range(5)] == [5, 6, 7, 8, 9]


async def test_a_conflicting_ack_fails_and_commit_aborts_instead(client):
    source = await client.create_producer(IN)
    producer = await client.create_producer(OUT)
    await source.send(b"x")
    consumer = await client.subscribe(IN, "conflict", consumer_type="shared", initial_position="earliest")
    watcher = await client.subscribe(OUT, "watch", initial_position="earliest")
    message = await consumer.receive(timeout=5)
    first, second = await client.new_transaction(), await client.new_transaction()
    await consumer.acknowledge(message, txn=first)
    await producer.send(b"from-second", txn=second)
    with pytest.raises(TransactionConflictError):
        await consumer.acknowledge(message, txn=second)
    with pytest.raises(TransactionConflictError):
        await second.commit()                  # aborted instead, and the reason raised
    assert second.state == ABORTED
    await first.commit()
    await producer.send(b"after")
    assert (await watcher.receive(timeout=5)).data == b"after"


async def test_a_finished_transaction_refuses_further_use(client):
    producer = await client.create_producer(OUT)
    consumer = await client.subscribe(OUT, "sub", initial_position="earliest")
    txn = await client.new_transaction()
    await producer.send(b"x", txn=txn)
    await txn.commit()
    message = await consumer.receive(timeout=5)
    with pytest.raises(InvalidTxnStatusError):
        await producer.send(b"y", txn=txn)
    with pytest.raises(InvalidTxnStatusError):
        await consumer.acknowledge(message, txn=txn)
    with pytest.raises(InvalidTxnStatusError):
        await txn.commit()
    with pytest.raises(InvalidTxnStatusError):
        await txn.abort()


async def test_a_timed_out_transaction_is_aborted_by_the_broker(client):
    producer = await client.create_producer(OUT)
    watcher = await client.subscribe(OUT, "watch", initial_position="earliest")
    # Long enough for the send's durable writes on a slow CI disk, short enough for a test.
    txn = await client.new_transaction(timeout_ms=1500)
    await producer.send(b"late", txn=txn)
    await eventually(lambda: txn.state == TIMED_OUT)
    with pytest.raises(InvalidTxnStatusError):
        await txn.commit()
    # The broker ended it too: its END_TXN COMMIT is refused, and nothing becomes visible.
    with pytest.raises((InvalidTxnStatusError, TransactionNotFoundError)):
        await client._core.coordinator.end(txn.txn_id, pb.COMMIT)
    await producer.send(b"plain")
    assert (await watcher.receive(timeout=5)).data == b"plain"


async def test_a_transaction_the_coordinator_never_issued_is_not_found(client):
    """A txn id of a real coordinator (most bits 0) that it never handed out: every request of
    it is TransactionNotFound, not InvalidTxnStatus, from the send's registration to the end."""
    await (await client.new_transaction()).abort()          # the coordinator is up and issuing
    coordinator = client._core.coordinator
    never_issued = TxnId(0, 1 << 40)
    with pytest.raises(TransactionNotFoundError):
        await coordinator.end(never_issued, pb.COMMIT)
    with pytest.raises(TransactionNotFoundError):
        await coordinator.end(never_issued, pb.ABORT)
    forged = Transaction(coordinator, never_issued, 60_000)
    producer = await client.create_producer(OUT)
    with pytest.raises(TransactionNotFoundError):           # ADD_PARTITION_TO_TXN refuses it
        await producer.send(b"x", txn=forged)
    with pytest.raises(TransactionNotFoundError):           # commit aborts and raises the send's failure
        await forged.commit()
    watcher = await client.subscribe(OUT, "watch", initial_position="earliest")
    with pytest.raises(TimeoutError):
        await watcher.receive(timeout=0.3)


async def test_concurrent_sends_and_acks_register_once(client, monkeypatch):
    coordinator = client._core.coordinator
    registrations = []
    for name in ("add_partition", "add_subscription"):
        original = getattr(coordinator, name)

        def counted(*args, _original=original, _name=name):
            registrations.append(_name)
            return _original(*args)
        monkeypatch.setattr(coordinator, name, counted)
    source = await client.create_producer(IN)
    for i in range(10):
        await source.send(b"%d" % i)
    consumer = await client.subscribe(IN, "once", consumer_type="shared", initial_position="earliest")
    messages = [await consumer.receive(timeout=5) for _ in range(10)]
    producer = await client.create_producer(OUT)
    txn = await client.new_transaction()
    await asyncio.gather(*(producer.send(b"%d" % i, txn=txn) for i in range(20)),
                         *(consumer.acknowledge(m, txn=txn) for m in messages))
    assert sorted(registrations) == ["add_partition", "add_subscription"]
    await txn.commit()
    watcher = await client.subscribe(OUT, "all", initial_position="earliest")
    assert sorted([int((await watcher.receive(timeout=5)).data) for _ in range(20)]) == list(range(20))


async def test_transactional_batches(client):
    producer = await client.create_producer(OUT, batching_enabled=True, batching_max_messages=10,
                                            batching_max_publish_delay_ms=50)
    watcher = await client.subscribe(OUT, "watch", initial_position="earliest")
    txn = await client.new_transaction()
    ids = await asyncio.gather(*(producer.send(b"%d" % i, txn=txn) for i in range(25)))
    assert {i.batch_size for i in ids} == {10, 5}
    with pytest.raises(TimeoutError):
        await watcher.receive(timeout=0.2)
    await txn.commit()
    assert [int((await watcher.receive(timeout=5)).data) for _ in range(25)] == list(range(25))


async def test_messages_held_for_their_registration_count_that_wait_in_the_batching_delay(client, monkeypatch):
    """A txn's first messages wait for ADD_PARTITION_TO_TXN; their batch then goes once the
    batching delay has passed since they were sent, not a whole delay after the registration."""
    registered = answer_registrations_when_set(client, monkeypatch)
    producer = await client.create_producer(OUT, batching_enabled=True, batching_max_publish_delay_ms=1000)
    txn = await client.new_transaction()
    sent = [producer.send_async(b"%d" % i, txn=txn) for i in range(3)]
    await asyncio.sleep(1.2)                     # longer than the batching delay, all of it held
    released = asyncio.get_running_loop().time()
    registered.set()
    ids = await asyncio.wait_for(asyncio.gather(*sent), 5)
    assert asyncio.get_running_loop().time() - released < 0.5     # not another second
    assert {i.batch_size for i in ids} == {3}
    await txn.commit()


async def test_sends_built_before_their_registration_is_answered_are_written_after_it(client, monkeypatch):
    """A txn's first messages are batched at once but their SEND waits for ADD_PARTITION_TO_TXN
    (the broker must know the partition before it stores them), and a plain send behind them
    waits too: the wire keeps sequence order."""
    registered = answer_registrations_when_set(client, monkeypatch)
    producer = await client.create_producer(OUT, batching_enabled=True, batching_max_messages=2,
                                            batching_max_publish_delay_ms=5)
    # The topic's first transactional append waits until the topic is marked transactional,
    # while plain ones do not: a first transaction makes the broker's order the wire's.
    first = await client.new_transaction()
    registered.set()
    await producer.send(b"first", txn=first)
    await first.commit()
    registered.clear()
    written = record_sends(producer._partitions[0].connection, monkeypatch)
    txn = await client.new_transaction()
    in_txn = [producer.send_async(b"t%d" % i, txn=txn) for i in range(5)]     # three batches
    plain = producer.send_async(b"plain")
    await asyncio.sleep(0.2)                     # every batch's delay has passed
    assert written == [] and not any(f.done() for f in [*in_txn, plain])
    registered.set()
    ids = await asyncio.wait_for(asyncio.gather(*in_txn, plain), 5)
    assert len(written) == 4 and ids == sorted(ids)
    assert [i.batch_size for i in ids] == [2, 2, 2, 2, 1, 1]
    await txn.commit()
    watcher = await client.subscribe(OUT, "gated", initial_position="earliest")
    assert [(await watcher.receive(timeout=5)).data for _ in range(7)] == [b"first", b"t0", b"t1", b"t2", b"t3",
                                                                            b"t4", b"plain"]


async def test_a_failed_registration_fails_the_sends_waiting_for_it_and_not_those_behind(client, monkeypatch):
    coordinator = client._core.coordinator
    refuse = asyncio.Event()

    async def refused(*args):
        await refuse.wait()
        raise TransactionNotFoundError("refused by the test")
    monkeypatch.setattr(coordinator, "add_partition", lambda *args: asyncio.ensure_future(refused(*args)))
    producer = await client.create_producer(OUT, batching_enabled=True, batching_max_publish_delay_ms=5)
    txn = await client.new_transaction()
    in_txn = [producer.send_async(b"t%d" % i, txn=txn) for i in range(3)]
    plain = producer.send_async(b"plain")
    await asyncio.sleep(0.05)
    assert producer._partitions[0].queue_full is False and producer._partitions[0]._pending_messages == 4
    refuse.set()
    await asyncio.wait_for(asyncio.wait([*in_txn, plain]), 5)
    assert all(isinstance(f.exception(), TransactionNotFoundError) for f in in_txn)
    assert plain.exception() is None
    assert producer._partitions[0]._pending_messages == 0
    with pytest.raises(TransactionNotFoundError):
        await txn.commit()                       # commit aborts and raises the sends' failure
    watcher = await client.subscribe(OUT, "after-refusal", initial_position="earliest")
    assert (await watcher.receive(timeout=5)).data == b"plain"
    with pytest.raises(TimeoutError):
        await watcher.receive(timeout=0.3)


async def test_send_async_after_a_failed_registration_registers_again(client, monkeypatch):
    """send_async in a transaction: sends behind a registration in flight share it, sends after
    it succeeded need none, and a send after a failed one registers the partition again."""
    coordinator = client._core.coordinator
    original = coordinator.add_partition
    asked = []

    async def refused(*args):
        raise TransactionNotFoundError("refused by the test")

    def add_partition(*args):
        asked.append(args)
        return asyncio.ensure_future(refused(*args)) if len(asked) == 1 else original(*args)
    monkeypatch.setattr(coordinator, "add_partition", add_partition)
    producer = await client.create_producer(OUT, batching_enabled=True, batching_max_publish_delay_ms=5)
    txn = await client.new_transaction()
    refused_sends = [producer.send_async(b"r%d" % i, txn=txn) for i in range(3)]
    await asyncio.wait_for(asyncio.wait(refused_sends), 5)
    assert all(isinstance(f.exception(), TransactionNotFoundError) for f in refused_sends) and len(asked) == 1
    stored = [producer.send_async(b"s%d" % i, txn=txn) for i in range(3)]     # registered again, shared
    await asyncio.wait_for(asyncio.gather(*stored), 5)
    stored.append(producer.send_async(b"s3", txn=txn))                          # registered: none asked
    await asyncio.wait_for(stored[-1], 5)
    assert len(asked) == 2
    with pytest.raises(TransactionNotFoundError):
        await txn.commit()                       # a send of it failed: the commit aborts
    watcher = await client.subscribe(OUT, "after-second-registration", initial_position="earliest")
    with pytest.raises(TimeoutError):
        await watcher.receive(timeout=0.3)       # aborted: none of them is visible


async def test_a_txns_first_send_writes_its_registration_at_once(client, monkeypatch):
    """ADD_PARTITION_TO_TXN goes out in the same turn as the send that needs it, not when a
    task first runs (behind the rest of a burst of sends)."""
    await (await client.new_transaction()).abort()          # the coordinator's handler is connected
    handler = client._core.coordinator._handlers[0]
    written = []
    write = handler.connection.write

    def spied(frame: bytes) -> None:
        size = int.from_bytes(frame[4:8], "big")
        written.append(pb.BaseCommand.FromString(frame[8:8 + size]).type)
        write(frame)
    monkeypatch.setattr(handler.connection, "write", spied)
    producer = await client.create_producer(OUT, batching_enabled=True)
    txn = await client.new_transaction()
    while txn.txn_id.most_bits != 0:                        # round robin: one of coordinator 0
        await txn.abort()
        txn = await client.new_transaction()
    written.clear()
    sent = producer.send_async(b"x", txn=txn)
    assert written == [pb.BaseCommand.ADD_PARTITION_TO_TXN]    # before this test yields
    await sent
    await txn.commit()


async def test_a_send_in_a_txn_of_an_unknown_coordinator_fails_its_future(client):
    await (await client.new_transaction()).abort()
    producer = await client.create_producer(OUT)
    unknown = Transaction(client._core.coordinator, TxnId(1 << 20, 1), 60_000)
    sent = producer.send_async(b"x", txn=unknown)            # refused by its future, not raised here
    with pytest.raises(TransactionCoordinatorNotFoundError):
        await sent


async def test_a_registration_while_its_coordinator_is_not_connected_waits_and_goes(client, monkeypatch):
    """Not written at once when the handler is not connected (or the write fails): the
    request's task sends it once it can, as every TC request does."""
    await (await client.new_transaction()).abort()
    handler = client._core.coordinator._handlers[0]
    producer = await client.create_producer(OUT)
    txn = await client.new_transaction()
    while txn.txn_id.most_bits != 0:
        await txn.abort()
        txn = await client.new_transaction()
    handler._ready.clear()                                   # as while it reconnects
    sent = producer.send_async(b"later", txn=txn)
    await asyncio.sleep(0.1)
    assert not sent.done()
    handler._ready.set()
    await asyncio.wait_for(sent, 5)
    # The connection refuses the first write: sent again by the task.
    other = await client.create_producer(IN)
    refusals = []
    send_request = handler.connection.send_request

    def refuse_once(cmd):
        if cmd.type == pb.BaseCommand.ADD_PARTITION_TO_TXN and not refusals:
            refusals.append(cmd.type)
            raise ConnectError("refused by the test")
        return send_request(cmd)
    monkeypatch.setattr(handler.connection, "send_request", refuse_once)
    await asyncio.wait_for(other.send_async(b"retried", txn=txn), 5)
    assert refusals == [pb.BaseCommand.ADD_PARTITION_TO_TXN]
    await txn.commit()


async def test_an_abort_rewinds_a_consumer_that_acked_cumulatively_in_it(client):
    """As the Java client's abort: the consumer drops what it has queued and reads again from
    the subscription's position. Its queue's later messages came first before: a processor
    that then acked one of them cumulatively in its next transaction acked the released
    messages before them without having processed them (lost to exactly-once processing)."""
    topic = "persistent://public/default/txn-cumulative-rewind"
    producer = await client.create_producer(topic)
    consumer = await client.subscribe(topic, "sub", consumer_type="failover", initial_position="earliest")
    for i in range(6):
        await producer.send(b"%d" % i)
    txn = await client.new_transaction()
    first = [await consumer.receive(5) for _ in range(2)]
    await asyncio.sleep(0.2)                          # the rest is queued at the consumer
    await consumer.acknowledge_cumulative(first[-1], txn=txn)
    await txn.abort()
    again = [await consumer.receive(5) for _ in range(6)]
    assert [m.data for m in again] == [b"%d" % i for i in range(6)]
    retry = await client.new_transaction()
    await consumer.acknowledge_cumulative(again[-1], txn=retry)
    await retry.commit()
    with pytest.raises(TimeoutError):
        await consumer.receive(0.3)                   # nothing more: all six acknowledged
