"""Expire by message id (`POST .../subscription/{sub}/expireMessages` with a MessageIdImpl /
ResetCursorData body) as Pulsar's PersistentTopicsBase.internalExpireMessagesByPosition and
PersistentMessageExpiryMonitor.expireMessages(Position) answer it: 409 for an id never issued
(beyond the last entry, latest too) and nothing expired; 405 on a partitioned topic (before
looking at the subscription); 412 for an id of another partition (an absent partitionIndex is
not checked); an id in a ledger that does not exist (or past its ledger's end) expires up to
the newest entry before it. Where Pulsar expires more than asked for (a batch index expires
its whole batch; isExcluded one entry more) nothing past the id is expired here. Malformed
bodies get 400 (Pulsar: 500 without a body, 0 for a missing field)."""

from __future__ import annotations

from types import SimpleNamespace

import aiohttp
import pytest

from pyengine.admin import AdminServer
from pyengine.broker.embedded import EmbeddedClient
from pyengine.broker.service import BrokerConfig, BrokerService
from pyengine.storage import ManagedLedgerConfig
from tests.admin.conftest import Api
from tests.admin.helpers import drain
from tests.broker.test_compaction import send_batch

P = "/admin/v2/persistent/public/default"
T = "persistent://public/default/"
INT64_MAX = 2**63 - 1


async def published(client, topic: str, count: int) -> list:
    producer = await client.create_producer(T + topic)
    ids = [await producer.send(b"m%d" % i) for i in range(count)]
    await producer.close()
    return ids


async def backlog(api, topic: str) -> int:
    return (await api.get(f"{P}/{topic}/stats")).body["subscriptions"]["s"]["msgBacklog"]


async def received(client, topic: str) -> list[bytes]:
    consumer = await client.subscribe(T + topic, "s")
    messages = await drain(consumer)
    await consumer.close()
    return [m.data for m in messages]


def message_id(mid, **more) -> dict:
    return {"ledgerId": mid.ledger_id, "entryId": mid.entry_id, **more}


async def subscribed_at_earliest(api, topic: str) -> None:
    assert (await api.put(f"{P}/{topic}/subscription/s", {"ledgerId": -1, "entryId": -1})).status == 204


async def test_an_id_beyond_the_last_entry_is_not_issued(api, client):
    ids = await published(client, "b", 3)
    await subscribed_at_earliest(api, "b")
    for beyond in (message_id(ids[2], entryId=ids[2].entry_id + 1),
                   message_id(ids[2], ledgerId=ids[2].ledger_id + 5, entryId=0),
                   {"ledgerId": INT64_MAX, "entryId": INT64_MAX},                  # latest
                   message_id(ids[2], entryId=ids[2].entry_id + 1, isExcluded=True)):
        reply = await api.post(f"{P}/b/subscription/s/expireMessages", beyond)
        assert reply.status == 409, (beyond, reply)
        assert reply.body["reason"] == (f"Expire message by position not issued on topic {T}b for subscription s "
                                        "due to ongoing message expiration not finished or invalid message "
                                        "position provided.")
        assert await backlog(api, "b") == 3                                      # nothing expired
    assert (await api.post(f"{P}/b/subscription/s/expireMessages", message_id(ids[2]))).status == 204
    assert await backlog(api, "b") == 0


async def test_isexcluded_on_the_last_entry_expires_the_ones_before(api, client):
    ids = await published(client, "x", 3)
    await subscribed_at_earliest(api, "x")
    reply = await api.post(f"{P}/x/subscription/s/expireMessages", message_id(ids[2], isExcluded=True))
    assert reply.status == 204
    assert await received(client, "x") == [b"m2"]


