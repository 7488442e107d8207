"""A producer's open batch: messages collected until it is full or its delay has passed, then
sent as one entry (N x [size][SingleMessageMetadata][payload], built by core_ext.batch)."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from core_ext.batch import build_batch
from pyengine.client.message import MessageId

if TYPE_CHECKING:
    from pyengine.client.transaction import Transaction


class BatchContainer:
    def __init__(self, max_messages: int, max_bytes: int, txn: Transaction | None) -> None:
        self.max_messages = max_messages
        self.max_bytes = max_bytes
        self.txn = txn
        self._singles: list[tuple[bytes, bytes]] = []
        self.futures: list[asyncio.Future[MessageId]] = []
        self.first_sequence_id = -1
        self.last_sequence_id = -1
        self.size = 0

    def __len__(self) -> int:
        return len(self._singles)

    def fits(self, payload_size: int) -> bool:
        """Room for one more message of `payload_size` bytes (an empty batch takes any)."""
        return not self._singles or (len(self._singles) < self.max_messages
                                     and self.size + payload_size <= self.max_bytes)

    def add(self, single_metadata: bytes, payload: bytes, sequence_id: int,
            future: asyncio.Future[MessageId]) -> None:
        if not self._singles:
            self.first_sequence_id = sequence_id
        self.last_sequence_id = sequence_id
        self._singles.append((single_metadata, payload))
        self.futures.append(future)
        self.size += len(payload)

    @property
    def full(self) -> bool:
        return len(self._singles) >= self.max_messages or self.size >= self.max_bytes

    def payload(self) -> bytes:
        return build_batch(self._singles)
