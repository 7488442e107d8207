"""A reader disconnected by its seek has its moved subscription kept for its return; if the
topic is deleted and created again meanwhile, the kept subscription went with the old topic:
the reader that comes back reads the new topic (it was given the old one's subscription,
reading the deleted ledger, and nothing published to the new topic ever reached it)."""

from __future__ import annotations

from pyengine.broker.service import BrokerService
from tests.protocol.wire_driver import WireClient

TOPIC = "persistent://public/default/seeked-then-deleted"
LATEST = {"ledgerId": (1 << 63) - 1, "entryId": (1 << 63) - 1}


async def test_a_reader_back_after_its_topic_was_deleted_reads_the_new_topic(service: BrokerService,
                                                                             client: WireClient) -> None:
    await client.create_producer(TOPIC, producer_id=1, request_id=1)
    for i, at in enumerate((1000, 2000)):
        await client.publish(1, i, b"old%d" % i, meta_fields={"publish_time": at})
    await client.subscribe(TOPIC, "reader-x", request_id=2, durable=False, start_message_id=LATEST)
    client.send("SEEK", consumer_id=0, request_id=3, message_publish_time=1500)
    await client.expect("CLOSE_CONSUMER")
    await client.expect("SUCCESS")
    client.send("CLOSE_PRODUCER", producer_id=1, request_id=4)
    await client.expect("SUCCESS")
    old = service.topics[TOPIC]
    await service.delete_topic(TOPIC)

    # The reader comes back (as after a seek by time: no start position) to a new topic.
    assert (await client.subscribe(TOPIC, "reader-x", request_id=5, durable=False, earliest=False,
                                   permits=10)).request_id == 5
    assert service.topics[TOPIC] is not old
    await client.create_producer(TOPIC, producer_id=2, request_id=6)
    await client.publish(2, 0, b"fresh", producer_name="p2")
    _, data = await client.message(timeout=2)
    assert data.endswith(b"fresh")
