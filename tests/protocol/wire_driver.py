"""A raw Pulsar-protocol client for tests: frames from `core_ext.frames`, commands from
`pyengine.protocol.commands`, nothing else between the test and the server's bytes."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from core_ext.frames import FrameDecoder, encode_command, encode_payload_frame
from pyengine.protocol import pulsar_api_pb2 as pb
from pyengine.protocol.commands import BODY_FIELD, base_command, message_metadata, parse_command, \
    serialize_command

BaseCommand = pb.BaseCommand
U64 = 1 << 64


def frame(type_: int | str, **fields: Any) -> bytes:
    return encode_command(serialize_command(base_command(type_, **fields)))


def metadata(producer_name: str = "p", sequence_id: int = 0, publish_time: int | None = None,
             **fields: Any) -> bytes:
    if publish_time is None:
        publish_time = int(time.time() * 1000)
    return message_metadata(producer_name, sequence_id, publish_time, **fields).SerializeToString()


class Closed(Exception):
    """The server closed the connection."""


class WireClient:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.decoder = FrameDecoder()
        self.pending: list[tuple[pb.BaseCommand, Any]] = []
        self.pings = 0

    @classmethod
    async def connect(cls, port: int, *, handshake: bool = True) -> WireClient:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        client = cls(reader, writer)
        if handshake:
            connected = await client.request("CONNECT", client_version="wire-driver", protocol_version=20)
            assert connected.server_version
        return client

    # --- sending ----------------------------------------------------------------------------

    def send_raw(self, data: bytes) -> None:
        self.writer.write(data)

    def send(self, type_: int | str, **fields: Any) -> None:
        self.send_raw(frame(type_, **fields))

    def send_payload(self, type_: int | str, meta: bytes, payload: bytes, **fields: Any) -> None:
        command = serialize_command(base_command(type_, **fields))
        self.send_raw(encode_payload_frame(command, meta, payload))

    # --- receiving --------------------------------------------------------------------------

    async def receive_command(self, timeout: float = 5.0, *, answer_pings: bool = True) -> tuple[pb.BaseCommand, Any]:
        """The next command from the server with its frame (PINGs are answered and skipped
        unless `answer_pings` is False). Raises Closed at EOF."""
        deadline = asyncio.get_running_loop().time() + timeout
        while True:
            while self.pending:
                cmd, raw = self.pending.pop(0)
                if cmd.type == BaseCommand.PING and answer_pings:
                    self.pings += 1
                    self.send("PONG")
                    continue
                return cmd, raw
            remaining = deadline - asyncio.get_running_loop().time()
            if remaining <= 0:
                raise TimeoutError("no command from the server")
            data = await asyncio.wait_for(self.reader.read(1 << 20), remaining)
            if not data:
                raise Closed()
            self.pending.extend((parse_command(f.command), f) for f in self.decoder.feed(data))

    async def receive(self, timeout: float = 5.0, **kwargs: Any) -> Any:
        cmd, _ = await self.receive_command(timeout, **kwargs)
        return cmd

    async def expect(self, type_name: str, timeout: float = 5.0) -> Any:
        """The body of the next command, which must be `type_name`."""
        cmd = await self.receive(timeout)
        name = BaseCommand.Type.Name(cmd.type)
        assert name == type_name, f"expected {type_name}, got {name}: {cmd}"
        return getattr(cmd, BODY_FIELD[cmd.type])

    async def request(self, type_: str, timeout: float = 5.0, **fields: Any) -> Any:
        """Send a command and return the body of the next command received."""
        self.send(type_, **fields)
        cmd = await self.receive(timeout)
        return getattr(cmd, BODY_FIELD[cmd.type])

    async def closed(self, timeout: float = 5.0) -> bool:
        """True once the server has closed the connection (False if it stays open)."""
        try:
            while True:
                await self.receive(timeout)
        except Closed:
            return True
        except TimeoutError:
            return False
        except ConnectionError:
            return True

    async def no_command(self, timeout: float = 0.3) -> None:
        """Assert that nothing (but PINGs) arrives for `timeout` seconds."""
        try:
            cmd = await self.receive(timeout)
        except TimeoutError:
            return
        raise AssertionError(f"unexpected command {cmd}")

    async def close(self) -> None:
        self.writer.close()
        try:
            await self.writer.wait_closed()
        except ConnectionError:
            pass

    # --- conveniences -----------------------------------------------------------------------

    async def create_producer(self, topic: str, producer_id: int = 0, request_id: int = 0, **fields: Any) -> Any:
        reply = await self.request("PRODUCER", topic=topic, producer_id=producer_id, request_id=request_id, **fields)
        return reply

    async def publish(self, producer_id: int, sequence_id: int, payload: bytes, *, producer_name: str = "p",
                      meta_fields: dict[str, Any] | None = None, **fields: Any) -> Any:
        meta = metadata(producer_name, sequence_id, **(meta_fields or {}))
        self.send_payload("SEND", meta, payload, producer_id=producer_id, sequence_id=sequence_id, **fields)
        return await self.receive()

    async def subscribe(self, topic: str, subscription: str, consumer_id: int = 0, request_id: int = 0, *,
                        sub_type: int = pb.CommandSubscribe.Exclusive, earliest: bool = True,
                        permits: int = 0, **fields: Any) -> Any:
        reply = await self.request(
            "SUBSCRIBE", topic=topic, subscription=subscription, subType=sub_type, consumer_id=consumer_id,
            request_id=request_id,
            initialPosition=pb.CommandSubscribe.Earliest if earliest else pb.CommandSubscribe.Latest, **fields)
        if permits:
            self.send("FLOW", consumer_id=consumer_id, messagePermits=permits)
        return reply

    async def message(self, timeout: float = 5.0) -> tuple[Any, bytes]:
        """The next MESSAGE: (its command body, the entry bytes after the command)."""
        cmd, raw = await self.receive_command(timeout)
        assert cmd.type == BaseCommand.MESSAGE, f"expected MESSAGE, got {cmd}"
        return cmd.message, raw.payload
