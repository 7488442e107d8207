"""The last message id a read-compacted reader is given (GET_LAST_MESSAGE_ID) never names a
chunk of a chunked message still incomplete at the compaction horizon: the view keeps such
chunks (the rest, after the horizon, completes the message), but no reader can ever receive
the message they begin, so `has_message_available` would stay true with nothing to read."""

from __future__ import annotations

import pytest

from pyengine.broker import compaction as compaction_module
from pyengine.broker.embedded import EmbeddedClient
from pyengine.client import Client
from pyengine.client.message import MessageId
from tests.broker.test_compaction_txn_and_chunks import send_chunk
from tests.client.conftest import NetworkBroker

TOPIC = "persistent://public/default/compacted-last-id"


@pytest.fixture
async def network(tmp_path):
    """A broker on the network, a client of it, and an embedded client of the same service
    (to publish chunks one by one)."""
    network_broker = NetworkBroker(tmp_path / "data")
    await network_broker.start()
    embedded = EmbeddedClient(network_broker.service)
    try:
        async with Client(network_broker.url, operation_timeout_seconds=10) as client:
            yield network_broker, client, embedded
    finally:
        await embedded.close()
        await network_broker.stop()


async def compacted(network_broker) -> None:
    compaction = network_broker.service.topics[TOPIC].compaction
    compaction.trigger()
    await compaction.wait()
    assert compaction.status_json()["status"] == "SUCCESS"


async def read_all(client) -> tuple[list[bytes], MessageId]:
    """What a read-compacted reader from the earliest reads while it is told more is
    available, and the last message id it is given."""
    reader = await client.create_reader(TOPIC, MessageId.earliest, read_compacted=True)
    try:
        got = []
        while await reader.has_message_available():
            got.append((await reader.read_next(1)).data)
        return got, await reader.get_last_message_id()
    finally:
        await reader.close()


@pytest.mark.parametrize("scan_chunk", [16, 1])
async def test_the_last_message_id_is_the_last_whole_message_of_the_view(network, monkeypatch, scan_chunk):
    network_broker, client, embedded = network
    monkeypatch.setattr(compaction_module, "LAST_MESSAGE_SCAN_CHUNK", scan_chunk)   # one read, or many
    producer = await embedded.create_producer(TOPIC)
    await send_chunk(embedded, producer, "a", "u1", 0, 2, b"a1-0")
    await send_chunk(embedded, producer, "a", "u1", 1, 2, b"a1-1")            # a whole chunked message
    b1 = await producer.send(b"b1", key="b")
    await send_chunk(embedded, producer, "c", "u2", 0, 3, b"c1-0")
    await send_chunk(embedded, producer, "c", "u2", 1, 3, b"c1-1")            # its last chunk is to come
    await compacted(network_broker)
    got, last = await read_all(client)
    assert got == [b"a1-0a1-1", b"b1"]
    assert (last.ledger_id, last.entry_id) == (b1.ledger_id, b1.entry_id)


async def test_a_whole_chunked_message_ends_the_view_after_an_incomplete_one(network):
    network_broker, client, embedded = network
    producer = await embedded.create_producer(TOPIC)
    await send_chunk(embedded, producer, "c", "u2", 0, 3, b"c1-0")            # incomplete
    await send_chunk(embedded, producer, "a", "u1", 0, 2, b"a1-0")
    await send_chunk(embedded, producer, "c", "u2", 1, 3, b"c1-1")
    a1 = await send_chunk(embedded, producer, "a", "u1", 1, 2, b"a1-1")        # whole
    await compacted(network_broker)
    got, last = await read_all(client)
    assert got == [b"a1-0a1-1"]
    assert (last.ledger_id, last.entry_id) == (a1.ledger_id, a1.entry_id)


async def test_a_view_of_incomplete_chunks_only_has_no_last_message(network):
    network_broker, client, embedded = network
    producer = await embedded.create_producer(TOPIC)
    await send_chunk(embedded, producer, "c", "u2", 0, 2, b"c1-0")
    await compacted(network_broker)
    got, last = await read_all(client)
    assert got == [] and last.entry_id == -1
    # Its last chunk comes: the message is after the horizon, read from the ledger.
    c1 = await send_chunk(embedded, producer, "c", "u2", 1, 2, b"c1-1")
    got, last = await read_all(client)
    assert got == [b"c1-0c1-1"]
    assert (last.ledger_id, last.entry_id) == (c1.ledger_id, c1.entry_id)
