"""Which partition a message goes to: Pulsar's default routing.

A keyed message goes to its key's hash modulo the partition count. The hash is the producer's
`hashing_scheme`, one of Pulsar's: `murmur3_32` (Murmur3_32Hash, `murmur3_32(utf-8 key, seed 0)
& 0x7fffffff`, the default here: the one scheme every Pulsar client implements alike) or
`java_string` (JavaStringHash, Java's `String.hashCode() & 0x7fffffff`, the Java client's
default). Producers of a topic agree on a key's partition only when they use the same scheme;
the C++ and Python clients default to BoostHash, which depends on the Boost version and is not
offered. Keyless messages go round robin; with batching a partition takes a whole batch, or
what comes within one batching delay, before the next one is used, so round robin does not cut
batches short and a slow producer still spreads its messages (as the C++ client's round-robin
router switches on a full batch or when the batching delay has passed).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable

import mmh3


def murmur3_32_hash(key: str) -> int:
    return mmh3.hash(key.encode(), 0, signed=False) & 0x7FFFFFFF


def java_string_hash(key: str) -> int:
    """Java's String.hashCode, over UTF-16 code units with 32-bit wrap-around, sign bit cleared."""
    units = key.encode("utf-16-be")
    h = 0
    for i in range(0, len(units), 2):
        h = (31 * h + (units[i] << 8 | units[i + 1])) & 0xFFFFFFFF
    return h & 0x7FFFFFFF


HASHING_SCHEMES: dict[str, Callable[[str], int]] = {"murmur3_32": murmur3_32_hash, "java_string": java_string_hash}
# Pulsar's enum names (ProducerConfiguration.HashingScheme) as well
_SCHEME_ALIASES = {"murmur3_32hash": "murmur3_32", "javastringhash": "java_string"}


def check_hashing_scheme(scheme: object) -> str:
    """The scheme's name here, from ours or Pulsar's (any case); ValueError otherwise."""
    name = getattr(scheme, "name", scheme)           # an enum member of Pulsar's
    if isinstance(name, str):
        lowered = name.lower()
        lowered = _SCHEME_ALIASES.get(lowered, lowered)
        if lowered in HASHING_SCHEMES:
            return lowered
    raise ValueError(f"hashing_scheme must be one of {', '.join(HASHING_SCHEMES)} "
                     f"(or Pulsar's Murmur3_32Hash, JavaStringHash), not {scheme!r}")


def key_partition(key: str, partitions: int, hashing_scheme: str = "murmur3_32") -> int:
    return HASHING_SCHEMES[hashing_scheme](key) % partitions


class PartitionRouter:
    def __init__(self, partitions: int, messages_per_turn: int = 1, hashing_scheme: str = "murmur3_32",
                 turn_ms: float | None = None, clock: Callable[[], float] = time.monotonic,
                 start: int | None = None) -> None:
        """`messages_per_turn` keyless messages go to a partition before the next one is used,
        or those that come within `turn_ms` of the turn's first (None: no time limit). The
        first turn is partition `start` (None: a random one)."""
        self.partitions = partitions
        self._hash = HASHING_SCHEMES[hashing_scheme]
        self._messages_per_turn = messages_per_turn
        self._turn_s = turn_ms / 1000 if turn_ms is not None else None
        self._clock = clock
        # A random first partition, as pulsar-client-cpp and Java start round robin: producers
        # that send a few messages each would all fill partition 0 otherwise.
        self._turn = start if start is not None else random.randrange(partitions) if partitions > 0 else 0
        self._sent_this_turn = 0
        self._turn_started = 0.0

    def choose(self, key: str | None) -> int:
        if key is not None:
            return self._hash(key) % self.partitions
        if self._turn_s is not None:
            now = self._clock()
            if self._sent_this_turn and now - self._turn_started >= self._turn_s:
                self._next_turn()
            if not self._sent_this_turn:
                self._turn_started = now
        partition = self._turn % self.partitions
        self._sent_this_turn += 1
        if self._sent_this_turn >= self._messages_per_turn:
            self._next_turn()
        return partition

    def _next_turn(self) -> None:
        self._sent_this_turn = 0
        self._turn += 1
