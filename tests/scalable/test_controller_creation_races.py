"""The creation of a topic's controller, shared by the requests that ask for it at once, against
a cancelled first request and a service closing meanwhile. Found by an audit: the creation ran
in the first request's await, so cancelling that request (its connection closed) cancelled the
creation under the others, which ended with CancelledError though nobody cancelled them; and a
controller whose creation ended after the service closed was kept, standing for election (and
taking over) for a broker that is gone."""

from __future__ import annotations

import asyncio

import pytest

from pyengine.errors import NotAllowedError
from tests.scalable.conftest import TOPIC


def hold(service, method: str = "load") -> tuple[asyncio.Event, asyncio.Event]:
    """The controller's first call of `service.resources.method` waits for `go` (`reached`
    once it does): "load" before it stands for election, "subscription_states" once elected."""
    original, reached, go = getattr(service.resources, method), asyncio.Event(), asyncio.Event()

    async def held(*args, **kwargs):
        reached.set()
        await go.wait()
        return await original(*args, **kwargs)
    setattr(service.resources, method, held)
    return reached, go


async def test_a_cancelled_first_request_does_not_cancel_the_creation_under_the_others(services):
    service = await services("a")
    await service.create_topic(TOPIC, 1)
    reached, go = hold(service)
    first = asyncio.ensure_future(service.controller(TOPIC))
    await asyncio.wait_for(reached.wait(), 2)
    second = asyncio.ensure_future(service.controller(TOPIC))
    await asyncio.sleep(0)
    first.cancel()
    await asyncio.sleep(0)
    go.set()
    controller = await asyncio.wait_for(second, 2)
    assert first.cancelled()
    assert service.controllers[str(controller.topic)] is controller
    await controller.wait_leading(2)


@pytest.mark.parametrize("step", ["load", "subscription_states"])
async def test_a_controller_created_while_the_service_closes_is_not_kept(services, step):
    service = await services("a")
    await service.create_topic(TOPIC, 1)
    reached, go = hold(service, step)
    creating = asyncio.ensure_future(service.controller(TOPIC))
    await asyncio.wait_for(reached.wait(), 2)
    closing = asyncio.ensure_future(service.close())
    await asyncio.sleep(0)
    go.set()
    with pytest.raises(NotAllowedError):
        await asyncio.wait_for(creating, 2)
    await asyncio.wait_for(closing, 2)
    assert service.controllers == {}
    assert await service.leader_url(TOPIC) is None      # it resigned: no leader for a closed broker


async def test_a_controller_created_while_its_topic_is_released_is_not_kept(services):
    """A release (the topic's deletion) while the controller is being created: the creation
    ended after it and its controller was kept, standing for election for a deleted topic."""
    service = await services("a")
    await service.create_topic(TOPIC, 1)
    reached, go = hold(service)
    creating = asyncio.ensure_future(service.controller(TOPIC))
    await asyncio.wait_for(reached.wait(), 2)
    releasing = asyncio.ensure_future(service.release(TOPIC, deleted=True))
    await asyncio.sleep(0)
    go.set()
    controller = await asyncio.wait_for(creating, 2)
    await asyncio.wait_for(releasing, 2)
    assert str(controller.topic) not in service.controllers
    assert controller._closed
