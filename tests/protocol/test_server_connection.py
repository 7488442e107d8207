"""The connection itself: handshake, keep-alive, and input that must close only this
connection while the others go on."""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Awaitable, Callable

import pytest

from core_ext.frames import encode_command, encode_payload_frame
from pyengine.broker.service import BrokerService
from pyengine.protocol import pulsar_api_pb2 as pb
from pyengine.protocol.commands import base_command, serialize_command
from pyengine.protocol.server import ProtocolServer
from tests.protocol.wire_driver import BaseCommand, WireClient, frame, metadata

Connect = Callable[..., Awaitable[WireClient]]


async def test_connected_has_server_version_protocol_20_and_max_message_size(connect: Connect,
                                                                             server: ProtocolServer) -> None:
    client = await connect(server.port, handshake=False)
    connected = await client.request("CONNECT", client_version="Pulsar-CPP-v4.2.0", protocol_version=20,
                                     auth_method_name="none")
    assert connected.server_version.startswith("pyengine-")
    assert connected.protocol_version == 20
    assert connected.max_message_size == 5 * 1024 * 1024


async def test_an_older_client_gets_its_own_protocol_version(connect: Connect, server: ProtocolServer) -> None:
    client = await connect(server.port, handshake=False)
    connected = await client.request("CONNECT", client_version="old", protocol_version=12)
    assert connected.protocol_version == 12


async def test_ping_is_answered_with_pong(client: WireClient) -> None:
    pong = await client.request("PING")
    assert isinstance(pong, pb.CommandPong)


async def test_an_idle_client_is_pinged_and_closed_when_silent(connect: Connect, service: BrokerService) -> None:
    server = ProtocolServer(service, "127.0.0.1", 0, keepalive_interval=0.2)
    await server.start()
    try:
        answering = await connect(server.port)
        silent = await connect(server.port)

        async def stay_silent() -> None:
            # Reads but never answers: PING after one quiet interval, closed after two.
            cmd = await silent.receive(2, answer_pings=False)
            assert cmd.type == BaseCommand.PING
            assert await silent.closed(2)

        async def answer() -> None:
            # Answers the PINGs: stays connected through several intervals.
            await answering.no_command(1.0)

        await asyncio.gather(stay_silent(), answer())
        assert answering.pings >= 1
        assert isinstance(await answering.request("PING"), pb.CommandPong)
    finally:
        await server.stop()


async def test_a_connection_that_never_connects_is_closed(connect: Connect, service: BrokerService) -> None:
    server = ProtocolServer(service, "127.0.0.1", 0, keepalive_interval=0.2)
    await server.start()
    try:
        client = await connect(server.port, handshake=False)
        assert await client.closed(2)
    finally:
        await server.stop()


@pytest.mark.parametrize("first", [
    frame("PING"),
    frame("LOOKUP", topic="t", request_id=1),
    frame("PRODUCER", topic="t", producer_id=0, request_id=0),
])
async def test_commands_before_connect_close_only_that_connection(connect: Connect, server: ProtocolServer,
                                                                  client: WireClient,
                                                                  first: bytes) -> None:
    early = await connect(server.port, handshake=False)
    early.send_raw(first)
    assert await early.closed()
    assert isinstance(await client.request("PING"), pb.CommandPong)


async def test_a_second_connect_closes_the_connection(connect: Connect, server: ProtocolServer,
                                                      client: WireClient) -> None:
    other = await connect(server.port)
    other.send("CONNECT", client_version="again", protocol_version=20)
    assert await other.closed()
    assert isinstance(await client.request("PING"), pb.CommandPong)


def _command_with_type(number: int) -> bytes:
    """A BaseCommand whose type field holds `number` (field 1, varint) and nothing else."""
    body = bytes([0x08]) + _varint(number)
    return encode_command(body)


def _varint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


