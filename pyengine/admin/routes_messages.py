"""Reading stored messages through the admin API, as Pulsar's PersistentTopics resource: peek
the n-th message of a subscription's backlog, examine the n-th message from the start or the
end of a topic, get one entry by its id. What `pulsar-admin topics peek-messages`,
`examine-message` and `get-message-by-id` call.

Each reply is one stored entry as Pulsar's generateResponseWithEntry sends it: the payload as
the binary body (decompressed; a batch stays one body of [size][SingleMessageMetadata][payload]
records, which the client splits), the metadata in `X-Pulsar-...` headers. Nothing is filtered
here: markers and the messages of aborted or open transactions are answered too, marked by
`X-Pulsar-marker-type`, `X-Pulsar-txn-aborted` and `X-Pulsar-txn-uncommitted`; the admin
client drops them (showServerMarker, READ_COMMITTED), as Pulsar's does.
"""

from __future__ import annotations

import base64
import datetime
import re
import urllib.parse

from aiohttp import web
from multidict import CIMultiDict

from pyengine.admin.errors import INTERNAL_ERROR, METHOD_NOT_ALLOWED, NOT_FOUND, PRECONDITION_FAILED, AdminError
from pyengine.admin.names import subscription_name
from pyengine.admin.routes_subscriptions import SUB_URL, topics_of
from pyengine.admin.routes_topics import TOPIC_URL, requested_topic
from pyengine.admin.routing import Call, Param, Reply, RouteTable
from pyengine.admin.schemas import INT64_MAX, SUBSCRIPTION, TOPIC_PATH, errors
from pyengine.admin.validation import INVALID_STATUS
from pyengine.broker.topic import Topic
from pyengine.errors import SubscriptionNotFoundError
from pyengine.protocol import pulsar_api_pb2 as pb
from pyengine.protocol.commands import parse_message_metadata
from pyengine.storage.entry import Entry, split_headers_and_payload
from pyengine_kernels import Position
from core_ext.records import RecordFormatError, decompress

routes = RouteTable("messages")

MESSAGE = {200: Reply("The entry's payload (decompressed; a batch whole), its metadata in X-Pulsar-* headers",
                      {"type": "string", "format": "binary"}, media_type="application/octet-stream")}
MESSAGE_POSITION = Param("messagePosition", {"type": "integer", "minimum": 1, "maximum": 2**31 - 1,
                                             INVALID_STATUS: PRECONDITION_FAILED},
                         "the n-th message (1-based) after the subscription's mark-delete position", "path",
                         required=True)
INITIAL_POSITION = Param("initialPosition", {"type": "string", "enum": ["latest", "earliest"]},
                         "count from the last entry (latest) or from the first (earliest)", default="latest")
EXAMINE_POSITION = Param("messagePosition", {"type": "integer", "minimum": -2**63, "maximum": INT64_MAX},
                         "the n-th entry (1-based; below 1: the first) from initialPosition", default=1)
LEDGER_ID = Param("ledgerId", {"type": "integer", "minimum": -2**63, "maximum": INT64_MAX}, "ledger id", "path",
                  required=True)
ENTRY_ID = Param("entryId", {"type": "integer", "minimum": -2**63, "maximum": INT64_MAX}, "entry id", "path",
                 required=True)

_UNSAFE_IN_VALUE = re.compile(r"[\x00-\x1f\x7f%]")
_HEADER_NAME_SAFE = "!#$&'*+-.^_`|~"          # the token characters besides letters and digits


@routes.add("GET", SUB_URL + "/position/{messagePosition}",
            summary="Peek the n-th message after a subscription's mark-delete position (acknowledged ones not "
                    "counted; markers and uncommitted or aborted transactions' messages flagged in headers).",
            params=(*TOPIC_PATH, SUBSCRIPTION, MESSAGE_POSITION), replies={**MESSAGE, **errors(400, 404, 405, 412)})
