"""The vocabulary the admin routes share: JSON schemas of request and reply bodies (Pulsar's
admin data classes, as far as this broker fills them), the common parameters, and the error
replies with the descriptions Pulsar gives them."""

from __future__ import annotations

from typing import Any

from pyengine.admin.names import NAME_SCHEMA, SUBSCRIPTION_SCHEMA, TOPIC_SCHEMA
from pyengine.admin.routing import Param, Reply
from pyengine.admin.validation import INVALID_STATUS
from pyengine.schema import CompatibilityStrategy

INT64_MAX = 2**63 - 1
# Refused above this, as by Pulsar's maxNumPartitionsPerPartitionedTopic (406 on create, 422
# on update): every partition is a topic of its own, created and loaded with the partitioned topic.
MAX_PARTITIONS = 10_000

ERROR_REF = {"$ref": "#/components/schemas/ErrorData"}
COMPONENTS: dict[str, dict[str, Any]] = {
    "ErrorData": {"type": "object", "properties": {"reason": {"type": "string"}}, "required": ["reason"]},
}

STRING_LIST = {"type": "array", "items": {"type": "string"}}
BOOLEAN = {"type": "boolean"}
POSITION = {"type": "string", "description": "ledgerId:entryId"}
NULLABLE_POSITION = {"type": "string", "nullable": True, "description": "ledgerId:entryId, null if none"}
COUNT = {"type": "integer", "minimum": 0}

TENANT_INFO = {
    "type": "object",
    "description": "Pulsar's TenantInfo: allowedClusters is required (412 when missing, null, empty or blank)",
    "properties": {"adminRoles": {**STRING_LIST, "maxItems": 100},
                   "allowedClusters": {**STRING_LIST, "maxItems": 100, "nullable": True}},
}
RETENTION_LIMIT = {"type": "integer", "minimum": -1, "maximum": 2**31 - 1}
RETENTION_POLICIES = {
    "type": "object",
    "description": "Pulsar's RetentionPolicies: how long and how much of the consumed ledgers to keep "
                   "(-1: no limit; both 0: none; a missing field is 0)",
    "properties": {"retentionTimeInMinutes": RETENTION_LIMIT, "retentionSizeInMB": RETENTION_LIMIT},
    "additionalProperties": False,
}
DELAY_MS = {"type": "integer", "minimum": 0, "maximum": INT64_MAX}
DELAYED_DELIVERY_POLICIES = {
    "type": "object",
    "description": "Pulsar's DelayedDeliveryPolicies: whether Shared and Key_Shared subscriptions hold back "
                   "messages with a deliver_at_time (active), the tick of the timer releasing them (ms), and the "
                   "longest delay a producer may ask for, deliver_at_time - publish_time (ms; 0: no limit). "
                   "A missing field is its default: true, 1000, 0",
    "properties": {"active": BOOLEAN, "tickTime": DELAY_MS, "maxDeliveryDelayInMillis": DELAY_MS},
    "additionalProperties": False,
}
INACTIVE_TOPIC_POLICIES = {
    "type": "object",
    "description": "Pulsar's InactiveTopicPolicies: whether a topic inactive for maxInactiveDurationSeconds (and for "
                   "its retention time) is deleted (deleteWhileInactive), and what inactive means besides having no "
                   "producer and no consumer: no subscription (delete_when_no_subscriptions) or none with a backlog "
                   "(delete_when_subscriptions_caught_up). A missing field is its default: delete_when_no_subscriptions, "
                   "60, true",
    "properties": {
        "inactiveTopicDeleteMode": {"type": "string",
                                    "enum": ["delete_when_no_subscriptions", "delete_when_subscriptions_caught_up"]},
        "maxInactiveDurationSeconds": {"type": "integer", "minimum": 0, "maximum": 2**31 - 1},
        "deleteWhileInactive": BOOLEAN,
    },
    "additionalProperties": False,
}
# A message TTL in seconds (a Java int in Pulsar; 0: messages never expire). A negative one is
# refused with 412 "Invalid value for message TTL", as Pulsar does, by the handlers.
MESSAGE_TTL = {"type": "integer", "maximum": 2**31 - 1,
               "description": "message TTL in seconds (0: messages do not expire; negative: 412)"}
