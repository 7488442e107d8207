"""Pulsar batch payloads: N x ``[4-byte BE size][SingleMessageMetadata][payload_size bytes]``.

Splitting needs only ``SingleMessageMetadata.payload_size`` (field 3, a required int32), so the
metadata is scanned at the protobuf wire-format level rather than parsed.
"""

from cpython.buffer cimport PyBUF_SIMPLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize
from cpython.mem cimport PyMem_Calloc, PyMem_Free
from cpython.unicode cimport PyUnicode_DecodeUTF8
from libc.stdint cimport UINT32_MAX, int32_t, uint32_t, uint64_t
from libc.string cimport memcpy

from ._endian cimport load_be32, store_be32

cdef enum:
    # SingleMessageMetadata
    PROPERTIES_FIELD = 1
    PARTITION_KEY_FIELD = 2
    PAYLOAD_SIZE_FIELD = 3
    EVENT_TIME_FIELD = 5
    ORDERING_KEY_FIELD = 7
    SEQUENCE_ID_FIELD = 8
    # KeyValue
    KEY_FIELD = 1
    VALUE_FIELD = 2
    WIRE_VARINT = 0
    WIRE_FIXED64 = 1
    WIRE_LENGTH_DELIMITED = 2
    WIRE_START_GROUP = 3
    WIRE_END_GROUP = 4
    WIRE_FIXED32 = 5
    MAX_VARINT_BYTES = 10
    # protobuf's nesting limit (upb's default): groups and submessages together, counted from
    # the top-level message, so a KeyValue's unknown groups may nest one level less.
    MAX_NESTING = 100


class BatchFormatError(ValueError):
    """A batch payload, or a single message's metadata in it, is malformed."""


cdef Py_ssize_t _read_varint(const unsigned char* data, Py_ssize_t size, Py_ssize_t pos,
                             uint64_t* value) except -1:
    """Decode the varint at ``data[pos]`` into ``value``; return the position after it."""
    cdef uint64_t result = 0
    cdef unsigned int shift = 0
    cdef unsigned char byte
    cdef Py_ssize_t end = min(size, pos + MAX_VARINT_BYTES)
    while pos < end:
        byte = data[pos]
        pos += 1
        # Bits beyond 64 in a tenth byte are dropped, as protobuf decoders do.
        result |= <uint64_t>(byte & 0x7F) << shift
        if byte < 0x80:
            value[0] = result
            return pos
        shift += 7
    if end == size:
        raise BatchFormatError("a protobuf varint is cut off by the end of the metadata")
    raise BatchFormatError(f"a protobuf varint is longer than {MAX_VARINT_BYTES} bytes")


cdef inline Py_ssize_t _skip(Py_ssize_t size, Py_ssize_t pos, uint64_t count) except -1:
    if count > <uint64_t>(size - pos):
        raise BatchFormatError(f"a protobuf field of {count} bytes overruns the metadata")
    return pos + <Py_ssize_t>count


cdef inline Py_ssize_t _read_tag(const unsigned char* data, Py_ssize_t size, Py_ssize_t pos,
                                 uint64_t* field, int* wire_type) except -1:
    cdef uint64_t tag
    pos = _read_varint(data, size, pos, &tag)
    if tag >> 3 == 0 or tag > UINT32_MAX:
        raise BatchFormatError(f"invalid protobuf tag {tag}")
    field[0] = tag >> 3
    wire_type[0] = tag & 7
    return pos


cdef Py_ssize_t _skip_value(const unsigned char* data, Py_ssize_t size, Py_ssize_t pos, int wire_type,
                            uint64_t field, int nesting_left) except -1:
    """The position after a field's value, which is not needed. Unknown fields may be proto2
    groups, which protobuf skips too (up to its nesting limit)."""
    cdef uint64_t value
    if wire_type == WIRE_VARINT:
        return _read_varint(data, size, pos, &value)
    if wire_type == WIRE_FIXED64:
        return _skip(size, pos, 8)
    if wire_type == WIRE_LENGTH_DELIMITED:
        pos = _read_varint(data, size, pos, &value)
        return _skip(size, pos, value)
    if wire_type == WIRE_FIXED32:
        return _skip(size, pos, 4)
    if wire_type == WIRE_START_GROUP:
        return _skip_group(data, size, pos, field, nesting_left)
    if wire_type == WIRE_END_GROUP:
        raise BatchFormatError(f"protobuf end of group {field} without its start")
    raise BatchFormatError(f"unsupported protobuf wire type {wire_type} in field {field}")


cdef Py_ssize_t _skip_group(const unsigned char* data, Py_ssize_t size, Py_ssize_t pos,
                            uint64_t group, int nesting_left) except -1:
    """The position after the end-group tag that closes ``group``."""
    cdef uint64_t field
    cdef int wire_type
    if nesting_left <= 0:
        raise BatchFormatError(f"protobuf groups nested deeper than {MAX_NESTING} levels")
    while pos < size:
        pos = _read_tag(data, size, pos, &field, &wire_type)
        if wire_type == WIRE_END_GROUP:
            if field != group:
                raise BatchFormatError(f"protobuf group {group} closed as group {field}")
            return pos
        pos = _skip_value(data, size, pos, wire_type, field, nesting_left - 1)
    raise BatchFormatError(f"protobuf group {group} is cut off by the end of the metadata")


