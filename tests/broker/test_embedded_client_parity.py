"""The embedded API has what pyengine.client has, with its semantics: the compacted view's last
message id for read-compacted consumers and readers (and a reader's has_message_available /
read_next), batch_receive() with a batch receive policy, and subscriptions to a list of topics
or a regex (pyengine.client.pattern's MultiTopicsConsumer over embedded consumers)."""

from __future__ import annotations

import asyncio
import re

import pytest

from pyengine.broker import Broker
from pyengine.client.consumer import ConsumerBatchReceivePolicy
from pyengine.client.errors import AlreadyClosedError
from pyengine.client.message import MessageId
from pyengine.client.pattern import MultiTopicsConsumer
from pyengine.errors import NotAllowedError, PulsarError
from pyengine.transaction.coordinator.metadata_records import V5_COORDINATOR_ID
from tests.broker.helpers import drain
from tests.broker.test_compaction import TOPIC, compact, values

T = "persistent://public/default/parity"


# --- get_last_message_id with read_compacted --------------------------------------------------

async def test_last_message_id_of_read_compacted_readers_and_consumers_is_the_views(tmp_path):
    async with Broker.embedded(tmp_path, sync=False) as broker:
        producer = await broker.create_producer(TOPIC)
        kept = await producer.send(b"a1", key="a")
        await producer.send(b"b1", key="b")
        tombstone = await producer.send(b"", key="b")          # the topic's last: not in the view
        await compact(broker)
        reader = await broker.create_reader(TOPIC, MessageId.earliest, read_compacted=True)
        assert await reader.get_last_message_id() == kept
        got = []
        while await reader.has_message_available():            # ends: nothing waits for b's tombstone
            got.append(await reader.read_next(timeout=2))
        assert values(got) == [("a", b"a1")]
        consumer = await broker.subscribe(TOPIC, "s", initial_position="earliest", read_compacted=True)
        assert await consumer.get_last_message_id() == kept
        plain = await broker.create_reader(TOPIC, MessageId.earliest)
        assert await plain.get_last_message_id() == tombstone
        after = await producer.send(b"a2", key="a")            # after the horizon: the topic's
        assert await reader.get_last_message_id() == after
        assert await reader.has_message_available()
        assert values([await reader.read_next(timeout=2)]) == [("a", b"a2")]
        assert not await reader.has_message_available()


async def test_reader_has_message_available_from_its_start_and_after_a_seek(tmp_path):
    async with Broker.embedded(tmp_path, sync=False) as broker:
        producer = await broker.create_producer(T)
        ids = [await producer.send(f"m{i}".encode()) for i in range(3)]
        assert not await (await broker.create_reader(T, ids[2])).has_message_available()   # after it
        assert await (await broker.create_reader(T, ids[2], start_message_id_inclusive=True)).has_message_available()
        assert not await (await broker.create_reader(T, MessageId.latest)).has_message_available()
        reader = await broker.create_reader(T, MessageId.earliest)
        assert [m.data for m in await drain(reader)] == [b"m0", b"m1", b"m2"]
        assert not await reader.has_message_available()
        await reader.seek(ids[1])
        assert await reader.has_message_available()
        assert (await reader.read_next(timeout=2)).data == b"m2"
        await reader.seek(ids[2])
        assert not await reader.has_message_available()
        with pytest.raises(TypeError, match="start_message_id must be a MessageId"):
            await broker.create_reader(T, (0, 0))
        with pytest.raises(TypeError, match="start_message_id_inclusive must be a bool"):
            await broker.create_reader(T, ids[0], start_message_id_inclusive="no")


# --- batch_receive ------------------------------------------------------------------------------

