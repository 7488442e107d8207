"""ScalableProducer: a send that meets its segment producer's full queue holds its key's turn
until it is queued there (so the key's next sends do not overtake it); the key's next sends
waiting behind it then wait as sends blocked by a full queue do, without a deadline (the send
timeout bounds the waits for draining segments only; the operation timeout none)."""

from __future__ import annotations

import asyncio

import pytest

from tests.scalable.test_producer_key_order_across_splits import (
    T, HeldAnswers, read_in_lineage_order, segment_producer,
)


@pytest.fixture
def operation_timeout() -> float:
    return 0.5


async def test_sends_behind_a_full_queue_wait_past_the_operation_timeout_in_order(client, service):
    scalable = await service.scalable_topics()
    await scalable.create_topic(T, 1)
    producer = await client.create_producer(T, max_pending_messages=1)
    await producer.send(b"0", key="k")
    answers = HeldAnswers(segment_producer(producer, 0))
    sends = [asyncio.create_task(producer.send(str(i).encode(), key="k")) for i in (1, 2, 3)]
    await answers.wait_for(1)                     # "1" queued, its receipt held: the queue is full
    await asyncio.sleep(0.8)                      # longer than the operation timeout
    assert not any(send.done() for send in sends)
    answers.release()
    results = await asyncio.wait_for(asyncio.gather(*sends), 5)
    ids = [message_id for _, message_id in results]
    assert ids == sorted(ids)
    assert [data for key, data in await read_in_lineage_order(client, producer) if key == "k"] == ["0", "1", "2", "3"]
    assert not producer._waiting
    await producer.close()
