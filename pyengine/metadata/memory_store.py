"""The in-memory metadata store (tests, `--metadata-store memory`): nothing survives the process."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from pyengine.metadata.local import KV, LocalMetadataStore, MemoryKV, Outcome


class MemoryMetadataStore(LocalMetadataStore):
    """Writes are applied synchronously on the event loop after one yield (so that concurrent
    tasks interleave as they would against a real store); notifications are dispatched in the
    same step, in revision order."""

    def __init__(self) -> None:
        super().__init__()
        self._kv = MemoryKV()
        self._ids = itertools.count(1)

    @contextmanager
    def _reader(self) -> Iterator[KV]:
        yield self._kv

    async def _apply(self, fn: Callable[[KV], Outcome]) -> Outcome:
        await asyncio.sleep(0)
        outcome = fn(self._kv)
        self._dispatch(outcome)
        return outcome

    async def _new_session_id(self) -> int:
        return next(self._ids)
