"""Stored entries to columns: the Spark data source's decoder (one row per message).

A stored entry (see ``pyengine/storage/entry.py``) is a 32-byte big-endian header (version,
flags, marker type, txn most, txn least, message count, publish time) followed by the message
as the producer sent it: optional CRC32C block (magic 0x0e01 + checksum), ``[metadataSize]``,
a Pulsar ``MessageMetadata`` and the payload. A payload whose metadata has
``num_messages_in_batch`` is a batch of ``[size][SingleMessageMetadata][payload]`` records.

``entry_headers`` reads the headers only (what READ_COMMITTED visibility needs, decided per
entry before anything is decoded). ``decode_entries`` expands the selected entries into one
row per message, scanning the protobuf wire format directly (no message objects), and returns
the columns as Arrow-ready buffers: native-endian fixed-width values, ``int32`` offsets and
UTF-8/binary data, and byte masks for the nullable columns. An entry that is one chunk of a
chunked message (``num_chunks_from_msg`` > 1) gives no row: its index is listed under
``chunks`` (``chunk_indices`` finds them without decoding), for the caller to put the message
back together from its chunk entries (``spark_udfs.chunks``), as a consumer does. The semantics are those of
``pyengine.client.message.decode_entry`` (what a consumer receives); ``tests/reference/records.py``
is the pure-Python oracle. Checksums are not re-verified (the broker verified them on publish).
"""

cimport cython
from cpython.buffer cimport PyBUF_SIMPLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.bytearray cimport PyByteArray_AS_STRING, PyByteArray_Resize
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.unicode cimport PyUnicode_AsUTF8String, PyUnicode_DecodeUTF8
from libc.stdint cimport int16_t, int32_t, int64_t, uint8_t, uint16_t, uint32_t, uint64_t
from libc.string cimport memcpy

from ._endian cimport load_be16, load_be32, load_be64

import operator
import zlib

import cramjam
import numpy as np

cdef enum:
    HEADER_SIZE = 32
    HEADER_VERSION = 1
    MAGIC_CRC32C = 0x0e01
    WIRE_VARINT = 0
    WIRE_FIXED64 = 1
    WIRE_LENGTH_DELIMITED = 2
    WIRE_START_GROUP = 3
    WIRE_END_GROUP = 4
    WIRE_FIXED32 = 5
    MAX_VARINT_BYTES = 10
    # protobuf's nesting limit (upb's default), counted from the top-level message.
    MAX_NESTING = 100
    # Compression codecs (Pulsar CompressionType): what decode_entry supports.
    CODEC_NONE = 0
    CODEC_LZ4 = 1
    CODEC_ZLIB = 2
    CODEC_ZSTD = 3
    CODEC_SNAPPY = 4

# Highest signed 32-bit offset: a column of one call must stay below 2 GiB (Arrow int32 offsets).
cdef int64_t MAX_OFFSET = 2147483647
# Latest time (ms) whose microseconds, what the time columns hold, fit an int64.
cdef uint64_t MAX_TIME_MS = 9223372036854775


class RecordFormatError(ValueError):
    """A stored entry, or the message metadata in it, is malformed."""


class ChunkTooLargeError(RecordFormatError):
    """The entries of one call decode to a column over 2 GiB (Arrow's int32 offsets): read
    fewer at a time."""


# --- growable buffers -------------------------------------------------------------------------

@cython.final
cdef class _Buffer:
    """Bytes appended at the end of a bytearray; `finish()` trims it to what was written."""

    cdef bytearray data
    cdef Py_ssize_t size
    cdef Py_ssize_t capacity
    cdef char* ptr

    def __cinit__(self, Py_ssize_t capacity):
        if capacity < 64:
            capacity = 64
        self.data = bytearray(capacity)
        self.capacity = capacity
        self.size = 0
        self.ptr = PyByteArray_AS_STRING(self.data)

    cdef int _grow(self, Py_ssize_t needed) except -1:
        cdef Py_ssize_t capacity = self.capacity * 2
        while capacity < needed:
            capacity *= 2
        PyByteArray_Resize(self.data, capacity)
        self.capacity = capacity
        self.ptr = PyByteArray_AS_STRING(self.data)
        return 0

    cdef inline int write(self, const void* source, Py_ssize_t count) except -1:
        if self.size + count > self.capacity:
            self._grow(self.size + count)
        if count:
            memcpy(self.ptr + self.size, source, count)
        self.size += count
        return 0

    cdef inline int put_i64(self, int64_t value) except -1:
        return self.write(&value, 8)

    cdef inline int put_i32(self, int32_t value) except -1:
        return self.write(&value, 4)

    cdef inline int put_u8(self, uint8_t value) except -1:
        return self.write(&value, 1)

    cdef bytearray finish(self):
        PyByteArray_Resize(self.data, self.size)
        return self.data


