"""Pulsar frame codec: split a byte stream into frames, and build frames.

Every integer outside protobuf is big-endian. A frame is ``[totalSize][commandSize][command]``,
where totalSize counts everything after itself. A payload frame (SEND, MESSAGE) goes on with an
optional broker entry metadata block (magic 0x0e02, size, bytes), an optional CRC32C (magic 0x0e01,
checksum), then ``[metadataSize][metadata]`` and the payload up to the end of the frame. The CRC32C
covers everything after the checksum field: metadataSize, metadata and payload.

The CRC32C is pyengine_kernels' (the Rust ``crc32c`` crate, about twice as fast as google-crc32c
on 1 KiB messages): its C function is taken from a capsule once, at import, and called directly.
"""

cimport cython
from cpython.buffer cimport PyBUF_SIMPLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize
from cpython.mem cimport PyMem_Free, PyMem_Realloc
from cpython.pycapsule cimport PyCapsule_GetPointer
from libc.stdint cimport UINT32_MAX, uint32_t
from libc.string cimport memcpy, memset

from ._endian cimport load_be16, load_be32, store_be16, store_be32

from pyengine_kernels import _kernels

DEFAULT_MAX_FRAME_SIZE = 5 * 1024 * 1024 + 10 * 1024

cdef extern from *:
    """
    #if defined(__GNUC__) || defined(__clang__)
    #define CORE_EXT_PREFETCH(address) __builtin_prefetch(address)
    #else
    #define CORE_EXT_PREFETCH(address) ((void)(address))
    #endif
    """
    void prefetch "CORE_EXT_PREFETCH"(const void* address) noexcept nogil

cdef enum:
    MAGIC_CRC32C = 0x0e01
    MAGIC_BROKER_ENTRY_METADATA = 0x0e02
    # How far past the current frame _split keeps input cache lines on their way in.
    PREFETCH_DISTANCE = 2048
    CACHE_LINE = 64
    # Smallest pending buffer worth allocating, and the largest one kept between frames.
    MIN_PENDING_CAPACITY = 256
    RETAINED_PENDING_CAPACITY = 64 * 1024
    # Frame._checksum_state: what Frame.checksum_valid says (None, True, False).
    NOT_VERIFIED = 0
    CHECKSUM_VALID = 1
    CHECKSUM_INVALID = 2

ctypedef uint32_t (*crc32c_fn)(uint32_t crc, const unsigned char* data, size_t size) noexcept nogil

# Extends a running CRC32C (0 to start) with ``size`` bytes at ``data``.
cdef crc32c_fn _crc32c = <crc32c_fn>PyCapsule_GetPointer(
    _kernels._crc32c_capi, b"pyengine_kernels._kernels._crc32c_capi")


class FrameError(ValueError):
    """The bytes are not a valid sequence of Pulsar frames. Raised by ``FrameDecoder.feed``,
    ``frames`` holds the complete frames that the same call decoded before the broken one."""

    frames = ()


class FrameTooLarge(FrameError):
    """A frame is larger than allowed (decoding) or than a 32-bit size can say (encoding)."""


class ChecksumMismatch(FrameError):
    """A payload frame's CRC32C does not match its metadata and payload."""


class MalformedFrame(FrameError):
    """The sizes inside a frame are inconsistent, or the frame is truncated."""


