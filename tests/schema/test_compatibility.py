"""Schema validation and compatibility rules per type and strategy (pyengine.schema.compatibility)."""

from __future__ import annotations

import base64
import json

import pytest
from google.protobuf import descriptor_pb2
from hypothesis import given
from hypothesis import strategies as st

from pyengine.errors import IncompatibleSchemaError
from pyengine.schema import CompatibilityStrategy, InvalidSchemaDataError, SchemaData, SchemaType
from pyengine.schema.compatibility import check, join_key_value, split_key_value, validate

S = CompatibilityStrategy


def record(*fields: dict, name: str = "Rec") -> SchemaData:
    return avro(json.dumps({"type": "record", "name": name, "fields": list(fields)}))


def avro(text: str, kind: SchemaType = SchemaType.AVRO) -> SchemaData:
    return SchemaData(kind, text.encode())


A = {"name": "a", "type": "int"}
B_OPTIONAL = {"name": "b", "type": ["null", "string"], "default": None}
B_REQUIRED = {"name": "b", "type": "string"}
V1 = record(A)
V2_WITH_DEFAULT = record(A, B_OPTIONAL)            # a new field with a default: readable both ways
V2_WITHOUT_DEFAULT = record(A, B_REQUIRED)         # new readers cannot fill it from old data


def compatible(existing: list[SchemaData], new: SchemaData, strategy: CompatibilityStrategy) -> bool:
    try:
        check(existing, new, strategy)
    except IncompatibleSchemaError:
        return False
    return True


@pytest.mark.parametrize("strategy", list(S))
def test_a_field_with_a_default_is_compatible_unless_the_strategy_refuses_all(strategy: CompatibilityStrategy) -> None:
    expected = strategy not in (S.ALWAYS_INCOMPATIBLE, S.UNDEFINED)
    assert compatible([V1], V2_WITH_DEFAULT, strategy) == expected


@pytest.mark.parametrize("strategy, expected", [
    (S.BACKWARD, False),     # the new schema reads old data: nothing to fill b with
    (S.FORWARD, True),       # the old schema reads new data: ignores b
    (S.FULL, False),
    (S.ALWAYS_COMPATIBLE, True),
])
def test_a_required_new_field_breaks_backward_reading(strategy: CompatibilityStrategy, expected: bool) -> None:
    assert compatible([V1], V2_WITHOUT_DEFAULT, strategy) == expected


@pytest.mark.parametrize("strategy, expected", [(S.BACKWARD, True), (S.FORWARD, False), (S.FULL, False)])
def test_removing_a_required_field_breaks_forward_reading(strategy: CompatibilityStrategy, expected: bool) -> None:
    assert compatible([V2_WITHOUT_DEFAULT], V1, strategy) == expected


def test_transitive_strategies_check_every_version_the_others_the_latest() -> None:
    # v0 has b required; v1 drops it (backward-compatible with v0); v2 adds b back without a
    # default: readable against v1's data? No - but against v0's data, yes. And the other way:
    history = [V2_WITHOUT_DEFAULT, V1]
    candidate = record(A, {"name": "c", "type": "long"})     # c required: cannot read v1 nor v0
    assert not compatible(history[-1:], candidate, S.BACKWARD)
    renamed = record(A, {"name": "b", "type": "string", "default": "x"})
    assert compatible(history[-1:], renamed, S.BACKWARD)
    # FORWARD: v0's reader needs b, which `V1` data lacks. Latest-only does not look at v0.
    assert compatible(history[-1:], V1, S.FORWARD)
    assert not compatible(history, V1, S.FORWARD_TRANSITIVE)
    assert compatible(history[-1:], V1, S.FULL)
    assert not compatible(history, V1, S.FULL_TRANSITIVE)


def test_a_different_type_is_incompatible_except_under_always_compatible() -> None:
    string = SchemaData(SchemaType.STRING, b"")
    with pytest.raises(IncompatibleSchemaError, match="exists schema type AVRO, new schema type STRING"):
        check([V1], string, S.FULL)
    assert compatible([V1], string, S.ALWAYS_COMPATIBLE)


def test_a_renamed_record_is_a_different_schema() -> None:
    assert not compatible([V1], record(A, name="Other"), S.FORWARD)


@pytest.mark.parametrize("old, new", [
    (SchemaData(SchemaType.STRING, b""), SchemaData(SchemaType.STRING, b"null", {"__charset": "UTF-8"})),
    (SchemaData(SchemaType.PROTOBUF, V1.data), SchemaData(SchemaType.PROTOBUF, V2_WITHOUT_DEFAULT.data)),
])
def test_other_types_are_compatible_with_themselves_unless_always_incompatible(old: SchemaData,
                                                                                new: SchemaData) -> None:
    for strategy in S:
        assert compatible([old], new, strategy) == (strategy != S.ALWAYS_INCOMPATIBLE)


