"""`pyengine admin ...`: a client of the broker's admin REST API, with the command names of
`pulsar-admin` where it has them.

    pyengine admin --url http://127.0.0.1:8080 tenants list
    pyengine admin namespaces create public/x
    pyengine admin topics create-partitioned-topic persistent://public/default/t -p 4
    pyengine admin topics stats persistent://public/default/t-partition-0
    pyengine admin topics create-subscription persistent://public/default/t-partition-0 -s my-sub
    pyengine admin topics skip persistent://public/default/t-partition-0 -s my-sub -n 10
    pyengine admin topics peek-messages persistent://public/default/t-partition-0 -s my-sub -n 5
    pyengine admin topics compact persistent://public/default/t
    pyengine admin topics compaction-status persistent://public/default/t-partition-0 -w
    pyengine admin transactions coordinator-stats
    pyengine admin transactions get-metadata 0 12
    pyengine admin transactions abort 0 12
    pyengine admin transactions position-stats-in-pending-ack t-partition-0 -s my-sub -l 3 -e 12
    pyengine admin transactions get-transaction-key my-task
    pyengine admin scalable create topic://public/default/orders -n 4
    pyengine admin scalable split-segment topic://public/default/orders 0
    pyengine admin segments terminate segment://public/default/orders/0000-3fff-0

A reply with a body is printed as JSON (messages as objects: id, times, key, properties, and the
payload as text, or payloadBase64 when it is not UTF-8); a failure prints the server's reason to stderr and
exits with 1.
"""

from __future__ import annotations

import argparse
import base64
import datetime
import http.client
import json
import os
import re
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from typing import Any

from core_ext.batch import split_batch
from pyengine.errors import InvalidTopicNameError
from pyengine.naming import TopicName
from pyengine.protocol.pulsar_api_pb2 import SingleMessageMetadata

DEFAULT_URL = "http://127.0.0.1:8080"
TIMEOUT_S = 60.0
_LATEST = 2**63 - 1

Request = tuple[str, str, Any]                  # method, path with query, JSON body (None: none)
Builder = Callable[[argparse.Namespace], Request]


class AdminCallError(Exception):
    """The call failed: the server's reason, or why the server could not be reached."""


# --- arguments ------------------------------------------------------------------------------

def _quote(text: str) -> str:
    return urllib.parse.quote(text, safe="")


def topic_path(topic: str) -> str:
    """`tenant/namespace/topic` (the topic's local name URL-encoded) of a persistent topic."""
    try:
        name = TopicName.parse(topic)
    except InvalidTopicNameError as exc:
        raise AdminCallError(str(exc)) from None
    if name.domain != "persistent":
        raise AdminCallError(f"only persistent:// topics have admin resources, not {topic}")
    return f"{_quote(name.tenant)}/{_quote(name.namespace)}/{_quote(name.local_name)}"


def scalable_path(topic: str) -> str:
    """`tenant/namespace/topic` of a scalable topic (`topic://tenant/ns/topic` or `tenant/ns/topic`)."""
    try:
        name = TopicName.parse(topic if "://" in topic else f"topic://{topic}")
    except InvalidTopicNameError as exc:
        raise AdminCallError(str(exc)) from None
    if not name.is_scalable:
        raise AdminCallError(f"a scalable topic is topic://tenant/namespace/topic, not {topic}")
    return f"{_quote(name.tenant)}/{_quote(name.namespace)}/{_quote(name.local_name)}"


def segment_path(segment: str) -> str:
    """`tenant/namespace/topic/descriptor` of `segment://tenant/ns/topic/{hexStart}-{hexEnd}-{id}`."""
    try:
        name = TopicName.parse(segment)
    except InvalidTopicNameError as exc:
        raise AdminCallError(str(exc)) from None
    if not name.is_segment:
        raise AdminCallError(f"a segment is segment://tenant/namespace/topic/{{hexStart}}-{{hexEnd}}-{{id}}, "
                             f"not {segment}")
    return f"{scalable_path(str(name.scalable_topic))}/{name.segment_descriptor}"


def properties(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected key=value, not {text!r}")
    return key, value


def property_list(text: str) -> list[tuple[str, str]]:
    """pulsar-admin's `-m a=1,b=2`: comma-separated key=value pairs."""
    return [properties(pair) for pair in text.split(",")]


def namespace_path(namespace: str) -> str:
    parts = namespace.split("/")
    if len(parts) != 2 or not all(parts):
        raise AdminCallError(f"a namespace is tenant/namespace, not {namespace!r}")
    return "/".join(_quote(part) for part in parts)


def message_id(text: str) -> dict[str, Any]:
    """`earliest`, `latest` or `ledgerId:entryId` as Pulsar's MessageIdImpl JSON."""
    if text == "earliest":
        return {"ledgerId": -1, "entryId": -1}
    if text == "latest":
        return {"ledgerId": _LATEST, "entryId": _LATEST}
    match = re.fullmatch(r"(-?\d+):(-?\d+)", text)
    if match is None:
        raise argparse.ArgumentTypeError(f"expected earliest, latest or ledgerId:entryId, not {text!r}")
    return {"ledgerId": int(match[1]), "entryId": int(match[2])}


_DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def duration_ms(text: str) -> int:
    """pulsar-admin's relative times: `100m`, `3h`, `2d`, `5w`, `30s` (a bare number: minutes)."""
    match = re.fullmatch(r"(\d{1,12})([smhdw]?)", text)
    if match is None:
        raise argparse.ArgumentTypeError(f"expected a duration like 30s, 10m, 3h, 2d or 1w, not {text!r}")
    return int(match[1]) * _DURATION_UNITS[match[2] or "m"] * 1000


_DELAY_UNITS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000, "w": 7 * 86_400_000}


def delay_ms(text: str) -> int:
    """pulsar-admin's --time / --maxDelay of set-delayed-delivery: `1s`, `500ms`, `10m`, `2d`
    (a bare number: seconds), in milliseconds."""
    match = re.fullmatch(r"(\d{1,12})(ms|[smhdw]?)", text)
    if match is None:
        raise argparse.ArgumentTypeError(f"expected a duration like 500ms, 1s, 10m, 3h, 2d or 1w, not {text!r}")
    return int(match[1]) * _DELAY_UNITS[match[2] or "s"]


def ttl_seconds(text: str) -> int:
    """pulsar-admin's message TTL and expire times: seconds, or `30s`, `10m`, `3h`, `2d`, `1w`."""
    match = re.fullmatch(r"(\d{1,10})([smhdw]?)", text)
    if match is None:
        raise argparse.ArgumentTypeError(f"expected seconds or a duration like 30s, 10m, 3h, 2d or 1w, not {text!r}")
    seconds = int(match[1]) * _DURATION_UNITS[match[2] or "s"]
    if seconds > 2**31 - 1:
        raise argparse.ArgumentTypeError(f"{text!r} is more than {2**31 - 1} seconds")
    return seconds


