"""Auto topic creation settings (pyengine.broker.policies.AutoTopicCreation, BrokerConfig's
fields) and which topics the broker creates on first use (BrokerService.auto_creates)."""

from __future__ import annotations

import dataclasses

import pytest

from pyengine.broker.policies import AutoTopicCreation
from pyengine.broker.service import BrokerConfig, BrokerService
from pyengine.naming import TopicName


@pytest.mark.parametrize("value", [
    AutoTopicCreation(), AutoTopicCreation(False), AutoTopicCreation(False, "sharded", -3),
    AutoTopicCreation(True, "partitioned", 1), AutoTopicCreation(True, "non-partitioned"),
])
def test_valid_settings_round_trip_through_json(value):
    assert AutoTopicCreation.from_json(value.to_json()) == value


@pytest.mark.parametrize(("value", "partitions"), [
    (AutoTopicCreation(), 0), (AutoTopicCreation(True, "partitioned", 5), 5),
    (AutoTopicCreation(False, "partitioned", 5), 0),
])
def test_the_partitions_a_topic_is_created_with(value, partitions):
    assert value.partitions == partitions


@pytest.mark.parametrize("fields", [
    {"allowed": 1}, {"allowed": None}, {"topic_type": "PARTITIONED"}, {"topic_type": None},
    {"topic_type": "partitioned"}, {"topic_type": "partitioned", "default_num_partitions": 0},
    {"topic_type": "partitioned", "default_num_partitions": True},
    {"topic_type": "partitioned", "default_num_partitions": 2.0},
    {"default_num_partitions": 3}, {"allowed": False, "default_num_partitions": "3"},
])
def test_invalid_settings_are_refused(fields):
    with pytest.raises(ValueError):
        AutoTopicCreation(**fields)


@pytest.mark.parametrize("data", [None, [], "x", {}, {"allowAutoTopicCreation": True, "extra": 1},
                                  {"topicType": "partitioned", "defaultNumPartitions": 2}])
def test_malformed_json_is_refused(data):
    with pytest.raises(ValueError):
        AutoTopicCreation.from_json(data)


@pytest.mark.parametrize("fields", [
    {"allow_auto_topic_creation": "false"}, {"allow_auto_topic_creation_type": "sharded"},
    {"allow_auto_topic_creation": False, "allow_auto_topic_creation_type": "sharded"},
    {"default_num_partitions": 0}, {"default_num_partitions": "2"}, {"default_num_partitions": True},
])
def test_broker_config_refuses_invalid_settings(tmp_path, fields):
    with pytest.raises((TypeError, ValueError)):
        BrokerConfig(data_dir=tmp_path, **fields)


def test_broker_config_makes_the_default_setting(tmp_path):
    assert BrokerConfig(data_dir=tmp_path).auto_topic_creation() == AutoTopicCreation(True, "non-partitioned", None)
    config = BrokerConfig(data_dir=tmp_path, allow_auto_topic_creation_type="partitioned", default_num_partitions=3)
    assert config.auto_topic_creation() == AutoTopicCreation(True, "partitioned", 3)


async def test_which_topics_are_created_on_first_use_where_creation_is_off(tmp_path):
    service = BrokerService(BrokerConfig(data_dir=tmp_path, sync=False, num_coordinators=1,
                                         allow_auto_topic_creation=False))
    await service.start()
    try:
        await service.policies.create_partitioned_topic("persistent://public/default/p", 2)
        names = {"persistent://public/default/plain": False,
                 "persistent://public/default/p-partition-1": True,        # part of a created topic
                 "persistent://public/default/p-partition-2": False,       # beyond its partitions
                 "persistent://public/default/q-partition-0": False,       # of no partitioned topic
                 "persistent://pulsar/system/anything": True,              # the broker's own
                 "segment://public/default/s/0000-ffff-0": True}           # made by its controller
        assert {name: service.auto_creates(TopicName.parse(name)) for name in names} == names
        stored = service.policies.policies("public/default")
        await service.policies.set_policies("public/default", dataclasses.replace(
            stored, auto_topic_creation_override={"allowAutoTopicCreation": True, "topicType": "non-partitioned"}))
        assert service.auto_creates(TopicName.parse("persistent://public/default/plain"))
    finally:
        await service.close()
