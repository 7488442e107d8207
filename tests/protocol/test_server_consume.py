"""Consumers on the wire: subscriptions, permits, deliveries, acknowledgements, redelivery,
seeks, readers and the consumer-side requests."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from core_ext.batch import build_batch
from pyengine.broker.service import BrokerService
from pyengine.protocol import pulsar_api_pb2 as pb
from pyengine.protocol.server import ProtocolServer
from tests.broker.helpers import failover_names
from tests.protocol.wire_driver import U64, BaseCommand, WireClient, metadata

Connect = Callable[..., Awaitable[WireClient]]
TOPIC = "persistent://public/default/consume"
Sub = pb.CommandSubscribe
EARLIEST = {"ledgerId": U64 - 1, "entryId": U64 - 1}
LATEST = {"ledgerId": (1 << 63) - 1, "entryId": (1 << 63) - 1}


async def produce(client: WireClient, count: int, *, topic: str = TOPIC, producer_id: int = 100,
                  start: int = 0) -> list[tuple[int, int]]:
    """Send `count` messages b"m<i>"; their (ledger, entry) positions."""
    if start == 0:
        await client.create_producer(topic, producer_id=producer_id, request_id=1000 + producer_id)
    positions = []
    for i in range(start, start + count):
        receipt = await client.publish(producer_id, i, b"m%d" % i)
        assert receipt.type == BaseCommand.SEND_RECEIPT, receipt
        positions.append((receipt.send_receipt.message_id.ledgerId, receipt.send_receipt.message_id.entryId))
    return positions


def batch_of(count: int) -> bytes:
    pieces = [(pb.SingleMessageMetadata(payload_size=2, sequence_id=i).SerializeToString(), b"b%d" % i)
              for i in range(count)]
    return build_batch(pieces)


async def test_messages_flow_only_with_permits(client: WireClient) -> None:
    await produce(client, 5)
    reply = await client.subscribe(TOPIC, "s", consumer_id=3, request_id=4)
    assert reply.request_id == 4
    await client.no_command()                      # no permits yet
    client.send("FLOW", consumer_id=3, messagePermits=2)
    first, second = await client.message(), await client.message()
    assert (first[0].consumer_id, first[1], second[1]) == (3, b"m0", b"m1")
    assert first[0].redelivery_count == 0 and not first[0].ack_set
    await client.no_command()
    client.send("FLOW", consumer_id=3, messagePermits=10)
    assert [(await client.message())[1] for _ in range(3)] == [b"m2", b"m3", b"m4"]


async def test_a_message_is_the_stored_entry_as_the_producer_sent_it(client: WireClient) -> None:
    await client.create_producer(TOPIC, producer_id=1)
    meta = metadata("sender", 0, properties=[pb.KeyValue(key="k", value="v")], partition_key="key")
    client.send_payload("SEND", meta, b"exact bytes", producer_id=1, sequence_id=0)
    await client.expect("SEND_RECEIPT")
    await client.subscribe(TOPIC, "s", permits=1)
    cmd, raw = await client.receive_command()
    assert raw.checksum_valid is True
    assert raw.metadata == meta and raw.payload == b"exact bytes"


async def test_acks_with_a_request_id_are_answered(client: WireClient) -> None:
    positions = await produce(client, 2)
    await client.subscribe(TOPIC, "s", permits=10)
    await client.message(), await client.message()
    ledger, entry = positions[0]
    reply = await client.request("ACK", consumer_id=0, ack_type=pb.CommandAck.Individual,
                                 message_id=[{"ledgerId": ledger, "entryId": entry}], request_id=9)
    assert isinstance(reply, pb.CommandAckResponse)
    assert (reply.consumer_id, reply.request_id, reply.HasField("error")) == (0, 9, False)
    # Without a request id there is no answer.
    client.send("ACK", consumer_id=0, ack_type=pb.CommandAck.Cumulative,
                message_id=[{"ledgerId": positions[1][0], "entryId": positions[1][1]}])
    await client.no_command()


async def test_acknowledged_messages_are_not_redelivered(service: BrokerService, client: WireClient) -> None:
    positions = await produce(client, 3)
    await client.subscribe(TOPIC, "s", consumer_id=0, permits=10)
    for _ in range(3):
        await client.message()
    ledger, entry = positions[1]
    await client.request("ACK", consumer_id=0, ack_type=pb.CommandAck.Individual,
                         message_id=[{"ledgerId": ledger, "entryId": entry}], request_id=1)
    client.send("REDELIVER_UNACKNOWLEDGED_MESSAGES", consumer_id=0)
    redelivered = [(await client.message())[1] for _ in range(2)]
    assert redelivered == [b"m0", b"m2"]
    await client.no_command()


async def test_cumulative_acks_are_refused_on_shared_subscriptions(client: WireClient) -> None:
    positions = await produce(client, 1)
    await client.subscribe(TOPIC, "s", sub_type=Sub.Shared, permits=10)
    await client.message()
    reply = await client.request("ACK", consumer_id=0, ack_type=pb.CommandAck.Cumulative,
                                 message_id=[{"ledgerId": positions[0][0], "entryId": positions[0][1]}],
                                 request_id=2)
    assert reply.error == pb.NotAllowedError


async def test_acks_for_an_unknown_consumer(client: WireClient) -> None:
    reply = await client.request("ACK", consumer_id=77, ack_type=pb.CommandAck.Individual,
                                 message_id=[{"ledgerId": 1, "entryId": 1}], request_id=3)
    assert (reply.consumer_id, reply.request_id, reply.error) == (77, 3, pb.ConsumerNotFound)
    client.send("ACK", consumer_id=77, ack_type=pb.CommandAck.Individual, message_id=[{"ledgerId": 1, "entryId": 1}])
    client.send("FLOW", consumer_id=77, messagePermits=10)
    client.send("REDELIVER_UNACKNOWLEDGED_MESSAGES", consumer_id=77)
    await client.no_command()
    assert isinstance(await client.request("PING"), pb.CommandPong)


async def test_a_message_the_client_could_not_read_is_acknowledged(client: WireClient) -> None:
    positions = await produce(client, 1)
    await client.subscribe(TOPIC, "s", permits=10)
    await client.message()
    reply = await client.request("ACK", consumer_id=0, ack_type=pb.CommandAck.Individual,
                                 message_id=[{"ledgerId": positions[0][0], "entryId": positions[0][1]}],
                                 validation_error=pb.CommandAck.ChecksumMismatch, request_id=4)
    assert not reply.HasField("error")
    client.send("REDELIVER_UNACKNOWLEDGED_MESSAGES", consumer_id=0)
    await client.no_command()


async def test_batch_index_acks_come_back_as_the_ack_set(client: WireClient) -> None:
    await client.create_producer(TOPIC, producer_id=1)
    meta = metadata(sequence_id=0, num_messages_in_batch=5)
    client.send_payload("SEND", meta, batch_of(5), producer_id=1, sequence_id=0, num_messages=5)
    receipt = await client.expect("SEND_RECEIPT")
    await client.subscribe(TOPIC, "s", permits=10)
    await client.message()
    position = {"ledgerId": receipt.message_id.ledgerId, "entryId": receipt.message_id.entryId}
    # Indexes 0 and 1 acked: bits 2, 3, 4 still set (0b11100 = 28).
    await client.request("ACK", consumer_id=0, ack_type=pb.CommandAck.Individual,
                         message_id=[{**position, "ack_set": [28]}], request_id=1)
    client.send("REDELIVER_UNACKNOWLEDGED_MESSAGES", consumer_id=0)
    again, _ = await client.message()
    assert list(again.ack_set) == [28]
    # The rest of the batch acked: the entry is done.
    await client.request("ACK", consumer_id=0, ack_type=pb.CommandAck.Individual,
                         message_id=[{**position, "ack_set": [0]}], request_id=2)
    client.send("REDELIVER_UNACKNOWLEDGED_MESSAGES", consumer_id=0)
    await client.no_command()


async def test_redelivered_messages_count_their_redeliveries(client: WireClient) -> None:
    positions = await produce(client, 2)
    await client.subscribe(TOPIC, "s", sub_type=Sub.Shared, permits=10)
    await client.message(), await client.message()
    ledger, entry = positions[1]
    for count in (1, 2):
        client.send("REDELIVER_UNACKNOWLEDGED_MESSAGES", consumer_id=0,
                    message_ids=[{"ledgerId": ledger, "entryId": entry}])
        message, payload = await client.message()
        assert (payload, message.redelivery_count) == (b"m1", count)
    await client.no_command()


async def test_a_second_exclusive_consumer_is_busy(server: ProtocolServer, client: WireClient,
                                                   connect: Connect) -> None:
    await client.subscribe(TOPIC, "exclusive")
    other = await connect(server.port)
    reply = await other.subscribe(TOPIC, "exclusive")
    assert (reply.request_id, reply.error) == (0, pb.ConsumerBusy)
    reply = await other.subscribe(TOPIC, "exclusive", request_id=1, sub_type=Sub.Shared)
    assert reply.error == pb.ConsumerBusy


async def test_a_consumer_id_in_use_for_another_subscription_is_busy(client: WireClient) -> None:
    await client.subscribe(TOPIC, "first")
    again = await client.subscribe(TOPIC, "first", request_id=1)
    assert isinstance(again, pb.CommandSuccess)
    other = await client.subscribe(TOPIC, "second", request_id=2)
    assert other.error == pb.ConsumerBusy


async def test_failover_consumers_hear_which_one_is_active(server: ProtocolServer, client: WireClient,
                                                           connect: Connect) -> None:
    active, standby = failover_names(TOPIC)            # Pulsar's pick for this topic: the first
    client.send("SUBSCRIBE", topic=TOPIC, subscription="fo", subType=Sub.Failover, consumer_id=0, request_id=0,
                consumer_name=active)
    change = await client.expect("ACTIVE_CONSUMER_CHANGE")
    assert (change.consumer_id, change.is_active) == (0, True)
    await client.expect("SUCCESS")
    other = await connect(server.port)
    other.send("SUBSCRIBE", topic=TOPIC, subscription="fo", subType=Sub.Failover, consumer_id=0, request_id=0,
               consumer_name=standby)
    change = await other.expect("ACTIVE_CONSUMER_CHANGE")
    assert change.is_active is False
    await other.expect("SUCCESS")


async def test_closing_a_shared_consumer_gives_its_messages_to_the_others(server: ProtocolServer,
                                                                          client: WireClient,
                                                                          connect: Connect) -> None:
    await produce(client, 1)
    await client.subscribe(TOPIC, "shared", sub_type=Sub.Shared, permits=10)
    await client.message()
    other = await connect(server.port)
    await other.subscribe(TOPIC, "shared", sub_type=Sub.Shared, permits=10)
    assert (await client.request("CLOSE_CONSUMER", consumer_id=0, request_id=8)).request_id == 8
    assert (await other.message())[1] == b"m0"
    assert (await client.request("CLOSE_CONSUMER", consumer_id=55, request_id=9)).request_id == 9


async def test_key_shared_sticky_ranges_route_by_key(server: ProtocolServer, client: WireClient,
                                                     connect: Connect) -> None:
    everything = {"keySharedMode": pb.STICKY, "hashRanges": [{"start": 0, "end": 65535}]}
    await client.subscribe(TOPIC, "ks", sub_type=Sub.Key_Shared, permits=10, keySharedMeta=everything)
    await client.create_producer(TOPIC, producer_id=1)
    await client.publish(1, 0, b"keyed", meta_fields={"partition_key": "k1"})
    assert (await client.message())[1] == b"keyed"


async def test_get_last_message_id(client: WireClient) -> None:
    await client.subscribe(TOPIC, "s")
    empty = await client.request("GET_LAST_MESSAGE_ID", consumer_id=0, request_id=3)
    assert empty.request_id == 3
    assert empty.last_message_id.entryId == U64 - 1
    positions = await produce(client, 3)
    last = await client.request("GET_LAST_MESSAGE_ID", consumer_id=0, request_id=4)
    assert (last.last_message_id.ledgerId, last.last_message_id.entryId) == positions[-1]
    assert last.last_message_id.batch_index == -1
    assert last.HasField("consumer_mark_delete_position")
    missing = await client.request("GET_LAST_MESSAGE_ID", consumer_id=9, request_id=5)
    # As Apache's ServerCnx: an unknown consumer is a MetadataError "Consumer not found".
    assert (missing.request_id, missing.error) == (5, pb.MetadataError)
    assert "Consumer not found" in missing.message


async def test_get_last_message_id_of_a_batch_names_its_last_index(client: WireClient) -> None:
    await client.subscribe(TOPIC, "s")
    await client.create_producer(TOPIC, producer_id=1)
    client.send_payload("SEND", metadata(num_messages_in_batch=4), batch_of(4), producer_id=1, sequence_id=0,
                        num_messages=4)
    await client.expect("SEND_RECEIPT")
    last = await client.request("GET_LAST_MESSAGE_ID", consumer_id=0, request_id=1)
    assert last.last_message_id.batch_index == 3


async def test_seek_disconnects_the_consumer_and_restarts_at_the_position(client: WireClient) -> None:
    positions = await produce(client, 4)
    await client.subscribe(TOPIC, "s", permits=10)
    for _ in range(4):
        await client.message()
    ledger, entry = positions[2]
    client.send("SEEK", consumer_id=0, request_id=5, message_id={"ledgerId": ledger, "entryId": entry})
    closed = await client.expect("CLOSE_CONSUMER")
    assert closed.consumer_id == 0
    assert (await client.expect("SUCCESS")).request_id == 5
    await client.subscribe(TOPIC, "s", request_id=6, permits=10)
    assert [(await client.message())[1] for _ in range(2)] == [b"m2", b"m3"]
    await client.no_command()


async def test_seek_by_publish_time(client: WireClient) -> None:
    await client.create_producer(TOPIC, producer_id=1)
    for i, at in enumerate((1000, 2000, 3000)):
        await client.publish(1, i, b"t%d" % i, meta_fields={"publish_time": at})
    await client.subscribe(TOPIC, "s")
    client.send("SEEK", consumer_id=0, request_id=1, message_publish_time=1500)
    await client.expect("CLOSE_CONSUMER")
    await client.expect("SUCCESS")
    await client.subscribe(TOPIC, "s", request_id=2, permits=10)
    assert [(await client.message())[1] for _ in range(2)] == [b"t1", b"t2"]


async def test_seek_errors(client: WireClient) -> None:
    reply = await client.request("SEEK", consumer_id=4, request_id=1, message_publish_time=0)
    assert (reply.request_id, reply.error) == (1, pb.MetadataError) and "Consumer not found" in reply.message
    await client.subscribe(TOPIC, "s")
    reply = await client.request("SEEK", consumer_id=0, request_id=2)
    assert reply.error == pb.NotAllowedError


async def test_readers_start_where_they_are_told(client: WireClient) -> None:
    positions = await produce(client, 3)
    await client.subscribe(TOPIC, "reader-a", consumer_id=1, durable=False, start_message_id=EARLIEST, permits=10)
    assert [(await client.message())[1] for _ in range(3)] == [b"m0", b"m1", b"m2"]
    ledger, entry = positions[1]
    await client.subscribe(TOPIC, "reader-b", consumer_id=2, request_id=1, durable=False,
                           start_message_id={"ledgerId": ledger, "entryId": entry}, permits=10)
    assert [(await client.message())[1] for _ in range(2)] == [b"m1", b"m2"]
    await client.subscribe(TOPIC, "reader-c", consumer_id=3, request_id=2, durable=False,
                           start_message_id=LATEST, permits=10)
    await client.no_command()
    await produce(client, 1, start=3)
    message, payload = await client.message()
    assert payload == b"m3"
    # Three readers now see m3: reader-a and reader-b too.
    assert {message.consumer_id} | {(await client.message())[0].consumer_id for _ in range(2)} == {1, 2, 3}


async def test_a_reader_that_seeks_by_time_comes_back_to_its_moved_subscription(client: WireClient) -> None:
    await client.create_producer(TOPIC, producer_id=1)
    for i, at in enumerate((1000, 2000, 3000)):
        await client.publish(1, i, b"t%d" % i, meta_fields={"publish_time": at})
    await client.subscribe(TOPIC, "reader-x", durable=False, start_message_id=LATEST)
    client.send("SEEK", consumer_id=0, request_id=1, message_publish_time=2000)
    await client.expect("CLOSE_CONSUMER")
    await client.expect("SUCCESS")
    # After a seek by time the client subscribes again without a start position.
    await client.subscribe(TOPIC, "reader-x", request_id=2, durable=False, earliest=False, permits=10)
    assert [(await client.message())[1] for _ in range(2)] == [b"t1", b"t2"]


async def test_unsubscribe(service: BrokerService, server: ProtocolServer, client: WireClient,
                           connect: Connect) -> None:
    await client.subscribe(TOPIC, "shared", sub_type=Sub.Shared)
    other = await connect(server.port)
    await other.subscribe(TOPIC, "shared", sub_type=Sub.Shared)
    reply = await client.request("UNSUBSCRIBE", consumer_id=0, request_id=3)
    assert (reply.request_id, reply.error) == (3, pb.MetadataError)         # as Apache's broker
    assert reply.message.startswith("Unconnected or shared consumer attempting to unsubscribe")
    await other.request("CLOSE_CONSUMER", consumer_id=0, request_id=1)
    assert (await client.request("UNSUBSCRIBE", consumer_id=0, request_id=4)).request_id == 4
    topic = await service.get_topic(TOPIC)
    assert "shared" not in topic.subscriptions
    reply = await client.request("UNSUBSCRIBE", consumer_id=0, request_id=5)
    assert reply.error == pb.MetadataError and "Consumer not found" in reply.message


async def test_consumer_stats(client: WireClient) -> None:
    await produce(client, 2)
    await client.subscribe(TOPIC, "s", consumer_name="stats", permits=10)
    await client.message(), await client.message()
    stats = await client.request("CONSUMER_STATS", request_id=6, consumer_id=0)
    # Pulsar counts unacked messages of Shared and Key_Shared consumers only: 0 here.
    assert (stats.request_id, stats.consumerName, stats.unackedMessages) == (6, "stats", 0)
    assert stats.availablePermits == 8 and stats.type == "Exclusive"
    missing = await client.request("CONSUMER_STATS", request_id=7, consumer_id=5)
    assert missing.error_code == pb.ConsumerNotFound


async def test_a_deleted_topic_closes_its_consumers(service: BrokerService, client: WireClient) -> None:
    await client.subscribe(TOPIC, "s")
    await service.delete_topic(TOPIC)
    closed = await client.expect("CLOSE_CONSUMER")
    assert closed.consumer_id == 0
    # The client subscribes again with the same consumer id.
    assert isinstance(await client.subscribe(TOPIC, "s", request_id=1), pb.CommandSuccess)


async def test_subscribing_needs_a_name_and_a_namespace(client: WireClient) -> None:
    reply = await client.subscribe(TOPIC, "")
    assert reply.error == pb.NotAllowedError
    reply = await client.subscribe("persistent://nope/missing/t", "s", request_id=1)
    assert reply.error == pb.TopicNotFound
    reply = await client.subscribe(TOPIC + "-never-created", "s", request_id=2, force_topic_creation=False)
    assert reply.error == pb.TopicNotFound
