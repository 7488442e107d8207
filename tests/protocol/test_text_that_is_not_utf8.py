"""String fields whose bytes are not UTF-8 (pyengine.protocol.text). upb hands a proto2
`string` field that is not UTF-8 over as `bytes`: a subscription, producer, consumer or
namespace name that came so was answered UnknownError (TypeError, AttributeError inside the
handler), and a message whose partition key came so stopped a Key_Shared subscription's
dispatch for good (retried every few seconds, failing each time). Apache Pulsar decodes such
names with replacement characters, so two malformed names become one there; here the request
is refused in its own answer and the connection goes on."""

from __future__ import annotations

import pytest

from core_ext.frames import encode_command
from pyengine.protocol import pulsar_api_pb2 as pb
from pyengine.protocol.commands import BODY_FIELD, base_command, serialize_command
from pyengine.protocol.connection import _HANDLERS, _TEXT_REFUSALS
from pyengine.protocol.server import ProtocolServer
from pyengine.protocol.text import has_text, undecodable_text
from tests.protocol.wire_driver import WireClient, metadata

MARK = "\u00e9\u00e9"               # replaced in the encoded frame by bytes that are not UTF-8
NOT_UTF8 = b"\xff\xfe\xff\xfe"
T = "persistent://public/default/text"
BaseCommand = pb.BaseCommand


def not_utf8(type_: str, **fields) -> bytes:
    command = serialize_command(base_command(type_, **fields))
    assert command.count(MARK.encode()) == 1
    return encode_command(command.replace(MARK.encode(), NOT_UTF8))


# (command, its fields, the answer it gets, the field of the answer holding the error, code)
CASES = [
    ("PRODUCER", dict(topic=T, producer_id=1, request_id=1, producer_name=MARK), "ERROR", "error",
     pb.NotAllowedError),
    ("PRODUCER", dict(topic=T + MARK, producer_id=1, request_id=1), "ERROR", "error", pb.InvalidTopicName),
    ("PRODUCER", dict(topic=T, producer_id=1, request_id=1, metadata=[pb.KeyValue(key="k", value=MARK)]),
     "ERROR", "error", pb.NotAllowedError),
    ("SUBSCRIBE", dict(topic=T, subscription=MARK, consumer_id=1, request_id=1, subType=0), "ERROR", "error",
     pb.NotAllowedError),
    ("SUBSCRIBE", dict(topic=T, subscription="s", consumer_name=MARK, consumer_id=1, request_id=1, subType=0),
     "ERROR", "error", pb.NotAllowedError),
    ("SUBSCRIBE", dict(topic=T, subscription="s", consumer_id=1, request_id=1, subType=0,
                       subscription_properties=[pb.KeyValue(key=MARK, value="v")]), "ERROR", "error",
     pb.NotAllowedError),
    ("GET_TOPICS_OF_NAMESPACE", dict(namespace="public/" + MARK, request_id=1), "ERROR", "error",
     pb.NotAllowedError),
    ("LOOKUP", dict(topic=T + MARK, request_id=1), "LOOKUP_RESPONSE", "error", pb.InvalidTopicName),
    ("PARTITIONED_METADATA", dict(topic=T + MARK, request_id=1), "PARTITIONED_METADATA_RESPONSE", "error",
     pb.InvalidTopicName),
    ("GET_SCHEMA", dict(topic=T + MARK, request_id=1), "GET_SCHEMA_RESPONSE", "error_code", pb.InvalidTopicName),
    ("GET_OR_CREATE_SCHEMA", dict(topic=T, request_id=1, schema=pb.Schema(
        name="s", schema_data=b"{}", type=pb.Schema.JSON, properties=[pb.KeyValue(key="k", value=MARK)])),
     "GET_OR_CREATE_SCHEMA_RESPONSE", "error_code", pb.NotAllowedError),
    ("ADD_SUBSCRIPTION_TO_TXN", dict(request_id=1, txnid_most_bits=0, txnid_least_bits=1, subscription=[
        pb.Subscription(topic=T, subscription=MARK)]), "ADD_SUBSCRIPTION_TO_TXN_RESPONSE", "error",
     pb.NotAllowedError),
    ("END_TXN_ON_SUBSCRIPTION", dict(request_id=1, txnid_most_bits=0, txnid_least_bits=1, txn_action=pb.COMMIT,
                                     subscription=pb.Subscription(topic=T, subscription=MARK)),
     "END_TXN_ON_SUBSCRIPTION_RESPONSE", "error", pb.NotAllowedError),
    ("ADD_PARTITION_TO_TXN", dict(request_id=1, txnid_most_bits=(1 << 64) - 1, txnid_least_bits=(1 << 64) - 1,
                                  partitions=[T + MARK]), "ADD_PARTITION_TO_TXN_RESPONSE", "error",
     pb.InvalidTopicName),
    ("SCALABLE_CONSUMER_REGISTER", dict(request_id=1, consumer_id=1, topic="topic://public/default/x",
                                        subscription="s", consumer_name=MARK),
     "SCALABLE_CONSUMER_ASSIGNMENT", "error", pb.NotAllowedError),
]


