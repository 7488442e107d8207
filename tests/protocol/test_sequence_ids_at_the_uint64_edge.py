"""Sequence ids are uint64 on the wire (Java longs in Apache's broker: the same 64 bits). Any
value a client may send must be answered: a batch whose last id would pass 2^64 - 1, and a
producer name whose last sequence id is 2^63 or more (PRODUCER_SUCCESS.last_sequence_id is an
int64). Before, building those answers raised: the producer's answers stopped for good (its
sends, and the broker's publish buffer, were never released) or every PRODUCER of that name
was answered UnknownError while the producer was left created on the connection."""

from __future__ import annotations

from pyengine.broker.policies import NamespacePolicies
from pyengine.broker.service import BrokerService
from pyengine.protocol import pulsar_api_pb2 as pb
from pyengine.protocol.server import ProtocolServer
from tests.protocol.wire_driver import U64, BaseCommand, WireClient, metadata

TOPIC = "persistent://public/default/uint64-sequence-ids"


async def test_a_batch_ending_past_the_largest_sequence_id_is_answered(server: ProtocolServer,
                                                                       client: WireClient) -> None:
    await client.create_producer(TOPIC)
    client.send_payload("SEND", metadata("p", U64 - 1), b"batch", producer_id=0, sequence_id=U64 - 1, num_messages=2)
    receipt = await client.expect("SEND_RECEIPT")
    assert receipt.sequence_id == U64 - 1
    # The producer's next sends are still answered, and nothing stays in the publish buffer.
    assert (await client.publish(0, 5, b"next")).type == BaseCommand.SEND_RECEIPT
    assert server.publish_buffer_bytes == 0


async def test_a_producer_whose_last_sequence_id_is_above_int64_can_be_created_again(
        service: BrokerService, client: WireClient) -> None:
    await service.policies.set_policies("public/default", NamespacePolicies(deduplication_enabled=True))
    service.refresh_policies()
    await client.create_producer(TOPIC, producer_name="big")
    # (Answered; whether it is stored is the de-duplication's business: the name's last
    # sequence id is now 2^63 as far as the broker knows.)
    answer = await client.publish(0, 1 << 63, b"m", producer_name="big")
    assert answer.type in (BaseCommand.SEND_RECEIPT, BaseCommand.SEND_ERROR), answer
    assert isinstance(await client.request("CLOSE_PRODUCER", producer_id=0, request_id=1), pb.CommandSuccess)
    reopened = await client.create_producer(TOPIC, producer_id=1, request_id=2, producer_name="big")
    assert isinstance(reopened, pb.CommandProducerSuccess), reopened
    # The same 64 bits the client sent, read as the int64 field (as Apache's long).
    assert reopened.last_sequence_id % U64 in (1 << 63, U64 - 1), reopened
