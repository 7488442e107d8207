"""A broker shutting down while the metadata store refuses a write still lets go of every
topic it leads. Found by an audit: a controller whose resignation failed (its election record
not deleted) ended the service's close at once, so the other controllers were never closed
and the metadata session never closed: kept alive, it kept every leader record of the broker
in the store, and no other broker could take those topics over."""

from __future__ import annotations

from pyengine.metadata import LeaderState, MetadataStoreError

TOPICS = ["topic://public/default/t1", "topic://public/default/t2"]


async def test_a_failed_resignation_does_not_stop_the_close(services):
    service = await services("a")
    controllers = []
    for topic in TOPICS:
        await service.create_topic(topic, 1)
        controllers.append(await service.controller(topic))
        await controllers[-1].wait_leading(2)
    store, delete, failures = service.store, service.store.delete, [MetadataStoreError("etcd is unreachable")]

    async def flaky(path, *args, **kwargs):
        if path.endswith("/controller") and failures:
            raise failures.pop()
        return await delete(path, *args, **kwargs)
    store.delete = flaky
    await service.close()
    assert not failures
    assert [c.election.state for c in controllers] == [LeaderState.NO_LEADER] * 2
    assert not service._session.alive
    for topic in TOPICS:
        assert await service.leader_url(topic) is None      # gone with the session
