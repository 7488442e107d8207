"""A name in an admin path whose percent-escapes do not decode as UTF-8 (`%ff`, an encoded
lone surrogate) is not a valid name: 412, and nothing is created under a look-alike name.
(The web framework leaves such escapes undecoded, so `%ff` would otherwise reach the broker
as the three characters `%FF`, the name `%25FF` spells.)"""

from __future__ import annotations

import pytest

P = "/admin/v2/persistent/public/default"


@pytest.mark.parametrize("escaped", ["%ff", "%ED%A0%80", "ok%C3", "%E9t%E9"])
async def test_a_topic_name_that_is_not_utf8_is_refused_and_creates_nothing(api, service, escaped):
    reply = await api.put(f"{P}/{escaped}")
    assert reply.status == 412 and "UTF-8" in reply.body["reason"], reply.body
    assert (await api.get(P)).body == []
    assert (await api.put(f"{P}/{escaped}/partitions", 2)).status == 412
    assert (await api.get(f"{P}/partitioned")).body == []


async def test_the_look_alike_name_stays_apart(api):
    assert (await api.put(f"{P}/%25FF")).status == 204           # a topic really named "%FF"
    assert (await api.get(P)).body == ["persistent://public/default/%FF"]
    assert (await api.get(f"{P}/%25FF/stats")).status == 200
    assert (await api.get(f"{P}/%ff/stats")).status == 412       # not that topic
    assert (await api.delete(f"{P}/%ff")).status == 412
    assert (await api.get(P)).body == ["persistent://public/default/%FF"]


async def test_a_subscription_name_that_is_not_utf8_is_refused(api):
    assert (await api.put(f"{P}/t")).status == 204
    assert (await api.put(f"{P}/t/subscription/%ff")).status == 412
    assert (await api.put(f"{P}/t/subscription/caf%C3%A9")).status == 204    # proper UTF-8 is fine
    assert (await api.get(f"{P}/t/subscriptions")).body == ["café"]
