"""Protobuf strings that are not UTF-8 (a key, a producer name, a property) reach the string
columns as UTF-8, each invalid sequence replaced by U+FFFD.

Arrow string columns (and Spark's) must hold UTF-8, and the decoder copied the bytes as they
were: Arrow's validation, or whatever read the column, failed on them. A consumer receives such
a message (the Python client hands the field out as bytes, the Java client decodes it with
replacement): so does the decoder, as the Java client reads it.
"""

from __future__ import annotations

import pyarrow as pa
import pytest

from core_ext.batch import build_batch
from core_ext.records import decode_entries
from pyengine.protocol.commands import message_metadata
from pyengine.protocol.pulsar_api_pb2 import SingleMessageMetadata
from pyengine.storage.entry import encode_entry, headers_and_payload
from tests.core_ext.test_records import _tag, _varint, column_rows
from tests.reference import records as ref

BAD = [b"\xff", b"k\xc3(", b"\xed\xa0\x80", b"\xf0\x9f\x98", b"ok \xe2\x82\xac"]   # the last is UTF-8


def _string(field: int, raw: bytes) -> bytes:
    return _tag(field, 2) + _varint(len(raw)) + raw


def _property(field: int, key: bytes, value: bytes) -> bytes:
    kv = _string(1, key) + _string(2, value)
    return _tag(field, 2) + _varint(len(kv)) + kv


def _entries() -> list[bytes]:
    # Appended fields: the last producer_name wins, as in protobuf.
    md = message_metadata("p", 1, 5).SerializeToString() + _string(1, b"producer \xfe") + _string(6, b"\xffkey")
    for raw in BAD:
        md += _property(4, raw, b"value \xc0" + raw)
    single = encode_entry(headers_and_payload(md, b"payload"))
    singles = []
    for i, raw in enumerate(BAD):
        meta = SingleMessageMetadata(payload_size=1).SerializeToString() + _string(2, raw) + _property(1, b"i", raw)
        singles.append((meta, b"%d" % i))
    md = message_metadata("p", 1, 5, num_messages_in_batch=len(BAD)).SerializeToString()
    batch = encode_entry(headers_and_payload(md, build_batch(singles)), num_messages=len(BAD))
    return [single, batch]


def _replaced(value):
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


def _as_the_java_client_reads(row: dict) -> dict:
    row = dict(row, key=_replaced(row["key"]), producer_name=_replaced(row["producer_name"]))
    row["properties"] = {_replaced(k): _replaced(v) for k, v in row["properties"].items()}
    return row


def _strings(n: int, pair) -> pa.Array:
    offsets, data = pair
    return pa.Array.from_buffers(pa.string(), n, [None, pa.py_buffer(offsets), pa.py_buffer(data)])


def test_string_columns_hold_utf8():
    values = _entries()
    columns = decode_entries([1, 1], [0, 1], values)
    for name in ("key", "producer_name", "property_keys", "property_values"):
        _strings(len(columns[name][0]) - 1, columns[name]).validate(full=True)
    rows = column_rows(columns)
    assert rows == [_as_the_java_client_reads(row) for row in ref.decode_entries([1, 1], [0, 1], values)]
    assert rows[0]["key"] == "\ufffdkey" and rows[0]["producer_name"] == "producer \ufffd"
    assert [row["key"] for row in rows[1:]] == ["\ufffd", "k\ufffd(", "\ufffd" * 3, "\ufffd", "ok \u20ac"]


def test_property_keys_told_apart_as_written():
    """Keys that differ only in invalid bytes are one key once replaced: it keeps its last value
    (a Spark map with a key twice is invalid)."""
    md = message_metadata("p", 1, 5).SerializeToString()
    md += _property(4, b"k\xff", b"1") + _property(4, b"x", b"2") + _property(4, b"k\xfe", b"3")
    columns = decode_entries([1], [0], [encode_entry(headers_and_payload(md, b"v"))])
    (key_offsets, keys), (value_offsets, values) = columns["property_keys"], columns["property_values"]
    assert [bytes(keys[key_offsets[j]:key_offsets[j + 1]]).decode() for j in range(2)] == ["x", "k\ufffd"]
    assert [bytes(values[value_offsets[j]:value_offsets[j + 1]]) for j in range(2)] == [b"2", b"3"]


@pytest.mark.parametrize("raw", BAD)
def test_a_key_alone_is_replaced_like_pythons_decoder(raw):
    md = message_metadata("p", 1, 5).SerializeToString() + _string(6, raw)
    [row] = column_rows(decode_entries([1], [0], [encode_entry(headers_and_payload(md, b"v"))]))
    assert row["key"] == raw.decode("utf-8", "replace")
