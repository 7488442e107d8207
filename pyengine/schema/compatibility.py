"""What makes schema data valid, and when a new schema is compatible with a topic's schemas:
the rules of Apache Pulsar's `SchemaDataValidator` and its compatibility checks per type.

* Different types are never compatible (unless the strategy is ALWAYS_COMPATIBLE).
* AVRO follows Avro's rules: BACKWARD = the new schema can read data written with the existing
  one, FORWARD = the existing schema can read data written with the new one, FULL = both. JSON
  too, when both are Avro definitions; a schema in the old (Jackson JsonSchema) format is
  accepted next to an Avro one, two old ones need the same id. PROTOBUF (Avro-defined) must be
  a valid definition, but, as in Pulsar, is checked as the other types below.
* Names are Avro's Java parser's (Pulsar's): Unicode letters, digits and `_`.
* PROTOBUF_NATIVE keeps its root message type. KEY_VALUE checks its key and value schemas each
  with their own type's rules, and their types must not change.
* Every other type (STRING, INT64, ...) is compatible with itself under any strategy but
  ALWAYS_INCOMPATIBLE.
"""

from __future__ import annotations

import base64
import json
import struct
from collections.abc import Sequence
from typing import Any

import avro.errors
import avro.schema
from avro.compatibility import ReaderWriterCompatibilityChecker, SchemaCompatibilityType

from pyengine.errors import IncompatibleSchemaError
from pyengine.schema import AVRO_BASED, CompatibilityStrategy, InvalidSchemaDataError, SchemaData, SchemaType

S = CompatibilityStrategy
_PRIMITIVES_WITHOUT_DATA = frozenset(SchemaType) - AVRO_BASED - {
    SchemaType.NONE, SchemaType.STRING, SchemaType.KEY_VALUE, SchemaType.PROTOBUF_NATIVE, SchemaType.AUTO_CONSUME,
    SchemaType.EXTERNAL}
_BYTES = "BYTES"            # a key/value sub-schema of raw bytes (no wire type of its own)


# --- validation ---------------------------------------------------------------------------

def _check_not_union(parsed: avro.schema.Schema) -> None:
    """As Pulsar's StructSchemaDataValidator: a struct schema is not a bare union."""
    if isinstance(parsed, avro.schema.UnionSchema):
        raise InvalidSchemaDataError("Avro schema typed [UNION] is not supported")


def parse_avro(data: bytes) -> avro.schema.Schema:
    """The Avro schema `data` defines (InvalidSchemaDataError if it does not). Names are
    checked as Avro's Java parser (Pulsar's) checks them, not as the Python library does: any
    Unicode letter or `_`, then letters, digits or `_` (`Größe` is a name); namespaces are not
    checked (`com.example.App$`, as Java's reflection names a nested class, is one)."""
    try:
        text = data.decode()
        parsed = avro.schema.parse(text, validate_enum_symbols=False, validate_names=False)
        _check_names(json.loads(text))
        _check_defaults(parsed, set())
    except (UnicodeDecodeError, ValueError, TypeError, avro.errors.AvroException) as exc:
        raise InvalidSchemaDataError(f"invalid Avro schema definition: {exc}") from None
    return parsed


def _check_defaults(schema: avro.schema.Schema, seen: set[int]) -> None:
    """Avro Java's parser (Pulsar's) refuses a field default its type cannot hold, and an enum
    default that is not a symbol; the Python library takes both (and a reader would then fill
    in a value of the wrong type)."""
    if id(schema) in seen:                      # a named type used again, or recursion
        return
    seen.add(id(schema))
    if isinstance(schema, avro.schema.EnumSchema):
        default = schema.get_prop("default")
        if default is not None and default not in schema.symbols:
            raise avro.errors.SchemaParseException(f"The Enum Default: {default} is not in the enum symbol set: "
                                                   f"{schema.symbols}")
    elif isinstance(schema, avro.schema.RecordSchema):
        for field in schema.fields:
            if field.has_default and not _valid_default(field.type, field.default, set()):
                raise avro.errors.SchemaParseException(f"Invalid default for field {field.name}: "
                                                       f"{json.dumps(field.default)} not a {field.type}")
            _check_defaults(field.type, seen)
    elif isinstance(schema, avro.schema.ArraySchema):
        _check_defaults(schema.items, seen)
    elif isinstance(schema, avro.schema.MapSchema):
        _check_defaults(schema.values, seen)
    elif isinstance(schema, avro.schema.UnionSchema):
        for branch in schema.schemas:
            _check_defaults(branch, seen)


