"""Every route of the OpenAPI document, every method, against malformed input: path values,
query parameters and bodies that are wrong in type, range, encoding or syntax. Each request
is answered with a JSON error carrying a `reason` (4xx) or succeeds; none is a server error.

The routes come from `/openapi.json`, so a route added later is swept as well."""

from __future__ import annotations

import itertools
import re

# Names the sweep creates first, so that some requests reach past "not found" into the
# handlers' own checks of the other values.
REAL = {"tenant": "t1", "namespace": "n1", "topic": "top", "subscription": "s1", "subName": "s1"}

PATH_VALUES = ["x", "-1", "0", "99999999999999999999", "%00", "%FF", "%2F", "..", "a%20b", "%C3%BC",
               "a" * 300, "1:2:3", "(1,2)", "%25", "persistent", "true", "1.5"]

QUERY_VALUES = ["", "x", "-1", "99999999999999999999", "maybe", "%00", "1.5", "[1]", "%FF"]

BODIES = [None, "x", "{", "[]", "{}", "null", "1e999", '"text"', "[1,2]", '{"a":1}', "-1", "true",
          '{"partitions": "x"}', '{"allowedClusters": 5}', '{"numPartitions": -3}', "1" * 400, "\udcff"]


def requests(document: dict):
    """(method, url, body) for each route and method: each body once, with path and query
    values rotating through their lists (and real names on every third)."""
    for path, methods in sorted(document["paths"].items()):
        names = re.findall(r"\{([^}]+)\}", path)
        for method, operation in sorted(methods.items()):
            queries = [p["name"] for p in operation.get("parameters", []) if p.get("in") == "query"]
            for case, body in enumerate(BODIES):
                url = path
                for slot, name in enumerate(names):
                    real = REAL.get(name)
                    value = real if real is not None and (case + slot) % 3 == 0 else \
                        PATH_VALUES[(case * 7 + slot * 3) % len(PATH_VALUES)]
                    url = url.replace("{" + name + "}", value)
                if queries:
                    url += "?" + "&".join(f"{name}={QUERY_VALUES[(case + slot) % len(QUERY_VALUES)]}"
                                          for slot, name in enumerate(queries))
                yield method.upper(), url, body, operation


def json_reply(operation: dict, status: int) -> bool:
    """Whether the route documents a JSON body for `status` (a route that documents no body
    for it, or none at all, is held to JSON too)."""
    responses = operation.get("responses", {})
    media = set(responses.get(str(status), {}).get("content", {}))
    return not media or "application/json" in media


async def test_no_route_answers_malformed_input_with_a_server_error(api):
    await api.put("/admin/v2/tenants/t1", {"allowedClusters": ["standalone"]})
    await api.put("/admin/v2/namespaces/t1/n1")
    await api.put("/admin/v2/persistent/t1/n1/top")
    await api.put("/admin/v2/persistent/t1/n1/top/subscription/s1")
    document = (await api.get("/openapi.json")).body
    wrong, sent = [], 0
    for method, url, body, operation in requests(document):
        sent += 1
        reply = await api.call(method, url, raw=body.encode("utf-8", "surrogateescape") if body else None)
        if reply.status >= 500:
            wrong.append((method, url, body, reply.status, reply.body))
        elif reply.status >= 400 and not (isinstance(reply.body, dict) and "reason" in reply.body):
            wrong.append((method, url, body, reply.status, "not a JSON error with a reason", reply.body))
        elif json_reply(operation, reply.status) and reply.body is not None and \
                not reply.headers.get("Content-Type", "").startswith("application/json"):
            wrong.append((method, url, body, reply.status, "not JSON", reply.headers.get("Content-Type")))
    assert sent > 1000          # the document was read: every route was swept
    assert wrong == [], "\n".join(map(repr, itertools.islice(wrong, 20)))
    # The broker still answers, and what was created before the sweep is readable.
    assert (await api.get("/admin/v2/tenants")).status == 200
