"""Transaction keys through the admin API, the CLI and /metrics: list, get, delete (which fences
the key and aborts its transaction), bad keys, and the PIP's metrics."""

from __future__ import annotations

import asyncio
import json

import pytest

from pyengine.cli import main
from pyengine.transaction import TxnAction, TxnStatus
from pyengine.transaction.coordinator.keys import ANONYMOUS, coordinator_for

BASE = "/admin/v2/transactions/transaction-keys"


class Holder:
    def __init__(self) -> None:
        self.closed = False

    def close(self) -> None:
        self.closed = True


async def take_epoch(service, key: str, owner: str = ANONYMOUS, holder: Holder | None = None) -> int:
    tc = coordinator_for(owner, key, len(service.coordinator.coordinator_ids))
    holder = holder or Holder()
    return await service.coordinator.keys.connect(owner, key, tc, -1, holder=holder, on_fenced=holder.close)


async def test_list_get_and_delete(api, service):
    assert (await api.get(BASE)).body == []
    holder = Holder()
    await take_epoch(service, "b-task")
    await take_epoch(service, "a-task")
    await take_epoch(service, "a-task", holder=holder)
    keys = service.coordinator.keys
    tc = coordinator_for(ANONYMOUS, "a-task", 2)
    txn = await keys.new_transaction(ANONYMOUS, "a-task", 1, tc, 60_000)

    listed = (await api.get(BASE)).body
    assert [(k["key"], k["epoch"]) for k in listed] == [("a-task", 1), ("b-task", 0)]
    reply = await api.get(f"{BASE}/a-task")
    assert reply.status == 200
    body = reply.body
    assert (body["owner"], body["epoch"], body["coordinatorId"], body["txnStatus"], body["connected"]) == \
        (ANONYMOUS, 1, tc, "OPEN", True)
    assert body["txnId"] == f"({txn.most_bits},{txn.least_bits})" and body["ageMs"] >= 0
    assert body["transactions"] == [{"txnId": body["txnId"], "epoch": 1}]
    await service.coordinator.end_transaction(txn, TxnAction.COMMIT)
    second = await keys.new_transaction(ANONYMOUS, "a-task", 1, tc, 60_000)
    body = (await api.get(f"{BASE}/a-task")).body
    assert [t["txnId"] for t in body["transactions"]] == [f"({t.most_bits},{t.least_bits})" for t in (txn, second)]
    assert body["txnId"] == body["transactions"][-1]["txnId"] and body["txnStatus"] == "OPEN"
    txn = second

    assert (await api.delete(f"{BASE}/a-task")).status == 204
    assert holder.closed                                   # its connection is fenced
    assert service.coordinator.get(txn).status == TxnStatus.ABORTED
    assert (await api.get(f"{BASE}/a-task")).status == 404
    assert (await api.delete(f"{BASE}/a-task")).status == 404
    assert [k["key"] for k in (await api.get(BASE)).body] == ["b-task"]
    assert await take_epoch(service, "a-task") == 3        # never backwards: above the deleted epoch 2


async def test_keys_of_another_owner_and_encoded_names(api, service):
    await take_epoch(service, "x/y z", owner="role-1")
    assert (await api.get(f"{BASE}/x%2Fy%20z")).status == 404            # the anonymous owner's
    reply = await api.get(f"{BASE}/x%2Fy%20z?owner=role-1")
    assert reply.status == 200 and reply.body["owner"] == "role-1" and reply.body["key"] == "x/y z"


@pytest.mark.parametrize("path, status", [
    (f"{BASE}/a%26b", 412),                       # '&' separates owner and key
    (f"{BASE}/{'k' * 257}", 412),
    (f"{BASE}/k?owner=", 400),
    (f"{BASE}/", 404),
])
async def test_bad_keys(api, path, status):
    for method in ("GET", "DELETE"):
        reply = await api.call(method, path)
        assert reply.status == status, (method, reply.body)
        assert reply.body["reason"]


async def test_metrics(api, service, server):
    await take_epoch(service, "m1")
    await take_epoch(service, "m1")
    await take_epoch(service, "m2")
    text = (await api.get("/metrics")).body
    assert 'pulsar_txn_transaction_key_count{cluster="standalone"} 2.0' in text
    assert 'pulsar_txn_transaction_key_epoch{cluster="standalone",owner="anonymous",transaction_key="m1"} 1.0' in text
    assert 'pulsar_txn_transaction_key_age_count{cluster="standalone",owner="anonymous",transaction_key="m2"} 1.0' \
        in text
    assert "pulsar_txn_transaction_key_age_sum{" in text


async def test_cli(server, service, capsys):
    async def admin(*args: str):
        status = await asyncio.to_thread(main, ["admin", "--url", server.url, *args])
        out, err = capsys.readouterr()
        return status, json.loads(out) if out.strip() else None, err

    await take_epoch(service, "cli-task")
    status, listed, _ = await admin("transactions", "list-transaction-keys")
    assert status == 0 and [k["key"] for k in listed] == ["cli-task"]
    status, got, _ = await admin("transactions", "get-transaction-key", "cli-task")
    assert status == 0 and got["epoch"] == 0
    assert (await admin("transactions", "delete-transaction-key", "cli-task"))[0] == 0
    status, _, err = await admin("transactions", "get-transaction-key", "cli-task")
    assert status == 1 and "HTTP 404" in err
    status, _, err = await admin("transactions", "get-transaction-key", "a&b")
    assert status == 1 and "HTTP 412" in err and "&" in err
    status, _, err = await admin("transactions", "get-transaction-key", "k", "--owner", "other")
    assert status == 1 and "HTTP 404" in err
