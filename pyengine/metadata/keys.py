"""Byte encodings shared by the backends: order-preserving index keys and the stored form of a
record (its envelope).

Index keys are ints (signed 64-bit), str, bytes, or tuples of them. They are encoded so that
byte order is key order (the FoundationDB tuple-layer idea): each element is a type tag and a
self-delimiting body (ints: 8 bytes big-endian with the sign bit flipped; bytes and str: the
bytes with NUL escaped as NUL 0xFF, then NUL), and a key ends with a NUL. Ints sort before
bytes, bytes before str; a tuple sorts before the tuples that extend it. A scalar and the
1-tuple holding it are the same key (decoded as the scalar). An index entry is stored under
`encode_index_key(key) + path`, so entries sort by key, then path.
"""

from __future__ import annotations

import struct
from typing import Any

from pyengine.metadata import IndexKey, MetadataStoreError

_INT = 0x10
_BYTES = 0x20
_STR = 0x30
_END = 0x00
_I64 = struct.Struct(">Q")
MAX_INDEX_KEY_BYTES = 4096


def _elements(key: IndexKey) -> tuple:
    return key if isinstance(key, tuple) else (key,)


def _encode_elements(elements: tuple, out: bytearray) -> None:
    for element in elements:
        if isinstance(element, bool):
            element = int(element)
        if isinstance(element, int):
            if not -(1 << 63) <= element < (1 << 63):
                raise ValueError(f"index key int out of the signed 64-bit range: {element}")
            out.append(_INT)
            out += _I64.pack(element + (1 << 63))
        elif isinstance(element, (bytes, str)):
            raw = element.encode() if isinstance(element, str) else element
            out.append(_STR if isinstance(element, str) else _BYTES)
            out += raw.replace(b"\x00", b"\x00\xff")
            out.append(0)
        else:
            raise TypeError(f"an index key element is an int, str or bytes, not {type(element).__name__}")


def encode_index_key(key: IndexKey) -> bytes:
    """The full key, terminated: entries of exactly this key start with these bytes."""
    elements = _elements(key)
    if not elements:
        raise ValueError("an index key cannot be an empty tuple")
    out = bytearray()
    _encode_elements(elements, out)
    out.append(_END)
    if len(out) > MAX_INDEX_KEY_BYTES:
        raise ValueError(f"index key longer than {MAX_INDEX_KEY_BYTES} bytes encoded")
    return bytes(out)


def encode_index_prefix(key: IndexKey) -> bytes:
    """An unterminated key: entries of this key and of the tuples extending it start with these."""
    elements = _elements(key)
    if not elements:
        raise ValueError("an index key prefix cannot be an empty tuple")
    out = bytearray()
    _encode_elements(elements, out)
    return bytes(out)


def decode_index_entry(data: bytes) -> tuple[IndexKey, str]:
    """(key, path) from `encode_index_key(key) + path`; MetadataStoreError when `data` is not one."""
    try:
        return _decode_index_entry(data)
    except (struct.error, ValueError) as exc:      # (cut short, or not UTF-8)
        raise MetadataStoreError(f"corrupt index entry: {exc}") from None


def _decode_index_entry(data: bytes) -> tuple[IndexKey, str]:
    elements: list[Any] = []
    i = 0
    n = len(data)
    while True:
        if i >= n:
            raise MetadataStoreError("corrupt index entry")
        tag = data[i]
        i += 1
        if tag == _END:
            break
        if tag == _INT:
            elements.append(_I64.unpack_from(data, i)[0] - (1 << 63))
            i += 8
        elif tag in (_BYTES, _STR):
            body = bytearray()
            while True:
                j = data.index(b"\x00", i)
                body += data[i:j]
                if j + 1 < n and data[j + 1] == 0xFF:
                    body.append(0)
                    i = j + 2
                else:
                    i = j + 1
                    break
            elements.append(body.decode() if tag == _STR else bytes(body))
        else:
            raise MetadataStoreError("corrupt index entry")
    key = elements[0] if len(elements) == 1 else tuple(elements)
    return key, data[i:].decode()


def prefix_end(prefix: bytes) -> bytes | None:
    """The smallest byte string greater than every string starting with `prefix` (None: none)."""
    data = bytearray(prefix)
    while data:
        if data[-1] < 0xFF:
            data[-1] += 1
            return bytes(data)
        data.pop()
    return None