_INT_RANGES = {"int": 2**31, "long": 2**63}


def _valid_default(schema: avro.schema.Schema, value: Any, records: set[int]) -> bool:
    """Whether `value` (a default's JSON) is a value of `schema`, as Java's Schema.isValidDefault
    judges it (a union's default may match any branch, as the newer Java parsers allow)."""
    kind = schema.type
    if kind in ("string", "bytes", "enum", "fixed"):
        return isinstance(value, str)
    if kind in _INT_RANGES:
        bound = _INT_RANGES[kind]
        return isinstance(value, int) and not isinstance(value, bool) and -bound <= value < bound
    if kind in ("float", "double"):
        return (isinstance(value, (int, float)) and not isinstance(value, bool)) or \
            value in ("NaN", "Infinity", "-Infinity")
    if kind == "boolean":
        return isinstance(value, bool)
    if kind == "null":
        return value is None
    if kind == "array":
        return isinstance(value, list) and all(_valid_default(schema.items, v, records) for v in value)
    if kind == "map":
        return isinstance(value, dict) and all(_valid_default(schema.values, v, records) for v in value.values())
    if kind == "union":
        return any(_valid_default(branch, value, records) for branch in schema.schemas)
    if kind in ("record", "error"):
        if not isinstance(value, dict) or id(schema) in records:
            return isinstance(value, dict)      # a recursive record's default: not walked again
        inner = records | {id(schema)}
        return all(_valid_default(f.type, value[f.name], inner) if f.name in value
                   else f.has_default and _valid_default(f.type, f.default, inner) for f in schema.fields)
    return False


_NAMED_TYPES = ("record", "error", "enum", "fixed")


def _check_names(node: Any) -> None:
    """Avro Java's name rule (NameValidator.UTF_VALIDATOR) on every name of a schema's JSON:
    named types (the last part of a dotted name), record fields and enum symbols."""
    if isinstance(node, list):                  # a union
        for branch in node:
            _check_names(branch)
        return
    if not isinstance(node, dict):
        return
    kind = node.get("type")
    if kind in _NAMED_TYPES and isinstance(node.get("name"), str):
        _check_name(node["name"].rpartition(".")[2])
    if kind == "enum":
        for symbol in node.get("symbols") or ():
            _check_name(symbol)
    if kind in ("record", "error"):
        for field in node.get("fields") or ():
            if isinstance(field, dict):
                _check_name(field.get("name"))
                _check_names(field.get("type"))
    for key in ("items", "values"):
        _check_names(node.get(key))
    if isinstance(kind, (dict, list)):
        _check_names(kind)


def _check_name(name: Any) -> None:
    if not isinstance(name, str) or not name:
        raise avro.errors.SchemaParseException(f"invalid name: {name!r}")
    if not (name[0].isalpha() or name[0] == "_") or not all(c.isalnum() or c == "_" for c in name[1:]):
        raise avro.errors.SchemaParseException(f"Illegal character in name: {name!r} (letters, digits and _, "
                                               "not starting with a digit)")


_NOT_COMPARED = ("doc", "aliases")      # attributes Avro's (Java) Schema.equals ignores


