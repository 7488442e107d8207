"""Client.close() closes its producers and consumers together, as the Java and C++ clients
do (closeAsync gathers every producer's and consumer's close). Found by an audit: they were
closed one after the other, each waiting up to the operation timeout for a broker that does
not answer its CLOSE_PRODUCER / CLOSE_CONSUMER, so closing a client of N producers took N
operation timeouts (N x 30 s at the defaults)."""

from __future__ import annotations

import asyncio

from pyengine.client import Client
from pyengine.client.connection import ClientConnection
from pyengine.protocol import pulsar_api_pb2 as pb
from tests.client.conftest import answer_late

CLOSES = (pb.BaseCommand.CLOSE_PRODUCER, pb.BaseCommand.CLOSE_CONSUMER)


async def test_close_requests_of_every_producer_and_consumer_are_under_way_together(broker, monkeypatch):
    client = Client(broker.url, operation_timeout_seconds=5)
    producers = [await client.create_producer(f"persistent://public/default/close-together-{i}") for i in range(3)]
    consumers = [await client.subscribe(f"persistent://public/default/close-together-{i}", "s") for i in range(2)]
    # a slow broker: each close is answered 0.2 s after it was asked
    answer_late(monkeypatch, 0.2, lambda cmd: cmd.type in CLOSES)
    in_flight = 0
    most = 0
    send_request = ClientConnection.send_request      # (answer_late's wrapper)

    def counting(connection, cmd):
        nonlocal in_flight, most
        future = send_request(connection, cmd)
        if cmd.type in CLOSES:
            in_flight += 1
            most = max(most, in_flight)

            def settled(_):
                nonlocal in_flight
                in_flight -= 1
            future.add_done_callback(settled)
        return future
    monkeypatch.setattr(ClientConnection, "send_request", counting)
    await client.close()
    assert most == len(producers) + len(consumers), f"at most {most} closes were under way at once"
    assert all(p._closed for p in producers) and all(c._closed for c in consumers)
