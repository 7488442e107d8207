"""DELETE of a tenant or a namespace with force=true: 405 with Pulsar's reasons, as a Pulsar
broker answers by default (forceDeleteTenantAllowed and forceDeleteNamespaceAllowed are false),
before it looks whether the tenant or namespace exists or is empty; and `pyengine admin tenants
delete` and `namespaces delete` pass -f/--force on."""

from __future__ import annotations

T = "/admin/v2/tenants"
NS = "/admin/v2/namespaces"
TENANT_REFUSED = {"reason": "Broker doesn't allow forced deletion of tenants"}
NAMESPACE_REFUSED = {"reason": "Broker doesn't allow forced deletion of namespaces"}


async def test_forced_deletion_is_405_and_deletes_nothing(api, client):
    assert (await api.put(f"{T}/acme", {"allowedClusters": ["standalone"]})).status == 204
    assert (await api.put(f"{NS}/acme/full")).status == 204
    assert (await api.put(f"{NS}/acme/empty")).status == 204
    await client.create_producer("persistent://acme/full/t")

    for path, refused in ((f"{T}/acme", TENANT_REFUSED), (f"{NS}/acme/full", NAMESPACE_REFUSED),
                          (f"{NS}/acme/empty", NAMESPACE_REFUSED), (f"{T}/nobody", TENANT_REFUSED),
                          (f"{NS}/acme/nothing", NAMESPACE_REFUSED)):
        reply = await api.delete(f"{path}?force=true")
        assert (reply.status, reply.body) == (405, refused), path
    assert (await api.get(f"{NS}/acme")).body == ["acme/empty", "acme/full"]
    assert (await api.get(f"{NS}/acme/full/topics")).body == ["persistent://acme/full/t"]

    assert (await api.delete(f"{NS}/acme/empty?force=maybe")).status == 400
    assert (await api.delete(f"{T}/acme?force=false")).status == 409           # as without force
    assert (await api.delete(f"{NS}/acme/empty?force=false")).status == 204
    assert (await api.delete(f"{T}/bad%20name?force=true")).status == 412     # the name is checked first


async def test_the_cli_passes_force_on(admin):
    assert (await admin("namespaces", "create", "public/kept"))[0] == 0
    status, out, err = await admin("namespaces", "delete", "public/kept", "-f")
    assert (status, out, err) == (1, None, f"error: HTTP 405: {NAMESPACE_REFUSED['reason']}\n")
    status, out, err = await admin("tenants", "delete", "public", "--force")
    assert (status, out, err) == (1, None, f"error: HTTP 405: {TENANT_REFUSED['reason']}\n")
    assert (await admin("namespaces", "delete", "public/kept"))[0] == 0       # without it: deleted when empty


async def test_the_documented_force_parameter(api):
    paths = (await api.get("/openapi.json")).body["paths"]
    for path, refused in ((f"{T}/{{tenant}}", TENANT_REFUSED), (f"{NS}/{{tenant}}/{{namespace}}", NAMESPACE_REFUSED)):
        delete = paths[path]["delete"]
        assert {"name": "force", "in": "query"}.items() <= next(
            p for p in delete["parameters"] if p["name"] == "force").items()
        assert refused["reason"] in delete["responses"]["405"]["description"]
