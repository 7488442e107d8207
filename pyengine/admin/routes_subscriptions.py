"""Subscriptions of persistent topics: `/admin/v2/persistent/{tenant}/{namespace}/{topic}/
subscription...` (Pulsar's PersistentTopics resource): list, create at a position (with
properties), delete, read and replace a subscription's properties (PIP-105), reset the cursor
to a message id or a publish time, skip some messages, skip everything (clear the backlog),
and expire the messages older than some seconds or up to a message id.

On a partitioned topic each operation applies to every partition, as in Pulsar, except those
Pulsar refuses there with 405: a reset to a message id (a message id names one partition) and
skipping a number of messages (a count is not split among partitions: skip on a partition).
"""

from __future__ import annotations

from typing import Any

from pyengine.admin.errors import CONFLICT, METHOD_NOT_ALLOWED, NOT_FOUND, PRECONDITION_FAILED, AdminError
from pyengine.broker.topic_changes import topic_change
from pyengine.admin.names import subscription_name
from pyengine.admin.routes_topics import TOPIC_URL, existing_topic, partition_names, requested_topic
from pyengine.admin.routing import Call, Param, Reply, RouteTable
from pyengine.admin.schemas import (
    DONE,
    EXPIRE_TIME,
    FORCE,
    INT64_MAX,
    MESSAGE_ID,
    STRING_LIST,
    SUBSCRIPTION,
    SUBSCRIPTION_PROPERTIES,
    TOPIC_PATH,
    errors,
)
from pyengine.broker.compaction import COMPACTION_SUBSCRIPTION
from pyengine.broker.subscription import Subscription
from pyengine.broker.topic import Topic
from pyengine.errors import NotAllowedError, SubscriptionNotFoundError
from pyengine.protocol.lookup import resolve_topic
from pyengine.storage.managed_ledger import ManagedLedger
from pyengine.subscription_properties import check_subscription_properties
from pyengine_kernels import Position

routes = RouteTable("subscriptions")
SUB_URL = TOPIC_URL + "/subscription/{subName}"
SUB_PATH = (*TOPIC_PATH, SUBSCRIPTION)
NUM_MESSAGES = Param("numMessages", {"type": "integer", "minimum": 1, "maximum": 2**31 - 1},
                     "how many messages (entries) to skip", "path", required=True)
EXPIRE_TIME_PARAM = Param("expireTimeInSeconds", EXPIRE_TIME, "expire the messages published this many seconds "
                          "ago or earlier", "path", required=True)
TIMESTAMP = Param("timestamp", {"type": "integer", "minimum": 0, "maximum": INT64_MAX},
                  "publish time (ms since the epoch) to reset to", "path", required=True)


async def topics_of(call: Call, *, create_partitions: bool = False, create_topic: bool = False) -> list[Topic]:
    """The topic of the path, or the partitions of a partitioned topic (those that exist, or
    all of them, created, when `create_partitions`). A topic that does not exist is 404,
    or created when `create_topic` (as Apache's broker auto-creates it)."""
    name = requested_topic(call)
    service = call.service
    partitions = service.policies.partitions(str(name))
    if not partitions:
        if create_topic and not service.topic_exists(str(name)):
            resolve_topic(service, str(name))   # as a client's: no partition beyond its topic's count (404)
        topic = await (service.get_open_topic(str(name)) if create_topic else existing_topic(service, name))
        if topic.closed:
            # Being deleted (closed, loaded until its deletion ends; one being unloaded is
            # loaded again, see get_open_topic): its closed subscriptions
            # do nothing, so 404 as its ledger answers then, not 204 for what was not done.
            raise AdminError(NOT_FOUND, f"topic {name} is being deleted")
        return [topic]
    # A partition being deleted is one deleted already (one being unloaded is loaded again:
    # passed over, what the request did left it out).
    topics = [await service.get_open_topic(p) for p in partition_names(name, partitions)
              if create_partitions or service.topic_exists(p)]
    return [topic for topic in topics if not topic.closed]


async def subscriptions_of(call: Call) -> list[Subscription]:
    """The subscription of the path on every topic (partition) that has it; 404 if none has."""
    name = subscription_name(call["subName"])
    found = [topic.subscriptions[name] for topic in await topics_of(call) if name in topic.subscriptions]
    if not found:
        raise SubscriptionNotFoundError(f"subscription {name} does not exist on {requested_topic(call)}")
    return found


