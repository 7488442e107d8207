"""Complete frames of the commands a broker sends, ready for `transport.write`.

Every builder fills the fields the C++ client requires (a missing required field makes it
drop the connection, brief 2.3/4.9). The per-message ones (SEND_RECEIPT, MESSAGE) are on the
hot path: they set fields on a fresh protobuf and serialize it, nothing more.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

from core_ext.frames import encode_command
from pyengine.protocol import pulsar_api_pb2 as pb
from pyengine.protocol.schema_codec import fill_schema
from pyengine.schema import StoredSchema, encode_version
from pyengine_kernels import Position, TxnId

BaseCommand = pb.BaseCommand
PROTOCOL_VERSION = 20            # what the official client 3.13 (C++ 4.2.0) speaks
U64 = 1 << 64
# Request id of broker-initiated CLOSE_PRODUCER / CLOSE_CONSUMER (the client ignores it);
# Apache sends -1 as uint64.
NOTIFICATION_REQUEST_ID = U64 - 1
_FRAME_HEAD = struct.Struct(">II")


def u64(value: int) -> int:
    """A signed id (-1 = none) as the wire's uint64."""
    return value % U64


def i64(value: int) -> int:
    """A uint64 from the wire (a sequence id) as an int64 field holds it: the same 64 bits,
    as Apache's broker keeps them in a Java long."""
    return (value + (1 << 63)) % U64 - (1 << 63)


def _frame(cmd: pb.BaseCommand) -> bytes:
    return encode_command(cmd.SerializeToString())


def connected(server_version: str, protocol_version: int, max_message_size: int) -> bytes:
    cmd = BaseCommand(type=BaseCommand.CONNECTED)
    body = cmd.connected
    body.server_version = server_version
    body.protocol_version = protocol_version
    body.max_message_size = max_message_size
    return _frame(cmd)


def ping() -> bytes:
    cmd = BaseCommand(type=BaseCommand.PING)
    cmd.ping.SetInParent()
    return _frame(cmd)


def pong() -> bytes:
    cmd = BaseCommand(type=BaseCommand.PONG)
    cmd.pong.SetInParent()
    return _frame(cmd)


PING_FRAME = ping()
PONG_FRAME = pong()


def success(request_id: int) -> bytes:
    cmd = BaseCommand(type=BaseCommand.SUCCESS)
    cmd.success.request_id = request_id
    return _frame(cmd)


def error(request_id: int, code: int, message: str) -> bytes:
    cmd = BaseCommand(type=BaseCommand.ERROR)
    body = cmd.error
    body.request_id = request_id
    body.error = code
    body.message = message
    return _frame(cmd)


def partitioned_metadata(request_id: int, partitions: int) -> bytes:
    cmd = BaseCommand(type=BaseCommand.PARTITIONED_METADATA_RESPONSE)
    body = cmd.partitionMetadataResponse
    body.request_id = request_id
    body.partitions = partitions
    body.response = pb.CommandPartitionedTopicMetadataResponse.Success
    return _frame(cmd)


def partitioned_metadata_failed(request_id: int, code: int, message: str) -> bytes:
    cmd = BaseCommand(type=BaseCommand.PARTITIONED_METADATA_RESPONSE)
    body = cmd.partitionMetadataResponse
    body.request_id = request_id
    body.response = pb.CommandPartitionedTopicMetadataResponse.Failed
    body.error = code
    body.message = message
    return _frame(cmd)


def lookup_connect(request_id: int, broker_url: str) -> bytes:
    cmd = BaseCommand(type=BaseCommand.LOOKUP_RESPONSE)
    body = cmd.lookupTopicResponse
    body.request_id = request_id
    body.response = pb.CommandLookupTopicResponse.Connect
    body.brokerServiceUrl = broker_url
    body.authoritative = True
    return _frame(cmd)


def lookup_failed(request_id: int, code: int, message: str) -> bytes:
    cmd = BaseCommand(type=BaseCommand.LOOKUP_RESPONSE)
    body = cmd.lookupTopicResponse
    body.request_id = request_id
    body.response = pb.CommandLookupTopicResponse.Failed
    body.error = code
    body.message = message
    return _frame(cmd)


def producer_success(request_id: int, producer_name: str, last_sequence_id: int, *,
                     topic_epoch: int | None = None, ready: bool = True, schema_version: bytes = b"") -> bytes:
    cmd = BaseCommand(type=BaseCommand.PRODUCER_SUCCESS)
    body = cmd.producer_success
    body.request_id = request_id
    body.producer_name = producer_name
    body.last_sequence_id = i64(last_sequence_id)      # int64, sequence ids are uint64
    if schema_version:                  # the producer's schema (a producer of bytes has none)
        body.schema_version = schema_version
    if topic_epoch is not None:
        body.topic_epoch = topic_epoch
    if not ready:
        body.producer_ready = False
    return _frame(cmd)


