"""Chunked messages in the data source (`spark_udfs.chunks`): one row per message, at its last
chunk, whatever partition, ledger or micro-batch its chunks are read by.

Before, each chunk came as a row of its own, and a compressed chunked message (compressed
whole, then cut) failed the whole read: a chunk alone does not decompress.

The property test writes random interleavings of plain and chunked messages of several
producers (with the accidents a consumer meets: a chunk sent twice, a chunk missing, a message
abandoned half-way, a message sent again from its first chunk) over small ledgers, reads them
with partitions of every size from several start positions, and compares with a sequential
reader written here from Pulsar's consumer rules (a first chunk starts the message, a
duplicate is ignored, a gap drops it)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from core_ext.records import RecordFormatError, chunk_indices, decode_entries
from pyengine.broker import Broker
from pyengine.client import Client
from pyengine.protocol.pulsar_api_pb2 import CompressionType, MessageMetadata
from pyengine.storage.entry import encode_entry, headers_and_payload
from pyengine.storage.managed_ledger import ManagedLedgerConfig
from pyengine_kernels import Position
from spark_udfs.chunks import RangeChunks, parse_chunk
from spark_udfs.options import parse_options
from spark_udfs.schema import ARROW_SCHEMA
from spark_udfs.source import PyengineDataSource
from spark_udfs import SCHEMA
from tests.client.conftest import NetworkBroker
from tests.spark.workload import read_directly

T = "persistent://public/default/chunked"


# --- the stream written: plain messages and chunks ------------------------------------------

@dataclass(frozen=True)
class Stored:
    producer: str
    sequence_id: int
    payload: bytes              # as stored (a chunk: its part of the compressed message)
    uuid: str = ""              # chunks only
    chunk_id: int = -1
    num_chunks: int = 0
    compressed: bool = False
    whole: bytes = b""          # chunks: the message as sent (uncompressed)


def chunked(producer: str, sequence_id: int, whole: bytes, parts: int, compressed: bool) -> list[Stored]:
    sent = zlib.compress(whole) if compressed else whole
    size = -(-len(sent) // parts)
    pieces = [sent[i * size:(i + 1) * size] for i in range(parts)]
    return [Stored(producer, sequence_id, piece, f"{producer}-{sequence_id}", i, parts, compressed, whole)
            for i, piece in enumerate(pieces)]


@st.composite
def streams(draw) -> list[Stored]:
    """Per producer, its sends in order (plain, or chunked with an accident); then the
    producers' entries interleaved, each producer's in its own order."""
    per_producer = []
    for producer in ("p0", "p1", "p2")[:draw(st.integers(1, 3))]:
        entries: list[Stored] = []
        for sequence_id in range(draw(st.integers(0, 5))):
            whole = draw(st.binary(min_size=2, max_size=40)) * draw(st.integers(1, 3))
            if draw(st.booleans()):
                entries.append(Stored(producer, sequence_id, whole))
                continue
            pieces = chunked(producer, sequence_id, whole, draw(st.integers(2, 4)), draw(st.booleans()))
            accident = draw(st.sampled_from(["none", "none", "duplicate", "gap", "abandoned", "resent"]))
            at = draw(st.integers(0, len(pieces) - 1))
            if accident == "duplicate":
                pieces.insert(at + 1, pieces[at])
            elif accident == "gap" and 0 < at < len(pieces) - 1:
                del pieces[at]
            elif accident == "abandoned":
                pieces = pieces[:at]
            elif accident == "resent":
                pieces = pieces[:at + 1] + pieces
            entries.extend(pieces)
        per_producer.append(entries)
    stream = []
    while any(per_producer):
        turn = draw(st.sampled_from([entries for entries in per_producer if entries]))
        stream.append(turn.pop(0))
    return stream


def stored_bytes(item: Stored) -> tuple[bytes, int]:
    """The producer's message bytes (headers and payload) and the publish time."""
    publish_time = 1_700_000_000_000 + item.sequence_id
    metadata = MessageMetadata(producer_name=item.producer, sequence_id=item.sequence_id, publish_time=publish_time)
    if item.uuid:
        metadata.partition_key = item.uuid
        metadata.uuid = item.uuid
        metadata.chunk_id = item.chunk_id
        metadata.num_chunks_from_msg = item.num_chunks
        metadata.total_chunk_msg_size = len(zlib.compress(item.whole) if item.compressed else item.whole)
        if item.compressed:
            metadata.compression = CompressionType.ZLIB
            metadata.uncompressed_size = len(item.whole)
    return headers_and_payload(metadata.SerializeToString(), item.payload), publish_time


async def write(data_dir: Path, stream: list[Stored]) -> list[Position]:
    """Each item as one entry, in order, over ledgers of 3 entries; their positions."""
    positions = []
    async with Broker.embedded(data_dir, sync=False, ledger=ManagedLedgerConfig(max_entries_per_ledger=3)) as broker:
        producer = await broker.create_producer(T)
        for item in stream:
            data, publish_time = stored_bytes(item)
            positions.append(await producer._topic.publish(producer._producer, data, sequence_id=item.sequence_id,
                                                           publish_time=publish_time, deduplicate=False))
    return positions


