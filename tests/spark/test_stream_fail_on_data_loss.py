"""`failOnDataLoss` on a stream (spark_udfs.stream), as Spark's Kafka source: a micro-batch that
finds what it was to read gone fails (DataDirChangedError) rather than silently leaving it out.
Retention records how far it trimmed a topic (TopicRecord.trimmed_through) in the write that
deletes the ledgers, so a ledger trimmed after the query read it all is no loss, and one
trimmed before is, whichever other topics' ledgers lie between. Without the option (the
default) the query reads on from what is left.

A broker writes, then stops, then the reader plans: LMDB allows one environment per process,
and the reader opens the data dir read-only only while it plans or reads."""

from __future__ import annotations

import asyncio

import pyarrow as pa
import pytest
from pyspark.errors import StreamingQueryException

from pyengine.broker import Broker
from pyengine.storage import ManagedLedgerConfig
from spark_udfs import SCHEMA
from spark_udfs.schema import ARROW_SCHEMA
from spark_udfs.source import DataDirChangedError, PyengineDataSource
from tests.spark.micro_batches import MicroBatches
from tests.spark.test_chunked_messages import Stored, chunked, stored_bytes

NS = "persistent://public/default/"
A, B = NS + "loss-a", NS + "loss-b"
CONFIG = dict(sync=False, ledger=ManagedLedgerConfig(max_entries_per_ledger=4))


def with_broker(data_dir, step) -> None:
    async def run():
        async with Broker.embedded(data_dir, **CONFIG) as broker:
            await step(broker)
    asyncio.run(run())


async def trim_closed_ledgers(broker, topic: str) -> None:
    """Retention deletes every closed ledger of `topic` (it has no subscription), not the current
    one (each broker start opens a ledger, and closes the one a broker before left open)."""
    ledger = (await broker.service.get_topic(topic)).ledger
    ledger.set_retention(0, 0)
    await ledger.trim(now_ms=1 << 62)


def send(data_dir, topic: str, *payloads: bytes, then_trim: bool = False) -> None:
    """Send `payloads` to `topic`; `then_trim`: then `trim_closed_ledgers`."""
    async def step(broker):
        producer = await broker.create_producer(topic)
        for payload in payloads:
            await producer.send(payload)
        await producer.close()
        if then_trim:
            await trim_closed_ledgers(broker, topic)
    with_broker(data_dir, step)


def trim(data_dir, topic: str) -> None:
    send(data_dir, topic, then_trim=True)


def delete(data_dir, topic: str) -> None:
    async def step(broker):
        await broker.service.delete_topic(topic)
    with_broker(data_dir, step)


def stream(data_dir, fail_on_data_loss: bool, **options) -> MicroBatches:
    reader = PyengineDataSource({"path": str(data_dir), "topics": A, "failOnDataLoss": str(fail_on_data_loss).lower(),
                                 **options}).streamReader(SCHEMA)
    return MicroBatches(reader)


def messages(prefix: str, count: int) -> list[bytes]:
    return [b"%s-%d" % (prefix.encode(), i) for i in range(count)]


@pytest.mark.parametrize("fail_on_data_loss", [True, False])
def test_entries_trimmed_before_a_micro_batch_read_them(tmp_path, fail_on_data_loss):
    send(tmp_path, A, *messages("first", 3))
    batches = stream(tmp_path, fail_on_data_loss)
    assert batches.next() == messages("first", 3)
    send(tmp_path, A, *messages("unread", 6))
    send(tmp_path, A, b"after", then_trim=True)
    if fail_on_data_loss:
        with pytest.raises(DataDirChangedError, match=rf"entries of {A} from \d+:\d+ through \d+:\d+ were trimmed"):
            batches.next()
    else:
        assert batches.next() == [b"after"]                     # what is left


def test_the_rest_of_a_ledger_read_in_part_trimmed_before_the_next_micro_batch(tmp_path):
    send(tmp_path, A, *messages("m", 3))
    batches = stream(tmp_path, True, maxEntriesPerTrigger="2")
    assert batches.next() == messages("m", 2)
    trim(tmp_path, A)                                           # m-2 goes with its ledger
    with pytest.raises(DataDirChangedError, match="were trimmed by retention before the query read them"):
        batches.next()


