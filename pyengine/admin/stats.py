"""Pulsar-shaped stats built from the live broker objects: what the admin replies carry.

Field names are those of Pulsar's admin data classes (TopicStats, PersistentTopicInternalStats,
TransactionCoordinatorStats, TransactionMetadata, TransactionBufferStats, ...). Only what this
broker measures is filled: what it does not track (a consumer's address, a topic's
averageMsgSize, ...) is absent rather than zero. Message rates (msgRateIn, msgThroughputIn,
msgRateOut, msgThroughputOut, msgRateRedeliver, msgRateExpired) are Pulsar's: per second over
the last stats interval (pyengine.broker.rates).
"""

from __future__ import annotations

import datetime
import urllib.parse
from typing import Any

from pyengine.broker.consumer import Consumer
from pyengine.broker.rates import RateCounter
from pyengine.broker.service import BrokerService
from pyengine.broker.subscription import Subscription
from pyengine.broker.topic import Topic
from pyengine.errors import TopicNotFoundError
from pyengine.naming import TopicName
from pyengine.transaction import TxnStatus
from pyengine.transaction.coordinator import TxnMeta
from pyengine.transaction.coordinator.log_store import LogTransactionMetadataStore
from pyengine.transaction.coordinator.metadata_records import is_v5
from pyengine.transaction.pendingack.handle import HandleState
from pyengine_kernels import Position, TxnId

# Pulsar's spelling of subscription types and component states.
_SUB_TYPES = {"exclusive": "Exclusive", "shared": "Shared", "failover": "Failover", "key_shared": "Key_Shared"}
_STATES = {"new": "None", "none": "None", "initializing": "Initializing", "replaying": "Initializing",
           "ready": "Ready", "error": "Error", "closed": "Close"}
_LIVE = (TxnStatus.OPEN, TxnStatus.COMMITTING, TxnStatus.ABORTING)


def pulsar_state(state: str) -> str:
    return _STATES.get(state, state)


# --- topics -------------------------------------------------------------------------------

def topic_stats(topic: Topic) -> dict[str, Any]:
    # Readers' (non-durable) subscriptions are listed too, `isDurable` false, as Pulsar lists
    # them; the topic's backlog sums every subscription's, as Pulsar's pulsar_msg_backlog.
    subscriptions = {name: subscription_stats(sub) for name, sub in
                     [*topic.subscriptions.items(), *topic.non_durable_subscriptions().items()]}
    backlog = sum(sub["msgBacklog"] for sub in subscriptions.values())
    return {
        "msgInCounter": topic.msg_in_counter,
        "bytesInCounter": topic.bytes_in_counter,
        "msgRateIn": topic.rate_in.msg_rate, "msgThroughputIn": topic.rate_in.byte_rate,
        **_out(topic.rate_out),
        "storageSize": topic.ledger.total_size,
        "msgBacklog": backlog,
        "publishers": [{"producerName": p.name, "producerId": p.producer_id, "msgInCounter": p.rate_in.msgs,
                        "bytesInCounter": p.rate_in.bytes, "msgRateIn": p.rate_in.msg_rate,
                        "msgThroughputIn": p.rate_in.byte_rate} for p in topic.producers.values()],
        "subscriptions": subscriptions,
        "deduplicationStatus": "Enabled" if topic.dedup.enabled else "Disabled",
    }


def subscription_stats(subscription: Subscription) -> dict[str, Any]:
    consumers = [_consumer_stats(subscription, c) for c in subscription.consumers]
    return {
        "msgBacklog": subscription.backlog(),
        **_out(subscription.rate_out),
        # Its consumers' (as Pulsar sums them: Shared and Key_Shared only count).
        "unackedMessages": sum(c["unackedMessages"] for c in consumers),
        "msgRateRedeliver": sum(c["msgRateRedeliver"] for c in consumers),
        "msgRateExpired": subscription.rate_expired.msg_rate,
        # Held back for delayed delivery now (Pulsar's msgDelayed; 0 on Exclusive and Failover).
        "msgDelayed": subscription.dispatcher.number_of_delayed_messages(),
        # Message expiry (Pulsar's totalMsgExpired and lastExpireTimestamp).
        "totalMsgExpired": subscription.total_msg_expired,
        "lastExpireTimestamp": subscription.last_expire_timestamp,
        "type": _SUB_TYPES.get(subscription.sub_type or "", None),
        "isDurable": subscription.durable,
        "consumers": consumers,
        "blockedSubscriptionOnUnackedMsgs": subscription.dispatcher.blocked_on_unacked,
        # Key_Shared: the KeySharedMeta setting of its consumers (false on other types, as Pulsar).
        "allowOutOfOrderDelivery": subscription.sub_type == "key_shared" and subscription.allow_out_of_order_delivery,
        **({"keySharedMode": subscription.key_shared_mode} if subscription.sub_type == "key_shared" else {}),
        # Key_Shared draining hashes (PIP-379), as Pulsar 4.0: its consumers' summed.
        **{field: sum(c[field] for c in consumers) for field in _DRAINING_TOTALS},
        "subscriptionProperties": subscription.subscription_properties,
    }