EXPIRE_TIME = {"type": "integer", "minimum": 0, "maximum": 2**31 - 1,
               "description": "expire the messages published this many seconds ago or earlier"}
AUTO_TOPIC_CREATION_OVERRIDE = {
    "type": "object",
    "description": "Pulsar's AutoTopicCreationOverride: whether a producer or consumer creates a topic that does not "
                   "exist (allowAutoTopicCreation) and as what: a non-partitioned topic, or a partitioned topic of "
                   "defaultNumPartitions partitions (created by the client's lookup of its partitioned metadata). "
                   "The type and count are needed, and checked, only when creation is allowed",
    "properties": {
        "allowAutoTopicCreation": BOOLEAN,
        "topicType": {"type": "string", "nullable": True, "description": "partitioned or non-partitioned"},
        "defaultNumPartitions": {"type": "integer", "nullable": True, "minimum": -2**31, "maximum": 2**31 - 1,
                                 "description": "for the partitioned type (and only for it)"},
    },
    "required": ["allowAutoTopicCreation"],
    "additionalProperties": False,
}
AUTO_SUBSCRIPTION_CREATION_OVERRIDE = {
    "type": "object",
    "description": "Pulsar's AutoSubscriptionCreationOverride: whether a consumer creates a durable subscription that "
                   "does not exist (else SubscriptionNotFound), and a producer its initial subscription",
    "properties": {"allowAutoSubscriptionCreation": BOOLEAN},
    "required": ["allowAutoSubscriptionCreation"],
    "additionalProperties": False,
}
NAMESPACE_POLICIES = {
    "type": "object",
    "description": "Pulsar's Policies, the fields this broker applies",
    "properties": {
        "deduplicationEnabled": {"type": "boolean", "nullable": True},
        "retention_policies": {**RETENTION_POLICIES, "nullable": True},
        "schema_compatibility_strategy": {"type": "string", "nullable": True,
                                          "enum": [s.value for s in CompatibilityStrategy],
                                          "description": "SchemaCompatibilityStrategy (UNDEFINED or null: "
                                                         "the broker's default)"},
        "is_allow_auto_update_schema": {"type": "boolean", "nullable": True},
        "schema_validation_enforced": {"type": "boolean", "nullable": True},
        "delayed_delivery_policies": {**DELAYED_DELIVERY_POLICIES, "nullable": True},
        "inactive_topic_policies": {**INACTIVE_TOPIC_POLICIES, "nullable": True},
        "autoTopicCreationOverride": {**AUTO_TOPIC_CREATION_OVERRIDE, "nullable": True},
        "autoSubscriptionCreationOverride": {**AUTO_SUBSCRIPTION_CREATION_OVERRIDE, "nullable": True},
        "message_ttl_in_seconds": {"type": "integer", "nullable": True, "minimum": 0, "maximum": 2**31 - 1,
                                   "description": "message TTL in seconds (null: the broker's default; "
                                                  "0: messages do not expire)"},
        "properties": {"type": "object", "additionalProperties": {"type": "string"}},
    },
}
_PARTITION_COUNT = {"type": "integer", "minimum": 1, INVALID_STATUS: 406}
PARTITIONS = {**_PARTITION_COUNT, "maximum": MAX_PARTITIONS, "description": "number of partitions"}
# POST .../partitions: above MAX_PARTITIONS is 422 with Pulsar's reason (its handler checks it).
NEW_PARTITIONS = {**_PARTITION_COUNT, "description": f"number of partitions (above {MAX_PARTITIONS}: 422)"}
TOPIC_PROPERTIES = {"type": "object", "additionalProperties": {"type": "string"},
                    "description": "topic properties: non-empty keys, string values"}
PARTITIONED_METADATA = {"type": "object", "properties": {"partitions": COUNT, "properties": TOPIC_PROPERTIES},
                        "required": ["partitions"],
                        "description": "PartitionedTopicMetadata (properties: only where the topic has some)"}
