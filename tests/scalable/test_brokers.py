"""Two brokers in one process on one metadata store: admin requests reaching the follower are
forwarded to the controller leader, which operates on segments the other broker owns through
that broker's segments API."""

from __future__ import annotations

import aiohttp
import pytest

from pyengine.admin import AdminServer
from pyengine.broker.service import BrokerConfig, BrokerService
from pyengine.metadata.memory_store import MemoryMetadataStore

BASE = "/admin/v2/scalable/public/default/orders"


@pytest.fixture
async def cluster(tmp_path):
    store = await MemoryMetadataStore().start()
    brokers = []
    for name in ("a", "b"):
        service = BrokerService(BrokerConfig(data_dir=tmp_path / name, sync=False, num_coordinators=1,
                                             metadata_store=store))
        await service.start()
        admin = AdminServer(service, port=0)
        await admin.start()
        service.service_url = f"pulsar://{name}:6650"
        service.web_service_url = admin.url
        brokers.append((service, admin))
    async with aiohttp.ClientSession() as http:
        yield brokers, http
    for service, admin in brokers:
        await admin.stop()
        await service.close()
    await store.close()


async def test_requests_to_the_follower_reach_the_leader(cluster):
    (a, a_admin), (b, b_admin), http = *cluster[0], cluster[1]
    async with http.put(f"{b_admin.url}{BASE}?numInitialSegments=2") as reply:        # segments on b
        assert reply.status == 204
    leader = await (await a.scalable_topics()).controller("topic://public/default/orders")
    assert leader.is_leader
    follower = await (await b.scalable_topics()).controller("topic://public/default/orders")
    assert not follower.is_leader
    async with http.put(f"{b_admin.url}{BASE}/subscriptions/sub") as reply:
        assert reply.status == 204
    async with http.post(f"{b_admin.url}{BASE}/split/0") as reply:                     # forwarded to a
        assert reply.status == 204, await reply.text()
    async with http.post(f"{b_admin.url}{BASE}/split/99") as reply:                    # a's refusal, relayed
        assert reply.status == 404 and "not found" in (await reply.json())["reason"]
    layout = (await a.scalable_topics()).get_layout
    assert [s.segment_id for s in (await layout("topic://public/default/orders")).active_segments] == [2, 3, 1]
    # the children were created beside their parent, on b, with the subscription; a holds none
    for child in ("segment://public/default/orders/0000-3fff-2", "segment://public/default/orders/4000-7fff-3"):
        assert list((await b.get_topic(child, create=False)).subscriptions) == ["sub"]
        assert not a.topic_exists(child)
    assert (await b.get_topic("segment://public/default/orders/0000-7fff-0", create=False)).ledger.terminated_at
    async with http.get(f"{a_admin.url}{BASE}/stats") as reply:                        # a reads b's segments
        stats = await reply.json()
    assert stats["segments"]["2"]["subscriptions"] == {"sub": {"msgBacklog": 0}}
    assert stats["segments"]["0"]["terminated"] is True
    await b_admin.stop()                         # b's segments API is away: a still reports the rest
    async with http.get(f"{a_admin.url}{BASE}/stats") as reply:
        stats = await reply.json()
    assert reply.status == 200 and "unreachable" in stats["segments"]["2"]["unavailable"]
    async with http.post(f"{a_admin.url}{BASE}/split/2") as reply:                     # cannot seal b's segment
        assert reply.status == 503 and "unreachable" in (await reply.json())["reason"]
    await b_admin.start()
    b.web_service_url = b_admin.url
    await (await b.scalable_topics()).resources.register_broker(b.service_url, b_admin.url,
                                                                (await b.scalable_topics())._session)
    async with http.delete(f"{b_admin.url}{BASE}/subscriptions/sub") as reply:
        assert reply.status == 204
    async with http.post(f"{b_admin.url}{BASE}/split/2") as reply:       # the failed split left nothing behind
        assert reply.status == 204
    assert "sub" not in (await b.get_topic("segment://public/default/orders/0000-3fff-2", create=False)).subscriptions
    async with http.delete(f"{a_admin.url}{BASE}") as reply:                           # a deletes b's segments
        assert reply.status == 204
    assert not [t for t in b.list_topics() if t.startswith("segment://")]
