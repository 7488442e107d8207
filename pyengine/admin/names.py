"""Names in admin paths: tenants, namespaces, topics and subscriptions, checked as Pulsar
checks them (an invalid name is 412 Precondition Failed) and held to the lengths the storage
takes: every name ends up in an LMDB key, and LMDB keys are at most 511 bytes.
"""

from __future__ import annotations

from pyengine.admin.errors import PRECONDITION_FAILED, AdminError
from pyengine.admin.validation import INVALID_STATUS
from pyengine.broker.policies import check_name
from pyengine.naming import TopicName

# Byte limits of each part. The longest key they make, a topic's policies
# ("/admin/topic-policies/persistent://tenant/namespace/topic", 437 bytes at most), stays
# within LMDB's 511 bytes.
MAX_NAME_BYTES = 100                 # a tenant, or a namespace without its tenant
MAX_LOCAL_NAME_BYTES = 200           # a topic without its domain, tenant and namespace
MAX_SUBSCRIPTION_BYTES = 400

# What the OpenAPI document says of them (in characters: a longer UTF-8 spelling is refused
# too). A name that breaks them is 412, as any invalid name.
_INVALID = {INVALID_STATUS: PRECONDITION_FAILED}
# Pulsar's tenant and namespace names: `[-=:.\w]+` with Java's (ASCII) \w.
NAME_SCHEMA = {"type": "string", "minLength": 1, "maxLength": MAX_NAME_BYTES, "pattern": r"^[-=:.A-Za-z0-9_]+$",
               **_INVALID}
TOPIC_SCHEMA = {"type": "string", "minLength": 1, "maxLength": MAX_LOCAL_NAME_BYTES, **_INVALID}
SUBSCRIPTION_SCHEMA = {"type": "string", "minLength": 1, "maxLength": MAX_SUBSCRIPTION_BYTES, **_INVALID}


def tenant_name(tenant: str) -> str:
    _check_length("tenant", tenant, MAX_NAME_BYTES)
    return check_name("tenant", tenant)


def namespace_name(tenant: str, namespace: str) -> str:
    """`tenant/namespace`, both parts checked."""
    _check_length("namespace", namespace, MAX_NAME_BYTES)
    return f"{tenant_name(tenant)}/{check_name('namespace', namespace)}"


def topic_name(tenant: str, namespace: str, local_name: str, domain: str = "persistent") -> TopicName:
    _check_length("topic", local_name, MAX_LOCAL_NAME_BYTES)
    return TopicName.parse(f"{domain}://{namespace_name(tenant, namespace)}/{local_name}")


def subscription_name(name: str) -> str:
    _check_length("subscription", name, MAX_SUBSCRIPTION_BYTES)
    if not name.strip() or any(ch in name for ch in "\n\r\0"):
        raise AdminError(PRECONDITION_FAILED, f"invalid subscription name {name!r}")
    return name


def _check_length(kind: str, name: str, limit: int) -> None:
    try:
        size = len(name.encode("utf-8"))
    except UnicodeEncodeError:          # a lone surrogate from a bad percent-escape
        raise AdminError(PRECONDITION_FAILED, f"{kind} name is not valid UTF-8") from None
    if size > limit:
        raise AdminError(PRECONDITION_FAILED, f"{kind} name longer than {limit} bytes")
