"""Ack timeout (unacked_messages_timeout_ms) and dead letter policy, with negative acks."""

import asyncio

import pulsar
import pytest

from pyengine.client import ConsumerDeadLetterPolicy, MessageId
from pyengine.client import consumer as consumer_module
from pyengine.client.consumer import ConsumerOptions
from pyengine.client.unacked import UnackedMessageTracker

from .conftest import drain

TOPIC = "persistent://public/default/dlq-src"


@pytest.fixture
def short_ack_timeouts(monkeypatch):
    """Pulsar's minimum ack timeout is 10 s: tests lower it (the public check stays)."""
    monkeypatch.setattr(consumer_module, "MIN_UNACKED_MESSAGES_TIMEOUT_MS", 1)


async def receive_all(consumer, timeout=1.0):
    got = []
    while True:
        try:
            got.append(await consumer.receive(timeout=timeout))
        except TimeoutError:
            return got


# --- ack timeout -------------------------------------------------------------------------------

async def test_unacked_messages_are_redelivered_after_the_timeout_on_shared(client, short_ack_timeouts):
    producer = await client.create_producer(TOPIC)
    consumer = await client.subscribe(TOPIC, "at-shared", consumer_type="shared", initial_position="earliest",
                                      unacked_messages_timeout_ms=300)
    consumer._unacked.tick_ms = 100            # not part of the API: C++'s tickDurationInMs
    for i in range(3):
        await producer.send(b"%d" % i)
    received = [await consumer.receive(timeout=5) for _ in range(3)]
    await consumer.acknowledge(received[0])
    await consumer.acknowledge(received[2])
    with pytest.raises(TimeoutError):
        await consumer.receive(timeout=0.15)           # not before the timeout
    again = await consumer.receive(timeout=5)
    assert again.data == b"1" and again.redelivery_count == 1
    await consumer.acknowledge(again)
    with pytest.raises(TimeoutError):
        await consumer.receive(timeout=0.8)            # acknowledged: no more timeouts


async def test_a_multi_topic_consumer_times_out_only_what_the_application_received(client, short_ack_timeouts):
    """As the Java client (a ConsumerImpl with a parent consumer leaves tracking to it): the
    messages waiting in a MultiTopicsConsumer's buffer are not timed out; before, the clock of
    each started when the parent took it from its topic's queue, so messages the application
    had not received yet came again (twice, once received)."""
    topics = [TOPIC + "-mt-a", TOPIC + "-mt-b"]
    for topic in topics:
        producer = await client.create_producer(topic)
        for i in range(3):
            await producer.send(f"{topic[-1]}{i}".encode())
    consumer = await client.subscribe(topics, "mt-at", consumer_type="shared", initial_position="earliest",
                                      unacked_messages_timeout_ms=300)
    for each in consumer._consumers.values():
        each._unacked.tick_ms = 100            # not part of the API: C++'s tickDurationInMs
    first = await consumer.receive(timeout=5)
    await asyncio.sleep(0.1)
    assert len(consumer._buffer) == 5          # the others wait in the parent's buffer
    await asyncio.sleep(0.7)                   # past the first one's timeout (and a tick)
    rest = await drain(consumer)
    assert sorted((m.data, m.redelivery_count) for m in rest) == sorted(
        [(first.data, 1)] + [(f"{t}{i}".encode(), 0) for t in "ab" for i in range(3) if f"{t}{i}".encode() != first.data])


async def test_ack_timeout_on_exclusive_redelivers_everything_unacked(client, short_ack_timeouts):
    producer = await client.create_producer(TOPIC)
    consumer = await client.subscribe(TOPIC, "at-excl", initial_position="earliest",
                                      unacked_messages_timeout_ms=200)
    for i in range(3):
        await producer.send(b"%d" % i)
    first = await consumer.receive(timeout=5)          # the others stay in the queue, not received
    assert first.data == b"0"
    await asyncio.sleep(0.6)                            # past the timeout (and a tick)
    again = await consumer.receive(timeout=5)
    # the queue was dropped and everything unacked came again, in order (with count 0: as
    # Pulsar, a single-active-consumer subscription counts no redeliveries)
    assert again.data == b"0" and again.redelivery_count == 0
    await consumer.acknowledge(again)
    rest = [await consumer.receive(timeout=5) for _ in range(2)]
    assert [m.data for m in rest] == [b"1", b"2"]


