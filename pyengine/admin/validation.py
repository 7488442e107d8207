"""Request checking against the schemas the routes declare (the same schemas the OpenAPI
document publishes, so the document and the server cannot disagree).

A small subset of JSON Schema, the part the admin API uses: `type` (one or a list, `nullable`),
integer bounds, string length and pattern, `enum`, arrays of `items` (`maxItems`), objects with
`properties`, `required`, `additionalProperties` and `maxProperties`, and `anyOf` (a value
checked by the alternative of its type: the error is that alternative's). A value of the right type
that breaks the schema's bounds, length or pattern is a 400 unless the schema names another
status in `x-invalid-status` (Pulsar answers 412 for an invalid name, 406 for a number of
partitions out of range). Unknown object members are accepted unless `additionalProperties` is
false (Pulsar ignores unknown JSON fields too).
"""

from __future__ import annotations

import functools
import json
import re
from typing import Any

from pyengine.admin.errors import BAD_REQUEST, AdminError

_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "object": (dict,), "array": (list,), "string": (str,), "boolean": (bool,),
    "integer": (int,), "number": (int, float), "null": (type(None),),
}
_INTEGER = re.compile(r"[+-]?[0-9]{1,40}")           # the whole text (fullmatch)
INVALID_STATUS = "x-invalid-status"


def check(value: Any, schema: dict[str, Any], where: str) -> None:
    """Raise AdminError(400) naming `where` when `value` does not match `schema`."""
    if "anyOf" in schema:
        _check_any_of(value, schema["anyOf"], where)
    types = schema.get("type")
    if types is not None:
        allowed = [types] if isinstance(types, str) else list(types)
        if schema.get("nullable"):
            allowed.append("null")
        if not any(_is_type(value, name) for name in allowed):
            raise AdminError(BAD_REQUEST, f"{where}: expected {' or '.join(allowed)}, got {_describe(value)}")
    if value is None:
        return
    if "enum" in schema and value not in schema["enum"]:
        raise AdminError(BAD_REQUEST, f"{where}: must be one of {', '.join(map(str, schema['enum']))}")
    status = schema.get(INVALID_STATUS, BAD_REQUEST)
    if isinstance(value, int) and not isinstance(value, bool):
        if "minimum" in schema and value < schema["minimum"]:
            raise AdminError(status, f"{where}: must be >= {schema['minimum']}")
        if "maximum" in schema and value > schema["maximum"]:
            raise AdminError(status, f"{where}: must be <= {schema['maximum']}")
    elif isinstance(value, str):
        if len(value) < schema.get("minLength", 0):
            raise AdminError(status, f"{where}: must not be empty")
        if "maxLength" in schema and len(value) > schema["maxLength"]:
            raise AdminError(status, f"{where}: longer than {schema['maxLength']} characters")
        if "pattern" in schema and not _pattern(schema["pattern"]).search(value):
            raise AdminError(status, f"{where}: {value[:40]!r} does not match {schema['pattern']}")
    elif isinstance(value, list):
        if "maxItems" in schema and len(value) > schema["maxItems"]:
            raise AdminError(BAD_REQUEST, f"{where}: more than {schema['maxItems']} items")
        for index, item in enumerate(value):
            check(item, schema.get("items", {}), f"{where}[{index}]")
    elif isinstance(value, dict):
        # A keyword the document publishes and the server did not check is a limit nobody keeps.
        if "maxProperties" in schema and len(value) > schema["maxProperties"]:
            raise AdminError(BAD_REQUEST, f"{where}: more than {schema['maxProperties']} members")
        for name in schema.get("required", ()):
            if name not in value:
                raise AdminError(BAD_REQUEST, f"{where}: missing {name!r}")
        properties = schema.get("properties", {})
        extra = schema.get("additionalProperties", True)
        for name, item in value.items():
            if name in properties:
                check(item, properties[name], f"{where}.{name}")
            elif extra is False:
                raise AdminError(BAD_REQUEST, f"{where}: unknown field {name!r}")
            elif isinstance(extra, dict):
                check(item, extra, f"{where}.{name}")


def _check_any_of(value: Any, alternatives: list[dict[str, Any]], where: str) -> None:
    """`value` against the first alternative of its JSON type (an alternative without a type
    takes any), whose error it gets: a number of partitions out of range stays a 406 where a
    body may also be an object."""
    for alternative in alternatives:
        types = alternative.get("type")
        allowed = [types] if isinstance(types, str) else types
        if allowed is None or any(_is_type(value, name) for name in allowed) or (
                value is None and alternative.get("nullable")):
            check(value, alternative, where)
            return
    expected = " or ".join(str(a.get("type")) for a in alternatives)
    raise AdminError(BAD_REQUEST, f"{where}: expected {expected}, got {_describe(value)}")


@functools.lru_cache(maxsize=None)
def _pattern(pattern: str) -> re.Pattern[str]:
    """An OpenAPI (ECMA) pattern as Python runs it: a final `$` is the end of the text, where
    Python's also matches before a last newline ("name\\n" taken for "name")."""
    if pattern.endswith("$") and not pattern.endswith("\\$"):
        pattern = pattern[:-1] + r"\Z"
    return re.compile(pattern)


def from_text(text: str, schema: dict[str, Any], where: str) -> Any:
    """A path or query parameter: its text converted to the schema's type, then checked."""
    kind = schema.get("type")
    if kind == "integer":
        if not _INTEGER.fullmatch(text):
            raise AdminError(BAD_REQUEST, f"{where}: expected an integer, got {text[:40]!r}")
        value: Any = int(text)
    elif kind == "boolean":
        lowered = text.lower()
        if lowered not in ("true", "false"):
            raise AdminError(BAD_REQUEST, f"{where}: expected true or false, got {text[:40]!r}")
        value = lowered == "true"
    else:
        value = text
    check(value, schema, where)
    return value


def parse_json(raw: bytes, where: str = "body") -> Any:
    """Decode a JSON request body; malformed, non-UTF-8, NaN/Infinity or absurdly nested input
    is a 400, never a crash."""
    try:
        return json.loads(raw, parse_constant=_reject_constant)
    except RecursionError:
        raise AdminError(BAD_REQUEST, f"{where}: JSON nested too deeply") from None
    except ValueError as exc:       # JSONDecodeError, UnicodeDecodeError, int() digit limit
        raise AdminError(BAD_REQUEST, f"{where}: malformed JSON ({exc})") from None


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _is_type(value: Any, name: str) -> bool:
    if name in ("integer", "number") and isinstance(value, bool):
        return False
    return isinstance(value, _JSON_TYPES.get(name, ()))


def _describe(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    return "an array" if isinstance(value, list) else "an object"