@pytest.mark.parametrize("type_,fields,answer,error_field,code", CASES,
                         ids=[f"{case[0]}-{i}" for i, case in enumerate(CASES)])
async def test_a_request_naming_text_that_is_not_utf8_is_refused_in_its_own_answer(
        server: ProtocolServer, client: WireClient, type_, fields, answer, error_field, code) -> None:
    client.send_raw(not_utf8(type_, **fields))
    reply = await client.expect(answer)
    assert getattr(reply, error_field) == code, reply
    assert "is not UTF-8 text" in str(reply)
    # Nothing was made of it, and the connection goes on.
    assert (await client.request("LOOKUP", topic=T, request_id=2)).response == pb.CommandLookupTopicResponse.Connect


async def test_a_key_shared_message_whose_key_is_not_utf8_is_delivered(server: ProtocolServer,
                                                                       client: WireClient) -> None:
    """Its key came as bytes: `entry_key` called .encode() on them, and the dispatch failed
    and was retried for good, delivering nothing more on the subscription."""
    topic = T + "-key-shared"
    await client.create_producer(topic, producer_id=1, request_id=1)
    bad_key = metadata("p", 0, partition_key=MARK).replace(MARK.encode(), NOT_UTF8)
    client.send_payload("SEND", bad_key, b"bad-key", producer_id=1, sequence_id=0)
    assert (await client.receive()).type == BaseCommand.SEND_RECEIPT
    client.send_payload("SEND", metadata("p", 1, partition_key="k"), b"good-key", producer_id=1, sequence_id=1)
    assert (await client.receive()).type == BaseCommand.SEND_RECEIPT
    await client.subscribe(topic, "ks", consumer_id=1, request_id=2, sub_type=pb.CommandSubscribe.Key_Shared,
                           permits=10)
    payloads = [(await client.message(3.0))[1] for _ in range(2)]
    assert sorted(payload[-7:] for payload in payloads) == [b"bad-key", b"ood-key"]


def test_every_handled_command_with_text_is_checked_or_reads_none_of_it() -> None:
    """A new command type with string fields must be checked, or be known to read none."""
    reads_no_text = {BaseCommand.CONNECT, BaseCommand.AUTH_RESPONSE, BaseCommand.ACK, BaseCommand.CLOSE_PRODUCER,
                     BaseCommand.CLOSE_CONSUMER}
    for type_ in _HANDLERS:
        body = BaseCommand.DESCRIPTOR.fields_by_name[BODY_FIELD[type_]].message_type
        if has_text(body):
            assert (type_ in _TEXT_REFUSALS) != (type_ in reads_no_text), BaseCommand.Type.Name(type_)
        else:
            assert type_ not in _TEXT_REFUSALS, BaseCommand.Type.Name(type_)


def test_undecodable_text_names_the_field() -> None:
    command = pb.CommandSubscribe(topic=T, subscription="s", consumer_id=1, request_id=1, subType=0,
                                  metadata=[pb.KeyValue(key="a", value="b"), pb.KeyValue(key="c", value=MARK)])
    raw = command.SerializeToString().replace(MARK.encode(), NOT_UTF8)
    parsed = pb.CommandSubscribe.FromString(raw)
    assert undecodable_text(parsed) == "metadata[1].value"
    assert undecodable_text(command) is None
