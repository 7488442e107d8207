"""Pulsar batch payloads: N x ``[4-byte BE size][SingleMessageMetadata][payload_size bytes]``.

Splitting needs only ``SingleMessageMetadata.payload_size`` (field 3, a required int32), so the
metadata is scanned at the protobuf wire-format level rather than parsed.
"""

from cpython.buffer cimport PyBUF_SIMPLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize
from cpython.mem cimport PyMem_Calloc, PyMem_Free
from libc.stdint cimport UINT32_MAX, int32_t, uint32_t, uint64_t
from libc.string cimport memcpy

from ._endian cimport load_be32, store_be32

cdef enum:
    PAYLOAD_SIZE_FIELD = 3
    WIRE_VARINT = 0
    WIRE_FIXED64 = 1
    WIRE_LENGTH_DELIMITED = 2
    WIRE_FIXED32 = 5
    MAX_VARINT_BYTES = 10


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


cdef int32_t read_payload_size(const unsigned char* data, Py_ssize_t size) except -1:
    cdef Py_ssize_t pos = 0
    cdef uint64_t tag, field, value
    cdef int wire_type
    cdef int32_t payload_size = 0
    cdef bint found = False
    while pos < size:
        pos = _read_varint(data, size, pos, &tag)
        field = tag >> 3
        wire_type = tag & 7
        if field == 0 or tag > UINT32_MAX:
            raise BatchFormatError(f"invalid protobuf tag {tag}")
        if wire_type == WIRE_VARINT:
            pos = _read_varint(data, size, pos, &value)
            if field == PAYLOAD_SIZE_FIELD:
                # Last occurrence wins; int32 keeps the varint's low 32 bits, as in protobuf.
                payload_size = <int32_t><uint32_t>value
                found = True
        elif field == PAYLOAD_SIZE_FIELD:
            raise BatchFormatError(f"payload_size has wire type {wire_type}, not a varint")
        elif wire_type == WIRE_FIXED64:
            pos = _skip(size, pos, 8)
        elif wire_type == WIRE_LENGTH_DELIMITED:
            pos = _read_varint(data, size, pos, &value)
            pos = _skip(size, pos, value)
        elif wire_type == WIRE_FIXED32:
            pos = _skip(size, pos, 4)
        else:
            # 3 and 4 are proto2 groups, unused by SingleMessageMetadata; 6 and 7 do not exist.
            raise BatchFormatError(f"unsupported protobuf wire type {wire_type} in field {field}")
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


def split_batch(payload, num_messages=None):
    """Split an uncompressed batch payload into (single metadata, message payload) pairs.

    With ``num_messages`` (the outer metadata's num_messages_in_batch), the batch must hold
    exactly that many messages.
    """
    cdef Py_buffer view
    cdef const unsigned char* data
    cdef Py_ssize_t pos = 0, expected = -1, index = 0, metadata_size, payload_size
    cdef list messages = []
    if num_messages is not None:
        expected = num_messages
        if expected < 0:
            raise BatchFormatError(f"num_messages must not be negative, got {expected}")
    PyObject_GetBuffer(payload, &view, PyBUF_SIMPLE)
    try:
        data = <const unsigned char*>view.buf
        while pos < view.len:
            if index == expected:
                raise BatchFormatError(
                    f"{view.len - pos} bytes follow the {expected} messages announced")
            if view.len - pos < 4:
                raise BatchFormatError(f"message {index}: its metadata size is cut off")
            metadata_size = load_be32(data + pos)
            pos += 4
            if metadata_size > view.len - pos:
                raise BatchFormatError(
                    f"message {index}: metadata of {metadata_size} bytes overruns the batch")
            payload_size = read_payload_size(data + pos, metadata_size)
            metadata = _copy(data + pos, metadata_size)
            pos += metadata_size
            if payload_size > view.len - pos:
                raise BatchFormatError(
                    f"message {index}: payload of {payload_size} bytes overruns the batch")
            messages.append((metadata, _copy(data + pos, payload_size)))
            pos += payload_size
            index += 1
    finally:
        PyBuffer_Release(&view)
    if expected >= 0 and index != expected:
        raise BatchFormatError(f"the batch holds {index} messages, {expected} were announced")
    return messages


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