def _without_docs(node: Any) -> Any:
    """A schema's JSON without what Java's `Schema.equals` does not compare: `doc` and
    `aliases` of named types and fields, and a field's default `order` ("ascending")."""
    if isinstance(node, list):                  # a union
        return [_without_docs(branch) for branch in node]
    if not isinstance(node, dict):
        return node
    out = {k: v for k, v in node.items() if k not in _NOT_COMPARED}
    for key in ("type", "items", "values"):
        if key in out:
            out[key] = _without_docs(out[key])
    if isinstance(out.get("fields"), list):
        fields = []
        for f in out["fields"]:
            if isinstance(f, dict):
                f = _without_docs(f)
                if f.get("order") == "ascending":
                    del f["order"]
            fields.append(f)
        out["fields"] = fields
    return out


def identity_form(data: bytes) -> avro.schema.Schema | None:
    """The Avro schema `data` defines, as Pulsar's broker compares schemas to find an
    identical one (Java's `Schema.equals`: names, types, defaults and custom properties count;
    docs, aliases and the default field order do not). None if it is not an Avro schema."""
    try:
        value = json.loads(data)
    except (UnicodeDecodeError, ValueError):
        return None
    try:
        return parse_avro(json.dumps(_without_docs(value)).encode())
    except InvalidSchemaDataError:
        return None


def identity_key(data: bytes) -> Any:
    """A plain value of `identity_form(data)`, equal to another's exactly when the two forms
    are `==` (Avro compares records, arrays and maps by their JSON, primitives, enums and fixed
    by their properties), to keep and compare without parsing again. None if not Avro."""
    form = identity_form(data)
    if form is None:
        return None
    if isinstance(form, avro.schema.EqualByPropsMixin):
        return ("props", form.props)
    return ("json", json.loads(str(form)))


# The types of a Jackson JsonSchema (JsonFormatTypes): an old-format JSON schema is one of
# them; an Avro definition that is not valid (a record named "1bad") is not.
_JSON_SCHEMA_TYPES = frozenset({"string", "number", "integer", "boolean", "object", "array", "null", "any"})


def _legacy_json_schema(data: bytes) -> dict[str, Any] | None:
    """An old-format JSON schema (a Jackson JsonSchema object), else None."""
    try:
        value = json.loads(data)
    except (UnicodeDecodeError, ValueError):
        return None
    return value if isinstance(value, dict) and value.get("type") in _JSON_SCHEMA_TYPES else None


def validate(schema: SchemaData) -> None:
    """Raise InvalidSchemaDataError unless `schema`'s data is a valid definition of its type."""
    kind = schema.type
    if kind == SchemaType.AUTO_CONSUME:
        raise InvalidSchemaDataError("Schema AUTO_CONSUME is a client-side schema type")
    if kind in (SchemaType.AVRO, SchemaType.PROTOBUF):
        _check_not_union(parse_avro(schema.data))
    elif kind == SchemaType.JSON:
        try:
            parsed = parse_avro(schema.data)
        except InvalidSchemaDataError:
            if _legacy_json_schema(schema.data) is None:
                raise InvalidSchemaDataError("invalid JSON schema: neither an Avro definition nor a JSON schema "
                                             "object") from None
        else:
            _check_not_union(parsed)
    elif kind == SchemaType.STRING:
        if schema.data not in (b"", b"null"):
            raise InvalidSchemaDataError("a STRING schema carries no definition (empty or \"null\")")
    elif kind in _PRIMITIVES_WITHOUT_DATA:
        if schema.data:
            raise InvalidSchemaDataError(f"a {kind.name} schema carries no definition, got {len(schema.data)} bytes")
    elif kind == SchemaType.KEY_VALUE:
        key, value = split_key_value(schema)
        for part in (key, value):
            if part is not None:
                validate(part)
    elif kind == SchemaType.PROTOBUF_NATIVE:
        _protobuf_root(schema.data)


# --- KEY_VALUE ----------------------------------------------------------------------------