_SIZE_UNITS = {"": 1, "k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4}


def retention_minutes(text: str) -> int:
    """pulsar-admin's set-retention --time: seconds, or `100m`, `3h`, `2d`, `5w` (-1: no
    limit), stored in minutes as pulsar-admin converts it (`-t 120`: 2 minutes)."""
    if text == "-1":
        return -1
    match = re.fullmatch(r"(\d{1,12})([smhdw]?)", text)
    if match is None:
        raise argparse.ArgumentTypeError(f"expected seconds, a time like 100m, 3h, 2d or 5w, or -1, not {text!r}")
    minutes = int(match[1]) * _DURATION_UNITS[match[2] or "s"] // 60
    if minutes > 2**31 - 1:
        raise argparse.ArgumentTypeError(f"{text!r} is more than {2**31 - 1} minutes")
    return minutes


def retention_mb(text: str) -> int:
    """pulsar-admin's set-retention --size: bytes, or `4096`, `10M`, `16G`, `3T` (k/K, m/M,
    g/G, t/T; -1: no limit), stored in MB as pulsar-admin converts it (under 1 MB: 0)."""
    if text == "-1":
        return -1
    match = re.fullmatch(r"(\d{1,19})([kKmMgGtT]?)", text)
    if match is None:
        raise argparse.ArgumentTypeError(f"expected bytes, a size like 10M, 16G or 3T, or -1, not {text!r}")
    megabytes = int(match[1]) * _SIZE_UNITS[match[2].lower()] // 1024**2
    if megabytes > 2**63 - 1:
        raise argparse.ArgumentTypeError(f"{text!r} is too large")
    return megabytes


def admin_url(text: str) -> str:
    """`--url` (or $PYENGINE_ADMIN_URL): http(s)://HOST[:PORT][/prefix], checked before any call."""
    try:
        parts = urllib.parse.urlsplit(text)
        parts.port                      # raises ValueError for a port that is not one
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{text!r} is not a valid URL: {exc}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise argparse.ArgumentTypeError(f"{text!r} is not an http://HOST:PORT (or https://) URL")
    return text


def _query(**values: Any) -> str:
    given = {k: str(v).lower() if isinstance(v, bool) else v for k, v in values.items() if v is not None}
    return "?" + urllib.parse.urlencode(given) if given else ""


# --- commands -------------------------------------------------------------------------------
# Each command: (group, name, aliases, help, arguments, request builder).

V2 = "/admin/v2"
TXN = "/admin/v3/transactions"


def _topic(a: argparse.Namespace) -> str:
    return f"{V2}/persistent/{topic_path(a.topic)}"


def _sub(a: argparse.Namespace) -> str:
    return f"{_topic(a)}/subscription/{_quote(a.subscription)}"


TOPIC = (("topic",), {"help": "topic name, e.g. persistent://public/default/t"})
NAMESPACE = (("namespace",), {"help": "tenant/namespace"})
SUBSCRIPTION = (("-s", "--subscription"), {"required": True, "help": "subscription name"})
SUBSCRIPTION_PROPERTY = (("-p", "--property"), {"type": properties, "action": "append", "default": [],
                                                "help": "a subscription property, key=value (repeatable)"})
FORCE = (("-f", "--force"), {"action": "store_true", "help": "also when clients are connected"})
FORCE_DELETE = (("-f", "--force"), {"action": "store_true",
                                    "help": "delete what it holds too (if the broker allows forced deletion)"})
PARTITIONS = (("-p", "--partitions"), {"type": int, "required": True, "help": "number of partitions"})
TOPIC_METADATA = (("-m", "--metadata"), {"type": property_list, "action": "extend", "default": [],
                                         "help": "topic properties key=value[,key=value...] (repeatable)"})
TOPIC_PROPERTY = (("-p", "--property"), {"type": properties, "action": "append", "default": [],
                                         "help": "a topic property key=value (repeatable)"})
PROPERTY_KEY = (("-k", "--key"), {"required": True, "help": "the property to remove"})
MOST = (("most_bits",), {"type": int, "help": "txn id most significant bits (coordinator id)"})
LEAST = (("least_bits",), {"type": int, "help": "txn id least significant bits"})
COORDINATOR = (("-c", "--coordinator-id"), {"type": int, "help": "only this coordinator"})
METADATA = (("-m", "--metadata"), {"action": "store_true",
                                   "help": "Pulsar's flag: add the ledgers' metadata (these logs have none)"})
ENABLE = (("--enable",), {"action": "store_true", "help": "enable (default: disable)"})
RETENTION_TIME = (("-t", "--time"), {"type": retention_minutes, "required": True,
                                      "help": "how long to keep consumed messages: seconds, or 100m, 3h, 2d, 5w "
                                              "(as pulsar-admin; kept in whole minutes; -1: no limit; 0 with "
                                              "--size 0: none)"})
RETENTION_SIZE = (("-s", "--size"), {"type": retention_mb, "required": True,
                                     "help": "how much consumed data to keep: bytes, or 10M, 16G, 3T (as "
                                             "pulsar-admin; kept in whole MB; -1: no limit)"})


NAMESPACE_TTL = (("-ttl", "--messageTTL", "--message-ttl"), {"type": ttl_seconds, "required": True, "dest": "ttl",
                                                            "help": "seconds, or 30s, 10m, 3h, 2d "
                                                                    "(0: messages do not expire)"})
TOPIC_TTL = (("-t", "--ttl"), {"type": ttl_seconds, "required": True,
                               "help": "seconds, or 30s, 10m, 3h, 2d (0: messages do not expire)"})
APPLIED = (("--applied",), {"action": "store_true", "help": "the policy in force"})


def _expire(a: argparse.Namespace) -> Request:
    if (a.expire_time is None) == (a.messageId is None):
        raise AdminCallError("expire-messages takes either --expireTime or --messageId")
    if a.expire_time is not None:
        return "POST", f"{_sub(a)}/expireMessages/{a.expire_time}", None
    return "POST", f"{_sub(a)}/expireMessages", {**a.messageId, "isExcluded": a.exclude}


def _tenant_info(a: argparse.Namespace) -> dict[str, Any]:
    """The TenantInfo of `tenants create`: without -c, as pulsar-admin, every cluster the broker
    lists (the REST API requires allowedClusters)."""
    clusters = a.allowed_clusters.split(",") if a.allowed_clusters else call(a.url, "GET", f"{V2}/clusters")
    return {"adminRoles": [role for role in a.admin_roles.split(",") if role], "allowedClusters": clusters}


def _retention(a: argparse.Namespace) -> dict[str, int]:
    return {"retentionTimeInMinutes": a.time, "retentionSizeInMB": a.size}


DELAYED_ENABLE = (("-e", "--enable"), {"action": "store_true",
                                       "help": "hold back delayed messages (default: deliver them at once)"})
TICK_TIME = (("-t", "--time"), {"type": delay_ms, "default": 1000,
                                "help": "tick of the timer releasing delayed messages, e.g. 1s, 500ms (default 1s)"})
MAX_DELAY = (("-md", "--maxDelay", "--max-delay"), {"type": delay_ms, "default": 0, "dest": "max_delay",
                                                    "help": "longest delay a producer may ask for, e.g. 7d "
                                                            "(default 0: no limit)"})


def _delayed_delivery(a: argparse.Namespace) -> dict[str, Any]:
    return {"active": a.enable, "tickTime": a.time, "maxDeliveryDelayInMillis": a.max_delay}


INACTIVE_ENABLE = (("-e", "--enable-delete-while-inactive"), {"action": "store_true", "dest": "delete_enable",
                                                              "help": "delete the topics once inactive"})
INACTIVE_DISABLE = (("-d", "--disable-delete-while-inactive"), {"action": "store_true", "dest": "delete_disable",
                                                                "help": "never delete them for being inactive"})
INACTIVE_DURATION = (("-t", "--max-inactive-duration"), {"type": ttl_seconds, "required": True, "dest": "max_inactive",
                                                         "help": "how long a topic must be inactive: seconds, or "
                                                                 "30s, 10m, 3h, 2d"})
INACTIVE_MODE = (("-m", "--delete-mode"), {"required": True, "dest": "delete_mode",
                                           "choices": ("delete_when_no_subscriptions",
                                                       "delete_when_subscriptions_caught_up"),
                                           "help": "inactive: no subscription, or none with a backlog"})
INACTIVE_OPTIONS = (INACTIVE_ENABLE, INACTIVE_DISABLE, INACTIVE_DURATION, INACTIVE_MODE)


def _inactive_topic_policies(a: argparse.Namespace) -> dict[str, Any]:
    if a.delete_enable == a.delete_disable:
        raise AdminCallError("set-inactive-topic-policies takes either --enable-delete-while-inactive (-e) or "
                             "--disable-delete-while-inactive (-d)")
    return {"inactiveTopicDeleteMode": a.delete_mode, "maxInactiveDurationSeconds": a.max_inactive,
            "deleteWhileInactive": a.delete_enable}


AUTO_CREATION_ENABLE = (("-e", "--enable"), {"action": "store_true",
                                              "help": "create topics on first use (default: refuse them)"})
AUTO_SUBSCRIPTION_ENABLE = (("-e", "--enable"), {"action": "store_true",
                                                  "help": "consumers create subscriptions (default: refused)"})
AUTO_CREATION_TYPE = (("-t", "--type"), {"choices": ("non-partitioned", "partitioned"), "default": "non-partitioned",
                                         "help": "what a topic is created as (default: non-partitioned)"})
AUTO_CREATION_PARTITIONS = (("-n", "--num-partitions"), {"type": int, "dest": "num_partitions",
                                                         "help": "the partitions of a partitioned topic"})


def _auto_topic_creation(a: argparse.Namespace) -> dict[str, Any]:
    override: dict[str, Any] = {"allowAutoTopicCreation": a.enable}
    if a.enable:
        override["topicType"] = a.type
        if a.num_partitions is not None:
            override["defaultNumPartitions"] = a.num_partitions
    return override


SCHEMA_FILE = (("-f", "--filename"), {"required": True,
                                      "help": 'JSON file: {"type": "AVRO", "schema": "...", "properties": {}}'})
STRATEGIES = ("ALWAYS_INCOMPATIBLE", "ALWAYS_COMPATIBLE", "BACKWARD", "FORWARD", "FULL", "BACKWARD_TRANSITIVE",
              "FORWARD_TRANSITIVE", "FULL_TRANSITIVE", "UNDEFINED")


def _schemas(a: argparse.Namespace) -> str:
    return f"{V2}/schemas/{topic_path(a.topic)}"


def _schema_file(a: argparse.Namespace) -> Any:
    """The schema payload in --filename (pulsar-admin's `schemas upload -f`)."""
    try:
        with open(a.filename, encoding="utf-8") as file:
            return json.load(file)
    except OSError as exc:
        raise AdminCallError(f"cannot read {a.filename}: {exc.strerror}") from None
    except ValueError as exc:
        raise AdminCallError(f"{a.filename} is not JSON: {exc}") from None
SCALABLE = (("topic",), {"help": "scalable topic, e.g. topic://public/default/t"})
SEGMENT = (("segment",), {"help": "segment topic, e.g. segment://public/default/t/0000-7fff-1"})
SEGMENT_ID = (("segment_id",), {"type": int, "help": "segment id"})
TXN_KEY = (("transaction_key",), {"help": "the transaction key"})
OWNER = (("--owner",), {"help": "the key's owner (default: anonymous)"})
TXN_KEYS = V2 + "/transactions/transaction-keys"
SCALABLE_V2 = V2 + "/scalable"
SEGMENTS_V2 = V2 + "/segments"

def publish_time_ms(text: str) -> int:
    """A time as pulsar-admin's get-message-id takes it (ISO 8601; ours also takes ms since
    the epoch), in ms since the epoch."""
    if text.isdigit():
        return int(text)
    try:
        moment = datetime.datetime.fromisoformat(text.replace("Z", "+00:00") if text.endswith("Z") else text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an ISO 8601 time nor ms since the epoch: {text!r}") from None
    ms = round(moment.astimezone().timestamp() * 1000)        # without an offset: local time, as Pulsar
    if ms < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is before the epoch")
    return ms


COMMANDS: list[tuple[str, str, tuple[str, ...], str, tuple, Builder]] = [
    ("brokers", "healthcheck", (), "run a health check: a message sent on the broker's heartbeat topic comes back "
     "(ok)", (), lambda a: ("GET", f"{V2}/brokers/health", None)),
    ("brokers", "ready", (), "whether the broker has started and serves (ok)", (),
     lambda a: ("GET", f"{V2}/brokers/ready", None)),
    ("brokers", "list", (), "list the active brokers of a cluster", ((("cluster",), {"help": "cluster name"}),),
     lambda a: ("GET", f"{V2}/brokers/{urllib.parse.quote(a.cluster, safe='')}", None)),
    ("brokers", "version", (), "show the broker's version", (), lambda a: ("GET", f"{V2}/brokers/version", None)),
    ("tenants", "list", (), "list the tenants", (), lambda a: ("GET", f"{V2}/tenants", None)),
    ("tenants", "get", (), "show a tenant", ((("tenant",), {}),),
     lambda a: ("GET", f"{V2}/tenants/{_quote(a.tenant)}", None)),
    ("tenants", "create", (), "create a tenant",
     ((("tenant",), {}), (("-r", "--admin-roles"), {"default": "", "help": "comma-separated roles"}),
      (("-c", "--allowed-clusters"), {"help": "comma-separated clusters (default: every cluster of the broker)"})),
     lambda a: ("PUT", f"{V2}/tenants/{_quote(a.tenant)}", _tenant_info(a))),
    ("tenants", "delete", (), "delete a tenant", ((("tenant",), {}), FORCE_DELETE),
     lambda a: ("DELETE", f"{V2}/tenants/{_quote(a.tenant)}" + _query(force=a.force or None), None)),

    ("namespaces", "list", (), "list the namespaces of a tenant", ((("tenant",), {}),),
     lambda a: ("GET", f"{V2}/namespaces/{_quote(a.tenant)}", None)),
    ("namespaces", "create", (), "create a namespace", (NAMESPACE,),
     lambda a: ("PUT", f"{V2}/namespaces/{namespace_path(a.namespace)}", None)),
    ("namespaces", "delete", (), "delete an empty namespace", (NAMESPACE, FORCE_DELETE),
     lambda a: ("DELETE", f"{V2}/namespaces/{namespace_path(a.namespace)}" + _query(force=a.force or None), None)),
    ("namespaces", "policies", (), "show a namespace's policies", (NAMESPACE,),
     lambda a: ("GET", f"{V2}/namespaces/{namespace_path(a.namespace)}", None)),
    ("namespaces", "topics", (), "list every topic of a namespace", (NAMESPACE,),
     lambda a: ("GET", f"{V2}/namespaces/{namespace_path(a.namespace)}/topics", None)),
    ("namespaces", "unload", (), "unload every loaded topic of a namespace (clients reconnect)", (NAMESPACE,),
     lambda a: ("PUT", f"{V2}/namespaces/{namespace_path(a.namespace)}/unload", None)),
    ("namespaces", "get-deduplication", (), "show the namespace's de-duplication policy", (NAMESPACE,),
     lambda a: ("GET", f"{V2}/namespaces/{namespace_path(a.namespace)}/deduplication", None)),
    ("namespaces", "set-deduplication", (), "enable (--enable) or disable de-duplication", (NAMESPACE, ENABLE),
     lambda a: ("POST", f"{V2}/namespaces/{namespace_path(a.namespace)}/deduplication", a.enable)),
    ("namespaces", "remove-deduplication", (), "remove the namespace's de-duplication policy", (NAMESPACE,),
     lambda a: ("DELETE", f"{V2}/namespaces/{namespace_path(a.namespace)}/deduplication", None)),
    ("namespaces", "get-schema-compatibility-strategy", (), "show the namespace's schema compatibility strategy",
     (NAMESPACE,), lambda a: ("GET", f"{V2}/namespaces/{namespace_path(a.namespace)}/schemaCompatibilityStrategy",
                              None)),
    ("namespaces", "set-schema-compatibility-strategy", (), "set how new schemas are checked",
     (NAMESPACE, (("-c", "--compatibility"), {"required": True, "choices": STRATEGIES})),
     lambda a: ("PUT", f"{V2}/namespaces/{namespace_path(a.namespace)}/schemaCompatibilityStrategy",
                a.compatibility)),
    ("namespaces", "set-is-allow-auto-update-schema", (), "let producers and consumers register schemas (--enable)",
     (NAMESPACE, ENABLE),
     lambda a: ("POST", f"{V2}/namespaces/{namespace_path(a.namespace)}/isAllowAutoUpdateSchema", a.enable)),
    ("namespaces", "set-schema-validation-enforce", (), "refuse producers without a schema (--enable)",
     (NAMESPACE, ENABLE),
     lambda a: ("POST", f"{V2}/namespaces/{namespace_path(a.namespace)}/schemaValidationEnforced", a.enable)),
    ("namespaces", "get-delayed-delivery", (), "show the namespace's delayed delivery policy", (NAMESPACE,),
     lambda a: ("GET", f"{V2}/namespaces/{namespace_path(a.namespace)}/delayedDelivery", None)),
    ("namespaces", "set-delayed-delivery", (), "enable (--enable) or disable delayed delivery, its --time tick "
     "and --maxDelay", (NAMESPACE, DELAYED_ENABLE, TICK_TIME, MAX_DELAY),
     lambda a: ("POST", f"{V2}/namespaces/{namespace_path(a.namespace)}/delayedDelivery", _delayed_delivery(a))),
    ("namespaces", "remove-delayed-delivery", (), "remove the namespace's delayed delivery policy", (NAMESPACE,),
     lambda a: ("DELETE", f"{V2}/namespaces/{namespace_path(a.namespace)}/delayedDelivery", None)),
    ("namespaces", "get-inactive-topic-policies", (), "show the namespace's inactive topic policies", (NAMESPACE,),
     lambda a: ("GET", f"{V2}/namespaces/{namespace_path(a.namespace)}/inactiveTopicPolicies", None)),
    ("namespaces", "set-inactive-topic-policies", (), "delete the namespace's topics once inactive (-e) or not (-d), "
     "after how long (-t), and what inactive means (-m)", (NAMESPACE, *INACTIVE_OPTIONS),
     lambda a: ("POST", f"{V2}/namespaces/{namespace_path(a.namespace)}/inactiveTopicPolicies",
                _inactive_topic_policies(a))),
    ("namespaces", "remove-inactive-topic-policies", (), "remove the namespace's inactive topic policies",
     (NAMESPACE,), lambda a: ("DELETE", f"{V2}/namespaces/{namespace_path(a.namespace)}/inactiveTopicPolicies", None)),
    ("namespaces", "get-auto-topic-creation", (), "show the namespace's override of the broker's auto topic creation",
     (NAMESPACE,), lambda a: ("GET", f"{V2}/namespaces/{namespace_path(a.namespace)}/autoTopicCreation", None)),
    ("namespaces", "set-auto-topic-creation", (), "create the namespace's topics on first use (-e) or not, as "
     "non-partitioned or partitioned topics (-t) of how many partitions (-n)",
     (NAMESPACE, AUTO_CREATION_ENABLE, AUTO_CREATION_TYPE, AUTO_CREATION_PARTITIONS),
     lambda a: ("POST", f"{V2}/namespaces/{namespace_path(a.namespace)}/autoTopicCreation", _auto_topic_creation(a))),
    ("namespaces", "remove-auto-topic-creation", (), "remove the namespace's override (the broker's setting applies)",
     (NAMESPACE,), lambda a: ("DELETE", f"{V2}/namespaces/{namespace_path(a.namespace)}/autoTopicCreation", None)),
    ("namespaces", "get-auto-subscription-creation", (),
     "show the namespace's override of the broker's auto subscription creation", (NAMESPACE,),
     lambda a: ("GET", f"{V2}/namespaces/{namespace_path(a.namespace)}/autoSubscriptionCreation", None)),
    ("namespaces", "set-auto-subscription-creation", (), "let consumers create the namespace's subscriptions (-e) "
     "or not", (NAMESPACE, AUTO_SUBSCRIPTION_ENABLE),
     lambda a: ("POST", f"{V2}/namespaces/{namespace_path(a.namespace)}/autoSubscriptionCreation",
                {"allowAutoSubscriptionCreation": a.enable})),
    ("namespaces", "remove-auto-subscription-creation", (), "remove the namespace's override (the broker's setting "
     "applies)", (NAMESPACE,),
     lambda a: ("DELETE", f"{V2}/namespaces/{namespace_path(a.namespace)}/autoSubscriptionCreation", None)),
    ("namespaces", "clear-backlog", (), "clear the backlog of every subscription (or of -s) on every topic of the "
     "namespace", (NAMESPACE, (("-s", "--sub"), {"dest": "subscription", "help": "only this subscription"}),
                   (("-force", "--force"), {"action": "store_true", "help": "accepted as pulsar-admin's (no prompt "
                                                                             "here)"})),
     lambda a: ("POST", f"{V2}/namespaces/{namespace_path(a.namespace)}/clearBacklog"
                + (f"/{urllib.parse.quote(a.subscription, safe='')}" if a.subscription is not None else ""), None)),
    ("namespaces", "unsubscribe", (), "delete a subscription from every topic of the namespace",
     (NAMESPACE, (("-s", "--sub"), {"dest": "subscription", "required": True, "help": "subscription name"})),
     lambda a: ("POST", f"{V2}/namespaces/{namespace_path(a.namespace)}/unsubscribe/"
                f"{urllib.parse.quote(a.subscription, safe='')}", None)),
    ("namespaces", "get-message-ttl", (), "show the namespace's message TTL (seconds)", (NAMESPACE,),
     lambda a: ("GET", f"{V2}/namespaces/{namespace_path(a.namespace)}/messageTTL", None)),
    ("namespaces", "set-message-ttl", (), "expire the namespace's messages -ttl seconds after they were published",
     (NAMESPACE, NAMESPACE_TTL),
     lambda a: ("POST", f"{V2}/namespaces/{namespace_path(a.namespace)}/messageTTL", a.ttl)),
    ("namespaces", "remove-message-ttl", (), "remove the namespace's message TTL (the broker's default applies)",
     (NAMESPACE,), lambda a: ("DELETE", f"{V2}/namespaces/{namespace_path(a.namespace)}/messageTTL", None)),
    ("namespaces", "get-retention", (), "show the namespace's retention policy", (NAMESPACE,),
     lambda a: ("GET", f"{V2}/namespaces/{namespace_path(a.namespace)}/retention", None)),
    ("namespaces", "set-retention", (), "keep consumed messages for -t TIME / up to -s SIZE",
     (NAMESPACE, RETENTION_TIME, RETENTION_SIZE),
     lambda a: ("POST", f"{V2}/namespaces/{namespace_path(a.namespace)}/retention", _retention(a))),
    ("namespaces", "remove-retention", (), "remove the namespace's retention policy", (NAMESPACE,),
     lambda a: ("DELETE", f"{V2}/namespaces/{namespace_path(a.namespace)}/retention", None)),

    ("topics", "list", (), "list the persistent topics of a namespace", (NAMESPACE,),
     lambda a: ("GET", f"{V2}/persistent/{namespace_path(a.namespace)}", None)),
    ("topics", "list-partitioned-topics", (), "list the partitioned topics of a namespace", (NAMESPACE,),
     lambda a: ("GET", f"{V2}/persistent/{namespace_path(a.namespace)}/partitioned", None)),
    ("topics", "create", (), "create a non-partitioned topic (with -m properties)", (TOPIC, TOPIC_METADATA),
     lambda a: ("PUT", _topic(a), dict(a.metadata) or None)),
    ("topics", "create-partitioned-topic", (), "create a partitioned topic (with -m properties)",
     (TOPIC, PARTITIONS, TOPIC_METADATA),
     lambda a: ("PUT", f"{_topic(a)}/partitions",
                {"partitions": a.partitions, "properties": dict(a.metadata)} if a.metadata else a.partitions)),
    ("topics", "update-partitioned-topic", (), "add partitions to a partitioned topic", (TOPIC, PARTITIONS),
     lambda a: ("POST", f"{_topic(a)}/partitions", a.partitions)),
    ("topics", "get-partitioned-topic-metadata", (), "show the number of partitions", (TOPIC,),
     lambda a: ("GET", f"{_topic(a)}/partitions", None)),
    ("topics", "get-properties", (), "show a topic's properties", (TOPIC,),
     lambda a: ("GET", f"{_topic(a)}/properties", None)),
    ("topics", "update-properties", (), "set topic properties (-p key=value ...), kept with the others",
     (TOPIC, TOPIC_PROPERTY), lambda a: ("PUT", f"{_topic(a)}/properties", dict(a.property))),
    ("topics", "remove-properties", (), "remove one topic property (-k key)", (TOPIC, PROPERTY_KEY),
     lambda a: ("DELETE", f"{_topic(a)}/properties" + _query(key=a.key), None)),
    ("topics", "delete", (), "delete a non-partitioned topic", (TOPIC, FORCE),
     lambda a: ("DELETE", _topic(a) + _query(force=a.force), None)),
    ("topics", "delete-partitioned-topic", (), "delete a partitioned topic", (TOPIC, FORCE),
     lambda a: ("DELETE", f"{_topic(a)}/partitions" + _query(force=a.force), None)),
    ("topics", "stats", (), "show a topic's stats", (TOPIC,), lambda a: ("GET", f"{_topic(a)}/stats", None)),
    ("topics", "partitioned-stats", (), "show a partitioned topic's stats", (TOPIC,),
     lambda a: ("GET", f"{_topic(a)}/partitioned-stats", None)),
    ("topics", "stats-internal", ("internal-stats",), "show a topic's ledgers and cursors", (TOPIC,),
     lambda a: ("GET", f"{_topic(a)}/internalStats", None)),
    ("topics", "partitioned-stats-internal", (), "show each partition's ledgers and cursors", (TOPIC,),
     lambda a: ("GET", f"{_topic(a)}/partitioned-internalStats", None)),
    ("topics", "last-message-id", (), "show the id of the last message readers can see", (TOPIC,),
     lambda a: ("GET", f"{_topic(a)}/lastMessageId", None)),
    ("topics", "subscriptions", (), "list a topic's subscriptions", (TOPIC,),
     lambda a: ("GET", f"{_topic(a)}/subscriptions", None)),
    ("topics", "create-subscription", (), "create a subscription",
     (TOPIC, SUBSCRIPTION, (("-m", "--messageId"), {"type": message_id, "default": "latest",
                                                     "help": "earliest, latest (default) or ledgerId:entryId"}),
      SUBSCRIPTION_PROPERTY),
     lambda a: ("PUT", _sub(a), {**a.messageId, **({"properties": dict(a.property)} if a.property else {})})),
    ("topics", "get-subscription-properties", (), "show a subscription's properties", (TOPIC, SUBSCRIPTION),
     lambda a: ("GET", f"{_sub(a)}/properties", None)),
    ("topics", "update-subscription-properties", (), "replace a subscription's properties (-p k=v ..., or --clear)",
     (TOPIC, SUBSCRIPTION, SUBSCRIPTION_PROPERTY,
      (("-c", "--clear"), {"action": "store_true", "help": "remove every property"})),
     lambda a: _update_subscription_properties(a)),
    ("topics", "unsubscribe", (), "delete a subscription", (TOPIC, SUBSCRIPTION, FORCE),
     lambda a: ("DELETE", _sub(a) + _query(force=a.force), None)),
    ("topics", "reset-cursor", (), "move a subscription to a time or a message id",
     (TOPIC, SUBSCRIPTION, (("-t", "--time"), {"type": duration_ms, "help": "this long ago: 30s, 10m, 3h, 2d"}),
      (("-m", "--messageId"), {"type": message_id, "help": "earliest, latest or ledgerId:entryId"})),
     lambda a: _reset_cursor(a)),
    ("topics", "get-message-id", (), "show the id of the first message published at or after a time",
     (TOPIC, (("-d", "--datetime"), {"type": publish_time_ms, "required": True, "dest": "datetime",
                                     "help": "ISO 8601 (2026-11-29T10:00:00Z; without an offset: local time) "
                                             "or ms since the epoch"})),
     lambda a: ("GET", f"{_topic(a)}/messageid/{a.datetime}", None)),
    ("topics", "clear-backlog", ("skip-all",), "skip every message on a subscription", (TOPIC, SUBSCRIPTION),
     lambda a: ("POST", f"{_sub(a)}/skip_all", None)),
    ("topics", "skip", (), "skip the next -n messages of a subscription (not on a partitioned topic)",
     (TOPIC, SUBSCRIPTION, (("-n", "--count"), {"type": int, "required": True,
                                                 "help": "number of messages to skip"})),
     lambda a: ("POST", f"{_sub(a)}/skip/{a.count}", None)),
    ("topics", "expire-messages", (), "expire a subscription's messages older than --expireTime, or up to "
     "--messageId (not past an open transaction's)",
     (TOPIC, SUBSCRIPTION, (("-t", "--expireTime", "--expire-time"), {"type": ttl_seconds, "dest": "expire_time",
                                                                       "help": "seconds, or 30s, 10m, 3h, 2d"}),
      (("-m", "--messageId"), {"type": message_id, "help": "ledgerId:entryId (not on a partitioned topic)"}),
      (("-e", "--exclude"), {"action": "store_true", "help": "with --messageId: not that message itself"})),
     lambda a: _expire(a)),
    ("topics", "expire-messages-all-subscriptions", (), "expire the messages older than --expireTime on every "
     "subscription of a topic",
     (TOPIC, (("-t", "--expireTime", "--expire-time"), {"type": ttl_seconds, "required": True, "dest": "expire_time",
                                                         "help": "seconds, or 30s, 10m, 3h, 2d"})),
     lambda a: ("POST", f"{_topic(a)}/all_subscription/expireMessages/{a.expire_time}", None)),
    ("topics", "terminate", (), "terminate a topic", (TOPIC,), lambda a: ("POST", f"{_topic(a)}/terminate", None)),
    ("topics", "unload", (), "unload a topic, or each partition of a partitioned topic (clients reconnect)",
     (TOPIC,), lambda a: ("PUT", f"{_topic(a)}/unload", None)),
    ("topics", "get-deduplication", (), "show the topic's de-duplication policy",
     (TOPIC, (("--applied",), {"action": "store_true", "help": "the policy in force"})),
     lambda a: ("GET", f"{_topic(a)}/deduplicationEnabled" + _query(applied=a.applied or None), None)),
    ("topics", "set-deduplication", (), "enable (--enable) or disable de-duplication on a topic", (TOPIC, ENABLE),
     lambda a: ("POST", f"{_topic(a)}/deduplicationEnabled", a.enable)),
    ("topics", "remove-deduplication", (), "remove the topic's de-duplication policy", (TOPIC,),
     lambda a: ("DELETE", f"{_topic(a)}/deduplicationEnabled", None)),
    ("topics", "get-delayed-delivery", (), "show the topic's delayed delivery policy",
     (TOPIC, (("--applied",), {"action": "store_true", "help": "the policy in force"})),
     lambda a: ("GET", f"{_topic(a)}/delayedDelivery" + _query(applied=a.applied or None), None)),
    ("topics", "set-delayed-delivery", (), "enable (--enable) or disable delayed delivery on a topic, its --time "
     "tick and --maxDelay", (TOPIC, DELAYED_ENABLE, TICK_TIME, MAX_DELAY),
     lambda a: ("POST", f"{_topic(a)}/delayedDelivery", _delayed_delivery(a))),
    ("topics", "remove-delayed-delivery", (), "remove the topic's delayed delivery policy", (TOPIC,),
     lambda a: ("DELETE", f"{_topic(a)}/delayedDelivery", None)),
    ("topics", "get-auto-subscription-creation", (), "show the topic's override of auto subscription creation",
     (TOPIC, APPLIED),
     lambda a: ("GET", f"{_topic(a)}/autoSubscriptionCreation" + _query(applied=a.applied or None), None)),
    ("topics", "set-auto-subscription-creation", (), "let consumers create the topic's subscriptions (-e) or not",
     (TOPIC, AUTO_SUBSCRIPTION_ENABLE),
     lambda a: ("POST", f"{_topic(a)}/autoSubscriptionCreation", {"allowAutoSubscriptionCreation": a.enable})),
    ("topics", "remove-auto-subscription-creation", (), "remove the topic's override (the namespace's applies)",
     (TOPIC,), lambda a: ("DELETE", f"{_topic(a)}/autoSubscriptionCreation", None)),
    ("topics", "get-inactive-topic-policies", (), "show the topic's inactive topic policies", (TOPIC, APPLIED),
     lambda a: ("GET", f"{_topic(a)}/inactiveTopicPolicies" + _query(applied=a.applied or None), None)),
    ("topics", "set-inactive-topic-policies", (), "delete the topic once inactive (-e) or not (-d), after how long "
     "(-t), and what inactive means (-m)", (TOPIC, *INACTIVE_OPTIONS),
     lambda a: ("POST", f"{_topic(a)}/inactiveTopicPolicies", _inactive_topic_policies(a))),
    ("topics", "remove-inactive-topic-policies", (), "remove the topic's inactive topic policies", (TOPIC,),
     lambda a: ("DELETE", f"{_topic(a)}/inactiveTopicPolicies", None)),
    ("topics", "get-retention", (), "show the topic's retention policy",
     (TOPIC, (("--applied",), {"action": "store_true", "help": "the policy in force"})),
     lambda a: ("GET", f"{_topic(a)}/retention" + _query(applied=a.applied or None), None)),
    ("topics", "set-retention", (), "keep the topic's consumed messages for -t TIME / up to -s SIZE",
     (TOPIC, RETENTION_TIME, RETENTION_SIZE), lambda a: ("POST", f"{_topic(a)}/retention", _retention(a))),
    ("topics", "remove-retention", (), "remove the topic's retention policy", (TOPIC,),
     lambda a: ("DELETE", f"{_topic(a)}/retention", None)),
    ("topics", "get-message-ttl", (), "show the topic's message TTL (seconds)", (TOPIC, APPLIED),
     lambda a: ("GET", f"{_topic(a)}/messageTTL" + _query(applied=a.applied or None), None)),
    ("topics", "set-message-ttl", (), "expire the topic's messages --ttl seconds after they were published",
     (TOPIC, TOPIC_TTL), lambda a: ("POST", f"{_topic(a)}/messageTTL" + _query(messageTTL=a.ttl), None)),
    ("topics", "remove-message-ttl", (), "remove the topic's message TTL (the namespace's applies)", (TOPIC,),
     lambda a: ("DELETE", f"{_topic(a)}/messageTTL", None)),
    ("topics", "trim-topic", ("trim",), "delete now the consumed ledgers retention no longer keeps", (TOPIC,),
     lambda a: ("POST", f"{_topic(a)}/trim", None)),
    ("topics", "compact", (), "start a compaction of the topic (of each partition of a partitioned topic)",
     (TOPIC,), lambda a: ("PUT", f"{_topic(a)}/compaction", None)),
    ("topics", "compaction-status", (), "show the status of the topic's last compaction (a non-partitioned "
     "topic or one partition); an error in it exits with 1",
     (TOPIC, (("-w", "--wait-complete"), {"action": "store_true", "help": "wait until it is no longer running"})),
     lambda a: ("GET", f"{_topic(a)}/compaction", None)),

    ("topics", "get-schema-compatibility-strategy", (), "show the topic's schema compatibility strategy",
     (TOPIC, (("--applied",), {"action": "store_true", "help": "the strategy in force"})),
     lambda a: ("GET", f"{_topic(a)}/schemaCompatibilityStrategy" + _query(applied=a.applied or None), None)),
    ("topics", "set-schema-compatibility-strategy", (), "set how the topic's new schemas are checked",
     (TOPIC, (("-c", "--compatibility"), {"required": True, "choices": STRATEGIES[:-1]})),
     lambda a: ("PUT", f"{_topic(a)}/schemaCompatibilityStrategy", a.compatibility)),
    ("topics", "remove-schema-compatibility-strategy", (), "remove the topic's strategy (the namespace's applies)",
     (TOPIC,), lambda a: ("DELETE", f"{_topic(a)}/schemaCompatibilityStrategy", None)),

    ("schemas", "get", (), "show the topic's latest schema, or --version N",
     (TOPIC, (("--version",), {"type": int, "help": "a schema version"})),
     lambda a: ("GET", f"{_schemas(a)}/schema" + ("" if a.version is None else f"/{a.version}"), None)),
    ("schemas", "get-all-versions", (), "show every version since the last delete", (TOPIC,),
     lambda a: ("GET", f"{_schemas(a)}/schemas", None)),
    ("schemas", "upload", (), "upload a schema (checked against the compatibility strategy)", (TOPIC, SCHEMA_FILE),
     lambda a: ("POST", f"{_schemas(a)}/schema", _schema_file(a))),
    ("schemas", "compatibility", (), "test whether a schema could be uploaded", (TOPIC, SCHEMA_FILE),
     lambda a: ("POST", f"{_schemas(a)}/compatibility", _schema_file(a))),
    ("schemas", "delete", (), "delete the topic's schema (--force: forget every version)",
     (TOPIC, (("--force",), {"action": "store_true"})),
     lambda a: ("DELETE", f"{_schemas(a)}/schema" + _query(force=a.force or None), None)),

    ("scalable", "list", (), "list the scalable topics of a namespace", (NAMESPACE,),
     lambda a: ("GET", f"{SCALABLE_V2}/{namespace_path(a.namespace)}", None)),
    ("scalable", "create", (), "create a scalable topic",
     (SCALABLE, (("-n", "--num-segments"), {"type": int, "default": 1, "help": "initial segments (default 1)"}),
      (("-p", "--property"), {"type": properties, "action": "append", "default": [], "help": "key=value"})),
     lambda a: ("PUT", f"{SCALABLE_V2}/{scalable_path(a.topic)}" + _query(numInitialSegments=a.num_segments),
                dict(a.property))),
    ("scalable", "get-metadata", ("metadata",), "show the segment DAG", (SCALABLE,),
     lambda a: ("GET", f"{SCALABLE_V2}/{scalable_path(a.topic)}", None)),
    ("scalable", "delete", (), "delete a scalable topic and its segments", (SCALABLE, FORCE),
     lambda a: ("DELETE", f"{SCALABLE_V2}/{scalable_path(a.topic)}" + _query(force=a.force or None), None)),
    ("scalable", "stats", (), "show a scalable topic's stats", (SCALABLE,),
     lambda a: ("GET", f"{SCALABLE_V2}/{scalable_path(a.topic)}/stats", None)),
    ("scalable", "create-subscription", (), "create a subscription on every active segment",
     (SCALABLE, SUBSCRIPTION),
     lambda a: ("PUT", f"{SCALABLE_V2}/{scalable_path(a.topic)}/subscriptions/{_quote(a.subscription)}", None)),
    ("scalable", "delete-subscription", (), "delete a subscription", (SCALABLE, SUBSCRIPTION),
     lambda a: ("DELETE", f"{SCALABLE_V2}/{scalable_path(a.topic)}/subscriptions/{_quote(a.subscription)}", None)),
    ("scalable", "split-segment", ("split",), "split an active segment at its midpoint", (SCALABLE, SEGMENT_ID),
     lambda a: ("POST", f"{SCALABLE_V2}/{scalable_path(a.topic)}/split/{a.segment_id}", None)),
    ("scalable", "merge-segments", ("merge",), "merge two adjacent active segments",
     (SCALABLE, (("segment_id1",), {"type": int}), (("segment_id2",), {"type": int})),
     lambda a: ("POST", f"{SCALABLE_V2}/{scalable_path(a.topic)}/merge/{a.segment_id1}/{a.segment_id2}", None)),

    ("segments", "create", (), "create a segment topic with subscriptions at Earliest",
     (SEGMENT, (("-s", "--subscription"), {"action": "append", "default": [], "help": "repeatable"})),
     lambda a: ("PUT", f"{SEGMENTS_V2}/{segment_path(a.segment)}", a.subscription)),
    ("segments", "terminate", (), "terminate (seal) a segment topic", (SEGMENT,),
     lambda a: ("POST", f"{SEGMENTS_V2}/{segment_path(a.segment)}/terminate", None)),
    ("segments", "delete", (), "delete a segment topic", (SEGMENT,),
     lambda a: ("DELETE", f"{SEGMENTS_V2}/{segment_path(a.segment)}", None)),

    ("transactions", "coordinator-stats", (), "show the transaction coordinators' stats", (COORDINATOR,),
     lambda a: ("GET", f"{TXN}/coordinatorStats" + _query(coordinatorId=a.coordinator_id), None)),
    ("transactions", "coordinator-internal-stats", (), "show the log of a transaction coordinator",
     ((("-c", "--coordinator-id"), {"type": int, "required": True, "help": "the coordinator"}), METADATA),
     lambda a: ("GET", f"{TXN}/coordinatorInternalStats/{a.coordinator_id}" + _query(metadata=a.metadata or None),
                None)),
    ("transactions", "scale-transactionCoordinators", ("scale-transaction-coordinators",),
     "grow the number of transaction coordinators to --replicas",
     ((("-r", "--replicas"), {"type": int, "required": True, "help": "more than now"}),),
     lambda a: ("POST", f"{TXN}/transactionCoordinator/replicas", a.replicas)),
    ("transactions", "get-metadata", ("transaction-metadata",), "show a transaction", (MOST, LEAST),
     lambda a: ("GET", f"{TXN}/transactionMetadata/{a.most_bits}/{a.least_bits}", None)),
    ("transactions", "slow-transactions", (), "list transactions open for longer than --time",
     ((("-t", "--time"), {"type": duration_ms, "required": True, "help": "e.g. 30s, 10m"}), COORDINATOR),
     lambda a: ("GET", f"{TXN}/slowTransactions/{a.time}" + _query(coordinatorId=a.coordinator_id), None)),
    ("transactions", "buffer-stats", ("transaction-buffer-stats",), "show a topic's transaction buffer",
     (TOPIC, (("-l", "--low-water-marks"), {"action": "store_true"}),
      (("-s", "--segment-stats"), {"action": "store_true", "help": "also list each sealed snapshot segment"})),
     lambda a: ("GET", f"{TXN}/transactionBufferStats/{topic_path(a.topic)}"
                + _query(lowWaterMarks=a.low_water_marks or None, segmentStats=a.segment_stats or None), None)),
    ("transactions", "buffer-internal-stats", ("transaction-buffer-internal-stats",),
     "show the stores of a topic's transaction buffer snapshots", (TOPIC, METADATA),
     lambda a: ("GET", f"{TXN}/transactionBufferInternalStats/{topic_path(a.topic)}"
                + _query(metadata=a.metadata or None), None)),
    ("transactions", "pending-ack-stats", (), "show a subscription's pending acks",
     (TOPIC, SUBSCRIPTION, (("-l", "--low-water-marks"), {"action": "store_true"})),
     lambda a: ("GET", f"{TXN}/pendingAckStats/{topic_path(a.topic)}/{_quote(a.subscription)}"
                + _query(lowWaterMarks=a.low_water_marks or None), None)),
    ("transactions", "pending-ack-internal-stats", (), "show the log of a subscription's pending acks",
     (TOPIC, SUBSCRIPTION, METADATA),
     lambda a: ("GET", f"{TXN}/pendingAckInternalStats/{topic_path(a.topic)}/{_quote(a.subscription)}"
                + _query(metadata=a.metadata or None), None)),
    ("transactions", "position-stats-in-pending-ack", (), "show where a position stands in a subscription's "
     "pending acks (PendingAck, MarkDelete, NotInPendingAck, ...)",
     (TOPIC, SUBSCRIPTION, (("-l", "--ledger-id"), {"type": int, "required": True, "help": "ledger id"}),
      (("-e", "--entry-id"), {"type": int, "required": True, "help": "entry id"}),
      (("-b", "--batch-index"), {"type": int, "help": "an index of the batch entry"})),
     lambda a: ("GET", f"{TXN}/positionStatsInPendingAck/{topic_path(a.topic)}/{_quote(a.subscription)}"
                       f"/{a.ledger_id}/{a.entry_id}" + _query(batchIndex=a.batch_index), None)),
    ("transactions", "in-buffer-stats", ("transaction-in-buffer-stats",),
     "show a transaction's state in a topic's buffer", (TOPIC, MOST, LEAST),
     lambda a: ("GET", f"{TXN}/transactionInBufferStats/{topic_path(a.topic)}/{a.most_bits}/{a.least_bits}", None)),
    ("transactions", "in-pending-ack-stats", ("transaction-in-pending-ack-stats",),
     "show a transaction's state in a subscription's pending acks", (TOPIC, SUBSCRIPTION, MOST, LEAST),
     lambda a: ("GET", f"{TXN}/transactionInPendingAckStats/{topic_path(a.topic)}/{_quote(a.subscription)}"
                       f"/{a.most_bits}/{a.least_bits}", None)),
    ("transactions", "abort", ("abort-transaction",), "abort a transaction now (a stuck one)", (MOST, LEAST),
     lambda a: ("POST", f"{TXN}/abortTransaction/{a.most_bits}/{a.least_bits}", None)),
    ("transactions", "list-transaction-keys", (), "list the transaction keys", (),
     lambda a: ("GET", TXN_KEYS, None)),
    ("transactions", "get-transaction-key", (), "show a transaction key (epoch, owner, transaction, age)",
     (TXN_KEY, OWNER), lambda a: ("GET", f"{TXN_KEYS}/{_quote(a.transaction_key)}" + _query(owner=a.owner), None)),
    ("transactions", "delete-transaction-key", (), "remove a transaction key, aborting its transaction",
     (TXN_KEY, OWNER), lambda a: ("DELETE", f"{TXN_KEYS}/{_quote(a.transaction_key)}" + _query(owner=a.owner), None)),
]


def _update_subscription_properties(a: argparse.Namespace) -> Request:
    # As pulsar-admin: an empty set of properties only by --clear, never by forgetting -p.
    if not a.property and not a.clear:
        raise AdminCallError("give the new properties (-p key=value), or --clear to remove them all")
    if a.property and a.clear:
        raise AdminCallError("--clear removes every property: give no -p with it")
    return "PUT", f"{_sub(a)}/properties", dict(a.property)


def _reset_cursor(a: argparse.Namespace) -> Request:
    if (a.time is None) == (a.messageId is None):
        raise AdminCallError("reset-cursor takes either --time or --messageId")
    if a.time is not None:
        return "POST", f"{_sub(a)}/resetcursor/{int(time.time() * 1000) - a.time}", None
    return "POST", f"{_sub(a)}/resetcursor", a.messageId


# --- messages (peek-messages, examine-message, get-message-by-id) ---------------------------
# The broker answers one entry at a time, its payload as the body and its metadata in headers;
# as Pulsar's admin client, this side splits a batch into its messages and, for peek-messages,
# drops server markers (unless --show-server-marker) and, READ_COMMITTED, the messages of
# aborted transactions and those past the read horizon (an open transaction's).

PROPERTY_PREFIX = "x-pulsar-property-"
TXN_ABORTED = "X-Pulsar-txn-aborted"
TXN_UNCOMMITTED = "X-Pulsar-txn-uncommitted"
BATCH_HEADERS = ("X-Pulsar-num-batch-message", "X-Pulsar-batch-size")
ISOLATION_LEVELS = ("READ_COMMITTED", "READ_UNCOMMITTED")
NO_MORE_MESSAGES = "Message not found"          # the broker's 404 past the last entry


def _epoch_ms(text: str | None) -> int:
    """Milliseconds since the epoch of an X-Pulsar-...-time header (ISO 8601 with an offset)."""
    if not text:
        return 0
    try:
        return round(datetime.datetime.fromisoformat(text).timestamp() * 1000)
    except ValueError:
        raise AdminCallError(f"the broker sent a time that is not ISO 8601: {text[:40]!r}") from None


def _payload(data: bytes) -> dict[str, str]:
    try:
        return {"payload": data.decode("utf-8")}
    except UnicodeDecodeError:
        return {"payloadBase64": base64.b64encode(data).decode("ascii")}


def entry_messages(headers: http.client.HTTPMessage, body: bytes, *, show_server_marker: bool = True,
                   isolation: str = "READ_UNCOMMITTED") -> list[dict[str, Any]]:
    """The messages of one entry answered by the broker, as Pulsar's admin client reads them
    (getMessagesFromHttpResponse): none for a marker not shown or, READ_COMMITTED, for an
    aborted or uncommitted transaction's entry; a batch split unless encrypted."""
    marker = headers.get("X-Pulsar-marker-type")
    if marker is not None and not show_server_marker:
        return []
    properties: dict[str, str] = {}
    for flag in (TXN_ABORTED, TXN_UNCOMMITTED):
        if (headers.get(flag) or "").lower() == "true":
            if isolation == "READ_COMMITTED":
                return []
            properties[flag] = "true"
    properties.update({name: headers[name] for name in BATCH_HEADERS if headers.get(name) is not None})
    properties.update({name[len(PROPERTY_PREFIX):]: value for name, value in headers.items()
                       if name.lower().startswith(PROPERTY_PREFIX)})
    message_id = headers.get("X-Pulsar-Message-ID", "")
    common: dict[str, Any] = {"publishTime": _epoch_ms(headers.get("X-Pulsar-publish-time")),
                              "eventTime": _epoch_ms(headers.get("X-Pulsar-event-time")),
                              "producerName": headers.get("X-Pulsar-producer-name"),
                              "sequenceId": int(headers.get("X-Pulsar-sequence-id") or 0)}
    if headers.get("X-Pulsar-partition-key") is not None:
        common["key"] = headers["X-Pulsar-partition-key"]
    if marker is not None:
        common["markerType"] = int(marker)
    encrypted = (headers.get("X-Pulsar-Is-Encrypted") or "").lower() == "true"
    batch_size = headers.get("X-Pulsar-num-batch-message")
    if encrypted or batch_size is None:
        return [{"messageId": message_id, **common, "properties": properties, **_payload(body)}]
    try:
        singles = split_batch(body, int(batch_size))
    except ValueError as exc:
        raise AdminCallError(f"entry {message_id}: the batch does not split: {exc}") from None
    messages = []
    for index, (raw_metadata, payload) in enumerate(singles):
        single = SingleMessageMetadata.FromString(raw_metadata)
        own = {**properties, **{kv.key: kv.value for kv in single.properties}}
        message = {"messageId": f"{message_id}:{index}", **common, "properties": own, **_payload(payload)}
        if single.HasField("partition_key"):
            message["key"] = single.partition_key
        if single.HasField("event_time"):
            message["eventTime"] = single.event_time
        messages.append(message)
    return messages


def _peek_messages(a: argparse.Namespace) -> list[dict[str, Any]]:
    """pulsar-admin's peek-messages: the 1st, 2nd... entry after the mark-delete position until
    --count messages are found or there are no more (404), filtered as Pulsar's client does."""
    if a.count < 1:
        raise AdminCallError(f"--count must be at least 1, not {a.count}")
    messages: list[dict[str, Any]] = []
    nth = 1
    while len(messages) < a.count:
        try:
            headers, body = exchange(a.url, "GET", f"{_sub(a)}/position/{nth}")
        except AdminHttpError as exc:
            if exc.status == 404 and exc.reason == NO_MORE_MESSAGES:     # (not a topic or subscription)
                break                                                   # what was found so far
            raise
        messages.extend(entry_messages(headers, body, show_server_marker=a.show_server_marker,
                                       isolation=a.transaction_isolation_level))
        nth += 1
    return messages[:a.count]


def _one_message(a: argparse.Namespace, path: str) -> dict[str, Any] | None:
    """The first message of the entry at `path`, as pulsar-admin's examine-message and
    get-message-by-id print it (nothing filtered)."""
    messages = entry_messages(*exchange(a.url, "GET", path))
    return messages[0] if messages else None


def _examine_message(a: argparse.Namespace) -> dict[str, Any] | None:
    query = _query(initialPosition=a.initialPosition, messagePosition=a.messagePosition)
    return _one_message(a, f"{_topic(a)}/examinemessage{query}")


def _message_by_id(a: argparse.Namespace) -> dict[str, Any] | None:
    return _one_message(a, f"{_topic(a)}/ledger/{a.ledgerId}/entry/{a.entryId}")


# Commands that make their own calls: (group, name, aliases, help, arguments, runner).
MESSAGE_COMMANDS: list[tuple[str, str, tuple[str, ...], str, tuple, Callable[[argparse.Namespace], Any]]] = [
    ("topics", "peek-messages", (), "show the next -n messages of a subscription (a partition's, not a partitioned "
     "topic's), as JSON: markers and uncommitted or aborted transactions' messages left out unless asked",
     (TOPIC, SUBSCRIPTION, (("-n", "--count"), {"type": int, "default": 1, "help": "number of messages (default 1)"}),
      (("-ssm", "--show-server-marker"), {"action": "store_true", "help": "also the transactions' markers"}),
      (("-til", "--transaction-isolation-level"),
       {"choices": ISOLATION_LEVELS, "default": "READ_COMMITTED",
        "help": "READ_COMMITTED (default): committed messages only; READ_UNCOMMITTED: also those of open and "
                "aborted transactions"})),
     _peek_messages),
    ("topics", "examine-message", (), "show the -m-th message from the latest (default) or the earliest",
     (TOPIC, (("-i", "--initialPosition"), {"choices": ("latest", "earliest"), "default": "latest",
                                            "help": "count from the latest (default) or the earliest message"}),
      (("-m", "--messagePosition"), {"type": int, "default": 1, "help": "the position (default 1)"})),
     _examine_message),
    ("topics", "get-message-by-id", (), "show the message of a ledger id and entry id",
     (TOPIC, (("-l", "--ledgerId"), {"type": int, "required": True, "help": "ledger id"}),
      (("-e", "--entryId"), {"type": int, "required": True, "help": "entry id"})),
     _message_by_id),
]


COMPACTION_POLL_S = 1.0            # pulsar-admin's compaction-status --wait-complete polls each second


def _compaction_status(a: argparse.Namespace, reply: Any, again: Callable[[], Any]) -> Any:
    """pulsar-admin's compaction-status: with --wait-complete, asked again while RUNNING; an
    ERROR status is a failure (its lastError on stderr, exit status 1)."""
    while a.wait_complete and isinstance(reply, dict) and reply.get("status") == "RUNNING":
        time.sleep(COMPACTION_POLL_S)
        reply = again()
    if isinstance(reply, dict) and reply.get("status") == "ERROR":
        raise AdminCallError(f"Error in compaction: {reply.get('lastError', '')}")
    return reply


# what a command does with its reply before it is printed (the reply, or AdminCallError)
REPLY_CHECKS: dict[tuple[str, str], Callable[[argparse.Namespace, Any, Callable[[], Any]], Any]] = {
    ("topics", "compaction-status"): _compaction_status,
}


# --- HTTP -----------------------------------------------------------------------------------

class PlainText(str):
    """A text/plain reply (a health check's `ok`): printed as it is, not as JSON."""


def call(url: str, method: str, path: str, body: Any = None) -> Any:
    """One admin call: the reply's JSON (None for an empty reply; PlainText for a text/plain
    one), or AdminCallError."""
    headers, raw = exchange(url, method, path, body)
    if not raw.strip():
        return None
    # (get_content_type() says text/plain for a reply without a Content-Type: not one of ours)
    if "Content-Type" in headers and headers.get_content_type() == "text/plain":
        return PlainText(raw.decode(errors="replace"))
    try:
        return json.loads(raw)
    except ValueError:
        raise AdminCallError(f"{url} did not answer as the admin API does (the reply is not JSON: "
                             f"{raw[:80].decode(errors='replace')!r})") from None


class AdminHttpError(AdminCallError):
    """The server answered with an error status."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(f"HTTP {status}: {reason}")
        self.status = status
        self.reason = reason


def exchange(url: str, method: str, path: str, body: Any = None) -> tuple[http.client.HTTPMessage, bytes]:
    """One admin call: the reply's headers and body, or AdminCallError (AdminHttpError for an
    error status)."""
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url.rstrip("/") + path, data=data, method=method,
                                     headers={"Content-Type": "application/json",
                                              "Accept": "application/json, application/octet-stream"})
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_S) as reply:
            return reply.headers, reply.read()
    except urllib.error.HTTPError as exc:
        raise AdminHttpError(exc.code, _reason(_error_body(exc)) or exc.reason) from None
    except http.client.IncompleteRead as exc:
        raise AdminCallError(f"the reply of the admin API at {url} was cut short "
                             f"({len(exc.partial)} bytes, {exc.expected} more expected)") from None
    except (http.client.HTTPException, ValueError) as exc:   # not HTTP (the binary protocol's port?)
        raise AdminCallError(f"{url} did not answer as the admin API does (not an HTTP reply: "
                             f"{type(exc).__name__}: {exc})") from None
    except (urllib.error.URLError, OSError) as exc:
        reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
        raise AdminCallError(f"cannot reach the admin API at {url}: {reason}") from None


def _error_body(exc: urllib.error.HTTPError) -> bytes:
    """The body of an error reply, or what arrived of it."""
    try:
        return exc.read()
    except http.client.IncompleteRead as cut:
        return cut.partial
    except (http.client.HTTPException, OSError):
        return b""


def _reason(raw: bytes) -> str:
    try:
        reply = json.loads(raw)
    except ValueError:
        return raw.decode(errors="replace").strip()
    return str(reply.get("reason", "")) if isinstance(reply, dict) else str(reply)


# --- the command line -----------------------------------------------------------------------

def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("admin", help="manage a broker through its admin REST API",
                            description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", type=admin_url, default=os.environ.get("PYENGINE_ADMIN_URL", DEFAULT_URL),
                        help=f"the broker's admin URL (default: $PYENGINE_ADMIN_URL or {DEFAULT_URL})")
    groups = parser.add_subparsers(dest="admin_group", required=True, metavar="GROUP")
    group_parsers: dict[str, argparse._SubParsersAction] = {}
    for group, name, aliases, help_text, arguments, builder in COMMANDS:
        if group not in group_parsers:
            group_parsers[group] = groups.add_parser(group, help=f"{group} commands").add_subparsers(
                dest="admin_command", required=True, metavar="COMMAND")
        command = group_parsers[group].add_parser(name, aliases=list(aliases), help=help_text)
        for flags, options in arguments:
            command.add_argument(*flags, **options)
        command.set_defaults(admin_request=builder, admin_reply=REPLY_CHECKS.get((group, name)))
    for group, name, aliases, help_text, arguments, runner in MESSAGE_COMMANDS:
        command = group_parsers[group].add_parser(name, aliases=list(aliases), help=help_text)
        for flags, options in arguments:
            command.add_argument(*flags, **options)
        command.set_defaults(admin_run=runner)


def run(args: argparse.Namespace) -> int:
    try:
        if getattr(args, "admin_run", None) is not None:
            reply = args.admin_run(args)
        else:
            method, path, body = args.admin_request(args)
            reply = call(args.url, method, path, body)
            check = getattr(args, "admin_reply", None)
            if check is not None:
                reply = check(args, reply, lambda: call(args.url, method, path, body))
    except AdminCallError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if isinstance(reply, PlainText):
        print(reply)
    elif reply is not None:
        print(json.dumps(reply, indent=2, sort_keys=True))
    return 0