async def test_cumulative_ack_and_nack_stop_the_ack_timeout(client, short_ack_timeouts):
    producer = await client.create_producer(TOPIC)
    consumer = await client.subscribe(TOPIC, "at-cumul", initial_position="earliest",
                                      unacked_messages_timeout_ms=200, negative_ack_redelivery_delay_ms=60_000)
    for i in range(3):
        await producer.send(b"%d" % i)
    received = [await consumer.receive(timeout=5) for _ in range(3)]
    await consumer.acknowledge_cumulative(received[1])
    await consumer.negative_acknowledge(received[2])   # redelivered after a minute, not by the timeout
    assert len(consumer._unacked) == 0
    with pytest.raises(TimeoutError):
        await consumer.receive(timeout=0.6)


async def test_batch_messages_time_out_by_themselves(client, short_ack_timeouts):
    producer = await client.create_producer(TOPIC, batching_enabled=True, batching_max_messages=4,
                                            batching_max_publish_delay_ms=1000)
    consumer = await client.subscribe(TOPIC, "at-batch", consumer_type="shared", initial_position="earliest",
                                      unacked_messages_timeout_ms=200)
    await asyncio.gather(*(producer.send(b"%d" % i) for i in range(4)))
    received = [await consumer.receive(timeout=5) for _ in range(4)]
    for message in received[:3]:
        await consumer.acknowledge(message)
    again = await consumer.receive(timeout=5)
    assert again.data == b"3" and again.message_id == received[3].message_id


def test_the_ack_timeout_has_pulsars_minimum():
    assert ConsumerOptions("s", unacked_messages_timeout_ms=10_000).unacked_messages_timeout_ms == 10_000
    assert ConsumerOptions("s", unacked_messages_timeout_ms=0).unacked_messages_timeout_ms == 0
    assert ConsumerOptions("s", unacked_messages_timeout_ms=None).unacked_messages_timeout_ms == 0
    with pytest.raises(ValueError):
        ConsumerOptions("s", unacked_messages_timeout_ms=9_999)
    with pytest.raises(ValueError):
        ConsumerOptions("s", unacked_messages_timeout_ms=-1)
    with pytest.raises(TypeError):
        ConsumerOptions("s", unacked_messages_timeout_ms=10.5)


async def test_the_tracker_redelivers_each_entry_once_between_timeout_and_timeout_plus_tick():
    redelivered = []
    tracker = UnackedMessageTracker(100, 50, lambda owner, ids: redelivered.append((owner, ids)))
    loop = asyncio.get_running_loop()
    start = loop.time()
    tracker.add("p", MessageId(1, 1, 0, -1, 2))
    tracker.add("p", MessageId(1, 1, 1, -1, 2))
    tracker.add("p", MessageId(1, 2))
    tracker.remove("p", MessageId(1, 2))
    while not redelivered:
        await asyncio.sleep(0.01)
    assert 0.1 <= loop.time() - start <= 0.3
    assert redelivered == [("p", [MessageId(1, 1)])]
    assert len(tracker) == 0
    tracker.close()


# --- dead letters ------------------------------------------------------------------------------

async def test_a_message_nacked_max_redeliver_count_times_more_goes_to_the_dlq(client):
    producer = await client.create_producer(TOPIC)
    consumer = await client.subscribe(TOPIC, "dlq-nack", consumer_type="shared", initial_position="earliest",
                                      negative_ack_redelivery_delay_ms=10,
                                      dead_letter_policy=ConsumerDeadLetterPolicy(max_redeliver_count=2))
    sent = await producer.send(b"poison", key="k1", properties={"a": "b"})
    await producer.send(b"fine")
    counts = []
    while True:        # as Pulsar: handed out max_redeliver_count + 1 times, then dead-lettered
        try:
            message = await consumer.receive(timeout=1.5)
        except TimeoutError:
            break
        if message.data == b"fine":
            await consumer.acknowledge(message)
            continue
        counts.append(message.redelivery_count)
        await consumer.negative_acknowledge(message)
    assert counts == [0, 1, 2]
    dlq_topic = f"{TOPIC}-dlq-nack-DLQ"
    dlq = await client.subscribe(dlq_topic, "check", initial_position="earliest")
    dead = await dlq.receive(timeout=5)
    assert dead.data == b"poison" and dead.partition_key == "k1"
    assert dead.properties == {"a": "b", "REAL_TOPIC": TOPIC, "ORIGIN_MESSAGE_ID": str(sent)}
    with pytest.raises(TimeoutError):
        await dlq.receive(timeout=0.3)
    # the original was acknowledged once dead-lettered
    await consumer.close()
    again = await client.subscribe(TOPIC, "dlq-nack", consumer_type="shared")
    with pytest.raises(TimeoutError):
        await again.receive(timeout=0.5)


