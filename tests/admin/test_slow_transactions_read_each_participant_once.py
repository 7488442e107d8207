"""`GET /admin/v3/transactions/slowTransactions/{timeout}` reads each participant once per
request: a topic's open transactions and a subscription's pending-ack stats each cost O(open
txns) to build, so building them once per slow transaction made the request quadratic in the
open transactions of a topic. Counted, not timed."""

from __future__ import annotations

import asyncio

TX = "/admin/v3/transactions"
IN = "persistent://public/default/in"
OUT = "persistent://public/default/out"
N = 6


async def test_n_slow_transactions_on_one_topic_read_its_buffer_and_pending_acks_once(api, client, service,
                                                                                      monkeypatch):
    source = await client.create_producer(IN)
    for i in range(N):
        await source.send(b"in-%d" % i)
    consumer = await client.subscribe(IN, "sub", initial_position="earliest")
    producer = await client.create_producer(OUT)
    txns, starts, acked = [], {}, {}
    for _ in range(N):
        txn = await client.new_transaction(timeout_ms=600_000)
        sent = await producer.send(b"out", txn=txn)
        message = await consumer.receive(timeout=5)
        await consumer.acknowledge(message, txn=txn)
        txns.append(txn)
        starts[str(txn.txn_id)] = f"{sent.ledger_id}:{sent.entry_id}"
    await asyncio.sleep(0.01)                       # older than the 0 ms timeout

    buffer = (await service.get_topic(OUT, create=False)).buffer
    handle = (await service.get_topic(IN, create=False)).subscriptions["sub"].pending_ack
    calls = {"ongoing_txns": 0, "stats": 0}

    def counted(name, method):
        def wrapper(*args, **kwargs):
            calls[name] += 1
            return method(*args, **kwargs)
        return wrapper

    monkeypatch.setattr(buffer, "ongoing_txns", counted("ongoing_txns", buffer.ongoing_txns))
    monkeypatch.setattr(handle, "stats", counted("stats", handle.stats))

    slow = (await api.get(f"{TX}/slowTransactions/0")).body
    assert sorted(slow) == sorted(str(txn.txn_id) for txn in txns)
    for txn_id, meta in slow.items():                       # still the right answer for each
        assert meta["producedPartitions"] == {OUT: {"startPosition": starts[txn_id], "aborted": False}}
        assert meta["ackedPartitions"] == {IN: {"sub": {"cumulativeAckPosition": None}}}
    # Once per request, not once per slow transaction (N each before).
    assert calls == {"ongoing_txns": 1, "stats": 1}