def test_the_latest_definition_again_needs_no_check_but_transitive_checks_do_not_shortcut() -> None:
    assert compatible([V1], SchemaData(SchemaType.AVRO, V1.data, {"p": "q"}), S.ALWAYS_INCOMPATIBLE)
    assert not compatible([V1, V2_WITH_DEFAULT], V1, S.ALWAYS_INCOMPATIBLE)
    # V1 again after V1: fine against the latest, but an older version cannot read it
    assert compatible([V2_WITHOUT_DEFAULT, V1], V1, S.FORWARD)
    assert not compatible([V2_WITHOUT_DEFAULT, V1], V1, S.FORWARD_TRANSITIVE)


def test_nothing_to_check_against_is_compatible() -> None:
    assert compatible([], V1, S.ALWAYS_INCOMPATIBLE)


# --- JSON ---------------------------------------------------------------------------------

def test_json_schemas_defined_in_avro_follow_avro_rules() -> None:
    old, new = avro(V1.data.decode(), SchemaType.JSON), avro(V2_WITHOUT_DEFAULT.data.decode(), SchemaType.JSON)
    assert compatible([old], new, S.FORWARD)
    assert not compatible([old], new, S.BACKWARD)


def test_old_format_json_schemas_are_accepted_next_to_avro_ones_and_compared_by_id() -> None:
    legacy_a = SchemaData(SchemaType.JSON, json.dumps({"type": "object", "id": "urn:a"}).encode())
    legacy_b = SchemaData(SchemaType.JSON, json.dumps({"type": "object", "id": "urn:b"}).encode())
    avro_json = avro(V1.data.decode(), SchemaType.JSON)
    assert compatible([avro_json], legacy_a, S.FULL)
    assert compatible([legacy_a], avro_json, S.FULL)
    assert not compatible([legacy_a], legacy_b, S.FULL)
    assert compatible([legacy_a], SchemaData(SchemaType.JSON, json.dumps({"type": "object", "id": "urn:a",
                                                                           "title": "t"}).encode()), S.FULL)


# --- KEY_VALUE and PROTOBUF_NATIVE --------------------------------------------------------

def test_key_value_layout_round_trips_and_checks_each_side() -> None:
    schema = join_key_value(SchemaData(SchemaType.STRING), V1)
    key, value = split_key_value(schema)
    assert key is not None and key.type == SchemaType.STRING and value is not None and value.data == V1.data
    assert schema.data[:4] == b"\x00\x00\x00\x00"                 # empty key definition
    assert compatible([schema], join_key_value(SchemaData(SchemaType.STRING), V2_WITH_DEFAULT), S.FULL)
    assert not compatible([schema], join_key_value(SchemaData(SchemaType.STRING), V2_WITHOUT_DEFAULT), S.FULL)
    with pytest.raises(IncompatibleSchemaError, match="different schema type"):
        check([schema], join_key_value(SchemaData(SchemaType.INT64), V1), S.FULL)
    with pytest.raises(IncompatibleSchemaError, match="different schema type"):
        check([schema], join_key_value(None, V1), S.FULL)


@pytest.mark.parametrize("data", [b"", b"\x00\x00\x00", b"\x00\x00\x00\x09abc", b"\x00\x00\x00\x00\x00\x00\x00\x00x",
                                  b"\xff\xff\xff\xfe"])
def test_malformed_key_value_data_is_invalid(data: bytes) -> None:
    schema = SchemaData(SchemaType.KEY_VALUE, data, {"key.schema.type": "STRING", "value.schema.type": "STRING"})
    with pytest.raises(InvalidSchemaDataError):
        validate(schema)


def protobuf_native(root: str, *messages: str) -> SchemaData:
    files = descriptor_pb2.FileDescriptorSet()
    proto = files.file.add(name="m.proto", package="pkg")
    for message in messages:
        proto.message_type.add(name=message)
    body = {"fileDescriptorSet": base64.b64encode(files.SerializeToString()).decode(),
            "rootMessageTypeName": root, "rootFileDescriptorName": "m.proto"}
    return SchemaData(SchemaType.PROTOBUF_NATIVE, json.dumps(body).encode())


def test_protobuf_native_keeps_its_root_message() -> None:
    old = protobuf_native("pkg.A", "A", "B")
    assert compatible([old], protobuf_native("pkg.A", "A"), S.FULL)
    with pytest.raises(IncompatibleSchemaError, match="root message"):
        check([old], protobuf_native("pkg.B", "A", "B"), S.BACKWARD)
    with pytest.raises(InvalidSchemaDataError, match="no message pkg.C"):
        validate(protobuf_native("pkg.C", "A"))


# --- validation ---------------------------------------------------------------------------

