"""A transaction whose END_TXN is still on its way (held by a slow network, or never sent)
holds every READ_COMMITTED reader of its partitions just before its first entry, also from the
values of transactions that committed after that entry. This lasts until the transaction ends,
by its late commit or by its timeout, and no longer.

The soak of benchmarks/bench_soak.py met this at the end of a run: its readers drained while the
proxied worker's last END_TXN was still held by the delay proxy, and the checker counted the
values committed behind that transaction as lost writes. Nothing was lost: once the held
transaction ended, every reader read them.
"""

import asyncio

import pytest

from pyengine.client import Client, MessageId
from pyengine.client.transaction import COMMITTED, TIMED_OUT
from tests.client.conftest import NetworkBroker
from tests.clocks import PausedWallClock

TOPICS = ["persistent://public/default/late-end-0", "persistent://public/default/late-end-1"]


async def _read_to_the_end(reader) -> list[bytes]:
    values = []
    while await reader.has_message_available():
        values.append((await reader.read_next(5)).data)
    return values


async def _read_until(reader, expected: list[bytes], timeout: float) -> list[bytes]:
    values: list[bytes] = []
    async with asyncio.timeout(timeout):
        while values != expected:
            try:
                values.append((await reader.read_next(0.2)).data)
            except TimeoutError:
                continue
    return values


@pytest.mark.parametrize("end", ["late_commit", "timeout"])
async def test_an_open_txn_holds_readers_until_it_ends_then_everything_committed_after_it_shows(tmp_path, end):
    # The broker's clock stands still until the readers have drained: the held transaction's
    # 1.5 s timeout counts only from then (a slow machine's set-up took longer, and the
    # transaction was aborted before the drain it must hold back).
    clock = PausedWallClock()
    broker = NetworkBroker(tmp_path / "data", num_coordinators=4, clock=clock)
    await broker.start()
    try:
        await _held_then_ended(broker, clock, end)
    finally:
        await broker.stop()


async def _held_then_ended(broker: NetworkBroker, clock: PausedWallClock, end: str) -> None:
    async with Client(broker.url) as client:
        producers = [await client.create_producer(topic) for topic in TOPICS]
        before = [await producer.send(b"plain") for producer in producers]
        held = await client.new_transaction(timeout_ms=1500 if end == "timeout" else 60_000)
        for producer in producers:
            await producer.send(b"held", txn=held)
        later = await client.new_transaction(timeout_ms=60_000)
        for producer in producers:
            await producer.send(b"later", txn=later)
        await later.commit()                 # acknowledged while `held` is still open
        assert later.state == COMMITTED

        readers = [await client.create_reader(topic, MessageId.earliest, start_message_id_inclusive=True)
                   for topic in TOPICS]
        for reader, first in zip(readers, before):
            # The drain the soak did: the reader ends right before the held txn's first entry.
            assert await _read_to_the_end(reader) == [b"plain"]
            last = await reader.get_last_message_id()
            assert (last.ledger_id, last.entry_id) == (first.ledger_id, first.entry_id)

        clock.resume()
        if end == "late_commit":
            await held.commit()              # the END_TXN the proxy held arrives at last
            expected = [b"held", b"later"]
        else:
            expected = [b"later"]            # the coordinator aborts it at its timeout
        for reader in readers:
            assert await _read_until(reader, expected, timeout=10) == expected
            assert not await reader.has_message_available()
        if end == "timeout":
            assert held.state == TIMED_OUT
