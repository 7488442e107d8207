"""segment:// and topic:// names (PIP-468) and a broker opening a segment topic like a persistent one."""

import pytest
from hypothesis import given, strategies as st

from pyengine.broker import Broker
from pyengine.errors import InvalidTopicNameError, NotAllowedError, TopicTerminatedError
from pyengine.naming import TopicName, format_segment_descriptor, parse_segment_descriptor
from tests.broker.helpers import drain


def test_segment_name_parts():
    name = TopicName.parse("segment://tenant/ns/my-topic/0000-7FFF-1")
    assert str(name) == "segment://tenant/ns/my-topic/0000-7fff-1"       # canonical lowercase
    assert name.is_segment and not name.is_scalable
    assert name.segment_range == (0, 0x7FFF) and name.segment_id == 1
    assert name.segment_descriptor == "0000-7fff-1"
    assert str(name.scalable_topic) == "topic://tenant/ns/my-topic"
    assert name.partition_index == -1


def test_scalable_topic_name_and_segment_factory():
    parent = TopicName.parse("topic://public/default/orders")
    assert parent.is_scalable
    assert str(TopicName.segment(parent, 0x8000, 0xFFFF, 7)) == "segment://public/default/orders/8000-ffff-7"
    with pytest.raises(InvalidTopicNameError):
        TopicName.segment("persistent://public/default/orders", 0, 1, 0)
    with pytest.raises(ValueError):
        TopicName.segment(parent, 2, 1, 0)


@pytest.mark.parametrize("bad", [
    "segment://t/ns/topic",                    # no descriptor
    "segment://t/ns/topic/0000-ffff",          # no id
    "segment://t/ns/topic/000-ffff-0",         # 3 hex digits
    "segment://t/ns/topic/0000-1ffff-0",       # 5 hex digits
    "segment://t/ns/topic/8000-7fff-0",        # start above end
    "segment://t/ns/topic/0000-ffff--1",       # negative id
    "segment://t/ns/topic/0000-ffff-01",       # leading zero
    "segment://t/ns/topic/0000-ffff-x",
    "segment://t/ns/a/b/0000-ffff-0",          # nested topic part
    "segment://t/ns//0000-ffff-0",
    "segment://t/ns/topic/0000-ffff-99999999999999999999",
    "topic://t/ns/a/b",                        # '/' inside a scalable topic name
])
def test_malformed_segment_and_scalable_names_are_refused(bad):
    with pytest.raises(InvalidTopicNameError):
        TopicName.parse(bad)


@pytest.mark.parametrize("bad", ["", "ffff", "0000-ffff-", None, 7, "g000-ffff-0"])
def test_malformed_descriptors(bad):
    with pytest.raises(InvalidTopicNameError):
        parse_segment_descriptor(bad)


@given(st.integers(0, 0xFFFF), st.integers(0, 0xFFFF), st.integers(0, 2**63 - 1))
def test_descriptor_round_trip(a, b, segment_id):
    start, end = min(a, b), max(a, b)
    descriptor = format_segment_descriptor(start, end, segment_id)
    assert parse_segment_descriptor(descriptor) == (start, end, segment_id)
    name = TopicName.parse(f"segment://t/ns/x/{descriptor}")
    assert (name.segment_range, name.segment_id) == ((start, end), segment_id)
    assert TopicName.parse(str(name)) == name


async def test_broker_opens_a_segment_topic_like_a_persistent_one(tmp_path):
    segment = "segment://public/default/orders/0000-ffff-0"
    async with Broker.embedded(tmp_path) as broker:
        producer = await broker.create_producer(segment)
        consumer = await broker.subscribe(segment, "s", initial_position="earliest")
        for i in range(5):
            await producer.send(f"m{i}".encode(), key=f"k{i}")
        assert [m.data for m in await drain(consumer)] == [f"m{i}".encode() for i in range(5)]
        assert broker.service.topic_exists(segment)
        await (await broker.service.get_topic(segment)).terminate()
        with pytest.raises(TopicTerminatedError):
            await producer.send(b"late")
    async with Broker.embedded(tmp_path) as broker:            # durable across a restart, still sealed
        assert segment in broker.service.list_topics("public/default")
        topic = await broker.service.get_topic(segment, create=False)
        assert topic.ledger.terminated_at is not None


async def test_broker_refuses_to_open_a_scalable_topic_as_a_ledger(tmp_path):
    async with Broker.embedded(tmp_path) as broker:
        with pytest.raises(NotAllowedError, match="scalable topic"):
            await broker.create_producer("topic://public/default/orders")
        assert not broker.service.topic_exists("topic://public/default/orders")
