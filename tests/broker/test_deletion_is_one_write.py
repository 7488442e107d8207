"""Deleting a topic or a subscription is one LMDB write: a kill -9 right after the first commit of
the deletion leaves all of it or none of it. (Each part used to go in its own commit: the
pending-ack log first, so a crash there left the subscription without its pending acks, and the
commit of their transaction after the restart acked nothing: the message came back.)"""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from pyengine.broker import Broker
from pyengine.broker.embedded import EmbeddedTransaction
from pyengine.errors import TopicNotFoundError
from pyengine_kernels import TxnId

ROOT = Path(__file__).resolve().parents[2]
TOPIC = "persistent://public/default/deleted"

# Acks m0 in an open transaction, then deletes (the topic, or the subscription with force) and
# dies in the writer thread right after the first LMDB commit that the deletion makes (after
# what closing wrote).
WORKER = textwrap.dedent("""
    import asyncio, os, sys
    from pyengine.broker import Broker
    from pyengine.broker.subscription import Subscription
    from pyengine.broker.topic import Topic
    from pyengine.storage import environment

    async def main(path, what):
        async with Broker.embedded(path, num_coordinators=1) as broker:
            producer = await broker.create_producer("%(topic)s")
            await producer.send(b"m0")
            await producer.send(b"m1")
            consumer = await broker.subscribe("%(topic)s", "S", initial_position="earliest")
            message = await consumer.receive(timeout=5)
            txn = await broker.new_transaction(timeout_ms=600_000)
            await consumer.acknowledge(message, txn=txn)
            print("TXN", txn.txn_id.most_bits, txn.txn_id.least_bits, flush=True)
            await consumer.close()
            await producer.close()
            # Once the topic (the subscription) is closed, what it wrote while closing is
            # durable: the next commit is the deletion's first.
            write_batch = environment.StorageEnvironment._write_batch
            deleting = False

            def crash_after_a_deletion_commit(self, writes):
                result = write_batch(self, writes)
                if deleting:
                    os._exit(137)
                return result
            environment.StorageEnvironment._write_batch = crash_after_a_deletion_commit
            closed = Topic.close if what == "topic" else Subscription.close

            async def close_then_delete(self):
                nonlocal deleting
                await closed(self)
                deleting = True
            setattr(Topic if what == "topic" else Subscription, "close", close_then_delete)
            if what == "topic":
                await broker.service.delete_topic("%(topic)s")
            else:
                topic = await broker.service.get_topic("%(topic)s", create=False)
                await topic.unsubscribe("S", force=True)
            print("deleted without a commit?", flush=True)

    asyncio.run(main(sys.argv[1], sys.argv[2]))
""") % {"topic": TOPIC}


async def _remaining(broker: Broker) -> list[bytes]:
    consumer = await broker.subscribe(TOPIC, "S", initial_position="earliest")
    got = []
    try:
        while True:
            got.append((await consumer.receive(timeout=0.5)).data)
    except TimeoutError:
        pass
    await consumer.close()
    return got


@pytest.mark.parametrize("what", ["topic", "subscription"])
async def test_a_crash_during_a_deletion_leaves_all_or_nothing(tmp_path, what):
    data = tmp_path / "data"
    run = subprocess.run([sys.executable, "-c", WORKER, str(data), what], capture_output=True, text=True,
                         cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=60)
    assert run.returncode == 137, run.stdout + run.stderr
    most, least = (int(v) for v in run.stdout.split("TXN", 1)[1].split()[:2])

    async with Broker.embedded(data, num_coordinators=1) as broker:
        if what == "topic":
            with pytest.raises(TopicNotFoundError):
                await broker.service.get_topic(TOPIC, create=False)
        else:
            topic = await broker.service.get_topic(TOPIC, create=False)
            assert "S" not in topic.subscriptions
        # Its transaction still ends; the subscription, created afresh, starts from the start.
        await EmbeddedTransaction(broker.service, TxnId(most, least), 600_000).commit()
        expected = [] if what == "topic" else [b"m0", b"m1"]
        assert await _remaining(broker) == expected
