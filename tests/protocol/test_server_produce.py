"""Producers on the wire: creation, names, access modes, sends and their answers."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from core_ext.frames import encode_payload_frame
from pyengine.broker.policies import NamespacePolicies
from pyengine.broker.service import BrokerService
from pyengine.protocol import pulsar_api_pb2 as pb
from pyengine.protocol.commands import base_command, serialize_command
from pyengine.protocol.server import ProtocolServer
from tests.protocol.wire_driver import U64, BaseCommand, WireClient, metadata

Connect = Callable[..., Awaitable[WireClient]]
TOPIC = "persistent://public/default/produce"


async def test_a_producer_gets_a_name_and_no_last_sequence_id(client: WireClient) -> None:
    reply = await client.create_producer(TOPIC, producer_id=3, request_id=11)
    assert isinstance(reply, pb.CommandProducerSuccess)
    assert reply.request_id == 11
    assert reply.producer_name.startswith("standalone-0-")
    assert reply.last_sequence_id == -1
    assert reply.producer_ready


async def test_sends_are_answered_in_order_with_their_positions(client: WireClient) -> None:
    await client.create_producer(TOPIC)
    for i in range(5):
        client.send_payload("SEND", metadata(sequence_id=i), b"m%d" % i, producer_id=0, sequence_id=i)
    receipts = [await client.expect("SEND_RECEIPT") for _ in range(5)]
    assert [r.sequence_id for r in receipts] == list(range(5))
    positions = [(r.message_id.ledgerId, r.message_id.entryId) for r in receipts]
    assert positions == sorted(positions) and len(set(positions)) == 5
    assert all(r.producer_id == 0 for r in receipts)


async def test_a_batch_is_one_entry_with_its_highest_sequence_id(client: WireClient) -> None:
    await client.create_producer(TOPIC)
    receipt = await client.publish(0, 10, b"five messages", meta_fields={"num_messages_in_batch": 5},
                                   num_messages=5)
    assert receipt.send_receipt.sequence_id == 10
    assert receipt.send_receipt.highest_sequence_id == 14


async def test_a_wrong_checksum_is_a_checksum_error_and_the_connection_lives(client: WireClient) -> None:
    await client.create_producer(TOPIC)
    command = serialize_command(base_command("SEND", producer_id=0, sequence_id=0))
    corrupt = bytearray(encode_payload_frame(command, metadata(), b"payload"))
    corrupt[-1] ^= 0xFF
    client.send_raw(bytes(corrupt))
    error = await client.expect("SEND_ERROR")
    assert (error.producer_id, error.sequence_id, error.error) == (0, 0, pb.ChecksumError)
    receipt = await client.publish(0, 1, b"fine")
    assert receipt.type == BaseCommand.SEND_RECEIPT


async def test_a_checksum_error_waits_for_the_sends_before_it(client: WireClient) -> None:
    await client.create_producer(TOPIC)
    command = serialize_command(base_command("SEND", producer_id=0, sequence_id=1))
    corrupt = bytearray(encode_payload_frame(command, metadata(sequence_id=1), b"payload"))
    corrupt[-1] ^= 0xFF
    client.send_payload("SEND", metadata(), b"first", producer_id=0, sequence_id=0)
    client.send_raw(bytes(corrupt))
    first, second = await client.receive(), await client.receive()
    assert (first.type, first.send_receipt.sequence_id) == (BaseCommand.SEND_RECEIPT, 0)
    assert (second.type, second.send_error.sequence_id) == (BaseCommand.SEND_ERROR, 1)


async def test_a_message_above_the_limit_is_refused(client: WireClient) -> None:
    await client.create_producer(TOPIC)
    reply = await client.publish(0, 0, b"x" * (5 * 1024 * 1024 + 1024))
    assert reply.type == BaseCommand.SEND_ERROR
    assert reply.send_error.error == pb.NotAllowedError


async def test_undecodable_metadata_is_a_send_error(client: WireClient) -> None:
    await client.create_producer(TOPIC)
    command = serialize_command(base_command("SEND", producer_id=0, sequence_id=0))
    client.send_raw(encode_payload_frame(command, b"\xff\xff\xff", b"payload"))
    error = await client.expect("SEND_ERROR")
    assert error.error == pb.MetadataError
    incomplete = pb.MessageMetadata(producer_name="p").SerializePartialToString()
    client.send_raw(encode_payload_frame(command, incomplete, b"payload"))
    assert (await client.expect("SEND_ERROR")).error == pb.MetadataError


async def test_a_send_without_payload_is_a_send_error(client: WireClient) -> None:
    await client.create_producer(TOPIC)
    client.send("SEND", producer_id=0, sequence_id=0)
    assert (await client.expect("SEND_ERROR")).error == pb.MetadataError


async def test_a_send_for_an_unknown_producer_closes_only_that_connection(server: ProtocolServer,
                                                                          client: WireClient,
                                                                          connect: Connect) -> None:
    await client.create_producer(TOPIC)
    stray = await connect(server.port)
    stray.send_payload("SEND", metadata(), b"nobody", producer_id=42, sequence_id=0)
    assert await stray.closed()
    assert (await client.publish(0, 0, b"ok")).type == BaseCommand.SEND_RECEIPT


async def test_the_same_producer_id_again_is_the_same_producer(client: WireClient) -> None:
    first = await client.create_producer(TOPIC, producer_name="again")
    second = await client.create_producer(TOPIC, request_id=1, producer_name="again")
    assert (second.request_id, second.producer_name) == (1, first.producer_name)
    other_topic = await client.create_producer(TOPIC + "-2", request_id=2)
    assert isinstance(other_topic, pb.CommandError)
    assert other_topic.error == pb.ProducerBusy


async def test_a_name_in_use_on_a_live_connection_is_producer_busy(server: ProtocolServer, client: WireClient,
                                                                  connect: Connect) -> None:
    holder = await connect(server.port)
    await holder.create_producer(TOPIC, producer_name="taken")

    async def hold() -> None:
        await holder.no_command(1.0)        # answers the liveness PING
    holding = asyncio.ensure_future(hold())
    reply = await client.create_producer(TOPIC, producer_name="taken")
    await holding
    assert isinstance(reply, pb.CommandError)
    assert reply.error == pb.ProducerBusy


async def test_a_name_held_by_a_silent_connection_is_taken_over(server: ProtocolServer, client: WireClient,
                                                                connect: Connect) -> None:
    holder = await connect(server.port)
    await holder.create_producer(TOPIC, producer_name="stale")
    reply = await client.create_producer(TOPIC, producer_name="stale")     # holder never answers
    assert isinstance(reply, pb.CommandProducerSuccess)
    assert reply.producer_name == "stale"
    assert await holder.closed()


async def test_producers_need_an_existing_namespace_and_no_partitioned_base(service: BrokerService,
                                                                            client: WireClient) -> None:
    reply = await client.create_producer("persistent://nope/missing/t")
    assert (reply.request_id, reply.error) == (0, pb.TopicNotFound)
    await service.policies.create_partitioned_topic(TOPIC + "-parted", 2)
    reply = await client.create_producer(TOPIC + "-parted", request_id=1)
    assert reply.error == pb.NotAllowedError
    reply = await client.create_producer(TOPIC + "-parted-partition-1", request_id=2)
    assert isinstance(reply, pb.CommandProducerSuccess)


async def test_close_producer_is_success_even_for_an_unknown_id(client: WireClient) -> None:
    await client.create_producer(TOPIC, producer_name="closing")
    assert (await client.request("CLOSE_PRODUCER", producer_id=0, request_id=5)).request_id == 5
    assert (await client.request("CLOSE_PRODUCER", producer_id=99, request_id=6)).request_id == 6
    reply = await client.create_producer(TOPIC, producer_id=1, request_id=7, producer_name="closing")
    assert isinstance(reply, pb.CommandProducerSuccess)


async def test_deduplication_drops_repeated_sequence_ids(service: BrokerService, client: WireClient) -> None:
    await service.policies.set_policies("public/default", NamespacePolicies(deduplication_enabled=True))
    service.refresh_policies()
    await client.create_producer(TOPIC, producer_name="dedup")
    for i in range(3):
        assert (await client.publish(0, i, b"m%d" % i, producer_name="dedup")).type == BaseCommand.SEND_RECEIPT
    repeated = await client.publish(0, 1, b"m1", producer_name="dedup")
    assert repeated.send_receipt.sequence_id == 1
    assert (repeated.send_receipt.message_id.ledgerId, repeated.send_receipt.message_id.entryId) == (U64 - 1, U64 - 1)
    await client.request("CLOSE_PRODUCER", producer_id=0, request_id=1)
    reopened = await client.create_producer(TOPIC, producer_id=1, request_id=2, producer_name="dedup")
    assert reopened.last_sequence_id == 2
    topic = await service.get_topic(TOPIC)
    assert topic.ledger.number_of_entries == 3


async def test_a_duplicate_is_answered_after_the_sends_before_it(service: BrokerService, client: WireClient) -> None:
    await service.policies.set_policies("public/default", NamespacePolicies(deduplication_enabled=True))
    service.refresh_policies()
    await client.create_producer(TOPIC, producer_name="ordered")
    assert (await client.publish(0, 0, b"a", producer_name="ordered")).type == BaseCommand.SEND_RECEIPT
    client.send_payload("SEND", metadata("ordered", 1), b"b", producer_id=0, sequence_id=1)
    client.send_payload("SEND", metadata("ordered", 0), b"a", producer_id=0, sequence_id=0)
    first, second = await client.expect("SEND_RECEIPT"), await client.expect("SEND_RECEIPT")
    assert [first.sequence_id, second.sequence_id] == [1, 0]


# --- access modes -----------------------------------------------------------------------------

async def test_a_second_exclusive_producer_is_fenced(server: ProtocolServer, client: WireClient,
                                                     connect: Connect) -> None:
    first = await client.create_producer(TOPIC, producer_access_mode=pb.Exclusive)
    assert first.HasField("topic_epoch")
    other = await connect(server.port)
    reply = await other.create_producer(TOPIC, producer_access_mode=pb.Exclusive)
    assert reply.error == pb.ProducerFenced
    reply = await other.create_producer(TOPIC, request_id=1)
    assert reply.error == pb.ProducerBusy


async def test_exclusive_is_refused_while_shared_producers_exist(server: ProtocolServer, client: WireClient,
                                                                 connect: Connect) -> None:
    await client.create_producer(TOPIC)
    other = await connect(server.port)
    reply = await other.create_producer(TOPIC, producer_access_mode=pb.Exclusive)
    assert reply.error == pb.ProducerFenced


async def test_exclusive_with_fencing_pushes_the_others_out(server: ProtocolServer, client: WireClient,
                                                            connect: Connect) -> None:
    await client.create_producer(TOPIC, producer_access_mode=pb.Exclusive)
    fencer = await connect(server.port)
    reply = await fencer.create_producer(TOPIC, producer_access_mode=pb.ExclusiveWithFencing)
    assert isinstance(reply, pb.CommandProducerSuccess)
    closed = await client.expect("CLOSE_PRODUCER")
    assert closed.producer_id == 0
    # Sends the fenced client had in flight are dropped, not a reason to close the connection.
    client.send_payload("SEND", metadata(), b"late", producer_id=0, sequence_id=0)
    await client.no_command()
    # Coming back with the old epoch is fenced.
    again = await client.create_producer(TOPIC, producer_id=0, request_id=1,
                                         producer_access_mode=pb.Exclusive, topic_epoch=1)
    assert again.error == pb.ProducerFenced


async def test_wait_for_exclusive_gets_the_topic_when_it_is_free(server: ProtocolServer, client: WireClient,
                                                                 connect: Connect) -> None:
    await client.create_producer(TOPIC, producer_access_mode=pb.Exclusive)
    waiter = await connect(server.port)
    queued = await waiter.create_producer(TOPIC, producer_access_mode=pb.WaitForExclusive)
    assert isinstance(queued, pb.CommandProducerSuccess) and not queued.producer_ready
    await client.request("CLOSE_PRODUCER", producer_id=0, request_id=1)
    ready = await waiter.expect("PRODUCER_SUCCESS")
    assert ready.request_id == 0 and ready.producer_ready and ready.HasField("topic_epoch")
    assert (await waiter.publish(0, 0, b"mine now")).type == BaseCommand.SEND_RECEIPT