MALFORMED = [
    ("garbage bytes", b"\x00\x00\x00\x10" + b"\xff" * 16),
    ("command size overruns the frame", struct.pack(">II", 8, 200) + b"\x08\x12\x92\x01"),
    ("frame larger than the limit", struct.pack(">I", 64 * 1024 * 1024) + b"\x00" * 16),
    ("unknown command type", _command_with_type(99)),
    ("a type without its body", _command_with_type(BaseCommand.PRODUCER)),
    ("missing required fields", encode_command(pb.BaseCommand(
        type=BaseCommand.PRODUCER, producer=pb.CommandProducer(topic="t")).SerializePartialToString())),
    ("a command only brokers send", frame("SUCCESS", request_id=1)),
    ("a MESSAGE from a client", encode_payload_frame(
        serialize_command(base_command("MESSAGE", consumer_id=0, message_id={"ledgerId": 1, "entryId": 1})),
        metadata(), b"x")),
    ("a watch command this broker does not know", _command_with_type(64)),
]


@pytest.mark.parametrize("name, data", MALFORMED, ids=[name for name, _ in MALFORMED])  # some frames carry a clock
async def test_malformed_input_closes_only_that_connection(connect: Connect, server: ProtocolServer,
                                                           client: WireClient,
                                                           name: str, data: bytes) -> None:
    await client.create_producer("persistent://public/default/survivor")
    bad = await connect(server.port)
    bad.send_raw(data)
    assert await bad.closed(), name
    # The other connection keeps producing.
    receipt = await client.publish(0, 0, b"still here")
    assert receipt.type == BaseCommand.SEND_RECEIPT


BROKEN_AFTER_SENDS = [
    ("frame larger than the limit", struct.pack(">I", 64 * 1024 * 1024) + b"\x00" * 16),
    ("command size overruns the frame", struct.pack(">II", 8, 200) + b"\x08\x12\x92\x01"),
]


@pytest.mark.parametrize("name, broken", BROKEN_AFTER_SENDS, ids=[name for name, _ in BROKEN_AFTER_SENDS])
async def test_sends_before_a_broken_frame_in_the_same_read_are_stored(connect: Connect, server: ProtocolServer,
                                                                       name: str, broken: bytes) -> None:
    """As a Pulsar broker (Netty hands on the frames decoded before the one that failed), the
    commands ahead of a broken frame are carried out; then the connection is closed."""
    topic = "persistent://public/default/before-broken"
    producer = await connect(server.port)
    await producer.create_producer(topic)
    sends = b"".join(encode_payload_frame(serialize_command(base_command("SEND", producer_id=0, sequence_id=n)),
                                          metadata("p", n), f"m{n}".encode()) for n in range(2))
    producer.send_raw(sends + broken)
    assert await producer.closed(), name
    reader = await connect(server.port)
    await reader.subscribe(topic, "check", permits=10)
    assert [(await reader.message())[1] for _ in range(2)] == [b"m0", b"m1"]


async def test_a_frame_split_into_single_bytes_is_reassembled(client: WireClient) -> None:
    for byte in frame("PING"):
        client.send_raw(bytes([byte]))
        await client.writer.drain()
    assert (await client.receive()).type == BaseCommand.PONG


async def test_many_commands_in_one_write_are_all_answered_in_order(client: WireClient) -> None:
    client.send_raw(b"".join(frame("LOOKUP", topic=f"t{i}", request_id=i) for i in range(50)))
    answers = [await client.expect("LOOKUP_RESPONSE") for _ in range(50)]
    assert [a.request_id for a in answers] == list(range(50))


async def test_stop_closes_connections_cleanly(connect: Connect, service: BrokerService) -> None:
    server = ProtocolServer(service, "127.0.0.1", 0)
    await server.start()
    client = await connect(server.port)
    await client.create_producer("persistent://public/default/stopping")
    client.send_payload("SEND", metadata(), b"in flight", producer_id=0, sequence_id=0)
    await client.writer.drain()
    await asyncio.sleep(0.05)
    await server.stop()
    # The send in flight was answered before the connection closed.
    receipt = await client.receive()
    assert receipt.type == BaseCommand.SEND_RECEIPT
    assert await client.closed()
    assert not server.connections
    with pytest.raises(RuntimeError):
        server.port