async def test_ack_timeout_and_dead_letters_together(client, short_ack_timeouts):
    producer = await client.create_producer(TOPIC)
    consumer = await client.subscribe(TOPIC, "dlq-at", consumer_type="shared", initial_position="earliest",
                                      unacked_messages_timeout_ms=100,
                                      dead_letter_policy=ConsumerDeadLetterPolicy(1, f"{TOPIC}-custom-dlq"))
    consumer._unacked.tick_ms = 50
    for i in range(3):
        await producer.send(b"%d" % i)
    got = await receive_all(consumer, timeout=1.0)     # never acknowledged
    assert sorted(m.data for m in got) == [b"0", b"0", b"1", b"1", b"2", b"2"]
    dlq = await client.subscribe(f"{TOPIC}-custom-dlq", "check", initial_position="earliest")
    assert sorted([(await dlq.receive(timeout=5)).data for _ in range(3)]) == [b"0", b"1", b"2"]


async def test_the_dlq_initial_subscription_is_created_before_the_first_dead_letter(client):
    producer = await client.create_producer(TOPIC)
    policy = ConsumerDeadLetterPolicy(max_redeliver_count=1, initial_subscription_name="init-sub")
    consumer = await client.subscribe(TOPIC, "dlq-init", consumer_type="shared", initial_position="earliest",
                                      negative_ack_redelivery_delay_ms=10, dead_letter_policy=policy)
    await producer.send(b"x")
    for _ in range(2):
        await consumer.negative_acknowledge(await consumer.receive(timeout=5))
    dlq_topic = f"{TOPIC}-dlq-init-DLQ"
    for _ in range(100):
        if consumer._dead_letter._producers:
            break
        await asyncio.sleep(0.02)
    await asyncio.sleep(0.2)
    # subscribing at "latest" still finds the dead letter: the subscription existed before it
    late = await client.subscribe(dlq_topic, "init-sub", initial_position="latest")
    dead = await late.receive(timeout=5)
    assert dead.data == b"x" and dead.properties["REAL_TOPIC"] == TOPIC


async def test_each_message_of_a_batch_is_dead_lettered_by_itself(client):
    producer = await client.create_producer(TOPIC, batching_enabled=True, batching_max_messages=3,
                                            batching_max_publish_delay_ms=1000)
    consumer = await client.subscribe(TOPIC, "dlq-batch", consumer_type="shared", initial_position="earliest",
                                      negative_ack_redelivery_delay_ms=10,
                                      dead_letter_policy=ConsumerDeadLetterPolicy(max_redeliver_count=1))
    ids = await asyncio.gather(*(producer.send(b"%d" % i, key=f"k{i}") for i in range(3)))
    first = [await consumer.receive(timeout=5) for _ in range(3)]
    await consumer.acknowledge(first[0])              # the others fail
    for message in first[1:]:
        await consumer.negative_acknowledge(message)
    second = [await consumer.receive(timeout=5) for _ in range(2)]
    assert [m.data for m in second] == [b"1", b"2"] and {m.redelivery_count for m in second} == {1}
    for message in second:
        await consumer.negative_acknowledge(message)
    dlq = await client.subscribe(f"{TOPIC}-dlq-batch-DLQ", "check", initial_position="earliest")
    dead = [await dlq.receive(timeout=5) for _ in range(2)]
    assert sorted((m.data, m.partition_key, m.properties["ORIGIN_MESSAGE_ID"]) for m in dead) == [
        (b"1", "k1", str(ids[1])), (b"2", "k2", str(ids[2]))]
    assert all(m.message_id.batch_index == -1 for m in dead)    # sent one by one, not as a batch
    with pytest.raises(TimeoutError):
        await dlq.receive(timeout=0.3)
    with pytest.raises(TimeoutError):
        await consumer.receive(timeout=0.5)


