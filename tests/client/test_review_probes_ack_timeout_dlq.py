"""Review probes: ack timeout and dead letters at their edges (transactions, failures, close)."""

import asyncio

import pytest

from pyengine.client import ConsumerDeadLetterPolicy
from pyengine.client import consumer as consumer_module
from pyengine.client import dead_letter as dead_letter_module
from pyengine.errors import InvalidTxnStatusError

TOPIC = "persistent://public/default/review-probes"


@pytest.fixture
def short_ack_timeouts(monkeypatch):
    monkeypatch.setattr(consumer_module, "MIN_UNACKED_MESSAGES_TIMEOUT_MS", 1)


async def test_an_ack_refused_by_an_ended_txn_leaves_the_message_to_the_ack_timeout(client, short_ack_timeouts):
    # As the Java client: the tracker forgets a message when its transactional ACK goes out,
    # which an ended transaction never lets happen; the message is still unacknowledged.
    producer = await client.create_producer(TOPIC)
    consumer = await client.subscribe(TOPIC, "txn-ended", consumer_type="shared", initial_position="earliest",
                                      unacked_messages_timeout_ms=200)
    consumer._unacked.tick_ms = 50
    await producer.send(b"x")
    message = await consumer.receive(timeout=5)
    txn = await client.new_transaction()
    await txn.commit()
    with pytest.raises(InvalidTxnStatusError):
        await consumer.acknowledge(message, txn)
    again = await consumer.receive(timeout=3)
    assert again.data == b"x" and again.redelivery_count == 1


async def test_an_ack_with_a_txn_of_the_wrong_type_leaves_the_message_tracked(client, short_ack_timeouts):
    producer = await client.create_producer(TOPIC)
    consumer = await client.subscribe(TOPIC, "txn-type", consumer_type="shared", initial_position="earliest",
                                      unacked_messages_timeout_ms=200)
    consumer._unacked.tick_ms = 50
    await producer.send(b"x")
    message = await consumer.receive(timeout=5)
    with pytest.raises(TypeError):
        await consumer.acknowledge(message, object())
    assert len(consumer._unacked) == 1


async def test_a_dlq_that_cannot_be_opened_leaves_the_message_to_come_again(client, monkeypatch):
    producer = await client.create_producer(TOPIC)
    consumer = await client.subscribe(TOPIC, "dlq-refused", consumer_type="shared", initial_position="earliest",
                                      negative_ack_redelivery_delay_ms=10,
                                      dead_letter_policy=ConsumerDeadLetterPolicy(max_redeliver_count=1))
    sender = consumer._dead_letter
    opened = sender._open
    failures = []

    async def refuse_once(topic, schema):
        if not failures:
            failures.append(topic)
            raise ConnectionError("refused")
        return await opened(topic, schema)

    monkeypatch.setattr(sender, "_open", refuse_once)
    await producer.send(b"poison")
    seen = []
    while True:
        try:
            message = await consumer.receive(timeout=1.5)
        except TimeoutError:
            break
        seen.append(message.redelivery_count)
        await consumer.negative_acknowledge(message)
    assert failures and seen[:2] == [0, 1]
    dlq = await client.subscribe(f"{TOPIC}-dlq-refused-DLQ", "check", initial_position="earliest")
    assert (await dlq.receive(timeout=5)).data == b"poison"


async def test_closing_a_consumer_with_a_dead_letter_in_flight_leaves_nothing_running(client, monkeypatch):
    producer = await client.create_producer(TOPIC)
    consumer = await client.subscribe(TOPIC, "dlq-close", consumer_type="shared", initial_position="earliest",
                                      negative_ack_redelivery_delay_ms=10,
                                      dead_letter_policy=ConsumerDeadLetterPolicy(max_redeliver_count=1))
    gate = asyncio.Event()
    sender = consumer._dead_letter
    opened = sender._open

    async def slow_open(topic, schema):
        await gate.wait()
        return await opened(topic, schema)

    monkeypatch.setattr(sender, "_open", slow_open)
    await producer.send(b"poison")
    for _ in range(2):
        await consumer.negative_acknowledge(await consumer.receive(timeout=5))
    for _ in range(100):
        if consumer._dead_tasks:
            break
        await asyncio.sleep(0.02)
    assert consumer._dead_tasks
    tasks = list(consumer._dead_tasks)
    await consumer.close()
    await asyncio.sleep(0.05)
    assert all(t.done() for t in tasks)
    assert not sender._producers
    # not acknowledged: it comes again to the next consumer
    again = await client.subscribe(TOPIC, "dlq-close", consumer_type="shared")
    assert (await again.receive(timeout=5)).data == b"poison"


