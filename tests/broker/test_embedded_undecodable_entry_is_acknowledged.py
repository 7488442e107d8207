"""An entry an embedded consumer cannot decode (a malformed batch, which a network producer can
store: the broker does not read batch payloads, as Pulsar's does not) is acknowledged and its
permits given back, as pyengine.client and the Java and C++ clients do. Before, decoding it
raised into the dispatcher: the entry stayed pending at the consumer for good, unseen by the
application and never acknowledged, holding the subscription's backlog."""

from __future__ import annotations

from pyengine.broker import Broker
from pyengine.protocol.pulsar_api_pb2 import MessageMetadata
from pyengine.storage.entry import headers_and_payload

T = "persistent://public/default/undecodable"


async def test_an_undecodable_batch_is_acknowledged_and_the_next_message_delivered(tmp_path):
    async with Broker.embedded(tmp_path, sync=False) as broker:
        consumer = await broker.subscribe(T, "s", consumer_type="shared", initial_position="earliest",
                                          receiver_queue_size=10)
        producer = await broker.create_producer(T, producer_name="p")
        topic = broker.service.topics[T]
        metadata = MessageMetadata(producer_name="p", sequence_id=0, publish_time=1, num_messages_in_batch=3)
        malformed = headers_and_payload(metadata.SerializeToString(), b"\xff\xff\xff\xff not a batch")
        await topic.publish(producer._producer, malformed, sequence_id=0, num_messages=3)
        await producer.send(b"good", sequence_id=1)
        message = await consumer.receive(timeout=5)
        assert message.data == b"good"
        await consumer.acknowledge(message)
        subscription = topic.subscriptions["s"]
        assert subscription.backlog() == 0
        assert not subscription.consumers[0].pending