def test_ledgers_trimmed_after_the_query_read_them_are_no_loss(tmp_path):
    send(tmp_path, B, b"other")                                 # another topic's ledgers between
    send(tmp_path, A, *messages("read", 6))
    send(tmp_path, B, b"other")
    batches = stream(tmp_path, True)
    assert batches.next() == messages("read", 6)
    trim(tmp_path, A)                                           # all the read ones go
    assert batches.next() == []
    send(tmp_path, A, b"new", then_trim=True)                  # and the empty one since
    assert batches.next() == [b"new"]


def test_an_earliest_start_reads_what_is_left(tmp_path):
    send(tmp_path, A, *messages("gone", 5))
    send(tmp_path, A, b"left", then_trim=True)
    assert stream(tmp_path, True).next() == [b"left"]


def test_a_ledger_read_to_its_end_trimmed_with_an_empty_one_after_it_is_no_loss(tmp_path):
    send(tmp_path, A, *messages("read", 3))
    batches = stream(tmp_path, True)
    assert batches.next() == messages("read", 3)
    send(tmp_path, A)                                           # a restart leaves an empty ledger
    trim(tmp_path, A)                                           # both go
    assert batches.next() == []


def test_a_topic_that_appears_with_only_an_empty_ledger_trimmed_is_no_loss(tmp_path):
    send(tmp_path, A, b"a")
    batches = stream(tmp_path, True, topics=NS + "loss-*")
    assert batches.next() == [b"a"]
    send(tmp_path, B)                                           # created, never written
    trim(tmp_path, B)
    send(tmp_path, B, b"b")
    assert batches.next() == [b"b"]


@pytest.mark.parametrize("start", ["earliest", "latest"])
def test_a_start_resolved_when_the_query_begins_catches_a_trim_before_its_first_micro_batch(tmp_path, start):
    """`earliest` and `latest` are resolved to what is stored when the query begins (Kafka's
    source resolves them to offsets): a trim before the first micro-batch read the entries is a
    loss; what was trimmed before the query began is not."""
    send(tmp_path, A, *messages("before", 3))
    send(tmp_path, A, then_trim=True)                           # trimmed before the query
    batches = stream(tmp_path, True, startPosition=start)
    send(tmp_path, A, *messages("unread", 3))
    send(tmp_path, A, b"left", then_trim=True)
    with pytest.raises(DataDirChangedError, match="were trimmed by retention before the query read them"):
        batches.next()


def test_a_latest_start_on_a_topic_trimmed_empty_is_no_loss(tmp_path):
    send(tmp_path, A, *messages("before", 3))
    send(tmp_path, A, then_trim=True)
    batches = stream(tmp_path, True, startPosition="latest")
    assert batches.next() == []
    send(tmp_path, A, b"new")
    assert batches.next() == [b"new"]


@pytest.mark.parametrize("fail_on_data_loss", [True, False])
def test_entries_trimmed_between_planning_and_the_task(tmp_path, fail_on_data_loss):
    """As Kafka's source when offsets go out of range under a task: with failOnDataLoss the
    micro-batch fails; without, the task skips what is gone and the query reads on."""
    send(tmp_path, A, *messages("read", 3))
    batches = stream(tmp_path, fail_on_data_loss)
    assert batches.next() == messages("read", 3)
    send(tmp_path, A, *messages("planned", 3))
    reader = batches.reader
    end = reader.latestOffset(batches.offset, reader.getDefaultReadLimit())
    parts = reader.partitions(batches.offset, end)
    send(tmp_path, A, b"after", then_trim=True)                 # the planned ledger goes
    if fail_on_data_loss:
        with pytest.raises(DataDirChangedError, match="failOnDataLoss: entries .* were trimmed by retention .*"
                                                      "after the micro-batch was planned"):
            [batch for part in parts for batch in reader.read(part)]
    else:
        assert sum(batch.num_rows for part in parts for batch in reader.read(part)) == 0
        batches.offset = end
        assert batches.next() == [b"after"]



def publish_stored(data_dir, *items, then_trim: bool = False) -> None:
    """Store `items` (tests.spark.test_chunked_messages.Stored: messages, or chunks of one) as
    a producer sends them; `then_trim` as in `send`."""
    async def step(broker):
        producer = await broker.create_producer(A)
        for item in items:
            data, publish_time = stored_bytes(item)
            await producer._topic.publish(producer._producer, data, sequence_id=item.sequence_id,
                                          publish_time=publish_time, deduplicate=False)
        await producer.close()
        if then_trim:
            await trim_closed_ledgers(broker, A)
    with_broker(data_dir, step)


