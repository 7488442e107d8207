"""Building and restarting coordinator services in tests."""

from __future__ import annotations

from pathlib import Path

from pyengine.storage import StorageEnvironment
from pyengine.transaction.coordinator.retry import Backoff
from pyengine.transaction.coordinator.service import TransactionCoordinatorService

FAST_BACKOFF = Backoff(initial_ms=1, max_ms=4, call_timeout_ms=5_000)


class ServiceHarness:
    """A service on a data dir, restartable (clean close, or dropped as if the process died)."""

    def __init__(self, data_dir: Path, participants, clock, *, sync: bool = True, **options) -> None:
        self.data_dir = data_dir
        self.participants = participants
        self.clock = clock
        self.sync = sync
        self.options = {"num_coordinators": 4, "backoff": FAST_BACKOFF, **options}
        self.env: StorageEnvironment | None = None
        self.service: TransactionCoordinatorService | None = None

    async def start(self) -> TransactionCoordinatorService:
        self.env = StorageEnvironment(self.data_dir, sync=self.sync)
        self.service = TransactionCoordinatorService(self.env, self.participants, clock=self.clock, **self.options)
        await self.service.start()
        return self.service

    async def stop(self) -> None:
        if self.service is not None:
            await self.service.close()
        if self.env is not None:
            await self.env.drain()
            self.env.close()
        self.service = self.env = None

    async def restart(self) -> TransactionCoordinatorService:
        await self.stop()
        return await self.start()
