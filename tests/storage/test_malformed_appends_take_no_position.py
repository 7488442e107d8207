"""A malformed append (an entry that is not bytes, a header field out of range) raises before it
takes a position or queues anything. Found by an audit: append_batch put the entries before a
bad one into the queued batch, so they were written though the caller was told the call failed,
without the ledger's counters moving past them, and the next append was given (and overwrote)
the position of one of them; a lone append of a str left an empty batch whose commit made the
ledger's callback fail with IndexError."""

import asyncio
import struct

import pytest

from pyengine.storage import ManagedLedger
from pyengine_kernels import Position

TOPIC = "persistent://public/default/malformed"


def stored(ml: ManagedLedger) -> list[tuple[Position, bytes]]:
    return [(e.position, e.data) for e in ml.read_entries(Position(-1, -1), 100)]


@pytest.fixture
async def loop_errors():
    """What the event loop's exception handler was given (a callback that raised)."""
    errors: list = []
    loop = asyncio.get_running_loop()
    previous = loop.get_exception_handler()
    loop.set_exception_handler(lambda _loop, context: errors.append(context))
    yield errors
    loop.set_exception_handler(previous)


@pytest.mark.parametrize("bad", ["not bytes", None, 7])
async def test_a_batch_with_a_bad_entry_stores_none_of_it(env, reopen, loop_errors, bad):
    ml = await ManagedLedger.open(env, TOPIC)
    first = await ml.append(b"first")
    with pytest.raises(TypeError):
        ml.append_batch([b"a", b"b", bad, b"d"])
    later = await ml.append(b"later")
    assert later == first.next()
    assert ml.lac == later
    assert stored(ml) == [(first, b"first"), (later, b"later")]
    assert ml.ledgers[first.ledger_id].entries == 2
    assert await ml.append_batch([b"x", b"y"]) == [later.next(), later.next().next()]
    await ml.close()
    again = await ManagedLedger.open(reopen(env), TOPIC)
    assert [data for _, data in stored(again)] == [b"first", b"later", b"x", b"y"]
    assert loop_errors == []


@pytest.mark.parametrize("call", [
    lambda ml: ml.append("not bytes"),
    lambda ml: ml.append(b"x", num_messages=1 << 40),          # out of the header's range
    lambda ml: ml.append_entry(b"x", after="not a future"),
    lambda ml: ml.append_batch([b"x"], publish_time="now"),
])
async def test_a_malformed_append_alone_leaves_nothing_queued(env, loop_errors, call):
    ml = await ManagedLedger.open(env, TOPIC)
    with pytest.raises((TypeError, struct.error)):
        call(ml)
    await env.barrier()
    await asyncio.sleep(0.01)
    assert loop_errors == []
    assert ml._in_flight == 0 and ml._queued is None
    assert await ml.append(b"ok") == Position(ml.lac.ledger_id, 0)
    assert stored(ml) == [(ml.lac, b"ok")]
    await ml.close()
