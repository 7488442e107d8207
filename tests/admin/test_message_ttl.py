"""Message TTL and expiry (Pulsar's messageTTL policies, expireMessages and the broker's
message expiry task).

The TTL in force is the topic's (`POST .../{topic}/messageTTL?messageTTL=N`), else the
namespace's (`POST /admin/v2/namespaces/{t}/{ns}/messageTTL` with the seconds as body,
`message_ttl_in_seconds` in its policies), else the broker's `ttl_duration_default_seconds`;
0 is no expiry. A negative TTL is refused with 412 "Invalid value for message TTL", as Pulsar
does; what is not an integer with 400. Expiry acknowledges, on each subscription, the messages
published TTL seconds ago or earlier, never past the read horizon: an open transaction's
entries, however old, and all after them stay, and are delivered if it commits."""

from __future__ import annotations

import asyncio
import time

import aiohttp
import pytest

import pyengine.broker.embedded as embedded
from pyengine.admin import AdminServer
from pyengine.broker.embedded import EmbeddedClient
from pyengine.broker.service import BrokerConfig, BrokerService
from tests.admin.conftest import Api
from tests.admin.helpers import drain

P = "/admin/v2/persistent/public/default"
NS = "/admin/v2/namespaces/public/default"
T = "persistent://public/default/"
HOUR_MS = 3_600_000


@pytest.fixture
def publish_an_hour_ago(monkeypatch):
    """While on, messages the embedded client sends carry a publish time an hour old."""

    def switch(on: bool) -> None:
        offset = HOUR_MS if on else 0
        monkeypatch.setattr(embedded, "_now_ms", lambda: int(time.time() * 1000) - offset)

    return switch


async def published(client, topic: str, count: int, prefix: bytes = b"m", txn=None) -> list:
    producer = await client.create_producer(T + topic)
    ids = [await producer.send(prefix + b"%d" % i, txn=txn) for i in range(count)]
    await producer.close()
    return ids


async def received(client, topic: str, subscription: str) -> list[bytes]:
    consumer = await client.subscribe(T + topic, subscription)
    messages = await drain(consumer)
    await consumer.close()
    return [m.data for m in messages]


async def sub_stats(api, topic: str, subscription: str) -> dict:
    return (await api.get(f"{P}/{topic}/stats")).body["subscriptions"][subscription]


# --- policies -----------------------------------------------------------------------------------

async def test_namespace_message_ttl(api):
    assert (await api.get(f"{NS}/messageTTL")).status == 204                 # not set
    assert (await api.get(NS)).body["message_ttl_in_seconds"] is None
    assert (await api.post(f"{NS}/messageTTL", 30)).status == 204
    reply = await api.get(f"{NS}/messageTTL")
    assert (reply.status, reply.body) == (200, 30)
    assert (await api.get(NS)).body["message_ttl_in_seconds"] == 30
    assert (await api.post(f"{NS}/messageTTL", 0)).status == 204            # 0: explicitly no expiry
    assert (await api.get(f"{NS}/messageTTL")).body == 0
    assert (await api.delete(f"{NS}/messageTTL")).status == 204
    assert (await api.get(f"{NS}/messageTTL")).status == 204


async def test_namespace_created_with_a_ttl(api):
    assert (await api.put("/admin/v2/namespaces/public/withttl", {"message_ttl_in_seconds": 12})).status == 204
    assert (await api.get("/admin/v2/namespaces/public/withttl/messageTTL")).body == 12
    assert (await api.put("/admin/v2/namespaces/public/badttl", {"message_ttl_in_seconds": -1})).status == 400


async def test_namespace_message_ttl_malformed(api):
    reply = await api.post(f"{NS}/messageTTL", -1)
    assert (reply.status, reply.body) == (412, {"reason": "Invalid value for message TTL"})
    for raw in ("\"10\"", "1.5", "true", "null", "[1]", "{}", "abc", str(2**31)):
        reply = await api.post(f"{NS}/messageTTL", raw=raw)
        assert reply.status == 400, (raw, reply)
    assert (await api.post(f"{NS}/messageTTL")).status == 400               # no body
    assert (await api.post("/admin/v2/namespaces/public/nowhere/messageTTL", 10)).status == 404
    assert (await api.get("/admin/v2/namespaces/public/nowhere/messageTTL")).status == 404
    assert (await api.get(f"{NS}/messageTTL")).status == 204                # nothing was stored