@cython.final
cdef class _Strings:
    """A variable-length column: int32 offsets (one more than values) and the data."""

    cdef _Buffer offsets
    cdef _Buffer data

    def __cinit__(self, Py_ssize_t rows, Py_ssize_t data_bytes):
        self.offsets = _Buffer((rows + 1) * 4)
        self.data = _Buffer(data_bytes)
        self.offsets.put_i32(0)

    cdef inline int append(self, const unsigned char* source, Py_ssize_t count) except -1:
        self.data.write(source, count)
        if self.data.size > MAX_OFFSET:
            raise ChunkTooLargeError("a column of one chunk holds more than 2 GiB: read smaller chunks")
        self.offsets.put_i32(<int32_t>self.data.size)
        return 0

    cdef inline int append_text(self, const unsigned char* source, Py_ssize_t count) except -1:
        """Append a protobuf string (Arrow's string columns must hold UTF-8)."""
        cdef Py_ssize_t i
        for i in range(count):
            if source[i] >= 0x80:
                text = _utf8(source, count)
                return self.append(<const unsigned char*>PyBytes_AS_STRING(text), PyBytes_GET_SIZE(text))
        return self.append(source, count)

    cdef tuple finish(self):
        return self.offsets.finish(), self.data.finish()


cdef bytes _utf8(const unsigned char* source, Py_ssize_t count):
    """A protobuf string's bytes as valid UTF-8: as they are, or with each invalid sequence
    replaced by U+FFFD, as the Java client decodes them (the Python client hands them out as
    bytes, which a string column cannot hold)."""
    try:
        PyUnicode_DecodeUTF8(<const char*>source, count, NULL)
    except UnicodeDecodeError:
        return PyUnicode_AsUTF8String(PyUnicode_DecodeUTF8(<const char*>source, count, "replace"))
    return PyBytes_FromStringAndSize(<const char*>source, count)


# --- protobuf wire format ----------------------------------------------------------------------

cdef inline Py_ssize_t _varint(const unsigned char* data, Py_ssize_t size, Py_ssize_t pos,
                               uint64_t* value) except -1:
    cdef uint64_t result = 0
    cdef unsigned int shift = 0
    cdef unsigned char byte
    cdef Py_ssize_t end = pos + MAX_VARINT_BYTES
    if end > size:
        end = size
    while pos < end:
        byte = data[pos]
        pos += 1
        result |= <uint64_t>(byte & 0x7F) << shift
        if byte < 0x80:
            value[0] = result
            return pos
        shift += 7
    if end == size:
        raise RecordFormatError("a protobuf varint is cut off")
    raise RecordFormatError("a protobuf varint is longer than 10 bytes")


cdef Py_ssize_t _skip(const unsigned char* data, Py_ssize_t size, Py_ssize_t pos,
                      int wire_type, uint64_t field, int nesting_left) except -1:
    """Skip the value of a field that is not read. As in protobuf, that is any field of an
    unexpected wire type too (an unknown field), including proto2 groups."""
    cdef uint64_t length
    if wire_type == WIRE_VARINT:
        return _varint(data, size, pos, &length)
    if wire_type == WIRE_FIXED64:
        length = 8
    elif wire_type == WIRE_FIXED32:
        length = 4
    elif wire_type == WIRE_LENGTH_DELIMITED:
        pos = _varint(data, size, pos, &length)
    elif wire_type == WIRE_START_GROUP:
        return _skip_group(data, size, pos, field, nesting_left)
    elif wire_type == WIRE_END_GROUP:
        raise RecordFormatError(f"protobuf end of group {field} without its start")
    else:
        raise RecordFormatError(f"unsupported protobuf wire type {wire_type} in field {field}")
    if length > <uint64_t>(size - pos):
        raise RecordFormatError(f"protobuf field {field} overruns its message")
    return pos + <Py_ssize_t>length


cdef Py_ssize_t _skip_group(const unsigned char* data, Py_ssize_t size, Py_ssize_t pos,
                            uint64_t group, int nesting_left) except -1:
    cdef uint64_t field
    cdef int wire_type
    if nesting_left <= 0:
        raise RecordFormatError(f"protobuf groups nested deeper than {MAX_NESTING} levels")
    while pos < size:
        pos = _tag(data, size, pos, &field, &wire_type)
        if wire_type == WIRE_END_GROUP:
            if field != group:
                raise RecordFormatError(f"protobuf group {group} closed as group {field}")
            return pos
        pos = _skip(data, size, pos, wire_type, field, nesting_left - 1)
    raise RecordFormatError(f"protobuf group {group} is cut off by the end of its message")


cdef inline Py_ssize_t _delimited(const unsigned char* data, Py_ssize_t size, Py_ssize_t pos,
                                  Py_ssize_t* start, Py_ssize_t* length) except -1:
    cdef uint64_t count
    pos = _varint(data, size, pos, &count)
    if count > <uint64_t>(size - pos):
        raise RecordFormatError("a protobuf string or message overruns its message")
    start[0] = pos
    length[0] = <Py_ssize_t>count
    return pos + <Py_ssize_t>count


cdef inline Py_ssize_t _tag(const unsigned char* data, Py_ssize_t size, Py_ssize_t pos,
                            uint64_t* field, int* wire_type) except -1:
    cdef uint64_t tag
    pos = _varint(data, size, pos, &tag)
    field[0] = tag >> 3
    wire_type[0] = <int>(tag & 7)
    if field[0] == 0 or tag > 0xFFFFFFFF:
        raise RecordFormatError(f"invalid protobuf tag {tag}")
    return pos


ctypedef struct Metadata:
    # MessageMetadata fields the rows need (positions are offsets into the metadata).
    Py_ssize_t producer_start
    Py_ssize_t producer_length
    uint64_t sequence_id
    uint64_t publish_time
    uint64_t event_time
    Py_ssize_t key_start
    Py_ssize_t key_length
    bint has_key
    uint64_t compression
    uint64_t uncompressed_size
    int64_t num_messages
    bint is_batch
    int properties
    int32_t num_chunks          # num_chunks_from_msg: over 1, the entry is one chunk of a message