_DRAINING_TOTALS = ("drainingHashesCount", "drainingHashesClearedTotal", "drainingHashesUnackedMessages")
# what a topic, subscription or consumer delivered: counters, and rates over the last stats
# interval (pyengine.broker.rates)
_OUT_FIELDS = ("msgOutCounter", "bytesOutCounter", "msgRateOut", "msgThroughputOut")
_RATE_TOTALS = ("msgRateIn", "msgThroughputIn", *_OUT_FIELDS)


def _out(rate: RateCounter) -> dict[str, Any]:
    return dict(zip(_OUT_FIELDS, (rate.msgs, rate.bytes, rate.msg_rate, rate.byte_rate)))


def _consumer_stats(subscription: Subscription, consumer: Consumer) -> dict[str, Any]:
    dispatcher = subscription.dispatcher
    draining = dispatcher.draining_hashes(consumer)
    # Key_Shared: the hashes it is given, as Pulsar 4.0's keyHashRangeArrays (other types: absent)
    ranges = ({"keyHashRangeArrays": [list(r) for r in dispatcher.key_hash_ranges(consumer)]}
              if subscription.sub_type == "key_shared" else {})
    return {
        "consumerName": consumer.name, "availablePermits": consumer.permits,
        **_out(consumer.rate_out),
        "msgRateRedeliver": consumer.rate_redeliver.msg_rate,
        # As Pulsar, unackedMessages counts on Shared and Key_Shared only (individual-ack mode):
        # Exclusive and Failover consumers show 0.
        "unackedMessages": (consumer.unacked_messages if subscription.sub_type in ("shared", "key_shared")
                            else 0),
        "blockedConsumerOnUnackedMsgs": consumer.blocked_on_unacked,
        # Key_Shared (PIP-379): the key hashes this consumer still holds unacknowledged entries
        # of while another consumer owns them now (0 and empty on other subscription types).
        "drainingHashesCount": len(draining),
        "drainingHashesClearedTotal": dispatcher.draining_hashes_cleared(consumer),
        "drainingHashesUnackedMessages": sum(d.unack_msgs for d in draining),
        "drainingHashes": [{"hash": d.hash_value, "unackMsgs": d.unack_msgs, "blockedAttempts": d.blocked_attempts}
                           for d in draining],
        **ranges,
    }


def partitioned_topic_stats(partitions: int, loaded: dict[str, Topic], per_partition: bool = True) -> dict[str, Any]:
    """Pulsar's PartitionedTopicStats: the TopicStats of the whole topic (counters summed over
    its partitions, each partitioned producer or consumer merged into one) and, under
    `partitions` unless `per_partition` is false, each partition's."""
    each = {name: topic_stats(topic) for name, topic in loaded.items()}
    totals = {key: sum(stats[key] for stats in each.values())
              for key in ("msgInCounter", "bytesInCounter", "storageSize", "msgBacklog", *_RATE_TOTALS)}
    publishers: list[dict[str, Any]] = []
    subscriptions: dict[str, dict[str, Any]] = {}
    for stats in each.values():
        _merge_by_name(publishers, stats["publishers"], "producerName")
        for name, sub in stats["subscriptions"].items():
            whole = subscriptions.get(name)
            if whole is None:
                subscriptions[name] = {**sub, "consumers": [dict(c) for c in sub["consumers"]]}
                continue
            consumers = whole["consumers"]
            _add_into(whole, {key: value for key, value in sub.items() if key != "consumers"})
            _merge_by_name(consumers, sub["consumers"], "consumerName")
    whole_topic = {"metadata": {"partitions": partitions}, **totals, "publishers": publishers,
                   "subscriptions": subscriptions}
    if per_partition:
        whole_topic["partitions"] = each
    return whole_topic


