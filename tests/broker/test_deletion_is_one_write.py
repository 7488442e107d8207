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


# A topic's schema and topic-level policies are keyed by its name, not by its (fresh) topic id:
# they used to be deleted in commits of their own after the topic's, so a crash in between left
# them to a topic created again under that name (for a partitioned topic, after its metadata
# went: a retry of the delete was a 404). The worker sets both, deletes through the admin API and
# dies in the writer thread right after the commit in which `db`/`key` disappears.
CRASH_WORKER = textwrap.dedent("""
    import asyncio, os, sys
    import aiohttp
    from pyengine.admin import AdminServer
    from pyengine.broker.service import BrokerConfig, BrokerService
    from pyengine.schema import CompatibilityStrategy, SchemaData, SchemaType, schema_id
    from pyengine.storage import environment

    async def main(path, kind, db, key):
        service = BrokerService(BrokerConfig(data_dir=path, sync=False, num_coordinators=1))
        await service.start()
        admin = AdminServer(service, port=0)
        await admin.start()
        if kind == "partitioned":
            await service.policies.create_partitioned_topic("%(topic)s", 2)
            for i in range(2):
                await service.get_topic(f"%(topic)s-partition-{i}")
        else:
            await service.get_topic("%(topic)s")
        await service.schemas.registry.put_if_absent(schema_id("%(topic)s"), SchemaData(SchemaType.STRING),
                                                     CompatibilityStrategy.FULL)
        await service.policies.set_topic_policy("%(topic)s", "messageTTLInSeconds", 5)
        write_batch = environment.StorageEnvironment._write_batch

        def crash_once_gone(self, writes):
            result = write_batch(self, writes)
            with self._env.begin() as txn:
                if txn.get(key.encode(), db=self.db(db)) is None:
                    os._exit(137)
            return result
        environment.StorageEnvironment._write_batch = crash_once_gone
        url = admin.url + "/admin/v2/persistent/public/default/deleted" + ("/partitions" if kind == "partitioned" else "")
        async with aiohttp.ClientSession() as session:
            async with session.delete(url) as reply:
                print("deleted without a crash?", reply.status, await reply.text(), flush=True)

    asyncio.run(main(*sys.argv[1:]))
""") % {"topic": TOPIC}


@pytest.mark.parametrize("kind, db, key", [
    ("topic", "topics", TOPIC),
    ("partitioned", "topics", f"{TOPIC}-partition-0"),          # a retry of the delete finishes it
    ("partitioned", "topics", f"{TOPIC}-partition-1"),
    ("partitioned", "metadata", f"/admin/partitioned/{TOPIC}"),
])
async def test_a_topic_created_again_after_a_crash_during_its_deletion_has_no_old_schema_or_policies(
        tmp_path, kind, db, key):
    import aiohttp

    from pyengine.admin import AdminServer
    from pyengine.broker.service import BrokerConfig, BrokerService
    from pyengine.schema import schema_id

    data = tmp_path / "data"
    run = subprocess.run([sys.executable, "-c", CRASH_WORKER, str(data), kind, db, key], capture_output=True,
                         text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=60)
    assert run.returncode == 137, run.stdout + run.stderr

    service = BrokerService(BrokerConfig(data_dir=data, sync=False, num_coordinators=1))
    await service.start()
    admin = AdminServer(service, port=0)
    await admin.start()
    try:
        policies = service.policies
        url = admin.url + "/admin/v2/persistent/public/default/deleted"
        if kind == "partitioned":
            if policies.partitions(TOPIC):          # crashed before its metadata went: retry
                async with aiohttp.ClientSession() as session, session.delete(url + "/partitions") as reply:
                    assert reply.status == 204, await reply.text()
            assert not policies.partitions(TOPIC)
            assert not any(service.topic_exists(f"{TOPIC}-partition-{i}") for i in range(2))
            await policies.create_partitioned_topic(TOPIC, 2)
            topic = await service.get_topic(f"{TOPIC}-partition-0")
        else:
            assert not service.topic_exists(TOPIC)
            topic = await service.get_topic(TOPIC)
        # Created afresh: nothing of the old topic's.
        assert service.schemas.registry.latest(schema_id(TOPIC)) is None
        assert policies.topic_policies(TOPIC) == {}
        assert policies.message_ttl(topic.name) == policies.message_ttl_default
    finally:
        await admin.stop()
        await service.close()


async def test_a_topic_created_again_has_none_of_the_old_ones_transaction_state(tmp_path):
    """Its transaction-buffer snapshot and its subscriptions' pending-ack logs are deleted with
    it and stored under its topic id, which a topic created again under its name does not
    reuse: no aborted set or pending ack of the old topic shows there, before or after a
    restart."""
    data = tmp_path / "data"
    async with Broker.embedded(data, num_coordinators=1) as broker:
        producer = await broker.create_producer(TOPIC)
        aborted = await broker.new_transaction(timeout_ms=600_000)
        await producer.send(b"aborted", txn=aborted)
        await aborted.abort()
        await producer.send(b"m0")
        consumer = await broker.subscribe(TOPIC, "S", initial_position="earliest")
        message = await consumer.receive(timeout=5)
        pending = await broker.new_transaction(timeout_ms=600_000)
        await consumer.acknowledge(message, txn=pending)
        old = broker.service.topics[TOPIC]
        await old.buffer.take_snapshot()
        assert old.buffer.stats()["aborted_txn_count"] == 1
        assert old.subscriptions["S"].pending_ack.stats()["pending_individual_positions"] == 1
        await consumer.close()
        await producer.close()
        await broker.service.delete_topic(TOPIC)

        def fresh(topic):
            assert topic.ledger.topic_id != old.ledger.topic_id
            assert topic.buffer.stats()["aborted_txn_count"] == 0
            assert topic.subscriptions["S"].pending_ack.stats()["pending_individual_positions"] == 0

        consumer = await broker.subscribe(TOPIC, "S", initial_position="earliest")
        fresh(broker.service.topics[TOPIC])
        await consumer.close()
    async with Broker.embedded(data, num_coordinators=1) as broker:
        fresh(await broker.service.get_topic(TOPIC, create=False))
        await EmbeddedTransaction(broker.service, pending.txn_id, 600_000).commit()
        assert await _remaining(broker) == []          # nothing published on the new one