def split_key_value(schema: SchemaData) -> tuple[SchemaData | None, SchemaData | None]:
    """The key and value schemas of a KEY_VALUE schema (None for raw bytes). Its data is
    [int32 key length][key schema][int32 value length][value schema], big-endian, -1 for none;
    the parts' types are in the properties `key.schema.type` / `value.schema.type`."""
    data, parts, offset = schema.data, [], 0
    for side in ("key", "value"):
        if len(data) < offset + 4:
            raise InvalidSchemaDataError(f"KEY_VALUE schema data ends before the {side} schema's length")
        (length,) = struct.unpack_from(">i", data, offset)
        offset += 4
        if length < -1 or len(data) < offset + max(length, 0):
            raise InvalidSchemaDataError(f"KEY_VALUE schema data: {side} schema length {length} is out of range")
        part = data[offset:offset + max(length, 0)]
        offset += max(length, 0)
        type_name = schema.properties.get(f"{side}.schema.type", _BYTES)
        if type_name.upper() == _BYTES:
            parts.append(None)
            continue
        try:
            properties = json.loads(schema.properties.get(f"{side}.schema.properties", "{}") or "{}")
        except ValueError:
            raise InvalidSchemaDataError(f"KEY_VALUE schema: {side}.schema.properties is not JSON") from None
        if not isinstance(properties, dict):
            raise InvalidSchemaDataError(f"KEY_VALUE schema: {side}.schema.properties is not a JSON object")
        parts.append(SchemaData(SchemaType.parse(type_name), part, {str(k): str(v) for k, v in properties.items()},
                                schema.properties.get(f"{side}.schema.name", "")))
    if offset != len(data):
        raise InvalidSchemaDataError(f"KEY_VALUE schema data has {len(data) - offset} bytes after the value schema")
    return parts[0], parts[1]


def join_key_value(key: SchemaData | None, value: SchemaData | None, *, encoding: str = "INLINE") -> SchemaData:
    """A KEY_VALUE schema of `key` and `value` (None: raw bytes), as Pulsar's clients build it."""
    data, properties = b"", {"kv.encoding.type": encoding}
    for side, part in (("key", key), ("value", value)):
        raw = b"" if part is None else part.data
        data += struct.pack(">i", len(raw)) + raw
        properties[f"{side}.schema.type"] = _BYTES if part is None else part.type.name
        properties[f"{side}.schema.name"] = "" if part is None else part.name
        properties[f"{side}.schema.properties"] = json.dumps({} if part is None else part.properties)
    return SchemaData(SchemaType.KEY_VALUE, data, properties, "KeyValue")


# --- PROTOBUF_NATIVE ----------------------------------------------------------------------

def _protobuf_root(data: bytes) -> str:
    """The full name of a PROTOBUF_NATIVE schema's root message (its data is Pulsar's JSON
    ProtobufNativeSchemaData: a base64 FileDescriptorSet and the root message's name)."""
    from google.protobuf import descriptor_pb2
    from google.protobuf.message import DecodeError

    try:
        value = json.loads(data)
        root = value["rootMessageTypeName"]
        files = descriptor_pb2.FileDescriptorSet.FromString(base64.b64decode(value["fileDescriptorSet"]))
    except (ValueError, KeyError, TypeError, DecodeError) as exc:
        raise InvalidSchemaDataError(f"invalid PROTOBUF_NATIVE schema data: {exc!r}") from None
    if not isinstance(root, str):
        raise InvalidSchemaDataError("invalid PROTOBUF_NATIVE schema data: rootMessageTypeName is not a string")
    names = {f"{f.package}.{m.name}" if f.package else m.name for f in files.file for m in f.message_type}
    if root not in names:
        raise InvalidSchemaDataError(f"invalid PROTOBUF_NATIVE schema data: no message {root} in its descriptors")
    return root


# --- compatibility ------------------------------------------------------------------------

def same_definition(a: SchemaData, b: SchemaData) -> bool:
    """The same type and bytes (properties aside, as Pulsar compares them), and for KEY_VALUE
    the same key and value types too: those live in the properties, and Pulsar comparing the
    bytes alone takes a STRING key turned INT64 for the same schema."""
    if a.type != b.type or a.data != b.data:
        return False
    if a.type != SchemaType.KEY_VALUE:
        return True
    return all(a.properties.get(f"{side}.schema.type", _BYTES).upper() ==
               b.properties.get(f"{side}.schema.type", _BYTES).upper() for side in ("key", "value"))


