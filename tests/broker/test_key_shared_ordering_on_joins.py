"""Key_Shared: per-key order while consumers join. Entries held back for a joining consumer are
replayed later; a consumer that joined after them must not get them while older messages of
their key are still unacknowledged at another consumer (the key's hash drains there, PIP-379)."""

from pyengine.broker import Broker
from pyengine.broker.dispatcher import RING_POINTS
from pyengine.broker.hash_ring import HashRing, ring_key_hash
from tests.broker.helpers import drain

T = "persistent://public/default/key-shared-joins"


def ring_owner(names: list[str], key: str) -> str:
    """The consumer (of these names) that the dispatcher's hash ring gives `key` to."""
    ring: HashRing[str] = HashRing(RING_POINTS)
    for name in names:
        ring.add(name, name)
    return ring.select(ring_key_hash(key.encode()))


def _key_moving_to_each_new_consumer() -> str:
    """A key that c1 takes from c0 when it joins, and c2 from c1 when it joins."""
    for i in range(10_000):
        key = f"key-{i}"
        if ring_owner(["c0", "c1"], key) == "c1" and ring_owner(["c0", "c1", "c2"], key) == "c2":
            return key
    raise AssertionError("no such key")


async def test_a_later_joiner_does_not_get_replayed_messages_before_older_ones_are_acked(tmp_path):
    key = _key_moving_to_each_new_consumer()
    async with Broker.embedded(tmp_path) as broker:
        producer = await broker.create_producer(T)
        c0 = await broker.subscribe(T, "s", consumer_type="key_shared", initial_position="earliest",
                                    consumer_name="c0")
        for i in range(2):
            await producer.send(b"m%d" % i, key=key)
        first = await drain(c0)
        assert [m.data for m in first] == [b"m0", b"m1"]
        c1 = await broker.subscribe(T, "s", consumer_type="key_shared", consumer_name="c1")
        for i in range(2, 4):
            await producer.send(b"m%d" % i, key=key)
        assert await drain(c1) == []             # held back: m0, m1 are not acknowledged yet
        c2 = await broker.subscribe(T, "s", consumer_type="key_shared", consumer_name="c2")
        assert await drain(c2) == []             # still behind m0, m1 at c0
        for message in first:
            await c0.acknowledge(message)
        assert [m.data for m in await drain(c2)] == [b"m2", b"m3"]
