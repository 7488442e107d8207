"""`leader(topic, timeout)` waits for this broker to lead across the end of its metadata session:
the controller it waited on is dropped with the session, and a new one (on a new session) stands.
Found by a CI flake: with a short session TTL, a stalled event loop expired the session while a
caller waited, and the caller waited on the dropped controller until its timeout ("leader: none
elected") although the broker came to lead at once."""

import asyncio

import pytest

from tests.scalable.conftest import TOPIC


@pytest.fixture
def session_ttl() -> float:
    """Short: these tests wait for a crashed broker's session to expire."""
    return 0.5


async def test_a_wait_for_the_leadership_outlives_the_session_it_began_on(services):
    gone = await services("gone")
    await gone.create_topic(TOPIC, 1)
    await gone.leader(TOPIC, timeout=5)
    a = await services("a")
    assert not (await a.controller(TOPIC)).is_leader           # following "gone"
    gone.crash()                                               # its record expires after its TTL
    a._session.abandon()                                       # and so does a's session, with its controller
    loop = asyncio.get_running_loop()
    began = loop.time()
    controller = await a.leader(TOPIC, timeout=5)
    assert controller.is_leader and loop.time() - began < 4
    await controller.create_subscription("s")
