"""The protocol core against a scripted broker (a fake transport, no sockets)."""

import asyncio
import itertools

import pytest

from core_ext.frames import FrameDecoder, encode_command
from pyengine.client.config import ClientConfig
from pyengine.client.connection import ClientConnection
from pyengine.client.errors import ConnectError
from pyengine.client.url import BrokerAddress
from pyengine.errors import ProducerBusyError, TopicNotFoundError
from pyengine.protocol import pulsar_api_pb2 as pb
from pyengine.protocol.commands import base_command, parse_command

T = pb.BaseCommand


class FakeTransport(asyncio.Transport):
    def __init__(self, protocol: ClientConnection) -> None:
        super().__init__()
        self.protocol = protocol
        self.decoder = FrameDecoder()
        self.sent: list[pb.BaseCommand] = []
        self.closing = False

    def write(self, data) -> None:
        self.sent.extend(parse_command(frame.command) for frame in self.decoder.feed(data))

    def is_closing(self) -> bool:
        return self.closing

    def abort(self) -> None:
        if not self.closing:
            self.closing = True
            asyncio.get_running_loop().call_soon(self.protocol.connection_lost, None)

    close = abort


def frame(cmd: pb.BaseCommand) -> bytes:
    return encode_command(cmd.SerializeToString())


async def connected(keep_alive: float = 30.0) -> tuple[ClientConnection, FakeTransport]:
    connection = ClientConnection(BrokerAddress("pulsar://broker:6650", "broker", 6650),
                                  ClientConfig(keep_alive_interval=keep_alive), itertools.count())
    transport = FakeTransport(connection)
    connection.connection_made(transport)
    connection.data_received(frame(base_command(T.CONNECTED, server_version="test", protocol_version=20,
                                                max_message_size=1000)))
    await connection.wait_connected(1)
    return connection, transport


async def test_handshake_sends_connect_and_adopts_the_broker_limits():
    connection, transport = await connected()
    assert transport.sent[0].type == T.CONNECT
    assert transport.sent[0].connect.protocol_version == 20
    assert connection.usable and connection.max_message_size == 1000 and connection.protocol_version == 20
    connection.close()


async def test_anything_but_connected_first_fails_the_handshake():
    connection = ClientConnection(BrokerAddress("pulsar://b:1", "b", 1), ClientConfig(), itertools.count())
    connection.connection_made(FakeTransport(connection))
    connection.data_received(frame(base_command(T.ERROR, request_id=0, error=pb.TopicNotFound, message="no")))
    with pytest.raises(TopicNotFoundError):
        await connection.wait_connected(1)
    await connection.closed


async def test_responses_are_matched_by_request_id_and_errors_raised():
    connection, transport = await connected()
    first = asyncio.ensure_future(connection.request(base_command(T.PARTITIONED_METADATA, topic="t", request_id=7), 5))
    second = asyncio.ensure_future(connection.request(
        base_command(T.PRODUCER, topic="t", producer_id=1, request_id=8), 5))
    await asyncio.sleep(0)
    connection.data_received(
        frame(base_command(T.ERROR, request_id=8, error=pb.ProducerBusy, message="busy"))
        + frame(base_command(T.PARTITIONED_METADATA_RESPONSE, request_id=7, partitions=3,
                             response=pb.CommandPartitionedTopicMetadataResponse.Success)))
    assert (await first).partitions == 3
    with pytest.raises(ProducerBusyError, match="busy"):
        await second
    connection.close()


async def test_lookup_failures_come_inside_their_response():
    connection, _ = await connected()
    lookup = asyncio.ensure_future(connection.request(base_command(T.LOOKUP, topic="t", request_id=1), 5))
    metadata = asyncio.ensure_future(connection.request(base_command(T.PARTITIONED_METADATA, topic="t", request_id=2), 5))
    await asyncio.sleep(0)
    connection.data_received(
        frame(base_command(T.LOOKUP_RESPONSE, request_id=1, response=pb.CommandLookupTopicResponse.Failed,
                           error=pb.TopicNotFound, message="gone"))
        + frame(base_command(T.PARTITIONED_METADATA_RESPONSE, request_id=2)))
    with pytest.raises(TopicNotFoundError):
        await lookup
    with pytest.raises(ConnectError):          # neither Success nor Failed: a failure
        await metadata
    connection.close()


