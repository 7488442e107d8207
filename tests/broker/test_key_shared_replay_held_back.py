"""Key_Shared: entries held back because their key's consumer is blocked (no permits, or its
unacked-messages limit) cost the other consumers nothing per dispatch pass, however many there
are (Pulsar keeps sticky key hashes with its replay set and passes over the hashes of a consumer
that cannot take); the held keys keep their order when that consumer unblocks or leaves."""

import sys

from pyengine.broker import Broker
from tests.broker.helpers import drain

T = "persistent://public/default/key-shared-replay"


def subscription(broker):
    return broker.service.topics[T].subscriptions["s"]


def keys_by_owner(broker) -> dict[str, str]:
    """A key of each consumer of the subscription."""
    keys: dict[str, str] = {}
    dispatcher = subscription(broker).dispatcher
    for i in range(100):
        keys.setdefault(dispatcher._owner(dispatcher.key_hash(b"k%d" % i)).name, "k%d" % i)
    return keys


class DispatcherLines:
    """Counts the lines the dispatcher runs (the work of its passes, not wall time)."""

    def __init__(self) -> None:
        from pyengine.broker import dispatcher
        self.filename = dispatcher.__file__
        self.count = 0

    def _local(self, frame, event, arg):
        if event == "line":
            self.count += 1
        return self._local

    def _global(self, frame, event, arg):
        return self._local if frame.f_code.co_filename == self.filename else None

    def __enter__(self) -> "DispatcherLines":
        self._previous = sys.gettrace()
        sys.settrace(self._global)
        return self

    def __exit__(self, *exc) -> None:
        sys.settrace(self._previous)


async def dispatch_work(tmp_path, held: int, consumed: int = 30) -> int:
    """The dispatcher's lines run while b receives and acknowledges `consumed` messages one by
    one (a pass after each), a blocked holding back `held` entries of its key."""
    async with Broker.embedded(tmp_path / str(held), sync=False, max_unacked_messages_per_consumer=2) as broker:
        a = await broker.subscribe(T, "s", consumer_type="key_shared", initial_position="earliest", consumer_name="a")
        b = await broker.subscribe(T, "s", consumer_type="key_shared", consumer_name="b")
        keys = keys_by_owner(broker)
        producer = await broker.create_producer(T)
        for i in range(held + 2):
            await producer.send(b"a%d" % i, key=keys["a"])
        for i in range(consumed):
            await producer.send(b"b%d" % i, key=keys["b"])
        first = [await a.receive(timeout=5) for _ in range(2)]  # a blocked from here
        assert len(subscription(broker).dispatcher.redeliveries) == held
        with DispatcherLines() as lines:
            for i in range(consumed):
                message = await b.receive(timeout=5)
                assert message.data == b"b%d" % i
                await b.acknowledge(message)
        for message in first:
            await a.acknowledge(message)
        for i in range(2, held + 2):                            # a's key in order once a unblocks
            message = await a.receive(timeout=5)
            assert message.data == b"a%d" % i
            await a.acknowledge(message)
        return lines.count


async def test_a_blocked_consumers_held_entries_cost_the_others_nothing_per_pass(tmp_path):
    few, many = await dispatch_work(tmp_path, 20), await dispatch_work(tmp_path, 400)
    # Walking (or sorting) the held entries on every pass makes this 20 times the work.
    assert many < 1.5 * few, (few, many)


async def test_held_entries_go_in_order_to_the_consumer_their_key_has_after_one_leaves(tmp_path):
    async with Broker.embedded(tmp_path, sync=False, max_unacked_messages_per_consumer=3) as broker:
        a = await broker.subscribe(T, "s", consumer_type="key_shared", initial_position="earliest", consumer_name="a",
                                   negative_ack_redelivery_delay_ms=0)
        b = await broker.subscribe(T, "s", consumer_type="key_shared", consumer_name="b")
        keys = keys_by_owner(broker)
        producer = await broker.create_producer(T)
        for name in "ab":
            for i in range(10):
                await producer.send(b"%s%d" % (name.encode(), i), key=keys[name])
        got_a = await drain(a)
        assert [m.data for m in got_a] == [b"a0", b"a1", b"a2"]  # a blocked, a3.. held back
        assert len(subscription(broker).dispatcher.redeliveries) == 7
        await a.negative_acknowledge(got_a[1])                  # held back as well
        await a.close()                                         # a0, a2 given back; a1, a3.. now b's
        received: list[bytes] = []
        while len(received) < 20:
            message = await b.receive(timeout=5)
            received.append(message.data)
            await b.acknowledge(message)
        assert [d for d in received if d.startswith(b"a")] == [b"a%d" % i for i in range(10)]
        assert [d for d in received if d.startswith(b"b")] == [b"b%d" % i for i in range(10)]
        assert len(subscription(broker).dispatcher.redeliveries) == 0


async def test_held_entries_of_a_consumer_without_permits_go_in_order_once_it_flows(tmp_path):
    async with Broker.embedded(tmp_path, sync=False) as broker:
        a = await broker.subscribe(T, "s", consumer_type="key_shared", initial_position="earliest",
                                   consumer_name="a", receiver_queue_size=2)
        b = await broker.subscribe(T, "s", consumer_type="key_shared", consumer_name="b")
        c = await broker.subscribe(T, "s", consumer_type="key_shared", consumer_name="c")
        keys = keys_by_owner(broker)
        producer = await broker.create_producer(T)
        for i in range(30):
            for name in "abc":
                await producer.send(b"%s%d" % (name.encode(), i), key=keys[name])
        for consumer, name in ((b, "b"), (c, "c"), (a, "a")):  # a takes 2 at a time: the rest waits
            if consumer is a:
                assert len(subscription(broker).dispatcher.redeliveries) == 28
            for i in range(30):
                message = await consumer.receive(timeout=5)
                assert message.data == b"%s%d" % (name.encode(), i)
                await consumer.acknowledge(message)
        assert len(subscription(broker).dispatcher.redeliveries) == 0


def test_the_replay_walk_merges_the_groups_in_position_order_and_leaves_refusing_ones():
    from pyengine.broker.dispatcher import ReplayQueue
    from pyengine_kernels import Position

    busy, free, gone = object(), object(), None                 # gone: a key no consumer's range covers
    owners = {1: busy, 2: free, 3: gone}
    queue = ReplayQueue(owners.__getitem__)
    for entry, hash_value in ((2, 1), (3, 2), (5, 2), (6, 3), (8, 2)):
        queue.hold(Position(1, entry), hash_value)
    queue.update([Position(1, 1), Position(1, 4), Position(1, 7), Position(1, 9)])
    walked = []
    for position in queue.walk(lambda consumer: consumer is free, horizon=Position(1, 8)):
        walked.append(position.entry_id)
        queue.discard(position)
        if position == Position(1, 4):
            queue.hold(position, 3)                             # read: nobody's key, the walk goes on
        if position == Position(1, 5):
            queue.hold(position, 2)                             # free refused it: not its later ones
    assert walked == [1, 3, 4, 5, 7]                            # busy's 2 and nobody's 6 unread; 9 later
    assert sorted(queue) == [Position(1, e) for e in (2, 4, 5, 6, 8, 9)]
    assert len(queue) == 6 and Position(1, 9) in queue and Position(1, 1) not in queue
