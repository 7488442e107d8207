"""Key-based batching (pulsar-client's `BatchingType.KeyBased`): a producer's open batch is one
batch per key, as pulsar-client-cpp's BatchMessageKeyBasedContainer. A message's key is its
ordering key, else its partition key; messages without either share one batch. Each batch goes
out as its own entry whose MessageMetadata carries the key of its first message, so a Key_Shared
subscription (which routes an entry by that key) gives every message of a key to one consumer.

The limits (batching_max_messages, batching_max_allowed_size_in_bytes) count all the key
batches together: when they are reached, every key batch is sent, in the order of their first
sequence ids (receipts settle the producer's queue in that order). Sequence ids interleave
between the entries, so, as with Pulsar, this does not go with broker de-duplication.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pyengine.client.batch import BatchContainer
from pyengine.client.message import MessageId
from pyengine.client.validation import option_name

if TYPE_CHECKING:
    from pyengine.client.transaction import Transaction


class BatchingType(enum.IntEnum):
    """pulsar-client's batching types: `Default` (one batch of everything, in send order) and
    `KeyBased` (one batch per key). `create_producer(batching_type=...)` takes one of these,
    a name as a string ("default", "key_based", "KeyBased", any case), or `pulsar.BatchingType`."""

    Default = 0
    KeyBased = 1


_BATCHING_NAMES = {"default": BatchingType.Default, "keybased": BatchingType.KeyBased}


def check_batching_type(value: Any) -> BatchingType:
    """The BatchingType `value` names: a BatchingType, its name as a string (any case, with or
    without '_'), or pulsar-client's `pulsar.BatchingType` (matched by name, not imported)."""
    if isinstance(value, BatchingType):
        return value
    batching = _BATCHING_NAMES.get(option_name("batching_type", value, "BatchingType").replace("_", ""))
    if batching is None:
        raise ValueError(f"batching_type must be 'default' or 'key_based' (BatchingType.Default or "
                         f"BatchingType.KeyBased), not {value!r}")
    return batching


def batch_key(partition_key: str | None, ordering_key: bytes | None) -> bytes | None:
    """The key a message is batched by: its ordering key, else its partition key (None: neither)."""
    if ordering_key is not None:
        return ordering_key
    return partition_key.encode() if partition_key is not None else None


@dataclass(slots=True)
class KeyBatch:
    """One key's batch, with the keys of its first message for the entry's metadata."""

    container: BatchContainer
    partition_key: str | None
    ordering_key: bytes | None


class KeyBasedBatches:
    """A producer's open batches, one per key; the producer uses it as it uses one
    BatchContainer (txn, gate, size, max_bytes, len, futures, add) and sends `batches()`."""

    def __init__(self, max_messages: int, max_bytes: int, txn: Transaction | None) -> None:
        self.max_messages = max_messages
        self.max_bytes = max_bytes
        self.txn = txn
        self.gate: asyncio.Future[None] | None = None
        self._batches: dict[bytes | None, KeyBatch] = {}
        self.count = 0                    # messages, in all the key batches
        self.size = 0

    def __len__(self) -> int:
        return self.count

    @property
    def futures(self) -> list[asyncio.Future[MessageId]]:
        return [future for batch in self._batches.values() for future in batch.container.futures]

    def add(self, single_metadata: bytes, payload: bytes, sequence_id: int, future: asyncio.Future[MessageId],
            partition_key: str | None = None, ordering_key: bytes | None = None) -> bool:
        """Add a message to its key's batch; True when the batches together are full with it."""
        key = batch_key(partition_key, ordering_key)
        batch = self._batches.get(key)
        if batch is None:
            # each key's container never fills before the whole does: the limits are checked here
            batch = self._batches[key] = KeyBatch(BatchContainer(self.max_messages, self.max_bytes, self.txn),
                                                  partition_key, ordering_key)
        batch.container.add(single_metadata, payload, sequence_id, future)
        self.count += 1
        self.size += len(payload)
        return self.count >= self.max_messages or self.size >= self.max_bytes

    def batches(self) -> Iterator[KeyBatch]:
        """The key batches in the order of their first sequence ids (the order they are sent in)."""
        return iter(sorted(self._batches.values(), key=lambda batch: batch.container.first_sequence_id))