async def peek_nth_message(call: Call) -> web.Response:
    if call.service.policies.partitions(str(requested_topic(call))):      # first, as Pulsar
        raise AdminError(METHOD_NOT_ALLOWED, "Peek messages on a partitioned topic is not allowed")
    name = subscription_name(call["subName"])
    (topic,) = await topics_of(call)
    subscription = topic.subscriptions.get(name)
    if subscription is None:
        raise SubscriptionNotFoundError("Subscription not found")
    cursor, ledger = subscription.cursor, topic.ledger
    # The n-th entry not acknowledged: jump n entries, then as many again as were acknowledged
    # on the way (Pulsar's asyncGetNthEntry with IndividualDeletedEntries.Exclude).
    after, remaining = cursor.mark_delete, call["messagePosition"]
    while True:
        target = ledger.position_after(after, remaining)
        if target is None:
            raise AdminError(NOT_FOUND, "Message not found")
        remaining = cursor.acked_between(after, target)
        if remaining == 0:
            return entry_reply(topic, _read(topic, target, "Message not found"))
        after = target


@routes.add("GET", TOPIC_URL + "/examinemessage",
            summary="Examine the n-th entry of a topic from its first (earliest) or its last (latest) entry.",
            params=(*TOPIC_PATH, INITIAL_POSITION, EXAMINE_POSITION), replies={**MESSAGE, **errors(400, 404, 405, 412)})
async def examine_message(call: Call) -> web.Response:
    if call.service.policies.partitions(str(requested_topic(call))):
        raise AdminError(METHOD_NOT_ALLOWED, "Examine messages on a partitioned topic is not allowed, "
                                             "please try examine message on specific topic partition")
    (topic,) = await topics_of(call)
    ledger = topic.ledger
    total = ledger.number_of_entries
    wanted = max(call["messagePosition"], 1)
    # From the start, beyond the last entry is the last (as Pulsar's getPositionAfterN); from the
    # end, before the first is none (Pulsar fails the read there).
    nth = min(wanted, total) if call["initialPosition"] == "earliest" else total - wanted + 1
    position = ledger.position_after(ledger.previous_position(ledger.first_position()), nth) if nth > 0 else None
    if position is None:
        raise AdminError(NOT_FOUND, "Message not found")
    return entry_reply(topic, _read(topic, position, "Message not found"))


@routes.add("GET", TOPIC_URL + "/ledger/{ledgerId}/entry/{entryId}", summary="Get one entry by its message id.",
            params=(*TOPIC_PATH, LEDGER_ID, ENTRY_ID), replies={**MESSAGE, **errors(400, 404, 412)})
async def get_message_by_id(call: Call) -> web.Response:
    if call.service.policies.partitions(str(requested_topic(call))):
        # no topic of that name, as Pulsar's topic lookup answers (an id names one partition's entry)
        raise AdminError(NOT_FOUND, f"Topic not found: {requested_topic(call)} is a partitioned topic, "
                                    "ask one of its partitions")
    (topic,) = await topics_of(call)
    if call["ledgerId"] not in topic.ledger.ledgers:
        raise AdminError(NOT_FOUND, f"Message not found, the ledgerId does not belong to the topic {topic.name}")
    return entry_reply(topic, _read(topic, Position(call["ledgerId"], call["entryId"]), "Message id not found"))


MESSAGE_ID_REPLY = {"type": "object", "description": "Pulsar's MessageIdImpl",
                    "properties": {"ledgerId": {"type": "integer"}, "entryId": {"type": "integer"},
                                   "partitionIndex": {"type": "integer"}},
                    "required": ["ledgerId", "entryId", "partitionIndex"]}


PUBLISHED_AT = Param("timestamp", {"type": "integer", "minimum": 0, "maximum": INT64_MAX},
                     "publish time (ms since the epoch)", "path", required=True)


@routes.add("GET", TOPIC_URL + "/messageid/{timestamp}",
            summary="The id of the first message published at or after a time (ms since the epoch).",
            params=(*TOPIC_PATH, PUBLISHED_AT), replies={200: Reply("MessageId", MESSAGE_ID_REPLY),
                                                      **errors(400, 404, 405, 412)})
