//! CRC32C (Castagnoli), the checksum of Pulsar payload frames.
//!
//! Computed by the `crc32c` crate rather than google-crc32c: both use the SSE 4.2 CRC
//! instruction, but the crate runs three interleaved instruction streams over every 768-byte
//! block, where google-crc32c's C library interleaves only on large buffers, so a 1 KiB
//! message is checked in about half the time. Python calls `crc32c`; `core_ext.frames` calls
//! the C entry point in the `_crc32c_capi` capsule directly, with no Python call per frame.

use std::ffi::{c_void, CStr};
use std::ptr::NonNull;

use pyo3::buffer::PyUntypedBuffer;
use pyo3::exceptions::PyBufferError;
use pyo3::prelude::*;
use pyo3::types::PyCapsule;

/// Name of the capsule (`_kernels._crc32c_capi`) whose pointer is a [`CrcFn`].
pub const CAPSULE_NAME: &CStr = c"pyengine_kernels._kernels._crc32c_capi";

/// `uint32_t crc32c_extend(uint32_t crc, const uint8_t *data, size_t len)`: safe to call
/// without the GIL.
pub type CrcFn = unsafe extern "C" fn(u32, *const u8, usize) -> u32;

/// Extends the running CRC32C `crc` (0 to start) with `len` bytes at `data`, like
/// google-crc32c's `extend`.
///
/// # Safety
///
/// `data` must be valid for reads of `len` bytes; it may be anything, even null, when `len`
/// is 0.
pub unsafe extern "C" fn crc32c_extend(crc: u32, data: *const u8, len: usize) -> u32 {
    if len == 0 {
        return crc;
    }
    // SAFETY: the caller guarantees `len` readable bytes at `data`.
    ::crc32c::crc32c_append(crc, unsafe { std::slice::from_raw_parts(data, len) })
}

/// The capsule exporting [`crc32c_extend`] to C extensions.
pub fn capsule(py: Python<'_>) -> PyResult<Bound<'_, PyCapsule>> {
    let pointer =
        NonNull::new(crc32c_extend as CrcFn as *mut c_void).expect("functions are not null");
    // SAFETY: the pointer is a function of the static library, valid as long as the module.
    unsafe { PyCapsule::new_with_pointer(py, pointer, CAPSULE_NAME) }
}

/// Any contiguous buffer, read in place (a bytes-like of any format, like `PyBUF_SIMPLE`).
#[pyfunction]
#[pyo3(signature = (data, value = 0))]
pub fn crc32c(data: &Bound<'_, PyAny>, value: u32) -> PyResult<u32> {
    let buffer = PyUntypedBuffer::get(data)?;
    if !buffer.is_c_contiguous() {
        return Err(PyBufferError::new_err("crc32c needs a contiguous buffer"));
    }
    // SAFETY: the exporter keeps `len_bytes` bytes at `buf_ptr` alive and in place until the
    // buffer is released, after this call.
    Ok(unsafe { crc32c_extend(value, buffer.buf_ptr().cast(), buffer.len_bytes()) })
}
