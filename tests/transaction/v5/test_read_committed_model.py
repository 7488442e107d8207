"""The v4 READ_COMMITTED stateful model (tests/broker/test_read_committed_model.py), unchanged,
against v5: a segment:// topic, transactions of the v5 coordinator, decisions reaching the
participants through the header watch. The engine must give the same answers."""

from __future__ import annotations

import asyncio
import os

from hypothesis import HealthCheck, settings

from pyengine.broker.embedded import EmbeddedTransaction
from tests.broker.test_read_committed_model import SUB, ReadCommittedMachine


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
        """Decisions travel by watch: wait until every participant applied them."""
        service = self.broker.service
        topic = service.topics[self.topic]
        pending_ack = topic.subscriptions[SUB].pending_ack
        ended = {self.handles[label].txn_id for label, state in self.model.txns.items() if state != "open"}
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 10
        while (any(txn in service.v5.headers._listeners for txn in ended)
               or topic.buffer._materialising or pending_ack._deciding):
            assert loop.time() < deadline, "v5 decisions were not materialised in 10 s"
            await asyncio.sleep(0.001)


V5ReadCommittedMachine.TestCase.settings = settings(
    max_examples=int(os.environ.get("MODEL_EXAMPLES", 10)), stateful_step_count=25, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
test_v5_read_committed_model = V5ReadCommittedMachine.TestCase