@cython.final
@cython.no_gc
@cython.freelist(64)
@cython.auto_pickle(False)      # its offsets restored unchecked would read out of bounds
cdef class Frame:
    """One decoded frame. The byte fields are copies, independent of the decoder's input.

    Decoding a payload frame copies its bytes into two objects (three with broker entry
    metadata): ``command`` and ``headers_and_payload``, which a broker stores as they are, at no
    further copy; ``metadata`` and ``payload`` are sliced from it on first use, then kept.
    Simple command frames have ``metadata``, ``payload``, ``headers_and_payload``,
    ``broker_entry_metadata`` and ``checksum`` set to None.
    """

    def __init__(self):
        raise TypeError("Frame objects are created by FrameDecoder.feed and decode_frame")

    @property
    def headers_and_payload(self):
        """The frame's bytes from its checksum magic 0x0e01 (or, without one, from its
        metadataSize) to its end: checksum, metadata and payload, as a broker stores them."""
        return self._headers_and_payload

    @property
    def metadata(self):
        """The serialized MessageMetadata of a payload frame."""
        if self._metadata is None and self._headers_and_payload is not None:
            self._metadata = self._slice(self._metadata_start, self._payload_start)
        return self._metadata

    @property
    def payload(self):
        """Everything after the metadata, up to the end of a payload frame."""
        if self._payload is None and self._headers_and_payload is not None:
            self._payload = self._slice(self._payload_start, len(self._headers_and_payload))
        return self._payload

    @property
    def checksum(self):
        """The CRC32C the frame carries, or None when it has no 0x0e01 magic."""
        return self._checksum if self._has_checksum else None

    @property
    def checksum_valid(self):
        """Whether the checksum matched: None when the frame has none or it was not verified;
        False only from a decoder that reports bad checksums instead of raising."""
        if self._checksum_state == NOT_VERIFIED:
            return None
        return self._checksum_state == CHECKSUM_VALID

    @property
    def is_payload(self):
        """True for a payload frame (metadata and payload set)."""
        return self._headers_and_payload is not None

    cdef bytes _slice(self, Py_ssize_t start, Py_ssize_t end):
        return _copy(<const unsigned char*>PyBytes_AS_STRING(self._headers_and_payload) + start,
                     end - start)

    def __repr__(self):
        parts = [f"command={len(self.command)}B"]
        if self.broker_entry_metadata is not None:
            parts.append(f"broker_entry_metadata={len(self.broker_entry_metadata)}B")
        if self.metadata is not None:
            parts.append(f"metadata={len(self.metadata)}B payload={len(self.payload)}B")
        if self._has_checksum:
            parts.append(f"checksum={self._checksum:#010x}")
        return f"<Frame {' '.join(parts)}>"


cdef inline Py_ssize_t _prefetch(const unsigned char* data, Py_ssize_t start,
                                 Py_ssize_t end) noexcept nogil:
    """Start loading data[start:end] into the cache; return where the next request may begin."""
    while start < end:
        prefetch(data + start)
        start += CACHE_LINE
    return start


cdef inline bytes _copy(const unsigned char* data, Py_ssize_t size):
    return PyBytes_FromStringAndSize(<const char*>data, size)