async def test_earliest_and_ids_before_the_first_entry_expire_nothing(api, client):
    ids = await published(client, "e", 2)
    await subscribed_at_earliest(api, "e")
    for before in ({"ledgerId": -1, "entryId": -1}, {"ledgerId": -1, "entryId": -1, "isExcluded": True},
                   message_id(ids[0], isExcluded=True), message_id(ids[0], entryId=-1),
                   {"ledgerId": 0, "entryId": 0, "batchIndex": 0}):
        assert (await api.post(f"{P}/e/subscription/s/expireMessages", before)).status == 204, before
        assert await backlog(api, "e") == 2
    stats = (await api.get(f"{P}/e/stats")).body["subscriptions"]["s"]
    assert stats["lastExpireTimestamp"] > 0 and stats["totalMsgExpired"] == 0


@pytest.fixture
async def small_ledgers(tmp_path):
    """An admin API over a broker whose ledgers roll over every 2 entries."""
    config = BrokerConfig(data_dir=tmp_path / "data", sync=False, ledger=ManagedLedgerConfig(max_entries_per_ledger=2))
    service = BrokerService(config)
    await service.start()
    admin = AdminServer(service, port=0)
    await admin.start()
    client = EmbeddedClient(service)
    async with aiohttp.ClientSession() as session:
        yield Api(session, admin.url), client, service
    await client.close()
    await admin.stop()
    await service.close()


async def test_ids_in_ledgers_that_do_not_exist(small_ledgers):
    api, client, service = small_ledgers
    ids = []
    for _ in range(3):             # another topic's ledgers between this one's: ids no ledger of it has
        ids += await published(client, "l", 2)
        await published(client, "other", 2)
    ledgers = sorted({mid.ledger_id for mid in ids})
    assert len(ledgers) == 3 and ledgers[1] - ledgers[0] > 1, ids
    await subscribed_at_earliest(api, "l")
    cursor = service.topics[T + "l"].subscriptions["s"].cursor
    expire = f"{P}/l/subscription/s/expireMessages"
    # Past the end of its ledger: up to the ledger's last entry, not to a position no entry holds.
    assert (await api.post(expire, {"ledgerId": ledgers[0], "entryId": 50})).status == 204
    assert str(cursor.mark_delete) == f"{ledgers[0]}:1"
    assert await backlog(api, "l") == 4
    # A ledger id between two of the topic's: up to the entries before it.
    assert (await api.post(expire, {"ledgerId": ledgers[2] - 1, "entryId": 7})).status == 204
    assert str(cursor.mark_delete) == f"{ledgers[1]}:1"
    assert await backlog(api, "l") == 2
    # A ledger after the last one: never issued.
    reply = await api.post(expire, {"ledgerId": ledgers[2] + 1000, "entryId": 0})
    assert reply.status == 409 and "not issued" in reply.body["reason"]
    assert await backlog(api, "l") == 2
    assert await received(client, "l") == [b"m0", b"m1"]


async def test_partitioned_topic_and_partition_index(api, client):
    await api.put(f"{P}/pt/partitions", 2)
    ids = await published(client, "pt-partition-1", 2)
    # 405 on the partitioned topic, whether the subscription exists or not (Pulsar checks first).
    for sub in ("s", "nope"):
        reply = await api.post(f"{P}/pt/subscription/{sub}/expireMessages", message_id(ids[0]))
        assert reply.status == 405, reply
        assert reply.body["reason"] == "Expire message at position is not supported for partitioned-topic"
    await api.put(f"{P}/pt-partition-1/subscription/s", {"ledgerId": -1, "entryId": -1})
    mismatch = ("Invalid parameter for expire message by position, partition index of passed in message "
                "position doesn't match partition index for the topic")
    for index in (0, -1, -7):
        body = message_id(ids[0], partitionIndex=index)
        reply = await api.post(f"{P}/pt-partition-1/subscription/s/expireMessages", body)
        assert reply.status == 412 and reply.body["reason"] == mismatch, (index, reply)
    assert await backlog(api, "pt-partition-1") == 2
    body = message_id(ids[0], partitionIndex=1)
    assert (await api.post(f"{P}/pt-partition-1/subscription/s/expireMessages", body)).status == 204
    assert await backlog(api, "pt-partition-1") == 1
    # Without one it is not checked (Pulsar reads -1 there, and refuses it on a partition).
    assert (await api.post(f"{P}/pt-partition-1/subscription/s/expireMessages", message_id(ids[1]))).status == 204
    assert await backlog(api, "pt-partition-1") == 0
    # On a topic that is not a partition the index must be -1 (or absent).
    await published(client, "np", 1)
    await api.put(f"{P}/np/subscription/s", {"ledgerId": -1, "entryId": -1})
    reply = await api.post(f"{P}/np/subscription/s/expireMessages", {"ledgerId": 0, "entryId": 0, "partitionIndex": 0})
    assert reply.status == 412


