"""The admin HTTP server: Pulsar's admin REST paths, `/openapi.json` and `/metrics` on aiohttp.

    server = AdminServer(service, host="127.0.0.1", port=0)    # 0: any free port
    await server.start()
    print(server.port)
    ...
    await server.stop()

Transaction keys are served at both `/admin/v2/transactions/transaction-keys` (the PIP's path) and
`/admin/v3/transactions/transaction-keys` (beside Pulsar's other transaction resources).
`GET /lookup/v2/topic/{domain}/{tenant}/{namespace}/{topic}` is Pulsar's HTTP lookup, so
`pulsar.Client("http://HOST:HTTP_PORT")` works as it does against a Pulsar broker.

Every reply that is not a success is JSON `{"reason": "..."}`, also for an unknown path (404),
a method the path does not have (405, with `Allow`), a body too large (413) or a failure of
the server itself (500, logged): bad input never takes the server down.
"""

from __future__ import annotations

import logging
import urllib.parse
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from pyengine.admin import (
    metrics,
    openapi,
    routes_backlog_quota,
    routes_brokers,
    routes_compaction,
    routes_limits,
    routes_messages,
    routes_namespaces,
    routes_scalable,
    routes_schemas,
    routes_subscriptions,
    routes_tenants,
    routes_topics,
    routes_transaction_keys,
    routes_transactions,
)
from pyengine.admin.errors import INTERNAL_ERROR, AdminError, error_response, status_of
from pyengine.admin.names import topic_name
from pyengine.admin.routing import Call, Param, Reply, Route, RouteTable, aiohttp_handler
from pyengine.admin.schemas import NAMESPACE, STRING_LIST, TENANT, TOPIC, errors
from pyengine.broker.service import BrokerService
from pyengine.errors import PulsarError
from pyengine.protocol.lookup import resolve_topic
from pyengine.storage.errors import LedgerClosedError

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 1 << 20

# Pulsar's HTTP lookup (what `pulsar.Client("http://HOST:PORT")` asks before it connects over
# the binary protocol) and the clusters list: one broker owns every topic, in one cluster.
lookup_routes = RouteTable("lookup")
DOMAIN = Param("domain", {"type": "string", "enum": ["persistent", "non-persistent"]},
               "topic domain", "path", required=True)
LOOKUP_DATA = {"type": "object", "properties": {name: {"type": "string", "nullable": True} for name in
                                                 ("brokerUrl", "brokerUrlTls", "httpUrl", "httpUrlTls", "nativeUrl")},
               "required": ["brokerUrl", "httpUrl"]}


@lookup_routes.add("GET", "/lookup/v2/topic/{domain}/{tenant}/{namespace}/{topic}",
                   summary="Look a topic up: the broker that serves it (this one).",
                   params=(DOMAIN, TENANT, NAMESPACE, TOPIC),
                   replies={200: Reply("LookupData", LOOKUP_DATA), **errors(404, 412)})
async def lookup_topic(call: Call) -> dict[str, Any]:
    topic = topic_name(call["tenant"], call["namespace"], call["topic"], call["domain"])
    resolve_topic(call.service, str(topic))            # 404 for a namespace that does not exist
    service_url = _reachable(call.service.service_url, call)
    return {"brokerUrl": service_url, "brokerUrlTls": None, "httpUrl": _reachable(call.service.web_service_url, call),
            "httpUrlTls": None, "nativeUrl": service_url}


def _reachable(url: str | None, call: Call) -> str | None:
    """`url` as the client can use it: a wildcard listening address (`--host 0.0.0.0`) is
    replaced by the host the client reached this request at."""
    if url is None:
        return None
    parts = urllib.parse.urlsplit(url)
    if parts.hostname not in ("0.0.0.0", "::") or not call.request.url.host:
        return url
    host = call.request.url.host
    host = f"[{host}]" if ":" in host else host
    return parts._replace(netloc=f"{host}:{parts.port}").geturl()


