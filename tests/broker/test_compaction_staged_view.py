"""Topic compaction writes its view in bounded writes, as a new generation made current with
the compaction cursor's move: a compaction killed while it writes leaves the previous view."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import textwrap

from core_ext.poskeys import pack_i64
from pyengine.broker import Broker
from pyengine.storage.compacted import DB_NAME, GENERATION_MARK
from tests.broker.helpers import drain
from tests.broker.test_compaction import TOPIC, attach, compact, values

# Compacts the topic of the data dir in argv[1] with two entries a staged write, and stops for
# ever once two writes are durable (the third is about to be made): the test kills it there.
COMPACT_AND_HANG = textwrap.dedent(f"""
    import asyncio, sys, time
    import pyengine.broker.compaction as compaction
    from pyengine.broker import Broker
    from pyengine.storage.compacted import CompactedView

    compaction.STAGE_CHUNK_ENTRIES = 2
    original = CompactedView.stage_write
    calls = 0

    def stage_write(self, generation, entries):
        global calls
        calls += 1
        if calls == 3:
            print("STAGED", flush=True)
            time.sleep(60)
        return original(self, generation, entries)

    CompactedView.stage_write = stage_write

    async def main():
        async with Broker.embedded(sys.argv[1], sync=False) as broker:
            topic = await broker.service.get_topic({TOPIC!r})
            await topic.compaction.compact()
            print("NOT KILLED", flush=True)

    asyncio.run(main())
""")


def generation_rows(topic) -> dict[bytes, int]:
    """The number of rows of each generation of the topic's view."""
    prefix = GENERATION_MARK + pack_i64(topic.ledger.topic_id)
    counts: dict[bytes, int] = {}
    env = topic.ledger.env
    with env.read() as txn:
        cursor = txn.cursor(db=env.db(DB_NAME))
        if cursor.set_range(prefix):
            for key, _ in cursor:
                if not key.startswith(prefix):
                    break
                generation = key[len(prefix):len(prefix) + 8]
                counts[generation] = counts.get(generation, 0) + 1
    return counts


async def test_a_compaction_killed_while_writing_its_view_leaves_the_previous_one(tmp_path):
    async with Broker.embedded(tmp_path, sync=False) as broker:
        producer = await broker.create_producer(TOPIC)
        for i in range(10):
            await producer.send(f"v{i}".encode(), key=f"k{i % 5}")
        topic = await compact(broker)
        first_horizon = topic.compaction.horizon
        for i in range(20):
            await producer.send(f"w{i}".encode(), key=f"w{i}")
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-c", COMPACT_AND_HANG, str(tmp_path), stdout=asyncio.subprocess.PIPE,
        cwd=os.getcwd())
    try:
        line = await asyncio.wait_for(process.stdout.readline(), 30)
        assert line == b"STAGED\n"
    finally:
        if process.returncode is None:
            os.kill(process.pid, signal.SIGKILL)           # kill -9 mid-write
        await process.wait()
    async with Broker.embedded(tmp_path, sync=False) as broker:
        topic = await broker.service.get_topic(TOPIC)
        assert topic.compaction.horizon == first_horizon
        # What the killed compaction staged is there, beside the current view, and unseen.
        rows = generation_rows(topic)
        assert sorted(rows.values()) == [4, 5]
        consumer = await attach(broker, TOPIC)
        assert values(await drain(consumer)) == [(f"k{i}", f"v{i + 5}".encode()) for i in range(5)] + [
            (f"w{i}", f"w{i}".encode()) for i in range(20)]
        # The next compaction goes on from there, and removes what was staged.
        await compact(broker)
        assert list(generation_rows(topic).values()) == [25]
        latest = await attach(broker, TOPIC, "latest")
        assert len(await drain(latest)) == 25