def _merge_by_name(into: list[dict[str, Any]], items: list[dict[str, Any]], name_field: str) -> None:
    """A partitioned producer or consumer has one per partition, under one name: those are
    summed into one entry, as Pulsar merges a partial producer's by name (TopicStatsImpl.add).
    Clients of different names stay apart (Pulsar's other merge, by position in the list, can
    take two clients for one); so do two of one name on the same partition."""
    taken: set[int] = set()
    for item in items:
        match = next((i for i, whole in enumerate(into)
                      if i not in taken and whole[name_field] == item[name_field]), None)
        if match is None:
            into.append(dict(item))
            taken.add(len(into) - 1)
        else:
            _add_into(into[match], item)
            taken.add(match)


def _add_into(whole: dict[str, Any], part: dict[str, Any]) -> None:
    """Counters and rates summed, flags or-ed, draining hashes listed together, subscription
    properties merged, the latest expiry kept; names, ids, types and hash ranges stay the
    first partition's that has them."""
    for key, value in part.items():
        if whole.get(key) is None:            # (a type shows once a partition has consumers)
            whole[key] = value
        elif key in _FIRST_PARTITION_KEEPS:
            continue
        elif key == "lastExpireTimestamp":
            whole[key] = max(whole[key], value)
        elif isinstance(value, bool):
            whole[key] = whole[key] or value
        elif isinstance(value, (int, float)):
            whole[key] += value
        elif key == "drainingHashes":
            whole[key] = [*whole[key], *value]
        elif key == "subscriptionProperties":     # as Pulsar's SubscriptionStatsImpl.add (putAll)
            whole[key] = {**whole[key], **value}


_FIRST_PARTITION_KEEPS = frozenset({"producerId", "producerName", "consumerName", "type", "keyHashRangeArrays"})


def internal_stats(topic: Topic) -> dict[str, Any]:
    ledger = topic.ledger
    ledgers = list(ledger.ledgers.values())
    current = ledgers[-1] if ledgers else None
    return {
        "numberOfEntries": ledger.number_of_entries,
        "totalSize": ledger.total_size,
        "currentLedgerEntries": current.entries if current else 0,
        "currentLedgerSize": current.size if current else 0,
        "lastLedgerCreatedTimestamp": _iso_ms(current.created_ms) if current else "",
        "lastConfirmedEntry": str(ledger.lac),
        "state": "Terminated" if ledger.terminated_at is not None else "LedgerOpened",
        "ledgers": [{"ledgerId": info.ledger_id, "entries": info.entries, "size": info.size, "offloaded": False}
                    for info in ledgers],
        # Every cursor, readers' (non-durable) ones too, as Pulsar's managed ledger lists them.
        "cursors": {name: _cursor_stats(sub) for name, sub in
                    [*topic.subscriptions.items(), *topic.non_durable_subscriptions().items()]},
    }


def _cursor_stats(subscription: Subscription) -> dict[str, Any]:
    """Pulsar's CursorStats, for what this cursor has."""
    cursor = subscription.cursor
    ledger = cursor.ledger
    holes = cursor.individually_deleted_ranges()
    return {
        "markDeletePosition": str(cursor.mark_delete),
        "readPosition": str(cursor.read_position),
        "state": "Open",
        "active": bool(subscription.consumers),
        # Acknowledged after the mark-delete position, in Pulsar's form: [(1:0..1:1],(1:2..1:3]]
        "individuallyDeletedMessages": "[" + ",".join(f"({start}..{end}]" for start, end in holes) + "]",
        "totalNonContiguousDeletedMessagesRange": len(holes),
        "numberOfEntriesSinceFirstNotAckedMessage":
            ledger.entries_between(cursor.mark_delete, min(cursor.read_position, ledger.lac)),
        "properties": dict(cursor.properties),
    }


# --- transactions -------------------------------------------------------------------------

