"""Tenants: `/admin/v2/tenants` (Pulsar's Tenants resource)."""

from __future__ import annotations

from typing import Any

from pyengine.admin.errors import PRECONDITION_FAILED, AdminError
from pyengine.admin.names import tenant_name
from pyengine.admin.routing import Call, Reply, RouteTable
from pyengine.admin.schemas import DONE, STRING_LIST, TENANT, TENANT_INFO, errors

routes = RouteTable("tenants")
BASE = "/admin/v2/tenants"


@routes.add("GET", BASE, summary="List the tenants.", replies={200: Reply("Tenant names", STRING_LIST)})
async def list_tenants(call: Call) -> list[str]:
    return call.service.policies.tenants()


@routes.add("GET", BASE + "/{tenant}", summary="Get a tenant's admin roles and allowed clusters.",
            params=(TENANT,), replies={200: Reply("TenantInfo", TENANT_INFO), **errors(404, 412)})
async def get_tenant(call: Call) -> dict[str, Any]:
    return call.service.policies.tenant(tenant_name(call["tenant"]))


@routes.add("PUT", BASE + "/{tenant}", summary="Create a tenant.", params=(TENANT,), body=TENANT_INFO,
            replies={204: DONE, **errors(400, 409, 412)})
async def create_tenant(call: Call) -> None:
    info = call.body or {}
    cluster = call.service.config.cluster_name
    clusters = info.get("allowedClusters", [cluster])
    if not clusters:
        raise AdminError(PRECONDITION_FAILED, "Clusters can not be empty")
    unknown = sorted(set(clusters) - {cluster})
    if unknown:
        raise AdminError(PRECONDITION_FAILED, f"Clusters do not exist: {', '.join(unknown)} (this is {cluster})")
    await call.service.policies.create_tenant(tenant_name(call["tenant"]), {
        "adminRoles": info.get("adminRoles", []), "allowedClusters": clusters})


@routes.add("DELETE", BASE + "/{tenant}", summary="Delete a tenant that has no namespaces.", params=(TENANT,),
            replies={204: DONE, **errors(404, 409, 412)})
async def delete_tenant(call: Call) -> None:
    await call.service.policies.delete_tenant(tenant_name(call["tenant"]))