cdef Frame _decode_body(const unsigned char* body, Py_ssize_t size, bint verify,
                        bint report_bad_checksum):
    """Decode the ``size`` bytes of a frame that follow its totalSize field; a bad checksum
    raises ChecksumMismatch, or with ``report_bad_checksum`` marks the frame invalid."""
    cdef Py_ssize_t command_size, pos, metadata_size, headers_start
    cdef Py_ssize_t block_start = -1, block_size = 0, checked_from = -1
    cdef uint32_t checksum = 0, actual
    cdef Frame frame

    if size < 4:
        raise MalformedFrame(f"a frame of {size} bytes has no room for its command size")
    command_size = load_be32(body)
    if command_size > size - 4:
        raise MalformedFrame(f"command size {command_size} overruns the {size}-byte frame")
    frame = Frame.__new__(Frame)
    frame.command = _copy(body + 4, command_size)
    pos = 4 + command_size
    if pos == size:
        return frame

    if size - pos >= 2 and load_be16(body + pos) == MAGIC_BROKER_ENTRY_METADATA:
        if size - pos < 6:
            raise MalformedFrame("the broker entry metadata block is cut off before its size")
        block_size = load_be32(body + pos + 2)
        block_start = pos + 6
        if block_size > size - block_start:
            raise MalformedFrame(
                f"broker entry metadata of {block_size} bytes overruns the {size}-byte frame")
        pos = block_start + block_size
    headers_start = pos
    if size - pos >= 2 and load_be16(body + pos) == MAGIC_CRC32C:
        if size - pos < 6:
            raise MalformedFrame("the checksum is cut off after its magic")
        checksum = load_be32(body + pos + 2)
        pos += 6
        checked_from = pos
    if size - pos < 4:
        raise MalformedFrame(
            f"only {size - pos} bytes remain in the frame for its 4-byte metadata size")
    metadata_size = load_be32(body + pos)
    pos += 4
    if metadata_size > size - pos:
        raise MalformedFrame(
            f"metadata size {metadata_size} overruns the {size - pos} bytes left in the frame")
    if verify and checked_from >= 0:
        actual = _crc32c(0, body + checked_from, size - checked_from)
        if actual == checksum:
            frame._checksum_state = CHECKSUM_VALID
        elif report_bad_checksum:
            frame._checksum_state = CHECKSUM_INVALID
        else:
            raise ChecksumMismatch(
                f"the frame carries CRC32C {checksum:#010x} but its contents give {actual:#010x}")

    if block_start >= 0:
        frame.broker_entry_metadata = _copy(body + block_start, block_size)
    frame._headers_and_payload = _copy(body + headers_start, size - headers_start)
    frame._metadata_start = pos - headers_start
    frame._payload_start = pos - headers_start + metadata_size
    frame._checksum = checksum
    frame._has_checksum = checked_from >= 0
    return frame


