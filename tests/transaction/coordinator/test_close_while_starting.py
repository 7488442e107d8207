"""A coordinator service closed while start() recovers its stores (a broker stopped during
its start-up) must end closed. start() used to set "running" once the recovery returned,
after close() had run: its timeout and purge timers were armed over closed stores, and
nothing would ever stop them."""

import asyncio

import pytest

from pyengine.errors import ServiceNotReadyError
from pyengine.storage import StorageEnvironment
from pyengine.transaction import TxnAction
from pyengine.transaction.coordinator.log_store import DEFAULT_FINISHED_RETENTION_MS
from pyengine.transaction.coordinator.service import TransactionCoordinatorService
from tests.transaction.coordinator.helpers import FAST_BACKOFF, ServiceHarness

COORDINATORS = 4


async def test_close_during_the_last_stores_recovery_leaves_the_service_closed(data_dir, participants, clock):
    # The last coordinator has a FINISHED record past its retention: its recovery awaits the
    # write that purges it, the last thing start() awaits.
    harness = ServiceHarness(data_dir, participants, clock, num_coordinators=COORDINATORS)
    service = await harness.start()
    txn = await service.new_transaction(COORDINATORS - 1, 60_000)
    await service.end_transaction(txn, TxnAction.COMMIT)
    await service.wait_for_endings()
    await harness.stop()
    clock.advance(DEFAULT_FINISHED_RETENTION_MS + 1)

    env = StorageEnvironment(data_dir)
    try:
        service = TransactionCoordinatorService(env, participants, clock=clock, backoff=FAST_BACKOFF,
                                                num_coordinators=COORDINATORS)
        starting = asyncio.ensure_future(service.start())
        await asyncio.sleep(0)           # start() now awaits the last store's purge write
        assert not starting.done() and service.store(COORDINATORS - 1).state == "ready"
        await service.close()
        with pytest.raises(ServiceNotReadyError, match="closed while starting"):
            await starting
        assert service._purge_timer is None
        assert not service._timeouts._running
        with pytest.raises(ServiceNotReadyError, match="closed"):
            await service.new_transaction(0, 60_000)
    finally:
        await env.drain()
        env.close()
