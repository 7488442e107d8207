"""Which design serves a topic: segment:// v5, persistent:// v4, and a namespace override
(REST `/admin/v2/namespaces/{tenant}/{namespace}/transactionVersion`) for migration and
debugging; malformed overrides are refused."""

from __future__ import annotations

from pyengine.transaction.buffer.metadata_buffer import MetadataTransactionBuffer
from pyengine.transaction.buffer.topic_buffer import TopicTransactionBuffer
from pyengine.transaction.pendingack.handle import PendingAckHandleImpl
from pyengine.transaction.pendingack.metadata_store import MetadataPendingAckHandle
from tests.admin.conftest import api, server, service  # noqa: F401  (fixtures)

PATH = "/admin/v2/namespaces/public/{ns}/transactionVersion"


async def design(service, topic: str) -> tuple[type, type]:
    loaded = await service.get_topic(topic)
    subscription = await loaded.open_subscription("s")
    designs = type(loaded.buffer), type(subscription.pending_ack)
    await service.delete_topic(topic)
    return designs


async def test_domain_defaults_and_namespace_override(api, service):
    assert await design(service, "segment://public/default/a/0000-ffff-0") == \
        (MetadataTransactionBuffer, MetadataPendingAckHandle)
    assert await design(service, "persistent://public/default/a") == (TopicTransactionBuffer, PendingAckHandleImpl)
    assert (await api.get(PATH.format(ns="default"))).status == 204
    await service.policies.create_namespace("public/migrating")
    assert (await api.post(PATH.format(ns="migrating"), 4)).status == 204
    assert (await api.get(PATH.format(ns="migrating"))).body == 4
    assert await design(service, "segment://public/migrating/a/0000-ffff-0") == \
        (TopicTransactionBuffer, PendingAckHandleImpl)
    assert (await api.post(PATH.format(ns="migrating"), 5)).status == 204
    assert await design(service, "persistent://public/migrating/b") == \
        (MetadataTransactionBuffer, MetadataPendingAckHandle)
    assert (await api.delete(PATH.format(ns="migrating"))).status == 204
    assert await design(service, "persistent://public/migrating/c") == (TopicTransactionBuffer, PendingAckHandleImpl)


async def test_malformed_overrides_are_refused(api, service):
    for body in (3, 6, "5", True, None, [5], 4.5):
        reply = await api.post(PATH.format(ns="default"), body)
        assert reply.status == 400, (body, reply)
    assert (await api.post(PATH.format(ns="default"), raw="{not json")).status == 400
    assert (await api.post(PATH.format(ns="nope"), 5)).status == 404
    assert (await api.get(PATH.format(ns="nope"))).status == 404
    assert service.policies.policies("public/default").transaction_version is None


async def test_v5_requests_before_the_broker_started_are_not_ready(tmp_path):
    import pytest

    from pyengine.broker.service import BrokerConfig, BrokerService
    from pyengine.errors import ServiceNotReadyError
    from pyengine.transaction import TxnAction
    from pyengine.transaction.coordinator.metadata_records import V5_COORDINATOR_ID
    from pyengine_kernels import TxnId

    broker = BrokerService(BrokerConfig(data_dir=tmp_path / "data", sync=False))
    try:
        assert not broker.coordinator.serves(V5_COORDINATOR_ID)
        with pytest.raises(ServiceNotReadyError):
            await broker.coordinator.new_transaction(V5_COORDINATOR_ID, 1000)
        with pytest.raises(ServiceNotReadyError):
            await broker.coordinator.end_transaction(TxnId(V5_COORDINATOR_ID, 1), TxnAction.COMMIT)
    finally:
        await broker.close()
