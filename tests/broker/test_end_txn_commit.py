"""END_TXN's storage path: the coordinator's decision and the partitions' commit markers are
written by one group commit (the markers are conditional on the decision, never durable
without it), and a decision that cannot be written leaves nothing applied anywhere."""

import asyncio
import contextlib

import pytest

from pyengine.broker import Broker
from pyengine.errors import PersistenceError
from pyengine.transaction import TxnAction, TxnStatus
from tests.broker.helpers import GatedWriter, drain

T = "persistent://public/default/end-txn"


@contextlib.asynccontextmanager
async def one_sent_txn(tmp_path):
    """A broker, a consumer of T, and a txn whose one message to T is durable (nothing else
    is in flight)."""
    async with Broker.embedded(tmp_path) as broker:
        producer = await broker.create_producer(T)
        consumer = await broker.subscribe(T, "s", initial_position="earliest")
        txn = await broker.new_transaction()
        await producer.send(b"m", txn=txn)
        await broker.service.env.barrier()
        yield broker, consumer, txn


async def test_the_decision_and_the_marker_share_one_group_commit(tmp_path):
    async with one_sent_txn(tmp_path) as (broker, consumer, txn):
        gate = GatedWriter(broker.service.env)
        try:
            commit = asyncio.ensure_future(txn.commit())
            await gate.next_commit()
            gate.let_through()                       # exactly one group commit
            # The caller is answered once decision and marker are durable: one commit did both
            # (the terminal record comes after the answer).
            await asyncio.wait_for(asyncio.shield(commit), 5)
            assert broker.service.coordinator.get(txn.txn_id).status in (TxnStatus.COMMITTING,
                                                                          TxnStatus.COMMITTED)
            assert [m.data for m in await drain(consumer)] == [b"m"]
        finally:
            gate.open()


async def test_a_decision_that_cannot_be_written_applies_nothing(tmp_path):
    async with one_sent_txn(tmp_path) as (broker, consumer, txn):
        env = broker.service.env
        original, failed = env._write_batch, []

        def fail_once(writes):
            if not failed:
                failed.append(len(writes))
                raise OSError(5, "injected I/O error")
            return original(writes)

        env._write_batch = fail_once
        try:
            with pytest.raises(PersistenceError, match="injected"):
                await txn.commit()
        finally:
            env._write_batch = original
        coordinator = broker.service.coordinator
        assert failed and coordinator.get(txn.txn_id).status == TxnStatus.OPEN
        topic = await broker.service.get_topic(T)
        assert txn.txn_id in {t for t, _ in topic.buffer.ongoing_txns()}
        assert [e for e in topic.ledger.read_entries(topic.ledger.first_position(), 10) if e.is_marker] == []
        assert await drain(consumer) == []
        # Nothing was decided: the same commit can be asked again, and goes through.
        assert await coordinator.end_transaction(txn.txn_id, TxnAction.COMMIT) == TxnStatus.COMMITTED
        assert [m.data for m in await drain(consumer)] == [b"m"]
