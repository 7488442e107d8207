"""Group commit's conditional writes (`StorageEnvironment.depend` / `submit(after=...)`): a
write that presupposes another is never durable without it, and usually shares its commit."""

import asyncio
import itertools
import threading

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pyengine.storage import LedgerClosedError, StorageEnvironment, StorageError, environment


def put(env: StorageEnvironment, key: bytes, seen: list | None = None):
    meta = env.db("meta")

    def write(txn):
        if seen is not None:
            seen.append((key, txn))         # kept alive: ids of freed objects are reused
        txn.put(key, b"1", db=meta)
    return write


def stored(env: StorageEnvironment, key: bytes) -> bool:
    with env.read() as txn:
        return txn.get(key, db=env.db("meta")) is not None


def doomed_write(release: threading.Event):
    """A write that holds the writer thread until `release`, then fails its whole batch."""
    def write(txn):
        release.wait(10)
        raise RuntimeError("injected write failure")
    return write


async def test_a_conditional_write_shares_the_commit_of_its_condition(env):
    seen: list = []
    decision = env.submit(put(env, b"decision", seen))
    marker = env.submit(put(env, b"marker", seen), after=decision)
    await asyncio.gather(decision, marker)
    assert [key for key, _ in seen] == [b"decision", b"marker"]
    assert seen[0][1] is seen[1][1]                 # one LMDB write transaction
    assert stored(env, b"decision") and stored(env, b"marker")


async def test_a_condition_already_durable_lets_the_write_through(env):
    decision = env.submit(put(env, b"decision"))
    await decision
    await env.submit(put(env, b"marker"), after=decision)
    assert stored(env, b"marker")


async def test_a_write_queued_behind_its_failed_condition_is_never_written(env):
    release = threading.Event()
    decision = env.submit(doomed_write(release))
    await asyncio.sleep(0)                          # the decision's batch is with the writer now
    seen: list = []
    marker = env.submit(put(env, b"marker", seen), after=decision)
    unrelated = env.submit(put(env, b"unrelated"))
    release.set()
    with pytest.raises(StorageError, match="injected"):
        await decision
    with pytest.raises(StorageError, match="presupposes failed"):
        await marker
    await unrelated                                 # the rest of the next batch is written
    assert seen == [] and not stored(env, b"marker") and stored(env, b"unrelated")
    await env.submit(put(env, b"later"))            # and the environment goes on
    assert stored(env, b"later")


async def test_depend_makes_a_queued_keyed_write_conditional(env):
    release = threading.Event()
    decision = env.submit(doomed_write(release))
    await asyncio.sleep(0)
    batch = env.submit(put(env, b"entries"), key=("append", 1))
    env.depend(("append", 1), decision)
    release.set()
    with pytest.raises(StorageError):
        await decision
    with pytest.raises(StorageError, match="presupposes"):
        await batch
    assert not stored(env, b"entries")


async def test_a_write_queued_before_a_refused_condition_is_refused_with_it(env):
    # Found by an audit: an append batch queued before a decision whose own condition failed,
    # then made to depend on that decision (the decision's commit marker joining it), was
    # written: a commit marker durable while its decision was refused.
    release = threading.Event()
    registration = env.submit(doomed_write(release))
    await asyncio.sleep(0)                          # the registration's batch is with the writer
    batch = env.submit(put(env, b"entries"), key=("append", 1))
    decision = env.submit(put(env, b"decision"), after=registration)
    env.depend(("append", 1), decision)             # the marker joins the earlier batch
    release.set()
    for refused in (registration, decision, batch):
        with pytest.raises(StorageError):
            await refused
    assert not stored(env, b"entries") and not stored(env, b"decision")


EXAMPLES = itertools.count()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.integers(1, 7).flatmap(lambda n: st.tuples(
    st.just(n),
    st.lists(st.tuples(st.integers(0, n - 1), st.integers(-1, n - 1)), max_size=2 * n))))
async def test_refusals_follow_every_chain_of_conditions_in_a_batch(env, writes_and_edges):
    """Writes 0..n-1 in one batch, each condition an edge to another write of the batch
    (earlier or later) or to a failed write (-1): exactly those that reach the failed one
    through their conditions are refused (the reference: a reachability check)."""
    n, edges = writes_and_edges
    edges = [(a, b) for a, b in edges if a != b]
    release = threading.Event()
    failed = env.submit(doomed_write(release))
    await asyncio.sleep(0)
    tag = next(EXAMPLES).to_bytes(8, "little")      # the examples share one environment
    futures = [env.submit(put(env, tag + bytes([i])), key=("w", tag, i)) for i in range(n)]
    for a, b in edges:
        env.depend(("w", tag, a), failed if b == -1 else futures[b])
    release.set()
    doomed, grew = set(), True
    while grew:
        grown = {a for a, b in edges if b == -1 or b in doomed}
        grew, doomed = grown != doomed, grown
    results = await asyncio.gather(failed, *futures, return_exceptions=True)
    assert isinstance(results[0], StorageError)
    assert {i for i, r in enumerate(results[1:]) if isinstance(r, BaseException)} == doomed
    assert {i for i in range(n) if stored(env, tag + bytes([i]))} == set(range(n)) - doomed


async def test_a_condition_from_elsewhere_is_refused_not_trusted(env):
    foreign = asyncio.get_running_loop().create_future()      # never submitted here
    with pytest.raises(StorageError, match="never queued"):
        await env.submit(put(env, b"marker"), after=foreign)
    assert not stored(env, b"marker")