# PUT .../partitions: the count (application/json), or, as Pulsar's admin client sends it when
# there are topic properties (application/vnd.partitioned-topic-metadata+json), the metadata.
NEW_PARTITIONED_TOPIC = {
    "anyOf": [PARTITIONS, {"type": "object", "required": ["partitions"],
                           "properties": {"partitions": PARTITIONS, "properties": TOPIC_PROPERTIES}}],
    "description": "number of partitions, or PartitionedTopicMetadata {partitions, properties}",
}
MESSAGE_ID = {
    "type": "object",
    "description": "Pulsar's MessageIdImpl / ResetCursorData: (-1, -1) is earliest, "
                   "(2^63-1, 2^63-1) latest; isExcluded starts after the message",
    "properties": {
        "ledgerId": {"type": "integer", "minimum": -1, "maximum": INT64_MAX},
        "entryId": {"type": "integer", "minimum": -1, "maximum": INT64_MAX},
        "partitionIndex": {"type": "integer"},
        "batchIndex": {"type": "integer"},
        "isExcluded": BOOLEAN,
    },
    "required": ["ledgerId", "entryId"],
}
LAST_MESSAGE_ID = {
    "type": "object",
    "description": "Pulsar's MessageIdImpl (BatchMessageIdImpl for a batch): the last message readers can "
                   "see, never one of an open transaction (the read horizon)",
    "properties": {"ledgerId": {"type": "integer"}, "entryId": {"type": "integer"},
                   "partitionIndex": {"type": "integer"},
                   "batchIndex": {"type": "integer", "description": "the last message of a batch entry"},
                   "batchSize": COUNT},
    "required": ["ledgerId", "entryId", "partitionIndex"],
}
TERMINATED_AT = {
    "type": "object",
    "properties": {"ledgerId": {"type": "integer"}, "entryId": {"type": "integer"},
                   "partitionIndex": {"type": "integer"}},
    "required": ["ledgerId", "entryId"],
}

DRAINING_HASH = {
    "type": "object",
    "description": "Pulsar's DrainingHash: a key hash, its unacknowledged messages, the deliveries of it to "
                   "other consumers refused",
    "properties": {"hash": {"type": "integer"}, "unackMsgs": COUNT, "blockedAttempts": COUNT},
    "required": ["hash", "unackMsgs", "blockedAttempts"],
}
RATE = {"type": "number", "minimum": 0, "description": "per second, over the last stats interval"}
OUT_STATS = {"msgOutCounter": {**COUNT, "description": "messages delivered"},
             "bytesOutCounter": {**COUNT, "description": "bytes delivered"},
             "msgRateOut": RATE, "msgThroughputOut": {**RATE, "description": "bytes per second delivered, over "
                                                                              "the last stats interval"}}
CONSUMER_STATS = {
    "type": "object",
    "properties": {"consumerName": {"type": "string"}, "availablePermits": {"type": "integer"}, **OUT_STATS,
                   "msgRateRedeliver": {**RATE, "description": "messages it asked to have redelivered, per second "
                                                               "over the last stats interval"},
                   "unackedMessages": COUNT,
                   "blockedConsumerOnUnackedMsgs": {"type": "boolean", "description": "Shared, Key_Shared: held "
                                                    "back by maxUnackedMessagesPerConsumer"},
                   "drainingHashesCount": {**COUNT, "description": "Key_Shared: key hashes draining at this "
                                                                   "consumer (PIP-379)"},
                   "drainingHashesClearedTotal": {**COUNT, "description": "Key_Shared: key hashes that stopped "
                                                                          "draining at this consumer since it joined"},
                   "drainingHashesUnackedMessages": {**COUNT, "description": "Key_Shared: its unacknowledged "
                                                                             "messages of its draining hashes"},
                   "drainingHashes": {"type": "array", "description": "Key_Shared: its draining hashes",
                                      "items": DRAINING_HASH},
                   "keyHashRangeArrays": {"type": "array", "description": "Key_Shared only: the key hashes it "
                                          "is given, [start, end] inclusive, in order (Pulsar 4.0)",
                                          "items": {"type": "array", "items": {"type": "integer"},
                                                    "minItems": 2, "maxItems": 2}}},
}
SUBSCRIPTION_PROPERTIES = {"type": "object", "additionalProperties": {"type": "string"},
                           "description": "a subscription's properties (PIP-105): string keys to string values"}
