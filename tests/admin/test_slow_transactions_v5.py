"""`GET /admin/v3/transactions/slowTransactions/{timeout}` lists the open transactions of the
v5 (metadata-driven) coordinator too, in the same TransactionMetadata format as the v4 ones:
all coordinators by default, only the v5 one for `?coordinatorId=<V5_COORDINATOR_ID>`."""

from __future__ import annotations

import asyncio

from pyengine.transaction.coordinator.metadata_records import V5_COORDINATOR_ID

TX = "/admin/v3/transactions"


async def test_open_v5_transactions_older_than_the_timeout_are_listed(api, client):
    v5 = await client.new_transaction(timeout_ms=600_000, version=5)
    v4 = await client.new_transaction(timeout_ms=600_000)
    await asyncio.sleep(0.05)
    slow = (await api.get(f"{TX}/slowTransactions/10")).body
    assert sorted(slow) == sorted([str(v5.txn_id), str(v4.txn_id)])
    entry = slow[str(v5.txn_id)]
    assert entry == (await api.get(f"{TX}/transactionMetadata/{v5.txn_id.most_bits}/{v5.txn_id.least_bits}")).body
    assert entry["status"] == "OPEN" and entry["timeoutAt"] == 600_000
    assert set(entry) == set(slow[str(v4.txn_id)])                     # the same format
    assert (await api.get(f"{TX}/slowTransactions/60000")).body == {}

    only_v5 = (await api.get(f"{TX}/slowTransactions/10?coordinatorId={V5_COORDINATOR_ID}")).body
    assert list(only_v5) == [str(v5.txn_id)]
    only_v4 = (await api.get(f"{TX}/slowTransactions/10?coordinatorId={v4.txn_id.most_bits}")).body
    assert list(only_v4) == [str(v4.txn_id)]

    await v5.commit()
    await v4.abort()
    assert (await api.get(f"{TX}/slowTransactions/10")).body == {}
    assert (await api.get(f"{TX}/slowTransactions/10?coordinatorId={V5_COORDINATOR_ID}")).body == {}


async def test_a_young_v5_transaction_is_not_slow(api, client):
    await client.new_transaction(timeout_ms=600_000, version=5)
    assert (await api.get(f"{TX}/slowTransactions/600000")).body == {}


async def test_malformed_timeouts_and_unknown_coordinators(api):
    for timeout in ("soon", "-1", "1.5", "9" * 40, "%20"):
        reply = await api.get(f"{TX}/slowTransactions/{timeout}")
        assert reply.status == 400 and "timeout" in reply.body["reason"], (timeout, reply)
    assert (await api.get(f"{TX}/slowTransactions/10?coordinatorId=9")).status == 404
    assert (await api.get(f"{TX}/slowTransactions/10?coordinatorId=-1")).status == 400
    assert (await api.get(f"{TX}/slowTransactions/10?coordinatorId=x")).status == 400
