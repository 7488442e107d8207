"""GET .../{topic}/messageid/{timestamp}, as Pulsar's getMessageIdByTimestamp: the id of the
first message published at or after a time; 404 when none was, 405 on a partitioned topic's
base name; and `pyengine admin topics get-message-id -d`."""

from __future__ import annotations

import asyncio
import datetime
import time

import pytest

from pyengine.cli import main

P = "/admin/v2/persistent/public/default"
TOPIC = "persistent://public/default/timed"


async def published(client, count: int) -> list[tuple[int, int, int]]:
    """Send `count` messages a few ms apart: [(ledger id, entry id, a time just before it)]."""
    producer = await client.create_producer(TOPIC)
    sent = []
    for i in range(count):
        before = int(time.time() * 1000)
        await asyncio.sleep(0.005)
        message_id = await producer.send(f"m{i}".encode())
        sent.append((message_id.ledger_id, message_id.entry_id, before))
        await asyncio.sleep(0.005)
    await producer.close()
    return sent


async def test_the_first_message_published_at_or_after_a_time(api, client):
    sent = await published(client, 3)
    for ledger_id, entry_id, before in sent:
        reply = await api.get(f"{P}/timed/messageid/{before}")
        assert reply.body == {"ledgerId": ledger_id, "entryId": entry_id, "partitionIndex": -1}
    assert (await api.get(f"{P}/timed/messageid/0")).body["entryId"] == sent[0][1]
    later = await api.get(f"{P}/timed/messageid/{int(time.time() * 1000) + 60_000}")
    assert (later.status, later.body["reason"]) == (404, "Message ID not found")


async def test_partitions_give_their_index_and_the_partitioned_base_is_405(api, client):
    assert (await api.put(f"{P}/parted/partitions", 2)).status == 204
    producer = await client.create_producer("persistent://public/default/parted-partition-1")
    await producer.send(b"x")
    reply = await api.get(f"{P}/parted-partition-1/messageid/0")
    assert reply.status == 200 and reply.body["partitionIndex"] == 1
    assert (await api.get(f"{P}/parted/messageid/0")).status == 405


@pytest.mark.parametrize(("path", "status"), [("nope/messageid/0", 404), ("timed/messageid/-1", 400),
                                              ("timed/messageid/soon", 400),
                                              ("timed/messageid/99999999999999999999", 400)])
async def test_bad_requests(api, client, path, status):
    await published(client, 1)
    reply = await api.get(f"{P}/{path}")
    assert reply.status == status and "reason" in reply.body


async def test_cli(client, server, capsys):
    (ledger_id, entry_id, before), = await published(client, 1)
    iso = datetime.datetime.fromtimestamp(before / 1000, datetime.timezone.utc).isoformat()
    for when in (str(before), iso.replace("+00:00", "Z")):
        status = await asyncio.to_thread(main, ["admin", "--url", server.url, "topics", "get-message-id", TOPIC,
                                                "-d", when])
        out, _ = capsys.readouterr()
        assert status == 0 and f'"entryId": {entry_id}' in out, when


@pytest.mark.parametrize("when", ["yesterday", "1969-12-31T00:00:00Z", ""])
def test_cli_refuses_bad_times(when):
    with pytest.raises(SystemExit):
        main(["admin", "topics", "get-message-id", TOPIC, "-d", when])
