"""Backlog quotas of namespaces and topics, at Pulsar's admin paths: `backlogQuotaMap` (GET: the
quotas set, by BacklogQuotaType), `backlogQuota` (POST a BacklogQuota for the
`backlogQuotaType` query parameter, destination_storage when absent; DELETE it: the next level
applies). As Pulsar, a quota a retention policy could not keep is refused with 412: a
destination_storage limit at or over the retention size, or a limit time at or over the
retention time (`pyengine.broker.backlog_quota` applies them)."""

from __future__ import annotations

import dataclasses
from typing import Any

from pyengine.admin.errors import PRECONDITION_FAILED, AdminError
from pyengine.broker.topic_changes import topic_change
from pyengine.admin.routes_limits import APPLIED, NAMESPACE_PARAMS, NAMESPACE_URL, TOPIC_PARAMS, TOPIC_URL
from pyengine.admin.routes_limits import _namespace, _requested_topic, _topic
from pyengine.admin.routing import Call, Param, Reply, RouteTable
from pyengine.admin.schemas import DONE, errors
from pyengine.broker.policies import (BACKLOG_QUOTA_TYPES, BACKLOG_RETENTION_POLICIES, MAX_INT, MAX_LONG,
                                      BacklogQuota, Retention)

routes = RouteTable("backlog quotas")

SIZE = {"type": "integer", "minimum": -1, "maximum": MAX_LONG, "description": "bytes (-1: no limit)"}
BACKLOG_QUOTA = {
    "type": "object",
    "description": "Pulsar's BacklogQuota (limit: the deprecated name of limitSize)",
    "properties": {"limit": SIZE, "limitSize": SIZE,
                   "limitTime": {"type": "integer", "minimum": -1, "maximum": MAX_INT,
                                 "description": "seconds (-1: no limit)"},
                   "policy": {"type": "string", "enum": list(BACKLOG_RETENTION_POLICIES)}},
    "additionalProperties": False,
}
BACKLOG_QUOTA_MAP = {"type": "object", "properties": {name: BACKLOG_QUOTA for name in BACKLOG_QUOTA_TYPES},
                     "additionalProperties": False}
QUOTA_TYPE = Param("backlogQuotaType", {"type": "string", "enum": list(BACKLOG_QUOTA_TYPES)},
                   "the quota's type (destination_storage when absent)", default="destination_storage")
_CONFLICT = "Backlog Quota exceeds configured retention quota for {}. Please increase retention quota and retry"


def _fits_retention(quota: BacklogQuota, retention: Retention | None) -> bool:
    """Pulsar's checkBacklogQuota: a retention with a limit must keep more than the quota's."""
    if retention is None or (retention.size_mb <= 0 and retention.time_minutes <= 0):
        return True
    if retention.size_mb > 0 and quota.limit_size >= retention.size_mb * 1024 * 1024:
        return False
    return not (retention.time_minutes > 0 and quota.limit_time >= retention.time_minutes * 60)


def _checked(call: Call, retention: Retention | None, level: str) -> BacklogQuota:
    quota = BacklogQuota.from_json(call.body)
    # As Pulsar: a message_age quota is not checked itself, the broker's default quota is.
    checked = quota if call["backlogQuotaType"] == "destination_storage" else \
        call.service.policies.backlog_quota_default
    if not _fits_retention(checked, retention):
        raise AdminError(PRECONDITION_FAILED, _CONFLICT.format(level))
    return quota


def _namespace_retention(call: Call, namespace: str) -> Retention | None:
    policies = call.service.policies.policies(namespace)
    if policies.retention_time_minutes is None or policies.retention_size_mb is None:
        return None
    return Retention(policies.retention_time_minutes, policies.retention_size_mb)


def _with(stored: dict[str, Any] | None, quota_type: str, quota: BacklogQuota | None) -> dict[str, Any] | None:
    changed = dict(stored or {})
    if quota is None:
        changed.pop(quota_type, None)
    else:
        changed[quota_type] = quota.to_json()
    return changed or None


