"""Transactions: `/admin/v3/transactions/...` (Pulsar's Transactions resource): coordinator
stats, a transaction's metadata and its state in each participant, transaction buffer and
pending-ack stats, slow transactions, and the force-abort of a stuck transaction.

The force-abort is Pulsar's `POST /admin/v3/transactions/abortTransaction/{mostSigBits}/
{leastSigBits}` (PIP-325, the answer to apache/pulsar#19786): a transaction left open by a
crashed or hung client holds back every reader of the topics it wrote to until its timeout;
aborting it releases them at once. It is the coordinator's own abort, so it is durable and
idempotent: aborting an aborted or timed-out transaction succeeds again, aborting a committed
or committing one is 409.
"""

from __future__ import annotations

from typing import Any

from pyengine.admin import stats
from pyengine.admin.names import subscription_name
from pyengine.admin.routes_topics import existing_topic, requested_topic
from pyengine.admin.routing import Call, Param, Reply, RouteTable
from pyengine.admin.schemas import (
    BOOLEAN,
    BUFFER_STATS,
    COORDINATOR_STATS,
    COORDINATOR_STATS_MAP,
    DONE,
    IN_BUFFER_STATS,
    IN_PENDING_ACK_STATS,
    INT64_MAX,
    LEAST_BITS,
    MOST_BITS,
    PENDING_ACK_STATS,
    SUBSCRIPTION,
    TOPIC_PATH,
    TRANSACTION_METADATA,
    TRANSACTION_METADATA_MAP,
    errors,
)
from pyengine.broker.subscription import Subscription
from pyengine.errors import SubscriptionNotFoundError, TransactionNotFoundError
from pyengine.transaction import TxnAction, TxnStatus
from pyengine.transaction.coordinator import TxnMeta
from pyengine.transaction.coordinator.metadata_coordinator import MetadataTransactionCoordinator
from pyengine.transaction.coordinator.metadata_records import (
    IDX_DEADLINE,
    V5_COORDINATOR_ID,
    HeaderState,
    TxnHeader,
    is_v5,
    txn_of_path,
)
from pyengine_kernels import TxnId

routes = RouteTable("transactions")
BASE = "/admin/v3/transactions"
TOPIC_SUFFIX = "/{tenant}/{namespace}/{topic}"
COORDINATOR_ID = Param("coordinatorId", {"type": "integer", "minimum": 0, "maximum": INT64_MAX},
                       "only this coordinator")
LOW_WATER_MARKS = Param("lowWaterMarks", BOOLEAN, "include the low watermark of each coordinator", default=False)
TIMEOUT = Param("timeout", {"type": "integer", "minimum": 0, "maximum": INT64_MAX},
                "open for longer than this many milliseconds", "path", required=True)


def requested_txn(call: Call) -> TxnId:
    return TxnId(call["mostSigBits"], call["leastSigBits"])


async def requested_subscription(call: Call) -> Subscription:
    topic = await existing_topic(call.service, requested_topic(call))
    name = subscription_name(call["subName"])
    subscription = topic.subscriptions.get(name)
    if subscription is None:
        raise SubscriptionNotFoundError(f"subscription {name} does not exist on {topic.name}")
    return subscription


COORDINATOR_INFO_MAP = {
    "type": "object", "description": "coordinator id -> Pulsar's TransactionCoordinatorInfo",
    "additionalProperties": {"type": "object", "properties": {"id": {"type": "integer"},
                                                              "brokerServiceUrl": {"type": "string"}},
                             "required": ["id", "brokerServiceUrl"]},
}


@routes.add("GET", BASE + "/coordinators", summary="List the transaction coordinators and the broker serving each.",
            replies={200: Reply("TransactionCoordinatorInfo per coordinator id", COORDINATOR_INFO_MAP)})
async def list_coordinators(call: Call) -> dict[str, Any]:
    # Pulsar's listCoordinators: `pulsar-admin transactions list` asks it first. This broker
    # serves every coordinator; listed as coordinatorStats lists them (the v5 one too).
    from pyengine.admin.server import _reachable     # server imports the route tables
    url = _reachable(call.service.service_url, call)
    coordinator = call.service.coordinator
    ids = coordinator.coordinator_ids + ([V5_COORDINATOR_ID] if coordinator.v5 is not None else [])
    return {str(cid): {"id": cid, "brokerServiceUrl": url} for cid in ids}


@routes.add("GET", BASE + "/coordinatorStats", summary="Get the stats of the transaction coordinators.",
            params=(COORDINATOR_ID,),
            replies={200: Reply("TransactionCoordinatorStats per coordinator id, or of the one asked for",
                                {"anyOf": [COORDINATOR_STATS_MAP, COORDINATOR_STATS]}), **errors(400, 404)})
async def get_coordinator_stats(call: Call) -> dict[str, Any]:
    coordinator = call.service.coordinator
    if call["coordinatorId"] == V5_COORDINATOR_ID and coordinator.v5 is not None:
        return await _v5_coordinator_stats(coordinator.v5)
    if call["coordinatorId"] is not None:
        return stats.coordinator_stats(coordinator.store(call["coordinatorId"]))
    every = {str(cid): stats.coordinator_stats(coordinator.store(cid)) for cid in coordinator.coordinator_ids}
    if coordinator.v5 is not None:          # every coordinator, as slowTransactions lists them
        every[str(V5_COORDINATOR_ID)] = await _v5_coordinator_stats(coordinator.v5)
    return every


async def _v5_coordinator_stats(v5: Any) -> dict[str, Any]:
    """The v5 coordinator's (PIP-473): no log, no low watermark; its open txns are headers."""
    return {"state": "Ready", "leastSigBits": -1, "lowWaterMark": -1, "ongoingTxnSize": await v5.open_count()}


