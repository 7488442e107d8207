"""Order-preserving LMDB keys: bytewise order of the keys is the numeric order of the values.

A position (ledger_id, entry_id) becomes 16 bytes, an int64 8 bytes; each int64 is stored
big-endian with its sign bit flipped (see poskeys.pxd).
"""

cimport cython
from cpython.buffer cimport (
    PyBUF_RECORDS_RO, PyBUF_SIMPLE, PyBuffer_Release, PyObject_CheckBuffer, PyObject_GetBuffer,
)
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize
from cpython.long cimport PyLong_AsLongLongAndOverflow
from cpython.sequence cimport PySequence_Fast, PySequence_Fast_GET_ITEM, PySequence_Fast_GET_SIZE
from libc.stdint cimport int64_t
from libc.string cimport memcpy, strcmp

cdef extern from "Python.h":
    int PY_LITTLE_ENDIAN


cdef int64_t _as_int64(object value, str name, Py_ssize_t index=-1) except? -1:
    cdef int overflow = 0
    cdef long long result = PyLong_AsLongLongAndOverflow(value, &overflow)
    if overflow:
        where = name if index < 0 else f"{name}[{index}]"
        raise OverflowError(f"{where}={value} is outside the signed 64-bit range")
    return result


@cython.final
@cython.auto_pickle(False)
cdef class _Int64Column:
    """The values of a native int64 buffer (read in place) or of a sequence of ints (converted
    one by one, with a range check)."""

    cdef Py_buffer view
    cdef bint has_view
    cdef object items
    cdef str name
    cdef Py_ssize_t length

    def __cinit__(self, object values, str name):
        self.name = name
        if PyObject_CheckBuffer(values):
            PyObject_GetBuffer(values, &self.view, PyBUF_RECORDS_RO)
            self.has_view = True
            if (self.view.ndim == 1 and self.view.itemsize == 8
                    and _is_native_int64(self.view.format)):
                self.length = self.view.shape[0]
                return
            # Other dtypes, byte orders and shapes take the generic path, which checks each value.
            PyBuffer_Release(&self.view)
            self.has_view = False
        self.items = PySequence_Fast(values, "expected a sequence of ints or an int64 array")
        self.length = PySequence_Fast_GET_SIZE(self.items)

    def __dealloc__(self):
        if self.has_view:
            PyBuffer_Release(&self.view)

    cdef int64_t get(self, Py_ssize_t i) except? -1:
        cdef int64_t value
        if self.has_view:
            # memcpy: the array need not be aligned.
            memcpy(&value, <const char*>self.view.buf + i * self.view.strides[0], 8)
            return value
        # A list is read in place (PySequence_Fast does not copy it), and an item's __index__
        # may have shrunk it since: reading past its end would crash the process.
        if i >= PySequence_Fast_GET_SIZE(self.items):
            raise RuntimeError(f"{self.name} changed size during the call")
        return _as_int64(<object>PySequence_Fast_GET_ITEM(self.items, i), self.name, i)


cdef bint _is_native_int64(const char* fmt) noexcept:
    """Whether a buffer format is an int64 in native byte order (itemsize checked by the caller)."""
    cdef char native_order = c"<" if PY_LITTLE_ENDIAN else c">"
    if fmt == NULL:
        return False
    if fmt[0] == c"@" or fmt[0] == c"=" or fmt[0] == native_order:
        fmt += 1
    return strcmp(fmt, "q") == 0 or strcmp(fmt, "l") == 0


cdef inline bytes _new_key(Py_ssize_t size, unsigned char** out):
    key = PyBytes_FromStringAndSize(NULL, size)
    out[0] = <unsigned char*>PyBytes_AS_STRING(key)
    return key


cdef const unsigned char* _key_bytes(Py_buffer* view, Py_ssize_t size, str what) except NULL:
    if view.len != size:
        raise ValueError(f"{what} must have {size} bytes, got {view.len}")
    return <const unsigned char*>view.buf


def pack_position(ledger_id, entry_id):
    """16-byte key of the position (ledger_id, entry_id), both signed int64."""
    cdef int64_t ledger = _as_int64(ledger_id, "ledger_id")
    cdef int64_t entry = _as_int64(entry_id, "entry_id")
    cdef unsigned char* out
    key = _new_key(16, &out)
    store_ordered_i64(out, ledger)
    store_ordered_i64(out + 8, entry)
    return key


def unpack_position(key):
    """(ledger_id, entry_id) of a 16-byte position key."""
    cdef Py_buffer view
    cdef const unsigned char* data
    PyObject_GetBuffer(key, &view, PyBUF_SIMPLE)
    try:
        data = _key_bytes(&view, 16, "a position key")
        return load_ordered_i64(data), load_ordered_i64(data + 8)
    finally:
        PyBuffer_Release(&view)


def pack_positions(ledger_ids, entry_ids):
    """Keys of many positions: two sequences of ints or int64 arrays, of equal length."""
    cdef _Int64Column ledgers = _Int64Column(ledger_ids, "ledger_ids")
    cdef _Int64Column entries = _Int64Column(entry_ids, "entry_ids")
    cdef Py_ssize_t i
    cdef int64_t ledger, entry
    cdef unsigned char* out
    cdef list keys = []
    if ledgers.length != entries.length:
        raise ValueError(
            f"ledger_ids has {ledgers.length} values but entry_ids has {entries.length}")
    for i in range(ledgers.length):
        ledger = ledgers.get(i)
        entry = entries.get(i)
        key = _new_key(16, &out)
        store_ordered_i64(out, ledger)
        store_ordered_i64(out + 8, entry)
        keys.append(key)
    return keys


def pack_i64(value):
    """8-byte ordered key of a signed int64."""
    cdef int64_t number = _as_int64(value, "value")
    cdef unsigned char* out
    key = _new_key(8, &out)
    store_ordered_i64(out, number)
    return key


def unpack_i64(key):
    """The signed int64 of an 8-byte ordered key."""
    cdef Py_buffer view
    PyObject_GetBuffer(key, &view, PyBUF_SIMPLE)
    try:
        return load_ordered_i64(_key_bytes(&view, 8, "an int64 key"))
    finally:
        PyBuffer_Release(&view)