def send_receipt(producer_id: int, sequence_id: int, highest_sequence_id: int, position: Position | None) -> bytes:
    """A receipt; `position` None is a de-duplicated send (Apache answers ledger/entry -1)."""
    cmd = BaseCommand(type=BaseCommand.SEND_RECEIPT)
    body = cmd.send_receipt
    body.producer_id = producer_id
    body.sequence_id = sequence_id
    body.highest_sequence_id = highest_sequence_id
    message_id = body.message_id
    if position is None:
        message_id.ledgerId = U64 - 1
        message_id.entryId = U64 - 1
    else:
        message_id.ledgerId = position.ledger_id
        message_id.entryId = position.entry_id
    return _frame(cmd)


def send_error(producer_id: int, sequence_id: int, code: int, message: str) -> bytes:
    cmd = BaseCommand(type=BaseCommand.SEND_ERROR)
    body = cmd.send_error
    body.producer_id = producer_id
    body.sequence_id = sequence_id
    body.error = code
    body.message = message
    return _frame(cmd)


def message_head(consumer_id: int, position: Position, redelivery_count: int,
                 ack_set: Sequence[int] | None, payload_size: int, partition: int = -1,
                 consumer_epoch: int = -1) -> bytes:
    """The start of a MESSAGE frame: sizes and command; the stored entry (checksum, metadata
    and payload as the producer sent them) follows as a separate buffer, never copied.
    `partition`: the topic's partition index (-1: not a partition), in the message id as
    Apache's broker sets it; clients compare ids with it (the C++ client's
    hasMessageAvailable against GET_LAST_MESSAGE_ID's id). `consumer_epoch`: the consumer's
    PIP-84 epoch (-1: none, not sent)."""
    cmd = BaseCommand(type=BaseCommand.MESSAGE)
    body = cmd.message
    body.consumer_id = consumer_id
    message_id = body.message_id
    message_id.ledgerId = position.ledger_id
    message_id.entryId = position.entry_id
    if partition >= 0:
        message_id.partition = partition
    if redelivery_count:
        body.redelivery_count = redelivery_count
    if ack_set:
        body.ack_set.extend(ack_set)
    if consumer_epoch >= 0:
        body.consumer_epoch = consumer_epoch
    raw = cmd.SerializeToString()
    return _FRAME_HEAD.pack(4 + len(raw) + payload_size, len(raw)) + raw


def ack_response(consumer_id: int, request_id: int, txn: TxnId | None = None,
                 code: int | None = None, message: str = "") -> bytes:
    cmd = BaseCommand(type=BaseCommand.ACK_RESPONSE)
    body = cmd.ackResponse
    body.consumer_id = consumer_id
    body.request_id = request_id
    if txn is not None:
        body.txnid_most_bits = txn.most_bits
        body.txnid_least_bits = txn.least_bits
    if code is not None:
        body.error = code
        body.message = message
    return _frame(cmd)


def close_producer(producer_id: int) -> bytes:
    cmd = BaseCommand(type=BaseCommand.CLOSE_PRODUCER)
    cmd.close_producer.producer_id = producer_id
    cmd.close_producer.request_id = NOTIFICATION_REQUEST_ID
    return _frame(cmd)


def close_consumer(consumer_id: int) -> bytes:
    cmd = BaseCommand(type=BaseCommand.CLOSE_CONSUMER)
    cmd.close_consumer.consumer_id = consumer_id
    cmd.close_consumer.request_id = NOTIFICATION_REQUEST_ID
    return _frame(cmd)


def active_consumer_change(consumer_id: int, active: bool) -> bytes:
    cmd = BaseCommand(type=BaseCommand.ACTIVE_CONSUMER_CHANGE)
    cmd.active_consumer_change.consumer_id = consumer_id
    cmd.active_consumer_change.is_active = active
    return _frame(cmd)


def message_id_data(position: Position, *, partition: int = -1, batch_index: int = -1) -> pb.MessageIdData:
    data = pb.MessageIdData(ledgerId=u64(position.ledger_id), entryId=u64(position.entry_id))
    if partition >= 0:
        data.partition = partition
    if batch_index >= 0:
        data.batch_index = batch_index
    return data


def last_message_id(request_id: int, last: pb.MessageIdData, mark_delete: pb.MessageIdData | None) -> bytes:
    cmd = BaseCommand(type=BaseCommand.GET_LAST_MESSAGE_ID_RESPONSE)
    body = cmd.getLastMessageIdResponse
    body.request_id = request_id
    body.last_message_id.CopyFrom(last)
    if mark_delete is not None:
        body.consumer_mark_delete_position.CopyFrom(mark_delete)
    return _frame(cmd)


