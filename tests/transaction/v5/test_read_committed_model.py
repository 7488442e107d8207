"""The v4 READ_COMMITTED stateful models (tests/broker/test_read_committed_model.py), unchanged,
against v5: a segment:// topic, transactions of the v5 coordinator, decisions reaching the
participants through the header watch. The engine must give the same answers."""

from __future__ import annotations

import asyncio
import os

from hypothesis import HealthCheck, settings

from pyengine.broker.embedded import EmbeddedTransaction
from tests.broker.test_read_committed_model import SUB, ReadCommittedMachine, SharedBatchTxnMachine


async def settle_v5(machine) -> None:
    """Decisions travel by watch: wait until every participant applied them."""
    service = machine.broker.service
    topic = service.topics[machine.topic]
    pending_ack = topic.subscriptions[SUB].pending_ack
    ended = {machine.handles[label].txn_id for label, state in machine.model.txns.items() if state != "open"}
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 10
    while (any(txn in service.v5.headers._listeners for txn in ended)
           or topic.buffer._materialising or pending_ack._deciding):
        assert loop.time() < deadline, "v5 decisions were not materialised in 10 s"
        await asyncio.sleep(0.001)


class V5ReadCommittedMachine(ReadCommittedMachine):
    topic = "segment://public/default/model/0000-ffff-0"

    async def new_txn(self, timeout: int) -> EmbeddedTransaction:
        handle = await self.broker.new_transaction(timeout_ms=timeout, version=5)
        assert type(self.broker.service.topics[self.topic].buffer).__name__ == "MetadataTransactionBuffer"
        return handle

    async def expire(self) -> None:
        await self.broker.service.coordinator.v5.sweep_timeouts()

    async def ended(self, handle: EmbeddedTransaction) -> bool:
        return (await self.broker.service.coordinator.v5.get(handle.txn_id)).status.outcome is not None

    async def settle(self) -> None:
        await settle_v5(self)


V5ReadCommittedMachine.TestCase.settings = settings(
    max_examples=int(os.environ.get("MODEL_EXAMPLES", 10)), stateful_step_count=25, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
test_v5_read_committed_model = V5ReadCommittedMachine.TestCase


class V5SharedBatchTxnMachine(SharedBatchTxnMachine):
    topic = "segment://public/default/batch-model/0000-ffff-0"

    async def new_txn(self) -> EmbeddedTransaction:
        return await self.broker.new_transaction(version=5)

    async def settle(self) -> None:
        await settle_v5(self)


V5SharedBatchTxnMachine.TestCase.settings = settings(
    max_examples=int(os.environ.get("MODEL_EXAMPLES", 20)), stateful_step_count=25, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
test_v5_shared_batch_txn_model = V5SharedBatchTxnMachine.TestCase