async def test_topic_message_ttl_and_precedence(api, client, service):
    await published(client, "p", 1)
    assert (await api.get(f"{P}/p/messageTTL")).status == 204
    assert (await api.get(f"{P}/p/messageTTL?applied=true")).body == 0      # the broker's default here
    assert (await api.post(f"{NS}/messageTTL", 60)).status == 204
    assert (await api.get(f"{P}/p/messageTTL?applied=true")).body == 60     # the namespace's
    assert (await api.post(f"{P}/p/messageTTL?messageTTL=5")).status == 204
    assert (await api.get(f"{P}/p/messageTTL")).body == 5
    assert (await api.get(f"{P}/p/messageTTL?applied=true")).body == 5      # the topic's
    assert (await api.post(f"{P}/p/messageTTL?messageTTL=0")).status == 204
    assert (await api.get(f"{P}/p/messageTTL?applied=true")).body == 0      # 0 on the topic: off
    assert (await api.delete(f"{P}/p/messageTTL")).status == 204
    assert (await api.get(f"{P}/p/messageTTL")).status == 204
    assert (await api.get(f"{P}/p/messageTTL?applied=true")).body == 60
    assert service.policies.message_ttl(T + "p") == 60


async def test_topic_message_ttl_malformed(api, client):
    await published(client, "bad", 1)
    reply = await api.post(f"{P}/bad/messageTTL?messageTTL=-3")
    assert (reply.status, reply.body) == (412, {"reason": "Invalid value for message TTL"})
    for value in ("abc", "1.5", "", "0x10", str(2**31), "%20"):
        reply = await api.post(f"{P}/bad/messageTTL?messageTTL={value}")
        assert reply.status == 400 and "messageTTL" in reply.body["reason"], (value, reply)
    assert (await api.post(f"{P}/bad/messageTTL")).status == 400            # the parameter is required
    assert (await api.post(f"{P}/none/messageTTL?messageTTL=5")).status == 404
    assert (await api.get(f"{P}/none/messageTTL")).status == 404
    assert (await api.get(f"{P}/bad/messageTTL?applied=maybe")).status == 400
    assert (await api.get(f"{P}/bad/messageTTL")).status == 204


async def test_partitioned_topic_takes_a_topic_ttl(api, service):
    await api.put(f"{P}/pt/partitions", 2)
    assert (await api.post(f"{P}/pt/messageTTL?messageTTL=7")).status == 204
    assert service.policies.message_ttl(T + "pt-partition-1") == 7          # a partition follows its topic


# --- manual expiry ------------------------------------------------------------------------------

async def test_expire_messages_of_a_subscription(api, client, publish_an_hour_ago):
    publish_an_hour_ago(True)
    await published(client, "e", 3, b"old")
    publish_an_hour_ago(False)
    await published(client, "e", 2, b"new")
    await api.put(f"{P}/e/subscription/s", {"ledgerId": -1, "entryId": -1})
    await api.put(f"{P}/e/subscription/other", {"ledgerId": -1, "entryId": -1})
    assert (await api.post(f"{P}/e/subscription/s/expireMessages/60")).status == 204
    stats = await sub_stats(api, "e", "s")
    assert stats["msgBacklog"] == 2 and stats["totalMsgExpired"] == 3 and stats["lastExpireTimestamp"] > 0
    assert (await sub_stats(api, "e", "other"))["msgBacklog"] == 5          # only that subscription
    assert await received(client, "e", "s") == [b"new0", b"new1"]
    # Nothing expired left, and no consumer: issued, nothing moves.
    assert (await api.post(f"{P}/e/subscription/s/expireMessages/60")).status == 204
    assert (await sub_stats(api, "e", "s"))["msgBacklog"] == 2
    # 0 seconds: everything published so far.
    assert (await api.post(f"{P}/e/subscription/s/expireMessages/0")).status == 204
    assert (await sub_stats(api, "e", "s"))["msgBacklog"] == 0
    # No backlog: Pulsar does not issue it (409).
    reply = await api.post(f"{P}/e/subscription/s/expireMessages/0")
    assert reply.status == 409 and reply.body["reason"].startswith("Expire message by timestamp not issued on topic")


async def test_expire_takes_messages_held_by_a_connected_consumer(api, client, publish_an_hour_ago):
    publish_an_hour_ago(True)
    await published(client, "held", 3, b"old")
    publish_an_hour_ago(False)
    await published(client, "held", 1, b"new")
    consumer = await client.subscribe(T + "held", "s", initial_position="earliest")
    assert len(await drain(consumer)) == 4
    assert (await api.post(f"{P}/held/subscription/s/expireMessages/60")).status == 204
    await consumer.close()                                                   # unacked ones come back...
    assert await received(client, "held", "s") == [b"new0"]                # ...not the expired ones


