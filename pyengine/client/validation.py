"""Checks of the arguments of the public API: a clear TypeError or ValueError, raised before
anything goes on the wire."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pyengine.naming import normalize_topic
from pyengine.schema import SchemaData

CONSUMER_TYPES = ("exclusive", "shared", "failover", "key_shared")
INITIAL_POSITIONS = ("earliest", "latest")


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_positive_number(name: str, value: Any) -> float:
    if not _is_number(value):
        raise TypeError(f"{name} must be a number, not {type(value).__name__}")
    if not value > 0 or value != value or value == float("inf"):
        raise ValueError(f"{name} must be a positive finite number, not {value!r}")
    return value


def check_timeout(name: str, value: Any) -> float | None:
    """An optional timeout in seconds: None (wait forever) or a number >= 0."""
    if value is None:
        return None
    if not _is_number(value):
        raise TypeError(f"{name} must be a number of seconds or None, not {type(value).__name__}")
    if value < 0 or value != value:
        raise ValueError(f"{name} must be >= 0, not {value!r}")
    return value


def check_int(name: str, value: Any, minimum: int, maximum: int | None = None) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{name} must be an int, not {type(value).__name__}")
    if value < minimum or (maximum is not None and value > maximum):
        bound = f">= {minimum}" if maximum is None else f"between {minimum} and {maximum}"
        raise ValueError(f"{name} must be {bound}, not {value}")
    return value


def check_topic(topic: Any) -> str:
    """The normalised topic name (InvalidTopicNameError, a ValueError, if it is not one)."""
    if not isinstance(topic, str):
        raise TypeError(f"a topic name is a string, not {type(topic).__name__}")
    return normalize_topic(topic)


def check_name(name: str, value: Any, *, optional: bool = False) -> str | None:
    if value is None and optional:
        return None
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a string, not {type(value).__name__}")
    if not value or value.strip() != value or any(ch in value for ch in "\0\n\r"):
        raise ValueError(f"{name} must be a non-empty name without surrounding blanks, not {value!r}")
    return value


def option_name(name: str, value: Any, pulsar_enum: str) -> str:
    """The lower-case name `value` gives: a string in any case, or pulsar-client's enum of that
    option (`pulsar.ConsumerType.KeyShared`, `pulsar.InitialPosition.Earliest`: matched by its
    type's name and the member's name, pulsar is not imported)."""
    if isinstance(value, str):
        return value.lower().replace("-", "_")
    if type(value).__name__ == pulsar_enum and isinstance(getattr(value, "name", None), str):
        return value.name.lower()
    raise TypeError(f"{name} must be a string (or pulsar.{pulsar_enum}), not {type(value).__name__}")


def check_consumer_type(value: Any) -> str:
    normalized = option_name("consumer_type", value, "ConsumerType")
    normalized = "key_shared" if normalized == "keyshared" else normalized
    if normalized not in CONSUMER_TYPES:
        raise ValueError(f"consumer_type must be one of {', '.join(CONSUMER_TYPES)}, not {value!r}")
    return normalized


def check_initial_position(value: Any) -> str:
    normalized = option_name("initial_position", value, "InitialPosition")
    if normalized not in INITIAL_POSITIONS:
        raise ValueError(f"initial_position must be 'earliest' or 'latest', not {value!r}")
    return normalized


def check_payload(data: Any) -> bytes:
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise TypeError(f"data must be bytes, not {type(data).__name__}")
    return bytes(data)


def check_properties(properties: Any) -> dict[str, str]:
    if properties is None:
        return {}
    if not isinstance(properties, Mapping):
        raise TypeError(f"properties must be a dict of str to str, not {type(properties).__name__}")
    for key, value in properties.items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise TypeError(f"properties must map str to str, not {key!r}: {value!r}")
    return dict(properties)


def check_send_fields(key: Any, properties: Any, event_time: Any, sequence_id: Any) -> dict[str, str]:
    """A send's optional fields (the properties returned as a dict): what both the network
    client and the embedded API refuse before a producer changes."""
    if key is not None and not isinstance(key, str):
        raise TypeError(f"key must be a string, not {type(key).__name__}")
    props = check_properties(properties)
    if event_time is not None:
        check_int("event_time", event_time, 0, (1 << 64) - 1)       # MessageMetadata's uint64
    if sequence_id is not None:
        check_int("sequence_id", sequence_id, 0, (1 << 63) - 1)
    return props


def check_schema(schema: object) -> None:
    """A producer's or consumer's schema: a pyengine.schema.SchemaData, or None (bytes)."""
    if schema is not None and not isinstance(schema, SchemaData):
        raise TypeError(f"schema must be a pyengine.schema.SchemaData or None, not {type(schema).__name__}")