def index_range(start: IndexKey, end: IndexKey, prefix: IndexKey) -> tuple[bytes, bytes | None]:
    """[low, high) over index entries (`encode_index_key(key) + path`), high None: unbounded."""
    if prefix is not None:
        if start is not None or end is not None:
            raise ValueError("give either a prefix or a start/end range, not both")
        low = encode_index_prefix(prefix)
        # after a complete element comes a tag (< 0xFF) or the end; 0xFF would continue an
        # escaped NUL inside the last element, i.e. a different, longer element
        return low, low + b"\xff"
    low = encode_index_key(start) if start is not None else b""
    high = encode_index_key(end) if end is not None else None
    return low, high


def index_keys_for(specs: Any, record: Any) -> list[tuple[str, bytes]]:
    """The (index name, encoded key) entries of `record` under the declared index specs.
    A failing key function fails the write (nothing is written)."""
    entries = []
    for spec in specs:
        if not record.path.startswith(spec.prefix):
            continue
        try:
            key = spec.key_fn(record)
            if key is None:
                continue
            entries.append((spec.name, encode_index_key(key)))
        except Exception as exc:
            raise MetadataStoreError(f"index {spec.name!r} cannot index {record.path}: {exc!r}") from exc
    entries.sort()
    return entries


# --- record envelope ----------------------------------------------------------------------
#
# What a backend stores for a record besides the value: the partition key and the record's
# index entries (so that the next write removes exactly the entries this one wrote, whatever
# the key functions say by then). The local backends prepend the stat (version, revisions,
# session); etcd keeps those in its own key metadata.

_FORMAT = 1
_STAT = struct.Struct(">BqqqQ")
_U16 = struct.Struct(">H")
_NONE16 = 0xFFFF


def encode_meta(partition_key: str | None, entries: list[tuple[str, bytes]]) -> bytes:
    out = bytearray()
    if partition_key is None:
        out += _U16.pack(_NONE16)
    else:
        raw = partition_key.encode()
        out += _U16.pack(len(raw))
        out += raw
    out += _U16.pack(len(entries))
    for name, key in entries:
        raw = name.encode()
        out += _U16.pack(len(raw))
        out += raw
        out += _U16.pack(len(key))
        out += key
    return bytes(out)


def decode_meta(data: bytes | memoryview, offset: int) -> tuple[str | None, list[tuple[str, bytes]], int]:
    (n,) = _U16.unpack_from(data, offset)
    offset += 2
    partition_key = None
    if n != _NONE16:
        partition_key = bytes(data[offset:offset + n]).decode()
        offset += n
    (count,) = _U16.unpack_from(data, offset)
    offset += 2
    entries = []
    for _ in range(count):
        (n,) = _U16.unpack_from(data, offset)
        offset += 2
        name = bytes(data[offset:offset + n]).decode()
        offset += n
        (n,) = _U16.unpack_from(data, offset)
        offset += 2
        entries.append((name, bytes(data[offset:offset + n])))
        offset += n
    return partition_key, entries, offset


def encode_local(version: int, create_revision: int, mod_revision: int, session_id: int | None,
                 partition_key: str | None, entries: list[tuple[str, bytes]], value: bytes) -> bytes:
    return (_STAT.pack(_FORMAT, version, create_revision, mod_revision, session_id or 0)
            + encode_meta(partition_key, entries) + value)


def decode_local(data: bytes) -> tuple[int, int, int, int | None, str | None, list[tuple[str, bytes]], bytes]:
    fmt, version, create_revision, mod_revision, session = _STAT.unpack_from(data, 0)
    if fmt != _FORMAT:
        raise MetadataStoreError(f"unknown metadata record format {fmt}")
    partition_key, entries, offset = decode_meta(data, _STAT.size)
    return version, create_revision, mod_revision, session or None, partition_key, entries, bytes(data[offset:])


def encode_remote(partition_key: str | None, entries: list[tuple[str, bytes]], value: bytes) -> bytes:
    return bytes((_FORMAT,)) + encode_meta(partition_key, entries) + value


def decode_remote(data: bytes) -> tuple[str | None, list[tuple[str, bytes]], bytes]:
    if not data or data[0] != _FORMAT:
        raise MetadataStoreError("not a pyengine metadata record")
    try:
        partition_key, entries, offset = decode_meta(data, 1)
    except (struct.error, ValueError) as exc:      # (cut short, or not UTF-8)
        raise MetadataStoreError(f"corrupt metadata record: {exc}") from None
    return partition_key, entries, bytes(data[offset:])