async def get_message_id_by_timestamp(call: Call) -> dict[str, int]:
    name = requested_topic(call)
    if call.service.policies.partitions(str(name)):
        raise AdminError(METHOD_NOT_ALLOWED, "Get message ID by timestamp on a partitioned topic is not allowed, "
                                             "please try do it on specific topic partition")
    (topic,) = await topics_of(call)
    ledger = topic.ledger
    position = ledger.find_by_publish_time(call["timestamp"])
    if position > ledger.lac:               # nothing published then or since (Pulsar's null)
        raise AdminError(NOT_FOUND, "Message ID not found")
    return {"ledgerId": position.ledger_id, "entryId": position.entry_id, "partitionIndex": name.partition_index}


def _read(topic: Topic, position: Position, missing: str) -> Entry:
    entry = topic.ledger.read_entry(position) if position.entry_id >= 0 else None
    if entry is None:
        raise AdminError(NOT_FOUND, missing)
    return entry


# --- the reply ------------------------------------------------------------------------------

def _time(ms: int) -> str:
    """Pulsar's DateFormatter (ISO_OFFSET_DATE_TIME; a broker running in UTC): milliseconds
    only when not zero, trailing zeros dropped."""
    moment = datetime.datetime.fromtimestamp(ms // 1000, datetime.timezone.utc)
    fraction = f".{ms % 1000:03d}".rstrip("0") if ms % 1000 else ""
    return moment.strftime("%Y-%m-%dT%H:%M:%S") + fraction + "Z"


def _value(text: str) -> str:
    """A header value that cannot break the reply (control characters and `%` escaped as in
    URLs): HTTP has no way to carry a newline of a property's value."""
    return _UNSAFE_IN_VALUE.sub(lambda match: f"%{ord(match[0]):02X}", text)


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _flag(value: bool) -> str:
    return "true" if value else "false"


def entry_reply(topic: Topic, entry: Entry) -> web.Response:
    """`entry` as Pulsar's generateResponseWithEntry answers it (the headers it sets, named and
    formatted as it does, in its order)."""
    try:
        raw_metadata, payload = split_headers_and_payload(entry.data)
        md = parse_message_metadata(raw_metadata)
    except ValueError as exc:
        raise AdminError(INTERNAL_ERROR, f"entry {entry.position} does not decode: {exc}") from None
    headers: list[tuple[str, str]] = [("X-Pulsar-Message-ID", f"{entry.position.ledger_id}:{entry.position.entry_id}")]
    for prop in md.properties:
        name = urllib.parse.quote(prop.key, safe=_HEADER_NAME_SAFE)      # (a header name is a token)
        headers.append(("X-Pulsar-PROPERTY-" + name, _value(prop.value)))
    headers.append(("X-Pulsar-publish-time", _time(md.publish_time)))
    if md.HasField("event_time"):
        headers.append(("X-Pulsar-event-time", _time(md.event_time)))
    if md.HasField("deliver_at_time"):
        headers.append(("X-Pulsar-deliver-at-time", _time(md.deliver_at_time)))
    if md.HasField("num_messages_in_batch"):
        headers.append(("X-Pulsar-num-batch-message", str(md.num_messages_in_batch)))
        # (Pulsar's: the whole entry less its metadata, the magic, checksum and size included)
        headers.append(("X-Pulsar-batch-size", str(len(entry.data) - len(raw_metadata))))
    if md.HasField("null_value"):
        headers.append(("X-Pulsar-null-value", _flag(md.null_value)))
    if md.HasField("num_chunks_from_msg"):
        headers.append(("X-Pulsar-PROPERTY-TOTAL-CHUNKS", str(md.num_chunks_from_msg)))
        headers.append(("X-Pulsar-PROPERTY-CHUNK-ID", str(md.chunk_id)))
    headers.append(("X-Pulsar-Is-Encrypted", _flag(len(md.encryption_keys) > 0)))
    headers.append(("X-Pulsar-producer-name", _value(md.producer_name)))
    headers.append(("X-Pulsar-sequence-id", str(md.sequence_id)))
    if md.HasField("replicated_from"):
        headers.append(("X-Pulsar-replicated-from", _value(md.replicated_from)))
    headers.extend(("X-Pulsar-replicated-to", _value(cluster)) for cluster in md.replicate_to)
    if md.HasField("partition_key"):
        headers.append(("X-Pulsar-partition-key", _value(md.partition_key)))
    if md.HasField("compression"):
        headers.append(("X-Pulsar-compression", pb.CompressionType.Name(md.compression)))
    if md.HasField("uncompressed_size"):
        headers.append(("X-Pulsar-uncompressed-size", str(md.uncompressed_size)))
    if md.HasField("encryption_algo"):
        headers.append(("X-Pulsar-encryption-algo", _value(md.encryption_algo)))
    headers.extend(("X-Pulsar-Base64-encryption-keys", _b64(keys.SerializeToString())) for keys in md.encryption_keys)
    if md.HasField("encryption_param"):
        headers.append(("X-Pulsar-Base64-encryption-param", _b64(md.encryption_param)))
    if md.HasField("schema_version"):
        # The broker's name, and the one Pulsar's admin client reads (they differ upstream).
        headers.append(("X-Pulsar-Base64-schema-version", _b64(md.schema_version)))
        headers.append(("X-Pulsar-Base64-schema-version-b64encoded", _b64(md.schema_version)))
    if md.HasField("partition_key_b64_encoded"):
        headers.append(("X-Pulsar-partition-key-b64-encoded", _flag(md.partition_key_b64_encoded)))
    if md.HasField("ordering_key"):
        headers.append(("X-Pulsar-Base64-ordering-key", _b64(md.ordering_key)))
    if md.HasField("marker_type"):
        headers.append(("X-Pulsar-marker-type", str(md.marker_type)))
    if md.HasField("txnid_least_bits"):
        headers.append(("X-Pulsar-txnid-least-bits", str(md.txnid_least_bits)))
    if md.HasField("txnid_most_bits"):
        headers.append(("X-Pulsar-txnid-most-bits", str(md.txnid_most_bits)))
    if md.HasField("highest_sequence_id"):
        headers.append(("X-Pulsar-highest-sequence-id", str(md.highest_sequence_id)))
    if md.HasField("uuid"):
        headers.append(("X-Pulsar-uuid", _value(md.uuid)))
    if md.HasField("num_chunks_from_msg"):
        headers.append(("X-Pulsar-num-chunks-from-msg", str(md.num_chunks_from_msg)))
    if md.HasField("total_chunk_msg_size"):
        headers.append(("X-Pulsar-total-chunk-msg-size", str(md.total_chunk_msg_size)))
    if md.HasField("chunk_id"):
        headers.append(("X-Pulsar-chunk-id", str(md.chunk_id)))
    if md.HasField("null_partition_key"):
        headers.append(("X-Pulsar-null-partition-key", _flag(md.null_partition_key)))
    # The transaction's state by the buffer (the entry header's txn id, which dispatch goes by):
    # aborted only for a transaction's entry, uncommitted for anything past the read horizon.
    if entry.txn_most >= 0:
        headers.append(("X-Pulsar-txn-aborted", _flag(topic.buffer.hides(entry))))
    headers.append(("X-Pulsar-txn-uncommitted", _flag(entry.position > topic.buffer.max_read_position())))
    # (a multi-dict: a property key, or replicated-to, may repeat)
    return web.Response(body=_body(entry, md, payload), headers=CIMultiDict(headers),
                        content_type="application/octet-stream")


def _body(entry: Entry, md: pb.MessageMetadata, payload: bytes) -> bytes:
    """The payload decompressed, as Pulsar's; an encrypted one as stored (it was compressed
    before it was encrypted: only its consumer's key opens it)."""
    if md.compression == pb.NONE or md.encryption_keys:
        return payload
    try:
        return decompress(md.compression, payload, md.uncompressed_size)
    except RecordFormatError as exc:
        raise AdminError(INTERNAL_ERROR, f"the payload of entry {entry.position} does not decompress: {exc}") \
            from None