SUBSCRIPTION_STATS = {
    "type": "object",
    "properties": {"msgBacklog": COUNT, **OUT_STATS,
                   "unackedMessages": {**COUNT, "description": "its consumers' (Shared and Key_Shared)"},
                   "msgRateRedeliver": {**RATE, "description": "its consumers' redelivery requests, messages per "
                                                               "second over the last stats interval"},
                   "msgRateExpired": {**RATE, "description": "entries expired per second over the last stats "
                                                             "interval"},
                   "msgDelayed": {**COUNT, "description": "held back for delayed delivery"},
                   "totalMsgExpired": {**COUNT, "description": "entries expired (message TTL, expireMessages) "
                                                               "since the topic was loaded"},
                   "lastExpireTimestamp": {**COUNT, "description": "when an expiry was last issued (ms; 0: never)"},
                   "type": {"type": "string", "nullable": True},
                   "isDurable": BOOLEAN, "consumers": {"type": "array", "items": CONSUMER_STATS},
                   "blockedSubscriptionOnUnackedMsgs": {**BOOLEAN, "description": "Shared, Key_Shared: held back "
                                                        "by maxUnackedMessagesPerSubscription"},
                   "keySharedMode": {"type": "string", "enum": ["AUTO_SPLIT", "STICKY"],
                                     "description": "Key_Shared only: its consumers' mode"},
                   "allowOutOfOrderDelivery": {**BOOLEAN, "description": "Key_Shared: its consumers allow out of "
                                                                          "order delivery (no draining hashes)"},
                   "drainingHashesCount": {**COUNT, "description": "Key_Shared: its consumers' draining hashes"},
                   "drainingHashesClearedTotal": {**COUNT, "description": "Key_Shared: its consumers' hashes "
                                                                          "cleared from draining"},
                   "drainingHashesUnackedMessages": {**COUNT, "description": "Key_Shared: its consumers' "
                                                                             "unacknowledged messages of "
                                                                             "draining hashes"},
                   "subscriptionProperties": {**SUBSCRIPTION_PROPERTIES,
                                              "description": "its properties (PIP-105; a partitioned topic's: "
                                                             "every partition's together)"}},
    "required": ["msgBacklog", "consumers"],
}
TOPIC_STATS = {
    "type": "object",
    "description": "Pulsar's TopicStats: counters since the topic was loaded, and rates per second over the "
                   "last stats interval (statsUpdateFrequencyInSecs, 60 s: 0 until it first passed)",
    "properties": {
        "msgInCounter": COUNT, "bytesInCounter": COUNT, "storageSize": COUNT, "msgBacklog": COUNT,
        "msgRateIn": RATE, "msgThroughputIn": RATE, **OUT_STATS,
        "publishers": {"type": "array", "items": {"type": "object", "properties": {
            "producerName": {"type": "string"}, "producerId": {"type": "integer"}, "msgInCounter": COUNT,
            "bytesInCounter": COUNT, "msgRateIn": RATE, "msgThroughputIn": RATE}}},
        "subscriptions": {"type": "object", "additionalProperties": SUBSCRIPTION_STATS},
        "deduplicationStatus": {"type": "string", "enum": ["Enabled", "Disabled"]},
    },
    "required": ["msgInCounter", "bytesInCounter", "storageSize", "publishers", "subscriptions"],
}
PARTITIONED_TOPIC_STATS = {
    "type": "object",
    "description": "Pulsar's PartitionedTopicStats: the whole topic (summed over its partitions), and each partition",
    "properties": {
        "metadata": PARTITIONED_METADATA,
        "msgInCounter": COUNT, "bytesInCounter": COUNT, "storageSize": COUNT, "msgBacklog": COUNT,
        "msgRateIn": RATE, "msgThroughputIn": RATE, **OUT_STATS,
        "publishers": TOPIC_STATS["properties"]["publishers"],
        "subscriptions": TOPIC_STATS["properties"]["subscriptions"],
        "partitions": {"type": "object", "additionalProperties": TOPIC_STATS,
                       "description": "each partition's stats (left out with perPartition=false)"},
    },
    "required": ["metadata", "publishers", "subscriptions"],
}
INTERNAL_STATS = {
    "type": "object",
    "description": "Pulsar's PersistentTopicInternalStats (managed ledger and cursors)",
    "properties": {
        "numberOfEntries": COUNT, "totalSize": COUNT, "currentLedgerEntries": COUNT,
        "currentLedgerSize": COUNT, "lastLedgerCreatedTimestamp": {"type": "string"},
        "lastConfirmedEntry": POSITION, "state": {"type": "string"},
        "ledgers": {"type": "array", "items": {"type": "object", "properties": {
            "ledgerId": {"type": "integer"}, "entries": COUNT, "size": COUNT, "offloaded": BOOLEAN}}},
        "cursors": {"type": "object", "description": "every cursor, readers' (non-durable) ones too",
                    "additionalProperties": {"type": "object", "properties": {
            "markDeletePosition": POSITION, "readPosition": POSITION, "state": {"type": "string"},
            "active": {**BOOLEAN, "description": "it has consumers"},
            "individuallyDeletedMessages": {"type": "string", "description": "entries acknowledged after the "
                                            "mark-delete position: open-closed ranges, [(1:0..1:1],(1:2..1:3]]"},
            "totalNonContiguousDeletedMessagesRange": COUNT,
            "numberOfEntriesSinceFirstNotAckedMessage": COUNT,
            "properties": {"type": "object", "additionalProperties": {"type": "integer"}}}}},
    },
    "required": ["numberOfEntries", "totalSize", "lastConfirmedEntry", "ledgers", "cursors"],
}
PARTITIONED_INTERNAL_STATS = {
    "type": "object",
    "description": "Pulsar's PartitionedTopicInternalStats: the internal stats of each partition stored",
    "properties": {"metadata": PARTITIONED_METADATA,
                   "partitions": {"type": "object", "additionalProperties": INTERNAL_STATS}},
    "required": ["metadata", "partitions"],
}

