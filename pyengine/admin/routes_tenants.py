"""Tenants: `/admin/v2/tenants` (Pulsar's Tenants resource)."""

from __future__ import annotations

from typing import Any

from pyengine.admin.errors import METHOD_NOT_ALLOWED, PRECONDITION_FAILED, AdminError
from pyengine.admin.names import tenant_name
from pyengine.admin.routing import Call, Param, Reply, RouteTable
from pyengine.admin.schemas import BOOLEAN, DONE, STRING_LIST, TENANT, TENANT_INFO, error, errors

routes = RouteTable("tenants")
BASE = "/admin/v2/tenants"

FORCED_DELETION_REFUSED = "Broker doesn't allow forced deletion of tenants"          # Pulsar's words
FORCE_DELETE = Param("force", BOOLEAN, "also delete its namespaces and their topics: refused (405), as by a "
                     "Pulsar broker with its default forceDeleteTenantAllowed=false", default=False)


@routes.add("GET", BASE, summary="List the tenants.", replies={200: Reply("Tenant names", STRING_LIST)})
async def list_tenants(call: Call) -> list[str]:
    return call.service.policies.tenants()


@routes.add("GET", BASE + "/{tenant}", summary="Get a tenant's admin roles and allowed clusters.",
            params=(TENANT,), replies={200: Reply("TenantInfo", TENANT_INFO), **errors(404, 412)})
async def get_tenant(call: Call) -> dict[str, Any]:
    return call.service.policies.tenant(tenant_name(call["tenant"]))


@routes.add("PUT", BASE + "/{tenant}", summary="Create a tenant (its TenantInfo, with allowedClusters, is required).",
            params=(TENANT,), body={**TENANT_INFO, "nullable": True},      # null: 412, as no body
            replies={204: DONE, **errors(400, 409, 412)})
async def create_tenant(call: Call) -> None:
    # As Pulsar's validateClustersAsync: the REST API has no default clusters (pulsar-admin's
    # `tenants create`, and ours, fill them in).
    info = call.body
    if info is None:
        raise AdminError(PRECONDITION_FAILED, "TenantInfo is null")
    clusters = info.get("allowedClusters")
    if clusters is None:
        raise AdminError(PRECONDITION_FAILED, "Clusters cannot be null")
    if not clusters or any(not cluster.strip() for cluster in clusters):
        raise AdminError(PRECONDITION_FAILED, "Clusters cannot be empty or blank")
    cluster = call.service.config.cluster_name
    unknown = sorted(set(clusters) - {cluster})
    if unknown:
        raise AdminError(PRECONDITION_FAILED, f"Clusters do not exist: {', '.join(unknown)} (this is {cluster})")
    await call.service.policies.create_tenant(tenant_name(call["tenant"]), {
        "adminRoles": info.get("adminRoles", []), "allowedClusters": clusters})


@routes.add("DELETE", BASE + "/{tenant}", summary="Delete a tenant that has no namespaces.",
            params=(TENANT, FORCE_DELETE),
            replies={204: DONE, **errors(404, 409, 412), 405: error(FORCED_DELETION_REFUSED)})
async def delete_tenant(call: Call) -> None:
    tenant = tenant_name(call["tenant"])
    if call["force"]:                               # checked first, as Pulsar does
        raise AdminError(METHOD_NOT_ALLOWED, FORCED_DELETION_REFUSED)
    await call.service.policies.delete_tenant(tenant)