async def test_batch_receive_by_count_wakes_when_enough_arrive(tmp_path):
    async with Broker.embedded(tmp_path, sync=False) as broker:
        producer = await broker.create_producer(T)
        policy = ConsumerBatchReceivePolicy(max_num_message=3, max_num_bytes=-1, timeout_ms=10_000)
        consumer = await broker.subscribe(T, "s", initial_position="earliest", batch_receive_policy=policy)
        for i in range(7):
            await producer.send(f"m{i}".encode())
        assert [m.data for m in await consumer.batch_receive()] == [b"m0", b"m1", b"m2"]
        assert [m.data for m in await consumer.batch_receive()] == [b"m3", b"m4", b"m5"]
        waiting = asyncio.ensure_future(consumer.batch_receive())     # one queued: not enough
        await asyncio.sleep(0.01)
        assert not waiting.done()
        await producer.send(b"m7")
        await producer.send(b"m8")
        assert [m.data for m in await asyncio.wait_for(waiting, 2)] == [b"m6", b"m7", b"m8"]


async def test_batch_receive_by_bytes_timeout_and_full_queue(tmp_path):
    async with Broker.embedded(tmp_path, sync=False) as broker:
        producer = await broker.create_producer(T)
        by_bytes = await broker.subscribe(T, "bytes", initial_position="earliest", batch_receive_policy=(
            ConsumerBatchReceivePolicy(max_num_message=-1, max_num_bytes=10, timeout_ms=10_000)))
        by_time = await broker.subscribe(T, "time", initial_position="earliest", batch_receive_policy=(
            ConsumerBatchReceivePolicy(max_num_message=100, max_num_bytes=-1, timeout_ms=50)))
        full = await broker.subscribe(T, "full", initial_position="earliest", receiver_queue_size=4,
                                      batch_receive_policy=ConsumerBatchReceivePolicy(100, -1, 0))
        for i in range(6):
            await producer.send(f"msg{i}".encode())                    # 4 bytes each
        assert [m.data for m in await by_bytes.batch_receive()] == [b"msg0", b"msg1"]    # a third: 12 > 10
        assert len(await by_time.batch_receive()) == 6                 # at the timeout, all queued
        assert await by_time.batch_receive() == []                     # none by the timeout
        assert len(await asyncio.wait_for(full.batch_receive(), 2)) == 4      # no timeout: a full queue
        default = await broker.subscribe(T, "default", initial_position="earliest")
        await asyncio.sleep(0.05)
        assert len(await default.batch_receive()) == 6                 # the default policy: 100 ms


async def test_batch_receive_policy_is_checked(tmp_path):
    async with Broker.embedded(tmp_path, sync=False) as broker:
        with pytest.raises(TypeError, match="batch_receive_policy must be a ConsumerBatchReceivePolicy"):
            await broker.subscribe(T, "s", batch_receive_policy={"max_num_message": 3})
        with pytest.raises(TypeError, match="batch_receive_policy must be"):
            await broker.subscribe([T], "s", batch_receive_policy=3)
        assert T not in broker.service.topics                           # refused before attaching


# --- list and pattern subscriptions -----------------------------------------------------------

async def test_subscribe_to_a_list_of_topics(tmp_path):
    a, b = T + "-a", T + "-b"
    async with Broker.embedded(tmp_path, sync=False) as broker:
        consumer = await broker.subscribe([a, b, a], "s", initial_position="earliest")
        assert isinstance(consumer, MultiTopicsConsumer) and consumer.topics == [a, b]
        for topic in (a, b):
            producer = await broker.create_producer(topic)
            await producer.send(b"x")
            await producer.send(b"y")
        got = await drain(consumer)
        assert sorted((m.topic, m.data) for m in got) == [(a, b"x"), (a, b"y"), (b, b"x"), (b, b"y")]
        a_x = next(m for m in got if (m.topic, m.data) == (a, b"x"))
        b_y = next(m for m in got if (m.topic, m.data) == (b, b"y"))
        await consumer.acknowledge(a_x)
        await consumer.acknowledge(b_y.message_id)                      # a received id names its topic
        txn = await broker.new_transaction()
        a_y = next(m for m in got if (m.topic, m.data) == (a, b"y"))
        await consumer.acknowledge(a_y, txn)
        await txn.commit()
        await consumer.redeliver_unacknowledged_messages()
        assert [(m.topic, m.data) for m in await drain(consumer)] == [(b, b"x")]
        await consumer.close()
        assert consumer not in broker._consumers