cdef int _parse_metadata(const unsigned char* data, Py_ssize_t size, Metadata* md) except -1:
    cdef Py_ssize_t pos = 0, start, length
    cdef uint64_t field, value
    cdef int wire_type
    cdef bint has_producer = False, has_sequence = False, has_publish = False
    md.sequence_id = md.publish_time = md.event_time = 0
    md.has_key = False
    md.key_start = md.key_length = 0
    md.compression = md.uncompressed_size = 0
    md.num_messages = 1
    md.is_batch = False
    md.properties = 0
    md.num_chunks = 0
    while pos < size:
        pos = _tag(data, size, pos, &field, &wire_type)
        if field == 1 and wire_type == WIRE_LENGTH_DELIMITED:  # producer_name
            pos = _delimited(data, size, pos, &md.producer_start, &md.producer_length)
            has_producer = True
        elif field == 2 and wire_type == WIRE_VARINT:  # sequence_id
            pos = _varint(data, size, pos, &md.sequence_id)
            has_sequence = True
        elif field == 3 and wire_type == WIRE_VARINT:  # publish_time
            pos = _varint(data, size, pos, &md.publish_time)
            has_publish = True
        elif field == 4 and wire_type == WIRE_LENGTH_DELIMITED:  # properties
            pos = _delimited(data, size, pos, &start, &length)
            md.properties += 1
        elif field == 6 and wire_type == WIRE_LENGTH_DELIMITED:  # partition_key
            pos = _delimited(data, size, pos, &md.key_start, &md.key_length)
            md.has_key = True
        elif field == 8 and wire_type == WIRE_VARINT:  # compression (a proto2 enum)
            pos = _varint(data, size, pos, &value)
            # As protobuf: an enum is read as an int32, and a value it does not know is an
            # unknown field, leaving the field as it was (NONE by default).
            if <uint64_t><uint32_t>value <= CODEC_SNAPPY:
                md.compression = <uint32_t>value
        elif field == 9 and wire_type == WIRE_VARINT:  # uncompressed_size (uint32)
            pos = _varint(data, size, pos, &value)
            md.uncompressed_size = <uint32_t>value     # the low 32 bits, as protobuf keeps
        elif field == 11 and wire_type == WIRE_VARINT:  # num_messages_in_batch (int32)
            pos = _varint(data, size, pos, &value)
            md.num_messages = <int32_t><uint32_t>value
            md.is_batch = True
        elif field == 12 and wire_type == WIRE_VARINT:  # event_time
            pos = _varint(data, size, pos, &md.event_time)
        elif field == 27 and wire_type == WIRE_VARINT:  # num_chunks_from_msg (int32)
            pos = _varint(data, size, pos, &value)
            md.num_chunks = <int32_t><uint32_t>value
        else:
            pos = _skip(data, size, pos, wire_type, field, MAX_NESTING)
    if not (has_producer and has_sequence and has_publish):
        raise RecordFormatError("message metadata misses producer_name, sequence_id or publish_time")
    return 0


ctypedef struct Single:
    # SingleMessageMetadata fields (positions are offsets into the single metadata).
    Py_ssize_t key_start
    Py_ssize_t key_length
    bint has_key
    int64_t payload_size
    bint has_payload_size
    uint64_t event_time
    uint64_t sequence_id
    bint has_sequence


cdef int _parse_single(const unsigned char* data, Py_ssize_t size, Single* single) except -1:
    cdef Py_ssize_t pos = 0, start, length
    cdef uint64_t field, value
    cdef int wire_type
    single.has_key = single.has_payload_size = single.has_sequence = False
    single.key_start = single.key_length = 0
    single.payload_size = 0
    single.event_time = single.sequence_id = 0
    while pos < size:
        pos = _tag(data, size, pos, &field, &wire_type)
        if field == 1 and wire_type == WIRE_LENGTH_DELIMITED:  # properties
            pos = _delimited(data, size, pos, &start, &length)
        elif field == 2 and wire_type == WIRE_LENGTH_DELIMITED:  # partition_key
            pos = _delimited(data, size, pos, &single.key_start, &single.key_length)
            single.has_key = True
        elif field == 3 and wire_type == WIRE_VARINT:  # payload_size (int32)
            pos = _varint(data, size, pos, &value)
            single.payload_size = <int32_t><uint32_t>value
            single.has_payload_size = True
        elif field == 5 and wire_type == WIRE_VARINT:  # event_time
            pos = _varint(data, size, pos, &single.event_time)
        elif field == 8 and wire_type == WIRE_VARINT:  # sequence_id
            pos = _varint(data, size, pos, &single.sequence_id)
            single.has_sequence = True
        else:
            pos = _skip(data, size, pos, wire_type, field, MAX_NESTING)
    if not single.has_payload_size:
        raise RecordFormatError("a batched message's metadata has no payload_size")
    if single.payload_size < 0:
        raise RecordFormatError(f"negative payload_size {single.payload_size}")
    return 0


# --- the columns being built ---------------------------------------------------------------------

