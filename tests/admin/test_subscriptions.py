"""Subscriptions through the admin API: create at a position, list, delete, reset the cursor to
a message id or a time, skip everything — seen by a consumer of the same broker."""

from __future__ import annotations

import asyncio
import time

from tests.admin.helpers import drain

P = "/admin/v2/persistent/public/default"
LATEST = 2**63 - 1


async def published(client, topic: str, count: int) -> list:
    producer = await client.create_producer(f"persistent://public/default/{topic}")
    ids = [await producer.send(b"m%d" % i) for i in range(count)]
    await producer.close()
    return ids


async def received(client, topic: str, subscription: str) -> list[bytes]:
    consumer = await client.subscribe(f"persistent://public/default/{topic}", subscription)
    messages = await drain(consumer)
    await consumer.close()
    return [m.data for m in messages]


async def test_create_at_positions_and_list(api, client):
    ids = await published(client, "t", 5)
    assert (await api.put(f"{P}/t/subscription/from-start", {"ledgerId": -1, "entryId": -1})).status == 204
    assert (await api.put(f"{P}/t/subscription/from-end")).status == 204                 # default: latest
    third = {"ledgerId": ids[2].ledger_id, "entryId": ids[2].entry_id}
    assert (await api.put(f"{P}/t/subscription/from-third", third)).status == 204
    after_third = {**third, "isExcluded": True}
    assert (await api.put(f"{P}/t/subscription/after-third", after_third)).status == 204
    assert (await api.put(f"{P}/t/subscription/latest", {"ledgerId": LATEST, "entryId": LATEST})).status == 204
    assert (await api.get(f"{P}/t/subscriptions")).body == ["after-third", "from-end", "from-start",
                                                            "from-third", "latest"]
    assert await received(client, "t", "from-start") == [b"m0", b"m1", b"m2", b"m3", b"m4"]
    assert await received(client, "t", "from-third") == [b"m2", b"m3", b"m4"]
    assert await received(client, "t", "after-third") == [b"m3", b"m4"]
    assert await received(client, "t", "from-end") == []
    assert await received(client, "t", "latest") == []


async def test_create_beyond_the_end_waits_for_new_messages(api, client):
    await published(client, "far", 2)
    assert (await api.put(f"{P}/far/subscription/s", {"ledgerId": 10**12, "entryId": 5})).status == 204
    consumer = await client.subscribe("persistent://public/default/far", "s")
    producer = await client.create_producer("persistent://public/default/far")
    await producer.send(b"new")
    assert (await consumer.receive(timeout=5)).data == b"new"


async def test_subscription_errors(api, client):
    await published(client, "t", 1)
    assert (await api.put(f"{P}/t/subscription/s")).status == 204
    assert (await api.put(f"{P}/t/subscription/s")).status == 409
    assert (await api.get(f"{P}/none/subscriptions")).status == 404
    # As Apache with auto topic creation: creating a subscription creates its topic.
    assert (await api.put(f"{P}/none/subscription/s")).status == 204
    assert (await api.get(f"{P}/none/subscriptions")).body == ["s"]
    assert (await api.put(f"{P}/none2/subscription/s", {"ledgerId": 5, "entryId": 0})).status == 204
    assert (await api.put(f"{P}/t/subscription/x", {"ledgerId": "a", "entryId": 0})).status == 400
    assert (await api.put(f"{P}/t/subscription/x", {"ledgerId": -2, "entryId": 0})).status == 400
    assert (await api.put(f"{P}/t/subscription/x", {"entryId": 0})).status == 400
    assert (await api.put(f"{P}/t/subscription/x", [1, 2])).status == 400
    assert (await api.put(f"{P}/t/subscription/%20")).status == 412
    assert (await api.delete(f"{P}/t/subscription/nope")).status == 404
    assert (await api.post(f"{P}/t/subscription/nope/skip_all")).status == 404
    assert (await api.post(f"{P}/t/subscription/s/resetcursor/abc")).status == 400
    assert (await api.post(f"{P}/t/subscription/s/resetcursor/-5")).status == 400
    assert (await api.post(f"{P}/t/subscription/s/resetcursor/" + "9" * 30)).status == 400
    assert (await api.post(f"{P}/t/subscription/s/resetcursor")).status == 400       # message id required
    assert (await api.post(f"{P}/t/subscription/s/resetcursor", raw="{]")).status == 400