async def test_expire_on_all_subscriptions(api, client, publish_an_hour_ago):
    publish_an_hour_ago(True)
    await published(client, "all", 2, b"old")
    publish_an_hour_ago(False)
    await published(client, "all", 1, b"new")
    for name in ("a", "b"):
        await api.put(f"{P}/all/subscription/{name}", {"ledgerId": -1, "entryId": -1})
    assert (await api.post(f"{P}/all/all_subscription/expireMessages/60")).status == 204
    for name in ("a", "b"):
        assert (await sub_stats(api, "all", name))["msgBacklog"] == 1
    assert (await api.post(f"{P}/all/all_subscription/expireMessages/0")).status == 204
    reply = await api.post(f"{P}/all/all_subscription/expireMessages/0")     # no backlog left anywhere
    assert reply.status == 409


async def test_expire_on_a_partitioned_topic(api, client, publish_an_hour_ago):
    await api.put(f"{P}/ppt/partitions", 2)
    publish_an_hour_ago(True)
    for index in range(2):
        await published(client, f"ppt-partition-{index}", 2)
    await api.put(f"{P}/ppt/subscription/s", {"ledgerId": -1, "entryId": -1})
    assert (await api.post(f"{P}/ppt/subscription/s/expireMessages/60")).status == 204
    stats = (await api.get(f"{P}/ppt/partitioned-stats")).body
    assert stats["subscriptions"]["s"]["msgBacklog"] == 0
    assert stats["subscriptions"]["s"]["totalMsgExpired"] == 4
    reply = await api.post(f"{P}/ppt/subscription/s/expireMessages", {"ledgerId": -1, "entryId": -1})
    assert reply.status == 405


async def test_expire_up_to_a_message_id(api, client):
    ids = await published(client, "id", 4)
    await api.put(f"{P}/id/subscription/s", {"ledgerId": -1, "entryId": -1})
    second = {"ledgerId": ids[1].ledger_id, "entryId": ids[1].entry_id}
    assert (await api.post(f"{P}/id/subscription/s/expireMessages", {**second, "isExcluded": True})).status == 204
    assert (await sub_stats(api, "id", "s"))["msgBacklog"] == 3             # m0 only
    assert (await api.post(f"{P}/id/subscription/s/expireMessages", second)).status == 204
    assert (await sub_stats(api, "id", "s"))["msgBacklog"] == 2             # m1 as well
    assert (await api.post(f"{P}/id/subscription/s/expireMessages", {"ledgerId": -1, "entryId": -1})).status == 204
    assert await received(client, "id", "s") == [b"m2", b"m3"]
    # Beyond the last entry: nothing is expired, and the expiry is refused as not issued (409),
    # as Pulsar ("If it's beyond last position of this topic, do nothing").
    beyond = {"ledgerId": ids[3].ledger_id, "entryId": ids[3].entry_id + 100}
    assert (await api.post(f"{P}/id/subscription/s/expireMessages", beyond)).status == 409
    assert (await sub_stats(api, "id", "s"))["msgBacklog"] == 2
    await published(client, "id", 1, b"later")
    assert await received(client, "id", "s") == [b"m2", b"m3", b"later0"]


async def test_expire_malformed_and_unknown(api, client):
    await published(client, "x", 1)
    await api.put(f"{P}/x/subscription/s", {"ledgerId": -1, "entryId": -1})
    for value in ("abc", "-1", "1.5", "2147483648", "%20"):
        for path in (f"{P}/x/subscription/s/expireMessages/{value}", f"{P}/x/all_subscription/expireMessages/{value}"):
            reply = await api.post(path)
            assert reply.status == 400 and "expireTimeInSeconds" in reply.body["reason"], (path, reply)
    assert (await api.post(f"{P}/x/subscription/nope/expireMessages/1")).status == 404
    assert (await api.post(f"{P}/none/subscription/s/expireMessages/1")).status == 404
    assert (await api.post(f"{P}/none/all_subscription/expireMessages/1")).status == 404
    assert (await api.post(f"{P}/x/subscription/s/expireMessages", raw="{\"ledgerId\": 1}")).status == 400
    assert (await api.post(f"{P}/x/subscription/s/expireMessages")).status == 400


