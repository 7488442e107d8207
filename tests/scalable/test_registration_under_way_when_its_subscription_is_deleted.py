"""A consumer registration still under way when its subscription is deleted leaves no record.

The deletion unregisters the subscription's consumers, closes its coordinator and deletes the
records, while the leader still leads: its guard lets the leader's writes through. A
registration whose consumer record was being written meanwhile (the coordinator's close did not
wait for it) created the record after the deletion had removed the others: a phantom session,
which the subscription created again under the name restored, keeping segments from its
consumers for a grace period; and the registration failed with a KeyError. Now the deletion
waits for the work under way, which writes nothing more once the coordinator is closed, and
the registration fails as its consumer was told: SubscriptionNotFoundError."""

from __future__ import annotations

import asyncio

from pyengine.errors import SubscriptionNotFoundError
from tests.scalable.conftest import TOPIC


class HeldSave:
    """The resources' save_consumer of consumer `name` is held until `land` is set."""

    def __init__(self, resources, name: str):
        self.original = resources.save_consumer
        self.name = name
        self.sent, self.land = asyncio.Event(), asyncio.Event()
        resources.save_consumer = self

    async def __call__(self, topic, subscription, record, **kwargs):
        if record.consumer_name == self.name:
            self.sent.set()
            await self.land.wait()
        return await self.original(topic, subscription, record, **kwargs)


async def test_a_consumer_record_being_written_during_the_deletion_goes_with_the_subscription(services):
    service = await services("a", grace_period=30)
    await service.create_topic(TOPIC, 2)
    controller = await service.controller(TOPIC)
    await controller.register_consumer("s", "c1", 1, lambda a: None)
    held = HeldSave(service.resources, "c2")
    registering = asyncio.ensure_future(controller.register_consumer("s", "c2", 2, lambda a: None))
    await held.sent.wait()
    deletion = asyncio.ensure_future(controller.delete_subscription("s"))
    await asyncio.sleep(0.05)
    held.land.set()
    await deletion
    (registered,) = await asyncio.gather(registering, return_exceptions=True)
    assert await service.resources.consumers(controller.topic, "s") == []
    assert isinstance(registered, SubscriptionNotFoundError), registered
    # The subscription created again under the name has no phantom session holding segments.
    assert (await controller.register_consumer("s", "c3", 3, lambda a: None)).segment_ids == [0, 1]