@lookup_routes.add("GET", "/admin/v2/clusters", summary="List the clusters (this broker's own).",
                   replies={200: Reply("Cluster names", STRING_LIST)})
async def list_clusters(call: Call) -> list[str]:
    return [call.service.config.cluster_name]


ROUTE_TABLES = (routes_tenants.routes, routes_namespaces.routes, routes_topics.routes, routes_subscriptions.routes,
                routes_messages.routes, routes_transactions.routes, routes_transaction_keys.routes,
                routes_scalable.routes, routes_schemas.routes, routes_compaction.routes, routes_limits.routes,
                routes_backlog_quota.routes, routes_brokers.routes, lookup_routes, metrics.routes,
                openapi.routes)


# Paths also served under a second prefix. The transaction-key PIP names
# `/admin/v2/transactions/transaction-keys`, while Pulsar's (and the design's) transactions
# resource is `/admin/v3/transactions/...`: a client may use either.
ALIASES = (("/admin/v2/transactions/transaction-keys", "/admin/v3/transactions/transaction-keys"),)


def all_routes() -> list[Route]:
    routes = [route for table in ROUTE_TABLES for route in table.routes]
    aliases = [route.aliased(old, new) for route in routes for old, new in ALIASES if route.path.startswith(old)]
    return routes + aliases


@web.middleware
async def json_errors(request: web.Request,
                      handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> web.StreamResponse:
    try:
        return await handler(request)
    except web.HTTPException as exc:        # aiohttp's own: no such path, method, body too large
        if exc.status < 400:
            raise
        return error_response(exc.status, _http_reason(request, exc), headers=_kept_headers(exc))
    except (AdminError, PulsarError, ValueError, LedgerClosedError) as exc:
        status = status_of(exc)
        if status == INTERNAL_ERROR:
            log.exception("admin %s %s failed", request.method, request.path)
        return error_response(status, str(exc) or type(exc).__name__)
    except Exception as exc:
        log.exception("admin %s %s failed", request.method, request.path)
        return error_response(INTERNAL_ERROR, f"{type(exc).__name__}: {exc}")


def _http_reason(request: web.Request, exc: web.HTTPException) -> str:
    if isinstance(exc, web.HTTPNotFound):
        return f"no admin resource at {request.path}"
    if isinstance(exc, web.HTTPMethodNotAllowed):
        return f"{request.method} is not allowed on {request.path} (allowed: {', '.join(sorted(exc.allowed_methods))})"
    return exc.reason


def _kept_headers(exc: web.HTTPException) -> dict[str, str]:
    return {"Allow": exc.headers["Allow"]} if "Allow" in exc.headers else {}


def build_app(service: BrokerService) -> web.Application:
    app = web.Application(middlewares=[json_errors], client_max_size=MAX_BODY_BYTES)
    routes = all_routes()
    app[openapi.ROUTES] = routes
    app[metrics.REGISTRY] = metrics.metrics_registry(service)
    for route in routes:
        if route.method == "GET":   # HEAD too, as Pulsar's Jersey answers it for every GET
            app.router.add_get(route.path, aiohttp_handler(route, service))
        else:
            app.router.add_route(route.method, route.path, aiohttp_handler(route, service))
    return app


class AdminServer:
    def __init__(self, service: BrokerService, host: str = "127.0.0.1", port: int = 8080) -> None:
        self.service = service
        self.host = host
        self.requested_port = port
        self.app = build_app(service)
        self._runner: web.AppRunner | None = None

    async def start(self) -> None:
        runner = web.AppRunner(self.app, access_log=None)
        await runner.setup()
        try:
            await web.TCPSite(runner, self.host, self.requested_port).start()
        except BaseException:
            await runner.cleanup()
            raise
        self._runner = runner
        log.info("admin API listening on http://%s:%d", self.host, self.port)

    @property
    def port(self) -> int:
        """The port listened on (the one the system picked when asked for 0)."""
        if self._runner is None:
            raise RuntimeError("the admin server is not started")
        return self._runner.addresses[0][1]

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    async def stop(self) -> None:
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.cleanup()
