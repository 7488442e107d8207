"""GET_TOPICS_OF_NAMESPACE leaves the broker's system topics out, as Pulsar's
(NamespaceService.getListOfUserTopics filters them with SystemTopicNames.isSystemTopic):
a pattern consumer of `public/default/.*` must not subscribe to topic-policy, transaction
buffer snapshot or pending ack store topics, nor one of `pulsar/system/.*` to the transaction
coordinators' assign topic."""

from __future__ import annotations

from pyengine.broker.policies import TC_ASSIGN_TOPIC
from pyengine.broker.service import BrokerService
from pyengine.protocol import pulsar_api_pb2 as pb
from tests.protocol.wire_driver import WireClient

ALL = pb.CommandGetTopicsOfNamespace.ALL


async def test_system_topics_are_not_listed(service: BrokerService, client: WireClient) -> None:
    stored = ["persistent://public/default/user-topic",
              "persistent://public/default/__change_events",
              "persistent://public/default/__transaction_buffer_snapshot",
              "persistent://public/default/orders-sub__transaction_pending_ack"]
    for producer_id, name in enumerate(stored):
        reply = await client.create_producer(name, producer_id=producer_id, request_id=producer_id)
        assert reply.producer_name, reply
    await service.policies.create_partitioned_topic("persistent://public/default/__change_events-x", 1)

    reply = await client.request("GET_TOPICS_OF_NAMESPACE", request_id=10, namespace="public/default", mode=ALL)
    assert sorted(reply.topics) == ["persistent://public/default/__change_events-x-partition-0",
                                    "persistent://public/default/user-topic"]


async def test_the_coordinators_assign_topic_is_not_listed(client: WireClient) -> None:
    reply = await client.request("GET_TOPICS_OF_NAMESPACE", request_id=1, namespace="pulsar/system", mode=ALL)
    assert not [name for name in reply.topics if name.startswith(TC_ASSIGN_TOPIC)], reply.topics
