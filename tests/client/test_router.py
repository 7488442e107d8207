"""Partition routing: Pulsar's key hashes (Murmur3_32Hash, JavaStringHash) and round robin."""

from collections import Counter

import pytest

from pyengine.client.router import PartitionRouter, check_hashing_scheme, java_string_hash, key_partition

# MurmurHash3 x86_32 with seed 0 of this sentence is 0x2e4ff723 (the reference test vector).
SENTENCE = "The quick brown fox jumps over the lazy dog"


def test_keyed_messages_follow_murmur3():
    for partitions in (1, 3, 7, 16):
        assert key_partition(SENTENCE, partitions) == (0x2E4FF723 & 0x7FFFFFFF) % partitions
    assert key_partition("hello", 5) == (0x248BFA47 & 0x7FFFFFFF) % 5


def test_a_key_always_goes_to_the_same_partition():
    router = PartitionRouter(4)
    assert len({router.choose("user-42") for _ in range(20)}) == 1


def test_keyless_messages_go_round_robin():
    router = PartitionRouter(3, start=0)
    assert [router.choose(None) for _ in range(6)] == [0, 1, 2, 0, 1, 2]


def test_round_robin_starts_at_a_random_partition():
    """As pulsar-client-cpp and Java: producers that send one message each spread (found by an
    audit: twenty of them all wrote to partition 0)."""
    firsts = Counter(PartitionRouter(4).choose(None) for _ in range(400))
    assert set(firsts) == {0, 1, 2, 3} and min(firsts.values()) > 40
    router = PartitionRouter(4)
    first = router.choose(None)
    assert [router.choose(None) for _ in range(3)] == [(first + i) % 4 for i in (1, 2, 3)]


def test_with_batching_a_partition_takes_a_batch_at_a_time():
    router = PartitionRouter(2, messages_per_turn=3, start=0)
    assert [router.choose(None) for _ in range(7)] == [0, 0, 0, 1, 1, 1, 0]
    router = PartitionRouter(2, messages_per_turn=3)
    spread = Counter(router.choose(None) for _ in range(600))
    assert spread[0] == spread[1] == 300


def test_with_batching_a_slow_producer_moves_on_after_the_batching_delay():
    """As the C++ client's round-robin router: a turn also ends when the batching delay has
    passed, so messages sent slowly spread (they all went to one partition until a whole
    batch's count of them had been sent)."""
    now = [0.0]
    router = PartitionRouter(3, messages_per_turn=1000, turn_ms=10, clock=lambda: now[0], start=0)
    chosen = []
    for _ in range(6):
        chosen.append(router.choose(None))
        now[0] += 0.004                       # a message every 4 ms: 3 per 10 ms turn
    assert chosen == [0, 0, 0, 1, 1, 1]
    assert router.choose("k") == router.choose("k")       # keyed messages are not routed by turns


def test_java_string_hash_is_javas_string_hashcode():
    # String.hashCode() figures from the JDK: "hello" 99162322; "polygenelubricants" hashes to
    # Integer.MIN_VALUE (sign bit cleared: 0); a character outside the BMP counts as its two
    # UTF-16 surrogates (0xD83D, 0xDE00).
    assert java_string_hash("hello") == 99162322
    assert java_string_hash("polygenelubricants") == 0
    assert java_string_hash("\U0001F600") == 31 * 0xD83D + 0xDE00
    assert key_partition("hello", 5, "java_string") == 99162322 % 5
    assert PartitionRouter(5, hashing_scheme="java_string").choose("hello") == 99162322 % 5


def test_hashing_schemes_by_our_names_or_pulsars():
    assert check_hashing_scheme("murmur3_32") == check_hashing_scheme("Murmur3_32Hash") == "murmur3_32"
    assert check_hashing_scheme("JavaStringHash") == check_hashing_scheme("JAVA_STRING") == "java_string"
    for bad in ("BoostHash", "", None, 3, b"murmur3_32"):
        with pytest.raises(ValueError, match="hashing_scheme must be one of"):
            check_hashing_scheme(bad)
