"""Findings of a review of the broker's side of a wire connection (pyengine/protocol:
teardown, flow control, keep-alive), each pinned by a test that failed on the code as
reviewed."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from pyengine.broker.service import BrokerService
from pyengine.protocol import pulsar_api_pb2 as pb
from pyengine.protocol.server import ProtocolServer
from tests.protocol.wire_driver import BaseCommand, WireClient, frame, metadata

Connect = Callable[..., Awaitable[WireClient]]
TOPIC = "persistent://public/default/wire-connection-review"


async def test_a_huge_flow_to_a_client_that_does_not_read_buffers_a_bounded_amount(
        server: ProtocolServer, client: WireClient, connect: Connect) -> None:
    """A consumer gave 2^32-1 permits and then read nothing: the dispatcher's pass read the
    whole backlog at once and wrote it all to the connection (its writability was never
    asked), so the broker held every byte of the backlog in memory for a client that did not
    take them (Pulsar dispatches to a consumer only while its channel is writable)."""
    entries, size = 800, 20_000                 # 16 MB of backlog
    await client.create_producer(TOPIC, producer_id=1, request_id=1)
    for sequence_id in range(entries):
        client.send_payload("SEND", metadata("p", sequence_id), b"x" * size, producer_id=1, sequence_id=sequence_id)
    for _ in range(entries):
        assert (await client.receive()).type == BaseCommand.SEND_RECEIPT
    reader = await connect(server.port)
    await reader.subscribe(TOPIC, "s", consumer_id=1, request_id=2)
    connection = next(c for c in server.connections if c.consumers)
    reader.send("FLOW", consumer_id=1, messagePermits=(1 << 32) - 1)
    await asyncio.sleep(0.5)
    buffered = connection.transport.get_write_buffer_size()
    assert buffered < 6_000_000, f"{buffered} bytes buffered for a client that reads nothing"
    # Once the client reads, everything comes, in order.
    ids = []
    for _ in range(entries):
        message, _ = await reader.message()
        ids.append((message.message_id.ledgerId, message.message_id.entryId))
    assert ids == sorted(set(ids))


async def test_a_connection_trickling_bytes_that_never_make_a_connect_is_closed(
        service: BrokerService, connect: Connect) -> None:
    """A peer that sends a byte of a frame now and then but never a whole CONNECT: each byte
    counted as heard, so the keep-alive never closed it, and it held its connection (and a
    decoder buffer that may grow to the frame limit) for as long as it kept trickling.
    Pulsar's keep-alive closes a connection whose handshake is not done at its first timeout."""
    server = ProtocolServer(service, "127.0.0.1", 0, keepalive_interval=0.2)
    await server.start()
    try:
        slow = await connect(server.port, handshake=False)
        connect_frame = frame("CONNECT", client_version="slow", protocol_version=20)
        closed = False
        for byte in connect_frame[:-1]:             # never the last byte
            slow.send_raw(bytes([byte]))
            try:
                await asyncio.wait_for(slow.reader.read(1 << 16), 0.05)
            except TimeoutError:
                continue
            except ConnectionError:
                pass
            closed = True                           # EOF (the server sends nothing before CONNECTED)
            break
        assert closed, f"still open after {len(connect_frame) * 0.05:.1f} s without a CONNECT"
    finally:
        await server.stop()


async def test_a_reader_refused_when_it_comes_back_after_its_seek_leaves_no_subscription_for_good(
        server: ProtocolServer, service: BrokerService, client: WireClient) -> None:
    """A non-durable subscription moved by a seek is kept for its consumer's return. When that
    SUBSCRIBE was refused by the kept subscription (here: Sticky hash ranges that are not
    valid), the subscription had been taken out of the kept ones and was left on the topic
    with no consumer and no timer: never dropped, its cursor held for as long as the topic
    stayed loaded. It is kept again (its grace restarts), so a retry still finds it."""
    topic_name = TOPIC + "-kept-reader"
    await client.create_producer(topic_name, producer_id=1, request_id=1)
    await client.publish(1, 0, b"m")
    sticky = pb.KeySharedMeta(keySharedMode=pb.STICKY, hashRanges=[pb.IntRange(start=0, end=65535)])
    reply = await client.subscribe(topic_name, "nd", consumer_id=1, request_id=2, durable=False,
                                   sub_type=pb.CommandSubscribe.Key_Shared, keySharedMeta=sticky)
    assert isinstance(reply, pb.CommandSuccess), reply
    client.send("SEEK", consumer_id=1, request_id=3, message_publish_time=0)
    assert (await client.receive()).type == BaseCommand.CLOSE_CONSUMER
    assert (await client.expect("SUCCESS")).request_id == 3
    await asyncio.sleep(0.05)
    assert (topic_name, "nd") in server._kept_readers
    bad = pb.KeySharedMeta(keySharedMode=pb.STICKY, hashRanges=[pb.IntRange(start=10, end=5)])
    reply = await client.subscribe(topic_name, "nd", consumer_id=2, request_id=4, durable=False,
                                   sub_type=pb.CommandSubscribe.Key_Shared, keySharedMeta=bad)
    assert reply.error == pb.ConsumerAssignError, reply
    topic = await service.get_topic(topic_name)
    reader = topic._named_readers.get("nd")
    assert reader is None or (topic_name, "nd") in server._kept_readers, \
        "a reader's subscription with no consumer, neither kept nor dropped"
    # The retry with valid ranges finds the moved subscription.
    reply = await client.subscribe(topic_name, "nd", consumer_id=3, request_id=5, durable=False,
                                   sub_type=pb.CommandSubscribe.Key_Shared, keySharedMeta=sticky)
    assert isinstance(reply, pb.CommandSuccess), reply
    assert topic._named_readers.get("nd") is reader
