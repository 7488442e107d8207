"""A split that fails midway (a parent's broker unreachable when it is to be sealed) is
completed in the background once that broker answers, and meanwhile does not keep consumers
from registering on the existing subscriptions. Found by an audit: the operation stayed pending
until the next admin call or a failover (its sealed parent holding up part of the key space),
and every request of the controller, consumer registrations included, failed while it did."""

from __future__ import annotations

import asyncio

import pytest

from pyengine.errors import ServiceNotReadyError
from pyengine.scalable.segments import LocalSegments
from pyengine.scalable.service import ScalableTopicService
from tests.scalable.conftest import SEGMENTS_BROKER_URL, TOPIC

PARENT = "segment://public/default/orders/0000-7fff-0"


class Unreachable(LocalSegments):
    """Segment operations whose sealing of `down` segments fails (their broker is away)."""

    down: set[str] = set()

    async def terminate(self, segment: str):
        if segment in self.down:
            raise ServiceNotReadyError(f"{segment}: its broker is unreachable")
        return await super().terminate(segment)


async def test_a_split_left_pending_completes_in_the_background(broker, store):
    segments = Unreachable(broker.service, SEGMENTS_BROKER_URL)
    service = await ScalableTopicService(store, segments, "pulsar://a:6650", session_ttl=0.5).start()
    try:
        await service.create_topic(TOPIC, 2)
        controller = await service.controller(TOPIC)
        await controller.create_subscription("s")
        Unreachable.down = {PARENT}
        # the terminate fails after the operation entered its sealing phase: only forward now
        with pytest.raises(ServiceNotReadyError):
            await service.split_segment(TOPIC, 0)
        assert (await service.resources.pending_operation(controller.topic)).phase == "sealing"
        # consumers of an existing subscription are served on the stored layout meanwhile
        assignment = await controller.register_consumer("s", "c1")
        assert assignment.layout_epoch == 0 and assignment.segment_ids == [0, 1]
        # a new operation waits for the pending one (it cannot start on an unsettled layout)
        with pytest.raises(ServiceNotReadyError):
            await service.split_segment(TOPIC, 1)
        Unreachable.down = set()                 # the broker is back: no admin call needed
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 10
        while (await service.resources.pending_operation(controller.topic)) is not None:
            assert loop.time() < deadline, "the pending split was never completed"
            await asyncio.sleep(0.05)
        layout = await service.get_layout(TOPIC)
        assert layout.epoch == 1 and sorted(s.segment_id for s in layout.active_segments) == [1, 2, 3]
        assert sorted(controller.subscriptions["s"].assignment_of("c1").segment_ids) == [1, 2, 3]
    finally:
        Unreachable.down = set()
        await service.close()
