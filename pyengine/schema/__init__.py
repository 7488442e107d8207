"""The schema registry: the schemas typed producers and consumers declare, versioned per topic
and checked for compatibility, as Apache Pulsar's broker keeps them (`SchemaRegistryService`).

* A topic's schemas form a list of versions numbered from 0. All partitions of a partitioned
  topic share one list, and so do `persistent://` and `non-persistent://` topics of the same
  name: the list is keyed by `schema_id` (`tenant/namespace/topic`, Pulsar's schema name).
* `put_if_absent` answers the version of an identical schema (same type; the same Avro schema
  for AVRO/JSON/PROTOBUF, the same bytes otherwise; properties are not compared) or checks the
  new schema against the latest version (against all of them for a `*_TRANSITIVE` strategy)
  and stores it as the next version.
* A delete appends a tombstone that takes a version number: the schemas before it no longer
  count, and the next schema is stored without a check. A forced delete forgets the list.
* Versions travel on the wire as 8-byte big-endian integers (`encode_version`); a producer
  without a schema gets the empty version.

Implementation: `pyengine.schema.registry.LmdbSchemaRegistry` (records in the data dir's
metadata database); the rules per schema type are in `pyengine.schema.compatibility`.
"""

from __future__ import annotations

import abc
import enum
import struct
from collections.abc import Callable
from dataclasses import dataclass, field

from pyengine.errors import IncompatibleSchemaError, PulsarError
from pyengine.naming import TopicName

__all__ = [
    "CompatibilityStrategy", "IncompatibleSchemaError", "InvalidSchemaDataError", "SchemaData", "SchemaInfo",
    "SchemaRegistry", "SchemaType", "StoredSchema", "decode_version", "encode_version", "schema_id",
]


class SchemaType(enum.IntEnum):
    """Schema types by their wire number (`Schema.Type`), named as Pulsar's SchemaType names them
    in the admin API. BYTES is not a wire type: a producer of bytes sends no schema."""

    NONE = 0
    STRING = 1
    JSON = 2
    PROTOBUF = 3
    AVRO = 4
    BOOLEAN = 5
    INT8 = 6
    INT16 = 7
    INT32 = 8
    INT64 = 9
    FLOAT = 10
    DOUBLE = 11
    DATE = 12
    TIME = 13
    TIMESTAMP = 14
    KEY_VALUE = 15
    INSTANT = 16
    LOCAL_DATE = 17
    LOCAL_TIME = 18
    LOCAL_DATE_TIME = 19
    PROTOBUF_NATIVE = 20
    AUTO_CONSUME = 21          # a consumer's "whatever the topic has": never stored
    EXTERNAL = 22

    @classmethod
    def parse(cls, value: object) -> SchemaType:
        """A type from its wire number or its admin-API name (InvalidSchemaDataError otherwise)."""
        try:
            if isinstance(value, str):
                return cls[value.upper()]
            if isinstance(value, int) and not isinstance(value, bool):
                return cls(value)
        except (KeyError, ValueError):
            pass
        raise InvalidSchemaDataError(f"unknown schema type {value!r}")


AVRO_BASED = frozenset({SchemaType.AVRO, SchemaType.JSON, SchemaType.PROTOBUF})


class CompatibilityStrategy(enum.Enum):
    """Pulsar's SchemaCompatibilityStrategy. UNDEFINED (the namespace default) means "the
    broker's strategy", which is FULL unless configured."""

    UNDEFINED = "UNDEFINED"
    ALWAYS_INCOMPATIBLE = "ALWAYS_INCOMPATIBLE"
    ALWAYS_COMPATIBLE = "ALWAYS_COMPATIBLE"
    BACKWARD = "BACKWARD"
    FORWARD = "FORWARD"
    FULL = "FULL"
    BACKWARD_TRANSITIVE = "BACKWARD_TRANSITIVE"
    FORWARD_TRANSITIVE = "FORWARD_TRANSITIVE"
    FULL_TRANSITIVE = "FULL_TRANSITIVE"

    @property
    def transitive(self) -> bool:
        return self.value.endswith("_TRANSITIVE")

    @classmethod
    def parse(cls, value: object) -> CompatibilityStrategy:
        if isinstance(value, str):
            try:
                return cls[value.upper()]
            except KeyError:
                pass
        raise ValueError(f"unknown schema compatibility strategy {value!r}; one of "
                         f"{', '.join(s.value for s in cls)}")


class InvalidSchemaDataError(PulsarError, ValueError):
    """Schema data that does not parse for its type (Pulsar's InvalidSchemaDataException; on
    the wire it is IncompatibleSchema, as Apache sends it)."""

    server_error = IncompatibleSchemaError.server_error


