"""A close() whose caller is cancelled (a timeout around it, a shutdown) still closes, to the
end: the consumer's waiting receives end with AlreadyClosedError, the producer's flush goes on
and the broker-side producer or consumer is closed; a second close() waits for that same close
(found by an audit: the consumer stayed CLOSING, its receives waiting for ever, and the producer
stayed open on the broker, every later close doing nothing)."""

from __future__ import annotations

import asyncio

import pytest

from pyengine.client import AlreadyClosedError
from pyengine.client.handler import CLOSED
from pyengine.protocol import pulsar_api_pb2 as pb
from tests.client.conftest import answer_late, consumers_on_broker, producers_on_broker

T = pb.BaseCommand
TOPIC = "persistent://public/default/cancelled-close"


async def close_cut_short(closable) -> None:
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(closable.close(), 0.1)


async def test_a_cancelled_consumer_close_ends_its_receives_and_closes_it(broker, client, monkeypatch):
    consumer = await client.subscribe(TOPIC, "s")
    waiting = asyncio.ensure_future(consumer.receive())
    await asyncio.sleep(0.05)
    answer_late(monkeypatch, 1.0, lambda cmd: cmd.type == T.CLOSE_CONSUMER)
    await close_cut_short(consumer)
    with pytest.raises(AlreadyClosedError):
        await asyncio.wait_for(waiting, 1)
    with pytest.raises(AlreadyClosedError):
        await consumer.receive(timeout=1)
    await asyncio.wait_for(consumer.close(), 2)                     # waits for the same close
    assert [h.state for h in consumer._handlers.values()] == [CLOSED]
    assert consumers_on_broker(broker, TOPIC) == 0 and consumer not in client._core.open_objects
    await client.subscribe(TOPIC, "s")                       # exclusive: nobody holds it


async def test_a_producer_close_cancelled_while_flushing_still_closes_it(broker, client):
    producer = await client.create_producer(TOPIC, producer_name="named")
    partition = producer._partitions[0]
    receipts: list = []
    take_receipt, partition.on_send_receipt = partition.on_send_receipt, receipts.append
    sending = asyncio.ensure_future(producer.send(b"x"))
    await asyncio.sleep(0.05)
    await close_cut_short(producer)
    partition.on_send_receipt = take_receipt
    for receipt in receipts:
        take_receipt(receipt)
    assert (await asyncio.wait_for(sending, 2)).entry_id == 0     # flushed by the close going on
    await asyncio.wait_for(producer.close(), 2)
    assert partition.state == CLOSED and producers_on_broker(broker, TOPIC) == 0
    assert producer not in client._core.open_objects
    await client.create_producer(TOPIC, producer_name="named")      # the name is free


async def test_a_producer_close_cancelled_while_the_broker_answers_still_closes_it(broker, client, monkeypatch):
    producer = await client.create_producer(TOPIC, producer_name="named")
    answer_late(monkeypatch, 0.5, lambda cmd: cmd.type == T.CLOSE_PRODUCER)
    await close_cut_short(producer)
    await asyncio.wait_for(producer.close(), 2)                     # waits for the same close
    assert producer._partitions[0].state == CLOSED and producers_on_broker(broker, TOPIC) == 0
    monkeypatch.undo()
    await client.create_producer(TOPIC, producer_name="named")