@cython.final
cdef class _Columns:
    cdef Py_ssize_t rows
    cdef _Buffer ledger_id, entry_id, batch_index, publish_time, event_time, event_time_valid
    cdef _Buffer sequence_id, txnid_most, txnid_least, txn_valid, is_marker, key_valid
    cdef _Buffer property_offsets
    cdef _Strings key, value, producer_name, property_keys, property_values
    cdef int32_t property_count

    def __cinit__(self, Py_ssize_t rows, Py_ssize_t data_bytes):
        self.rows = 0
        self.ledger_id = _Buffer(rows * 8)
        self.entry_id = _Buffer(rows * 8)
        self.batch_index = _Buffer(rows * 4)
        self.publish_time = _Buffer(rows * 8)
        self.event_time = _Buffer(rows * 8)
        self.event_time_valid = _Buffer(rows)
        self.sequence_id = _Buffer(rows * 8)
        self.txnid_most = _Buffer(rows * 8)
        self.txnid_least = _Buffer(rows * 8)
        self.txn_valid = _Buffer(rows)
        self.is_marker = _Buffer(rows)
        self.key_valid = _Buffer(rows)
        self.property_offsets = _Buffer((rows + 1) * 4)
        self.property_offsets.put_i32(0)
        self.property_count = 0
        self.key = _Strings(rows, rows * 8)
        self.value = _Strings(rows, data_bytes)
        self.producer_name = _Strings(rows, rows * 16)
        self.property_keys = _Strings(rows, 64)
        self.property_values = _Strings(rows, 64)

    cdef int properties(self, const unsigned char* data, Py_ssize_t size, uint64_t wanted,
                        bint complete) except -1:
        """Append every KeyValue of field `wanted` of the message at data[:size]. `complete`: a
        KeyValue without its key or value is an error (MessageMetadata, which the broker parsed
        whole); otherwise the missing side is empty, as the consumer's batch decoder has it. A
        key given twice keeps its last value, at the place of its last pair, as the clients'
        property maps do (a Spark map with a key twice is invalid). Keys and values are UTF-8
        (`_utf8`): keys are told apart as written."""
        cdef Py_ssize_t pos = 0, start, length, kv_pos, kv_end, key_start, key_length
        cdef Py_ssize_t value_start, value_length
        cdef uint64_t field, kv_field
        cdef int wire_type, kv_wire
        cdef bint has_key_field, has_value_field
        cdef list pairs = None          # (key, value) spans, when the row has more than one
        while pos < size:
            pos = _tag(data, size, pos, &field, &wire_type)
            if field != wanted or wire_type != WIRE_LENGTH_DELIMITED:
                pos = _skip(data, size, pos, wire_type, field, MAX_NESTING)
                continue
            pos = _delimited(data, size, pos, &start, &length)
            kv_pos, kv_end = start, start + length
            has_key_field = has_value_field = False
            key_start = key_length = value_start = value_length = 0
            while kv_pos < kv_end:
                kv_pos = _tag(data, kv_end, kv_pos, &kv_field, &kv_wire)
                if kv_field == 1 and kv_wire == WIRE_LENGTH_DELIMITED:
                    kv_pos = _delimited(data, kv_end, kv_pos, &key_start, &key_length)
                    has_key_field = True
                elif kv_field == 2 and kv_wire == WIRE_LENGTH_DELIMITED:
                    kv_pos = _delimited(data, kv_end, kv_pos, &value_start, &value_length)
                    has_value_field = True
                else:
                    kv_pos = _skip(data, kv_end, kv_pos, kv_wire, kv_field, MAX_NESTING - 1)
            if complete and not (has_key_field and has_value_field):
                raise RecordFormatError("a KeyValue property misses its key or value")
            if pairs is None:
                pairs = []
            pairs.append((key_start, key_length, value_start, value_length))
        if pairs is not None:
            self._put_last_of_each_key(data, pairs)
        self.property_offsets.put_i32(self.property_count)
        return 0

    cdef int _put_last_of_each_key(self, const unsigned char* data, list pairs) except -1:
        cdef Py_ssize_t i, n = len(pairs), key_start, key_length, value_start, value_length
        cdef bytes key
        cdef list keys = []
        cdef dict last = {}             # key -> index of its last pair: linear in the pairs
        if n == 1:
            key_start, key_length, value_start, value_length = pairs[0]
            self.property_keys.append_text(data + key_start, key_length)
            self.property_values.append_text(data + value_start, value_length)
            self.property_count += 1
            return 0
        for i in range(n):
            key_start, key_length = pairs[i][0], pairs[i][1]
            key = _utf8(data + key_start, key_length)
            keys.append(key)
            last[key] = i
        for i in range(n):
            key = keys[i]
            if last[key] == i:
                value_start, value_length = pairs[i][2], pairs[i][3]
                self.property_keys.append(<const unsigned char*>PyBytes_AS_STRING(key), PyBytes_GET_SIZE(key))
                self.property_values.append_text(data + value_start, value_length)
                self.property_count += 1
        return 0

    cdef int row(self, int64_t ledger, int64_t entry, int32_t batch_index, uint64_t publish_ms,
                 uint64_t event_ms, int64_t sequence_id, int64_t most, int64_t least, bint marker,
                 const unsigned char* producer, Py_ssize_t producer_length,
                 bint has_key, const unsigned char* key, Py_ssize_t key_length,
                 const unsigned char* value, Py_ssize_t value_length) except -1:
        # A later time would wrap around in microseconds: no timestamp can hold it.
        if publish_ms > MAX_TIME_MS:
            raise RecordFormatError(f"entry {ledger}:{entry}: publish_time {publish_ms} ms is past "
                                    "the range of microsecond timestamps")
        if event_ms > MAX_TIME_MS:
            raise RecordFormatError(f"entry {ledger}:{entry}: event_time {event_ms} ms is past "
                                    "the range of microsecond timestamps")
        self.ledger_id.put_i64(ledger)
        self.entry_id.put_i64(entry)
        self.batch_index.put_i32(batch_index)
        self.publish_time.put_i64(<int64_t>publish_ms * 1000)          # ms -> Spark's microseconds
        self.event_time.put_i64(<int64_t>event_ms * 1000)
        self.event_time_valid.put_u8(event_ms != 0)
        self.sequence_id.put_i64(sequence_id)
        self.txnid_most.put_i64(most)
        self.txnid_least.put_i64(least)
        self.txn_valid.put_u8(most >= 0 and least >= 0)
        self.is_marker.put_u8(marker)
        self.key_valid.put_u8(has_key)
        self.key.append_text(key, key_length if has_key else 0)
        self.value.append(value, value_length)
        self.producer_name.append_text(producer, producer_length)
        self.rows += 1
        return 0

    cdef dict finish(self):
        key_offsets, key_data = self.key.finish()
        value_offsets, value_data = self.value.finish()
        producer_offsets, producer_data = self.producer_name.finish()
        pkey_offsets, pkey_data = self.property_keys.finish()
        pvalue_offsets, pvalue_data = self.property_values.finish()
        return {
            "rows": self.rows,
            "ledger_id": np.frombuffer(self.ledger_id.finish(), np.int64),
            "entry_id": np.frombuffer(self.entry_id.finish(), np.int64),
            "batch_index": np.frombuffer(self.batch_index.finish(), np.int32),
            "publish_time": np.frombuffer(self.publish_time.finish(), np.int64),
            "event_time": np.frombuffer(self.event_time.finish(), np.int64),
            "event_time_valid": np.frombuffer(self.event_time_valid.finish(), np.bool_),
            "sequence_id": np.frombuffer(self.sequence_id.finish(), np.int64),
            "txnid_most": np.frombuffer(self.txnid_most.finish(), np.int64),
            "txnid_least": np.frombuffer(self.txnid_least.finish(), np.int64),
            "txn_valid": np.frombuffer(self.txn_valid.finish(), np.bool_),
            "is_marker": np.frombuffer(self.is_marker.finish(), np.bool_),
            "key_valid": np.frombuffer(self.key_valid.finish(), np.bool_),
            "key": (np.frombuffer(key_offsets, np.int32), key_data),
            "value": (np.frombuffer(value_offsets, np.int32), value_data),
            "producer_name": (np.frombuffer(producer_offsets, np.int32), producer_data),
            "property_offsets": np.frombuffer(self.property_offsets.finish(), np.int32),
            "property_keys": (np.frombuffer(pkey_offsets, np.int32), pkey_data),
            "property_values": (np.frombuffer(pvalue_offsets, np.int32), pvalue_data),
        }