async def test_subscribe_to_a_pattern_discovers_new_topics(tmp_path):
    first, second, other = T + "-orders-1", T + "-orders-2", T + "-payments"
    async with Broker.embedded(tmp_path, sync=False) as broker:
        await (await broker.create_producer(first)).send(b"1")
        await (await broker.create_producer(other)).send(b"o")
        consumer = await broker.subscribe(re.compile(T + "-orders-.*"), "s", initial_position="earliest",
                                          pattern_auto_discovery_period=0.02)
        assert consumer.topics == [first]
        await (await broker.create_producer(second)).send(b"2")
        for _ in range(100):
            if second in consumer.topics:
                break
            await asyncio.sleep(0.01)
        assert consumer.topics == [first, second]
        assert sorted(m.data for m in await drain(consumer)) == [b"1", b"2"]


async def test_list_and_pattern_subscriptions_refuse_malformed_input(tmp_path):
    async with Broker.embedded(tmp_path, sync=False) as broker:
        with pytest.raises(ValueError, match="at least one topic"):
            await broker.subscribe([], "s")
        with pytest.raises(TypeError, match="a topic name is a string"):
            await broker.subscribe([T, 5], "s")
        with pytest.raises(TypeError, match="a topic name is a string"):
            await broker.subscribe(5, "s")
        with pytest.raises(ValueError, match="scalable"):
            await broker.subscribe([T, "topic://public/default/s"], "s")
        with pytest.raises(ValueError, match="tenant and namespace must be names"):
            await broker.subscribe(re.compile("persistent://public/.*/x"), "s")
        with pytest.raises(ValueError, match="pattern_auto_discovery_period must be > 0"):
            await broker.subscribe(re.compile(T + ".*"), "s", pattern_auto_discovery_period=0)
        with pytest.raises(TypeError, match="pattern_auto_discovery_period must be a number"):
            await broker.subscribe(re.compile(T + ".*"), "s", pattern_auto_discovery_period="1")
        with pytest.raises(NotAllowedError, match="readCompacted only allowed"):
            await broker.subscribe([T + "-a", T + "-b"], "s", consumer_type="shared", read_compacted=True)
        # one topic's refusal fails the whole subscription: the other topic's consumer is closed
        busy = await broker.subscribe(T + "-b", "s")
        with pytest.raises(PulsarError):
            await broker.subscribe([T + "-a", T + "-b"], "s")
        assert broker._consumers == [busy]
        assert not (await broker.service.get_topic(T + "-a")).subscriptions["s"].consumers


# --- receive ------------------------------------------------------------------------------------

async def test_receive_checks_its_timeout_and_ends_when_the_consumer_closes(tmp_path):
    async with Broker.embedded(tmp_path, sync=False) as broker:
        consumer = await broker.subscribe(T, "s")
        with pytest.raises(ValueError, match="timeout must be >= 0"):
            await consumer.receive(timeout=-1)
        with pytest.raises(TimeoutError):
            await consumer.receive(timeout=0.01)
        waiting = asyncio.ensure_future(consumer.receive())
        await asyncio.sleep(0.01)
        await consumer.close()
        with pytest.raises(NotAllowedError, match="closed"):
            await asyncio.wait_for(waiting, 2)


