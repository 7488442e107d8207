"""A close (CLOSE_PRODUCER, SCALABLE_CONSUMER_UNREGISTER) or a second request for the same id
that reaches the broker while a creation is still waiting on storage or on the controller: what
the creation then makes is discarded, so nothing is left holding a topic, a consumer name or
segments for a client that believes it closed it (Apache's ServerCnx: "closed before creation
was complete"). Each slow step is gated so that the interleaving is certain."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from pyengine.broker.service import BrokerService
from pyengine.protocol import pulsar_api_pb2 as pb
from pyengine.protocol.access_modes import TOPIC_EPOCH_PROPERTY
from pyengine.protocol.server import ProtocolServer
from pyengine.scalable.watch import DagWatchSession
from tests.protocol.wire_driver import BaseCommand, WireClient

Connect = Callable[..., Awaitable[WireClient]]
TOPIC = "persistent://public/default/closed-while-creation-awaits"
SCALABLE = "topic://public/default/closed-while-registering"


async def test_a_producer_closed_while_its_topic_epoch_is_stored_does_not_hold_the_topic(
        service: BrokerService, server: ProtocolServer, client: WireClient, connect: Connect,
        monkeypatch: pytest.MonkeyPatch) -> None:
    topic = await service.get_topic(TOPIC)
    storing, stored = asyncio.Event(), asyncio.Event()
    set_property = topic.ledger.set_property

    async def gated_set_property(key: str, value: str) -> None:
        if key == TOPIC_EPOCH_PROPERTY:
            storing.set()
            await stored.wait()
        await set_property(key, value)

    monkeypatch.setattr(topic.ledger, "set_property", gated_set_property)
    client.send("PRODUCER", topic=TOPIC, producer_id=0, request_id=1, producer_access_mode=pb.Exclusive)
    await asyncio.wait_for(storing.wait(), 5)
    # The client gives up on it while its grant is being stored.
    assert isinstance(await client.request("CLOSE_PRODUCER", producer_id=0, request_id=2), pb.CommandSuccess)
    stored.set()
    answer = await client.receive()
    assert BaseCommand.Type.Name(answer.type) == "ERROR", answer
    # The topic is not held exclusively by a producer its client closed.
    other = await connect(server.port)
    reply = await other.create_producer(TOPIC, producer_access_mode=pb.Exclusive)
    assert isinstance(reply, pb.CommandProducerSuccess), reply


async def _registrations(service: BrokerService) -> list[tuple[str, bool]]:
    controller = await (await service.scalable_topics()).leader(SCALABLE)
    subscriptions = (await controller.stats())["subscriptions"]
    return [(c["consumerName"], c["connected"]) for c in subscriptions.get("s", {}).get("consumers", [])]


async def _eventually(check: Callable[[], Awaitable[Any]], expected: Any) -> Any:
    for _ in range(100):
        seen = await check()
        if seen == expected:
            break
        await asyncio.sleep(0.02)
    return seen


async def test_a_consumer_unregistered_while_registering_is_not_left_registered(
        service: BrokerService, server: ProtocolServer, connect: Connect, monkeypatch: pytest.MonkeyPatch) -> None:
    scalable = await service.scalable_topics()
    await scalable.create_topic(SCALABLE, 2)
    controller = await scalable.leader(SCALABLE)
    registering, proceed = asyncio.Event(), asyncio.Event()
    register = controller.register_consumer

    async def gated_register(*args: Any, **kwargs: Any) -> Any:
        registering.set()
        await proceed.wait()
        return await register(*args, **kwargs)

    monkeypatch.setattr(controller, "register_consumer", gated_register)
    one = await connect(server.port)
    one.send("SCALABLE_CONSUMER_REGISTER", request_id=1, consumer_id=1, topic=SCALABLE, subscription="s",
             consumer_name="c1")
    await asyncio.wait_for(registering.wait(), 5)
    # The client gives up (its operation timeout, or close()) and says so.
    one.send("SCALABLE_CONSUMER_UNREGISTER", consumer_id=1)
    await asyncio.sleep(0.05)
    proceed.set()
    answer = await one.expect("SCALABLE_CONSUMER_ASSIGNMENT")
    # Nothing of it stays: not while the connection lasts, nor after it.
    assert await _eventually(lambda: _registrations(service), []) == []
    await one.close()
    await asyncio.sleep(0.05)
    assert await _registrations(service) == []
    assert answer.request_id == 1 and answer.HasField("error"), answer


async def test_a_second_registration_of_an_id_being_registered_is_refused(
        service: BrokerService, server: ProtocolServer, connect: Connect, monkeypatch: pytest.MonkeyPatch) -> None:
    scalable = await service.scalable_topics()
    await scalable.create_topic(SCALABLE, 2)
    await scalable.leader(SCALABLE)
    asked, proceed = asyncio.Event(), asyncio.Event()
    leader = scalable.leader

    async def gated_leader(*args: Any, **kwargs: Any) -> Any:
        asked.set()
        await proceed.wait()
        return await leader(*args, **kwargs)

    monkeypatch.setattr(scalable, "leader", gated_leader)
    one = await connect(server.port)
    one.send("SCALABLE_CONSUMER_REGISTER", request_id=1, consumer_id=1, topic=SCALABLE, subscription="s",
             consumer_name="c1")
    await asyncio.wait_for(asked.wait(), 5)
    one.send("SCALABLE_CONSUMER_REGISTER", request_id=2, consumer_id=1, topic=SCALABLE, subscription="s",
             consumer_name="c2")
    await asyncio.sleep(0.05)
    proceed.set()
    answers = {}
    while len(answers) < 2:
        answer = await one.expect("SCALABLE_CONSUMER_ASSIGNMENT")
        if answer.HasField("request_id"):
            answers[answer.request_id] = answer
    monkeypatch.undo()
    # Closing the connection disconnects what it registered (its grace period starts).
    await one.close()
    assert await _eventually(lambda: _registrations(service), [("c1", False)]) == [("c1", False)]
    assert not answers[1].HasField("error"), answers[1]
    assert answers[2].error == pb.NotAllowedError, answers[2]


async def test_a_watch_session_closed_and_opened_again_while_opening_leaves_no_watch_behind(
        service: BrokerService, server: ProtocolServer, connect: Connect, monkeypatch: pytest.MonkeyPatch) -> None:
    scalable = await service.scalable_topics()
    await scalable.create_topic(SCALABLE)
    watches = len(service.metadata._watches)
    first_starting, first_may_start = asyncio.Event(), asyncio.Event()
    start = DagWatchSession.start

    async def gated_start(session: DagWatchSession) -> None:
        if not first_starting.is_set():         # only the first session waits
            first_starting.set()
            await first_may_start.wait()
        await start(session)

    monkeypatch.setattr(DagWatchSession, "start", gated_start)
    one = await connect(server.port)
    one.send("SCALABLE_TOPIC_LOOKUP", session_id=7, topic=SCALABLE)
    await asyncio.wait_for(first_starting.wait(), 5)
    # Closed while opening, and the id opened again: only the second session is the client's.
    one.send("SCALABLE_TOPIC_CLOSE", session_id=7)
    one.send("SCALABLE_TOPIC_LOOKUP", session_id=7, topic=SCALABLE)
    assert not (await one.expect("SCALABLE_TOPIC_UPDATE")).HasField("error")
    first_may_start.set()
    await asyncio.sleep(0.1)
    # Closing the connection closes every watch it opened.
    await one.close()
    for _ in range(100):
        if len(service.metadata._watches) <= watches:
            break
        await asyncio.sleep(0.02)
    assert len(service.metadata._watches) == watches