def coordinator_stats(store: LogTransactionMetadataStore) -> dict[str, Any]:
    counts = store.status_counts()
    return {
        "state": pulsar_state(store.state),
        "leastSigBits": store.last_sequence,
        "lowWaterMark": store.low_watermark(),
        "ongoingTxnSize": sum(counts[status] for status in _LIVE),
        "recoverStartTime": store.recover_start_ms,
        "recoverEndTime": store.recover_end_ms,
    }


# --- transaction logs (internal stats) ------------------------------------------------------
# Pulsar keeps a coordinator's log, a subscription's pending acks and the buffer snapshots in
# managed ledgers and answers their ManagedLedgerInternalStats. Here each is a key range of an
# LMDB database: its records and their bytes are what it has of those stats. It has no ledgers
# (nothing rolls over, nothing is offloaded) and no cursors (replay is a scan of the range),
# hence the empty lists.

def log_internal_stats(records: int, size: int) -> dict[str, Any]:
    """Pulsar's ManagedLedgerInternalStats of a log kept as an LMDB key range."""
    return {"numberOfEntries": records, "totalSize": size, "ledgers": [], "cursors": {}}


def log_stats(name: str, records: int, size: int) -> dict[str, Any]:
    """Pulsar's TransactionLogStats (also the shape of its SnapshotInternalStats)."""
    return {"managedLedgerName": name, "managedLedgerInternalStats": log_internal_stats(records, size)}


def persistence_name(topic: TopicName) -> str:
    """The managed-ledger name Pulsar gives a persistent topic (getPersistenceNamingEncoding)."""
    return f"{topic.tenant}/{topic.namespace}/persistent/{urllib.parse.quote_plus(topic.local_name)}"


async def coordinator_internal_stats(store: LogTransactionMetadataStore) -> dict[str, Any]:
    """Pulsar's TransactionCoordinatorInternalStats: the coordinator's log, named as Pulsar
    names it (`__transaction_log_<id>` of pulsar/system), kept in LMDB's `txn_log`."""
    records, size = await store.stored_log()
    name = persistence_name(TopicName("persistent", "pulsar", "system", f"__transaction_log_{store.coordinator_id}"))
    return {"transactionLogStats": log_stats(name, records, size)}


async def pending_ack_internal_stats(subscription: Subscription, store: Any) -> dict[str, Any]:
    """Pulsar's TransactionPendingAckInternalStats: the subscription's pending-ack log, named as
    Pulsar names its store (`<topic>-<subscription>__transaction_pending_ack`), kept in LMDB's
    `pending_ack`. `store`: its LogPendingAckStore."""
    records, size = await store.stored()
    topic = TopicName.parse(subscription.topic.name)
    name = persistence_name(TopicName(topic.domain, topic.tenant, topic.namespace,
                                      f"{topic.local_name}-{subscription.name}__transaction_pending_ack"))
    return {"pendingAckLogStats": log_stats(name, records, size)}


SEGMENTS_TOPIC = "__transaction_buffer_snapshot_segments"
INDEXES_TOPIC = "__transaction_buffer_snapshot_indexes"


async def buffer_internal_stats(topic: Topic) -> dict[str, Any] | None:
    """Pulsar's TransactionBufferInternalStats of a v4 buffer: its snapshots are segmented
    (PIP-196), so the type is "Segment", with the segments' store and the index's, named after
    Pulsar's namespace topics but counting this topic's records only (kept in LMDB's
    `tb_snapshots`). None when nothing is stored for the topic (no snapshot written yet)."""
    index_size, segments, segments_size = await topic.buffer.stored_snapshot()
    if index_size is None and not segments:
        return None
    name = TopicName.parse(topic.name)

    def store(local: str) -> str:
        return persistence_name(TopicName("persistent", name.tenant, name.namespace, local))

    return {
        "snapshotType": "Segment",
        "singleSnapshotSystemTopicInternalStats": None,
        "segmentInternalStats": log_stats(store(SEGMENTS_TOPIC), segments, segments_size),
        "segmentIndexInternalStats": log_stats(store(INDEXES_TOPIC), 0 if index_size is None else 1,
                                               index_size or 0),
    }


# Pulsar's PositionInPendingAckStats.State
PENDING_ACK = "PendingAck"
MARK_DELETE = "MarkDelete"
NOT_IN_PENDING_ACK = "NotInPendingAck"
PENDING_ACK_NOT_READY = "PendingAckNotReady"
INVALID_POSITION = "InvalidPosition"
POSITION_STATES = (PENDING_ACK, MARK_DELETE, NOT_IN_PENDING_ACK, PENDING_ACK_NOT_READY, INVALID_POSITION)