async def test_a_batch_index_expires_nothing_past_it(api, client, service):
    producer = await client.create_producer(T + "batch")
    await producer.send(b"single")
    batch = await send_batch(SimpleNamespace(service=service), producer, [(None, b"b0"), (None, b"b1"), (None, b"b2")])
    await producer.send(b"after")
    await producer.close()
    await subscribed_at_earliest(api, "batch")
    at = {"ledgerId": batch.ledger_id, "entryId": batch.entry_id}
    # Up to b1 (or up to before b2, or b0 excluded): the batch's entry stays whole, b2 with it;
    # what is before it is expired.
    for body in ({**at, "batchIndex": 1}, {**at, "batchIndex": 2, "isExcluded": True}, {**at, "batchIndex": 0}):
        assert (await api.post(f"{P}/batch/subscription/s/expireMessages", body)).status == 204, body
        assert await backlog(api, "batch") == 2, body
    # Up to its last message: the whole entry.
    assert (await api.post(f"{P}/batch/subscription/s/expireMessages", {**at, "batchIndex": 2})).status == 204
    assert await received(client, "batch") == [b"after"]


async def test_a_batch_index_past_the_batch_and_no_batch_index(api, client, service):
    producer = await client.create_producer(T + "batch2")
    batch = await send_batch(SimpleNamespace(service=service), producer, [(None, b"b0"), (None, b"b1")])
    await producer.send(b"after")
    await producer.close()
    await subscribed_at_earliest(api, "batch2")
    at = {"ledgerId": batch.ledger_id, "entryId": batch.entry_id}
    assert (await api.post(f"{P}/batch2/subscription/s/expireMessages", {**at, "isExcluded": True})).status == 204
    assert await backlog(api, "batch2") == 2
    body = {**at, "batchIndex": 5, "isExcluded": True}                  # every message of the batch is before it
    assert (await api.post(f"{P}/batch2/subscription/s/expireMessages", body)).status == 204
    assert await received(client, "batch2") == [b"after"]


async def test_malformed_bodies(api, client):
    ids = await published(client, "m", 2)
    await subscribed_at_earliest(api, "m")
    good = message_id(ids[1])
    bodies = [
        {}, {"ledgerId": good["ledgerId"]}, {"entryId": good["entryId"]},                  # missing fields
        {**good, "ledgerId": "abc"}, {**good, "entryId": 1.5}, {**good, "ledgerId": None},  # wrong types
        {**good, "entryId": str(good["entryId"])}, {**good, "isExcluded": "yes"},
        {**good, "batchIndex": "1"}, {**good, "partitionIndex": True},
        {**good, "ledgerId": -2}, {**good, "entryId": -5}, {**good, "ledgerId": 2**63},     # out of range
        [good], "1:0", 5,
    ]
    for body in bodies:
        reply = await api.post(f"{P}/m/subscription/s/expireMessages", body)
        assert reply.status == 400, (body, reply)
    for raw in ("", "null", "{", "{\"ledgerId\": 1, \"entryId\": }"):
        reply = await api.post(f"{P}/m/subscription/s/expireMessages", raw=raw)
        assert reply.status == 400, (raw, reply)
    assert await backlog(api, "m") == 2
    # Unknown topic or subscription: 404 (after the body is found well formed).
    assert (await api.post(f"{P}/none/subscription/s/expireMessages", good)).status == 404
    assert (await api.post(f"{P}/m/subscription/nope/expireMessages", good)).status == 404