async def test_delete_subscription(api, client, service):
    await published(client, "t", 1)
    consumer = await client.subscribe("persistent://public/default/t", "busy")
    reply = await api.delete(f"{P}/t/subscription/busy")
    assert reply.status == 412 and reply.body == {"reason": "Subscription has active connected consumers"}
    await consumer.close()
    assert (await api.delete(f"{P}/t/subscription/busy")).status == 204
    assert "busy" not in service.topics["persistent://public/default/t"].subscriptions
    await client.subscribe("persistent://public/default/t", "forced")
    assert (await api.call("DELETE", f"{P}/t/subscription/forced?force=true")).status == 204
    assert (await api.get(f"{P}/t/subscriptions")).body == []


async def test_reset_cursor_to_message_and_time(api, client):
    producer = await client.create_producer("persistent://public/default/r")
    ids = []
    for i in range(4):
        ids.append(await producer.send(b"m%d" % i))
        await asyncio.sleep(0.005)                  # distinct publish times
    await api.put(f"{P}/r/subscription/s", {"ledgerId": -1, "entryId": -1})
    assert await received(client, "r", "s") == [b"m0", b"m1", b"m2", b"m3"]   # delivered, not acked

    second = {"ledgerId": ids[1].ledger_id, "entryId": ids[1].entry_id}
    assert (await api.post(f"{P}/r/subscription/s/resetcursor", second)).status == 204
    assert await received(client, "r", "s") == [b"m1", b"m2", b"m3"]
    assert (await api.post(f"{P}/r/subscription/s/resetcursor", {"ledgerId": -1, "entryId": -1})).status == 204
    assert await received(client, "r", "s") == [b"m0", b"m1", b"m2", b"m3"]
    latest = {"ledgerId": LATEST, "entryId": LATEST}
    assert (await api.post(f"{P}/r/subscription/s/resetcursor", latest)).status == 204
    assert await received(client, "r", "s") == []

    third = client.service.topics["persistent://public/default/r"].ledger.read_entry(ids[2].position)
    assert (await api.post(f"{P}/r/subscription/s/resetcursor/{third.publish_time}")).status == 204
    assert await received(client, "r", "s") == [b"m2", b"m3"]
    assert (await api.post(f"{P}/r/subscription/s/resetcursor/{int(time.time() * 1000) + 60_000}")).status == 204
    assert await received(client, "r", "s") == []


async def test_skip_all_clears_the_backlog_up_to_the_read_horizon(api, client, service):
    """Skipping leaves an open transaction's messages in place: they are delivered if it commits."""
    await published(client, "b", 3)
    await api.put(f"{P}/b/subscription/s", {"ledgerId": -1, "entryId": -1})
    producer = await client.create_producer("persistent://public/default/b")
    txn = await client.new_transaction()
    await producer.send(b"in-txn", txn=txn)
    await producer.send(b"after")
    assert (await api.get(f"{P}/b/stats")).body["subscriptions"]["s"]["msgBacklog"] == 5
    assert (await api.post(f"{P}/b/subscription/s/skip_all")).status == 204
    assert (await api.get(f"{P}/b/stats")).body["subscriptions"]["s"]["msgBacklog"] == 2
    await txn.commit()
    assert await received(client, "b", "s") == [b"in-txn", b"after"]


async def test_operations_on_a_partitioned_topic_apply_to_every_partition(api, client, service):
    await api.put(f"{P}/pt/partitions", 3)
    assert (await api.put(f"{P}/pt/subscription/s", {"ledgerId": -1, "entryId": -1})).status == 204
    for index in range(3):
        assert "s" in service.topics[f"persistent://public/default/pt-partition-{index}"].subscriptions
    assert (await api.get(f"{P}/pt/subscriptions")).body == ["s"]
    producer = await client.create_producer("persistent://public/default/pt-partition-2")
    await producer.send(b"x")
    assert (await api.post(f"{P}/pt/subscription/s/skip_all")).status == 204
    assert (await api.get(f"{P}/pt-partition-2/stats")).body["subscriptions"]["s"]["msgBacklog"] == 0
    assert (await api.post(f"{P}/pt/subscription/s/resetcursor/0")).status == 204
    assert (await api.get(f"{P}/pt-partition-2/stats")).body["subscriptions"]["s"]["msgBacklog"] == 1
    reply = await api.post(f"{P}/pt/subscription/s/resetcursor", {"ledgerId": -1, "entryId": -1})
    assert reply.status == 405
    assert (await api.put(f"{P}/pt/subscription/at", {"ledgerId": 1, "entryId": 0})).status == 405
    assert (await api.delete(f"{P}/pt/subscription/s")).status == 204
    assert (await api.get(f"{P}/pt/subscriptions")).body == []
