"""Which partition a message goes to: Pulsar's default routing.

A keyed message goes to `murmur3_32(key) & 0x7fffffff` modulo the partition count (Pulsar's
Murmur3_32Hash, seed 0), so a key stays on one partition across clients. Keyless messages
go round robin; with batching a partition takes a whole batch before the next one is used, so
round robin does not cut batches short (as the C++ client's round-robin router does).
"""

from __future__ import annotations

import mmh3


def key_partition(key: str, partitions: int) -> int:
    return (mmh3.hash(key.encode(), 0, signed=False) & 0x7FFFFFFF) % partitions


class PartitionRouter:
    def __init__(self, partitions: int, messages_per_turn: int = 1) -> None:
        self.partitions = partitions
        self._messages_per_turn = messages_per_turn
        self._turn = 0
        self._sent_this_turn = 0

    def choose(self, key: str | None) -> int:
        if key is not None:
            return key_partition(key, self.partitions)
        partition = self._turn % self.partitions
        self._sent_this_turn += 1
        if self._sent_this_turn >= self._messages_per_turn:
            self._sent_this_turn = 0
            self._turn += 1
        return partition
