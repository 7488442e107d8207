"""Fuzzing a live server: random bytes and random command sequences (every command type with
random fields, ids that collide with real producers and consumers, payload frames with random
metadata, string fields of commands and of message metadata that are sometimes not UTF-8) never
take the broker down, never make a handler fail unexpectedly, and never stop another connection
from working."""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import AsyncIterator, Iterator

import pytest
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from core_ext.frames import encode_command, encode_payload_frame
from pyengine.protocol import pulsar_api_pb2 as pb
from pyengine.protocol.commands import BODY_FIELD
from pyengine.protocol.server import ProtocolServer
from tests.protocol.wire_driver import WireClient, frame, metadata

TOPICS = ["persistent://public/default/fuzz", "fuzz-2", "persistent://public/default/fuzz-partition-0",
          "persistent://nope/none/t", "bad://x", "", "persistent://pulsar/system/transaction_coordinator_assign"]
# A string drawn as MARK is replaced in the encoded frame by bytes that are not UTF-8 (the same
# length: the protobuf encoding stays valid), which upb hands over as `bytes` (see
# pyengine.protocol.text).
MARK = "\u00e9\u00e9"
NOT_UTF8 = b"\xff\xfe\xff\xfe"
SMALL_INTS = st.one_of(st.integers(0, 3), st.sampled_from([(1 << 64) - 1, (1 << 63) - 1, 1 << 40]))
FUZZ_SETTINGS = settings(max_examples=int(os.environ.get("PYENGINE_FUZZ_EXAMPLES", "100")), suppress_health_check=[HealthCheck.function_scoped_fixture])


def _value(field: FieldDescriptor, depth: int) -> st.SearchStrategy:
    if field.type == FieldDescriptor.TYPE_MESSAGE:
        return message_fields(field.message_type, depth + 1)
    if field.type == FieldDescriptor.TYPE_ENUM:
        return st.sampled_from([v.number for v in field.enum_type.values])
    if field.type == FieldDescriptor.TYPE_BOOL:
        return st.booleans()
    if field.type == FieldDescriptor.TYPE_STRING:
        return st.one_of(st.sampled_from(TOPICS + ["s", "sub", "public/default"]), st.text(max_size=8),
                         st.sampled_from([MARK, "s" + MARK, TOPICS[0] + MARK]))
    if field.type == FieldDescriptor.TYPE_BYTES:
        return st.binary(max_size=8)
    if field.type in (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT):
        return st.floats(allow_nan=False, width=32)
    if field.type in (FieldDescriptor.TYPE_INT32, FieldDescriptor.TYPE_SINT32, FieldDescriptor.TYPE_SFIXED32):
        return st.integers(-2, 3)
    if field.type in (FieldDescriptor.TYPE_INT64, FieldDescriptor.TYPE_SINT64, FieldDescriptor.TYPE_SFIXED64):
        return st.integers(-2, 3)
    return SMALL_INTS


@st.composite
def message_fields(draw: st.DrawFn, descriptor: Descriptor, depth: int = 0) -> dict:
    """Keyword arguments for a message: required fields usually present, others sometimes."""
    fields = {}
    for field in descriptor.fields:
        if depth > 2 and field.type == FieldDescriptor.TYPE_MESSAGE:
            continue
        present = draw(st.booleans()) if not field.is_required else draw(st.integers(0, 9)) > 0
        if not present:
            continue
        if field.is_repeated:
            fields[field.name] = draw(st.lists(_value(field, depth), max_size=2))
        else:
            fields[field.name] = draw(_value(field, depth))
    return fields


@st.composite
def any_command(draw: st.DrawFn) -> bytes:
    """One frame: any command type with random fields, or a SEND with a payload."""
    type_ = draw(st.sampled_from(sorted(BODY_FIELD)))
    body_name = BODY_FIELD[type_]
    descriptor = pb.BaseCommand.DESCRIPTOR.fields_by_name[body_name].message_type
    cmd = pb.BaseCommand(type=type_)
    getattr(cmd, body_name).SetInParent()
    try:
        getattr(cmd, body_name).MergeFrom(type(getattr(cmd, body_name))(**draw(message_fields(descriptor))))
    except (ValueError, TypeError):
        pass                            # a value the message refuses: send the body as it is
    raw = cmd.SerializePartialToString().replace(MARK.encode(), NOT_UTF8)
    if type_ in (pb.BaseCommand.SEND, pb.BaseCommand.MESSAGE) and draw(st.booleans()):
        meta = draw(st.one_of(st.just(metadata()), st.binary(max_size=20), metadata_not_utf8()))
        return encode_payload_frame(raw, meta, draw(st.binary(max_size=64)))
    return encode_command(raw)


# MessageMetadata's string fields the broker may read (keys route Key_Shared entries and are
# compacted by, the others are stored and replayed as they came).
_METADATA_TEXT = ["producer_name", "partition_key", "ordering_key", "replicated_from", "uuid", "encryption_algo",
                  "schema_version", "properties", "replicate_to"]