COORDINATOR_STATS = {
    "type": "object",
    "description": "Pulsar's TransactionCoordinatorStats",
    "properties": {"state": {"type": "string"}, "leastSigBits": {"type": "integer"},
                   "lowWaterMark": {"type": "integer"}, "ongoingTxnSize": COUNT,
                   "recoverStartTime": {**COUNT, "description": "when the coordinator's last recovery (log "
                                        "replay) started, ms since the epoch (0: not yet); v4 only"},
                   "recoverEndTime": {**COUNT, "description": "when it ended (0: not yet); v4 only"}},
    "required": ["state", "leastSigBits", "lowWaterMark", "ongoingTxnSize"],
}
COORDINATOR_STATS_MAP = {"type": "object", "additionalProperties": COORDINATOR_STATS,
                         "description": "coordinator id -> stats"}
IN_BUFFER_STATS = {"type": "object", "properties": {"startPosition": NULLABLE_POSITION, "aborted": BOOLEAN},
                   "required": ["startPosition", "aborted"]}
IN_PENDING_ACK_STATS = {"type": "object", "properties": {"cumulativeAckPosition": NULLABLE_POSITION},
                        "required": ["cumulativeAckPosition"]}
TRANSACTION_METADATA = {
    "type": "object",
    "description": "Pulsar's TransactionMetadata",
    "properties": {
        "txnId": {"type": "string"}, "status": {"type": "string"},
        "openTimestamp": {"type": "integer"},
        "timeoutAt": {"type": "integer", "description": "as Pulsar fills it: the transaction's timeout in ms "
                                                        "(a duration, not an instant)"},
        "producedPartitions": {"type": "object", "nullable": True,
                               "description": "null once the transaction has ended (its participants are not "
                                              "kept) and for v5 transactions (their coordinator knows none)",
                               "additionalProperties": {**IN_BUFFER_STATS, "nullable": True}},
        "ackedPartitions": {"type": "object", "nullable": True, "description": "null as producedPartitions",
                            "additionalProperties": {
            "type": "object", "additionalProperties": {**IN_PENDING_ACK_STATS, "nullable": True}}},
    },
    "required": ["txnId", "status", "openTimestamp", "timeoutAt", "producedPartitions", "ackedPartitions"],
}
TRANSACTION_METADATA_MAP = {"type": "object", "additionalProperties": TRANSACTION_METADATA,
                            "description": "txn id -> metadata"}
