"""Avro definitions whose defaults their types cannot hold are refused, as Avro Java's parser
(Pulsar's StructSchemaDataValidator) refuses them; valid defaults are still taken."""

from __future__ import annotations

import json

import pytest

from pyengine.schema import InvalidSchemaDataError, SchemaData, SchemaType
from pyengine.schema import compatibility as rules


def _record(field_type, default) -> dict:
    return {"type": "record", "name": "R", "fields": [{"name": "x", "type": field_type, "default": default}]}


BAD = [
    (_record("int", "a"), "Invalid default for field x"),
    (_record("int", None), "Invalid default for field x"),
    (_record("int", 2**31), "Invalid default for field x"),
    (_record("boolean", 0), "Invalid default for field x"),
    (_record({"type": "array", "items": "int"}, ["a"]), "Invalid default for field x"),
    (_record({"type": "map", "values": "long"}, {"k": "v"}), "Invalid default for field x"),
    (_record({"type": "record", "name": "I", "fields": [{"name": "a", "type": "int"}]}, {}),
     "Invalid default for field x"),
    ({"type": "enum", "name": "E", "symbols": ["A", "B"], "default": "Z"}, "not in the enum symbol set"),
]

GOOD = [
    _record("long", 2**40),
    _record("double", 1),
    _record("string", "s"),
    _record(["null", "int"], None),
    _record(["null", "int"], 3),               # a later branch: taken by the newer Java parsers
    _record({"type": "array", "items": "int"}, [1, 2]),
    _record({"type": "record", "name": "I", "fields": [{"name": "a", "type": "int"},
                                                       {"name": "b", "type": "string", "default": "d"}]}, {"a": 1}),
    {"type": "record", "name": "Node", "fields": [{"name": "next", "type": ["null", "Node"], "default": None}]},
    {"type": "enum", "name": "E", "symbols": ["A", "B"], "default": "B"},
]


@pytest.mark.parametrize("kind", [SchemaType.AVRO, SchemaType.PROTOBUF])
@pytest.mark.parametrize(("definition", "message"), BAD)
def test_a_default_its_type_cannot_hold_is_refused(definition: dict, message: str, kind: SchemaType) -> None:
    with pytest.raises(InvalidSchemaDataError, match=message):
        rules.validate(SchemaData(kind, json.dumps(definition).encode()))


@pytest.mark.parametrize(("definition", "message"), BAD[:1])
def test_a_json_schema_with_a_bad_default_is_refused_too(definition: dict, message: str) -> None:
    # not an Avro definition, and not an old-format (Jackson) JSON schema either
    with pytest.raises(InvalidSchemaDataError):
        rules.validate(SchemaData(SchemaType.JSON, json.dumps(definition).encode()))


@pytest.mark.parametrize("definition", GOOD)
def test_defaults_of_the_right_type_are_taken(definition: dict) -> None:
    rules.validate(SchemaData(SchemaType.AVRO, json.dumps(definition).encode()))
    rules.validate(SchemaData(SchemaType.JSON, json.dumps(definition).encode()))
