"""Discovery commands: partitioned metadata, lookups, topics of a namespace (schemas: test_server_schemas)."""

from __future__ import annotations

from pyengine.broker.policies import TC_ASSIGN_TOPIC
from pyengine.broker.service import BrokerService
from pyengine.protocol import pulsar_api_pb2 as pb
from pyengine.protocol.server import ProtocolServer
from tests.protocol.conftest import NUM_COORDINATORS
from tests.protocol.wire_driver import WireClient

LookupResponse = pb.CommandLookupTopicResponse
MetadataResponse = pb.CommandPartitionedTopicMetadataResponse


async def test_a_plain_topic_has_no_partitions(client: WireClient) -> None:
    reply = await client.request("PARTITIONED_METADATA", topic="persistent://public/default/plain", request_id=1)
    assert reply.request_id == 1
    assert reply.response == MetadataResponse.Success
    assert reply.HasField("response") and reply.partitions == 0


async def test_a_partitioned_topic_says_how_many_partitions(service: BrokerService, client: WireClient) -> None:
    await service.policies.create_partitioned_topic("persistent://public/default/parted", 3)
    reply = await client.request("PARTITIONED_METADATA", topic="persistent://public/default/parted", request_id=7)
    assert (reply.request_id, reply.response, reply.partitions) == (7, MetadataResponse.Success, 3)


async def test_coordinator_discovery_sees_one_partition_per_coordinator(server: ProtocolServer,
                                                                        client: WireClient) -> None:
    reply = await client.request("PARTITIONED_METADATA", topic=TC_ASSIGN_TOPIC, request_id=1)
    assert reply.partitions == NUM_COORDINATORS
    for i in range(NUM_COORDINATORS):
        lookup = await client.request("LOOKUP", topic=f"{TC_ASSIGN_TOPIC}-partition-{i}", request_id=2 + i)
        assert lookup.response == LookupResponse.Connect
        assert lookup.brokerServiceUrl == f"pulsar://127.0.0.1:{server.port}"


async def test_metadata_failures_are_inside_the_response(client: WireClient) -> None:
    reply = await client.request("PARTITIONED_METADATA", topic="persistent://nope/missing/t", request_id=3)
    assert (reply.request_id, reply.response, reply.error) == (3, MetadataResponse.Failed, pb.TopicNotFound)
    assert "nope/missing" in reply.message
    reply = await client.request("PARTITIONED_METADATA", topic="bad://a/b/c", request_id=4)
    assert (reply.response, reply.error) == (MetadataResponse.Failed, pb.InvalidTopicName)


async def test_lookup_answers_the_address_the_client_reached(server: ProtocolServer, client: WireClient) -> None:
    reply = await client.request("LOOKUP", topic="persistent://public/default/t1", request_id=5)
    assert reply.request_id == 5
    assert reply.response == LookupResponse.Connect
    assert reply.brokerServiceUrl == f"pulsar://127.0.0.1:{server.port}"
    assert reply.authoritative
    assert not reply.proxy_through_service_url


async def test_an_advertised_url_overrides_the_local_address(service: BrokerService) -> None:
    server = ProtocolServer(service, "127.0.0.1", 0, advertised_url="pulsar://broker.example:6650")
    await server.start()
    client = await WireClient.connect(server.port)
    try:
        reply = await client.request("LOOKUP", topic="t", request_id=1)
        assert reply.brokerServiceUrl == "pulsar://broker.example:6650"
    finally:
        await client.close()
        await server.stop()


async def test_lookup_failures_are_inside_the_response(service: BrokerService, client: WireClient) -> None:
    reply = await client.request("LOOKUP", topic="persistent://nope/missing/t", request_id=6)
    assert (reply.request_id, reply.response, reply.error) == (6, LookupResponse.Failed, pb.TopicNotFound)
    reply = await client.request("LOOKUP", topic="a/b/c/d/e", request_id=7)
    assert (reply.response, reply.error) == (LookupResponse.Failed, pb.InvalidTopicName)
    await service.policies.create_partitioned_topic("persistent://public/default/two", 2)
    reply = await client.request("LOOKUP", topic="persistent://public/default/two-partition-5", request_id=8)
    assert (reply.response, reply.error) == (LookupResponse.Failed, pb.TopicNotFound)
    reply = await client.request("LOOKUP", topic="persistent://public/default/two-partition-1", request_id=9)
    assert reply.response == LookupResponse.Connect


async def test_the_two_request_id_spaces_may_use_the_same_number(client: WireClient) -> None:
    # The client's lookup counter and its producer/consumer counter both reach 1 at once.
    client.send("LOOKUP", topic="persistent://public/default/same-id", request_id=1)
    client.send("SUBSCRIBE", topic="persistent://public/default/same-id", subscription="s",
                subType=pb.CommandSubscribe.Exclusive, consumer_id=0, request_id=1)
    answers = {}
    for _ in range(2):
        cmd = await client.receive()
        answers[pb.BaseCommand.Type.Name(cmd.type)] = cmd
    assert answers["LOOKUP_RESPONSE"].lookupTopicResponse.request_id == 1
    assert answers["SUCCESS"].success.request_id == 1


async def test_topics_of_a_namespace_list_partitions_and_stored_topics(service: BrokerService,
                                                                       client: WireClient) -> None:
    await service.policies.create_partitioned_topic("persistent://public/default/listed-parted", 2)
    await client.create_producer("persistent://public/default/listed-plain")
    reply = await client.request("GET_TOPICS_OF_NAMESPACE", request_id=3, namespace="public/default")
    assert reply.request_id == 3
    assert set(reply.topics) == {
        "persistent://public/default/listed-plain",
        "persistent://public/default/listed-parted-partition-0",
        "persistent://public/default/listed-parted-partition-1",
    }
    reply = await client.request("GET_TOPICS_OF_NAMESPACE", request_id=4, namespace="public/default",
                                 mode=pb.CommandGetTopicsOfNamespace.NON_PERSISTENT)
    assert list(reply.topics) == []


async def test_topics_of_a_missing_namespace_is_an_error(client: WireClient) -> None:
    reply = await client.request("GET_TOPICS_OF_NAMESPACE", request_id=5, namespace="nope/none")
    assert (reply.request_id, reply.error) == (5, pb.TopicNotFound)
