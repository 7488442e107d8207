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
    """The AUTO_SPLIT selector: consumers by join order, their points, who owns each slot."""

    def __init__(self, points: int) -> None:
        if points < 1:
            raise ValueError(f"a consumer needs at least one point on the ring, not {points}")
        self.points = points
        self._members: dict[C, tuple[str, int]] = {}     # in join order: (name, name index)
        self._ring: list[tuple[int, C]] = []              # (slot, owner), one per distinct slot

    def __len__(self) -> int:
        return len(self._members)

    def __contains__(self, consumer: object) -> bool:
        return consumer in self._members

    def add(self, consumer: C, name: str) -> None:
        if consumer in self._members:
            return
        taken = {index for other_name, index in self._members.values() if other_name == name}
        index = next(i for i in range(len(taken) + 1) if i not in taken)
        self._members[consumer] = (name, index)
        self._rebuild()

    def remove(self, consumer: C) -> None:
        if self._members.pop(consumer, None) is not None:
            self._rebuild()

    def _rebuild(self) -> None:
        owners: dict[int, C] = {}
        for consumer, (name, index) in self._members.items():     # join order: the first keeps a slot
            for point in range(self.points):
                owners.setdefault(ring_key_hash(f"{name}\0{index}\0{point}".encode()), consumer)
        self._ring = sorted(owners.items(), key=lambda item: item[0])

    def select(self, hash_value: int) -> C | None:
        """The consumer of slot `hash_value` (None: no consumer)."""
        if not self._ring:
            return None
        index = bisect.bisect_left(self._ring, hash_value, key=lambda point: point[0])
        return self._ring[index % len(self._ring)][1]

    def assignments(self) -> list[tuple[int, int, C]]:
        """Every slot of 1..65535 once: (start, end, consumer), in slot order, adjacent
        ranges of one consumer joined (Pulsar's ConsumerHashAssignmentsSnapshot)."""
        if not self._ring:
            return []
        ranges: list[tuple[int, int, C]] = []
        start = RING_RANGE[0]
        for slot, consumer in self._ring:
            if ranges and ranges[-1][2] == consumer:
                ranges[-1] = (ranges[-1][0], slot, consumer)
            else:
                ranges.append((start, slot, consumer))
            start = slot + 1
        if start <= RING_RANGE[1]:                       # past the last point: the first point's
            first = self._ring[0][1]
            if ranges[-1][2] == first:
                ranges[-1] = (ranges[-1][0], RING_RANGE[1], first)
            else:
                ranges.append((start, RING_RANGE[1], first))
        return ranges

    def points_owned(self, consumer: C) -> int:
        """The points `consumer` holds (fewer than `points` where an earlier consumer's collide)."""
        return sum(1 for _, owner in self._ring if owner == consumer)

    def ranges_of(self, consumer: C) -> list[tuple[int, int]]:
        return [(start, end) for start, end, owner in self.assignments() if owner == consumer]