def _unacknowledged_from(first: int, size: int) -> list[int]:
    """The ack set (set bits: not acknowledged, signed 64-bit words) of a batch of `size`
    whose messages before index `first` are acknowledged."""
    words = [0] * ((size + 63) // 64)
    for index in range(first, size):
        words[index // 64] |= 1 << (index % 64)
    return [word - (1 << 64) if word >= 1 << 63 else word for word in words]


def start_of(message_id: dict[str, Any] | None) -> Position | str:
    """Where a MessageIdImpl / ResetCursorData body says to start: 'earliest', 'latest' or the
    first position to read."""
    if message_id is None:
        return "latest"
    ledger_id, entry_id = message_id["ledgerId"], message_id["entryId"]
    if (ledger_id, entry_id) == (-1, -1):
        return "earliest"
    if (ledger_id, entry_id) == (INT64_MAX, INT64_MAX):
        return "latest"
    position = Position(ledger_id, entry_id)
    return position.next() if message_id.get("isExcluded") else position


def closest_position(topic: Topic, position: Position) -> Position:
    """`position` moved into the stored range: a cursor left beyond the end of the ledger
    would wait for entries that never come."""
    ledger = topic.ledger
    return min(max(position, ledger.first_position()), ledger.lac.next())


@routes.add("GET", TOPIC_URL + "/subscriptions", summary="List the durable subscriptions of a topic.",
            params=TOPIC_PATH, replies={200: Reply("Subscription names", STRING_LIST), **errors(404, 412)})
async def list_subscriptions(call: Call) -> list[str]:
    names = {name for topic in await topics_of(call) for name in topic.subscriptions}
    return sorted(names)


# Pulsar's ResetCursorData as createSubscription takes it: a message id and the new
# subscription's properties.
CREATE_SUBSCRIPTION = {**MESSAGE_ID, "properties": {**MESSAGE_ID["properties"],
                                                   "properties": SUBSCRIPTION_PROPERTIES}}


@routes.add("PUT", SUB_URL, summary="Create a subscription at a message id (default: latest), with properties.",
            params=(*SUB_PATH, Param("replicated", {"type": "boolean"}, "ignored: no geo-replication")),
            body=CREATE_SUBSCRIPTION, replies={204: DONE, **errors(400, 404, 405, 409, 412)})
async def create_subscription(call: Call) -> None:
    # It may create the topic or its partitions: not while the topic is deleted, which left
    # them (or the subscription, on the closed topic: 405) half-made.
    async with topic_change(call.service, requested_topic(call)):
        await _create_subscription(call)


async def _create_subscription(call: Call) -> None:
    name = subscription_name(call["subName"])
    start = start_of(call.body)
    # Everything that refuses the request is checked before a partition is created for it.
    properties = check_subscription_properties((call.body or {}).get("properties"), "properties")
    partitions = call.service.policies.partitions(str(requested_topic(call)))
    if isinstance(start, Position) and partitions > 1:
        raise AdminError(METHOD_NOT_ALLOWED, "a message id names one partition: create the subscription "
                                             "on the partition, or at earliest / latest")
    # As Apache (internalCreateSubscription with auto topic creation, this broker's rule for
    # producers and consumers too): a topic that does not exist yet is created with it.
    exists = partitions > 0 or call.service.topic_exists(str(requested_topic(call)))
    if exists and any(name in topic.subscriptions for topic in await topics_of(call)):
        raise AdminError(CONFLICT, f"Subscription {name} already exists for topic {requested_topic(call)}")
    topics = await topics_of(call, create_partitions=True, create_topic=True)
    for topic in topics:
        if isinstance(start, Position):
            subscription = await topic.open_subscription(name, "latest", properties)
            await subscription.seek(closest_position(topic, start))
        else:
            await topic.open_subscription(name, start, properties)


@routes.add("DELETE", SUB_URL, summary="Delete a subscription.", params=(*SUB_PATH, FORCE),
            replies={204: DONE, **errors(400, 404, 412)})
async def delete_subscription(call: Call) -> None:
    for subscription in await subscriptions_of(call):
        try:
            await subscription.topic.unsubscribe(subscription.name, force=call["force"])
        except NotAllowedError:
            raise AdminError(PRECONDITION_FAILED, "Subscription has active connected consumers") from None


@routes.add("GET", SUB_URL + "/properties", summary="The properties of a subscription (PIP-105).",
            params=SUB_PATH, replies={200: Reply("Its properties (a partitioned topic's: every partition's "
                                                 "together, as Pulsar)", SUBSCRIPTION_PROPERTIES),
                                      **errors(404, 412)})
async def get_subscription_properties(call: Call) -> dict[str, str]:
    merged: dict[str, str] = {}
    for subscription in await subscriptions_of(call):
        merged.update(subscription.subscription_properties)
    return merged


@routes.add("PUT", SUB_URL + "/properties",
            summary="Replace the properties of a subscription (on every partition of a partitioned topic).",
            params=SUB_PATH, body=SUBSCRIPTION_PROPERTIES, body_required=True,
            replies={204: DONE, **errors(400, 404, 412)})
async def update_subscription_properties(call: Call) -> None:
    # Checked whole before any subscription changes (too large: none does).
    properties = check_subscription_properties(call.body, "body")
    for subscription in await subscriptions_of(call):
        await subscription.update_subscription_properties(properties)


@routes.add("POST", SUB_URL + "/resetcursor/{timestamp}",
            summary="Reset a subscription to the first message published at or after a time.",
            params=(*SUB_PATH, TIMESTAMP), replies={204: DONE, **errors(400, 404, 412)})
async def reset_cursor_to_time(call: Call) -> None:
    for subscription in await subscriptions_of(call):
        await subscription.seek(subscription.topic.ledger.find_by_publish_time(call["timestamp"]))


@routes.add("POST", SUB_URL + "/resetcursor", summary="Reset a subscription so that a message id is read next.",
            params=SUB_PATH, body=MESSAGE_ID, body_required=True, replies={204: DONE, **errors(400, 404, 405, 412)})
async def reset_cursor_to_message(call: Call) -> None:
    if call.service.policies.partitions(str(requested_topic(call))):      # first, as Pulsar
        raise AdminError(METHOD_NOT_ALLOWED, "Not supported for partitioned topics: reset a partition")
    (subscription,) = await subscriptions_of(call)
    batch_index = call.body.get("batchIndex", -1)
    if batch_index is not None and batch_index >= 0 and start_of(call.body) not in ("earliest", "latest"):
        # into a batch, as Pulsar's internalResetCursorOnPosition: its earlier indexes (and the
        # message itself when excluded) acknowledged; not a batch, the message id as it is
        position = Position(call.body["ledgerId"], call.body["entryId"])
        entry = subscription.topic.ledger.read_entry(position)
        if entry is not None and entry.num_messages > 1 and batch_index < entry.num_messages:
            first = batch_index + 1 if call.body.get("isExcluded") else batch_index
            await subscription.seek(position, ack_set=_unacknowledged_from(first, entry.num_messages))
            return
    start = start_of(call.body)
    if start == "earliest":
        start = subscription.topic.ledger.first_position()
    elif start == "latest":
        start = subscription.topic.ledger.lac.next()
    await subscription.seek(closest_position(subscription.topic, start))


@routes.add("POST", SUB_URL + "/skip_all", summary="Skip every message on a subscription (clear its backlog).",
            params=SUB_PATH, replies={204: DONE, **errors(404, 412)})
async def skip_all_messages(call: Call) -> None:
    for subscription in await subscriptions_of(call):
        await subscription.clear_backlog()


@routes.add("POST", SUB_URL + "/skip/{numMessages}",
            summary="Skip the next messages of a subscription (not past an open transaction's).",
            params=(*SUB_PATH, NUM_MESSAGES), replies={204: DONE, **errors(400, 404, 405, 412)})
async def skip_messages(call: Call) -> None:
    if call.service.policies.partitions(str(requested_topic(call))):
        raise AdminError(METHOD_NOT_ALLOWED, "Skip messages on a partitioned topic is not allowed")
    (subscription,) = await subscriptions_of(call)
    await subscription.skip_messages(call["numMessages"])


# --- expiring messages (Pulsar's expireMessages / expireMessagesForAllSubscriptions) ------------

def not_issued(subscription: Subscription) -> AdminError:
    """Pulsar's 409 for an expiry it did not issue (no backlog, or an almost caught-up
    subscription whose oldest message is not expired)."""
    return AdminError(CONFLICT, f"Expire message by timestamp not issued on topic {subscription.topic.name} for "
                                f"subscription {subscription.name} due to ongoing message expiration not finished or "
                                "subscription almost catch up. If it's performed on a partitioned topic operation "
                                "might succeeded on other partitions, please check stats of individual partition.")


async def expire(subscriptions: list[Subscription], seconds: int, now_ms: int) -> None:
    """Expire on every subscription (each partition's), then 409 if one did not issue it."""
    refused = None
    for subscription in subscriptions:
        if not await subscription.expire_messages(seconds, now_ms):
            refused = refused or subscription
    if refused is not None:
        raise not_issued(refused)


@routes.add("POST", SUB_URL + "/expireMessages/{expireTimeInSeconds}",
            summary="Expire (acknowledge) a subscription's messages published the given seconds ago or earlier "
                    "(not past an open transaction's).",
            params=(*SUB_PATH, EXPIRE_TIME_PARAM), replies={204: DONE, **errors(400, 404, 409, 412)})
async def expire_messages(call: Call) -> None:
    await expire(await subscriptions_of(call), call["expireTimeInSeconds"], call.service.config.clock())


def position_not_issued(subscription: Subscription) -> AdminError:
    """Pulsar's 409 for an expiry by message id it did not issue (an id beyond the last entry)."""
    return AdminError(CONFLICT, f"Expire message by position not issued on topic {subscription.topic.name} for "
                                f"subscription {subscription.name} due to ongoing message expiration not finished "
                                "or invalid message position provided.")


def newest_entry(ledger: ManagedLedger, upto: Position, *, inclusive: bool) -> Position | None:
    """The newest stored entry at (when `inclusive`) or before `upto`, None if there is none.
    As Pulsar's search, which expires up to the newest entry it finds: never to a position
    no entry holds (a ledger that does not exist, an entry id past its ledger's end)."""
    first = ledger.first_position()
    if upto < first or (upto == first and not inclusive):
        return None
    if not inclusive:
        upto = ledger.previous_position(upto)
    return ledger.previous_position(ledger.next_position(upto))


def entry_expired_whole(ledger: ManagedLedger, at: Position, batch_index: int, excluded: bool) -> bool:
    """Whether expiring up to message `batch_index` of the entry at `at` (isExcluded: up to the
    one before it) covers the whole entry. Pulsar expires the whole entry of a batch index
    (its search compares entries, not messages), and so the batch's later messages too: here
    they stay, and the entry with them; they are never past the id asked for. No batch index,
    or an entry that cannot be read, is the entry itself (as Pulsar falls back to)."""
    entry = ledger.read_entry(at) if batch_index >= 0 else None
    if entry is None:
        return not excluded
    return batch_index + (0 if excluded else 1) >= entry.num_messages


@routes.add("POST", SUB_URL + "/expireMessages",
            summary="Expire (acknowledge) a subscription's messages up to a message id (isExcluded: before it; "
                    "not past an open transaction's).",
            params=SUB_PATH, body=MESSAGE_ID, body_required=True,
            replies={204: DONE, **errors(400, 404, 405, 409, 412)})
async def expire_messages_up_to(call: Call) -> None:
    name, body = requested_topic(call), call.body
    # Refused in Pulsar's order: a partitioned topic, an id of another partition, then a
    # topic or subscription that does not exist.
    if call.service.policies.partitions(str(name)):
        raise AdminError(METHOD_NOT_ALLOWED, "Expire message at position is not supported for partitioned-topic")
    # An absent partitionIndex is not checked: Pulsar reads it as -1 (its Java field's default),
    # refusing ids without one on every partition, the ones our own CLI sends included.
    if body.get("partitionIndex", name.partition_index) != name.partition_index:
        raise AdminError(PRECONDITION_FAILED, "Invalid parameter for expire message by position, partition index "
                                              "of passed in message position doesn't match partition index for "
                                              "the topic")
    (subscription,) = await subscriptions_of(call)
    ledger = subscription.topic.ledger
    requested = Position(body["ledgerId"], body["entryId"])
    # An id never issued (beyond the last entry; latest too) expires nothing: 409, as Pulsar.
    # isExcluded is checked on the id itself: Pulsar checks the position after it, refusing
    # "everything before the last message" (and expiring one entry more than asked for).
    if requested > ledger.lac:
        # Still recorded as the subscription's last expiry (lastExpireTimestamp), as Pulsar's
        # expireMessages(Position) does: expire_up_to answers False for it.
        await subscription.expire_up_to(requested)
        raise position_not_issued(subscription)
    excluded = bool(body.get("isExcluded"))
    whole = entry_expired_whole(ledger, requested, body.get("batchIndex", -1), excluded)
    last = newest_entry(ledger, requested, inclusive=whole)
    # Nothing before the id: still issued (stats say when), moving nothing.
    if not await subscription.expire_up_to(last if last is not None else subscription.cursor.mark_delete):
        raise position_not_issued(subscription)


@routes.add("POST", TOPIC_URL + "/all_subscription/expireMessages/{expireTimeInSeconds}",
            summary="Expire (acknowledge) the messages published the given seconds ago or earlier on every "
                    "subscription of a topic (not past an open transaction's).",
            params=(*TOPIC_PATH, EXPIRE_TIME_PARAM), replies={204: DONE, **errors(400, 404, 409, 412)})
async def expire_messages_all_subscriptions(call: Call) -> None:
    subscriptions = [subscription for topic in await topics_of(call) for name, subscription
                     in list(topic.subscriptions.items()) if name != COMPACTION_SUBSCRIPTION]
    await expire(subscriptions, call["expireTimeInSeconds"], call.service.config.clock())
