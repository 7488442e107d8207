"""A topic's side of the schema registry: what producers and consumers that declare a schema
(or none) may do, as Apache Pulsar's topics decide it (`AbstractTopic.addSchema`,
`addSchemaIfIdleOrCheckCompatible`, `ServerCnx.tryAddSchema`).

* A producer's schema is registered (or found) under the topic's compatibility strategy; with
  auto-update off it must already be one of the topic's schemas. A producer without a schema
  is refused on a topic with one only when schema validation is enforced.
* A consumer's schema registers the topic's first schema only while the topic is idle (no
  schema, no producers, no other consumers, no data); otherwise it must be able to read the
  topic's schema (BACKWARD). AUTO_CONSUME consumers take whatever the topic has.
* The strategy comes from the topic's policies, else the namespace's, else the broker's;
  auto-update from the namespace's, else the broker's. Validation is enforced when the
  broker enforces it or the topic does (its policy, else its namespace's).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pyengine.broker.policies import BrokerPolicies, NamespacePolicies
from pyengine.errors import IncompatibleSchemaError
from pyengine.naming import TopicName
from pyengine.schema import CompatibilityStrategy, NoSchemaError, SchemaData, SchemaRegistry, SchemaType, schema_id

if TYPE_CHECKING:
    from pyengine.broker.topic import Topic


class TopicSchemas:
    def __init__(self, registry: SchemaRegistry, policies: BrokerPolicies, *, strategy: str,
                 allow_auto_update: bool, validation_enforced: bool) -> None:
        self.registry = registry
        self.policies = policies
        self.default_strategy = CompatibilityStrategy.parse(strategy)
        self.default_allow_auto_update = allow_auto_update
        self.default_validation_enforced = validation_enforced

    # --- effective policies ---------------------------------------------------------------

    def _namespace_policies(self, topic: str) -> NamespacePolicies:
        """The topic's namespace's policies (all unset when the namespace is not stored)."""
        namespace = TopicName.parse(topic).namespace_name
        return self.policies.policies(namespace) if self.policies.namespace_exists(namespace) else NamespacePolicies()

    def strategy(self, topic: str) -> CompatibilityStrategy:
        """The topic's strategy, else its namespace's (unless UNDEFINED), else the broker's."""
        topic_value = self.policies.topic_policies(topic).get("schemaCompatibilityStrategy")
        if topic_value is not None:
            return CompatibilityStrategy.parse(topic_value)
        value = self._namespace_policies(topic).schema_compatibility_strategy
        if value is not None:
            strategy = CompatibilityStrategy.parse(value)
            if strategy != CompatibilityStrategy.UNDEFINED:
                return strategy
        return self.default_strategy

    def allow_auto_update(self, topic: str) -> bool:
        value = self._namespace_policies(topic).is_allow_auto_update_schema
        return self.default_allow_auto_update if value is None else value

    def validation_enforced(self, topic: str) -> bool:
        """As Apache's ServerCnx: the broker's setting OR the topic's (its topic policy if it
        has one, else its namespace's), so a topic or namespace can turn the check on but not
        off where the broker enforces it."""
        if self.default_validation_enforced:
            return True
        topic_value = self.policies.topic_policies(topic).get("schemaValidationEnforced")
        if topic_value is not None:
            return bool(topic_value)
        return bool(self._namespace_policies(topic).schema_validation_enforced)

    # --- producers and consumers ----------------------------------------------------------

    async def add(self, topic: str | Topic, schema: SchemaData) -> int:
        """Register `schema` for `topic` (or find it): its version. A loaded topic (what a
        producer or consumer attaches to) must still be open once the schema's lock is taken
        (TopicFencedError, which clients retry): a deletion written meanwhile took its schemas
        away, and the schema stored after it would outlive the topic."""
        name, check = (topic, None) if isinstance(topic, str) else (topic.name, topic._check_open)
        sid = schema_id(name)
        if self.allow_auto_update(name):
            return await self.registry.put_if_absent(sid, schema, self.strategy(name), check=check)
        version = self.registry.find_version(sid, schema)
        if version is None:
            raise IncompatibleSchemaError("Schema not found and schema auto updating is disabled.")
        return version

    async def for_producer(self, topic: str | Topic, schema: SchemaData | None) -> int | None:
        """The schema version a producer of `schema` (None: bytes) gets on `topic` (a name, or
        the loaded topic it attaches to: see `add`), or IncompatibleSchemaError."""
        if schema is not None and schema.type != SchemaType.NONE:
            return await self.add(topic, schema)
        name = topic if isinstance(topic, str) else topic.name
        if self.validation_enforced(name) and self.registry.latest(schema_id(name)) is not None:
            raise IncompatibleSchemaError("Producers cannot connect or send message without a schema to topics "
                                          "with a schema")
        return None

    async def for_consumer(self, topic: Topic, schema: SchemaData) -> None:
        """Let a consumer with `schema` (not AUTO_CONSUME) subscribe to `topic`, or raise."""
        sid = schema_id(topic.name)
        busy = (self.registry.latest(sid) is not None or bool(topic.producers) or topic.ledger.total_size != 0
                or any(not consumer.auto_consume_schema for consumer in topic.consumers()))
        if not busy:
            await self.add(topic, schema)
            return
        try:
            self.registry.check_consumer(sid, schema, self.strategy(topic.name))
        except NoSchemaError:
            raise IncompatibleSchemaError(f"Failed to add schema to an active topic with empty(BYTES) schema: new "
                                          f"schema type {schema.type.name}") from None