@cython.final
cdef class FrameDecoder:
    """Incremental splitter of a connection's inbound byte stream into frames.

    Complete frames are decoded straight from the bytes passed to ``feed``; only an incomplete
    frame is copied aside (and completed by later feeds), so no input byte is buffered twice and
    the cost stays linear however the stream is cut. After any error the decoder refuses further
    input: a stream cannot be resynchronised, the caller closes the connection.

    A bad checksum is such an error by default (``checksum_errors="raise"``). With
    ``checksum_errors="report"`` the frame is returned with ``checksum_valid`` False and decoding
    goes on: its sizes were consistent, so the stream is still in sync (a Pulsar broker answers
    such a SEND with a ChecksumError and keeps the connection).
    """

    def __cinit__(self, Py_ssize_t max_frame_size=DEFAULT_MAX_FRAME_SIZE,
                  bint verify_checksum=True, str checksum_errors="raise"):
        if max_frame_size < 4:
            raise ValueError(f"max_frame_size must be at least 4, not {max_frame_size}")
        if checksum_errors not in ("raise", "report"):
            raise ValueError(
                f"checksum_errors must be 'raise' or 'report', not {checksum_errors!r}")
        self._max_frame_size = max_frame_size
        self._verify = verify_checksum
        self._report_bad_checksums = checksum_errors == "report"

    def __dealloc__(self):
        PyMem_Free(self._pending)

    @property
    def buffered(self):
        """Bytes held back as the start of an incomplete frame."""
        return self._pending_len

    def feed(self, data):
        """Add bytes from the stream; return the frames they complete, in stream order. On a
        broken frame, the FrameError raised carries the frames completed before it (``frames``)."""
        cdef Py_buffer view
        cdef const unsigned char* start
        cdef Py_ssize_t used = 0
        cdef list frames = []

        if self._failed:
            raise FrameError("the decoder stopped at an earlier error; the stream is unusable")
        PyObject_GetBuffer(data, &view, PyBUF_SIMPLE)
        try:
            start = <const unsigned char*>view.buf
            if self._pending_len:
                used = self._top_up(start, view.len, frames)
            if not self._pending_len:
                used += self._split(start + used, view.len - used, frames)
                self._append(start + used, view.len - used)
        except BaseException as exc:
            self._failed = True
            self._drop_pending()
            if isinstance(exc, FrameError):
                # The frames before the broken one are valid: as Netty's decoders hand on what
                # they decoded before failing, the caller handles them before closing.
                exc.frames = frames
            raise
        finally:
            PyBuffer_Release(&view)
        return frames

    cdef Py_ssize_t _body_size(self, const unsigned char* header) except -1:
        """Read a totalSize field, refusing it as soon as it exceeds the limit."""
        cdef Py_ssize_t body_size = load_be32(header)
        if body_size > self._max_frame_size:
            raise FrameTooLarge(
                f"a frame announces {body_size} bytes, "
                f"more than the {self._max_frame_size} allowed")
        return body_size

    cdef Py_ssize_t _split(self, const unsigned char* data, Py_ssize_t size, list out) except -1:
        """Decode the complete frames at the start of ``data``; return how many bytes they span."""
        cdef Py_ssize_t pos = 0, body_size, fetched = 0
        while size - pos >= 4:
            body_size = self._body_size(data + pos)
            if body_size > size - pos - 4:
                break
            # Large feeds are mostly cold in cache: request the next frames' bytes while this one
            # is checksummed and copied (a quarter off the time per 1 KiB frame from memory).
            fetched = _prefetch(data, max(fetched, pos),
                                min(pos + 4 + body_size + PREFETCH_DISTANCE, size))
            out.append(_decode_body(data + pos + 4, body_size, self._verify,
                                    self._report_bad_checksums))
            pos += 4 + body_size
        return pos

    cdef Py_ssize_t _top_up(self, const unsigned char* data, Py_ssize_t size, list out) except -1:
        """Move bytes into the pending frame and decode it once complete; return the bytes used."""
        cdef Py_ssize_t used, step, frame_size
        used = min(max(4 - self._pending_len, 0), size)
        self._append(data, used)
        if self._pending_len < 4:
            return used
        frame_size = 4 + self._body_size(self._pending)
        self._reserve(frame_size)
        step = min(frame_size - self._pending_len, size - used)
        self._append(data + used, step)
        if self._pending_len == frame_size:
            out.append(_decode_body(self._pending + 4, frame_size - 4, self._verify,
                                    self._report_bad_checksums))
            self._drop_pending()
        return used + step

    cdef int _reserve(self, Py_ssize_t capacity) except -1:
        cdef unsigned char* grown
        if capacity <= self._pending_cap:
            return 0
        # Geometric growth keeps many tiny feeds linear; a known frame size is reserved at once.
        capacity = max(capacity, 2 * self._pending_cap, MIN_PENDING_CAPACITY)
        grown = <unsigned char*>PyMem_Realloc(self._pending, capacity)
        if grown == NULL:
            raise MemoryError()
        self._pending = grown
        self._pending_cap = capacity
        return 0

    cdef int _append(self, const unsigned char* data, Py_ssize_t size) except -1:
        if size:
            self._reserve(self._pending_len + size)
            memcpy(self._pending + self._pending_len, data, size)
            self._pending_len += size
        return 0

    cdef void _drop_pending(self) noexcept:
        self._pending_len = 0
        # One huge frame must not pin its buffer for the rest of the connection.
        if self._pending_cap > RETAINED_PENDING_CAPACITY:
            PyMem_Free(self._pending)
            self._pending = NULL
            self._pending_cap = 0


def decode_frame(buf):
    """Decode ``buf``, which must hold exactly one complete frame (the CRC32C is verified)."""
    cdef Py_buffer view
    cdef Py_ssize_t body_size
    PyObject_GetBuffer(buf, &view, PyBUF_SIMPLE)
    try:
        if view.len < 4:
            raise MalformedFrame(f"{view.len} bytes cannot hold a frame's total size")
        body_size = load_be32(<const unsigned char*>view.buf)
        if body_size != view.len - 4:
            raise MalformedFrame(
                f"the frame announces {body_size} bytes after its size field, "
                f"{view.len - 4} follow")
        return _decode_body(<const unsigned char*>view.buf + 4, body_size, True, False)
    finally:
        PyBuffer_Release(&view)