def position_in_pending_ack(subscription: Subscription, position: Position, batch_index: int | None) -> str:
    """Where `position` (and its index `batch_index` of a batch, if given) stands for the
    subscription, as Pulsar's checkPositionInPendingAckState answers: PendingAckNotReady until
    the pending acks are replayed; MarkDelete once acknowledged on the cursor; PendingAck while
    an open transaction holds it; InvalidPosition for an index beyond the batch size a
    transaction's ack of the entry gave; else NotInPendingAck.

    Pulsar tells acknowledged from the mark-delete position only (an entry acknowledged
    individually above it reads NotInPendingAck there), and looks at individual acks only;
    here a whole entry acknowledged individually on the cursor is MarkDelete too, and an entry
    under a transaction's pending cumulative ack is PendingAck. (A batch index acknowledged on
    the cursor while the rest of its entry is not reads as Pulsar reads it: NotInPendingAck.)"""
    handle = subscription.pending_ack
    if handle is None or getattr(handle, "state", None) is not HandleState.READY:
        return PENDING_ACK_NOT_READY
    if handle.cursor.is_acked(position):
        return MARK_DELETE
    cumulative = handle.cumulative_ack_of_txn
    if cumulative is not None and position <= cumulative[1]:
        return PENDING_ACK
    held = handle.individual_ack_positions.get(position)
    if held is None:
        return NOT_IN_PENDING_ACK
    if batch_index is None:
        return PENDING_ACK
    if batch_index >= held.batch_size:
        return INVALID_POSITION
    if held.whole:
        return PENDING_ACK
    # Pulsar's ack-set convention: a set bit is an index left free.
    return NOT_IN_PENDING_ACK if _bit(held.ack_set, batch_index) else PENDING_ACK


def _bit(words: Any, index: int) -> bool:
    """Whether bit `index` of an ack set (64-bit words, lowest bit first) is set; past its
    words: clear."""
    word = index // 64
    return word < len(words) and (words[word] >> (index % 64)) & 1 == 1


class ParticipantLookups:
    """A transaction's state in its participants, each participant read once per request: a
    buffer's open txns and a pending-ack handle's stats cost O(its open txns) to build, and
    slowTransactions asks them once per slow txn (quadratic in the open txns of a topic if
    built for each)."""

    def __init__(self) -> None:
        self._starts: dict[str, dict[TxnId, str]] = {}                     # topic -> txn -> start
        self._holders: dict[tuple[str, str], Any] = {}                     # (topic, sub) -> holder

    def in_buffer(self, topic: Topic, txn: TxnId) -> dict[str, Any]:
        starts = self._starts.get(topic.name)
        if starts is None:
            starts = self._starts[topic.name] = {ongoing: str(position)
                                                 for ongoing, position in topic.buffer.ongoing_txns()}
        return {"startPosition": starts.get(txn), "aborted": topic.buffer.is_txn_aborted(txn)}

    def in_pending_ack(self, subscription: Subscription, txn: TxnId) -> dict[str, Any]:
        key = (subscription.topic.name, subscription.name)
        if key not in self._holders:
            self._holders[key] = (subscription.pending_ack.stats()["pending_cumulative_ack"]
                                  if subscription.pending_ack else None)
        holder = self._holders[key]
        return {"cumulativeAckPosition": holder["position"] if holder is not None and holder["txn"] == str(txn)
                else None}


def in_buffer_stats(topic: Topic, txn: TxnId) -> dict[str, Any]:
    return ParticipantLookups().in_buffer(topic, txn)


def in_pending_ack_stats(subscription: Subscription, txn: TxnId) -> dict[str, Any]:
    return ParticipantLookups().in_pending_ack(subscription, txn)


