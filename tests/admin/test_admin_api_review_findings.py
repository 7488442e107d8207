"""Findings of a review of the admin REST API (transactions, scalable topics, validation,
OpenAPI, metrics): each test failed on the code as reviewed."""

from __future__ import annotations

SCALABLE = "/admin/v2/scalable/public/default"


async def test_a_scalable_topic_with_more_properties_than_published_is_refused(api):
    """The OpenAPI document says a scalable topic takes at most 100 properties (maxProperties),
    but the request check ignored that keyword: 150 were accepted and stored."""
    reply = await api.put(f"{SCALABLE}/many", {f"k{i}": "v" for i in range(150)})
    assert reply.status == 400 and "reason" in reply.body
    assert (await api.get(f"{SCALABLE}/many")).status == 404          # nothing created
    assert (await api.put(f"{SCALABLE}/enough", {f"k{i}": "v" for i in range(100)})).status == 204
