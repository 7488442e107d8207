from libc.stdint cimport uint32_t


cdef class Frame:
    cdef readonly bytes command
    cdef readonly bytes broker_entry_metadata
    cdef bytes _headers_and_payload
    # Where metadata and payload start in _headers_and_payload, and their copies once read.
    cdef Py_ssize_t _metadata_start
    cdef Py_ssize_t _payload_start
    cdef bytes _metadata
    cdef bytes _payload
    # The checksum is materialised as an int only when read.
    cdef uint32_t _checksum
    cdef bint _has_checksum
    cdef unsigned char _checksum_state

    cdef bytes _slice(self, Py_ssize_t start, Py_ssize_t end)


cdef class FrameDecoder:
    # One incomplete frame, assembled across feeds; complete frames never pass through it.
    cdef unsigned char* _pending
    cdef Py_ssize_t _pending_len
    cdef Py_ssize_t _pending_cap
    cdef Py_ssize_t _max_frame_size
    cdef bint _verify
    cdef bint _report_bad_checksums
    cdef bint _failed

    cdef Py_ssize_t _body_size(self, const unsigned char* header) except -1
    cdef Py_ssize_t _split(self, const unsigned char* data, Py_ssize_t size, list out) except -1
    cdef Py_ssize_t _top_up(self, const unsigned char* data, Py_ssize_t size, list out) except -1
    cdef int _reserve(self, Py_ssize_t capacity) except -1
    cdef int _append(self, const unsigned char* data, Py_ssize_t size) except -1
    cdef void _drop_pending(self) noexcept
