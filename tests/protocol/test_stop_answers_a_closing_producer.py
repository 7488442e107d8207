"""Stopping the server lets every send in flight be stored and answered before the
connections close, also the sends of a producer its client is closing (CLOSE_PRODUCER waits
for them, as Pulsar's): before, stop waited only for the producers still open, and the
closing one's receipts and its close's SUCCESS were dropped with the connection."""

from __future__ import annotations

import asyncio

import pytest

from pyengine.broker.service import BrokerService
from pyengine.protocol.server import ProtocolServer
from tests.protocol.stalled_storage import StalledPublishes
from tests.protocol.wire_driver import BaseCommand, Closed, WireClient, metadata

TOPIC = "persistent://public/default/stop-with-a-closing-producer"


async def test_stop_answers_the_sends_and_the_close_of_a_closing_producer(
        service: BrokerService, monkeypatch: pytest.MonkeyPatch) -> None:
    server = ProtocolServer(service, "127.0.0.1", 0)
    await server.start()
    client = await WireClient.connect(server.port)
    try:
        await client.create_producer(TOPIC)
        stalled = StalledPublishes(await service.get_topic(TOPIC), monkeypatch)
        client.send_payload("SEND", metadata("p", 0), b"in flight", producer_id=0, sequence_id=0)
        client.send("CLOSE_PRODUCER", producer_id=0, request_id=1)
        with pytest.raises(TimeoutError):
            await client.receive(0.2)           # the close waits for the send
        assert len(stalled) == 1
        stopping = asyncio.create_task(server.stop())
        await asyncio.sleep(0.05)               # stop is under way, waiting for the send
        await stalled.release()
        await asyncio.wait_for(stopping, 5)
        answers = []
        try:
            while True:
                answers.append(BaseCommand.Type.Name((await client.receive(1.0)).type))
        except (Closed, ConnectionError, TimeoutError):
            pass
        assert answers == ["SEND_RECEIPT", "SUCCESS"]
    finally:
        await client.close()
        await server.stop()
