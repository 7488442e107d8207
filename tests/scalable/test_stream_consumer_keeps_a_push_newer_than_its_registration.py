"""A StreamConsumer applies the controller's assignments in the order they arrive. Its
registration answer and a push that follows it (another consumer registering at once: a
rebalance of the same layout epoch) can arrive in one read; the push's apply task then ran
before the registering task resumed, and the registration's older answer, of the same epoch,
was applied over it: the consumer read the segments it had just been told to give up, so
two consumers claimed one segment (the other refused with ConsumerBusy) and the consumer
did not read what it was assigned."""

from __future__ import annotations

import asyncio

import pytest

from pyengine.client.scalable import StreamConsumer

T = "topic://public/default/orders"


@pytest.fixture
def operation_timeout() -> float:
    return 2


async def test_a_push_after_the_registration_answer_is_not_undone_by_it(client, service, monkeypatch):
    scalable = await service.scalable_topics()
    await scalable.create_topic(T, 2)
    apply = StreamConsumer._apply
    answered = asyncio.Event()
    pushed = asyncio.Event()

    async def slow_to_resume(self, assignment, **kwargs):
        if self.consumer_name == "b":
            if kwargs.get("strict"):
                # the registering task resumes only after the push that followed its answer
                answered.set()
                await asyncio.wait_for(pushed.wait(), 5)
            else:
                await apply(self, assignment, **kwargs)
                pushed.set()
                return
        await apply(self, assignment, **kwargs)
    monkeypatch.setattr(StreamConsumer, "_apply", slow_to_resume)

    registering = asyncio.create_task(client.subscribe_stream(T, "s", "b"))   # answered [0, 1]
    await asyncio.wait_for(answered.wait(), 5)
    a = await client.subscribe_stream(T, "s", "a")         # b is pushed [1] (same epoch), a gets [0]
    b = await registering
    assert a.assigned == [0]
    assert b.assigned == [1], "the registration's older answer was applied over the push"
    await a.close()
    await b.close()