async def test_a_receive_cancelled_once_woken_leaves_its_message_to_the_next(tmp_path):
    """As asyncio.Queue.get (which the embedded consumer's queue was): a receiver woken for a
    message and cancelled before it takes it wakes the next one."""
    async with Broker.embedded(tmp_path, sync=False) as broker:
        producer = await broker.create_producer(T)
        consumer = await broker.subscribe(T, "s")
        first = asyncio.ensure_future(consumer.receive())
        second = asyncio.ensure_future(consumer.receive())
        await asyncio.sleep(0.01)
        deliver = consumer.deliver

        def deliver_then_cancel_the_woken(deliveries):
            deliver(deliveries)
            first.cancel()              # woken, not run yet

        consumer.deliver = deliver_then_cancel_the_woken
        await producer.send(b"m")
        assert (await asyncio.wait_for(second, 2)).data == b"m"
        assert first.cancelled()


# --- the rest of pyengine.client's signatures -------------------------------------------------

async def test_subscribe_checks_its_options_as_the_network_client(tmp_path):
    async with Broker.embedded(tmp_path, sync=False) as broker:
        # a pattern that matches no topic yet subscribes nothing: its options are checked first
        with pytest.raises(ValueError, match="subscription_name must be a non-empty name"):
            await broker.subscribe(re.compile(T + "-none-.*"), "")
        with pytest.raises(ValueError, match="consumer_name must be a non-empty name"):
            await broker.subscribe([T], "s", consumer_name="")
        with pytest.raises(TypeError, match="receiver_queue_size must be an int"):
            await broker.subscribe(T, "s", receiver_queue_size="5")
        with pytest.raises(ValueError, match="priority must be >= 0"):
            await broker.subscribe(T, "s", priority=-1)
        with pytest.raises(ValueError, match="consumer_type must be one of"):
            await broker.subscribe(T, "s", consumer_type="bogus")
        # names in any case, as pyengine.client (and pulsar-client's enums)
        consumer = await broker.subscribe(T, "s", consumer_type="Key_Shared", initial_position="Earliest",
                                          consumer_name="c1")
        assert consumer.consumer_name == "c1"
        assert broker.service.topics[T].subscriptions["s"].sub_type == "key_shared"


async def test_create_producer_initial_sequence_id_and_initial_subscription(tmp_path):
    async with Broker.embedded(tmp_path, sync=False) as broker:
        producer = await broker.create_producer(T, producer_name="p", initial_sequence_id=9,
                                                initial_subscription_name="init")
        assert producer.last_sequence_id == 9
        await producer.send(b"kept")                           # before any consumer
        assert producer.last_sequence_id == 10
        await producer.flush()
        consumer = await broker.subscribe(T, "init")           # "latest", but the subscription exists
        assert [m.data for m in await drain(consumer)] == [b"kept"]
        with pytest.raises(ValueError, match="initial_sequence_id must be >= -1"):
            await broker.create_producer(T, initial_sequence_id=-2)
        with pytest.raises(TypeError, match="initial_sequence_id must be an int"):
            await broker.create_producer(T, initial_sequence_id="1")
        with pytest.raises(ValueError, match="initial_subscription_name must be a non-empty name"):
            await broker.create_producer(T, initial_subscription_name="")
        await producer.close()
        with pytest.raises(NotAllowedError, match="closed"):
            await producer.flush()


async def test_reader_name_and_new_transaction_scalable(tmp_path):
    async with Broker.embedded(tmp_path, sync=False) as broker:
        reader = await broker.create_reader(T, MessageId.earliest, reader_name="r1")
        assert reader.consumer_name == "r1"
        txn = await broker.new_transaction(scalable=True)
        assert txn.txn_id.most_bits == V5_COORDINATOR_ID       # new_transaction(version=5)'s
        await txn.abort()
        with pytest.raises(TypeError, match="scalable must be a bool"):
            await broker.new_transaction(scalable="yes")
        with pytest.raises(ValueError, match="timeout_ms must be >= 1"):
            await broker.new_transaction(timeout_ms=0)
        with pytest.raises(ValueError, match="reader_name must be a non-empty name"):
            await broker.create_reader(T, MessageId.earliest, reader_name="")


