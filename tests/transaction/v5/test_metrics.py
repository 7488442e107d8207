"""The PIP-473 metrics on /metrics (admin server over an in-process broker), moving with v5
traffic: op records written, header CAS outcomes, index query latency, outstanding op records."""

from __future__ import annotations

import asyncio

from pyengine.errors import InvalidTxnStatusError
from tests.admin.conftest import api, client, server, service  # noqa: F401  (fixtures)
from tests.admin.test_metrics import scrape, value

SEGMENT = "segment://public/default/metrics/0000-ffff-0"


async def test_v5_metrics_move_with_traffic(api, client, service):
    before = await scrape(api)
    assert value(before, "pulsar_txn_metadata_store_op_writes_total") == 0
    assert value(before, "pulsar_txn_metadata_store_outstanding_op_records") == 0
    producer = await client.create_producer(SEGMENT)        # recovery: one index range query
    txn = await client.new_transaction(version=5)
    await producer.send(b"a", txn=txn)
    await producer.send(b"b", txn=txn)
    mid = await scrape(api)
    assert value(mid, "pulsar_txn_metadata_store_op_writes_total") == 2
    assert value(mid, "pulsar_txn_metadata_store_outstanding_op_records") == 2
    assert value(mid, "pulsar_txn_metadata_store_index_query_seconds_count") >= 1
    await txn.commit()
    other = await client.new_transaction(version=5)
    await other.abort()
    try:
        await service.coordinator.end_transaction(other.txn_id, 0)
    except InvalidTxnStatusError:
        pass
    for _ in range(200):
        after = await scrape(api)
        if value(after, "pulsar_txn_metadata_store_outstanding_op_records") == 0:
            break
        await asyncio.sleep(0.01)
    assert value(after, "pulsar_txn_metadata_store_outstanding_op_records") == 0
    assert value(after, "pulsar_txn_metadata_store_header_cas_total", result="ok") == 2
    assert value(after, "pulsar_txn_metadata_store_header_cas_total", result="reject") == 1
    assert value(after, "pulsar_txn_metadata_store_header_cas_total", result="conflict") == 0