async def test_a_queued_producer_waits_for_its_second_answer():
    connection, _ = await connected()
    request = asyncio.ensure_future(connection.request(
        base_command(T.PRODUCER, topic="t", producer_id=1, request_id=3), 5))
    await asyncio.sleep(0)
    connection.data_received(frame(base_command(T.PRODUCER_SUCCESS, request_id=3, producer_name="p",
                                                producer_ready=False)))
    await asyncio.sleep(0.01)
    assert not request.done()
    connection.data_received(frame(base_command(T.PRODUCER_SUCCESS, request_id=3, producer_name="p")))
    assert (await request).producer_name == "p"
    connection.close()


async def test_request_timeout_and_unknown_ids_are_ignored():
    connection, _ = await connected()
    connection.data_received(frame(base_command(T.SUCCESS, request_id=99)))   # nobody asked: ignored
    with pytest.raises(TimeoutError, match="SEEK"):
        await connection.request(base_command(T.SEEK, consumer_id=1, request_id=4), 0.05)
    assert connection.usable
    connection.close()


async def test_losing_the_connection_fails_pending_requests_and_tells_handlers():
    connection, transport = await connected()
    told = []

    class Handler:
        def on_connection_closed(self, closed):
            told.append(closed)

    connection.producers[0] = Handler()
    request = asyncio.ensure_future(connection.request(base_command(T.SUBSCRIBE, topic="t", subscription="s",
                                                                    subType=0, consumer_id=0, request_id=5), 5))
    await asyncio.sleep(0)
    transport.abort()
    with pytest.raises(ConnectError):
        await request
    assert told == [connection] and not connection.usable


async def test_pings_are_answered_and_a_silent_broker_is_dropped():
    connection, transport = await connected(keep_alive=0.05)
    connection.data_received(frame(base_command(T.PING)))
    assert transport.sent[-1].type == T.PONG
    await asyncio.sleep(0.07)
    assert transport.sent[-1].type == T.PING           # first tick: heard from the broker, so PING
    await asyncio.wait_for(connection.closed, 1)         # second tick: silence, so close


async def test_garbage_or_unexpected_commands_close_the_connection():
    connection, _ = await connected()
    connection.data_received(b"\x00\x00\x00\x05\x00\x00\x00\x09z")      # command size overruns the frame
    await asyncio.wait_for(connection.closed, 1)
    connection, _ = await connected()
    connection.data_received(frame(base_command(T.NEW_TXN, request_id=1)))  # a request, from a broker
    await asyncio.wait_for(connection.closed, 1)


async def test_answers_before_a_broken_frame_are_taken_then_the_connection_closes():
    """A response in the same read as a broken frame, ahead of it, is not lost."""
    connection, _ = await connected()
    answered = asyncio.ensure_future(connection.request(base_command(T.PARTITIONED_METADATA, topic="t",
                                                                     request_id=3), 5))
    unanswered = asyncio.ensure_future(connection.request(base_command(T.PARTITIONED_METADATA, topic="u",
                                                                       request_id=4), 5))
    await asyncio.sleep(0)
    connection.data_received(frame(base_command(T.PARTITIONED_METADATA_RESPONSE, request_id=3, partitions=2,
                                                response=pb.CommandPartitionedTopicMetadataResponse.Success))
                             + b"\x00\x00\x00\x05\x00\x00\x00\x09z")
    assert (await answered).partitions == 2
    with pytest.raises(ConnectError, match="unreadable frame"):
        await unanswered
    await asyncio.wait_for(connection.closed, 1)


async def test_messages_and_receipts_are_routed_by_id():
    connection, _ = await connected()
    seen = []

    class Producer:
        def on_send_receipt(self, receipt):
            seen.append(("receipt", receipt.sequence_id))

    class Consumer:
        def on_message(self, message, payload_frame):
            seen.append(("message", message.consumer_id))

    connection.producers[4] = Producer()
    connection.consumers[9] = Consumer()
    connection.data_received(frame(base_command(T.SEND_RECEIPT, producer_id=4, sequence_id=11))
                             + frame(base_command(T.SEND_RECEIPT, producer_id=5, sequence_id=1))
                             + frame(base_command(T.MESSAGE, consumer_id=9,
                                                  message_id=pb.MessageIdData(ledgerId=1, entryId=2))))
    assert seen == [("receipt", 11), ("message", 9)]
    connection.close()
