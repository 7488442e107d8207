"""Key_Shared key hashes and the consistent-hash ring of AUTO_SPLIT subscriptions, as Pulsar 4.0.

A key's hash is a slot of a 2^16 space, Murmur3 (32 bit, seed 0, made non-negative) reduced
into the selector's range, 0 never used (Pulsar's STICKY_KEY_HASH_NOT_SET):

* AUTO_SPLIT (the consistent-hash ring): `murmur % 65535 + 1`, slots 1..65535;
* STICKY (ranges the consumers chose, 0..65535): `murmur % 65536`, 0 taken as 1.

These are the hashes Pulsar reports (drainingHashes, keyHashRangeArrays) and the ones its
documentation tells users to compute. Each AUTO_SPLIT consumer puts `points` points on the ring,
the slots of "name NUL index NUL point", where the index tells apart consumers of the same name
(the lowest one free); a slot belongs to the first point at or after it, wrapping around. Two
consumers whose points collide: the one added first keeps the point, the other takes it over
when the first leaves. Names that end in digits no longer collide wholesale (Pulsar #22050:
"c1" point 10 and "c11" point 0 were the same string when the index was appended bare).
"""

from __future__ import annotations

import bisect
from collections.abc import Hashable
from typing import Generic, TypeVar

import mmh3

KEY_HASH_RANGE_SIZE = 1 << 16           # Pulsar's DEFAULT_RANGE_SIZE
RING_RANGE = (1, KEY_HASH_RANGE_SIZE - 1)

C = TypeVar("C", bound=Hashable)


def murmur_hash(key: bytes) -> int:
    """Pulsar's Murmur3_32Hash.makeHash: Murmur3 32-bit, seed 0, made non-negative."""
    return mmh3.hash(key, signed=True) & 0x7FFFFFFF


def ring_key_hash(key: bytes) -> int:
    """A key's slot on the AUTO_SPLIT ring: 1..65535."""
    return murmur_hash(key) % (RING_RANGE[1] - RING_RANGE[0] + 1) + RING_RANGE[0]


def sticky_key_hash(key: bytes) -> int:
    """A key's slot for STICKY consumers' ranges: 1..65535 (0 is not used: taken as 1)."""
    return murmur_hash(key) % KEY_HASH_RANGE_SIZE or 1


class HashRing(Generic[C]):
    """The AUTO_SPLIT selector: consumers by join order, their points, who owns each slot.

    A join or a leave touches that consumer's points only, and the ranges (stats) are computed
    once per change, as Pulsar's ConsistentHashingStickyKeyConsumerSelector: recomputed from
    every consumer's points each time, 600 consumers took seconds of the event loop."""

    def __init__(self, points: int) -> None:
        if points < 1:
            raise ValueError(f"a consumer needs at least one point on the ring, not {points}")
        self.points = points
        self._members: dict[C, tuple[str, int, list[int]]] = {}   # in join order: name, index, slots
        self._slots: list[int] = []                    # the distinct slots of every point, sorted
        self._claims: dict[int, list[C]] = {}          # slot -> its consumers in join order (owner first)
        self._ranges: dict[C, list[tuple[int, int]]] | None = None     # by consumer, when computed

    def __len__(self) -> int:
        return len(self._members)

    def __contains__(self, consumer: object) -> bool:
        return consumer in self._members

    def add(self, consumer: C, name: str) -> None:
        if consumer in self._members:
            return
        taken = {index for other_name, index, _ in self._members.values() if other_name == name}
        index = next(i for i in range(len(taken) + 1) if i not in taken)
        slots = sorted({ring_key_hash(f"{name}\0{index}\0{point}".encode()) for point in range(self.points)})
        self._members[consumer] = (name, index, slots)
        for slot in slots:
            claims = self._claims.get(slot)
            if claims is None:
                self._claims[slot] = [consumer]
                bisect.insort(self._slots, slot)
            else:
                claims.append(consumer)          # joined last: owns it once those before it leave
        self._ranges = None

    def remove(self, consumer: C) -> None:
        member = self._members.pop(consumer, None)
        if member is None:
            return
        for slot in member[2]:
            claims = self._claims[slot]
            claims.remove(consumer)
            if not claims:
                del self._claims[slot]
                del self._slots[bisect.bisect_left(self._slots, slot)]
        self._ranges = None

    def select(self, hash_value: int) -> C | None:
        """The consumer of slot `hash_value` (None: no consumer)."""
        slots = self._slots
        if not slots:
            return None
        index = bisect.bisect_left(slots, hash_value)
        return self._claims[slots[index % len(slots)]][0]

    def assignments(self) -> list[tuple[int, int, C]]:
        """Every slot of 1..65535 once: (start, end, consumer), in slot order, adjacent
        ranges of one consumer joined (Pulsar's ConsumerHashAssignmentsSnapshot)."""
        if not self._slots:
            return []
        claims = self._claims
        ranges: list[tuple[int, int, C]] = []
        start = RING_RANGE[0]
        for slot in self._slots:
            consumer = claims[slot][0]
            if ranges and ranges[-1][2] == consumer:
                ranges[-1] = (ranges[-1][0], slot, consumer)
            else:
                ranges.append((start, slot, consumer))
            start = slot + 1
        if start <= RING_RANGE[1]:                       # past the last point: the first point's
            first = claims[self._slots[0]][0]
            if ranges[-1][2] == first:
                ranges[-1] = (ranges[-1][0], RING_RANGE[1], first)
            else:
                ranges.append((start, RING_RANGE[1], first))
        return ranges

    def points_owned(self, consumer: C) -> int:
        """The points `consumer` holds (fewer than `points` where an earlier consumer's collide)."""
        member = self._members.get(consumer)
        return 0 if member is None else sum(1 for slot in member[2] if self._claims[slot][0] == consumer)

    def ranges_of(self, consumer: C) -> list[tuple[int, int]]:
        if self._ranges is None:
            by_consumer: dict[C, list[tuple[int, int]]] = {}
            for start, end, owner in self.assignments():
                by_consumer.setdefault(owner, []).append((start, end))
            self._ranges = by_consumer
        return list(self._ranges.get(consumer, ()))
