"""Command text that is not UTF-8.

protobuf's upb parser checks UTF-8 only in proto3 `string` fields: a proto2 one (all of
PulsarApi.proto) whose bytes are not UTF-8 reaches the broker as `bytes`, not `str`. Apache
Pulsar's broker decodes such bytes with replacement characters, so two different malformed
names became one name there; here the command is refused, in its own answer, before any
handler sees a name that is not text (they failed with TypeError/AttributeError, answered as
UnknownError, or stored it). Clients send UTF-8 text (the Java client has no other kind); a Go
string may hold any bytes, as may a hand-made frame.
"""

from __future__ import annotations

from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message

# Per message type: its string fields (name, repeated) and its message fields holding some.
_Plan = tuple[tuple[tuple[str, bool], ...], tuple[tuple[str, bool, Descriptor], ...]]
_PLANS: dict[str, _Plan] = {}


def _plan(descriptor: Descriptor, visiting: frozenset[str] = frozenset()) -> _Plan:
    plan = _PLANS.get(descriptor.full_name)
    if plan is not None:
        return plan
    texts: list[tuple[str, bool]] = []
    messages: list[tuple[str, bool, Descriptor]] = []
    for field in descriptor.fields:
        repeated = field.is_repeated
        if field.type == FieldDescriptor.TYPE_STRING:
            texts.append((field.name, repeated))
        elif field.type == FieldDescriptor.TYPE_MESSAGE and field.message_type.full_name not in visiting:
            inner = _plan(field.message_type, visiting | {descriptor.full_name})
            if inner[0] or inner[1]:
                messages.append((field.name, repeated, field.message_type))
    plan = (tuple(texts), tuple(messages))
    _PLANS[descriptor.full_name] = plan
    return plan


def has_text(descriptor: Descriptor) -> bool:
    """Whether messages of this type hold any string field, nested ones included."""
    texts, messages = _plan(descriptor)
    return bool(texts or messages)


def undecodable_text(message: Message) -> str | None:
    """The path of the first string field of `message` (nested ones included) whose bytes are
    not UTF-8, e.g. "subscription" or "metadata[1].value"; None when all are text."""
    texts, messages = _plan(message.DESCRIPTOR)
    for name, repeated in texts:
        value = getattr(message, name)
        if repeated:
            for index, item in enumerate(value):
                if type(item) is bytes:
                    return f"{name}[{index}]"
        elif type(value) is bytes:
            return name
    for name, repeated, _descriptor in messages:
        if repeated:
            for index, item in enumerate(getattr(message, name)):
                inner = undecodable_text(item)
                if inner is not None:
                    return f"{name}[{index}].{inner}"
        elif message.HasField(name):
            inner = undecodable_text(getattr(message, name))
            if inner is not None:
                return f"{name}.{inner}"
    return None
