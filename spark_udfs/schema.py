"""The rows the data source yields: one per message, as Spark and Arrow types.

| column | type | what |
| --- | --- | --- |
| topic | string | full topic name (`persistent://tenant/ns/name`) |
| ledger_id, entry_id | long | the entry's position in the managed ledger (a chunked message: its last chunk's) |
| batch_index | int | index of the message in its batch entry; -1 for an entry of one unbatched message |
| publish_time | timestamp | when the producer published it (ms precision) |
| event_time | timestamp, null if unset | the producer's event time |
| key | string, null if unset | the partition key |
| value | binary | the payload (decompressed) |
| properties | map<string,string> | the message properties |
| producer_name | string | |
| sequence_id | long | the producer's sequence id (Pulsar's uint64 as signed: markers carry -1) |
| txnid_most, txnid_least | long, null outside transactions | the transaction id (coordinator, sequence) |
| is_marker | boolean | a commit/abort marker (only with `includeMarkers`) |
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import (
    BinaryType,
    BooleanType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

SCHEMA = StructType([
    StructField("topic", StringType(), False),
    StructField("ledger_id", LongType(), False),
    StructField("entry_id", LongType(), False),
    StructField("batch_index", IntegerType(), False),
    StructField("publish_time", TimestampType(), False),
    StructField("event_time", TimestampType(), True),
    StructField("key", StringType(), True),
    StructField("value", BinaryType(), False),
    StructField("properties", MapType(StringType(), StringType(), valueContainsNull=False), False),
    StructField("producer_name", StringType(), False),
    StructField("sequence_id", LongType(), False),
    StructField("txnid_most", LongType(), True),
    StructField("txnid_least", LongType(), True),
    StructField("is_marker", BooleanType(), False),
])

# Exactly what Spark checks a yielded RecordBatch against.
ARROW_SCHEMA: pa.Schema = to_arrow_schema(SCHEMA, timezone="UTC")
_TYPES = {f.name: f.type for f in ARROW_SCHEMA}

# The columns READ_COMMITTED visibility reads (the arguments of the UDF, in order).
VISIBILITY_COLUMNS = ("ledger_id", "entry_id", "txnid_most", "txnid_least", "is_marker")


def _validity(valid: np.ndarray) -> pa.Buffer | None:
    if valid.all():
        return None
    return pa.py_buffer(np.packbits(valid, bitorder="little"))


def _var(kind: str, n: int, pair, valid: np.ndarray | None = None) -> pa.Array:
    offsets, data = pair
    return pa.Array.from_buffers(_TYPES[kind] if kind in _TYPES else kind, n,
                                 [None if valid is None else _validity(valid), pa.py_buffer(offsets),
                                  pa.py_buffer(data)])


def _constant_string(text: str, n: int) -> pa.Array:
    raw = text.encode()
    offsets = np.arange(n + 1, dtype=np.int32) * np.int32(len(raw))
    return pa.Array.from_buffers(pa.string(), n, [None, pa.py_buffer(offsets), pa.py_buffer(raw * n)])


def _fixed(kind: pa.DataType, n: int, values: np.ndarray, valid: np.ndarray | None = None) -> pa.Array:
    return pa.Array.from_buffers(kind, n, [None if valid is None else _validity(valid), pa.py_buffer(values)])


def record_batch(topic: str, columns: dict) -> pa.RecordBatch:
    """The RecordBatch of `core_ext.records.decode_entries` output for one topic (buffers are
    handed to Arrow without copies, except the constant topic column and bit-packed masks)."""
    n = columns["rows"]
    keys = _var(pa.string(), len(columns["property_keys"][0]) - 1, columns["property_keys"])
    values = _var(pa.string(), len(columns["property_values"][0]) - 1, columns["property_values"])
    properties = pa.MapArray.from_arrays(pa.array(columns["property_offsets"], pa.int32()), keys, values,
                                         type=_TYPES["properties"])
    txn_valid = columns["txn_valid"]
    arrays = [
        _constant_string(topic, n),
        _fixed(pa.int64(), n, columns["ledger_id"]),
        _fixed(pa.int64(), n, columns["entry_id"]),
        _fixed(pa.int32(), n, columns["batch_index"]),
        _fixed(_TYPES["publish_time"], n, columns["publish_time"]),
        _fixed(_TYPES["event_time"], n, columns["event_time"], columns["event_time_valid"]),
        _var("key", n, columns["key"], columns["key_valid"]),
        _var("value", n, columns["value"]),
        properties,
        _var("producer_name", n, columns["producer_name"]),
        _fixed(pa.int64(), n, columns["sequence_id"]),
        _fixed(pa.int64(), n, columns["txnid_most"], txn_valid),
        _fixed(pa.int64(), n, columns["txnid_least"], txn_valid),
        pa.array(columns["is_marker"], pa.bool_()),
    ]
    return pa.RecordBatch.from_arrays(arrays, schema=ARROW_SCHEMA)


__all__ = ["ARROW_SCHEMA", "SCHEMA", "VISIBILITY_COLUMNS", "record_batch"]