@st.composite
def metadata_not_utf8(draw: st.DrawFn) -> bytes:
    """A SEND's metadata, valid but for some string fields that are not UTF-8."""
    fields: dict = {}
    for name in draw(st.lists(st.sampled_from(_METADATA_TEXT), min_size=1, max_size=3, unique=True)):
        if name == "properties":
            fields[name] = [pb.KeyValue(key=draw(st.sampled_from(["k", MARK])), value=MARK)]
        elif name == "replicate_to":
            fields[name] = [MARK]
        elif name == "schema_version":
            fields[name] = MARK.encode()            # bytes: kept as they came
        elif name == "ordering_key":
            fields[name] = NOT_UTF8                 # bytes too
        elif name != "producer_name":
            fields[name] = draw(st.sampled_from([MARK, "k" + MARK]))
    if draw(st.booleans()):
        fields["num_messages_in_batch"] = 1
    producer_name = MARK if "producer_name" in fields or draw(st.booleans()) else "p"
    fields.pop("producer_name", None)
    return metadata(producer_name, draw(st.integers(0, 3)), **fields).replace(MARK.encode(), NOT_UTF8)


@st.composite
def setup_send(draw: st.DrawFn) -> bytes:
    """A SEND of SETUP's producer, stored and dispatched to its consumers: its metadata's text
    (keys, properties, names) is sometimes not UTF-8."""
    sequence_id = draw(st.integers(0, 3))
    meta = draw(st.one_of(st.just(metadata("p", sequence_id)), metadata_not_utf8()))
    command = pb.BaseCommand(type=pb.BaseCommand.SEND, send=pb.CommandSend(producer_id=1, sequence_id=sequence_id))
    return encode_payload_frame(command.SerializeToString(), meta, draw(st.binary(max_size=16)))


def commands() -> st.SearchStrategy[bytes]:
    return st.one_of(any_command(), setup_send())


FLOWS = [frame("FLOW", consumer_id=1, messagePermits=100), frame("FLOW", consumer_id=2, messagePermits=100)]
SETUP = [
    frame("PRODUCER", topic=TOPICS[0], producer_id=1, request_id=1),
    frame("SUBSCRIBE", topic=TOPICS[0], subscription="s", subType=pb.CommandSubscribe.Shared, consumer_id=1,
          request_id=2),
    FLOWS[0],
    frame("SUBSCRIBE", topic=TOPICS[0], subscription="ks", subType=pb.CommandSubscribe.Key_Shared, consumer_id=2,
          request_id=4),
    FLOWS[1],
    frame("NEW_TXN", request_id=3, tc_id=0, txn_ttl_seconds=60_000),
]


@pytest.fixture
async def control(server: ProtocolServer) -> AsyncIterator[WireClient]:
    client = await WireClient.connect(server.port)
    yield client
    await client.close()


class _Errors(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def errors() -> Iterator[_Errors]:
    handler = _Errors()
    logger = logging.getLogger("pyengine")
    logger.addHandler(handler)
    yield handler
    logger.removeHandler(handler)


async def _set_up(client: WireClient) -> None:
    """SETUP, answered: its producer is ready (a SEND sent with it is for a producer being
    created, which closes the connection), its consumers are subscribed."""
    client.send_raw(b"".join(f for f in SETUP if f not in FLOWS))
    answered: set[int] = set()
    while len(answered) < 4:
        cmd = await client.receive()
        body = getattr(cmd, cmd.WhichOneof("body"))
        answered.add(body.request_id)
    client.send_raw(b"".join(FLOWS))      # once subscribed (a FLOW of an unknown consumer is ignored)


async def _exchange(server: ProtocolServer, data: list[bytes], control: WireClient, errors: _Errors, *,
                    set_up: bool = False) -> None:
    errors.records.clear()
    fuzzed = await WireClient.connect(server.port)
    try:
        if set_up:
            await _set_up(fuzzed)
        for chunk in data:
            fuzzed.send_raw(chunk)
        try:
            await fuzzed.writer.drain()
        except ConnectionError:
            pass
        await fuzzed.closed(0.05)       # read whatever comes back, briefly
    finally:
        await fuzzed.close()
    await asyncio.sleep(0)
    assert isinstance(await control.request("PING"), pb.CommandPong)
    assert not errors.records, [r.getMessage() for r in errors.records]


@FUZZ_SETTINGS
@given(data=st.lists(st.binary(min_size=1, max_size=200), min_size=1, max_size=4))
async def test_random_bytes_never_break_the_server(server: ProtocolServer, control: WireClient, errors: _Errors,
                                                   data: list[bytes]) -> None:
    await _exchange(server, data, control, errors)


@FUZZ_SETTINGS
@given(sequence=st.lists(commands(), min_size=1, max_size=12))
async def test_random_command_sequences_never_break_the_server(server: ProtocolServer, control: WireClient,
                                                               errors: _Errors, sequence: list[bytes]) -> None:
    await _exchange(server, sequence, control, errors, set_up=True)


@FUZZ_SETTINGS
@given(sequence=st.lists(commands(), min_size=1, max_size=6), cut=st.integers(1, 50))
async def test_random_commands_cut_anywhere_never_break_the_server(server: ProtocolServer, control: WireClient,
                                                                   errors: _Errors, sequence: list[bytes],
                                                                   cut: int) -> None:
    stream = b"".join(SETUP + sequence)
    await _exchange(server, [stream[i:i + cut] for i in range(0, len(stream), cut)], control, errors)