def sequential_reader(stream: list[Stored], positions: list[Position], start: Position) -> list[tuple]:
    """What a reader started at `start` receives, by Pulsar's consumer rules: (ledger, entry,
    value) per message; a chunked message at its last chunk."""
    rows, contexts = [], {}
    for item, position in zip(stream, positions):
        if position < start:
            continue
        if not item.uuid:
            rows.append((position.ledger_id, position.entry_id, item.payload))
            continue
        received = contexts.get(item.uuid)
        if item.chunk_id == 0:
            received = contexts[item.uuid] = []
        elif received is None or item.chunk_id < len(received):
            continue                                # no first chunk seen / a duplicate
        elif item.chunk_id > len(received):
            del contexts[item.uuid]                 # a gap
            continue
        received.append(item)
        if len(received) == item.num_chunks:
            del contexts[item.uuid]
            rows.append((position.ledger_id, position.entry_id, item.whole))
    return sorted(rows)


def rows_of(table: pa.Table) -> list[tuple]:
    return sorted(zip(table.column("ledger_id").to_pylist(), table.column("entry_id").to_pylist(),
                      table.column("value").to_pylist()))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(stream=streams(), data=st.data())
def test_partitions_of_any_size_read_each_message_once_as_a_reader_would(tmp_path_factory, stream, data):
    data_dir = tmp_path_factory.mktemp("chunks") / "data"
    positions = asyncio.run(write(data_dir, stream))
    starts = [Position.EARLIEST] + ([data.draw(st.sampled_from(positions))] if positions else [])
    for start in starts:
        expected = sequential_reader(stream, positions, start)
        for size in (1, 2, 5, 100_000):
            options = {"topics": T, "maxPartitionEntries": str(size)}
            if start != Position.EARLIEST:
                options["startPosition"] = str(start)
            assert rows_of(read_directly(data_dir, **options)) == expected, (start, size)


# --- the decoder and the assembler -----------------------------------------------------------

def test_the_decoder_leaves_chunks_out_of_its_rows_and_lists_them():
    items = [Stored("p", 0, b"plain"), *chunked("p", 1, b"x" * 50, 2, True), Stored("p", 2, b"after")]
    values = [encode_entry(stored_bytes(item)[0]) for item in items]
    ledgers, entries = np.zeros(4, np.int64), np.arange(4, dtype=np.int64)
    columns = decode_entries(ledgers, entries, values)
    assert columns["rows"] == 2 and columns["chunks"].tolist() == [1, 2]
    assert chunk_indices(ledgers, entries, values).tolist() == [1, 2]
    assert chunk_indices(ledgers, entries, values, np.array([True, False, True, True])).tolist() == [2]
    assert decode_entries(ledgers, entries, values, np.array([True, False, False, True]))["chunks"].tolist() == []


def test_a_malformed_chunk_entry_is_a_clear_error():
    with pytest.raises(RecordFormatError, match="shorter than its 32-byte header"):
        chunk_indices([0], [0], [b"\x01short"])
    with pytest.raises(RecordFormatError, match="entry 4:7: the message metadata overruns"):
        chunk_indices([4], [7], [encode_entry(b"\x00\x00\x10\x00abc")])
    with pytest.raises(ValueError, match="2 values but 1 ledger ids"):
        chunk_indices([0], [0, 1], [b"", b""])
    with pytest.raises(ValueError, match="1 values but 2 keep flags"):
        chunk_indices([0], [0], [encode_entry(stored_bytes(Stored("p", 0, b"x"))[0])], np.array([True, True]))
    with pytest.raises(RecordFormatError, match="entry 3:9"):
        parse_chunk(3, 9, encode_entry(b"\x00\x00\x00\x05\xff\xff\xff\xff\xff"))


def test_a_range_completes_a_message_begun_before_it_by_reading_back():
    first, last = chunked("p", 7, b"abcdef" * 5, 2, False)
    pieces = RangeChunks()
    last_chunk = parse_chunk(0, 5, encode_entry(stored_bytes(last)[0]))
    assert pieces.add(last_chunk) is None                   # its first chunk is before the range
    asked = []

    def look_back(uuids):
        asked.append(uuids)
        return {"p-7": [parse_chunk(0, 2, encode_entry(stored_bytes(first)[0]))]}

    [(chunk, entry)] = pieces.finish(look_back)
    assert asked == [{"p-7"}] and (chunk.ledger_id, chunk.entry_id) == (0, 5)
    row = decode_entries([0], [5], [entry])
    assert row["rows"] == 1 and row["chunks"].tolist() == []
    offsets, data = row["value"]
    assert bytes(data[offsets[0]:offsets[1]]) == b"abcdef" * 5
    assert RangeChunks().finish(look_back) == [] and len(asked) == 1     # nothing begun before: no look-back


