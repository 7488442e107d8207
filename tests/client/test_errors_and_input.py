"""Broker errors as pyengine.errors classes, timeouts, and malformed input to every public call."""

import asyncio

import pulsar
import pytest

import pyengine.client
from pyengine import errors
from pyengine.client import AlreadyClosedError, Client, MessageId, MessageTooBigError
from pyengine.client import errors as client_errors
from pyengine.client.consumer import ConsumerOptions
from pyengine.errors import ConsumerBusyError, InvalidTopicNameError, TopicNotFoundError
from pyengine.protocol import pulsar_api_pb2 as pb
from pyengine.protocol.commands import base_command

from core_ext.frames import encode_command

TOPIC = "persistent://public/default/errors"


def _error_classes(module) -> dict[str, type]:
    return {name: value for name, value in vars(module).items()
            if isinstance(value, type) and issubclass(value, errors.PulsarError)}


def test_every_error_class_is_importable_from_pyengine_client():
    from pyengine.client import InvalidTxnStatusError, TransactionConflictError, TransactionNotFoundError

    assert (InvalidTxnStatusError, TransactionConflictError, TransactionNotFoundError) == (
        errors.InvalidTxnStatusError, errors.TransactionConflictError, errors.TransactionNotFoundError)
    exported = {}
    exec("from pyengine.client import *", exported)          # what __all__ promises
    every = {**_error_classes(errors), **_error_classes(client_errors)}
    assert len(every) > 25
    for name, cls in every.items():
        assert getattr(pyengine.client, name) is cls, name   # the same class, not a copy
        assert exported.get(name) is cls, f"{name} missing from pyengine.client.__all__"


async def test_a_topic_in_a_missing_namespace_is_not_found_at_once(client):
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(TopicNotFoundError):
        await client.create_producer("persistent://nobody/nowhere/t")
    with pytest.raises(TopicNotFoundError):
        await client.subscribe("persistent://nobody/nowhere/t", "s")
    assert loop.time() - started < 2


async def test_a_second_exclusive_consumer_is_busy(client):
    await client.subscribe(TOPIC, "only")
    with pytest.raises(ConsumerBusyError):
        await client.subscribe(TOPIC, "only")


async def test_no_broker_means_a_timeout_at_the_operation_timeout(unused_tcp_port):
    async with Client(f"pulsar://127.0.0.1:{unused_tcp_port}", operation_timeout_seconds=0.5) as client:
        loop = asyncio.get_running_loop()
        started = loop.time()
        with pytest.raises(TimeoutError):
            await client.create_producer(TOPIC)
        assert loop.time() - started < 2


