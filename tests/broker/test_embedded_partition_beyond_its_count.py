"""The embedding API refuses a partition beyond its partitioned topic's count, as the wire does
(`lookup.resolve_topic`: TopicNotFoundError, as Pulsar's broker finds no such topic). It created
it instead: a stray topic named like a partition that no partitioned-topic client reads."""

from __future__ import annotations

import pytest

from pyengine.broker import Broker
from pyengine.client.message import MessageId
from pyengine.errors import TopicNotFoundError

PT = "persistent://public/default/two-partitions"


@pytest.mark.parametrize("make", ["producer", "consumer", "reader"])
async def test_a_partition_beyond_the_count_is_refused_and_not_created(tmp_path, make):
    async with Broker.embedded(tmp_path, sync=False) as broker:
        await broker.service.policies.create_partitioned_topic(PT, 2)
        beyond = f"{PT}-partition-2"
        with pytest.raises(TopicNotFoundError, match="has 2 partitions, there is no partition 2"):
            if make == "producer":
                await broker.create_producer(beyond)
            elif make == "consumer":
                await broker.subscribe(beyond, "s")
            else:
                await broker.create_reader(beyond, MessageId.earliest)
        assert not broker.service.topic_exists(beyond)
        producer = await broker.create_producer(f"{PT}-partition-1")       # within the count: fine
        await producer.send(b"m")