# --- compression ----------------------------------------------------------------------------------

def decompress(uint64_t codec, bytes payload, uint64_t uncompressed_size):
    """The decompressed payload of a message or batch (Pulsar's CompressionType `codec`; ZLIB,
    LZ4, ZSTD, SNAPPY), or RecordFormatError. The consumer's decoder
    (`pyengine.client.message`) and `decode_entries` both use it (once per entry: a batch is
    compressed whole). LZ4 (a raw block sized by uncompressed_size), ZSTD (a
    zstd frame) and SNAPPY (raw, no framing) are decompressed by cramjam into a buffer of exactly
    uncompressed_size (the `_into` forms, which fail rather than pad); ZLIB is inflated to at
    most uncompressed_size + 1 bytes. Without uncompressed_size (0, protobuf's default) a
    payload must decompress to nothing, as Pulsar's clients decode it into 0 bytes (and discard
    a message that does not), except a zstd frame or snappy block that states its own size: it
    is held to that, checked as a claim is. So nothing is decompressed past a stated size."""
    cdef str name
    cdef Py_ssize_t written
    cdef Py_ssize_t payload_size = len(payload)
    if codec == CODEC_NONE:
        return payload
    if codec == CODEC_ZLIB:
        if uncompressed_size > 0xFFFFFFFF:
            # MessageMetadata's is a uint32; and uncompressed_size + 1 below must not wrap to
            # 0, which zlib reads as "no limit".
            raise RecordFormatError(f"ZLIB payload does not decompress to its uncompressed_size "
                                    f"of {uncompressed_size} bytes, more than a uint32 holds")
        try:
            # Never more than it states (one byte past it tells too much): a small payload
            # that inflates to gigabytes is refused after uncompressed_size + 1 bytes (after
            # 1 byte without uncompressed_size).
            inflating = zlib.decompressobj()
            plain = inflating.decompress(payload, <Py_ssize_t>min(uncompressed_size + 1, 0x100000000))
            if not inflating.eof and not inflating.unconsumed_tail:
                plain += inflating.flush()
        except zlib.error as exc:
            raise RecordFormatError(f"ZLIB payload does not decompress: {exc}")
        if <uint64_t>len(plain) != uncompressed_size:
            raise RecordFormatError(f"decompressed size does not match uncompressed_size"
                                    f"{'' if uncompressed_size else ' (none given: 0)'}")
        if not uncompressed_size and not inflating.eof:
            raise RecordFormatError("ZLIB payload does not decompress: incomplete or truncated stream")
        return plain
    if codec == CODEC_LZ4:
        name, into = "LZ4", cramjam.lz4.decompress_block_into
    elif codec == CODEC_ZSTD:
        name, into = "ZSTD", cramjam.zstd.decompress_into
    elif codec == CODEC_SNAPPY:
        name, into = "SNAPPY", cramjam.snappy.decompress_raw_into
    else:
        raise RecordFormatError(f"compression codec {codec} "
                                "is not supported (NONE, LZ4, ZLIB, ZSTD and SNAPPY are)")
    try:
        if not uncompressed_size:
            # A zstd frame or snappy block may state its size: held to that, else to 0.
            if codec == CODEC_ZSTD:
                uncompressed_size = _zstd_content_size(payload)
            elif codec == CODEC_SNAPPY:
                uncompressed_size = cramjam.snappy.decompress_raw_len(payload)
        # Refused before a buffer of uncompressed_size is allocated: more than an LZ4 block can
        # hold (255-fold), than a zstd frame can (at most 128 KiB per block of 4 bytes, an RLE
        # block: 32768-fold), than raw snappy can (64 bytes per copy of 3 bytes: 21.3-fold)
        # or than it states up front.
        if (uncompressed_size > 0xFFFFFFFF                      # MessageMetadata's is a uint32
                or (codec == CODEC_LZ4 and uncompressed_size > <uint64_t>(255 * payload_size + 64))
                or (codec == CODEC_ZSTD and uncompressed_size > <uint64_t>(32768 * payload_size + 131072))
                or (codec == CODEC_SNAPPY
                    and (uncompressed_size > <uint64_t>(22 * payload_size)
                         or uncompressed_size != <uint64_t>cramjam.snappy.decompress_raw_len(payload)))):
            written = -1
        else:
            out = bytearray(<Py_ssize_t>uncompressed_size)
            written = into(payload, out)
    except (cramjam.DecompressionError, ValueError, MemoryError) as exc:
        raise RecordFormatError(f"{name} (codec {codec}) payload does not decompress "
                                f"into its uncompressed_size of {uncompressed_size} bytes: {exc}")
    if written < 0:
        raise RecordFormatError(f"{name} (codec {codec}) payload of {payload_size} bytes "
                                f"does not decompress to its uncompressed_size of {uncompressed_size} bytes")
    if <uint64_t>written != uncompressed_size:
        raise RecordFormatError(f"{name} (codec {codec}): decompressed size {written} "
                                f"does not match uncompressed_size {uncompressed_size}")
    return bytes(out)


