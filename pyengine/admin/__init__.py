"""Admin REST API and metrics of the broker (the HTTP port of `pyengine serve`).

`AdminServer` (server.py) puts on aiohttp the Pulsar admin paths clients and tools use —
tenants, namespaces, persistent topics and subscriptions under `/admin/v2`, transactions under
`/admin/v3/transactions` (with the force-abort of a stuck transaction) — plus `/openapi.json`
(built from the route table) and `/metrics` (Prometheus). Routes live in one module per area.
"""

from pyengine.admin.server import AdminServer

__all__ = ["AdminServer"]
