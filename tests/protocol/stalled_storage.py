"""Storage that takes a while, for tests of what the broker does while sends are being stored:
a topic's publishes are held until the test releases them."""

from __future__ import annotations

import asyncio
from typing import Any


class StalledPublishes:
    """`topic.publish` patched (through `monkeypatch`) to hold each publish's outcome: the
    entry is stored as usual, its future settles only when released, oldest first."""

    def __init__(self, topic: Any, monkeypatch: Any) -> None:
        self.held: list[tuple[asyncio.Future, asyncio.Future]] = []
        real_publish = topic.publish

        def stalled_publish(*args: Any, **kwargs: Any) -> asyncio.Future:
            inner = real_publish(*args, **kwargs)
            outer = asyncio.get_running_loop().create_future()
            self.held.append((inner, outer))
            return outer
        monkeypatch.setattr(topic, "publish", stalled_publish)

    def __len__(self) -> int:
        return len(self.held)

    async def release(self, count: int | None = None) -> None:
        """Settle the `count` oldest held publishes (all by default) with their real outcomes."""
        count = len(self.held) if count is None else count
        released, self.held = self.held[:count], self.held[count:]
        for inner, outer in released:
            if outer.done():
                continue
            try:
                outer.set_result(await inner)
            except Exception as exc:
                outer.set_exception(exc)
