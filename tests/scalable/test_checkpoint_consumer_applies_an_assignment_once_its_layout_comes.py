"""A CheckpointConsumer applies an assignment once the DAG watch brings its layout, however
late that comes."""

from __future__ import annotations

import asyncio

import pytest

from pyengine.scalable import key_hash

T = "topic://public/default/orders"


@pytest.fixture
def operation_timeout() -> float:
    return 1


async def test_an_assignment_ahead_of_a_late_layout_is_applied_when_it_comes(client, service):
    """The controller pushed the assignment of a split (its children) before the consumer's
    DAG watch brought the new layout, and the layout came more than the operation timeout
    later (a watch re-opening): _apply's wait raised TimeoutError in its task, and the
    assignment was never applied. The consumer kept the sealed parent for good and never
    read the children: what was sent to them was never received."""
    scalable = await service.scalable_topics()
    await scalable.create_topic(T, 1)
    consumer = await client.subscribe_checkpoint(T, "cp", "a")
    assert consumer.assigned == [0]
    watch = consumer.watch
    connection, session_id = watch._connection, watch._session_id
    deliver = connection.dag_sessions[session_id]
    held = []
    connection.dag_sessions[session_id] = held.append          # the watch's updates held back
    await scalable.split_segment(T, 0)
    await asyncio.sleep(3)                                      # past the operation timeout, twice
    assert held and consumer.assigned == [0]                    # waiting for the layout
    connection.dag_sessions[session_id] = deliver
    for update in held:
        deliver(update)
    for _ in range(100):
        if sorted(consumer.assigned) == [1, 2]:
            break
        await asyncio.sleep(0.02)
    assert sorted(consumer.assigned) == [1, 2]
    producer = await client.create_producer(T)
    sid, _ = await producer.send(b"after", key="k")
    assert sid == (1 if key_hash("k") <= 0x7FFF else 2)
    assert (await consumer.receive(5)).data == b"after"
    await producer.close()
    await consumer.close()
