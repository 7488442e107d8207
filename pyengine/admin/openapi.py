"""The OpenAPI 3 document of the admin API, built from the route table (`GET /openapi.json`):
every route with its parameters, request body and replies, the same declarations the server
checks requests against."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from aiohttp import web

import pyengine
from pyengine.admin.routing import Call, Reply, Route, RouteTable
from pyengine.admin.schemas import COMPONENTS

OPENAPI_VERSION = "3.0.3"
DOCUMENT_PATH = "/openapi.json"
ROUTES = web.AppKey("routes", list)            # the application's routes, for the document

routes = RouteTable("meta")


def build_document(all_routes: Iterable[Route]) -> dict[str, Any]:
    paths: dict[str, dict[str, Any]] = {}
    for route in all_routes:
        operation: dict[str, Any] = {
            "operationId": route.operation_id,
            "summary": route.summary,
            "tags": [route.tag],
            "responses": {str(status): _reply(reply) for status, reply in sorted(route.replies.items())},
        }
        if route.params:
            operation["parameters"] = [
                {"name": p.name, "in": p.location, "required": p.location == "path" or p.required,
                 "description": p.description, "schema": p.schema}
                for p in route.params]
        if route.body is not None:
            operation["requestBody"] = {"required": route.body_required,
                                        "content": {"application/json": {"schema": route.body}}}
        paths.setdefault(route.path, {})[route.method.lower()] = operation
    return {
        "openapi": OPENAPI_VERSION,
        "info": {
            "title": "pyengine admin API",
            "version": pyengine.__version__,
            "description": "Pulsar's admin REST paths (/admin/v2, /admin/v3/transactions) as this broker "
                           "serves them, plus Prometheus metrics. Errors are {\"reason\": ...}.",
        },
        "paths": paths,
        "components": {"schemas": COMPONENTS},
    }


def _reply(reply: Reply) -> dict[str, Any]:
    described: dict[str, Any] = {"description": reply.description}
    if reply.schema is not None:
        described["content"] = {reply.media_type: {"schema": reply.schema}}
    return described


@routes.add("GET", DOCUMENT_PATH, summary="This document.",
            replies={200: Reply("OpenAPI 3 document", {"type": "object", "required": ["openapi", "paths"]})})
async def get_openapi_document(call: Call) -> dict[str, Any]:
    return build_document(call.request.app[ROUTES])
