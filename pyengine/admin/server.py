"""The admin HTTP server: Pulsar's admin REST paths, `/openapi.json` and `/metrics` on aiohttp.

    server = AdminServer(service, host="127.0.0.1", port=0)    # 0: any free port
    await server.start()
    print(server.port)
    ...
    await server.stop()

Every reply that is not a success is JSON `{"reason": "..."}`, also for an unknown path (404),
a method the path does not have (405, with `Allow`), a body too large (413) or a failure of
the server itself (500, logged): bad input never takes the server down.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from aiohttp import web

from pyengine.admin import (
    metrics,
    openapi,
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
from pyengine.admin.routing import Route, aiohttp_handler
from pyengine.broker.service import BrokerService
from pyengine.errors import PulsarError

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 1 << 20
ROUTE_TABLES = (routes_tenants.routes, routes_namespaces.routes, routes_topics.routes, routes_subscriptions.routes,
                routes_transactions.routes, routes_transaction_keys.routes, routes_scalable.routes,
                routes_schemas.routes, metrics.routes,
                openapi.routes)


def all_routes() -> list[Route]:
    return [route for table in ROUTE_TABLES for route in table.routes]


@web.middleware
async def json_errors(request: web.Request,
                      handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> web.StreamResponse:
    try:
        return await handler(request)
    except web.HTTPException as exc:        # aiohttp's own: no such path, method, body too large
        if exc.status < 400:
            raise
        return error_response(exc.status, _http_reason(request, exc), headers=_kept_headers(exc))
    except (AdminError, PulsarError, ValueError) as exc:
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
