"""Auto topic creation on the wire (Pulsar's allowAutoTopicCreation, allowAutoTopicCreationType,
defaultNumPartitions and a namespace's autoTopicCreationOverride): producers and consumers of a
topic that does not exist, and the partitioned metadata a client looks up first."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from pyengine.broker.policies import AutoTopicCreation
from pyengine.broker.service import BrokerService
from pyengine.client import Client
from pyengine.protocol import pulsar_api_pb2 as pb
from pyengine.protocol.server import ProtocolServer
from tests.protocol.wire_driver import WireClient

MetadataResponse = pb.CommandPartitionedTopicMetadataResponse
TOPIC = "persistent://public/default/new-topic"


def configure(service: BrokerService, **settings) -> None:
    """The broker's setting (as BrokerConfig's fields would make it at start)."""
    service.policies.auto_topic_creation_default = dataclasses.replace(
        service.policies.auto_topic_creation_default, **settings)


async def override(service: BrokerService, namespace: str, value: AutoTopicCreation | None) -> None:
    policies = service.policies
    await policies.set_policies(namespace, dataclasses.replace(
        policies.policies(namespace), auto_topic_creation_override=None if value is None else value.to_json()))


async def test_a_producer_of_a_missing_topic_is_refused_where_creation_is_off(service: BrokerService,
                                                                              client: WireClient) -> None:
    configure(service, allowed=False)
    reply = await client.create_producer(TOPIC, request_id=1)
    assert (reply.request_id, reply.error) == (1, pb.TopicNotFound)
    assert not service.topic_exists(TOPIC)


async def test_a_consumer_of_a_missing_topic_is_refused_even_when_it_forces_creation(
        service: BrokerService, client: WireClient) -> None:
    configure(service, allowed=False)
    reply = await client.subscribe(TOPIC, "sub", request_id=1, force_topic_creation=True)
    assert (reply.request_id, reply.error) == (1, pb.TopicNotFound)
    assert not service.topic_exists(TOPIC)


async def test_existing_topics_are_served_where_creation_is_off(service: BrokerService, client: WireClient) -> None:
    await service.get_topic(TOPIC)
    await service.policies.create_partitioned_topic("persistent://public/default/parted", 2)
    configure(service, allowed=False)
    assert (await client.create_producer(TOPIC, request_id=1)).producer_name
    assert (await client.subscribe(TOPIC, "sub", consumer_id=1, request_id=2)).request_id == 2
    # A partition of a partitioned topic is part of a topic created on purpose: made on first use.
    partition = "persistent://public/default/parted-partition-1"
    assert (await client.create_producer(partition, producer_id=2, request_id=3)).producer_name
    assert service.topic_exists(partition)


async def test_the_namespace_override_wins_over_the_broker_both_ways(service: BrokerService,
                                                                     client: WireClient) -> None:
    await service.policies.create_namespace("public/open")
    await override(service, "public/default", AutoTopicCreation(allowed=False))
    refused = await client.create_producer(TOPIC, request_id=1)
    assert refused.error == pb.TopicNotFound
    assert (await client.create_producer("persistent://public/open/t", producer_id=1, request_id=2)).producer_name

    configure(service, allowed=False)
    await override(service, "public/default", AutoTopicCreation(allowed=True))
    assert (await client.create_producer(TOPIC, producer_id=2, request_id=3)).producer_name
    refused = await client.create_producer("persistent://public/open/t2", producer_id=3, request_id=4)
    assert refused.error == pb.TopicNotFound

    await override(service, "public/default", None)          # removed: the broker's setting again
    refused = await client.create_producer("persistent://public/default/t3", producer_id=4, request_id=5)
    assert refused.error == pb.TopicNotFound


async def test_partitioned_metadata_creates_a_partitioned_topic_where_that_is_the_type(
        service: BrokerService, client: WireClient) -> None:
    configure(service, topic_type="partitioned", default_num_partitions=3)
    reply = await client.request("PARTITIONED_METADATA", topic=TOPIC, request_id=1)
    assert (reply.request_id, reply.response, reply.partitions) == (1, MetadataResponse.Success, 3)
    assert service.policies.partitions(TOPIC) == 3
    again = await client.request("PARTITIONED_METADATA", topic=TOPIC, request_id=2)
    assert again.partitions == 3
    assert (await client.create_producer(f"{TOPIC}-partition-2", request_id=3)).producer_name


@pytest.mark.parametrize("name", ["persistent://public/default/plain-already",
                                  "persistent://public/default/x-partition-0",
                                  "persistent://pulsar/system/own-topic"])
async def test_partitioned_metadata_leaves_plain_topics_partitions_and_system_topics_alone(
        service: BrokerService, client: WireClient, name: str) -> None:
    await service.get_topic("persistent://public/default/plain-already")
    configure(service, topic_type="partitioned", default_num_partitions=3)
    reply = await client.request("PARTITIONED_METADATA", topic=name, request_id=1)
    assert (reply.response, reply.partitions) == (MetadataResponse.Success, 0)
    assert not service.policies.partitions(name)


async def test_partitioned_metadata_creates_nothing_where_creation_is_off(service: BrokerService,
                                                                          client: WireClient) -> None:
    configure(service, allowed=False, topic_type="partitioned", default_num_partitions=3)
    reply = await client.request("PARTITIONED_METADATA", topic=TOPIC, request_id=1)
    assert (reply.response, reply.partitions) == (MetadataResponse.Success, 0)
    assert not service.policies.partitions(TOPIC)


async def test_concurrent_lookups_create_the_partitioned_topic_once(service: BrokerService,
                                                                    server: ProtocolServer, connect) -> None:
    configure(service, topic_type="partitioned", default_num_partitions=4)
    clients = [await connect(server.port) for _ in range(5)]
    replies = await asyncio.gather(*(c.request("PARTITIONED_METADATA", topic=TOPIC, request_id=i)
                                     for i, c in enumerate(clients)))
    assert [(r.response, r.partitions) for r in replies] == [(MetadataResponse.Success, 4)] * 5


async def test_a_producer_creating_the_plain_topic_meanwhile_wins_over_the_lookup(
        service: BrokerService, client: WireClient, connect, server: ProtocolServer) -> None:
    """A topic created as non-partitioned by a producer (e.g. an old client that does not look
    the metadata up) while the lookup waits for its turn is not made partitioned too: a plain
    and a partitioned topic of one name would both exist."""
    configure(service, topic_type="partitioned", default_num_partitions=2)
    loading = asyncio.get_running_loop().create_future()
    service._loading[TOPIC] = loading            # a producer's load of the plain topic under way
    other = await connect(server.port)
    other.send("PARTITIONED_METADATA", topic=TOPIC, request_id=1)
    await asyncio.sleep(0.05)
    del service._loading[TOPIC]
    await service.get_topic(TOPIC)
    loading.set_result(None)
    reply = await other.receive()
    assert (reply.partitionMetadataResponse.response, reply.partitionMetadataResponse.partitions) == (
        MetadataResponse.Success, 0)
    assert not service.policies.partitions(TOPIC)


async def test_our_client_produces_to_an_auto_created_partitioned_topic(service: BrokerService,
                                                                        server: ProtocolServer) -> None:
    configure(service, topic_type="partitioned", default_num_partitions=3)
    async with Client(f"pulsar://127.0.0.1:{server.port}", operation_timeout_seconds=10) as network_client:
        producer = await network_client.create_producer(TOPIC)
        for i in range(12):
            await producer.send(f"m{i}".encode(), key=f"k{i}")
        await producer.close()
    assert service.policies.partitions(TOPIC) == 3
    stored = 0
    for index in range(3):
        topic = await service.get_topic(f"{TOPIC}-partition-{index}", create=False)
        stored += topic.ledger.number_of_entries
    assert stored == 12