BUFFER_STATS = {
    "type": "object",
    "description": "Pulsar's TransactionBufferStats",
    "properties": {
        "state": {"type": "string"}, "maxReadPosition": POSITION, "lastSnapshotTimestamps": {"type": "integer"},
        "ongoingTxnSize": COUNT, "totalAbortedTransactions": COUNT, "recoverStartTime": {"type": "integer"},
        "recoverEndTime": {"type": "integer"},
        "lastSnapshotPosition": {**NULLABLE_POSITION, "description": "the max read position the last snapshot "
                                 "saved (recovery replays the entries after it); null if none (v5: never)"},
        "recoverReplayedEntries": {**COUNT, "description": "entries the last recovery read from the topic "
                                   "(0 for v5: no replay)"},
        "lowWaterMarks": {"type": "object", "additionalProperties": {"type": "integer"}},
        "snapshotType": {"type": "string", "enum": ["Segment"], "description": "v4 only: snapshots are segmented "
                         "(PIP-196)"},
        "segmentsStats": {"type": "object", "description": "v4 only: the snapshot's sealed segments",
                          "properties": {"segmentsSize": COUNT, "currentSegmentCapacity": COUNT,
                                         "unsealedAbortTxnIDSize": COUNT,
                                         "lastTookSnapshotSegmentTimestamp": {"type": "integer"},
                                         "segmentStats": {
                                             "type": "array",
                                             "description": "only with segmentStats=true: each sealed "
                                                            "segment, oldest first (Pulsar's SegmentStats)",
                                             "items": {"type": "object", "properties": {
                                                 "lastTxnID": {"type": "string", "nullable": True,
                                                               "description": "its last aborted txn, (most,least)"},
                                                 "persistentPosition": {**POSITION, "description": "that txn's "
                                                                        "abort marker"}},
                                                       "required": ["lastTxnID", "persistentPosition"]}}}},
    },
    "required": ["state", "maxReadPosition", "ongoingTxnSize", "lastSnapshotPosition", "recoverReplayedEntries"],
}
PENDING_ACK_STATS = {
    "type": "object",
    "description": "Pulsar's TransactionPendingAckStats, plus the positions held",
    "properties": {"state": {"type": "string"}, "ongoingTxnSize": COUNT, "pendingIndividualPositions": COUNT,
                   "pendingCumulativeAckPosition": NULLABLE_POSITION,
                   "lowWaterMarks": {"type": "object", "additionalProperties": {"type": "integer"},
                                     "description": "coordinator id -> low watermark; only with lowWaterMarks=true"}},
    "required": ["state", "ongoingTxnSize"],
}