cdef uint64_t _zstd_content_size(bytes payload):
    """The content size the header of a zstd frame states (RFC 8878 3.1.1.1), or 0 when it
    states none (or is not a zstd frame)."""
    cdef const unsigned char* data = payload
    cdef Py_ssize_t size = len(payload), pos, fcs_bytes, i
    cdef unsigned char descriptor
    cdef bint single_segment
    cdef uint64_t value = 0
    if size < 5 or data[0] != 0x28 or data[1] != 0xB5 or data[2] != 0x2F or data[3] != 0xFD:
        return 0
    descriptor = data[4]
    single_segment = (descriptor >> 5) & 1
    fcs_bytes = (1 if single_segment else 0, 2, 4, 8)[descriptor >> 6]
    # Past the descriptor, the window descriptor (not in a single segment) and the dictionary id.
    pos = 5 + (0 if single_segment else 1) + (0, 1, 2, 4)[descriptor & 3]
    if fcs_bytes == 0 or size - pos < fcs_bytes:
        return 0
    for i in range(fcs_bytes):
        value |= <uint64_t>data[pos + i] << (8 * i)
    return value + 256 if fcs_bytes == 2 else value


cdef object _inflate(int64_t ledger, int64_t entry, uint64_t codec, bytes payload, uint64_t uncompressed_size):
    try:
        return decompress(codec, payload, uncompressed_size)
    except RecordFormatError as exc:
        raise RecordFormatError(f"entry {ledger}:{entry}: {exc}") from None


# --- entries -------------------------------------------------------------------------------------

cdef struct Header:
    uint16_t marker_type
    int64_t most
    int64_t least
    int32_t count
    int64_t publish_time


cdef int _header(const unsigned char* data, Py_ssize_t size, Header* header) except -1:
    if size < HEADER_SIZE:
        raise RecordFormatError("a stored entry is shorter than its 32-byte header")
    if data[0] != HEADER_VERSION:
        raise RecordFormatError(f"stored entry header version {data[0]}, expected {HEADER_VERSION}")
    header.marker_type = load_be16(data + 2)
    header.most = <int64_t>load_be64(data + 4)
    header.least = <int64_t>load_be64(data + 12)
    header.count = <int32_t>load_be32(data + 20)
    header.publish_time = <int64_t>load_be64(data + 24)
    return 0