cdef int32_t read_payload_size(const unsigned char* data, Py_ssize_t size) except -1:
    cdef Py_ssize_t pos = 0
    cdef uint64_t field, value
    cdef int wire_type
    cdef int32_t payload_size = 0
    cdef bint found = False
    while pos < size:
        pos = _read_tag(data, size, pos, &field, &wire_type)
        if field == PAYLOAD_SIZE_FIELD:
            if wire_type != WIRE_VARINT:
                raise BatchFormatError(f"payload_size has wire type {wire_type}, not a varint")
            pos = _read_varint(data, size, pos, &value)
            # Last occurrence wins; int32 keeps the varint's low 32 bits, as in protobuf.
            payload_size = <int32_t><uint32_t>value
            found = True
        else:
            pos = _skip_value(data, size, pos, wire_type, field, MAX_NESTING)
    if not found:
        raise BatchFormatError("the single message metadata has no payload_size")
    if payload_size < 0:
        raise BatchFormatError(f"negative payload_size {payload_size}")
    return payload_size


cdef inline bytes _copy(const unsigned char* data, Py_ssize_t size):
    return PyBytes_FromStringAndSize(<const char*>data, size)


def single_payload_size(metadata):
    """``payload_size`` of a serialized SingleMessageMetadata."""
    cdef Py_buffer view
    PyObject_GetBuffer(metadata, &view, PyBUF_SIMPLE)
    try:
        return read_payload_size(<const unsigned char*>view.buf, view.len)
    finally:
        PyBuffer_Release(&view)


cdef Py_ssize_t _next_message(const unsigned char* data, Py_ssize_t size, Py_ssize_t pos, Py_ssize_t index,
                              Py_ssize_t expected, Py_ssize_t* metadata_size,
                              Py_ssize_t* payload_size) except -1:
    """Check the framing of the message at ``data[pos]``; return the position after it (its
    metadata and payload are the ``metadata_size + payload_size`` bytes before that)."""
    if index == expected:
        raise BatchFormatError(f"{size - pos} bytes follow the {expected} messages announced")
    if size - pos < 4:
        raise BatchFormatError(f"message {index}: its metadata size is cut off")
    metadata_size[0] = load_be32(data + pos)
    pos += 4
    if metadata_size[0] > size - pos:
        raise BatchFormatError(f"message {index}: metadata of {metadata_size[0]} bytes overruns the batch")
    payload_size[0] = read_payload_size(data + pos, metadata_size[0])
    pos += metadata_size[0]
    if payload_size[0] > size - pos:
        raise BatchFormatError(f"message {index}: payload of {payload_size[0]} bytes overruns the batch")
    return pos + payload_size[0]


cdef inline void _check_count(Py_ssize_t index, Py_ssize_t expected) except *:
    if expected >= 0 and index != expected:
        raise BatchFormatError(f"the batch holds {index} messages, {expected} were announced")


cdef Py_ssize_t _expected(num_messages) except -2:
    if num_messages is None:
        return -1
    if num_messages < 0:
        raise BatchFormatError(f"num_messages must not be negative, got {num_messages}")
    return num_messages


cdef list _messages(payload, num_messages, bint decode):
    """The messages of a batch: (metadata, payload) pairs, or with ``decode`` each message's
    decoded fields (``_decode_single``)."""
    cdef Py_buffer view
    cdef const unsigned char* data
    cdef const unsigned char* metadata
    cdef Py_ssize_t pos = 0, index = 0, metadata_size, payload_size
    cdef Py_ssize_t expected = _expected(num_messages)
    cdef list messages = []
    PyObject_GetBuffer(payload, &view, PyBUF_SIMPLE)
    try:
        data = <const unsigned char*>view.buf
        while pos < view.len:
            pos = _next_message(data, view.len, pos, index, expected, &metadata_size, &payload_size)
            metadata = data + pos - payload_size - metadata_size
            body = _copy(data + pos - payload_size, payload_size)
            if decode:
                messages.append(_decode_single(metadata, metadata_size, body))
            else:
                messages.append((_copy(metadata, metadata_size), body))
            index += 1
    finally:
        PyBuffer_Release(&view)
    _check_count(index, expected)
    return messages


def split_batch(payload, num_messages=None):
    """Split an uncompressed batch payload into (single metadata, message payload) pairs.

    With ``num_messages`` (the outer metadata's num_messages_in_batch), the batch must hold
    exactly that many messages.
    """
    return _messages(payload, num_messages, False)