# Pulsar answers the internal stats of its transaction logs (a coordinator's, a subscription's
# pending acks, the buffer snapshots) as those of their managed ledgers. This broker keeps each
# as a key range of an LMDB database: its records and their bytes are what it has of them.
LOG_INTERNAL_STATS = {
    "type": "object",
    "description": "Pulsar's ManagedLedgerInternalStats of a log kept as a key range of an LMDB database (not a "
                   "managed ledger): its records and their bytes, as stored (durable) now. It has no ledgers "
                   "(nothing rolls over or is offloaded) and no cursors (it is replayed by a scan): both empty",
    "properties": {"numberOfEntries": {**COUNT, "description": "records stored"},
                   "totalSize": {**COUNT, "description": "bytes of the records' values"},
                   "ledgers": {"type": "array", "maxItems": 0, "items": {"type": "object"}},
                   "cursors": {"type": "object", "additionalProperties": {"type": "object"}}},
    "required": ["numberOfEntries", "totalSize", "ledgers", "cursors"],
}
TRANSACTION_LOG_STATS = {
    "type": "object",
    "description": "Pulsar's TransactionLogStats (and SnapshotInternalStats): the log's name, as Pulsar names its "
                   "managed ledger, and its internal stats",
    "properties": {"managedLedgerName": {"type": "string"}, "managedLedgerInternalStats": LOG_INTERNAL_STATS},
    "required": ["managedLedgerName", "managedLedgerInternalStats"],
}
COORDINATOR_INTERNAL_STATS = {
    "type": "object",
    "description": "Pulsar's TransactionCoordinatorInternalStats: the coordinator's log (LMDB `txn_log`; its "
                   "header record not counted)",
    "properties": {"transactionLogStats": TRANSACTION_LOG_STATS},
    "required": ["transactionLogStats"],
}
PENDING_ACK_INTERNAL_STATS = {
    "type": "object",
    "description": "Pulsar's TransactionPendingAckInternalStats: the subscription's pending-ack log (LMDB "
                   "`pending_ack`: the acks of its transactions still open)",
    "properties": {"pendingAckLogStats": TRANSACTION_LOG_STATS},
    "required": ["pendingAckLogStats"],
}
BUFFER_INTERNAL_STATS = {
    "type": "object",
    "description": "Pulsar's TransactionBufferInternalStats. The snapshots of a v4 buffer are segmented (PIP-196): "
                   "type Segment, with the store of its sealed segments and the store of its index (LMDB "
                   "`tb_snapshots`), named after Pulsar's namespace topics but counting this topic's records only",
    "properties": {"snapshotType": {"type": "string", "enum": ["Single", "Segment"]},
                   "singleSnapshotSystemTopicInternalStats": {**TRANSACTION_LOG_STATS, "nullable": True,
                                                   "description": "type Single only (never here): null"},
                   "segmentInternalStats": TRANSACTION_LOG_STATS,
                   "segmentIndexInternalStats": TRANSACTION_LOG_STATS},
    "required": ["snapshotType"],
}
POSITION_IN_PENDING_ACK_STATS = {
    "type": "object",
    "description": "Pulsar's PositionInPendingAckStats",
    "properties": {"state": {"type": "string",
                             "enum": ["PendingAck", "MarkDelete", "NotInPendingAck", "PendingAckNotReady",
                                      "InvalidPosition"],
                             "description": "PendingAck: an open transaction holds it; MarkDelete: acknowledged "
                                            "on the subscription; NotInPendingAck: neither; PendingAckNotReady: "
                                            "the pending acks are not replayed (yet); InvalidPosition: a batch "
                                            "index beyond the batch size a transaction's ack of the entry gave"}},
    "required": ["state"],
}

# --- parameters -------------------------------------------------------------------------

TENANT = Param("tenant", NAME_SCHEMA, "tenant name", "path", required=True)
NAMESPACE = Param("namespace", NAME_SCHEMA, "namespace name (without the tenant)", "path", required=True)
TOPIC = Param("topic", TOPIC_SCHEMA, "topic local name (URL-encoded)", "path", required=True)
SUBSCRIPTION = Param("subName", SUBSCRIPTION_SCHEMA, "subscription name (URL-encoded)", "path", required=True)
MOST_BITS = Param("mostSigBits", {"type": "integer", "minimum": 0, "maximum": INT64_MAX},
                  "txn id most significant bits (the coordinator id)", "path", required=True)
LEAST_BITS = Param("leastSigBits", {"type": "integer", "minimum": 0, "maximum": INT64_MAX},
                   "txn id least significant bits", "path", required=True)
FORCE = Param("force", BOOLEAN, "also when clients are connected (they are disconnected)", default=False)
INCLUDE_SYSTEM_TOPIC = Param("includeSystemTopic", BOOLEAN, "also list system topics (those of pulsar/system, "
                             "topic policies, transaction buffer snapshots and pending acks)", default=False)

TOPIC_PATH = (TENANT, NAMESPACE, TOPIC)

# --- replies ----------------------------------------------------------------------------

DONE = Reply("Operation successful")
_ERRORS = {
    400: "Malformed request: bad JSON, a wrong type, a value out of range",
    404: "Tenant, namespace, topic, subscription or transaction does not exist",
    405: "Not allowed on this kind of object",
    406: "Number of partitions out of range",
    409: "Already exists, still in use, or in another state",
    412: "Name is not valid, or a precondition failed",
    422: "Fewer partitions than the topic has, or more than the maximum",
    503: "Service not ready",
}


def errors(*statuses: int) -> dict[int, Reply]:
    return {status: error(_ERRORS[status]) for status in statuses}


def error(description: str) -> Reply:
    """An error reply a route describes in its own words."""
    return Reply(description, ERROR_REF)