def check(existing: Sequence[SchemaData], new: SchemaData, strategy: CompatibilityStrategy, *,
          latest_only: bool | None = None) -> None:
    """Raise IncompatibleSchemaError unless `new` is compatible with `existing` (the live
    versions to check, oldest first: the latest only, or all of them for a transitive
    strategy) under `strategy`. Checked against the latest only (the default for a strategy
    that is not transitive), the latest definition itself passes without a check."""
    if latest_only is None:
        latest_only = not strategy.transitive
    if strategy == S.ALWAYS_COMPATIBLE or not existing:
        return
    for old in existing:
        if old.type != new.type:
            raise IncompatibleSchemaError(f"Incompatible schema: exists schema type {old.type.name}, "
                                          f"new schema type {new.type.name}")
    if latest_only and same_definition(existing[-1], new):
        return                                  # the same definition as the latest
    if new.type == SchemaType.JSON and not latest_only:
        # Checked against all (a consumer's ALWAYS_INCOMPATIBLE too), Pulsar parses every JSON
        # schema as Avro: the old (Jackson) format is only let through one schema to the next.
        _check_avro(existing, new, strategy)
        return
    _CHECKS.get(new.type, _check_default)(existing, new, strategy)


def _check_default(existing: Sequence[SchemaData], new: SchemaData, strategy: CompatibilityStrategy) -> None:
    if strategy == S.ALWAYS_INCOMPATIBLE:
        raise IncompatibleSchemaError("Schema compatibility strategy is ALWAYS_INCOMPATIBLE")


def _avro_pair(reader: avro.schema.Schema, writer: avro.schema.Schema) -> str | None:
    result = ReaderWriterCompatibilityChecker().get_compatibility(reader, writer)
    if result.compatibility == SchemaCompatibilityType.compatible:
        return None
    return "; ".join(result.messages) or "incompatible"


def _check_avro(existing: Sequence[SchemaData], new: SchemaData, strategy: CompatibilityStrategy) -> None:
    if strategy in (S.UNDEFINED, S.ALWAYS_INCOMPATIBLE):
        raise IncompatibleSchemaError(f"Schema compatibility strategy is {strategy.value}")
    try:
        new_schema = _checked_form(new.data)
        olds = [_checked_form(old.data) for old in existing]
    except InvalidSchemaDataError as exc:
        raise IncompatibleSchemaError(str(exc)) from None
    backward = strategy in (S.BACKWARD, S.BACKWARD_TRANSITIVE, S.FULL, S.FULL_TRANSITIVE)
    forward = strategy in (S.FORWARD, S.FORWARD_TRANSITIVE, S.FULL, S.FULL_TRANSITIVE)
    for old in reversed(olds):                  # newest first, as Avro's validator walks them
        problem = (backward and _avro_pair(reader=new_schema, writer=old)) or \
            (forward and _avro_pair(reader=old, writer=new_schema))
        if problem:
            raise IncompatibleSchemaError(f"Error during schema compatibility check with strategy "
                                          f"{strategy.value}: {problem}")


def _checked_form(data: bytes) -> avro.schema.Schema:
    """The Avro schema `data` defines, as compatibility checks read it: its named types'
    aliases made full names. Java's parser (Pulsar's) takes an alias without a dot as one in
    the type's namespace; Avro's Python checker compares the aliases as written with the
    writer's full name, so `"aliases": ["Old"]` in namespace `n` did not match `n.Old`."""
    schema = parse_avro(data)
    if b"aliases" not in data:
        return schema
    return parse_avro(json.dumps(_qualified_aliases(json.loads(data), "")).encode())


