from libc.stdint cimport int32_t


# SingleMessageMetadata.payload_size (field 3) of the serialized message at data[:size];
# raises BatchFormatError when it is missing, negative or the protobuf wire format is broken.
cdef int32_t read_payload_size(const unsigned char* data, Py_ssize_t size) except -1
