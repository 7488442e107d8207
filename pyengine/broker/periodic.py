"""A broker task that checks every loaded topic every so often (message expiry, backlog quotas),
one topic's failure never stopping the round; `check_now()` runs one round at once (tests, admin)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyengine.broker.service import BrokerService
    from pyengine.broker.topic import Topic

log = logging.getLogger(__name__)


class PeriodicTopicCheck:
    """Every `interval_s`, `check(topic, now_ms)` for each open topic of `service`."""

    def __init__(self, service: BrokerService, interval_s: float, name: str,
                 check: Callable[[Topic, int], Awaitable[object]]) -> None:
        self.service = service
        self.interval_s = interval_s
        self.name = name
        self._check = check
        self._task: asyncio.Task[None] | None = None
        self.rounds = 0                 # completed rounds (tests wait on it)

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name=self.name)

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            await self.check_now()

    async def check_now(self) -> None:
        now_ms = self.service.config.clock()
        for topic in list(self.service.topics.values()):
            if topic.closed:
                continue
            try:
                await self._check(topic, now_ms)
            except asyncio.CancelledError:
                raise
            except Exception:            # one topic's failure does not stop the others'
                if not topic.closed:
                    log.exception("%s of %s failed", self.name, topic.name)
        self.rounds += 1

    async def close(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
