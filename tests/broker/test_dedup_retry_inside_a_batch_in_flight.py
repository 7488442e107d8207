"""A send whose sequence id is above the highest stored but not above the highest accepted (a
message of a batch still being written) cannot be told a duplicate or not yet: if the batch
fails it was never stored. Apache's MessageDeduplication.isDuplicate answers
MessageDupStatus.Unknown and PersistentTopic.publishMessage completes the send with
MessageDupUnknownException, which the producer answers as a SEND_ERROR (PersistenceError): the
client resends later. It must not be answered as stored."""

import asyncio

import pytest

from core_ext.batch import build_batch
from pyengine.broker import Broker
from pyengine.broker.dedup import MessageDupUnknownError
from pyengine.broker.embedded import MessageId
from pyengine.broker.policies import NamespacePolicies
from pyengine.broker.service import BrokerConfig, BrokerService
from pyengine.errors import PersistenceError
from pyengine.protocol import pulsar_api_pb2 as pb
from pyengine.protocol.commands import message_metadata
from pyengine.protocol.pulsar_api_pb2 import SingleMessageMetadata
from pyengine.protocol.server import ProtocolServer
from pyengine.storage.entry import headers_and_payload
from pyengine.storage.errors import StorageError
from tests.broker.helpers import GatedWriter, drain
from tests.protocol.wire_driver import U64, WireClient, metadata

T = "persistent://public/default/dedup-unknown"


def _batch(producer_name: str, first: int, count: int) -> bytes:
    singles = [(SingleMessageMetadata(payload_size=2, sequence_id=first + i).SerializeToString(), b"b%d" % i)
               for i in range(count)]
    meta = message_metadata(producer_name, first, 1, num_messages_in_batch=count,
                            highest_sequence_id=first + count - 1).SerializeToString()
    return headers_and_payload(meta, build_batch(singles))


async def test_a_retry_inside_a_batch_in_flight_fails_retriably_then_is_a_duplicate(tmp_path):
    async with Broker.embedded(tmp_path, deduplication_enabled=True) as broker:
        producer = await broker.create_producer(T, producer_name="p")
        topic = broker.service.topics[T]
        gate = GatedWriter(broker.service.env)
        batch = topic.publish(producer._producer, _batch("p", 0, 5), sequence_id=0, num_messages=5,
                              highest_sequence_id=4)
        await gate.next_commit()                    # the batch's commit is being written
        with pytest.raises(MessageDupUnknownError) as unknown:
            await producer.send(b"b2", sequence_id=2)
        assert isinstance(unknown.value, PersistenceError)      # what the wire answers
        # The very batch again waits for it and gets its answer.
        again = topic.publish(producer._producer, _batch("p", 0, 5), sequence_id=0, num_messages=5,
                              highest_sequence_id=4)
        gate.open()
        position = await batch
        assert await again == position
        # Settled: the retry is now known to be a duplicate.
        assert await producer.send(b"b2", sequence_id=2) == MessageId(-1, -1)
        assert topic.ledger.number_of_entries == 1


async def test_a_retry_answered_unknown_is_stored_when_the_batch_failed(tmp_path):
    async with Broker.embedded(tmp_path, deduplication_enabled=True) as broker:
        producer = await broker.create_producer(T, producer_name="p")
        topic = broker.service.topics[T]
        gate = GatedWriter(broker.service.env)
        batch = topic.publish(producer._producer, _batch("p", 0, 3), sequence_id=0, num_messages=3,
                              highest_sequence_id=2)
        await gate.next_commit()
        with pytest.raises(MessageDupUnknownError):
            await producer.send(b"b1", sequence_id=1)
        gate.let_through(StorageError("the disk failed"))
        with pytest.raises(StorageError):
            await batch
        gate.open()
        # The client resends what was not acknowledged: stored now, once.
        for i in range(3):
            assert (await producer.send(b"b%d" % i, sequence_id=i)).entry_id >= 0
        consumer = await broker.subscribe(T, "s", initial_position="earliest")
        assert [m.data for m in await drain(consumer)] == [b"b0", b"b1", b"b2"]


async def test_over_the_wire_a_retry_inside_a_batch_in_flight_is_a_persistence_send_error(tmp_path):
    service = BrokerService(BrokerConfig(data_dir=tmp_path, sync=False, num_coordinators=1))
    await service.start()
    server = ProtocolServer(service, "127.0.0.1", 0, liveness_timeout=5)
    await server.start()
    client = await WireClient.connect(server.port)
    try:
        await service.policies.set_policies("public/default", NamespacePolicies(deduplication_enabled=True))
        service.refresh_policies()
        await client.create_producer(T, producer_name="w")
        gate = GatedWriter(service.env)
        singles = [(SingleMessageMetadata(payload_size=2, sequence_id=i).SerializeToString(), b"w%d" % i)
                   for i in range(5)]
        client.send_payload("SEND", metadata("w", 0, num_messages_in_batch=5, highest_sequence_id=4),
                            build_batch(singles), producer_id=0, sequence_id=0, num_messages=5,
                            highest_sequence_id=4)
        await gate.next_commit()
        client.send_payload("SEND", metadata("w", 3), b"w3", producer_id=0, sequence_id=3)
        await asyncio.sleep(0.05)
        gate.open()
        receipt = await client.expect("SEND_RECEIPT")
        assert (receipt.sequence_id, receipt.highest_sequence_id) == (0, 4)
        error = await client.expect("SEND_ERROR")
        assert (error.sequence_id, error.error) == (3, pb.PersistenceError)
        # Resent once the batch is settled: a duplicate, answered as one.
        again = await client.publish(0, 3, b"w3", producer_name="w")
        assert again.send_receipt.sequence_id == 3
        assert (again.send_receipt.message_id.ledgerId, again.send_receipt.message_id.entryId) == (U64 - 1, U64 - 1)
        assert (await service.get_topic(T)).ledger.number_of_entries == 1
    finally:
        await client.close()
        await server.stop()
        await service.close()


async def test_a_batch_starting_at_or_below_the_stored_ids_is_a_duplicate(tmp_path):
    """As Apache's isDuplicateNormal: a send is new only when its FIRST sequence id is above
    every one pushed. A batch 3..8 after 0..5 was stored again (3, 4 and 5 twice): only its
    highest id was compared."""
    async with Broker.embedded(tmp_path, deduplication_enabled=True) as broker:
        producer = await broker.create_producer(T, producer_name="p")
        topic = broker.service.topics[T]
        await topic.publish(producer._producer, _batch("p", 0, 6), sequence_id=0, num_messages=6,
                            highest_sequence_id=5)
        assert await topic.publish(producer._producer, _batch("p", 3, 6), sequence_id=3, num_messages=6,
                                   highest_sequence_id=8) is None              # answered as stored
        assert topic.ledger.number_of_entries == 1
        await topic.publish(producer._producer, _batch("p", 6, 3), sequence_id=6, num_messages=3,
                            highest_sequence_id=8)
        assert topic.ledger.number_of_entries == 2
