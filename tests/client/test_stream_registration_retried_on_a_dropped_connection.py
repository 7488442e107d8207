"""A StreamConsumer's (CheckpointConsumer's) registration with the controller whose connection
drops before the answer is sent again at once on a new connection, within the same operation
timeout, as a Consumer's subscribe is (found by an audit). Before, the registration waited for
its answer on a future nothing failed when the connection dropped, while the close started a
second registration beside it: subscribe_stream() failed only at the operation timeout, though
the second one had registered; and a Client.close() meanwhile made it wait the operation timeout
too, then fail with TimeoutError instead of AlreadyClosedError."""

from __future__ import annotations

import asyncio

import pytest

from pyengine.client import Client
from pyengine.client.errors import AlreadyClosedError
from pyengine.protocol.scalable import ScalableTopicCommands

T = "topic://public/default/registration-drop"
OPERATION_TIMEOUT = 10
PROMPTLY = 3                    # well within the operation timeout


@pytest.fixture
async def scalable(broker):
    broker.service.service_url = broker.url          # as `pyengine serve` sets it
    service = await broker.service.scalable_topics()
    await service.create_topic(T, 2)
    return service


def hold_first_registration(monkeypatch) -> tuple[list[str], asyncio.Event]:
    """The broker leaves the first SCALABLE_CONSUMER_REGISTER it gets unanswered (a slow
    controller); the event is set when it came. The list: every registration that came."""
    came: list[str] = []
    held = asyncio.Event()
    register = ScalableTopicCommands.register_consumer

    async def registering(commands, body) -> None:
        came.append(body.consumer_name)
        if len(came) == 1:
            held.set()
            return
        await register(commands, body)
    monkeypatch.setattr(ScalableTopicCommands, "register_consumer", registering)
    return came, held


async def subscribe(client: Client, kind: str):
    if kind == "stream":
        return await client.subscribe_stream(T, "s", "c1")
    return await client.subscribe_checkpoint(T, "s", "c1")


@pytest.mark.parametrize("kind", ["stream", "checkpoint"])
async def test_a_registration_whose_connection_drops_is_sent_again_at_once(broker, scalable, monkeypatch, kind):
    came, held = hold_first_registration(monkeypatch)
    async with Client(broker.url, operation_timeout_seconds=OPERATION_TIMEOUT) as client:
        subscribing = asyncio.ensure_future(subscribe(client, kind))
        await asyncio.wait_for(held.wait(), 5)
        for connection in client._core.pool.connections():
            connection.close()                  # the controller's connection drops, unanswered
        done, _ = await asyncio.wait([subscribing], timeout=PROMPTLY)
        assert done, "subscribe still waiting for the answer on the dropped connection"
        consumer = subscribing.result()

        layout = await scalable.get_layout(T)
        assert sorted(consumer.assigned) == sorted(s.segment_id for s in layout.active_segments)
        await asyncio.sleep(0.3)                # (a stray second registration would come by now)
        assert came == ["c1", "c1"]             # the held one, then exactly one on the new connection
        controller = await scalable.leader(T)
        registrations = controller.subscriptions["s"].consumers
        assert list(registrations) == ["c1"] and registrations["c1"].connected
        assert [r.consumer_name for r in await scalable.resources.consumers(controller.topic, "s")] == ["c1"]

        producer = await client.create_producer(T)
        keys = [f"k{i}" for i in range(10)]
        for key in keys:
            await producer.send(key.encode(), key=key)
        got = [(await consumer.receive(5)).data.decode() for _ in keys]
        assert sorted(got) == sorted(keys)


@pytest.mark.parametrize("kind", ["stream", "checkpoint"])
async def test_a_close_during_registration_fails_the_subscribe_at_once(broker, scalable, monkeypatch, kind):
    came, held = hold_first_registration(monkeypatch)
    client = Client(broker.url, operation_timeout_seconds=OPERATION_TIMEOUT)
    subscribing = asyncio.ensure_future(subscribe(client, kind))
    await asyncio.wait_for(held.wait(), 5)
    await client.close()
    done, _ = await asyncio.wait([subscribing], timeout=PROMPTLY)
    assert done, "subscribe still waiting after Client.close()"
    with pytest.raises(AlreadyClosedError):
        subscribing.result()
    await asyncio.sleep(0.3)
    assert came == ["c1"]                       # not registered again after the close
    controller = await scalable.leader(T)
    assert "c1" not in getattr(controller.subscriptions.get("s"), "consumers", {})