# --- namespaces -------------------------------------------------------------------------------

@routes.add("GET", NAMESPACE_URL + "/backlogQuotaMap", summary="Get the namespace's backlog quotas.",
            params=NAMESPACE_PARAMS, replies={200: Reply("The quotas by type", BACKLOG_QUOTA_MAP), **errors(404)})
async def get_namespace_backlog_quota_map(call: Call) -> dict[str, Any]:
    return call.service.policies.policies(_namespace(call)).backlog_quota_map or {}


async def _change_namespace(call: Call, quota: BacklogQuota | None) -> None:
    namespace = _namespace(call)
    policies = call.service.policies
    current = policies.policies(namespace)
    changed = _with(current.backlog_quota_map, call["backlogQuotaType"], quota)
    await policies.set_policies(namespace, dataclasses.replace(current, backlog_quota_map=changed))


@routes.add("POST", NAMESPACE_URL + "/backlogQuota", summary="Set a backlog quota of the namespace.",
            params=(*NAMESPACE_PARAMS, QUOTA_TYPE), body=BACKLOG_QUOTA, body_required=True,
            replies={204: DONE, **errors(400, 404, 412)})
async def set_namespace_backlog_quota(call: Call) -> None:
    namespace = _namespace(call)
    await _change_namespace(call, _checked(call, _namespace_retention(call, namespace), "namespace"))


@routes.add("DELETE", NAMESPACE_URL + "/backlogQuota",
            summary="Remove a backlog quota of the namespace (the broker's default applies).",
            params=(*NAMESPACE_PARAMS, QUOTA_TYPE), replies={204: DONE, **errors(400, 404)})
async def remove_namespace_backlog_quota(call: Call) -> None:
    await _change_namespace(call, None)


# --- topics -----------------------------------------------------------------------------------

@routes.add("GET", TOPIC_URL + "/backlogQuotaMap", summary="Get the topic's backlog quotas.",
            params=(*TOPIC_PARAMS, APPLIED), replies={200: Reply("The quotas by type", BACKLOG_QUOTA_MAP),
                                                       **errors(400, 404)})
async def get_topic_backlog_quota_map(call: Call) -> dict[str, Any]:
    name = str(_topic(call))
    policies = call.service.policies
    if call["applied"]:
        return {quota_type: policies.backlog_quota(name, quota_type).to_json() for quota_type in BACKLOG_QUOTA_TYPES}
    return policies.topic_policies(name).get("backLogQuotaMap") or {}


async def _change_topic(call: Call, quota: BacklogQuota | None) -> None:
    async with topic_change(call.service, _requested_topic(call)):     # not during its deletion
        name = str(_topic(call))
        policies = call.service.policies
        changed = _with(policies.topic_policies(name).get("backLogQuotaMap"), call["backlogQuotaType"], quota)
        await policies.set_topic_policy(name, "backLogQuotaMap", changed)


@routes.add("POST", TOPIC_URL + "/backlogQuota", summary="Set a backlog quota of the topic.",
            params=(*TOPIC_PARAMS, QUOTA_TYPE), body=BACKLOG_QUOTA, body_required=True,
            replies={204: DONE, **errors(400, 404, 412)})
async def set_topic_backlog_quota(call: Call) -> None:
    name = str(_topic(call))
    # The retention the topic keeps: its own policy, else its namespace's (not the broker's default).
    stored = call.service.policies.topic_policies(name).get("retention")
    retention = Retention.from_json(stored) if stored is not None else \
        _namespace_retention(call, _namespace(call))
    await _change_topic(call, _checked(call, retention, "topic"))


@routes.add("DELETE", TOPIC_URL + "/backlogQuota",
            summary="Remove a backlog quota of the topic (the namespace's applies).",
            params=(*TOPIC_PARAMS, QUOTA_TYPE), replies={204: DONE, **errors(400, 404)})
async def remove_topic_backlog_quota(call: Call) -> None:
    await _change_topic(call, None)