@routes.add("GET", BASE + "/transactionMetadata/{mostSigBits}/{leastSigBits}",
            summary="Get a transaction's metadata and its state in each participant.",
            params=(MOST_BITS, LEAST_BITS),
            replies={200: Reply("TransactionMetadata", TRANSACTION_METADATA), **errors(400, 404, 503)})
async def get_transaction_metadata(call: Call) -> dict[str, Any]:
    txn = requested_txn(call)
    if is_v5(txn):      # a header in the metadata store; the v5 coordinator knows no participants
        return await stats.transaction_metadata(call.service, await call.service.coordinator.v5.get(txn))
    return await stats.transaction_metadata(call.service, call.service.coordinator.get(txn))


@routes.add("GET", BASE + "/transactionInBufferStats" + TOPIC_SUFFIX + "/{mostSigBits}/{leastSigBits}",
            summary="Get a transaction's state in a topic's transaction buffer.",
            params=(*TOPIC_PATH, MOST_BITS, LEAST_BITS),
            replies={200: Reply("TransactionInBufferStats", IN_BUFFER_STATS), **errors(400, 404, 412)})
async def get_transaction_in_buffer_stats(call: Call) -> dict[str, Any]:
    topic = await existing_topic(call.service, requested_topic(call))
    return stats.in_buffer_stats(topic, requested_txn(call))


@routes.add("GET", BASE + "/transactionInPendingAckStats" + TOPIC_SUFFIX + "/{subName}/{mostSigBits}/{leastSigBits}",
            summary="Get a transaction's state in a subscription's pending acks.",
            params=(*TOPIC_PATH, SUBSCRIPTION, MOST_BITS, LEAST_BITS),
            replies={200: Reply("TransactionInPendingAckStats", IN_PENDING_ACK_STATS), **errors(400, 404, 412)})
async def get_transaction_in_pending_ack_stats(call: Call) -> dict[str, Any]:
    return stats.in_pending_ack_stats(await requested_subscription(call), requested_txn(call))


@routes.add("GET", BASE + "/transactionBufferStats" + TOPIC_SUFFIX,
            summary="Get the stats of a topic's transaction buffer.", params=(*TOPIC_PATH, LOW_WATER_MARKS),
            replies={200: Reply("TransactionBufferStats", BUFFER_STATS), **errors(400, 404, 412)})
async def get_transaction_buffer_stats(call: Call) -> dict[str, Any]:
    topic = await existing_topic(call.service, requested_topic(call))
    return stats.buffer_stats(topic, call["lowWaterMarks"])


@routes.add("GET", BASE + "/pendingAckStats" + TOPIC_SUFFIX + "/{subName}",
            summary="Get the stats of a subscription's pending acks.",
            params=(*TOPIC_PATH, SUBSCRIPTION, LOW_WATER_MARKS),
            replies={200: Reply("TransactionPendingAckStats", PENDING_ACK_STATS), **errors(400, 404, 412)})
async def get_pending_ack_stats(call: Call) -> dict[str, Any]:
    return stats.pending_ack_stats(await requested_subscription(call), call["lowWaterMarks"])


@routes.add("GET", BASE + "/slowTransactions/{timeout}",
            summary="List the transactions not ended after `timeout` ms (open, or stuck committing/aborting; "
                    "v4 and v5).",
            params=(TIMEOUT, COORDINATOR_ID),
            replies={200: Reply("TransactionMetadata per txn id", TRANSACTION_METADATA_MAP), **errors(400, 404)})
async def get_slow_transactions(call: Call) -> dict[str, Any]:
    service = call.service
    coordinator = service.coordinator
    wanted, timeout = call["coordinatorId"], call["timeout"]
    v5 = coordinator.v5
    asks_v5 = v5 is not None and wanted == V5_COORDINATOR_ID
    ids = [] if asks_v5 else [wanted] if wanted is not None else coordinator.coordinator_ids
    now = service.config.clock()
    slow = {}
    lookups = stats.ParticipantLookups()    # each participant read once, not once per slow txn
    for cid in ids:
        for meta in coordinator.store(cid).live_transactions():
            if now - meta.start_ms > timeout:
                slow[str(meta.txn_id)] = await stats.transaction_metadata(service, meta, lookups)
    if v5 is not None and (wanted is None or asks_v5):
        for meta in await _slow_v5_transactions(v5, timeout):
            slow[str(meta.txn_id)] = await stats.transaction_metadata(service, meta, lookups)
    return slow


async def _slow_v5_transactions(v5: MetadataTransactionCoordinator, timeout: int) -> list[TxnMeta]:
    """The v5 transactions OPEN for longer than `timeout` ms (every broker's: the headers in the
    metadata store, through the index of open headers by deadline), as `v5.get` gives them."""
    now = v5.clock()
    slow = []
    for record in await v5.store.range_query(IDX_DEADLINE):
        header = TxnHeader.decode(record.value, record.path)
        if header.state is not HeaderState.OPEN or now - header.created_ms <= timeout:
            continue
        try:
            meta = await v5.get(txn_of_path(record.path))
        except TransactionNotFoundError:
            continue                    # ended and collected since the query
        if meta.status is TxnStatus.OPEN:
            slow.append(meta)
    return slow


@routes.add("POST", BASE + "/abortTransaction/{mostSigBits}/{leastSigBits}",
            summary="Abort a transaction now (a stuck one holds its topics' readers back until it times out).",
            params=(MOST_BITS, LEAST_BITS), replies={204: DONE, **errors(400, 404, 409, 503)})
async def abort_transaction(call: Call) -> None:
    # Also a txn fenced by its transaction key (already aborted: succeeds again).
    await call.service.coordinator.end_transaction(requested_txn(call), TxnAction.ABORT, check_epoch=False)
