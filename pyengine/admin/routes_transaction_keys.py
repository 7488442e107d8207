"""Transaction keys (pip-transaction-key-fencing): `/admin/v2/transactions/transaction-keys`.

* `GET .../transaction-keys`: every key (deleted ones are not listed);
* `GET .../transaction-keys/{key}`: one key: owner, epoch, coordinator, its latest transaction
  and that transaction's state, its recent transactions with their epochs, when its epoch was
  taken and the age since, connected or not;
* `DELETE .../transaction-keys/{key}`: fence the key (its connection is closed), abort its open
  transaction and remove it; the epoch is kept, so a later connect continues above it (as a
  tombstone until the key's transactions have ended and the finished-transaction retention has
  passed, then as the floor of every new key's epochs: `TransactionKeys.purge_deleted`).

The owner of a key is the authenticated role of the client that connected it; this broker does
not authenticate, so it is `anonymous` (the `owner` query parameter names another).

Metrics (added to `/metrics`): `pulsar_txn_transaction_key_count` (gauge),
`pulsar_txn_transaction_key_epoch{transaction_key}` (gauge) and
`pulsar_txn_transaction_key_age{transaction_key}` (summary: one observation per key, the
seconds since its current epoch was taken; `sum without (transaction_key)` over the `_sum` and
`_count` series gives the total age and the number of keys).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client.core import GaugeMetricFamily, Metric, SummaryMetricFamily

from pyengine.admin.errors import PRECONDITION_FAILED, AdminError
from pyengine.admin.routing import Call, Param, Reply, RouteTable
from pyengine.admin.schemas import COUNT, DONE, errors
from pyengine.broker.service import BrokerService
from pyengine.errors import InvalidTransactionKeyError
from pyengine.transaction.coordinator.keys import ANONYMOUS, HISTORY, KeyState, TransactionKeys, check_transaction_key

routes = RouteTable("transaction keys")
BASE = "/admin/v2/transactions/transaction-keys"

KEY = Param("key", {"type": "string"}, "the transaction key (URL-encoded)", "path", required=True)
OWNER = Param("owner", {"type": "string", "minLength": 1}, "the key's owner (role)", default=ANONYMOUS)
NULLABLE_STRING = {"type": "string", "nullable": True}
TRANSACTION_KEY = {
    "type": "object",
    "properties": {
        "owner": {"type": "string"}, "key": {"type": "string"}, "coordinatorId": COUNT,
        "epoch": {"type": "integer", "minimum": 0},
        "txnId": {**NULLABLE_STRING, "description": "(mostSigBits,leastSigBits) of the key's latest transaction"},
        "txnStatus": {**NULLABLE_STRING, "description": "its state; null once ended and no longer retained"},
        "createdTimestamp": {"type": "integer"}, "epochTimestamp": {"type": "integer"},
        "ageMs": {**COUNT, "description": "since the current epoch was taken"},
        "connected": {"type": "boolean", "description": "a connection holds the current epoch"},
        "transactions": {"type": "array", "description": "the key's transactions, oldest first (the latest "
                         f"{HISTORY + 1}), each with the epoch it is bound to",
                         "items": {"type": "object", "properties": {"txnId": {"type": "string"},
                                                                    "epoch": {"type": "integer", "minimum": 0}},
                                   "required": ["txnId", "epoch"]}},
    },
    "required": ["owner", "key", "coordinatorId", "epoch", "txnId", "txnStatus", "ageMs", "connected"],
}


def _keys(call: Call) -> TransactionKeys:
    return call.service.coordinator.keys


def _requested(call: Call) -> tuple[str, str]:
    try:
        return call["owner"], check_transaction_key(call["key"])
    except InvalidTransactionKeyError as exc:
        raise AdminError(PRECONDITION_FAILED, str(exc)) from None


def key_json(keys: TransactionKeys, state: KeyState) -> dict[str, Any]:
    info = keys.info(state)
    return {"owner": info.owner, "key": info.key, "coordinatorId": info.coordinator_id, "epoch": info.epoch,
            "txnId": None if info.txn is None else f"({info.txn.most_bits},{info.txn.least_bits})",
            "txnStatus": info.txn_status, "createdTimestamp": info.created_ms, "epochTimestamp": info.epoch_ms,
            "ageMs": info.age_ms, "connected": info.connected,
            # the PIP's "associated transaction IDs": the latest and those the records keep
            "transactions": [{"txnId": f"({txn.most_bits},{txn.least_bits})", "epoch": epoch}
                             for txn, epoch in [*state.history, *([(state.txn, state.txn_epoch)] if state.txn else [])]]}


@routes.add("GET", BASE, summary="List the transaction keys.",
            replies={200: Reply("TransactionKey list", {"type": "array", "items": TRANSACTION_KEY}), **errors(503)})
async def list_transaction_keys(call: Call) -> list[dict[str, Any]]:
    keys = _keys(call)
    return sorted((key_json(keys, state) for state in keys.keys()), key=lambda k: (k["owner"], k["key"]))


@routes.add("GET", BASE + "/{key}", summary="Get a transaction key: its epoch, owner, transaction and age.",
            params=(KEY, OWNER), replies={200: Reply("TransactionKey", TRANSACTION_KEY), **errors(400, 404, 412)})
async def get_transaction_key(call: Call) -> dict[str, Any]:
    keys = _keys(call)
    return key_json(keys, keys.find(*_requested(call)))


@routes.add("DELETE", BASE + "/{key}",
            summary="Remove a transaction key: fence its connection and abort its open transaction.",
            params=(KEY, OWNER), replies={204: DONE, **errors(400, 404, 412, 503)})
async def delete_transaction_key(call: Call) -> None:
    await _keys(call).delete(*_requested(call))


def transaction_key_metrics(service: BrokerService) -> Iterator[Metric]:
    """The PIP's metrics, for the broker's Prometheus collector."""
    cluster = service.config.cluster_name
    keys = service.coordinator.keys
    states = list(keys.keys())
    count = GaugeMetricFamily("pulsar_txn_transaction_key_count", "Transaction keys in use", labels=["cluster"])
    count.add_metric([cluster], len(states))
    yield count
    epoch = GaugeMetricFamily("pulsar_txn_transaction_key_epoch", "The current epoch of each transaction key",
                              labels=["cluster", "owner", "transaction_key"])
    age = SummaryMetricFamily("pulsar_txn_transaction_key_age",
                              "Seconds since each transaction key's current epoch was taken",
                              labels=["cluster", "owner", "transaction_key"])
    for state in states:
        info = keys.info(state)
        epoch.add_metric([cluster, info.owner, info.key], info.epoch)
        age.add_metric([cluster, info.owner, info.key], 1, info.age_ms / 1000)
    yield epoch
    yield age