async def test_a_broker_that_does_not_answer_times_out_the_request():
    """A broker that completes the handshake and then stays silent."""
    class Silent(asyncio.Protocol):
        def connection_made(self, transport):
            connected = base_command(pb.BaseCommand.CONNECTED, server_version="silent", protocol_version=20)
            transport.write(encode_command(connected.SerializeToString()))

    server = await asyncio.get_running_loop().create_server(Silent, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        async with Client(f"pulsar://127.0.0.1:{port}", operation_timeout_seconds=0.3) as client:
            with pytest.raises(TimeoutError):
                await client.get_topic_partitions(TOPIC)
            with pytest.raises(TimeoutError):
                await client.new_transaction()
    finally:
        server.close()
        await server.wait_closed()


async def test_a_message_above_the_broker_limit_is_refused_locally(client):
    producer = await client.create_producer(TOPIC)
    with pytest.raises(MessageTooBigError):
        await producer.send(b"x" * (5 * 1024 * 1024 + 1))
    assert (await producer.send(b"fine")).entry_id >= 0


async def test_closed_objects_refuse_use(broker):
    client = Client(broker.url)
    producer = await client.create_producer(TOPIC)
    consumer = await client.subscribe(TOPIC, "closed")
    await producer.close()
    with pytest.raises(AlreadyClosedError):
        await producer.send(b"x")
    await consumer.close()
    with pytest.raises(AlreadyClosedError):
        await consumer.receive(timeout=1)
    await client.close()
    with pytest.raises(AlreadyClosedError):
        await client.create_producer(TOPIC)
    await client.close()                          # twice is fine


async def test_a_receive_waiting_when_the_consumer_closes_is_woken(client):
    consumer = await client.subscribe(TOPIC, "waiting")
    waiting = asyncio.ensure_future(consumer.receive())
    await asyncio.sleep(0.05)
    await consumer.close()
    with pytest.raises(AlreadyClosedError):
        await waiting


@pytest.mark.parametrize("url, kwargs, error", [
    ("http://127.0.0.1:6650", {}, ValueError),
    ("pulsar://127.0.0.1:nope", {}, ValueError),
    (6650, {}, TypeError),
    ("pulsar://127.0.0.1:6650", {"operation_timeout_seconds": -1}, ValueError),
    ("pulsar://127.0.0.1:6650", {"operation_timeout_seconds": "30"}, TypeError),
    ("pulsar://127.0.0.1:6650", {"connection_timeout_ms": 0}, ValueError),
    ("pulsar://127.0.0.1:6650", {"keep_alive_interval_seconds": float("nan")}, ValueError),
])
def test_malformed_client_arguments(url, kwargs, error):
    with pytest.raises(error):
        Client(url, **kwargs)


@pytest.mark.parametrize("topic, kwargs, error", [
    (123, {}, TypeError),
    ("a/b", {}, InvalidTopicNameError),
    ("bogus://public/default/t", {}, InvalidTopicNameError),
    ("persistent://public/cluster/default/t", {}, InvalidTopicNameError),        # a V1 name
    (TOPIC, {"producer_name": ""}, ValueError),
    (TOPIC, {"producer_name": 5}, TypeError),
    (TOPIC, {"batching_enabled": "yes"}, TypeError),
    (TOPIC, {"batching_max_messages": 0}, ValueError),
    (TOPIC, {"batching_max_publish_delay_ms": -1}, ValueError),
    (TOPIC, {"max_pending_messages": 0}, ValueError),
    (TOPIC, {"send_timeout_ms": -5}, ValueError),
    (TOPIC, {"initial_sequence_id": "1"}, TypeError),
])
async def test_malformed_producer_arguments(client, topic, kwargs, error):
    with pytest.raises(error):
        await client.create_producer(topic, **kwargs)


@pytest.mark.parametrize("topic, subscription, kwargs, error", [
    (TOPIC, None, {}, TypeError),
    (TOPIC, "", {}, ValueError),
    (TOPIC, " padded", {}, ValueError),
    ("", "s", {}, InvalidTopicNameError),
    (TOPIC, "s", {"consumer_type": "bogus"}, ValueError),
    (TOPIC, "s", {"consumer_type": 1}, TypeError),
    (TOPIC, "s", {"initial_position": "middle"}, ValueError),
    (TOPIC, "s", {"receiver_queue_size": 0}, ValueError),
    (TOPIC, "s", {"receiver_queue_size": 1.5}, TypeError),
    (TOPIC, "s", {"priority": -1}, ValueError),
    (TOPIC, "s", {"negative_ack_redelivery_delay_ms": -1}, ValueError),
    (TOPIC, "s", {"batch_index_ack_enabled": 1}, TypeError),
])
async def test_malformed_subscribe_arguments(client, topic, subscription, kwargs, error):
    with pytest.raises(error):
        await client.subscribe(topic, subscription, **kwargs)


def test_subscription_options_are_named_in_any_case_or_with_pulsar_client_enums():
    # What a pulsar-client user writes: its enums, or their names as they spell them.
    for consumer_type, expected in [("Shared", "shared"), ("KEY_SHARED", "key_shared"), ("KeyShared", "key_shared"),
                                    ("key-shared", "key_shared"), (pulsar.ConsumerType.KeyShared, "key_shared"),
                                    (pulsar.ConsumerType.Failover, "failover")]:
        assert ConsumerOptions("s", consumer_type).consumer_type == expected
    for position, expected in [("Earliest", "earliest"), ("LATEST", "latest"),
                               (pulsar.InitialPosition.Earliest, "earliest"), (pulsar.InitialPosition.Latest, "latest")]:
        assert ConsumerOptions("s", initial_position=position).initial_position == expected
    for bad, error in [(pulsar.InitialPosition.Earliest, TypeError), ("Key_Shared_", ValueError)]:
        with pytest.raises(error):
            ConsumerOptions("s", bad)          # an InitialPosition is not a consumer type
    with pytest.raises(TypeError):
        ConsumerOptions("s", initial_position=pulsar.ConsumerType.Shared)


async def test_an_official_client_enum_subscribes_as_its_name_says(client):
    producer = await client.create_producer(TOPIC)
    await producer.send(b"first")
    consumer = await client.subscribe(TOPIC, "enum-sub", consumer_type=pulsar.ConsumerType.Shared,
                                      initial_position=pulsar.InitialPosition.Earliest)
    assert (await consumer.receive(timeout=10)).data == b"first"
    await consumer.close()
    await producer.close()


async def test_malformed_reader_and_transaction_arguments(client):
    with pytest.raises(TypeError):
        await client.create_reader(TOPIC, "earliest")
    with pytest.raises(TypeError):
        await client.create_reader(TOPIC, MessageId.earliest, start_message_id_inclusive="no")
    with pytest.raises(ValueError):
        await client.new_transaction(timeout_ms=0)
    with pytest.raises(TypeError):
        await client.new_transaction(timeout_ms="60s")


async def test_an_event_time_past_uint64_is_refused_before_the_send(client):
    """MessageMetadata.event_time is a uint64: refused up front, naming the field, with no
    sequence id taken (before, protobuf refused it from inside the producer)."""
    producer = await client.create_producer(TOPIC)
    for event_time in (1 << 64, 1 << 70):
        with pytest.raises(ValueError, match="event_time"):
            await producer.send(b"x", event_time=event_time)
    await producer.send(b"x", event_time=(1 << 64) - 1)
    assert producer.last_sequence_id == 0


async def test_malformed_send_arguments(client):
    producer = await client.create_producer(TOPIC)
    for kwargs, error in [({}, None), ({"key": 5}, TypeError), ({"properties": {"a": 1}}, TypeError),
                          ({"properties": ["a"]}, TypeError), ({"event_time": -1}, ValueError),
                          ({"sequence_id": -1}, ValueError), ({"txn": "txn"}, TypeError)]:
        if error is None:
            continue
        with pytest.raises(error):
            await producer.send(b"x", **kwargs)
        with pytest.raises(error):
            producer.send_async(b"x", **kwargs)
    for data in ("text", None, 5, [1]):
        with pytest.raises(TypeError):
            await producer.send(data)
    with pytest.raises(TypeError):
        producer.send_async(b"x", callback="not callable")
    assert (await producer.send(bytearray(b"ok"))).entry_id >= 0


async def test_malformed_consumer_calls(client, broker):
    await broker.service.policies.create_partitioned_topic("persistent://public/default/two", 2)
    consumer = await client.subscribe(TOPIC, "calls")
    for bad in ("message", 5, None, object()):
        with pytest.raises(TypeError):
            await consumer.acknowledge(bad)
        with pytest.raises(TypeError):
            await consumer.acknowledge_cumulative(bad)
        with pytest.raises(TypeError):
            await consumer.negative_acknowledge(bad)
    with pytest.raises(TypeError):
        await consumer.acknowledge(MessageId(1, 1), txn="txn")
    for bad in ("earliest", True, 1.5):
        with pytest.raises(TypeError):
            await consumer.seek(bad)
    with pytest.raises(ValueError):
        await consumer.seek(-5)
    for bad in (-1, float("nan")):
        with pytest.raises(ValueError):
            await consumer.receive(timeout=bad)
    with pytest.raises(TypeError):
        await consumer.receive(timeout="1")
    parted = await client.subscribe("persistent://public/default/two", "calls")
    with pytest.raises(ValueError):
        await parted.acknowledge(MessageId(1, 1, partition=7))
    with pytest.raises(ValueError):
        await parted.acknowledge(MessageId(1, 1))      # no partition: not a message of this topic