def entry_headers(values):
    """Header fields of stored entries, as NumPy arrays:
    (marker_type int32, txn_most int64, txn_least int64, num_messages int32, publish_time int64).
    A txn id of -1 means "not transactional"."""
    cdef list items = list(values)
    cdef Py_ssize_t n = len(items), i
    cdef Py_buffer view
    cdef Header header
    marker_arr = np.empty(n, np.int32)
    most_arr = np.empty(n, np.int64)
    least_arr = np.empty(n, np.int64)
    count_arr = np.empty(n, np.int32)
    publish_arr = np.empty(n, np.int64)
    cdef int32_t[::1] marker = marker_arr
    cdef int64_t[::1] most = most_arr
    cdef int64_t[::1] least = least_arr
    cdef int32_t[::1] count = count_arr
    cdef int64_t[::1] publish = publish_arr
    for i in range(n):
        PyObject_GetBuffer(items[i], &view, PyBUF_SIMPLE)
        try:
            _header(<const unsigned char*>view.buf, view.len, &header)
        finally:
            PyBuffer_Release(&view)
        marker[i] = header.marker_type
        most[i] = header.most
        least[i] = header.least
        count[i] = header.count
        publish[i] = header.publish_time
    return marker_arr, most_arr, least_arr, count_arr, publish_arr


cdef Py_ssize_t _metadata_start(int64_t ledger, int64_t entry, const unsigned char* data, Py_ssize_t size,
                                Py_ssize_t* metadata_size) except -1:
    """Offset of the MessageMetadata in a stored entry (past its header, checksum and size)."""
    cdef Py_ssize_t pos = HEADER_SIZE
    if size - pos >= 2 and load_be16(data + pos) == MAGIC_CRC32C:
        pos += 6
    if size - pos < 4:
        raise RecordFormatError(f"entry {ledger}:{entry}: the message is shorter than its headers")
    metadata_size[0] = load_be32(data + pos)
    pos += 4
    if metadata_size[0] > size - pos:
        raise RecordFormatError(f"entry {ledger}:{entry}: the message metadata overruns the entry")
    return pos


cdef int _decode_one(_Columns out, int64_t ledger, int64_t entry, const unsigned char* data,
                     Py_ssize_t size) except -1:
    """Append the rows of one stored entry; 1 (and no row) when it is one chunk of a chunked
    message (num_chunks_from_msg > 1), else 0."""
    cdef Header header
    cdef Metadata md
    cdef Single single
    cdef Py_ssize_t pos = HEADER_SIZE, metadata_size, payload_start, payload_size, index
    cdef Py_ssize_t single_size, body_size
    cdef const unsigned char* metadata
    cdef const unsigned char* payload
    cdef const unsigned char* single_data
    cdef Py_buffer inflated_view
    cdef bint inflated = False
    cdef int64_t sequence
    cdef bint marker
    _header(data, size, &header)
    marker = header.marker_type != 0
    pos = _metadata_start(ledger, entry, data, size, &metadata_size)
    metadata = data + pos
    _parse_metadata(metadata, metadata_size, &md)
    if md.num_chunks > 1:
        return 1            # one chunk of a message: put back together by the caller
    payload = metadata + metadata_size
    payload_size = size - pos - metadata_size
    if md.compression != CODEC_NONE:
        plain = _inflate(ledger, entry, md.compression, (<const char*>payload)[:payload_size],
                         md.uncompressed_size)
        PyObject_GetBuffer(plain, &inflated_view, PyBUF_SIMPLE)
        inflated = True
        payload = <const unsigned char*>inflated_view.buf
        payload_size = inflated_view.len
    try:
        if not md.is_batch:
            out.row(ledger, entry, -1, md.publish_time, md.event_time, <int64_t>md.sequence_id,
                    header.most, header.least, marker, metadata + md.producer_start, md.producer_length,
                    md.has_key, metadata + md.key_start, md.key_length, payload, payload_size)
            out.properties(metadata, metadata_size, 4, True)
            return 0
        if md.num_messages < 0:
            raise RecordFormatError(f"entry {ledger}:{entry}: negative num_messages_in_batch")
        pos = 0
        for index in range(md.num_messages):
            if payload_size - pos < 4:
                raise RecordFormatError(f"entry {ledger}:{entry}: batched message {index}: its metadata size is cut off")
            single_size = load_be32(payload + pos)
            pos += 4
            if single_size > payload_size - pos:
                raise RecordFormatError(f"entry {ledger}:{entry}: batched message {index}: metadata overruns the batch")
            single_data = payload + pos
            _parse_single(single_data, single_size, &single)
            pos += single_size
            body_size = single.payload_size
            if body_size > payload_size - pos:
                raise RecordFormatError(f"entry {ledger}:{entry}: batched message {index}: payload overruns the batch")
            sequence = <int64_t>(single.sequence_id if single.has_sequence else md.sequence_id + <uint64_t>index)
            out.row(ledger, entry, <int32_t>index, md.publish_time, single.event_time, sequence,
                    header.most, header.least, marker, metadata + md.producer_start, md.producer_length,
                    single.has_key, single_data + single.key_start, single.key_length,
                    payload + pos, body_size)
            out.properties(single_data, single_size, 1, False)
            pos += body_size
        if pos != payload_size:
            raise RecordFormatError(f"entry {ledger}:{entry}: {payload_size - pos} bytes follow the "
                                    f"{md.num_messages} batched messages announced")
    finally:
        if inflated:
            PyBuffer_Release(&inflated_view)
    return 0


