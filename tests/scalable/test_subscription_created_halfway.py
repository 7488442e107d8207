"""A subscription whose creation failed on one segment (its broker unreachable for that call) is
stored, and retried only on the active segments. Found by an audit: a split of that segment
before the retry sealed it without the subscription's cursor, and then — its backlog on the
subscription read as none — handed the children out at once: the subscription never read the
parent's messages, which a creation without the failure reads first (its cursors at Earliest)."""

from __future__ import annotations

from pyengine.errors import ServiceNotReadyError
from tests.broker.helpers import drain
from tests.scalable.conftest import TOPIC

SECOND = "segment://public/default/orders/8000-ffff-1"


async def test_a_split_gives_its_parent_the_cursor_a_failed_creation_left_out(broker, services, monkeypatch):
    a = await services("a")
    await a.create_topic(TOPIC, 2)
    controller = await a.controller(TOPIC)
    producer = await broker.create_producer(SECOND)
    for i in range(3):
        await producer.send(f"m{i}".encode(), key=f"k{i}")

    create_subscription, failures = a.segments.create_subscription, [SECOND]

    async def unreachable_once(segment, subscription):
        if segment in failures:
            failures.remove(segment)
            raise ServiceNotReadyError(f"{segment}: its broker is unreachable (once)")
        return await create_subscription(segment, subscription)
    monkeypatch.setattr(a.segments, "create_subscription", unreachable_once)
    try:
        await controller.create_subscription("s")
    except ServiceNotReadyError:
        pass
    assert not failures and "s" in await a.resources.subscriptions(controller.topic)

    await controller.split_segment(1)
    # the parent, with its backlog, is read before its children (as without the failure)
    assignment = await controller.register_consumer("s", "c1")
    assert sorted(assignment.segment_ids) == [0, 1]
    consumer = await broker.subscribe(SECOND, "s", initial_position="latest")
    assert [m.data for m in await drain(consumer)] == [b"m0", b"m1", b"m2"]
    await consumer.close()