async def test_a_message_above_the_maximum_on_arrival_is_dead_lettered_without_being_handed_out(client):
    producer = await client.create_producer(TOPIC)
    plain = await client.subscribe(TOPIC, "dlq-arrive", consumer_type="shared", initial_position="earliest")
    await producer.send(b"late")
    for _ in range(3):          # redelivered three times before any dead letter policy
        await plain.redeliver_unacknowledged_messages()
        message = await plain.receive(timeout=5)
    assert message.redelivery_count == 3
    await plain.close()          # a consumer gone may count once more
    consumer = await client.subscribe(TOPIC, "dlq-arrive", consumer_type="shared",
                                      dead_letter_policy=ConsumerDeadLetterPolicy(max_redeliver_count=2))
    with pytest.raises(TimeoutError):
        await consumer.receive(timeout=0.8)
    dlq = await client.subscribe(f"{TOPIC}-dlq-arrive-DLQ", "check", initial_position="earliest")
    assert (await dlq.receive(timeout=5)).data == b"late"


async def test_dead_letters_of_a_partitioned_topic_go_to_each_partitions_dlq(client, broker):
    topic = "persistent://public/default/dlq-parted"
    await broker.service.policies.create_partitioned_topic(topic, 2)
    producer = await client.create_producer(topic)
    consumer = await client.subscribe(topic, "s", consumer_type="shared", initial_position="earliest",
                                      negative_ack_redelivery_delay_ms=10,
                                      dead_letter_policy=ConsumerDeadLetterPolicy(max_redeliver_count=1))
    sent = await producer.send(b"p", key="key")
    for _ in range(2):
        await consumer.negative_acknowledge(await consumer.receive(timeout=5))
    dlq = await client.subscribe(f"{topic}-partition-{sent.partition}-s-DLQ", "check",
                                 initial_position="earliest")
    dead = await dlq.receive(timeout=5)
    assert dead.properties["REAL_TOPIC"] == f"{topic}-partition-{sent.partition}"


def test_pulsar_clients_policy_is_accepted():
    options = ConsumerOptions("s", dead_letter_policy=pulsar.ConsumerDeadLetterPolicy(
        4, "persistent://public/default/d", "init"))
    assert options.dead_letter_policy == ConsumerDeadLetterPolicy(4, "persistent://public/default/d", "init")
    options = ConsumerOptions("s", dead_letter_policy=pulsar.ConsumerDeadLetterPolicy(2))
    assert options.dead_letter_policy == ConsumerDeadLetterPolicy(2)


def test_short_dlq_topic_names_are_normalised():
    assert ConsumerDeadLetterPolicy(1, "my-dlq").dead_letter_topic == "persistent://public/default/my-dlq"


@pytest.mark.parametrize("kwargs, error", [
    ({"dead_letter_policy": 3}, TypeError),
    ({"dead_letter_policy": {"max_redeliver_count": 3}}, TypeError),
    ({"unacked_messages_timeout_ms": 5_000}, ValueError),
    ({"unacked_messages_timeout_ms": -10_000}, ValueError),
    ({"unacked_messages_timeout_ms": "10000"}, TypeError),
])
async def test_malformed_subscribe_arguments(client, kwargs, error):
    with pytest.raises(error):
        await client.subscribe(TOPIC, "bad", **kwargs)


@pytest.mark.parametrize("args, error", [
    ((0,), ValueError), ((-1,), ValueError), ((1.5,), TypeError), ((True,), TypeError), ((None,), TypeError),
    ((1, 5), TypeError), ((1, ""), ValueError), ((1, None, ""), ValueError), ((1, None, 7), TypeError),
])
def test_malformed_dead_letter_policies(args, error):
    with pytest.raises(error):
        ConsumerDeadLetterPolicy(*args)


async def test_no_dead_letters_on_an_exclusive_subscription(client):
    # As Pulsar: its single-active-consumer dispatcher counts no redeliveries (its
    # RedeliveryTrackerDisabled), so an Exclusive / Failover message always comes with count 0
    # and a dead letter policy never fires there (Pulsar documents DLQs for Shared and Key_Shared).
    producer = await client.create_producer(TOPIC)
    consumer = await client.subscribe(TOPIC, "dlq-excl", initial_position="earliest",
                                      negative_ack_redelivery_delay_ms=10,
                                      dead_letter_policy=ConsumerDeadLetterPolicy(max_redeliver_count=1))
    await producer.send(b"bad")
    seen = []
    for _ in range(3):
        message = await consumer.receive(timeout=5)
        seen.append((message.data, message.redelivery_count))
        await consumer.negative_acknowledge(message)
    assert seen == [(b"bad", 0)] * 3
    await consumer.acknowledge(await consumer.receive(timeout=5))
    dlq = await client.subscribe(f"{TOPIC}-dlq-excl-DLQ", "check", initial_position="earliest")
    with pytest.raises(TimeoutError):
        await dlq.receive(timeout=0.3)