cdef object _text(const unsigned char* data, Py_ssize_t size):
    """A proto2 string field: its str, or its bytes when they are not UTF-8 (as the protobuf
    runtime hands them out)."""
    try:
        return PyUnicode_DecodeUTF8(<const char*>data, size, NULL)
    except UnicodeDecodeError:
        return _copy(data, size)


cdef tuple _key_value(const unsigned char* data, Py_ssize_t size):
    cdef Py_ssize_t pos = 0, start
    cdef uint64_t field, length
    cdef int wire_type
    key = value = ""                      # absent (required in the schema): protobuf's default
    while pos < size:
        pos = _read_tag(data, size, pos, &field, &wire_type)
        if wire_type == WIRE_LENGTH_DELIMITED and (field == KEY_FIELD or field == VALUE_FIELD):
            pos = _read_varint(data, size, pos, &length)
            start = pos
            pos = _skip(size, pos, length)
            if field == KEY_FIELD:
                key = _text(data + start, pos - start)
            else:
                value = _text(data + start, pos - start)
        else:
            pos = _skip_value(data, size, pos, wire_type, field, MAX_NESTING - 1)
    return key, value


cdef tuple _decode_single(const unsigned char* data, Py_ssize_t size, bytes body):
    """(body, properties, partition_key, ordering_key, event_time, sequence_id) of one message;
    a field absent is None (event_time: 0). A field of an unexpected wire type is skipped, as
    protobuf keeps it among the unknown fields; a repeated singular field's last value wins."""
    cdef Py_ssize_t pos = 0, start
    cdef uint64_t field, value
    cdef int wire_type
    cdef dict properties = {}
    cdef uint64_t event_time = 0
    partition_key = ordering_key = sequence_id = None
    while pos < size:
        pos = _read_tag(data, size, pos, &field, &wire_type)
        if wire_type == WIRE_LENGTH_DELIMITED and (field == PROPERTIES_FIELD or field == PARTITION_KEY_FIELD
                                                   or field == ORDERING_KEY_FIELD):
            pos = _read_varint(data, size, pos, &value)
            start = pos
            pos = _skip(size, pos, value)
            if field == PROPERTIES_FIELD:
                key, text = _key_value(data + start, pos - start)
                properties[key] = text
            elif field == PARTITION_KEY_FIELD:
                partition_key = _text(data + start, pos - start)
            else:
                ordering_key = _copy(data + start, pos - start)
        elif wire_type == WIRE_VARINT and (field == EVENT_TIME_FIELD or field == SEQUENCE_ID_FIELD):
            pos = _read_varint(data, size, pos, &value)
            if field == EVENT_TIME_FIELD:
                event_time = value
            else:
                sequence_id = value
        else:
            pos = _skip_value(data, size, pos, wire_type, field, MAX_NESTING)
    return body, properties, partition_key, ordering_key, event_time, sequence_id


def decode_batch(payload, num_messages=None):
    """Split an uncompressed batch payload and decode what a consumer reads of each message's
    SingleMessageMetadata: a list of (payload, properties, partition_key, ordering_key,
    event_time, sequence_id) (see ``split_batch`` for ``num_messages``)."""
    return _messages(payload, num_messages, True)


def build_batch(messages):
    """Concatenate (single metadata, message payload) pairs into a batch payload.

    Each metadata must already carry ``payload_size == len(payload)``.
    """
    cdef list pairs = list(messages)
    cdef Py_ssize_t count = len(pairs), i, total = 0, payload_size
    cdef Py_buffer* meta
    cdef Py_buffer* data
    cdef unsigned char* out
    # Zeroed views release as no-ops, so the finally clause can release all of them.
    cdef Py_buffer* views = <Py_buffer*>PyMem_Calloc(2 * count + 1, sizeof(Py_buffer))
    if views == NULL:
        raise MemoryError()
    try:
        for i in range(count):
            metadata, payload = pairs[i]
            meta = &views[2 * i]
            data = &views[2 * i + 1]
            PyObject_GetBuffer(metadata, meta, PyBUF_SIMPLE)
            PyObject_GetBuffer(payload, data, PyBUF_SIMPLE)
            if meta.len > UINT32_MAX:
                raise BatchFormatError(f"message {i}: metadata of {meta.len} bytes exceeds 4 GiB")
            payload_size = read_payload_size(<const unsigned char*>meta.buf, meta.len)
            if payload_size != data.len:
                raise BatchFormatError(
                    f"message {i}: payload_size is {payload_size}, "
                    f"but the payload has {data.len} bytes")
            total += 4 + meta.len + data.len
        batch = PyBytes_FromStringAndSize(NULL, total)
        out = <unsigned char*>PyBytes_AS_STRING(batch)
        for i in range(count):
            meta = &views[2 * i]
            data = &views[2 * i + 1]
            store_be32(out, <uint32_t>meta.len)
            memcpy(out + 4, meta.buf, meta.len)
            memcpy(out + 4 + meta.len, data.buf, data.len)
            out += 4 + meta.len + data.len
        return batch
    finally:
        for i in range(2 * count):
            PyBuffer_Release(&views[i])
        PyMem_Free(views)