async def transaction_metadata(service: BrokerService, meta: TxnMeta,
                               lookups: ParticipantLookups | None = None) -> dict[str, Any]:
    """Pulsar's TransactionMetadata, with the txn's state on each participant (null for a
    participant that no longer exists). `timeoutAt` is what Pulsar puts there: the timeout
    (ms), not an instant. An ended transaction's participants are null, not empty: they are not
    kept once it has ended (Pulsar forgets the whole transaction then: 404), and v5's
    coordinator never knows them. `lookups`: shared by the calls of one request."""
    if meta.status in _LIVE and not is_v5(meta.txn_id):
        lookups = lookups if lookups is not None else ParticipantLookups()
        produced: dict[str, Any] | None = {}
        for name in meta.partitions:
            topic = await _existing_topic(service, name)
            produced[name] = lookups.in_buffer(topic, meta.txn_id) if topic is not None else None
        acked: dict[str, dict[str, Any]] | None = {}
        for name, subscription_name in meta.subscriptions:
            topic = await _existing_topic(service, name)
            subscription = topic.subscriptions.get(subscription_name) if topic is not None else None
            acked.setdefault(name, {})[subscription_name] = (
                lookups.in_pending_ack(subscription, meta.txn_id) if subscription is not None else None)
    else:
        produced = acked = None
    return {
        "txnId": str(meta.txn_id),
        "status": meta.status.name,
        "openTimestamp": meta.start_ms,
        "timeoutAt": meta.timeout_ms,
        "producedPartitions": produced,
        "ackedPartitions": acked,
    }


def buffer_stats(topic: Topic, low_watermarks: bool, segment_stats: bool = False) -> dict[str, Any]:
    raw = topic.buffer.stats()
    stats = {
        "state": pulsar_state(raw["state"]),
        "maxReadPosition": raw["max_read_position"],
        "lastSnapshotTimestamps": raw["last_snapshot_timestamp"],
        "ongoingTxnSize": raw["ongoing_txn_count"],
        "totalAbortedTransactions": raw["aborted_txn_count"],
        "recoverStartTime": raw["recover_start_time"],
        "recoverEndTime": raw["recover_end_time"],
        # Not in Pulsar's TransactionBufferStats: what the next recovery starts from, and what
        # the last one read.
        "lastSnapshotPosition": raw["last_snapshot_position"],
        "recoverReplayedEntries": raw["recover_replayed_entries"],
    }
    if "snapshot_segments" in raw:          # v4: segmented snapshots (PIP-196); v5 keeps none
        stats["snapshotType"] = "Segment"
        stats["segmentsStats"] = {
            "segmentsSize": raw["snapshot_segments"],
            "currentSegmentCapacity": raw["snapshot_segment_capacity"],
            "unsealedAbortTxnIDSize": raw["unsealed_aborted_txn_count"],
            "lastTookSnapshotSegmentTimestamp": raw["last_snapshot_segment_timestamp"],
        }
        if segment_stats:               # Pulsar's segmentStats: each sealed segment's index entry
            stats["segmentsStats"]["segmentStats"] = [
                {"lastTxnID": None if txn is None else str(txn), "persistentPosition": str(marker)}
                for txn, marker in topic.buffer.snapshot_segments()]
    if low_watermarks:
        stats["lowWaterMarks"] = {str(cid): mark for cid, mark in raw["low_watermarks"].items()}
    return stats


def pending_ack_stats(subscription: Subscription, low_watermarks: bool = False) -> dict[str, Any]:
    raw = subscription.pending_ack.stats() if subscription.pending_ack is not None else None
    if raw is None:
        stats = {"state": "None", "ongoingTxnSize": 0, "pendingIndividualPositions": 0,
                 "pendingCumulativeAckPosition": None}
    else:
        cumulative = raw["pending_cumulative_ack"]
        stats = {
            "state": pulsar_state(raw["state"]),
            "ongoingTxnSize": len(raw["transactions"]),
            "pendingIndividualPositions": raw["pending_individual_positions"],
            "pendingCumulativeAckPosition": cumulative["position"] if cumulative is not None else None,
        }
    if low_watermarks:      # as Pulsar's TransactionPendingAckStats: coordinator id -> lwm
        known = raw["low_watermarks"] if raw is not None else {}
        stats["lowWaterMarks"] = {str(cid): mark for cid, mark in known.items()}
    return stats


async def _existing_topic(service: BrokerService, name: str) -> Topic | None:
    try:
        return await service.get_topic(name, create=False)
    except TopicNotFoundError:
        return None


def _iso_ms(epoch_ms: int) -> str:
    moment = datetime.datetime.fromtimestamp(epoch_ms / 1000, tz=datetime.timezone.utc)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")
