from libc.stdint cimport int64_t, uint64_t

from ._endian cimport load_be64, store_be64


# Flipping the sign bit maps signed order onto unsigned order, so the big-endian bytes of
# the result sort like the signed values: -1 before 0, INT64_MIN first.
cdef inline void store_ordered_i64(unsigned char* out, int64_t value) noexcept nogil:
    store_be64(out, <uint64_t>value ^ (<uint64_t>1 << 63))


cdef inline int64_t load_ordered_i64(const unsigned char* key) noexcept nogil:
    return <int64_t>(load_be64(key) ^ (<uint64_t>1 << 63))
