"""A Client.close() whose caller is cancelled (a timeout around it, a shutdown) still closes
the client to the end, and a second close() waits for that close, as a producer's or a
consumer's close does. Found by an audit: the cancel stopped it half-way (the connections and
the coordinators left open, PINGing the broker), and every later close() returned at once,
doing nothing, since the client counted as closed already."""

from __future__ import annotations

import asyncio

import pytest

from pyengine.client import Client
from pyengine.client.handler import CLOSED
from pyengine.protocol import pulsar_api_pb2 as pb
from tests.client.conftest import answer_late, producers_on_broker

TOPIC = "persistent://public/default/cancelled-client-close"


async def test_a_cancelled_client_close_finishes_and_a_second_close_waits_for_it(broker, monkeypatch):
    client = Client(broker.url, operation_timeout_seconds=5)
    producer = await client.create_producer(TOPIC)
    txn = await client.new_transaction()
    await txn.commit()                                   # the coordinators are connected
    answer_late(monkeypatch, 0.3, lambda cmd: cmd.type == pb.BaseCommand.CLOSE_PRODUCER)
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(client.close(), 0.05)     # cut short while the producer closes
    await client.close()                                 # waits for the first close to end
    assert producer._closed and producers_on_broker(broker, TOPIC) == 0
    assert client._core.pool.connections() == []
    assert all(h.state == CLOSED for h in client._core.coordinator._handlers.values())