@pytest.mark.parametrize("fail_on_data_loss", [True, False])
def test_the_first_chunks_of_a_message_trimmed_before_its_last_came(tmp_path, fail_on_data_loss):
    """A micro-batch read the first chunk of a message (no row: the message is not whole); the
    ledger holding it was trimmed before the micro-batch that reads the last chunk. The offset
    had gone past the chunk, so only the chunk's look-back can tell: the message is lost."""
    whole = b"0123456789" * 4
    first, last = chunked("p", 2, whole, 2, False)
    publish_stored(tmp_path, Stored("p", 0, b"a"), Stored("p", 1, b"b"), first)
    batches = stream(tmp_path, fail_on_data_loss)
    assert batches.next() == [b"a", b"b"]
    publish_stored(tmp_path, last, Stored("p", 3, b"c"), then_trim=True)
    if fail_on_data_loss:
        with pytest.raises(DataDirChangedError, match="failOnDataLoss: a chunked message of .* began in entries "
                                                      "trimmed by retention"):
            batches.next()
    else:
        assert batches.next() == [b"c"]


def test_a_chunked_message_begun_before_the_query_and_trimmed_then_is_no_loss(tmp_path):
    """Its first chunk was trimmed before the query began (an earliest start resolves after what
    was trimmed): left out, as by a reader started there, and not a loss."""
    whole = b"0123456789" * 4
    first, last = chunked("p", 2, whole, 2, False)
    publish_stored(tmp_path, Stored("p", 0, b"a"), first)
    publish_stored(tmp_path, last, Stored("p", 3, b"c"), then_trim=True)
    assert stream(tmp_path, True).next() == [b"c"]


def test_an_offset_without_the_starts_of_an_older_checkpoint_reads_on(tmp_path):
    """Offsets keep where the query began each topic ($starts); one written before they were
    (a checkpoint of an earlier version) is read as before, and the next offset has them."""
    send(tmp_path, A, *messages("m", 3))
    batches = stream(tmp_path, True)
    assert batches.next() == messages("m", 3)
    assert set(batches.offset) == {A, "$starts"}
    old = {A: batches.offset[A]}
    send(tmp_path, A, b"more")
    end = batches.reader.latestOffset(old, batches.reader.getDefaultReadLimit())
    assert end["$starts"] == {A: old[A]}
    parts = batches.reader.partitions(old, end)
    assert sum(b.num_rows for p in parts for b in batches.reader.read(p)) == 1



@pytest.mark.parametrize("start", ["earliest", "latest"])
def test_a_first_micro_batch_planned_again_after_a_restart_begins_where_it_began(tmp_path, start):
    """Spark asks initialOffset again for a first micro-batch planned (its end logged) but not
    committed before a restart: resolved now, `earliest` would begin after entries trimmed
    since, and `latest` after entries written since, both left out silently. The batch begins
    where its logged end says it began."""
    send(tmp_path, A, *messages("before", 2))
    first = stream(tmp_path, True, startPosition=start).reader
    begun = first.initialOffset()
    send(tmp_path, A, *messages("m", 3))
    logged_end = first.latestOffset(begun, first.getDefaultReadLimit())
    again = stream(tmp_path, True, startPosition=start).reader          # the restarted query
    if start == "earliest":
        send(tmp_path, A, b"left", then_trim=True)
        with pytest.raises(DataDirChangedError, match="were trimmed by retention before the query read them"):
            again.partitions(again.initialOffset(), logged_end)
    else:
        send(tmp_path, A, b"after")                             # latest resolves past the m-s now
        parts = again.partitions(again.initialOffset(), logged_end)
        rows = pa.Table.from_batches([b for p in parts for b in again.read(p)], schema=ARROW_SCHEMA)
        assert sorted(rows.column("value").to_pylist()) == messages("m", 3)