# --- transactions ------------------------------------------------------------------------------

async def test_an_open_transaction_holds_expiry_at_the_read_horizon(api, client, publish_an_hour_ago):
    """Its entries are older than the TTL, and so is one after them: none is expired, and all
    are delivered once it commits; what was before it expires."""
    publish_an_hour_ago(True)
    await published(client, "h", 2, b"before")
    await api.put(f"{P}/h/subscription/s", {"ledgerId": -1, "entryId": -1})
    txn = await client.new_transaction()
    producer = await client.create_producer(T + "h")
    await producer.send(b"in-txn", txn=txn)
    await producer.send(b"after")
    publish_an_hour_ago(False)
    assert (await api.post(f"{P}/h/subscription/s/expireMessages/60")).status == 204
    assert (await sub_stats(api, "h", "s"))["msgBacklog"] == 2              # in-txn and after stay
    assert (await api.post(f"{P}/h/all_subscription/expireMessages/0")).status == 204
    assert (await sub_stats(api, "h", "s"))["msgBacklog"] == 2
    await txn.commit()
    await producer.close()
    assert await received(client, "h", "s") == [b"in-txn", b"after"]


async def test_pending_acks_of_an_open_transaction_on_expired_messages(api, client, publish_an_hour_ago):
    """As in Pulsar (its expiry mark-deletes without asking the pending-ack handle): a message a
    transaction acknowledged may expire; the transaction then ends as usual, and an abort does
    not bring an expired message back."""
    publish_an_hour_ago(True)
    await published(client, "pa", 3)
    publish_an_hour_ago(False)
    await published(client, "pa", 1, b"new")
    consumer = await client.subscribe(T + "pa", "s", initial_position="earliest")
    messages = await drain(consumer)
    aborting = await client.new_transaction()
    await consumer.acknowledge(messages[0], txn=aborting)
    committing = await client.new_transaction()
    await consumer.acknowledge(messages[3], txn=committing)
    assert (await api.post(f"{P}/pa/subscription/s/expireMessages/60")).status == 204
    await aborting.abort()
    await committing.commit()
    stats = (await api.get("/admin/v3/transactions/pendingAckStats/public/default/pa/s")).body
    assert stats["ongoingTxnSize"] == 0 and stats["pendingIndividualPositions"] == 0
    assert await drain(consumer) == []
    await consumer.close()
    assert (await sub_stats(api, "pa", "s"))["msgBacklog"] == 0


# --- the broker's expiry task -------------------------------------------------------------------

@pytest.fixture
async def expiring(tmp_path):
    """A broker whose expiry task runs every 50 ms, with its admin API and embedded client."""
    started = []

    async def start(**config):
        broker = BrokerService(BrokerConfig(data_dir=tmp_path / "data", sync=False, num_coordinators=2,
                                            message_expiry_check_interval_s=0.05, **config))
        await broker.start()
        admin = AdminServer(broker, port=0)
        await admin.start()
        session = aiohttp.ClientSession()
        started.append((broker, admin, session))
        return broker, Api(session, admin.url), EmbeddedClient(broker)

    yield start
    for broker, admin, session in started:
        await session.close()
        await admin.stop()
        await broker.close()


async def rounds(broker, count: int = 2) -> None:
    """Wait until the expiry task has run `count` more rounds."""
    target = broker.message_expiry.rounds + count
    for _ in range(200):
        if broker.message_expiry.rounds >= target:
            return
        await asyncio.sleep(0.02)
    raise AssertionError("the expiry task did not run")


async def test_the_expiry_task_applies_the_namespace_ttl(expiring, publish_an_hour_ago):
    broker, api, client = await expiring()
    publish_an_hour_ago(True)
    await published(client, "task", 3, b"old")
    await api.put(f"{P}/task/subscription/s", {"ledgerId": -1, "entryId": -1})
    publish_an_hour_ago(False)
    await published(client, "task", 2, b"new")
    await rounds(broker)
    assert (await sub_stats(api, "task", "s"))["msgBacklog"] == 5           # no TTL: nothing expires
    assert (await api.post(f"{NS}/messageTTL", 60)).status == 204
    await rounds(broker)
    stats = await sub_stats(api, "task", "s")
    assert stats["msgBacklog"] == 2 and stats["totalMsgExpired"] == 3
    assert await received(client, "task", "s") == [b"new0", b"new1"]
    await client.close()


