"""pulsar_api.proto against the research brief's wire facts.

Two kinds of checks:
* enum numbers hard-coded from the brief (ServerError, BaseCommand.Type, MarkerType), so a
  renumbering in the .proto fails even if the brief file is unavailable or edited;
* every field table, nested enum and top-level enum of the brief (section 2), parsed from
  ../shared/protocol/pulsar-wire-protocol.md and compared with the compiled descriptor: field
  numbers, types, rules and declared defaults must be identical, with no extra fields.
"""

import re
import subprocess
from pathlib import Path

from google.protobuf import descriptor_pb2

from pyengine.protocol import pb
from pyengine.protocol.commands import BODY_FIELD

BRIEF_IN_SHARED = Path("protocol") / "pulsar-wire-protocol.md"


def _brief_path() -> Path:
    """The brief in ../shared beside this checkout (CI's layout), or else beside the local
    checkout this one was cloned from (a scratch clone in a temporary directory)."""
    repo = Path(__file__).resolve().parents[2]
    beside = repo.parent / "shared" / BRIEF_IN_SHARED
    if beside.is_file():
        return beside
    try:
        origin = subprocess.run(["git", "-C", str(repo), "remote", "get-url", "origin"],
                                capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return beside
    origin_path = Path(origin.removeprefix("file://"))
    if origin_path.is_dir():
        cloned_from = origin_path.resolve().parent / "shared" / BRIEF_IN_SHARED
        if cloned_from.is_file():
            return cloned_from
    return beside


BRIEF = _brief_path()

# --- hard-coded from the brief, section 2.2 / 2.1 -------------------------------------------------

SERVER_ERROR = {
    "UnknownError": 0, "MetadataError": 1, "PersistenceError": 2, "AuthenticationError": 3,
    "AuthorizationError": 4, "ConsumerBusy": 5, "ServiceNotReady": 6,
    "ProducerBlockedQuotaExceededError": 7, "ProducerBlockedQuotaExceededException": 8,
    "ChecksumError": 9, "UnsupportedVersionError": 10, "TopicNotFound": 11,
    "SubscriptionNotFound": 12, "ConsumerNotFound": 13, "TooManyRequests": 14,
    "TopicTerminatedError": 15, "ProducerBusy": 16, "InvalidTopicName": 17,
    "IncompatibleSchema": 18, "ConsumerAssignError": 19, "TransactionCoordinatorNotFound": 20,
    "InvalidTxnStatus": 21, "NotAllowedError": 22, "TransactionConflict": 23,
    "TransactionNotFound": 24, "ProducerFenced": 25,
}
# The project's extensions beyond the brief, each from a spec: pip-transaction-key-fencing's
# expired-transaction error.
SERVER_ERROR_EXTENSIONS = {"ExpiredTransaction": 26}
# Fields the project adds to the brief's messages (message -> {number: name}); each optional,
# so that clients that never send them (the official one) are unaffected.
FIELD_EXTENSIONS = {
    "CommandTcClientConnectRequest": {3: "epoch", 4: "transaction_key"},
    "CommandTcClientConnectResponse": {4: "epoch"},
}

MARKER_TYPE = {
    "UNKNOWN_MARKER": 0,
    "REPLICATED_SUBSCRIPTION_SNAPSHOT_REQUEST": 10,
    "REPLICATED_SUBSCRIPTION_SNAPSHOT_RESPONSE": 11,
    "REPLICATED_SUBSCRIPTION_SNAPSHOT": 12,
    "REPLICATED_SUBSCRIPTION_UPDATE": 13,
    "TXN_COMMITTING": 20,
    "TXN_COMMIT": 21,
    "TXN_ABORT": 22,
}

# value -> (type name, body field name); the brief's 2.1 table.
BASE_COMMAND_TYPES = {
    2: ("CONNECT", "connect"),
    3: ("CONNECTED", "connected"),
    4: ("SUBSCRIBE", "subscribe"),
    5: ("PRODUCER", "producer"),
    6: ("SEND", "send"),
    7: ("SEND_RECEIPT", "send_receipt"),
    8: ("SEND_ERROR", "send_error"),
    9: ("MESSAGE", "message"),
    10: ("ACK", "ack"),
    11: ("FLOW", "flow"),
    12: ("UNSUBSCRIBE", "unsubscribe"),
    13: ("SUCCESS", "success"),
    14: ("ERROR", "error"),
    15: ("CLOSE_PRODUCER", "close_producer"),
    16: ("CLOSE_CONSUMER", "close_consumer"),
    17: ("PRODUCER_SUCCESS", "producer_success"),
    18: ("PING", "ping"),
    19: ("PONG", "pong"),
    20: ("REDELIVER_UNACKNOWLEDGED_MESSAGES", "redeliverUnacknowledgedMessages"),
    21: ("PARTITIONED_METADATA", "partitionMetadata"),
    22: ("PARTITIONED_METADATA_RESPONSE", "partitionMetadataResponse"),
    23: ("LOOKUP", "lookupTopic"),
    24: ("LOOKUP_RESPONSE", "lookupTopicResponse"),
    25: ("CONSUMER_STATS", "consumerStats"),
    26: ("CONSUMER_STATS_RESPONSE", "consumerStatsResponse"),
    27: ("REACHED_END_OF_TOPIC", "reachedEndOfTopic"),
    28: ("SEEK", "seek"),
    29: ("GET_LAST_MESSAGE_ID", "getLastMessageId"),
    30: ("GET_LAST_MESSAGE_ID_RESPONSE", "getLastMessageIdResponse"),
    31: ("ACTIVE_CONSUMER_CHANGE", "active_consumer_change"),
    32: ("GET_TOPICS_OF_NAMESPACE", "getTopicsOfNamespace"),
    33: ("GET_TOPICS_OF_NAMESPACE_RESPONSE", "getTopicsOfNamespaceResponse"),
    34: ("GET_SCHEMA", "getSchema"),
    35: ("GET_SCHEMA_RESPONSE", "getSchemaResponse"),
    36: ("AUTH_CHALLENGE", "authChallenge"),
    37: ("AUTH_RESPONSE", "authResponse"),
    38: ("ACK_RESPONSE", "ackResponse"),
    39: ("GET_OR_CREATE_SCHEMA", "getOrCreateSchema"),
    40: ("GET_OR_CREATE_SCHEMA_RESPONSE", "getOrCreateSchemaResponse"),
    50: ("NEW_TXN", "newTxn"),
    51: ("NEW_TXN_RESPONSE", "newTxnResponse"),
    52: ("ADD_PARTITION_TO_TXN", "addPartitionToTxn"),
    53: ("ADD_PARTITION_TO_TXN_RESPONSE", "addPartitionToTxnResponse"),
    54: ("ADD_SUBSCRIPTION_TO_TXN", "addSubscriptionToTxn"),
    55: ("ADD_SUBSCRIPTION_TO_TXN_RESPONSE", "addSubscriptionToTxnResponse"),
    56: ("END_TXN", "endTxn"),
    57: ("END_TXN_RESPONSE", "endTxnResponse"),
    58: ("END_TXN_ON_PARTITION", "endTxnOnPartition"),
    59: ("END_TXN_ON_PARTITION_RESPONSE", "endTxnOnPartitionResponse"),
    60: ("END_TXN_ON_SUBSCRIPTION", "endTxnOnSubscription"),
    61: ("END_TXN_ON_SUBSCRIPTION_RESPONSE", "endTxnOnSubscriptionResponse"),
    62: ("TC_CLIENT_CONNECT_REQUEST", "tcClientConnectRequest"),
    63: ("TC_CLIENT_CONNECT_RESPONSE", "tcClientConnectResponse"),
    68: ("TOPIC_MIGRATED", "topicMigrated"),
}
# The project's extensions: scalable topics (PIP-468), the spec's 70-72 and our 73-75.
BASE_COMMAND_EXTENSIONS = {
    70: ("SCALABLE_TOPIC_LOOKUP", "scalableTopicLookup"),
    71: ("SCALABLE_TOPIC_UPDATE", "scalableTopicUpdate"),
    72: ("SCALABLE_TOPIC_CLOSE", "scalableTopicClose"),
    73: ("SCALABLE_CONSUMER_REGISTER", "scalableConsumerRegister"),
    74: ("SCALABLE_CONSUMER_ASSIGNMENT", "scalableConsumerAssignment"),
    75: ("SCALABLE_CONSUMER_UNREGISTER", "scalableConsumerUnregister"),
}


def _enum_items(enum_descriptor) -> dict[str, int]:
    return {value.name: value.number for value in enum_descriptor.values}


def test_server_error_numbers() -> None:
    assert _enum_items(pb.ServerError.DESCRIPTOR) == SERVER_ERROR | SERVER_ERROR_EXTENSIONS


def test_marker_type_numbers() -> None:
    assert _enum_items(pb.MarkerType.DESCRIPTOR) == MARKER_TYPE


def test_base_command_type_numbers_and_body_fields() -> None:
    all_types = {**BASE_COMMAND_TYPES, **BASE_COMMAND_EXTENSIONS}
    types = _enum_items(pb.BaseCommand.Type.DESCRIPTOR)
    assert types == {name: number for number, (name, _) in all_types.items()}
    fields = pb.BaseCommand.DESCRIPTOR.fields_by_number
    for number, (type_name, field_name) in all_types.items():
        field = fields[number]
        assert field.name == field_name, type_name
        assert field.message_type is not None, type_name
        assert not field.is_required and not field.is_repeated, type_name
    # `type` is field 1, required; nothing else besides the bodies.
    assert fields[1].name == "type" and fields[1].is_required
    assert set(fields) == {1, *all_types}
    assert dict(BODY_FIELD) == {number: field for number, (_, field) in all_types.items()}


# --- parsed from the brief file ---------------------------------------------------------------------

SCALARS = {
    "string": "TYPE_STRING", "bytes": "TYPE_BYTES", "bool": "TYPE_BOOL", "int32": "TYPE_INT32",
    "int64": "TYPE_INT64", "uint32": "TYPE_UINT32", "uint64": "TYPE_UINT64", "double": "TYPE_DOUBLE",
}
RULES = {"required": "LABEL_REQUIRED", "optional": "LABEL_OPTIONAL", "repeated": "LABEL_REPEATED"}


def _brief() -> str:
    if not BRIEF.is_file():
        raise AssertionError(f"the wire-protocol brief is not at {BRIEF}: this repository expects the "
                             "shared specs checked out beside it (or beside the checkout it was cloned from), as ../shared")
    return BRIEF.read_text(encoding="utf-8")


def _section(text: str, start: str, end: str) -> str:
    begin = text.index(start)
    return text[begin:text.index(end, begin)]


def _field_tables(text: str) -> dict[str, list[list[str]]]:
    tables: dict[str, list[list[str]]] = {}
    current = None
    for line in _section(text, "### 2.3 Field tables", "\n## 3.").splitlines():
        line = line.strip()
        if m := re.fullmatch(r"\*\*(\w+)\*\*", line):
            current = m.group(1)
            tables[current] = []
        elif current and re.fullmatch(r"\|\s*\d+\s*\|.*\|", line):
            tables[current].append([cell.strip() for cell in line.strip("|").split("|")])
    return tables


def _enum_list(text: str) -> list[tuple[str, int]]:
    pairs = [item.strip().split("=") for item in text.split(",")]
    return [(name.strip(), int(number)) for name, number in pairs]


def _messages() -> dict[str, descriptor_pb2.DescriptorProto]:
    file_proto = descriptor_pb2.FileDescriptorProto.FromString(pb.DESCRIPTOR.serialized_pb)
    return {message.name: message for message in file_proto.message_type}


def test_brief_is_parsed() -> None:
    tables = _field_tables(_brief())
    # 60 tables in the brief; guard against a parser that silently finds nothing
    assert len(tables) >= 60
    assert {"CommandConnect", "MessageMetadata", "CommandEndTxnOnSubscription"} <= set(tables)
    assert all(rows for name, rows in tables.items() if name not in {"CommandPing", "CommandPong"})


def test_every_brief_field_table_matches_the_proto() -> None:
    messages = _messages()
    label_names = {n: v for v, n in descriptor_pb2.FieldDescriptorProto.Label.items()}
    problems = []
    for message_name, rows in _field_tables(_brief()).items():
        if message_name not in messages:
            problems.append(f"{message_name}: missing")
            continue
        added = FIELD_EXTENSIONS.get(message_name, {})
        ours = {field.number: field for field in messages[message_name].field if field.number not in added}
        for field in messages[message_name].field:
            if field.number in added and (field.name != added[field.number]
                                          or label_names[field.label] != "LABEL_OPTIONAL"):
                problems.append(f"{message_name}: extension #{field.number} is not the optional {added[field.number]}")
        theirs = {int(number): (name, type_, rule, default) for number, name, type_, rule, default in rows}
        if set(ours) != set(theirs):
            problems.append(f"{message_name}: field numbers {sorted(ours)} != brief {sorted(theirs)}")
        for number, (name, type_, rule, default) in theirs.items():
            field = ours.get(number)
            if field is None:
                continue
            where = f"{message_name}.{name} (#{number})"
            if field.name != name:
                problems.append(f"{where}: named {field.name}")
            if label_names[field.label] != RULES[rule]:
                problems.append(f"{where}: rule {label_names[field.label]} != {rule}")
            if type_.startswith("enum "):
                expected_type, type_ref = "TYPE_ENUM", type_.removeprefix("enum ")
            elif type_ in SCALARS:
                expected_type, type_ref = SCALARS[type_], ""
            else:
                expected_type, type_ref = "TYPE_MESSAGE", type_
            actual_type = descriptor_pb2.FieldDescriptorProto.Type.Name(field.type)
            if actual_type != expected_type:
                problems.append(f"{where}: type {actual_type} != {type_}")
            if type_ref and field.type_name.rsplit(".", 1)[-1] != type_ref:
                problems.append(f"{where}: refers to {field.type_name}, brief says {type_ref}")
            declared = field.default_value if field.HasField("default_value") else ""
            if declared != default:
                problems.append(f"{where}: default {declared!r} != brief {default!r}")
    assert not problems, "\n".join(problems)


def _schema_type_name(brief_name: str) -> str:
    # Schema.Type values are spelled UPPER_SNAKE in our proto (see the comment there).
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", brief_name).upper()


def test_nested_enums_match_the_brief() -> None:
    found = re.findall(r"^nested enum (\w+)\.(\w+): (.+)$", _brief(), re.M)
    assert len(found) >= 8
    for message_name, enum_name, values in found:
        ours = [(v.name, v.number) for v in getattr(pb, message_name).DESCRIPTOR.enum_types_by_name[enum_name].values]
        expected = _enum_list(values)
        if (message_name, enum_name) == ("Schema", "Type"):
            expected = [(_schema_type_name(name), number) for name, number in expected]
            # two values the brief's client never sends, from Apache's PulsarApi.proto
            expected += [("AUTO_CONSUME", 21), ("EXTERNAL", 22)]
        assert ours == expected, f"{message_name}.{enum_name}"


def test_top_level_enums_match_the_brief() -> None:
    section = _section(_brief(), "### 2.2 Top-level enums", "### 2.3")
    found = re.findall(r"^\*\*(\w+)\*\*: (.+)$", section, re.M)
    names = {name for name, _ in found}
    assert {"ServerError", "TxnAction", "ProtocolVersion", "CompressionType", "ProducerAccessMode",
            "KeySharedMode", "AuthMethod"} <= names
    for enum_name, values in found:
        added = SERVER_ERROR_EXTENSIONS if enum_name == "ServerError" else {}
        ours = [(v.name, v.number) for v in getattr(pb, enum_name).DESCRIPTOR.values if v.name not in added]
        assert ours == _enum_list(values), enum_name


def test_brief_base_command_table_matches_the_proto() -> None:
    rows = re.findall(r"^\| (\d+) \| ([A-Z_]+) \| (\w+) \|", _section(_brief(), "### 2.1", "### 2.2"), re.M)
    assert len(rows) == len(BASE_COMMAND_TYPES)
    for number, type_name, field_name in rows:
        assert pb.BaseCommand.Type.Value(type_name) == int(number)
        assert pb.BaseCommand.DESCRIPTOR.fields_by_number[int(number)].name == field_name