cdef uint32_t _checked_body_size(Py_ssize_t body_size) except? 0:
    if body_size > UINT32_MAX:
        raise FrameTooLarge(f"a frame of {body_size} bytes does not fit its 32-bit size field")
    return <uint32_t>body_size


def encode_command(command):
    """Build a simple frame around a serialized BaseCommand."""
    cdef Py_buffer cmd
    cdef uint32_t body_size
    cdef unsigned char* out
    PyObject_GetBuffer(command, &cmd, PyBUF_SIMPLE)
    try:
        body_size = _checked_body_size(4 + cmd.len)
        frame = PyBytes_FromStringAndSize(NULL, 4 + <Py_ssize_t>body_size)
        out = <unsigned char*>PyBytes_AS_STRING(frame)
        store_be32(out, body_size)
        store_be32(out + 4, <uint32_t>cmd.len)
        memcpy(out + 8, cmd.buf, cmd.len)
        return frame
    finally:
        PyBuffer_Release(&cmd)


def encode_payload_frame(command, metadata, payload, broker_entry_metadata=None):
    """Build a payload frame with the CRC32C, and the broker entry metadata block when given."""
    cdef Py_buffer cmd, meta, data, block
    cdef bint has_block = broker_entry_metadata is not None
    cdef Py_ssize_t block_len = 0
    cdef uint32_t body_size
    cdef unsigned char* out
    cdef unsigned char* pos
    cdef unsigned char* checksum_field
    # Zeroed views release as no-ops, so one finally covers however many were acquired.
    memset(&cmd, 0, sizeof(Py_buffer))
    memset(&meta, 0, sizeof(Py_buffer))
    memset(&data, 0, sizeof(Py_buffer))
    memset(&block, 0, sizeof(Py_buffer))
    try:
        PyObject_GetBuffer(command, &cmd, PyBUF_SIMPLE)
        PyObject_GetBuffer(metadata, &meta, PyBUF_SIMPLE)
        PyObject_GetBuffer(payload, &data, PyBUF_SIMPLE)
        if has_block:
            PyObject_GetBuffer(broker_entry_metadata, &block, PyBUF_SIMPLE)
            block_len = 6 + block.len
        body_size = _checked_body_size(4 + cmd.len + block_len + 10 + meta.len + data.len)
        frame = PyBytes_FromStringAndSize(NULL, 4 + <Py_ssize_t>body_size)
        out = <unsigned char*>PyBytes_AS_STRING(frame)
        store_be32(out, body_size)
        store_be32(out + 4, <uint32_t>cmd.len)
        memcpy(out + 8, cmd.buf, cmd.len)
        pos = out + 8 + cmd.len
        if has_block:
            store_be16(pos, MAGIC_BROKER_ENTRY_METADATA)
            store_be32(pos + 2, <uint32_t>block.len)
            memcpy(pos + 6, block.buf, block.len)
            pos += block_len
        store_be16(pos, MAGIC_CRC32C)
        checksum_field = pos + 2
        pos += 6
        store_be32(pos, <uint32_t>meta.len)
        memcpy(pos + 4, meta.buf, meta.len)
        memcpy(pos + 4 + meta.len, data.buf, data.len)
        store_be32(checksum_field, _crc32c(0, pos, 4 + meta.len + data.len))
        return frame
    finally:
        PyBuffer_Release(&cmd)
        PyBuffer_Release(&meta)
        PyBuffer_Release(&data)
        PyBuffer_Release(&block)


def crc32c(data, uint32_t value=0):
    """Extend the running CRC32C ``value`` with ``data`` (any contiguous bytes-like object)."""
    cdef Py_buffer view
    PyObject_GetBuffer(data, &view, PyBUF_SIMPLE)
    try:
        return _crc32c(value, <const unsigned char*>view.buf, view.len)
    finally:
        PyBuffer_Release(&view)
