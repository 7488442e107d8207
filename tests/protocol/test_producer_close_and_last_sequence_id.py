"""A producer of the same name, created again, continues after every sequence id the broker
accepted, as Pulsar (PRODUCER_SUCCESS.last_sequence_id is getLastPublishedSequenceId, the
highest pushed, and CLOSE_PRODUCER is answered once the producer's sends are stored). Found by
an audit with de-duplication on: send_async(m1), close(), create the producer again, send(m2)
lost m2, which got m1's sequence id and was dropped as its duplicate."""

from __future__ import annotations

import pytest

from pyengine.broker.service import BrokerConfig, BrokerService
from pyengine.protocol.server import ProtocolServer
from tests.broker.helpers import GatedWriter
from tests.protocol.wire_driver import WireClient, metadata

TOPIC = "persistent://public/default/last-sequence"


@pytest.fixture
async def dedup_server(tmp_path):
    service = BrokerService(BrokerConfig(data_dir=tmp_path, sync=False, num_coordinators=1,
                                         deduplication_enabled=True))
    await service.start()
    server = ProtocolServer(service, "127.0.0.1", 0)
    await server.start()
    yield service, server
    await server.stop()
    await service.close()


def send(client: WireClient, sequence_id: int) -> None:
    client.send_payload("SEND", metadata("X", sequence_id), b"m%d" % sequence_id, producer_id=0,
                        sequence_id=sequence_id)


async def test_close_is_answered_once_the_sends_are_stored(dedup_server):
    service, server = dedup_server
    client = await WireClient.connect(server.port)
    assert (await client.create_producer(TOPIC, producer_name="X")).last_sequence_id == -1
    send(client, 0)
    assert (await client.expect("SEND_RECEIPT")).sequence_id == 0
    gate = GatedWriter(service.env)
    try:
        send(client, 1)
        await gate.next_commit()                           # its group commit is held
        client.send("CLOSE_PRODUCER", producer_id=0, request_id=1)
        with pytest.raises(TimeoutError):
            await client.receive(timeout=0.3)              # not answered while m1 is written
    finally:
        gate.open()
    assert (await client.expect("SEND_RECEIPT")).sequence_id == 1
    assert (await client.expect("SUCCESS")).request_id == 1
    other = await WireClient.connect(server.port)
    again = await other.create_producer(TOPIC, producer_name="X")
    assert again.last_sequence_id == 1
    await client.close()
    await other.close()


async def test_a_producer_back_after_its_connection_dropped_continues_after_a_send_being_written(dedup_server):
    service, server = dedup_server
    client = await WireClient.connect(server.port)
    await client.create_producer(TOPIC, producer_name="X")
    gate = GatedWriter(service.env)
    try:
        send(client, 0)
        await gate.next_commit()
        await client.close()                               # gone with m0 being written
        other = await WireClient.connect(server.port)
        again = await other.create_producer(TOPIC, producer_name="X")
        assert again.last_sequence_id == 0                 # accepted, not yet stored
    finally:
        gate.open()
    other.send_payload("SEND", metadata("X", 1), b"m1", producer_id=0, sequence_id=1)
    receipt = await other.expect("SEND_RECEIPT")
    assert receipt.sequence_id == 1 and receipt.message_id.entryId == 1     # stored after m0
    await other.close()
