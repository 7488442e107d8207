"""HEAD on any resource that answers GET: the GET's status and headers without its body, as
Pulsar's admin (Jersey answers HEAD for every GET resource). It was 405 everywhere, which
broke health checks and tools that probe a resource with HEAD before fetching it."""

from __future__ import annotations


async def test_head_answers_as_the_get_without_the_body(api) -> None:
    for path in ("/admin/v2/tenants", "/admin/v2/persistent/public/default", "/metrics"):
        got, head = await api.get(path), await api.call("HEAD", path)
        assert got.status == head.status == 200, (path, got.status, head.status)
        assert head.body is None
        assert head.headers["Content-Type"] == got.headers["Content-Type"]


async def test_head_of_a_missing_resource_is_its_get_status(api) -> None:
    path = "/admin/v2/persistent/public/default/nothing-here/stats"
    got, head = await api.get(path), await api.call("HEAD", path)
    assert got.status == head.status == 404
    assert head.body is None


async def test_head_where_no_get_is_still_405(api) -> None:
    head = await api.call("HEAD", "/admin/v2/persistent/public/default/t/unload")     # PUT only
    assert head.status == 405 and "GET" not in head.headers["Allow"]
