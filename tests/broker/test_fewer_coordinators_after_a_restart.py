"""A broker restarted with fewer transaction coordinators than its data dir ran keeps them all,
as Pulsar never shrinks transaction_coordinator_assign: the open txns of a coordinator left
out would never end (nor time out), and the read horizon of their topics would stay behind
them for good."""

from pyengine.broker import Broker
from pyengine.broker.policies import TC_ASSIGN_TOPIC
from pyengine.transaction import TxnAction

TOPIC = "persistent://public/default/orders"


async def test_the_coordinators_of_a_data_dir_are_all_kept(tmp_path):
    async with Broker.embedded(tmp_path, num_coordinators=4) as broker:
        producer = await broker.create_producer(TOPIC)
        txns = [await broker.new_transaction(timeout_ms=600_000) for _ in range(4)]
        assert {txn.txn_id.most_bits for txn in txns} == {0, 1, 2, 3}
        for txn in txns:
            await producer.send(b"open", txn=txn)
    async with Broker.embedded(tmp_path, num_coordinators=1) as broker:
        service = broker.service
        assert service.coordinator_v4.coordinator_ids == [0, 1, 2, 3]
        assert service.policies.partitions(TC_ASSIGN_TOPIC) == 4
        for txn in txns:        # each can still be ended, so the read horizon moves on
            await service.coordinator.end_transaction(txn.txn_id, TxnAction.ABORT)
        await (await broker.create_producer(TOPIC)).send(b"plain")
        consumer = await broker.subscribe(TOPIC, "s", initial_position="earliest")
        assert (await consumer.receive()).data == b"plain"