@pytest.mark.parametrize("schema, message", [
    (SchemaData(SchemaType.AVRO, b"{not json"), "invalid Avro"),
    (SchemaData(SchemaType.AVRO, b'{"type": "record", "name": "R"}'), "invalid Avro"),
    (SchemaData(SchemaType.AVRO, b"\xff\xfe"), "invalid Avro"),
    (SchemaData(SchemaType.JSON, b"[1, 2]"), "invalid JSON schema"),
    (SchemaData(SchemaType.STRING, b"text"), "STRING schema carries no definition"),
    (SchemaData(SchemaType.INT32, b"\x01"), "INT32 schema carries no definition"),
    (SchemaData(SchemaType.AUTO_CONSUME), "client-side"),
    (SchemaData(SchemaType.PROTOBUF_NATIVE, b"{}"), "PROTOBUF_NATIVE"),
])
def test_invalid_definitions_are_refused_with_the_reason(schema: SchemaData, message: str) -> None:
    with pytest.raises(InvalidSchemaDataError, match=message):
        validate(schema)


def test_a_schema_needs_bytes_and_string_properties_and_a_known_type() -> None:
    with pytest.raises(InvalidSchemaDataError, match="unknown schema type 99"):
        SchemaData(99, b"")  # type: ignore[arg-type]
    with pytest.raises(InvalidSchemaDataError, match="must be bytes"):
        SchemaData(SchemaType.AVRO, "text")  # type: ignore[arg-type]
    with pytest.raises(InvalidSchemaDataError, match="properties"):
        SchemaData(SchemaType.AVRO, b"", {"k": 1})  # type: ignore[dict-item]
    with pytest.raises(ValueError, match="unknown schema compatibility strategy"):
        CompatibilityStrategy.parse("SIDEWAYS")


# --- a property: Avro's rules are symmetric where they must be -----------------------------

FIELD_TYPES = ["int", "long", "string", "double", "boolean"]
fields = st.lists(st.tuples(st.sampled_from("abcdef"), st.sampled_from(FIELD_TYPES), st.booleans()),
                  max_size=5, unique_by=lambda f: f[0])


def as_record(spec: list[tuple[str, str, bool]]) -> SchemaData:
    return record(*[{"name": n, "type": t, **({"default": _default(t)} if d else {})} for n, t, d in spec])


def _default(avro_type: str) -> object:
    return {"int": 0, "long": 0, "string": "", "double": 0.0, "boolean": False}[avro_type]


@given(fields, fields)
def test_full_is_backward_and_forward_and_backward_is_forward_reversed(old: list, new: list) -> None:
    a, b = as_record(old), as_record(new)
    backward, forward = compatible([a], b, S.BACKWARD), compatible([a], b, S.FORWARD)
    assert compatible([a], b, S.FULL) == (backward and forward)
    assert forward == compatible([b], a, S.BACKWARD)


# --- names as Avro's Java parser (Pulsar's) takes them (found by an audit) -------------------

def json_record(*fields: dict, name: str) -> SchemaData:
    return avro(json.dumps({"type": "record", "name": name, "fields": list(fields)}), SchemaType.JSON)


@pytest.mark.parametrize("kind", [SchemaType.AVRO, SchemaType.JSON])
def test_names_of_any_unicode_letter_are_avro_names_and_are_checked(kind: SchemaType) -> None:
    """A JSON schema of a record named `Größe` passed for an old-format JSON schema (the Python
    Avro library allows ASCII names only), and then every change was "compatible", even under
    ALWAYS_INCOMPATIBLE; an AVRO one was refused."""
    first = avro(json.dumps({"type": "record", "name": "Größe", "fields": [{"name": "wert", "type": "int"}]}), kind)
    changed = avro(json.dumps({"type": "record", "name": "Größe", "fields": [{"name": "wert", "type": "string"}]}),
                   kind)
    validate(first)
    for strategy in (S.FULL, S.BACKWARD, S.ALWAYS_INCOMPATIBLE):
        assert not compatible([first], changed, strategy)
    assert compatible([first], first, S.FULL)


def test_namespaces_of_nested_java_classes_and_unicode_field_names_are_valid() -> None:
    validate(avro(json.dumps({"type": "record", "name": "Inner", "namespace": "com.example.App$",
                              "fields": [{"name": "größe", "type": "int"}, {"name": "_x1", "type": "long"}]})))
    validate(avro(json.dumps({"type": "enum", "name": "Farbe", "symbols": ["GRÜN", "_1"]})))


@pytest.mark.parametrize("bad", [
    {"type": "record", "name": "1bad", "fields": []},
    {"type": "record", "name": "ok", "fields": [{"name": "with-dash", "type": "int"}]},
    {"type": "enum", "name": "E", "symbols": ["9"]},
    ["null", {"type": "record", "name": "R", "fields": []}],          # a bare union (Pulsar refuses it)
])
@pytest.mark.parametrize("kind", [SchemaType.AVRO, SchemaType.JSON])
def test_invalid_avro_definitions_are_refused_also_as_json(bad, kind: SchemaType) -> None:
    with pytest.raises(InvalidSchemaDataError):
        validate(avro(json.dumps(bad), kind))


def test_an_old_format_json_schema_is_still_taken() -> None:
    legacy = avro(json.dumps({"type": "object", "id": "urn:jsonschema:com:example:Pojo",
                              "properties": {"a": {"type": "integer"}}}), SchemaType.JSON)
    validate(legacy)
    assert compatible([legacy], legacy, S.FULL)
