"""A stream consumer's name is held by the connection it is registered on while that connection
answers (found by an audit). Before, a second registration of the same name on another
connection took the session over at once; refused by the segments the first consumer still
read, it then unregistered the session, and the first consumer, never told, kept reading its
old segments: after a split, the keys of the new segments were read by nobody. Now the second
is refused with ConsumerBusy (as Apache refuses a second exclusive consumer) unless the first
connection stays silent to a PING, which is then closed and the session moves (a restarted
process's reconnect)."""

from __future__ import annotations

import asyncio

import pytest

from pyengine.client import Client
from pyengine.errors import ConsumerBusyError
from tests.scalable.conftest import TOPIC


async def drain(consumer, timeout: float = 1.5) -> list[str]:
    got = []
    try:
        while True:
            message = await consumer.receive(timeout)
            got.append(message.data.decode())
            await consumer.acknowledge(message)
    except (TimeoutError, asyncio.TimeoutError):
        return got


async def test_a_second_registration_of_a_live_name_is_refused_and_the_first_keeps_following(
        client, service, server) -> None:
    scalable = await service.scalable_topics()
    await scalable.create_topic(TOPIC, 2)
    first = await client.subscribe_stream(TOPIC, "ordered", "c1")
    async with Client(f"pulsar://127.0.0.1:{server.port}", operation_timeout_seconds=3) as other:
        with pytest.raises(ConsumerBusyError, match="connected on another connection"):
            await other.subscribe_stream(TOPIC, "ordered", "c1")
    controller = await scalable.leader(TOPIC)
    registration = controller.subscriptions["ordered"].consumers["c1"]
    assert registration.connected
    stored = await scalable.resources.consumers(controller.topic, "ordered")
    assert [record.consumer_name for record in stored] == ["c1"]

    layout = await scalable.split_segment(TOPIC, 0)
    for _ in range(100):
        if sorted(first.assigned) == sorted(s.segment_id for s in layout.active_segments):
            break
        await asyncio.sleep(0.05)
    assert sorted(first.assigned) == sorted(s.segment_id for s in layout.active_segments)
    producer = await client.create_producer(TOPIC)
    keys = [f"k{i}" for i in range(30)]
    for key in keys:
        await producer.send(key.encode(), key=key)
    assert sorted(await drain(first)) == sorted(keys)


async def test_a_silent_holder_is_closed_and_the_session_moves(services) -> None:
    service = await services("a", grace_period=5)
    await service.create_topic(TOPIC, 2)
    controller = await service.controller(TOPIC)
    checks: list[str] = []

    def liveness(name: str, answers: bool):
        async def alive() -> bool:
            checks.append(name)
            return answers
        return alive

    pushed_to_first: list = []
    first = await controller.register_consumer("s", "c1", 1, pushed_to_first.append, liveness("first", True))
    with pytest.raises(ConsumerBusyError):                  # the first one answers: refused
        await controller.register_consumer("s", "c1", 2, lambda _: None, liveness("second", True))
    coordinator = controller.subscriptions["s"]
    assert coordinator.consumers["c1"].on_assignment == pushed_to_first.append
    assert checks == ["first"]

    coordinator.consumers["c1"].alive = liveness("first-gone-silent", False)
    pushed_to_third: list = []
    third = await controller.register_consumer("s", "c1", 3, pushed_to_third.append, liveness("third", True))
    assert checks == ["first", "first-gone-silent"]
    assert third.segment_ids == first.segment_ids          # the same session, the same segments
    assert coordinator.consumers["c1"].on_assignment == pushed_to_third.append
    # the first connection's late disconnect leaves the moved session alone
    controller.consumer_disconnected("s", "c1", pushed_to_first.append)
    assert coordinator.consumers["c1"].connected


async def test_a_reconnect_after_the_disconnect_needs_no_check(services) -> None:
    service = await services("a", grace_period=5)
    await service.create_topic(TOPIC, 2)
    controller = await service.controller(TOPIC)

    async def never_called() -> bool:
        raise AssertionError("a disconnected session is resumed without a liveness check")

    listener = lambda _: None        # noqa: E731
    await controller.register_consumer("s", "c1", 1, listener, never_called)
    controller.consumer_disconnected("s", "c1", listener)
    resumed = await controller.register_consumer("s", "c1", 2, lambda _: None, never_called)
    assert resumed.segment_ids
