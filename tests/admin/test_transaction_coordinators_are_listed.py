"""`GET /admin/v3/transactions/coordinators` is Pulsar's listCoordinators (`pulsar-admin
transactions list`): every coordinator id with the broker serving it. It was missing (404)."""

from __future__ import annotations

from pyengine.transaction.coordinator.metadata_records import V5_COORDINATOR_ID

TX = "/admin/v3/transactions"


async def test_every_coordinator_is_listed_with_its_broker(api, service):
    reply = await api.get(f"{TX}/coordinators")
    assert reply.status == 200, reply
    # the same coordinators as coordinatorStats lists
    assert sorted(reply.body) == sorted((await api.get(f"{TX}/coordinatorStats")).body)
    # not the v5 one: Pulsar's admin client reads the keys as Java ints, which 5 << 32 overflows
    assert sorted(reply.body) == ["0", "1"] and str(V5_COORDINATOR_ID) not in reply.body
    for cid, info in reply.body.items():
        assert info == {"id": int(cid), "brokerServiceUrl": service.service_url}
