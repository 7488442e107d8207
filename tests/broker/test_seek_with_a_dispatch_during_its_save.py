"""A dispatch pass that runs while a seek's cursor save is under way (a FLOW, a new entry, an
ack wakes the dispatcher) must not lose what it delivers. The cursor moves in memory at once;
the dispatcher was reset only once the save was done: the pass in between delivered from the
new position, then the reset dropped those deliveries from the consumer (its queue, or its
connection) and from its pending acks, with the cursor's read position already past them - the
messages were never delivered again (until a restart)."""

from __future__ import annotations

import asyncio

from pyengine.broker import Broker
from pyengine.broker.embedded import MessageId
from tests.broker.helpers import GatedWriter, drain

T = "persistent://public/default/seek-with-a-dispatch-during-its-save"


async def test_a_pass_during_the_seeks_save_loses_nothing(tmp_path):
    async with Broker.embedded(tmp_path, sync=False) as broker:
        producer = await broker.create_producer(T)
        for i in range(3):
            await producer.send(b"m%d" % i)
        consumer = await broker.subscribe(T, "s", initial_position="earliest")
        for message in await drain(consumer):
            await consumer.acknowledge(message)
        subscription = broker.service.topics[T].subscriptions["s"]
        await broker.service.env.barrier()
        gate = GatedWriter(broker.service.env)
        try:
            seeking = asyncio.ensure_future(consumer.seek(MessageId.earliest))
            await gate.next_commit()                    # the cursor's save is held
            subscription.flow(subscription.consumers[0], 10)     # a FLOW meanwhile: a pass runs
            await asyncio.sleep(0)
        finally:
            gate.open()
        await seeking
        assert [m.data for m in await drain(consumer)] == [b"m0", b"m1", b"m2"]