cdef object _int64_ids(ids, str name):
    """`ids` as contiguous int64, refused where the cast would change them: it drops a
    float's fraction and wraps an integer past int64, silently naming the rows wrongly."""
    array = np.asarray(ids)
    if array.dtype.kind not in "iu" and (array.size or array.dtype.kind == "O"):
        if isinstance(ids, np.ndarray) and array.dtype.kind != "O":
            raise TypeError(f"{name} must be integers, not an array of {array.dtype}")
        # A sequence NumPy did not read as integers (it makes floats of ints past int64 of
        # either sign, objects of larger ones): each must be an int in int64's range.
        try:
            return np.array([operator.index(value) for value in ids], dtype=np.int64)
        except TypeError as exc:
            raise TypeError(f"{name} must be integers: {exc}") from None
        except OverflowError:
            raise ValueError(f"{name} must be in int64's range") from None
    if array.dtype.kind == "u" and array.size and array.max() > 0x7FFFFFFFFFFFFFFF:
        raise ValueError(f"{name} must be in int64's range, got {array.max()}")
    return np.ascontiguousarray(array, dtype=np.int64)


cdef object _selection(Py_ssize_t n, const int64_t[::1] ledgers, const int64_t[::1] entries, keep):
    """`keep` as n uint8 flags (all set when None), once the lengths are checked to agree."""
    if ledgers.shape[0] != n or entries.shape[0] != n:
        raise ValueError(f"{n} values but {ledgers.shape[0]} ledger ids and {entries.shape[0]} entry ids")
    if keep is None:
        return np.ones(n, np.uint8)
    selected = np.ascontiguousarray(keep, dtype=np.bool_).view(np.uint8)
    if selected.shape[0] != n:
        raise ValueError(f"{n} values but {selected.shape[0]} keep flags")
    return selected


def decode_entries(ledger_ids, entry_ids, values, keep=None):
    """One row per message of the stored entries (`values`, at positions
    `ledger_ids[i]:entry_ids[i]`); with `keep` (a bool array, one per entry) only the entries
    it selects. Returns a dict of columns (see the module doc): fixed-width NumPy arrays
    (`publish_time`/`event_time` in microseconds, `batch_index` -1 outside a batch,
    `sequence_id` as signed 64 bits), boolean masks `event_time_valid` (event time set),
    `txn_valid` (transactional), `key_valid` (partition key set), `(offsets, data)` pairs for
    `key`, `value`, `producer_name`, `property_keys`, `property_values`,
    `property_offsets` (row i holds properties `[offsets[i], offsets[i + 1])`), and `chunks`:
    the indices of the selected entries that are chunks of a chunked message (no rows). The
    string columns hold UTF-8: a protobuf string that is not has U+FFFD for each invalid
    sequence, as the Java client reads it. Ids must be integers of int64's range (TypeError,
    ValueError): a cast would rename the rows."""
    cdef list items = list(values)
    cdef Py_ssize_t n = len(items), i, rows = 0, data_bytes = 0
    cdef const int64_t[::1] ledgers = _int64_ids(ledger_ids, "ledger_ids")
    cdef const int64_t[::1] entries = _int64_ids(entry_ids, "entry_ids")
    cdef const uint8_t[::1] selected
    cdef Py_buffer view
    cdef Header header
    selected = _selection(n, ledgers, entries, keep)
    # Size the buffers from the headers' message counts and the entries' sizes.
    for i in range(n):
        if not selected[i]:
            continue
        PyObject_GetBuffer(items[i], &view, PyBUF_SIMPLE)
        try:
            _header(<const unsigned char*>view.buf, view.len, &header)
            data_bytes += view.len
            # The count is the producer's claim (CommandSend.num_messages), a capacity hint
            # only: a batched message takes 6 bytes at least (its size, a payload_size), so an
            # entry holds no more; a huge claim must not allocate gigabytes before the entry is
            # even parsed.
            rows += max(1, min(<Py_ssize_t>header.count, view.len // 6))
        finally:
            PyBuffer_Release(&view)
    cdef _Columns out = _Columns(rows, data_bytes)
    cdef list chunks = []
    for i in range(n):
        if not selected[i]:
            continue
        PyObject_GetBuffer(items[i], &view, PyBUF_SIMPLE)
        try:
            if _decode_one(out, ledgers[i], entries[i], <const unsigned char*>view.buf, view.len):
                chunks.append(i)
        finally:
            PyBuffer_Release(&view)
    columns = out.finish()
    columns["chunks"] = np.array(chunks, dtype=np.int64)
    return columns


def chunk_indices(ledger_ids, entry_ids, values, keep=None):
    """Indices (int64) of the stored entries (at positions `ledger_ids[i]:entry_ids[i]`) that
    are one chunk of a chunked message (num_chunks_from_msg > 1), among those `keep` selects
    (a bool array, one per entry): what `decode_entries` leaves out of its rows. Only the
    metadata is read."""
    cdef list items = list(values)
    cdef Py_ssize_t n = len(items), i, pos, metadata_size
    cdef const int64_t[::1] ledgers = _int64_ids(ledger_ids, "ledger_ids")
    cdef const int64_t[::1] entries = _int64_ids(entry_ids, "entry_ids")
    cdef const uint8_t[::1] selected
    cdef Py_buffer view
    cdef Header header
    cdef Metadata md
    cdef const unsigned char* data
    selected = _selection(n, ledgers, entries, keep)
    chunks = []
    for i in range(n):
        if not selected[i]:
            continue
        PyObject_GetBuffer(items[i], &view, PyBUF_SIMPLE)
        try:
            data = <const unsigned char*>view.buf
            _header(data, view.len, &header)
            pos = _metadata_start(ledgers[i], entries[i], data, view.len, &metadata_size)
            _parse_metadata(data + pos, metadata_size, &md)
            if md.num_chunks > 1:
                chunks.append(i)
        finally:
            PyBuffer_Release(&view)
    return np.array(chunks, dtype=np.int64)