def topics_of_namespace(request_id: int, topics: list[str]) -> bytes:
    cmd = BaseCommand(type=BaseCommand.GET_TOPICS_OF_NAMESPACE_RESPONSE)
    body = cmd.getTopicsOfNamespaceResponse
    body.request_id = request_id
    body.topics.extend(topics)
    return _frame(cmd)


def schema_error(request_id: int, code: int, message: str) -> bytes:
    cmd = BaseCommand(type=BaseCommand.GET_SCHEMA_RESPONSE)
    body = cmd.getSchemaResponse
    body.request_id = request_id
    body.error_code = code
    body.error_message = message
    return _frame(cmd)


def get_schema_response(request_id: int, name: str, stored: StoredSchema) -> bytes:
    cmd = BaseCommand(type=BaseCommand.GET_SCHEMA_RESPONSE)
    body = cmd.getSchemaResponse
    body.request_id = request_id
    fill_schema(body.schema, stored.schema, name)
    body.schema_version = encode_version(stored.version)
    return _frame(cmd)


def get_or_create_schema_response(request_id: int, version: int | None) -> bytes:
    cmd = BaseCommand(type=BaseCommand.GET_OR_CREATE_SCHEMA_RESPONSE)
    body = cmd.getOrCreateSchemaResponse
    body.request_id = request_id
    body.schema_version = encode_version(version)
    return _frame(cmd)


def get_or_create_schema_error(request_id: int, code: int, message: str) -> bytes:
    cmd = BaseCommand(type=BaseCommand.GET_OR_CREATE_SCHEMA_RESPONSE)
    body = cmd.getOrCreateSchemaResponse
    body.request_id = request_id
    body.error_code = code
    body.error_message = message
    return _frame(cmd)


def consumer_stats(request_id: int, stats: dict) -> bytes:
    cmd = BaseCommand(type=BaseCommand.CONSUMER_STATS_RESPONSE)
    body = cmd.consumerStatsResponse
    body.request_id = request_id
    body.consumerName = stats["consumerName"]
    body.availablePermits = max(0, stats["availablePermits"])
    body.unackedMessages = stats["unackedMessages"]
    body.blockedConsumerOnUnackedMsgs = stats["blockedConsumerOnUnackedMsgs"]
    body.msgBacklog = stats["msgBacklog"]
    body.type = stats["type"]
    body.address = stats["address"]
    return _frame(cmd)


def consumer_stats_error(request_id: int, code: int, message: str) -> bytes:
    cmd = BaseCommand(type=BaseCommand.CONSUMER_STATS_RESPONSE)
    body = cmd.consumerStatsResponse
    body.request_id = request_id
    body.error_code = code
    body.error_message = message
    return _frame(cmd)


# --- transaction responses (only ever answers to transaction requests) ---------------------

_TXN_RESPONSES = {
    BaseCommand.TC_CLIENT_CONNECT_RESPONSE: "tcClientConnectResponse",
    BaseCommand.NEW_TXN_RESPONSE: "newTxnResponse",
    BaseCommand.ADD_PARTITION_TO_TXN_RESPONSE: "addPartitionToTxnResponse",
    BaseCommand.ADD_SUBSCRIPTION_TO_TXN_RESPONSE: "addSubscriptionToTxnResponse",
    BaseCommand.END_TXN_RESPONSE: "endTxnResponse",
    BaseCommand.END_TXN_ON_PARTITION_RESPONSE: "endTxnOnPartitionResponse",
    BaseCommand.END_TXN_ON_SUBSCRIPTION_RESPONSE: "endTxnOnSubscriptionResponse",
}


def tc_client_connect_response(request_id: int, epoch: int) -> bytes:
    """A keyed TC_CLIENT_CONNECT's success: the epoch the connection now holds."""
    cmd = BaseCommand(type=BaseCommand.TC_CLIENT_CONNECT_RESPONSE)
    cmd.tcClientConnectResponse.request_id = request_id
    cmd.tcClientConnectResponse.epoch = epoch
    return _frame(cmd)


def txn_response(type_: int, request_id: int, txn: TxnId | None = None,
                 code: int | None = None, message: str = "") -> bytes:
    """Any of the transaction responses: request id, txn id bits when known, error if any."""
    cmd = BaseCommand(type=type_)
    body = getattr(cmd, _TXN_RESPONSES[type_])
    body.request_id = request_id
    if txn is not None:
        body.txnid_most_bits = txn.most_bits
        body.txnid_least_bits = txn.least_bits
    if code is not None:
        body.error = code
        body.message = message
    return _frame(cmd)
