"""De-duplication and chunked messages: every chunk of a message carries the message's
sequence id, so only the last chunk is checked and recorded (Apache's broker since #20948).
Before, with de-duplication on, the second chunk was answered as a duplicate of the first and
dropped: the send succeeded and the message never reached a consumer."""

from __future__ import annotations

from pyengine.broker.policies import NamespacePolicies
from pyengine.broker.service import BrokerService
from tests.protocol.wire_driver import U64, BaseCommand, WireClient, metadata

TOPIC = "persistent://public/default/chunked-dedup"


def _send_chunk(client: WireClient, sequence_id: int, chunk_id: int, chunks: int, payload: bytes) -> None:
    meta = metadata("chunker", sequence_id, uuid=f"chunker-{sequence_id}", num_chunks_from_msg=chunks,
                    total_chunk_msg_size=len(payload) * chunks, chunk_id=chunk_id)
    client.send_payload("SEND", meta, payload, producer_id=0, sequence_id=sequence_id, is_chunk=True)


async def test_every_chunk_of_a_message_is_stored_and_a_resent_message_is_dropped(service: BrokerService,
                                                                                 client: WireClient) -> None:
    await service.policies.set_policies("public/default", NamespacePolicies(deduplication_enabled=True))
    service.refresh_policies()
    await client.create_producer(TOPIC, producer_name="chunker")
    for chunk_id in range(3):
        _send_chunk(client, 0, chunk_id, 3, b"part-%d" % chunk_id)
    receipts = [await client.expect("SEND_RECEIPT") for _ in range(3)]
    positions = [(r.message_id.ledgerId, r.message_id.entryId) for r in receipts]
    assert len(set(positions)) == 3 and (U64 - 1, U64 - 1) not in positions, positions
    topic = await service.get_topic(TOPIC)
    assert topic.ledger.number_of_entries == 3

    # The whole message again (a producer resending after a reconnect): its last chunk is the
    # duplicate the broker drops.
    for chunk_id in range(3):
        _send_chunk(client, 0, chunk_id, 3, b"part-%d" % chunk_id)
    again = [await client.expect("SEND_RECEIPT") for _ in range(3)]
    assert (again[-1].message_id.ledgerId, again[-1].message_id.entryId) == (U64 - 1, U64 - 1)

    # A non-chunked message after it is new, and the producer's last sequence id is the message's.
    reply = await client.publish(0, 1, b"plain", producer_name="chunker")
    assert reply.type == BaseCommand.SEND_RECEIPT and reply.send_receipt.message_id.entryId != U64 - 1
    await client.request("CLOSE_PRODUCER", producer_id=0, request_id=1)
    reopened = await client.create_producer(TOPIC, producer_id=1, request_id=2, producer_name="chunker")
    assert reopened.last_sequence_id == 1
