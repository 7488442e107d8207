# Big-endian loads and stores shared by the core_ext modules. Everything here is inline, so this
# file has no module of its own; compilers turn the shift patterns into single bswap/movbe ops.

from libc.stdint cimport uint16_t, uint32_t, uint64_t


cdef inline uint16_t load_be16(const unsigned char* p) noexcept nogil:
    return <uint16_t>((<uint16_t>p[0] << 8) | p[1])


cdef inline uint32_t load_be32(const unsigned char* p) noexcept nogil:
    return (<uint32_t>p[0] << 24) | (<uint32_t>p[1] << 16) | (<uint32_t>p[2] << 8) | p[3]


cdef inline uint64_t load_be64(const unsigned char* p) noexcept nogil:
    return (<uint64_t>load_be32(p) << 32) | load_be32(p + 4)


cdef inline void store_be16(unsigned char* p, uint16_t value) noexcept nogil:
    p[0] = <unsigned char>(value >> 8)
    p[1] = <unsigned char>value


cdef inline void store_be32(unsigned char* p, uint32_t value) noexcept nogil:
    p[0] = <unsigned char>(value >> 24)
    p[1] = <unsigned char>(value >> 16)
    p[2] = <unsigned char>(value >> 8)
    p[3] = <unsigned char>value


cdef inline void store_be64(unsigned char* p, uint64_t value) noexcept nogil:
    store_be32(p, <uint32_t>(value >> 32))
    store_be32(p + 4, <uint32_t>value)
