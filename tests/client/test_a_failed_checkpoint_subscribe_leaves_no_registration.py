"""subscribe_checkpoint() that fails after its registration was accepted (its segments cannot
be read) unregisters from the controller, as subscribe_stream() does. Before, it closed only
the DAG watch: the controller kept the consumer's session connected, holding its segments from
the subscription's other consumers until the connection closed."""

from __future__ import annotations

import asyncio

import pytest

from pyengine.client import Client
from pyengine.client.errors import PulsarError
from pyengine.client.scalable import CheckpointConsumer

T = "topic://public/default/failed-checkpoint-subscribe"


async def test_a_checkpoint_consumer_that_cannot_read_its_segments_unregisters(broker, monkeypatch):
    broker.service.service_url = broker.url          # as `pyengine serve` sets it
    scalable = await broker.service.scalable_topics()
    await scalable.create_topic(T, 2)

    async def unreadable(consumer, assignment, *, strict=False):
        raise PulsarError("the segments cannot be read")
    monkeypatch.setattr(CheckpointConsumer, "_apply", unreadable)
    async with Client(broker.url, operation_timeout_seconds=10) as client:
        with pytest.raises(PulsarError, match="cannot be read"):
            await client.subscribe_checkpoint(T, "s", "c1")
        controller = await scalable.leader(T)
        for _ in range(100):                          # the unregistration is one command away
            if "c1" not in controller.subscriptions["s"].consumers:
                break
            await asyncio.sleep(0.01)
        assert "c1" not in controller.subscriptions["s"].consumers