# --- end to end: the real client's chunks, compressed, in transactions, in Spark -----------------

LIMIT = 10_000


async def _write_with_the_client(data_dir: Path) -> dict:
    broker = NetworkBroker(data_dir, num_coordinators=1, max_message_size=LIMIT,
                           ledger=ManagedLedgerConfig(max_entries_per_ledger=4))
    await broker.start()
    try:
        async with Client(broker.url, operation_timeout_seconds=10) as client:
            producer = await client.create_producer(T, chunking_enabled=True, compression_type="lz4",
                                                    producer_name="big")
            big = os.urandom(LIMIT * 2) + bytes(LIMIT * 20)          # compresses, still over the limit
            committed, aborted = await client.new_transaction(), await client.new_transaction()
            sent = {"plain": await producer.send(big, key="k1", properties={"a": "1"})}
            sent["committed"] = await producer.send(big[::-1], txn=committed)
            await producer.send(b"x" + big, txn=aborted)
            await aborted.abort()
            await committed.commit()
            sent["small"] = await producer.send(b"small")
            return {"big": big, "sent": sent}
    finally:
        await broker.stop()


@pytest.fixture(scope="module")
def client_data(tmp_path_factory) -> tuple[Path, dict]:
    data_dir = tmp_path_factory.mktemp("chunks-client") / "data"
    return data_dir, asyncio.run(_write_with_the_client(data_dir))


def test_spark_reads_the_clients_compressed_chunked_messages_whole_read_committed(spark, client_data):
    data_dir, written = client_data
    big, sent = written["big"], written["sent"]
    assert len(sent["plain"].chunk_ids) >= 3                 # over several ledgers of 4 entries
    frame = (spark.read.format("pyengine").options(topics=T, maxPartitionEntries="2").load(str(data_dir))
             .select("ledger_id", "entry_id", "batch_index", "key", "properties", "value", "txnid_most"))
    rows = sorted(frame.collect(), key=lambda r: (r.ledger_id, r.entry_id))
    assert [(r.ledger_id, r.entry_id) for r in rows] == \
        [(sent[k].ledger_id, sent[k].entry_id) for k in ("plain", "committed", "small")]
    plain, committed, small = rows
    assert plain.value == big and plain.key == "k1" and plain.properties == {"a": "1"} and plain.batch_index == -1
    assert committed.value == big[::-1] and committed.txnid_most is not None
    assert small.value == b"small"
    uncommitted = read_directly(data_dir, topics=T, isolation="read_uncommitted", maxPartitionEntries="3")
    assert sorted(uncommitted.column("value").to_pylist(), key=len) == [b"small", big, big[::-1], b"x" + big]


def test_a_stream_gives_a_chunked_message_once_in_the_micro_batch_of_its_last_chunk(client_data):
    data_dir, written = client_data
    reader = PyengineDataSource({"path": str(data_dir), "topics": T, "maxEntriesPerTrigger": "1"}).streamReader(SCHEMA)
    offset, values = reader.initialOffset(), []
    for _ in range(100):
        end = reader.latestOffset(offset, reader.getDefaultReadLimit())
        if end == offset:
            break
        batches = [b for part in reader.partitions(offset, end) for b in reader.read(part)]
        values += pa.Table.from_batches(batches, schema=ARROW_SCHEMA).column("value").to_pylist()
        offset = end
    assert values == [written["big"], written["big"][::-1], b"small"]


def test_a_start_inside_a_chunked_message_leaves_it_out_as_a_reader_started_there(client_data):
    data_dir, written = client_data
    second_chunk = written["sent"]["plain"].chunk_ids[1]
    table = read_directly(data_dir, topics=T, startPosition=f"{second_chunk.ledger_id}:{second_chunk.entry_id}")
    assert table.column("value").to_pylist() == [written["big"][::-1], b"small"]


def test_reads_are_bounded_by_bytes_as_well_as_entries(client_data, monkeypatch):
    """A worker reads stored entries about _READ_BYTES at a time (64 MiB; chunks and large
    messages would otherwise be read 1024 entries at once), looking back as well: the rows are
    the same at any bound."""
    import spark_udfs.source as source

    data_dir, written = client_data
    whole = rows_of(read_directly(data_dir, topics=T))
    sizes = []
    real = source.StoreReader

    class Counting(real):
        @contextlib.contextmanager
        def view(self):
            with real.view(self) as view:
                original = view.iter_raw

                def iter_raw(*args, **kwargs):
                    for raw in original(*args, **kwargs):
                        sizes.append(sum(len(v) for v in raw[2]))
                        yield raw
                view.iter_raw = iter_raw
                yield view

    monkeypatch.setattr(source, "StoreReader", Counting)
    monkeypatch.setattr(source, "_READ_BYTES", LIMIT)
    assert rows_of(read_directly(data_dir, topics=T)) == whole
    assert len(whole) == 3 and sizes and max(sizes) < 2 * LIMIT + 1024
