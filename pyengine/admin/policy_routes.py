"""The routes of one policy of a resource (a namespace's, a topic's), declared at once: GET it,
set it, DELETE it (unset: the next level's applies)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from pyengine.admin.routing import Call, Param, Reply, RouteTable
from pyengine.admin.schemas import DONE, errors


def add_policy_routes(table: RouteTable, url: str, name: str, *, params: tuple[Param, ...], schema: dict[str, Any],
                      shown: str, not_set: str, summaries: tuple[str, str, str | None],
                      read: Callable[[Call], Any], store: Callable[[Call, Any], Awaitable[None]],
                      validate: Callable[[Any], Any] | None = None, query: Param | None = None,
                      get_params: tuple[Param, ...] = (), get_errors: tuple[int, ...] = (404, 412),
                      set_method: str = "POST") -> None:
    """Register at `url`: GET answering `read(call)` (204 `not_set` when None); `set_method`
    storing `validate(value)` (without `validate`, the value as it is), the value being the body
    (of `schema`) or, with `query`, that query parameter; DELETE storing None, unless its summary
    (the last of `summaries`) is None.
    The handlers are named get_<name>, set_<name> and remove_<name>: the OpenAPI operation ids."""
    get_summary, set_summary, remove_summary = summaries

    async def get(call: Call) -> Any:
        return read(call)

    async def set_(call: Call) -> None:
        value = call[query.name] if query is not None else call.body
        await store(call, validate(value) if validate is not None else value)

    async def remove(call: Call) -> None:
        await store(call, None)

    for handler, verb in ((get, "get"), (set_, "set"), (remove, "remove")):
        handler.__name__ = handler.__qualname__ = f"{verb}_{name}"
    table.add("GET", url, summary=get_summary, params=(*params, *get_params),
              replies={200: Reply(shown, schema), 204: Reply(not_set), **errors(*get_errors)})(get)
    body: dict[str, Any] = {} if query is not None else {"body": schema, "body_required": True}
    table.add(set_method, url, summary=set_summary, params=(*params, query) if query is not None else params,
              replies={204: DONE, **errors(400, 404, 412)}, **body)(set_)
    if remove_summary is not None:
        table.add("DELETE", url, summary=remove_summary, params=params,
                  replies={204: DONE, **errors(404, 412)})(remove)
