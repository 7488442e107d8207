"""Key_Shared key hashes and the AUTO_SPLIT hash ring, against Pulsar 4.0's own figures and a
reference model of consistent hashing."""

from __future__ import annotations

import bisect

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pyengine.broker.hash_ring import HashRing, murmur_hash, ring_key_hash, sticky_key_hash

ALL_SLOTS = (1, 65535)


def test_the_ring_assigns_what_pulsar_assigns():
    # Pulsar's ConsistentHashingStickyKeyConsumerSelectorTest.testGetConsumerKeyHashRanges
    # (3 points per consumer): the same names give the same ranges.
    ring: HashRing[str] = HashRing(3)
    for name in ("consumer1", "consumer2", "consumer3"):
        ring.add(name, name)
    assert ring.ranges_of("consumer1") == [(14359, 18366), (29991, 39817), (52980, 60442)]
    assert ring.ranges_of("consumer2") == [(1, 6668), (39818, 52979), (60443, 63679), (65184, 65535)]
    assert ring.ranges_of("consumer3") == [(6669, 14358), (18367, 29990), (63680, 65183)]


def test_key_hashes_are_pulsars_slots():
    assert murmur_hash(b"") == 0 and murmur_hash(b"hello") == 613153351     # Murmur3 32, seed 0
    keys = [b"k%d" % i for i in range(200_000)]
    assert all(1 <= ring_key_hash(k) <= 65535 for k in keys[:5000])
    assert all(ring_key_hash(k) == murmur_hash(k) % 65535 + 1 for k in keys[:5000])
    # 0 marks "no hash" in Pulsar's dispatchers: a STICKY key landing on it takes slot 1
    zero = next(k for k in keys if murmur_hash(k) % 65536 == 0)
    assert sticky_key_hash(zero) == 1
    assert all(sticky_key_hash(k) == murmur_hash(k) % 65536 for k in keys[:5000] if murmur_hash(k) % 65536)


def test_names_ending_in_digits_keep_all_their_points():
    # Pulsar #22050: with the point number appended bare, "c1" point 10 was "c11" point 0
    ring: HashRing[str] = HashRing(100)
    ring.add("c1", "c1")
    ring.add("c11", "c11")
    assert ring.points_owned("c1") == 100 and ring.points_owned("c11") == 100


def test_consumers_of_one_name_get_points_of_their_own():
    ring: HashRing[object] = HashRing(100)
    a, b, c = object(), object(), object()
    ring.add(a, "worker")
    ring.add(b, "worker")
    assert ring.points_owned(a) == ring.points_owned(b) == 100
    assert set(ring.ranges_of(a)).isdisjoint(ring.ranges_of(b))
    before_b = ring.ranges_of(b)
    ring.remove(a)
    ring.add(c, "worker")                      # takes the freed index: a's points exactly
    assert ring.ranges_of(b) == before_b
    alone: HashRing[object] = HashRing(100)
    alone.add(a, "worker")
    alone.add(b, "worker")
    assert ring.ranges_of(c) == alone.ranges_of(a)


def test_a_ring_needs_points():
    with pytest.raises(ValueError, match="at least one point"):
        HashRing(0)
    ring: HashRing[str] = HashRing(5)
    assert ring.select(7) is None and ring.assignments() == []
    ring.remove("nobody")                      # not a member: nothing happens


def covered(ring: HashRing) -> None:
    """The assignments cover 1..65535 once, in order, and agree with select."""
    ranges = ring.assignments()
    assert ranges[0][0] == ALL_SLOTS[0] and ranges[-1][1] == ALL_SLOTS[1]
    for (_, end, owner), (start, _, next_owner) in zip(ranges, ranges[1:]):
        assert start == end + 1 and owner != next_owner
    for start, end, owner in ranges:
        assert ring.select(start) == owner and ring.select(end) == owner


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(0, 7)), min_size=1, max_size=25),
       st.lists(st.integers(1, 65535), min_size=20, max_size=20))
def test_a_change_moves_only_the_keys_of_the_consumer_that_came_or_went(operations, probes):
    ring: HashRing[int] = HashRing(10)
    names = {i: f"c{i % 3}" for i in range(8)}          # some consumers share a name
    for add, consumer in operations:
        before = {slot: ring.select(slot) for slot in probes}
        if add and consumer not in ring:
            ring.add(consumer, names[consumer])
            moved_to_it = True
        elif not add and consumer in ring:
            ring.remove(consumer)
            moved_to_it = False
        else:
            continue
        for slot, owner in before.items():
            now = ring.select(slot)
            if moved_to_it:
                assert now in (owner, consumer)          # kept, or taken by the newcomer
            elif owner != consumer:
                assert now == owner                      # only the leaver's keys move
        if len(ring):
            covered(ring)


def reference_owners(members: list[tuple[int, str, int]], points: int) -> dict[int, int]:
    """The ring rebuilt from scratch (what each change did before it became incremental):
    members in join order, the first to claim a slot owns it."""
    owners: dict[int, int] = {}
    for consumer, name, index in members:
        for point in range(points):
            owners.setdefault(ring_key_hash(f"{name}\0{index}\0{point}".encode()), consumer)
    return owners


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(0, 9)), min_size=1, max_size=40),
       st.lists(st.integers(1, 65535), min_size=30, max_size=30))
def test_the_incremental_ring_owns_what_a_rebuilt_one_owns(operations, probes):
    points = 3                                   # few points: collisions between consumers happen
    ring: HashRing[int] = HashRing(points)
    names = {i: f"c{i % 2}" if i < 6 else f"k{i}" for i in range(10)}
    members: list[tuple[int, str, int]] = []     # the reference: join order, name, name index
    for add, consumer in operations:
        if add and consumer not in ring:
            taken = {index for _, name, index in members if name == names[consumer]}
            members.append((consumer, names[consumer], next(i for i in range(len(taken) + 1) if i not in taken)))
            ring.add(consumer, names[consumer])
        elif not add and consumer in ring:
            members = [m for m in members if m[0] != consumer]
            ring.remove(consumer)
        owners = reference_owners(members, points)
        slots = sorted(owners)
        for probe in [*probes, *slots]:
            expected = owners[slots[bisect.bisect_left(slots, probe) % len(slots)]] if slots else None
            assert ring.select(probe) == expected
        for consumer, _, _ in members:
            assert ring.points_owned(consumer) == sum(1 for owner in owners.values() if owner == consumer)
            assert ring.ranges_of(consumer) == [(s, e) for s, e, o in ring.assignments() if o == consumer]
        if members:
            covered(ring)


def test_joins_and_leaves_of_many_consumers_stay_cheap():
    """Found by an audit: every join or leave hashed every consumer's points again, and each
    consumer's ranges walked the whole ring (600 consumers: 25 s to join, a stats call 6 s).
    Counted, not timed: a change hashes only its consumer's points."""
    import pyengine.broker.hash_ring as module

    calls = [0]
    original = module.ring_key_hash

    def counting(key: bytes) -> int:
        calls[0] += 1
        return original(key)

    ring: HashRing[int] = HashRing(100)
    module.ring_key_hash, saved = counting, module.ring_key_hash
    try:
        for consumer in range(300):
            ring.add(consumer, f"c{consumer}")
        for consumer in range(0, 300, 2):
            ring.remove(consumer)
    finally:
        module.ring_key_hash = saved
    assert calls[0] == 300 * 100
    assigned = ring.assignments()
    assert sum(len(ring.ranges_of(c)) for c in range(1, 300, 2)) == len(assigned)