async def test_close_stops_the_ack_timeout_timer(client, short_ack_timeouts):
    producer = await client.create_producer(TOPIC)
    consumer = await client.subscribe(TOPIC, "close-timer", consumer_type="shared", initial_position="earliest",
                                      unacked_messages_timeout_ms=200)
    await producer.send(b"x")
    await consumer.receive(timeout=5)
    tracker = consumer._unacked
    assert tracker._timer is not None
    await consumer.close()
    assert tracker._timer is None and len(tracker) == 0


async def test_failover_cumulative_ack_on_a_partitioned_topic_stops_the_timeouts(client, broker, short_ack_timeouts):
    topic = f"{TOPIC}-parts"
    await broker.service.policies.create_partitioned_topic(topic, 2)
    producer = await client.create_producer(topic)
    consumer = await client.subscribe(topic, "fo", consumer_type="failover", initial_position="earliest",
                                      unacked_messages_timeout_ms=200)
    consumer._unacked.tick_ms = 50
    for i in range(6):
        await producer.send(b"%d" % i, key=f"k{i}")
    got = [await consumer.receive(timeout=5) for _ in range(6)]
    last = {}
    for m in got:
        last[m.message_id.partition] = m
    for m in last.values():
        await consumer.acknowledge_cumulative(m)
    assert len(consumer._unacked) == 0
    with pytest.raises(TimeoutError):
        await consumer.receive(timeout=0.6)


async def test_a_dead_letter_keeps_the_ordering_key(client):
    # As the C++ client's processPossibleToDLQ (and Java's copyMessageKeysIfNeeded): the dead
    # letter keeps the original's partition key and ordering key (Key_Shared routes by it).
    import dataclasses

    producer = await client.create_producer(TOPIC)
    consumer = await client.subscribe(TOPIC, "dlq-okey", consumer_type="shared", initial_position="earliest",
                                      dead_letter_policy=ConsumerDeadLetterPolicy(max_redeliver_count=1))
    await producer.send(b"x", key="pk")
    message = await consumer.receive(timeout=5)
    message = dataclasses.replace(message, ordering_key=b"order-1")
    await consumer._dead_letter.send(TOPIC, message)
    dlq = await client.subscribe(f"{TOPIC}-dlq-okey-DLQ", "check", initial_position="earliest")
    dead = await dlq.receive(timeout=5)
    assert dead.partition_key == "pk" and dead.ordering_key == b"order-1"


async def test_a_cumulative_ack_forgets_the_partly_acked_batches_it_covers(client):
    # Without batch-index acks, the consumer counts each batch's acknowledged messages; a
    # cumulative ack past a batch settles it: nothing is kept for it (a long run stays bounded).
    topic = f"{TOPIC}-cumul-batches"
    producer = await client.create_producer(topic, batching_enabled=True, batching_max_messages=4,
                                            batching_max_publish_delay_ms=1000)
    consumer = await client.subscribe(topic, "s", initial_position="earliest", batch_index_ack_enabled=False)
    for _ in range(3):
        await asyncio.gather(*(producer.send(b"%d" % i) for i in range(4)))
    received = [await consumer.receive(timeout=5) for _ in range(12)]
    for m in received[0:12:4]:
        await consumer.acknowledge(m)                 # index 0 of each batch
    [handler] = consumer._handlers.values()
    assert len(handler._batch_remaining) == 3
    await consumer.acknowledge_cumulative(received[11])
    assert handler._batch_remaining == {} and handler._batch_left == {}
