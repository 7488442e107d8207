"""Transactions: `/admin/v3/transactions/...` (Pulsar's Transactions resource): coordinator
stats, a transaction's metadata and its state in each participant, transaction buffer and
pending-ack stats, slow transactions, and the force-abort of a stuck transaction; the internal
stats of the transaction logs (a coordinator's, a subscription's pending acks, the buffer's
snapshots), where a position stands in a subscription's pending acks, and the scaling of the
transaction coordinators.

The logs Pulsar keeps in managed ledgers are key ranges of LMDB databases here: their internal
stats have Pulsar's shape, filled with what such a range has (its records and their bytes; no
ledgers, no cursors). Scaling the coordinators is Pulsar's: the partitions of
transaction_coordinator_assign only grow (406 otherwise); here the new count is made durable
and the new coordinators start at once, in the running broker. It is refused (409) while a
transaction key would move to another coordinator: a key's coordinator is its hash modulo the
number of coordinators, which its client computed once, so its next connect would be refused
as if fenced.

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
from pyengine.admin.errors import CONFLICT, METHOD_NOT_ALLOWED, NOT_ACCEPTABLE, NOT_FOUND, AdminError
from pyengine.admin.names import subscription_name
from pyengine.admin.routes_topics import existing_topic, requested_topic
from pyengine.admin.routing import Call, Param, Reply, RouteTable
from pyengine.admin.schemas import (
    BOOLEAN,
    BUFFER_INTERNAL_STATS,
    BUFFER_STATS,
    COORDINATOR_INTERNAL_STATS,
    COORDINATOR_STATS,
    COORDINATOR_STATS_MAP,
    DONE,
    IN_BUFFER_STATS,
    IN_PENDING_ACK_STATS,
    INT64_MAX,
    LEAST_BITS,
    MAX_PARTITIONS,
    MOST_BITS,
    PENDING_ACK_INTERNAL_STATS,
    PENDING_ACK_STATS,
    POSITION_IN_PENDING_ACK_STATS,
    SUBSCRIPTION,
    TOPIC_PATH,
    TRANSACTION_METADATA,
    TRANSACTION_METADATA_MAP,
    error,
    errors,
)
from pyengine.broker.policies import TC_ASSIGN_TOPIC
from pyengine.broker.subscription import Subscription
from pyengine.errors import SubscriptionNotFoundError, TransactionNotFoundError
from pyengine.transaction import TxnAction, TxnStatus
from pyengine.transaction.buffer.topic_buffer import TopicTransactionBuffer
from pyengine.transaction.coordinator import TxnMeta
from pyengine.transaction.coordinator.keys import coordinator_for
from pyengine.transaction.coordinator.metadata_coordinator import MetadataTransactionCoordinator
from pyengine.transaction.coordinator.metadata_records import (
    IDX_DEADLINE,
    V5_COORDINATOR_ID,
    HeaderState,
    TxnHeader,
    is_v5,
    txn_of_path,
)
from pyengine.transaction.pendingack.log_store import LogPendingAckStore
from pyengine_kernels import Position, TxnId

routes = RouteTable("transactions")
BASE = "/admin/v3/transactions"
TOPIC_SUFFIX = "/{tenant}/{namespace}/{topic}"
COORDINATOR_ID = Param("coordinatorId", {"type": "integer", "minimum": 0, "maximum": INT64_MAX},
                       "only this coordinator")
LOW_WATER_MARKS = Param("lowWaterMarks", BOOLEAN, "include the low watermark of each coordinator", default=False)
TIMEOUT = Param("timeout", {"type": "integer", "minimum": 0, "maximum": INT64_MAX},
                "open for longer than this many milliseconds", "path", required=True)
SEGMENT_STATS = Param("segmentStats", BOOLEAN, "v4: also list each sealed snapshot segment (its last aborted txn "
                      "and that txn's abort marker)", default=False)
METADATA = Param("metadata", BOOLEAN, "Pulsar's: add each ledger's metadata. Accepted; these logs are LMDB key "
                 "ranges with no ledgers, so there is none to add", default=False)
COORDINATOR_PATH_ID = Param("coordinatorId", {"type": "integer", "minimum": 0, "maximum": INT64_MAX},
                            "the coordinator", "path", required=True)
LEDGER_ID = Param("ledgerId", {"type": "integer", "minimum": 0, "maximum": INT64_MAX},
                  "ledger id of the position", "path", required=True)
ENTRY_ID = Param("entryId", {"type": "integer", "minimum": 0, "maximum": INT64_MAX},
                 "entry id of the position", "path", required=True)
BATCH_INDEX = Param("batchIndex", {"type": "integer", "minimum": 0, "maximum": 2**31 - 1},
                    "an index of the batch entry at the position")
# POST .../transactionCoordinator/replicas: a Java int, as Pulsar reads it (else 400). Not more
# than the coordinators running is 406, as Pulsar; more than MAX_PARTITIONS is 406 too (ours:
# every Pulsar client connects to every coordinator).
REPLICAS = {"type": "integer", "minimum": -(2**31), "maximum": 2**31 - 1,
            "description": f"the number of transaction coordinators: more than now, at most {MAX_PARTITIONS}"}


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
    # serves every coordinator; listed as coordinatorStats lists them (see there for v5's).
    from pyengine.admin.server import _reachable     # server imports the route tables
    url = _reachable(call.service.service_url, call)
    return {str(cid): {"id": cid, "brokerServiceUrl": url} for cid in call.service.coordinator.coordinator_ids}


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
    # The v4 coordinators: Pulsar's admin client reads this map's keys as Java ints, which the
    # v5 coordinator's id (5 << 32) overflows, failing the whole call. Its stats are asked for
    # by id (`?coordinatorId=21474836480`); its transactions are in slowTransactions.
    return {str(cid): stats.coordinator_stats(coordinator.store(cid)) for cid in coordinator.coordinator_ids}


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
            summary="Get the stats of a topic's transaction buffer.",
            params=(*TOPIC_PATH, LOW_WATER_MARKS, SEGMENT_STATS),
            replies={200: Reply("TransactionBufferStats", BUFFER_STATS), **errors(400, 404, 412)})
async def get_transaction_buffer_stats(call: Call) -> dict[str, Any]:
    topic = await existing_topic(call.service, requested_topic(call))
    return stats.buffer_stats(topic, call["lowWaterMarks"], call["segmentStats"])


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


# --- internal stats, positions, scaling ------------------------------------------------------

@routes.add("GET", BASE + "/coordinatorInternalStats/{coordinatorId}",
            summary="Get the internal stats of a transaction coordinator's log.",
            params=(COORDINATOR_PATH_ID, METADATA),
            replies={200: Reply("TransactionCoordinatorInternalStats", COORDINATOR_INTERNAL_STATS),
                     **errors(400, 404),
                     405: error("The v5 coordinator (PIP-473) keeps no log (Pulsar: the coordinator does not use "
                                "MLTransactionMetadataStore)")})
async def get_coordinator_internal_stats(call: Call) -> dict[str, Any]:
    coordinator, wanted = call.service.coordinator, call["coordinatorId"]
    if wanted == V5_COORDINATOR_ID and coordinator.v5 is not None:
        raise AdminError(METHOD_NOT_ALLOWED, f"transaction coordinator {wanted} is the v5 (metadata-driven) one: "
                                             "it keeps no transaction log")
    return await stats.coordinator_internal_stats(coordinator.store(wanted))


@routes.add("GET", BASE + "/pendingAckInternalStats" + TOPIC_SUFFIX + "/{subName}",
            summary="Get the internal stats of a subscription's pending-ack log.",
            params=(*TOPIC_PATH, SUBSCRIPTION, METADATA),
            replies={200: Reply("TransactionPendingAckInternalStats", PENDING_ACK_INTERNAL_STATS),
                     **errors(400, 404, 412),
                     405: error("The subscription's pending acks are v5 (PIP-473) metadata records, not a log "
                                "(Pulsar: the pending ack handle does not use a managed ledger)")})
async def get_pending_ack_internal_stats(call: Call) -> dict[str, Any]:
    subscription = await requested_subscription(call)
    store = getattr(subscription.pending_ack, "store", None)
    if not isinstance(store, LogPendingAckStore):
        raise AdminError(METHOD_NOT_ALLOWED, f"the pending acks of subscription {subscription.name} of "
                                             f"{subscription.topic.name} are v5 metadata records: no pending-ack log")
    return await stats.pending_ack_internal_stats(subscription, store)


@routes.add("GET", BASE + "/transactionBufferInternalStats" + TOPIC_SUFFIX,
            summary="Get the internal stats of a topic's transaction buffer snapshots.",
            params=(*TOPIC_PATH, METADATA),
            replies={200: Reply("TransactionBufferInternalStats", BUFFER_INTERNAL_STATS),
                     **errors(400, 412),
                     404: error("The topic does not exist, or no snapshot of its transaction buffer is stored "
                                "(none written yet, snapshots disabled, or a v5 buffer: it keeps none)")})
async def get_transaction_buffer_internal_stats(call: Call) -> dict[str, Any]:
    topic = await existing_topic(call.service, requested_topic(call))
    if not isinstance(topic.buffer, TopicTransactionBuffer):
        raise AdminError(NOT_FOUND, f"the transaction buffer of {topic.name} is v5 (metadata-driven): it keeps no "
                                    "snapshots")
    internal = await stats.buffer_internal_stats(topic)
    if internal is None:
        raise AdminError(NOT_FOUND, f"no transaction buffer snapshot of {topic.name} is stored (none written yet, "
                                    "or snapshots are disabled)")
    return internal


@routes.add("GET", BASE + "/positionStatsInPendingAck" + TOPIC_SUFFIX + "/{subName}/{ledgerId}/{entryId}",
            summary="Get where a position stands in a subscription's pending acks.",
            params=(*TOPIC_PATH, SUBSCRIPTION, LEDGER_ID, ENTRY_ID, BATCH_INDEX),
            replies={200: Reply("PositionInPendingAckStats", POSITION_IN_PENDING_ACK_STATS),
                     **errors(400, 404, 412)})
async def get_position_stats_in_pending_ack(call: Call) -> dict[str, Any]:
    subscription = await requested_subscription(call)
    position = Position(call["ledgerId"], call["entryId"])
    return {"state": stats.position_in_pending_ack(subscription, position, call["batchIndex"])}


@routes.add("POST", BASE + "/transactionCoordinator/replicas",
            summary="Scale the transaction coordinators up to the number given (Pulsar's "
                    "scaleTransactionCoordinators): the partitions of transaction_coordinator_assign grow to it, "
                    "durably, and the new coordinators start at once. Clients started before see the new ones "
                    "when they discover the coordinators again.",
            body=REPLICAS, body_required=True,
            replies={204: DONE, **errors(400),
                     406: error("Not more than the coordinators running now, or more than the maximum"),
                     409: error("Transaction keys would move to another coordinator (their holders' reconnects "
                                "would be refused)"),
                     **errors(503)})
async def scale_transaction_coordinators(call: Call) -> None:
    await scale_coordinators(call.service, call.body)


async def scale_coordinators(service: BrokerService, replicas: int) -> None:
    """Scale the v4 coordinators up to `replicas` (also what an update of the partitioned topic
    transaction_coordinator_assign does, as in Pulsar, where its partitions are the coordinators)."""
    v4 = service.coordinator.v4
    policies = service.policies
    # Checked and recorded in one event-loop turn (update_partitions caches the new count
    # before it awaits the write): a concurrent request is checked against this one.
    current = max(len(v4.coordinator_ids), policies.partitions(TC_ASSIGN_TOPIC))
    if replicas <= current:
        raise AdminError(NOT_ACCEPTABLE, f"the number of transaction coordinators can only grow: {replicas} is not "
                                         f"more than the {current} there are")
    if replicas > MAX_PARTITIONS:
        raise AdminError(NOT_ACCEPTABLE, f"at most {MAX_PARTITIONS} transaction coordinators, not {replicas}")
    # Key connects wait from the check of the keys until the new coordinators serve (a key
    # connected in between would be checked against the old number).
    with v4.keys.connects_held():
        moved = [key for key in v4.keys.keys_that_may_connect()
                 if coordinator_for(key.owner, key.key, current) != coordinator_for(key.owner, key.key, replicas)]
        if moved:
            # A key belongs to the coordinator its CRC-32 modulo the number of coordinators names,
            # which its client computed once (the fencing PIP leaves coordinator expansion out): at
            # its next connect the broker would expect another one and refuse it as a fenced epoch.
            raise AdminError(CONFLICT, f"{len(moved)} transaction key(s) would move to another coordinator with "
                                       f"{replicas} coordinators (e.g. {moved[0].key!r}): their clients would be "
                                       "refused at their next connect. Delete those keys first, or stop their "
                                       "clients and restart the broker with --num-coordinators")
        # Durable first: the next start must recover the new coordinators' txns (it runs as many
        # coordinators as the assign topic has partitions, never fewer).
        await policies.update_partitions(TC_ASSIGN_TOPIC, replicas)
        policies.num_coordinators = max(policies.num_coordinators, replicas)
        await v4.add_coordinators(replicas)