async def test_a_pattern_subscription_outlives_a_deleted_topic(tmp_path):
    """The deleted topic's consumer is closed under the MultiTopicsConsumer: an AlreadyClosedError
    for it (as pyengine.client raises), so it drops that topic at the next discovery instead of
    failing (the embedded API's NotAllowedError for a closed consumer still holds)."""
    first, second = T + "-orders-1", T + "-orders-2"
    async with Broker.embedded(tmp_path, sync=False) as broker:
        producers = [await broker.create_producer(topic) for topic in (first, second)]
        consumer = await broker.subscribe(re.compile(T + "-orders-.*"), "s", pattern_auto_discovery_period=0.02)
        assert consumer.topics == [first, second]
        await producers[0].close()
        await broker.service.delete_topic(first)
        for _ in range(100):
            if consumer.topics == [second]:
                break
            await asyncio.sleep(0.01)
        assert consumer.topics == [second]
        await producers[1].send(b"still")
        assert (await consumer.receive(timeout=2)).data == b"still"
        closed = await broker.subscribe(T, "c")
        await closed.close()
        with pytest.raises(NotAllowedError, match="closed"):
            await closed.receive()
        with pytest.raises(AlreadyClosedError):
            await closed.receive()


async def test_a_partitioned_topics_base_name_is_refused_not_made_a_stray_topic(tmp_path):
    """As the broker refuses it over the network (pyengine.client attaches to the partitions)."""
    base = T + "-partitioned"
    async with Broker.embedded(tmp_path, sync=False) as broker:
        await broker.service.policies.create_partitioned_topic(base, 2)
        with pytest.raises(NotAllowedError, match="is a partitioned topic: attach to its partitions"):
            await broker.subscribe(base, "s")
        with pytest.raises(NotAllowedError, match="is a partitioned topic"):
            await broker.create_producer(base)
        with pytest.raises(NotAllowedError, match="is a partitioned topic"):
            await broker.create_reader(base, MessageId.earliest)
        with pytest.raises(NotAllowedError, match="is a partitioned topic"):
            await broker.subscribe(re.compile(base + ".*"), "s")          # its partitions match
        assert base not in broker.service.topics
        consumer = await broker.subscribe([base + "-partition-0", base + "-partition-1"], "s")
        assert consumer.topics == [base + "-partition-0", base + "-partition-1"]


async def test_send_takes_an_ordering_key_as_the_network_client(tmp_path):
    """Producer.send(ordering_key=...) as pyengine.client's (and pulsar-client's): Key_Shared
    routes by it before the partition key; a non-str is refused."""
    topic = "persistent://public/default/embedded-ordering-key"
    async with Broker.embedded(tmp_path) as broker:
        first = await broker.subscribe(topic, "ks", consumer_type="key_shared", receiver_queue_size=100)
        second = await broker.subscribe(topic, "ks", consumer_type="key_shared", receiver_queue_size=100)
        producer = await broker.create_producer(topic)
        txn = await broker.new_transaction(timeout_ms=60_000)
        await producer.send(b"in a txn", key="k-txn", ordering_key="one", txn=txn)
        for i in range(20):
            await producer.send(b"%d" % i, key=f"k-{i}", ordering_key="one")
        await txn.commit()
        with pytest.raises(TypeError, match="ordering_key"):
            await producer.send(b"x", ordering_key=b"bytes")
        got = {}
        for consumer in (first, second):
            got[consumer] = []
            while True:
                try:
                    got[consumer].append(await consumer.receive(timeout=0.3))
                except TimeoutError:
                    break
        receivers = [c for c, messages in got.items() if messages]
        assert len(receivers) == 1                    # one ordering key: one consumer
        messages = got[receivers[0]]
        assert len(messages) == 21 and {m.ordering_key for m in messages} == {b"one"}
