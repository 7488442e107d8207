"""A topic:// name (a scalable topic, PIP-468) has no ledger: the broker refuses to load it, so
no end of a transaction could ever reach it. The coordinator used to register it anyway; the
commit then repeated END_TXN_ON_PARTITION / _ON_SUBSCRIPTION forever (NotAllowedError each
time): END_TXN was never answered, the txn stayed COMMITTING across restarts and held its
coordinator's low watermark back for good. Its registration is refused instead (the client
registers the topic's segment:// topics)."""

import asyncio

import pytest

from pyengine.broker.service import BrokerConfig, BrokerService
from pyengine.errors import NotAllowedError
from pyengine.transaction import TxnAction, TxnStatus

SCALABLE = "topic://public/default/orders"
PLAIN = "persistent://public/default/plain"


@pytest.fixture
async def broker(tmp_path):
    service = BrokerService(BrokerConfig(data_dir=tmp_path / "data", sync=False, num_coordinators=2))
    await service.start()
    yield service
    await service.close()


async def test_a_scalable_topic_is_refused_and_the_txn_still_commits(broker):
    coordinator = broker.coordinator_v4
    txn = await coordinator.new_transaction(0, 60_000)
    with pytest.raises(NotAllowedError, match="scalable topic"):
        await coordinator.add_produced_partitions(txn, [SCALABLE])
    with pytest.raises(NotAllowedError, match="scalable topic"):
        await coordinator.add_acked_subscriptions(txn, [(SCALABLE, "sub")])
    await coordinator.add_produced_partitions(txn, [PLAIN])
    assert coordinator.get(txn).partitions == [PLAIN] and coordinator.get(txn).subscriptions == []
    status = await asyncio.wait_for(coordinator.end_transaction(txn, TxnAction.COMMIT), 5)
    assert status == TxnStatus.COMMITTED