def test_a_malformed_starts_in_an_offset_is_refused(tmp_path):
    from spark_udfs.options import OptionError

    send(tmp_path, A, b"a")
    reader = stream(tmp_path, True).reader
    for starts in ("1:0", {A: 7}, {A: "x:y"}):
        with pytest.raises(OptionError, match="offset|start of"):
            reader.latestOffset({A: "1:0", "$starts": starts}, reader.getDefaultReadLimit())

@pytest.mark.parametrize("named", ["by a pattern", "exactly"])
@pytest.mark.parametrize("fail_on_data_loss", [True, False])
def test_a_topic_deleted_after_the_query_read_it(tmp_path, fail_on_data_loss, named):
    """Named exactly too: the names were resolved again for each micro-batch, as at the start,
    and one deleted since failed every micro-batch for good ("unknown topic"), also from the
    checkpoint. It is no longer read, as Kafka's `subscribe` reads on."""
    send(tmp_path, A, b"a")
    send(tmp_path, B, b"b")
    batches = stream(tmp_path, fail_on_data_loss, topics=NS + "loss-*" if named == "by a pattern" else f"{A},{B}")
    assert batches.next() == [b"a", b"b"]
    delete(tmp_path, A)
    send(tmp_path, B, b"b2")
    if fail_on_data_loss:
        with pytest.raises(DataDirChangedError, match=f"{A} was deleted after the query read it up to"):
            batches.next()
    else:
        assert batches.next() == [b"b2"]


@pytest.mark.parametrize("fail_on_data_loss", [True, False])
def test_a_topic_deleted_and_created_again(tmp_path, fail_on_data_loss):
    send(tmp_path, A, b"old")
    batches = stream(tmp_path, fail_on_data_loss)
    assert batches.next() == [b"old"]
    delete(tmp_path, A)
    send(tmp_path, A, b"new")
    if fail_on_data_loss:
        with pytest.raises(DataDirChangedError, match="it was deleted and created again since"):
            batches.next()
    else:
        assert batches.next() == [b"new"]


def test_a_topic_that_appears_with_its_first_entries_trimmed(tmp_path):
    send(tmp_path, A, b"a")
    batches = stream(tmp_path, True, topics=NS + "loss-*")
    assert batches.next() == [b"a"]
    send(tmp_path, B, *messages("gone", 5))
    send(tmp_path, B, b"left", then_trim=True)
    with pytest.raises(DataDirChangedError, match=f"{B} appeared after the query started, and its entries through"):
        batches.next()


def test_a_topic_that_appears_whole_is_read_from_its_beginning(tmp_path):
    send(tmp_path, A, b"a")
    batches = stream(tmp_path, True, topics=NS + "loss-*")
    assert batches.next() == [b"a"]
    send(tmp_path, B, *messages("b", 5))
    assert batches.next() == messages("b", 5)


def test_a_malformed_fail_on_data_loss_is_refused(tmp_path):
    from spark_udfs.options import OptionError

    send(tmp_path, A, b"a")
    with pytest.raises(OptionError, match="failOnDataLoss must be true or false"):
        PyengineDataSource({"path": str(tmp_path), "topics": A, "failOnDataLoss": "yes please"}).streamReader(SCHEMA)


def test_a_streaming_query_fails_on_data_lost_between_its_runs(spark, tmp_path):
    """A real Structured Streaming query (availableNow, into a Parquet sink, from its checkpoint):
    the run after entries were trimmed unread fails, naming the option; without it the run reads
    what is left."""
    data_dir, checkpoint, out = tmp_path / "data", tmp_path / "checkpoint", tmp_path / "out"

    def run(fail_on_data_loss: bool):
        query = (spark.readStream.format("pyengine").option("topics", A)
                 .option("failOnDataLoss", str(fail_on_data_loss).lower()).load(str(data_dir))
                 .select("value").writeStream.format("parquet").option("path", str(out))
                 .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start())
        try:
            query.awaitTermination(120)
        except StreamingQueryException as exc:
            return exc
        return query.exception()

    send(data_dir, A, b"first")
    assert run(True) is None
    send(data_dir, A, *messages("unread", 5))
    send(data_dir, A, b"left", then_trim=True)
    error = run(True)
    assert error is not None and "failOnDataLoss" in str(error) and "were trimmed by retention" in str(error)
    assert run(False) is None
    assert sorted(bytes(row.value) for row in spark.read.parquet(str(out)).collect()) == [b"first", b"left"]
