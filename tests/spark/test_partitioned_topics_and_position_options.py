"""The `topics` option naming a partitioned topic, and position options that select nothing
they say: what Spark plans (`PyengineDataSource.reader`, then `read()` of every partition),
without a Spark query.

* A partitioned topic is stored as its partitions (`<topic>-partition-<n>`); its consumers read
  them all. Naming it gave "unknown topic ...: it is not stored in this data dir".
* `endPosition=earliest` failed in planning with a bare `TypeError` ('<' not supported between
  Position and str).
* A per-topic `startPosition`/`endPosition` naming a topic that is not read (a typo, or the
  partitioned topic instead of a partition) was ignored: every row of the topics read came back.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from pyengine.broker import Broker
from pyengine.client.message import MessageId
from spark_udfs.options import OptionError
from spark_udfs.source import PyengineDataSource
from tests.spark.workload import read_directly

PARTITIONED = "persistent://public/default/parted"
PARTITIONS = [f"{PARTITIONED}-partition-{i}" for i in range(3)]
OTHER = "persistent://public/default/parted-other"      # a topic sharing the partitioned topic's prefix


async def _write(data_dir: Path) -> list[tuple[str, int, int, bytes]]:
    """Plain and transactional messages on the partitions (one txn committed across two of
    them, one aborted, one left open on the last), and what READ_COMMITTED readers receive."""
    async with Broker.embedded(data_dir) as broker:
        await broker.service.policies.create_partitioned_topic(PARTITIONED, len(PARTITIONS))
        producers = [await broker.create_producer(name) for name in [*PARTITIONS, OTHER]]
        for i, producer in enumerate(producers):
            await producer.send(f"plain-{i}".encode())
        committed, aborted, pending = [await broker.new_transaction() for _ in range(3)]
        await producers[0].send(b"committed-0", txn=committed)
        await producers[1].send(b"committed-1", txn=committed)
        await producers[1].send(b"aborted-1", txn=aborted)
        await committed.commit()
        await aborted.abort()
        await producers[2].send(b"open-2", txn=pending)
        await producers[2].send(b"behind-open-2")
        await producers[0].send(b"after-0")
        delivered = []
        for name in PARTITIONS:
            reader = await broker.create_reader(name, MessageId.earliest)
            while True:
                try:
                    message = await reader.receive(timeout=0.3)
                except TimeoutError:
                    break
                delivered.append((name, message.message_id.ledger_id, message.message_id.entry_id, message.data))
            await reader.close()
    return delivered


@pytest.fixture(scope="module")
def partitioned(tmp_path_factory) -> tuple[Path, list]:
    data_dir = tmp_path_factory.mktemp("partitioned") / "data"
    return data_dir, asyncio.run(_write(data_dir))


def _rows(table) -> list[tuple[str, int, int, bytes]]:
    return sorted(zip(*(table.column(c).to_pylist() for c in ("topic", "ledger_id", "entry_id", "value"))))


def test_a_partitioned_topic_reads_as_its_consumers_receive_it(partitioned):
    data_dir, delivered = partitioned
    assert {b"committed-0", b"committed-1"} <= {value for *_, value in delivered}
    for name in (PARTITIONED, "public/default/parted", "parted"):
        assert _rows(read_directly(data_dir, topics=name)) == sorted(delivered), name
    uncommitted = _rows(read_directly(data_dir, topics=PARTITIONED, isolation="read_uncommitted"))
    assert {topic for topic, *_ in uncommitted} == set(PARTITIONS)
    assert {b"aborted-1", b"open-2", b"behind-open-2"} <= {value for *_, value in uncommitted}


def test_a_partitioned_topic_with_no_stored_partition_is_still_unknown(partitioned):
    data_dir, _ = partitioned
    for name in ("persistent://public/default/parte", "persistent://public/default/parted-partition"):
        with pytest.raises(OptionError, match="unknown topic"):
            source = PyengineDataSource({"path": str(data_dir), "topics": name})
            source.reader(source.schema())


@pytest.mark.parametrize(("options", "message"), [
    ({"endPosition": "earliest"}, "endPosition cannot be earliest"),
    ({"endPosition": f'{{"{PARTITIONS[0]}": "earliest"}}'}, "cannot be earliest"),
    # The partitioned topic is read, but positions are the partitions' own.
    ({"topics": PARTITIONED, "startPosition": f'{{"{PARTITIONED}": "1:0"}}'},
     f"startPosition names '{PARTITIONED}', which is not among the topics read"),
    ({"topics": PARTITIONS[0], "endPosition": f'{{"{PARTITIONS[1]}": "latest"}}'},
     "endPosition names .*partition-1', which is not among the topics read"),
    # A start after the end, both given (an audit's finding: silently empty; Spark's Kafka
    # source refuses it too).
    ({"startPosition": "5:3", "endPosition": "5:2"}, "startPosition 5:3 is after endPosition 5:2"),
    ({"startPosition": f'{{"{PARTITIONS[0]}": "9:0"}}', "endPosition": "3:7"},
     f"after endPosition 3:7 for {PARTITIONS[0]}"),
])
def test_positions_that_would_select_nothing_they_name_are_refused(partitioned, options, message):
    data_dir, _ = partitioned
    with pytest.raises(OptionError, match=message):
        source = PyengineDataSource({"path": str(data_dir), **options})
        source.reader(source.schema())


def test_per_topic_positions_of_the_topics_read_still_apply(partitioned):
    data_dir, delivered = partitioned
    first = min((ledger, entry) for topic, ledger, entry, _ in delivered if topic == PARTITIONS[0])
    start = f'{{"{PARTITIONS[0]}": "{first[0]}:{first[1] + 1}"}}'
    want = sorted(row for row in delivered if row[0] != PARTITIONS[0] or row[1:3] > first)
    assert _rows(read_directly(data_dir, topics=PARTITIONED, startPosition=start)) == want