async def test_ttl_precedence_topic_over_namespace_over_broker(expiring, publish_an_hour_ago):
    broker, api, client = await expiring(ttl_duration_default_seconds=60)
    for topic in ("t1", "t2", "t3"):
        await published(client, topic, 0)                # the topics, with no message yet
        await api.put(f"{P}/{topic}/subscription/s", {"ledgerId": -1, "entryId": -1})
    # t1: the broker's default (60 s) expires them. t2: its topic TTL of 0 turns expiry off.
    assert (await api.post(f"{P}/t2/messageTTL?messageTTL=0")).status == 204
    publish_an_hour_ago(True)
    for topic in ("t1", "t2"):
        await published(client, topic, 2)
    publish_an_hour_ago(False)
    await rounds(broker)
    assert (await sub_stats(api, "t1", "s"))["msgBacklog"] == 0
    assert (await sub_stats(api, "t2", "s"))["msgBacklog"] == 2
    # The namespace's TTL (2 h) is over the broker's: the hour-old messages of t3 stay ...
    assert (await api.post(f"{NS}/messageTTL", 7200)).status == 204
    publish_an_hour_ago(True)
    await published(client, "t1", 1, b"again")
    await published(client, "t3", 2)
    publish_an_hour_ago(False)
    await rounds(broker)
    assert (await sub_stats(api, "t1", "s"))["msgBacklog"] == 1
    # ... until the topic's TTL (60 s) is over the namespace's.
    assert (await api.post(f"{P}/t1/messageTTL?messageTTL=60")).status == 204
    await rounds(broker)
    assert (await sub_stats(api, "t1", "s"))["msgBacklog"] == 0
    assert (await sub_stats(api, "t2", "s"))["msgBacklog"] == 2
    assert (await sub_stats(api, "t3", "s"))["msgBacklog"] == 2
    assert (await api.get(f"{P}/t3/messageTTL?applied=true")).body == 7200
    await client.close()


async def test_the_expiry_task_stops_at_an_open_transaction(expiring, publish_an_hour_ago):
    broker, api, client = await expiring(ttl_duration_default_seconds=60)
    publish_an_hour_ago(True)
    await published(client, "tx", 0)
    await api.put(f"{P}/tx/subscription/s", {"ledgerId": -1, "entryId": -1})
    await published(client, "tx", 1, b"before")
    txn = await client.new_transaction()
    producer = await client.create_producer(T + "tx")
    await producer.send(b"in-txn", txn=txn)
    await producer.send(b"after")
    publish_an_hour_ago(False)
    await rounds(broker, 3)
    assert (await sub_stats(api, "tx", "s"))["msgBacklog"] == 2
    await txn.commit()
    await producer.close()
    consumer = await client.subscribe(T + "tx", "s")
    assert [m.data for m in await drain(consumer, timeout=0.05)] == [b"in-txn", b"after"]
    await consumer.close()
    await client.close()


async def test_policies_survive_a_restart(expiring):
    broker, api, client = await expiring()
    await published(client, "keep", 1)
    assert (await api.post(f"{NS}/messageTTL", 42)).status == 204
    assert (await api.post(f"{P}/keep/messageTTL?messageTTL=9")).status == 204
    await client.close()
    await broker.close()
    broker, api, client = await expiring()
    assert (await api.get(f"{NS}/messageTTL")).body == 42
    assert (await api.get(NS)).body["message_ttl_in_seconds"] == 42
    assert (await api.get(f"{P}/keep/messageTTL")).body == 9
    assert broker.policies.message_ttl(T + "keep") == 9
    await client.close()


async def test_in_the_openapi_document(api):
    paths = (await api.get("/openapi.json")).body["paths"]
    assert set(paths["/admin/v2/namespaces/{tenant}/{namespace}/messageTTL"]) == {"get", "post", "delete"}
    topic = paths["/admin/v2/persistent/{tenant}/{namespace}/{topic}/messageTTL"]
    assert set(topic) == {"get", "post", "delete"}
    assert any(p["name"] == "messageTTL" and p["in"] == "query" for p in topic["post"]["parameters"])
    base = "/admin/v2/persistent/{tenant}/{namespace}/{topic}"
    assert "post" in paths[base + "/subscription/{subName}/expireMessages/{expireTimeInSeconds}"]
    assert "post" in paths[base + "/subscription/{subName}/expireMessages"]
    assert "post" in paths[base + "/all_subscription/expireMessages/{expireTimeInSeconds}"]