@dataclass(frozen=True)
class SchemaData:
    """A schema as a client declares it: its type, its definition and free-form properties."""

    type: SchemaType
    data: bytes = b""
    properties: dict[str, str] = field(default_factory=dict)
    name: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.type, SchemaType):
            object.__setattr__(self, "type", SchemaType.parse(self.type))
        if not isinstance(self.data, bytes):
            raise InvalidSchemaDataError(f"schema data must be bytes, not {type(self.data).__name__}")
        if not isinstance(self.properties, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in self.properties.items()):
            raise InvalidSchemaDataError("schema properties must map strings to strings")


@dataclass(frozen=True)
class SchemaInfo:
    """A topic's schema as GET_SCHEMA answers it: its version and definition."""

    version: int
    schema: SchemaData


@dataclass(frozen=True)
class StoredSchema:
    """One version of a topic's schema list; a tombstone (`deleted`) marks a delete."""

    version: int
    schema: SchemaData
    timestamp_ms: int
    deleted: bool = False


def encode_version(version: int | None) -> bytes:
    """A version as the wire carries it: 8 bytes big-endian; None (no schema) is empty."""
    return b"" if version is None else struct.pack(">q", version)


def decode_version(raw: bytes) -> int:
    if len(raw) < 8:
        raise InvalidSchemaDataError(f"a schema version is 8 bytes, not {len(raw)}")
    return int(struct.unpack_from(">q", raw)[0])


def schema_id(topic: str | TopicName) -> str:
    """The key of a topic's schema list: Pulsar's `TopicName.getSchemaName()` (no domain, no
    partition suffix; a segment's schemas are its scalable topic's)."""
    name = topic if isinstance(topic, TopicName) else TopicName.parse(topic)
    if name.is_segment:
        name = name.scalable_topic
    return f"{name.tenant}/{name.namespace}/{name.partitioned_topic.local_name}"


class SchemaRegistry(abc.ABC):
    """Versioned schemas per schema id (`schema_id`)."""

    @abc.abstractmethod
    def versions(self, schema_id: str) -> list[StoredSchema]:
        """Every stored version, tombstones included, oldest first."""

    def live(self, schema_id: str) -> list[StoredSchema]:
        """The versions after the latest delete, oldest first (empty after a delete)."""
        versions = self.versions(schema_id)
        for i in range(len(versions) - 1, -1, -1):
            if versions[i].deleted:
                return versions[i + 1:]
        return versions

    def latest(self, schema_id: str) -> StoredSchema | None:
        """The newest version that is not deleted (None: no schema)."""
        live = self.live(schema_id)
        return live[-1] if live else None

    def get(self, schema_id: str, version: int) -> StoredSchema | None:
        """Version `version` if it is live (a deleted or unknown version is None)."""
        return next((s for s in self.live(schema_id) if s.version == version), None)

    @abc.abstractmethod
    async def put_if_absent(self, schema_id: str, schema: SchemaData, strategy: CompatibilityStrategy, *,
                            check: Callable[[], None] | None = None) -> int:
        """The version of `schema`: an identical live one's, else a new one if compatible
        (IncompatibleSchemaError / InvalidSchemaDataError otherwise). `check` is called once the
        schema id's lock is taken, before anything is looked up or stored: it raises to refuse
        (the topic closed while this waited, its deletion having taken the schemas away)."""

    @abc.abstractmethod
    async def delete(self, schema_id: str, *, force: bool = False) -> int | None:
        """Delete the schema: the tombstone's version, or None (forced, or nothing to delete)."""

    @abc.abstractmethod
    def find_version(self, schema_id: str, schema: SchemaData) -> int | None:
        """The oldest live version that is the same schema as `schema` (as `put_if_absent`
        judges it: the same Avro schema for the Avro-defined types, else the same bytes), if any."""

    @abc.abstractmethod
    def check_compatible(self, schema_id: str, schema: SchemaData, strategy: CompatibilityStrategy) -> None:
        """Raise IncompatibleSchemaError unless `schema` could be stored under `strategy`."""

    @abc.abstractmethod
    def check_consumer(self, schema_id: str, schema: SchemaData, strategy: CompatibilityStrategy) -> None:
        """Raise unless a consumer with `schema` can read the topic's data (NoSchemaError when
        the topic has none)."""


class NoSchemaError(IncompatibleSchemaError):
    """The topic has no schema to check a consumer's against (Pulsar's NotExistSchemaException)."""
