"""The admin API's route table. Each route says once what it is — method, path, parameters,
request body, replies — and everything else follows from that: the server registers it and
checks every request against it before the handler runs, and `openapi.py` publishes it.

A handler receives a `Call` (the checked parameters and body) and returns the reply body:
None is 204 No Content (Pulsar's answer to a successful change), anything else is 200 JSON,
and a ready `web.Response` is sent as it is.
"""

from __future__ import annotations

import re
import urllib.parse
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import Any

from aiohttp import web

from pyengine.admin.errors import BAD_REQUEST, AdminError
from pyengine.admin.validation import INVALID_STATUS, check, from_text, parse_json
from pyengine.broker.service import BrokerService

_PATH_PARAM = re.compile(r"{(\w+)}")


@dataclass(frozen=True)
class Param:
    """A path or query parameter."""

    name: str
    schema: dict[str, Any]
    description: str
    location: str = "query"
    required: bool = False
    default: Any = None


@dataclass(frozen=True)
class Reply:
    """One documented answer: its status description and body schema (None: no body)."""

    description: str
    schema: dict[str, Any] | None = None
    media_type: str = "application/json"


@dataclass
class Call:
    """One request, checked against its route."""

    service: BrokerService
    params: dict[str, Any]
    body: Any
    request: web.Request

    def __getitem__(self, name: str) -> Any:
        return self.params[name]


Handler = Callable[[Call], Awaitable[Any]]


@dataclass(frozen=True)
class Route:
    method: str
    path: str
    handler: Handler
    summary: str
    tag: str
    params: tuple[Param, ...]
    body: dict[str, Any] | None
    body_required: bool
    replies: dict[int, Reply]
    alias_of: str | None = None        # another path this one also serves (same handler)

    @property
    def operation_id(self) -> str:
        if self.alias_of is None:
            return self.handler.__name__
        version = next((part for part in self.path.split("/") if re.fullmatch(r"v\d+", part)), "alias")
        return f"{self.handler.__name__}_{version}"

    def aliased(self, old_prefix: str, new_prefix: str) -> Route:
        """This route also served under `new_prefix` in place of `old_prefix`."""
        assert self.path.startswith(old_prefix)
        return replace(self, path=new_prefix + self.path[len(old_prefix):], alias_of=self.path,
                       summary=f"{self.summary} (also at {self.path})")


@dataclass
class RouteTable:
    """The routes of one area of the API (one OpenAPI tag)."""

    tag: str
    routes: list[Route] = field(default_factory=list)

    def add(self, method: str, path: str, *, summary: str, params: tuple[Param, ...] = (),
            body: dict[str, Any] | None = None, body_required: bool = False,
            replies: dict[int, Reply]) -> Callable[[Handler], Handler]:
        declared = {p.name for p in params if p.location == "path"}
        in_path = set(_PATH_PARAM.findall(path))
        if declared != in_path:
            raise ValueError(f"{method} {path}: path parameters {sorted(in_path)} declared as {sorted(declared)}")

        if BAD_REQUEST not in replies and any(p.location == "query" and p.schema.get("type") in ("boolean", "integer")
                                              for p in params):
            # a malformed typed query parameter is answered 400 before the handler runs
            replies = {**replies, BAD_REQUEST: Reply("Malformed request: a query parameter of the wrong type",
                                                     {"$ref": "#/components/schemas/ErrorData"})}

        def register(handler: Handler) -> Handler:
            self.routes.append(Route(method, path, handler, summary, self.tag, params, body, body_required,
                                     replies))
            return handler

        return register


def aiohttp_handler(route: Route, service: BrokerService) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    """The aiohttp handler of `route`: check the request, call the route's handler, reply."""

    async def handle(request: web.Request) -> web.StreamResponse:
        _check_path_escapes(route, request)
        params = {}
        for param in route.params:
            source = request.match_info if param.location == "path" else request.query
            text = source.get(param.name)
            if text is None:
                if param.required:
                    raise AdminError(BAD_REQUEST, f"missing {param.location} parameter {param.name!r}")
                params[param.name] = param.default
            else:
                params[param.name] = from_text(text, param.schema, f"{param.location} parameter {param.name!r}")
        body = None
        if route.body is not None:
            raw = await request.read()
            if raw.strip():
                body = parse_json(raw)
                check(body, route.body, "body")
            elif route.body_required:
                raise AdminError(BAD_REQUEST, "body: a JSON body is required")
        result = await route.handler(Call(service, params, body, request))
        if isinstance(result, web.StreamResponse):
            return result
        if result is None:
            return web.Response(status=204)
        return web.json_response(result)

    return handle


def _check_path_escapes(route: Route, request: web.Request) -> None:
    """Refuse a path parameter whose percent-escapes do not decode as UTF-8 (`%ff`, an encoded
    lone surrogate). aiohttp leaves such escapes as they are, so `%ff` would reach the handler
    as the text `%FF`, the name `%25FF` spells: a look-alike of another name. Every path
    parameter is a whole segment of its route's path."""
    raw_segments = request.rel_url.raw_path.split("/")
    template = route.path.split("/")
    if len(raw_segments) != len(template):
        return
    for segment, raw in zip(template, raw_segments):
        name = segment[1:-1] if segment.startswith("{") and segment.endswith("}") else None
        if name is None or "%" not in raw:
            continue
        try:
            urllib.parse.unquote_to_bytes(raw).decode("utf-8")
        except UnicodeDecodeError:
            param = next((p for p in route.params if p.name == name and p.location == "path"), None)
            status = param.schema.get(INVALID_STATUS, BAD_REQUEST) if param is not None else BAD_REQUEST
            raise AdminError(status, f"path parameter {name!r}: {raw[:60]!r} is not valid UTF-8 "
                                     "once percent-decoded") from None