async def test_malformed_conditions_are_clear_errors(env):
    with pytest.raises(TypeError, match="after must be"):
        env.submit(put(env, b"x"), after="decision")
    with pytest.raises(StorageError, match="no queued write"):
        env.depend(("append", 99), env.submit(put(env, b"y")))
    with pytest.raises(TypeError, match="after must be"):
        env.depend(("append", 99), 42)
    await env.barrier()
    assert not stored(env, b"x") and stored(env, b"y")


async def test_a_lingering_write_waits_one_turn_for_the_writes_of_the_tasks_it_starts(env):
    async def marker(seen, decision):
        env.submit(put(env, b"marker", seen), after=decision)

    for linger in (False, True):
        seen: list = []
        decision = env.submit(put(env, b"decision", seen), linger=linger)
        task = asyncio.ensure_future(marker(seen, decision))   # its first step comes a turn later
        await task
        await env.barrier()
        same_commit = seen[0][1] is seen[1][1]
        assert same_commit is linger, (linger, seen)


async def test_a_lazy_write_joins_the_next_commit(env, monkeypatch):
    monkeypatch.setattr(environment, "LAZY_WRITE_DELAY_S", 30.0)      # no timer in this test
    seen: list = []
    lazy = env.submit(put(env, b"trim-record", seen), lazy=True)
    await asyncio.sleep(0)
    assert not lazy.done() and seen == []           # it asked for no commit of its own
    await env.submit(put(env, b"decision", seen))
    assert lazy.done() and [key for key, _ in seen] == [b"trim-record", b"decision"]
    assert seen[0][1] is seen[1][1]


async def test_a_lazy_write_alone_is_written_after_a_short_delay(env):
    loop = asyncio.get_running_loop()
    started = loop.time()
    await env.submit(put(env, b"trim-record"), lazy=True)
    assert loop.time() - started >= environment.LAZY_WRITE_DELAY_S * 0.9 and stored(env, b"trim-record")


async def test_a_lazy_write_queued_behind_a_commit_does_not_take_the_next_one_alone(env, monkeypatch):
    monkeypatch.setattr(environment, "LAZY_WRITE_DELAY_S", 30.0)
    release = threading.Event()
    meta = env.db("meta")
    seen: list = []

    def slow(txn):
        release.wait(10)
        txn.put(b"slow", b"1", db=meta)

    first = env.submit(slow)
    await asyncio.sleep(0)                          # in flight
    lazy = env.submit(put(env, b"trim-record", seen), lazy=True)
    release.set()
    await first
    eager = env.submit(put(env, b"next", seen))     # still in time to share the lazy one's commit
    await asyncio.gather(lazy, eager)
    assert seen[0][1] is seen[1][1]


async def test_drain_writes_lazy_writes_and_close_refuses_them(tmp_path):
    env = StorageEnvironment(tmp_path / "a")
    kept = env.submit(put(env, b"kept"), lazy=True)
    await env.drain()
    assert kept.done() and stored(env, b"kept")
    lost = env.submit(put(env, b"lost"), lazy=True)
    env.close()
    with pytest.raises(LedgerClosedError):
        await lost


def test_every_commit_is_fsynced_by_default_and_sync_false_is_the_only_way_out(tmp_path):
    """A publish is acknowledged after its commit is durable: LMDB must sync both the data and
    its meta page on every commit unless asked otherwise (a kill -9 test cannot see this: the
    page cache survives a process)."""
    from pyengine.broker.service import BrokerConfig

    durable = StorageEnvironment(tmp_path / "durable")
    relaxed = StorageEnvironment(tmp_path / "relaxed", sync=False)
    try:
        assert {k: durable._env.flags()[k] for k in ("sync", "metasync")} == {"sync": True, "metasync": True}
        assert {k: relaxed._env.flags()[k] for k in ("sync", "metasync")} == {"sync": False, "metasync": False}
    finally:
        durable.close()
        relaxed.close()
    assert BrokerConfig(data_dir=tmp_path).sync is True


# --- prefix_usage: counting a key range without holding the event loop ----------------------

@given(keys=st.sets(st.binary(min_size=0, max_size=3), max_size=40), chunk=st.integers(1, 7),
       start=st.none() | st.binary(max_size=3))
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
async def test_prefix_usage_counts_the_keys_under_a_prefix_chunk_by_chunk(env, monkeypatch, keys, chunk, start):
    """Against a count over the stored keys (other prefixes around them), whatever the chunk."""
    monkeypatch.setattr(environment, "PREFIX_USAGE_CHUNK", chunk)
    meta, prefix = env.db("meta"), b"pfx"
    stored_items = {prefix + k: b"v" * len(k) for k in keys} | {b"pfw": b"x", b"pfy": b"yy", b"pf": b"z"}

    def write(txn):
        txn.drop(meta, delete=False)
        for key, value in stored_items.items():
            txn.put(key, value, db=meta)
    await env.submit(write)
    begin = prefix + start if start is not None else None
    wanted = [(k, v) for k, v in stored_items.items() if k.startswith(prefix) and (begin is None or k >= begin)]
    assert await env.prefix_usage(meta, prefix, begin) == (len(wanted), sum(len(v) for _, v in wanted))


async def test_prefix_usage_lets_the_event_loop_run_between_chunks(env, monkeypatch):
    monkeypatch.setattr(environment, "PREFIX_USAGE_CHUNK", 10)
    meta = env.db("meta")
    await env.submit(lambda txn: [txn.put(b"k%03d" % i, b"v", db=meta) for i in range(95)])
    loop, turns = asyncio.get_running_loop(), []

    def other_work() -> None:               # one step per event-loop turn while it counts
        turns.append(1)
        if not counting.done():
            loop.call_soon(other_work)

    counting = asyncio.ensure_future(env.prefix_usage(meta, b"k"))
    loop.call_soon(other_work)
    assert await counting == (95, 95)
    assert len(turns) >= 9                  # a turn between each two of its 10 chunks
