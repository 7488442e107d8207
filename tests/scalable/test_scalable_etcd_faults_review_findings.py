"""Review of scalable topics on the etcd metadata store under faults: a broker whose metadata
session (etcd lease) ended while it kept running, as after a network partition longer than
the session ttl."""

from __future__ import annotations

import asyncio
import uuid

from aetcd import rpc

from pyengine.admin import AdminServer
from pyengine.broker.service import BrokerConfig, BrokerService
from pyengine.metadata.etcd_store import EtcdMetadataStore
from tests.metadata.conftest import etcd_server  # noqa: F401  (fixture)

TOPIC = "topic://public/default/orders"


async def test_a_broker_whose_session_expired_registers_again(etcd_server, tmp_path):
    """Broker a owns the segments, broker b leads the topic. a's session ended (its lease
    expired in etcd) while a kept running: its ephemeral registration went with it, and was
    written again only when a created a new controller - never, on a broker that holds
    segments but no controller. For good, every other broker took a for "not running": the
    leader's split of a's segment failed with ServiceNotReadyError at each retry."""
    root = f"/reg-{uuid.uuid4().hex[:8]}"
    brokers = []
    try:
        for name in ("a", "b"):
            store = await EtcdMetadataStore(etcd_server.host, etcd_server.port, root=root).start()
            service = BrokerService(BrokerConfig(data_dir=tmp_path / name, sync=False, num_coordinators=1,
                                                 metadata_store=store, scalable_session_ttl=1.0))
            await service.start()
            admin = AdminServer(service, port=0)
            await admin.start()
            service.service_url = f"pulsar://{name}:6650"
            service.web_service_url = admin.url
            brokers.append((service, admin, store))
        (a, _, _), (b, _, b_store) = brokers
        on_a, on_b = await a.scalable_topics(), await b.scalable_topics()
        await on_a.create_topic(TOPIC, 2)                   # the segments are a's
        assert (await on_b.controller(TOPIC)).is_leader
        # a's lease ends in etcd (what a partition longer than the ttl does)
        session = on_a._session
        await b_store._rpc(b_store.client.leasestub.LeaseRevoke, rpc.LeaseRevokeRequest(ID=session.id), "revoke")
        await asyncio.wait_for(session.wait_ended(), 5)
        for _ in range(200):
            if await on_b.resources.web_service_url(a.service_url) is not None:
                break
            await asyncio.sleep(0.025)
        else:
            raise AssertionError("broker a never registered again after its session ended")
        layout = await asyncio.wait_for(on_b.split_segment(TOPIC, 0), 10)
        assert sorted(s.segment_id for s in layout.active_segments) == [1, 2, 3]
    finally:
        for service, admin, store in brokers:
            await admin.stop()
            await service.close()
            await store.close()
