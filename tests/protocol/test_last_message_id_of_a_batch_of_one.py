"""GET_LAST_MESSAGE_ID names the batch index from the entry's metadata, as Apache's ServerCnx:
a batch of one message is index 0 (the client's id of that message is (ledger, entry, 0);
answered -1, the last id compared below it, so `hasMessageAvailable` of a reader started
inclusive at that message said no), a message sent alone is -1."""

from __future__ import annotations

from tests.protocol.test_server_consume import batch_of
from tests.protocol.wire_driver import WireClient, metadata

TOPIC = "persistent://public/default/last-of-one"


async def test_a_batch_of_one_message_is_index_0(client: WireClient) -> None:
    await client.subscribe(TOPIC, "s")
    await client.create_producer(TOPIC, producer_id=1, request_id=1)
    client.send_payload("SEND", metadata(num_messages_in_batch=1), batch_of(1), producer_id=1, sequence_id=0,
                        num_messages=1)
    receipt = await client.expect("SEND_RECEIPT")
    last = await client.request("GET_LAST_MESSAGE_ID", consumer_id=0, request_id=2)
    assert (last.last_message_id.ledgerId, last.last_message_id.entryId) == \
        (receipt.message_id.ledgerId, receipt.message_id.entryId)
    assert last.last_message_id.batch_index == 0


async def test_a_message_sent_alone_has_no_batch_index(client: WireClient) -> None:
    await client.subscribe(TOPIC, "s")
    await client.create_producer(TOPIC, producer_id=1, request_id=1)
    # A SEND that says 3 messages without batch metadata is not a batch.
    await client.publish(1, 0, b"alone", num_messages=3)
    last = await client.request("GET_LAST_MESSAGE_ID", consumer_id=0, request_id=2)
    assert not last.last_message_id.HasField("batch_index")
