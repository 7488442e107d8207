"""`GET /admin/v3/transactions/pendingAckStats/...?lowWaterMarks=true` adds the handle's low
watermark of each coordinator (`lowWaterMarks`, as in Pulsar's TransactionPendingAckStats);
left out by default, and a malformed value is 400 like the route's other boolean parameters."""

from __future__ import annotations

TX = "/admin/v3/transactions"
IN = "persistent://public/default/in"
STATS = f"{TX}/pendingAckStats/public/default/in/sub"


async def test_low_watermarks_are_returned_when_asked_for(api, client, service):
    source = await client.create_producer(IN)
    for i in range(3):
        await source.send(b"in-%d" % i)
    consumer = await client.subscribe(IN, "sub", initial_position="earliest")
    for _ in range(3):          # each txn ending on the subscription moves its low watermark
        txn = await client.new_transaction(timeout_ms=600_000)
        await consumer.acknowledge(await consumer.receive(timeout=5), txn=txn)
        await txn.commit()

    handle = (await service.get_topic(IN, create=False)).subscriptions["sub"].pending_ack
    expected = {str(cid): mark for cid, mark in handle.stats()["low_watermarks"].items()}
    # The last txn's coordinator ended an older txn before it: its low watermark is that one.
    assert expected[str(txn.txn_id.most_bits)] == txn.txn_id.least_bits - 1 >= 0

    with_marks = await api.get(f"{STATS}?lowWaterMarks=true")
    assert with_marks.status == 200 and with_marks.body["lowWaterMarks"] == expected
    assert with_marks.body["state"] == "Ready"
    for query in ("", "?lowWaterMarks=false"):
        reply = await api.get(STATS + query)
        assert reply.status == 200 and "lowWaterMarks" not in reply.body, query


async def test_a_malformed_low_watermarks_flag_is_400(api, client):
    await client.subscribe(IN, "sub")
    for value in ("bad", "2", "yes-please"):
        reply = await api.get(f"{STATS}?lowWaterMarks={value}")
        assert reply.status == 400 and "lowWaterMarks" in reply.body["reason"], (value, reply)
