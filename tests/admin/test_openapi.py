"""`/openapi.json`: the document describes every route the server has, and the server keeps to
the document — checked by structure here."""

from __future__ import annotations

import re

from pyengine.admin.openapi import build_document
from pyengine.admin.server import all_routes, build_app

_REF = re.compile(r"^#/components/schemas/(\w+)$")


async def test_document_describes_every_route(api, service):
    document = (await api.get("/openapi.json")).body
    assert document == build_document(all_routes())
    assert document["openapi"].startswith("3.0")
    registered = {(r.method, r.resource.canonical) for r in build_app(service).router.routes()}
    documented = {(method.upper(), path) for path, item in document["paths"].items() for method in item}
    # HEAD is the GET of the same resource without its body: registered with it, not documented.
    heads = {path for method, path in registered if method == "HEAD"}
    assert heads == {path for method, path in documented if method == "GET"}
    assert documented == {(method, path) for method, path in registered if method != "HEAD"}
    assert len(documented) == len(all_routes())
    operation_ids = [op["operationId"] for item in document["paths"].values() for op in item.values()]
    assert len(operation_ids) == len(set(operation_ids))

    for path, item in document["paths"].items():
        in_path = set(re.findall(r"{(\w+)}", path))
        for method, operation in item.items():
            where = f"{method.upper()} {path}"
            params = operation.get("parameters", [])
            assert {p["name"] for p in params if p["in"] == "path"} == in_path, where
            assert all(p["required"] for p in params if p["in"] == "path"), where
            assert all(p["in"] in ("path", "query") and "type" in p["schema"] for p in params), where
            assert operation["summary"] and operation["tags"], where
            statuses = [int(status) for status in operation["responses"]]
            assert any(200 <= status < 300 for status in statuses), where
            for status, reply in operation["responses"].items():
                assert reply["description"], where
                if int(status) >= 400:
                    assert reply["content"]["application/json"]["schema"] == {
                        "$ref": "#/components/schemas/ErrorData"}, where
            if "requestBody" in operation:
                assert "schema" in operation["requestBody"]["content"]["application/json"], where
    for ref in _refs(document):
        assert _REF.match(ref) and _REF.match(ref)[1] in document["components"]["schemas"], ref


def _refs(node):
    if isinstance(node, dict):
        if "$ref" in node:
            yield node["$ref"]
        for value in node.values():
            yield from _refs(value)
    elif isinstance(node, list):
        for value in node:
            yield from _refs(value)


async def test_pulsar_admin_paths_are_there(api):
    """The paths Pulsar's clients, tools and tests call (PersistentTopics, Namespaces, Tenants,
    Transactions resources; pulsar-client-python's tests; PIP-325's abortTransaction)."""
    paths = (await api.get("/openapi.json")).body["paths"]
    for method, path in [
        ("put", "/admin/v2/persistent/{tenant}/{namespace}/{topic}/partitions"),
        ("post", "/admin/v2/persistent/{tenant}/{namespace}/{topic}/partitions"),
        ("post", "/admin/v2/namespaces/{tenant}/{namespace}/deduplication"),
        ("post", "/admin/v2/persistent/{tenant}/{namespace}/{topic}/subscription/{subName}/resetcursor/{timestamp}"),
        ("post", "/admin/v2/persistent/{tenant}/{namespace}/{topic}/subscription/{subName}/skip_all"),
        ("post", "/admin/v2/persistent/{tenant}/{namespace}/{topic}/subscription/{subName}/skip/{numMessages}"),
        ("get", "/admin/v2/persistent/{tenant}/{namespace}/{topic}/subscription/{subName}/properties"),
        ("put", "/admin/v2/persistent/{tenant}/{namespace}/{topic}/subscription/{subName}/properties"),
        ("get", "/admin/v2/persistent/{tenant}/{namespace}/{topic}/internalStats"),
        ("get", "/admin/v3/transactions/coordinatorStats"),
        ("get", "/admin/v3/transactions/transactionMetadata/{mostSigBits}/{leastSigBits}"),
        ("get", "/admin/v3/transactions/slowTransactions/{timeout}"),
        ("post", "/admin/v3/transactions/abortTransaction/{mostSigBits}/{leastSigBits}"),
    ]:
        assert method in paths[path], (method, path)


async def test_an_unknown_path_or_method_is_a_json_error_with_the_allowed_methods(api):
    reply = await api.get("/admin/v2/no-such-resource")
    assert reply.status == 404
    assert reply.headers["Content-Type"].startswith("application/json")
    assert reply.body == {"reason": "no admin resource at /admin/v2/no-such-resource"}
    reply = await api.call("PATCH", "/admin/v2/namespaces/public/default/retention")
    assert reply.status == 405
    assert reply.headers["Content-Type"].startswith("application/json")
    assert reply.body["reason"].startswith("PATCH is not allowed on /admin/v2/namespaces/public/default/retention")
    assert {m.strip() for m in reply.headers["Allow"].split(",")} >= {"GET", "POST", "DELETE"}