def _qualified_aliases(node: Any, namespace: str) -> Any:
    """A schema's JSON with the aliases of its named types resolved as Java resolves them:
    a dotted alias is a full name, another one is in the type's namespace (the namespace of
    its dotted name, else its `namespace`, else the enclosing type's)."""
    if isinstance(node, list):                  # a union
        return [_qualified_aliases(branch, namespace) for branch in node]
    if not isinstance(node, dict):
        return node
    out = dict(node)
    if out.get("type") in _NAMED_TYPES and isinstance(out.get("name"), str):
        name = out["name"]
        if "." in name:
            namespace = name.rpartition(".")[0]
        elif isinstance(out.get("namespace"), str):
            namespace = out["namespace"]
        if isinstance(out.get("aliases"), list):
            out["aliases"] = [f"{namespace}.{alias}" if isinstance(alias, str) and "." not in alias and namespace
                              else alias for alias in out["aliases"]]
    for key in ("type", "items", "values"):
        if isinstance(out.get(key), (dict, list)):
            out[key] = _qualified_aliases(out[key], namespace)
    if isinstance(out.get("fields"), list):
        out["fields"] = [_qualified_aliases(f, namespace) if isinstance(f, dict) else f for f in out["fields"]]
    return out


def _check_json(existing: Sequence[SchemaData], new: SchemaData, strategy: CompatibilityStrategy) -> None:
    if strategy.transitive or len(existing) != 1:
        _check_avro(existing, new, strategy)
        return
    old = existing[0]
    old_is_avro, new_is_avro = _is_avro(old.data), _is_avro(new.data)
    if old_is_avro and new_is_avro:
        _check_avro(existing, new, strategy)
        return
    new_legacy = None if new_is_avro else _legacy_json_schema(new.data)
    if not new_is_avro and new_legacy is None:
        raise IncompatibleSchemaError("Unknown schema format")
    old_legacy = None if old_is_avro else _legacy_json_schema(old.data)
    if new_legacy is not None and old_legacy is not None and new_legacy.get("id") != old_legacy.get("id"):
        raise IncompatibleSchemaError(f"Incompatible schema: JSON schema ids differ: {old_legacy.get('id')!r} != "
                                      f"{new_legacy.get('id')!r}")


def _is_avro(data: bytes) -> bool:
    try:
        parse_avro(data)
    except InvalidSchemaDataError:
        return False
    return True


def _check_protobuf_native(existing: Sequence[SchemaData], new: SchemaData, strategy: CompatibilityStrategy) -> None:
    if strategy == S.ALWAYS_INCOMPATIBLE:
        raise IncompatibleSchemaError("Schema compatibility strategy is ALWAYS_INCOMPATIBLE")
    try:
        root = _protobuf_root(new.data)
        roots = {_protobuf_root(old.data) for old in existing}
    except InvalidSchemaDataError as exc:
        raise IncompatibleSchemaError(str(exc)) from None
    if roots != {root}:
        raise IncompatibleSchemaError("Protobuf root message isn't allow change!")


def _check_key_value(existing: Sequence[SchemaData], new: SchemaData, strategy: CompatibilityStrategy) -> None:
    try:
        key, value = split_key_value(new)
        olds = [split_key_value(old) for old in existing]
    except InvalidSchemaDataError as exc:
        raise IncompatibleSchemaError(str(exc)) from None
    for side, part, old_parts in (("key", key, [o[0] for o in olds]), ("value", value, [o[1] for o in olds])):
        types = {None if p is None else p.type for p in old_parts}
        if types != {None if part is None else part.type}:
            raise IncompatibleSchemaError(f"Key schemas or Value schemas are different schema type: the {side} "
                                          f"schema changes type")
        if part is None:
            _check_default([], SchemaData(SchemaType.NONE), strategy)
        else:
            # as Pulsar's KeyValueSchemaCompatibilityCheck: each side as a list, the way a check
            # against all versions goes (JSON sides parsed as Avro)
            check([p for p in old_parts if p is not None], part, strategy, latest_only=False)


_CHECKS = {SchemaType.AVRO: _check_avro, SchemaType.JSON: _check_json,
           SchemaType.PROTOBUF_NATIVE: _check_protobuf_native, SchemaType.KEY_VALUE: _check_key_value}
