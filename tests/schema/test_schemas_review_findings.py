"""Review findings in the schema compatibility rules."""

from __future__ import annotations

import json

import pytest

from pyengine.errors import IncompatibleSchemaError
from pyengine.schema import CompatibilityStrategy, SchemaData, SchemaType
from pyengine.schema import compatibility as rules

S = CompatibilityStrategy


def avro(definition: dict) -> SchemaData:
    return SchemaData(SchemaType.AVRO, json.dumps(definition).encode())


def record(name: str, namespace: str | None = None, **extra: object) -> SchemaData:
    definition = {"type": "record", "name": name, "fields": [{"name": "a", "type": "int"}], **extra}
    if namespace is not None:
        definition["namespace"] = namespace
    return avro(definition)


def test_an_alias_without_a_dot_is_in_the_types_namespace() -> None:
    """A record renamed with `"aliases": ["Old"]` in namespace `n` reads `n.Old` (Java's parser
    resolves the alias in the type's namespace, Pulsar's check accepts it); the check compared
    the alias as written with the writer's full name and refused the rename under BACKWARD."""
    rules.check([record("Old", "n")], record("New", "n", aliases=["Old"]), S.BACKWARD)
    enum_old = avro({"type": "record", "name": "R", "namespace": "n", "fields": [
        {"name": "e", "type": {"type": "enum", "name": "E1", "symbols": ["A"]}}]})
    enum_new = avro({"type": "record", "name": "R", "namespace": "n", "fields": [
        {"name": "e", "type": {"type": "enum", "name": "E2", "aliases": ["E1"], "symbols": ["A"]}}]})
    rules.check([enum_old], enum_new, S.BACKWARD_TRANSITIVE)


def test_an_alias_without_a_dot_does_not_name_a_type_of_another_namespace() -> None:
    """The same alias `Old` in namespace `n` is `n.Old`, not the writer's `Old` of no
    namespace: Java refuses that rename; the check took the alias as written and accepted it."""
    with pytest.raises(IncompatibleSchemaError):
        rules.check([record("Old")], record("New", "n", aliases=["Old"]), S.BACKWARD)
    # a dotted alias is a full name whatever the namespace
    rules.check([record("Old", "m")], record("New", "n", aliases=["m.Old"]), S.BACKWARD)
