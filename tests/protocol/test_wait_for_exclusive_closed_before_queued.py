"""A WaitForExclusive producer closed by its client (CLOSE_PRODUCER), or whose connection
drops, while its topic and schema are still being looked up, i.e. before it joins the topic's
queue: it must never join it. A producer queued for nobody makes every Shared producer of the
topic ProducerBusy for as long as the producers already there stay, and its client, which
closed it, would be told PRODUCER_SUCCESS(ready=false)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from pyengine.broker.service import BrokerService
from pyengine.protocol import pulsar_api_pb2 as pb
from pyengine.protocol.server import ProtocolServer
from tests.protocol.wire_driver import BaseCommand, WireClient

Connect = Callable[..., Awaitable[WireClient]]
TOPIC = "persistent://public/default/wait-for-exclusive-closed-before-queued"


def _gate_schema_lookup(service: BrokerService, monkeypatch: pytest.MonkeyPatch) -> tuple[asyncio.Event, asyncio.Event]:
    """The next producer's schema lookup waits for `proceed` (`reached` says it is there)."""
    reached, proceed = asyncio.Event(), asyncio.Event()
    for_producer = service.schemas.for_producer

    async def gated(*args: Any, **kwargs: Any) -> Any:
        if not reached.is_set():
            reached.set()
            await proceed.wait()
        return await for_producer(*args, **kwargs)

    monkeypatch.setattr(service.schemas, "for_producer", gated)
    return reached, proceed


async def test_a_waiting_producer_closed_before_it_is_queued_never_blocks_shared_producers(
        service: BrokerService, server: ProtocolServer, client: WireClient, connect: Connect,
        monkeypatch: pytest.MonkeyPatch) -> None:
    assert isinstance(await client.create_producer(TOPIC, producer_id=0, request_id=1), pb.CommandProducerSuccess)
    reached, proceed = _gate_schema_lookup(service, monkeypatch)
    other = await connect(server.port)
    other.send("PRODUCER", topic=TOPIC, producer_id=1, request_id=1, producer_access_mode=pb.WaitForExclusive)
    await asyncio.wait_for(reached.wait(), 5)
    assert isinstance(await other.request("CLOSE_PRODUCER", producer_id=1, request_id=2), pb.CommandSuccess)
    proceed.set()
    answer = await other.receive()
    assert BaseCommand.Type.Name(answer.type) == "ERROR" and answer.error.request_id == 1, answer
    # The topic's shared producers are not held off by a producer queued for nobody.
    reply = await client.create_producer(TOPIC, producer_id=2, request_id=2)
    assert isinstance(reply, pb.CommandProducerSuccess), reply


async def test_a_waiting_producer_whose_connection_dropped_before_it_is_queued_never_blocks_shared_producers(
        service: BrokerService, server: ProtocolServer, client: WireClient, connect: Connect,
        monkeypatch: pytest.MonkeyPatch) -> None:
    assert isinstance(await client.create_producer(TOPIC, producer_id=0, request_id=1), pb.CommandProducerSuccess)
    reached, proceed = _gate_schema_lookup(service, monkeypatch)
    other = await connect(server.port)
    other.send("PRODUCER", topic=TOPIC, producer_id=1, request_id=1, producer_access_mode=pb.WaitForExclusive)
    await asyncio.wait_for(reached.wait(), 5)
    await other.close()
    for _ in range(100):                        # the broker sees the connection go
        if len(server.connections) == 1:
            break
        await asyncio.sleep(0.01)
    assert len(server.connections) == 1
    proceed.set()
    reply = await client.create_producer(TOPIC, producer_id=2, request_id=2)
    assert isinstance(reply, pb.CommandProducerSuccess), reply


async def test_a_waiting_producer_fenced_in_the_turn_it_gets_the_topic_is_answered(
        server: ProtocolServer, client: WireClient, connect: Connect) -> None:
    """Granted the topic, then fenced by an ExclusiveWithFencing producer before its creation
    resumes: it is not a producer of its connection yet, so no CLOSE_PRODUCER tells the client;
    its PRODUCER request must be answered, or the client (told "queued") waits for ever."""
    assert isinstance(await client.create_producer(TOPIC, producer_access_mode=pb.Exclusive),
                      pb.CommandProducerSuccess)
    waiter = await connect(server.port)
    queued = await waiter.create_producer(TOPIC, producer_id=3, request_id=9, producer_access_mode=pb.WaitForExclusive)
    assert isinstance(queued, pb.CommandProducerSuccess) and not queued.producer_ready
    (holder,) = [p for c in server.connections for p in c.producers.values()]
    # In one turn: the holder leaves (the waiter is granted the topic) and a fencing producer
    # takes it (as when both frames are read before the waiter's creation runs again).
    holder.connection.producers.pop(holder.producer_id)
    server.detach_producer(holder)
    fencer = object()
    server.access.acquire(TOPIC, fencer, pb.ExclusiveWithFencing, None, server.fence_producer)
    try:
        answer = await waiter.receive()
        assert BaseCommand.Type.Name(answer.type) == "ERROR" and answer.error.request_id == 9, answer
    finally:
        server.access.release(TOPIC, fencer)
