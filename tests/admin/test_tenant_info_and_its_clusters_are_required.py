"""PUT of a tenant: as Pulsar's validateClustersAsync, the TenantInfo body and its
allowedClusters are required (412 "TenantInfo is null", "Clusters cannot be null"), and the
clusters may be neither empty nor blank; `pyengine admin tenants create` without -c fills in
the broker's clusters, as pulsar-admin does."""

from __future__ import annotations

from pyengine.cli import admin as cli_admin
from pyengine.cli.admin import call

T = "/admin/v2/tenants"


async def test_a_tenant_needs_its_info_and_clusters(api):
    for body, reason in ((None, "TenantInfo is null"),
                         ({}, "Clusters cannot be null"),
                         ({"adminRoles": ["ops"]}, "Clusters cannot be null"),
                         ({"allowedClusters": None}, "Clusters cannot be null"),
                         ({"allowedClusters": []}, "Clusters cannot be empty or blank"),
                         ({"allowedClusters": ["standalone", " "]}, "Clusters cannot be empty or blank")):
        reply = await api.put(f"{T}/acme", body)
        assert (reply.status, reply.body) == (412, {"reason": reason}), body
    assert (await api.put(f"{T}/acme", raw="null")).body == {"reason": "TenantInfo is null"}
    assert (await api.get(f"{T}/acme")).status == 404                     # nothing was created
    assert (await api.put(f"{T}/public")).status == 412                   # checked before existence, as Pulsar
    assert (await api.put(f"{T}/acme", {"allowedClusters": ["standalone"]})).status == 204


async def test_the_cli_fills_in_the_brokers_clusters(admin, api, monkeypatch):
    sent = []

    def recorded_call(url, method, path, body=None):
        sent.append((method, path, body))
        return call(url, method, path, body)

    monkeypatch.setattr(cli_admin, "call", recorded_call)
    assert (await admin("tenants", "create", "acme"))[0] == 0
    assert sent == [("GET", "/admin/v2/clusters", None),
                    ("PUT", f"{T}/acme", {"adminRoles": [], "allowedClusters": ["standalone"]})]
    assert (await api.get(f"{T}/acme")).body == {"adminRoles": [], "allowedClusters": ["standalone"]}
    status, _, err = await admin("tenants", "create", "other", "-c", "elsewhere")
    assert status == 1 and "HTTP 412: Clusters do not exist: elsewhere" in err
