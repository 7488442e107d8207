//! Column inputs and outputs shared by every bulk kernel.
//!
//! Inputs are 1-D NumPy arrays (contiguous or strided) or Arrow arrays reached through the
//! Arrow PyCapsule interface (`__arrow_c_array__`), imported zero-copy with arrow-rs' C data
//! interface. Boolean results go back as NumPy arrays (Rust `Vec<bool>` handed over without a
//! copy) or as Arrow arrays exported through the same C data interface.

use std::borrow::Cow;

use arrow_array::ffi::{from_ffi, to_ffi, FFI_ArrowArray, FFI_ArrowSchema};
use arrow_array::{Array, BooleanArray, Int64Array};
use arrow_buffer::{BooleanBuffer, Buffer, NullBuffer};
use arrow_data::ArrayData;
use arrow_schema::DataType;
use numpy::ndarray::ArrayView1;
use numpy::{
    Element, PyArray1, PyArrayMethods, PyReadonlyArray1, PyUntypedArray, PyUntypedArrayMethods,
};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyCapsule, PyCapsuleMethods};

const ARROW_SCHEMA: &std::ffi::CStr = c"arrow_schema";
const ARROW_ARRAY: &std::ffi::CStr = c"arrow_array";

/// A 1-D column as passed by the caller, still tied to its Python owner.
enum Source<'py, T: Element, A> {
    NumPy(PyReadonlyArray1<'py, T>),
    Arrow(A),
}

/// Classifies `obj` as a NumPy array of element `T` or an imported Arrow array of `arrow_type`.
fn extract_source<'py, T: Element>(
    obj: &Bound<'py, PyAny>,
    name: &str,
    arrow_type: &DataType,
    type_name: &str,
) -> PyResult<Source<'py, T, ArrayData>> {
    if let Ok(array) = obj.cast::<PyUntypedArray>() {
        if array.ndim() != 1 {
            return Err(PyValueError::new_err(format!(
                "{name}: expected a 1-D array, got a {}-D array",
                array.ndim()
            )));
        }
        let mut typed = array
            .cast::<PyArray1<T>>()
            .map_err(|_| {
                PyTypeError::new_err(format!(
                    "{name}: expected a NumPy array of dtype {type_name}, got dtype {}",
                    array.dtype()
                ))
            })?
            .clone();
        // The views below index elements, not bytes: a stride that is not a whole number of
        // elements (a field of a packed structured array, `as_strided` views) would be read at
        // the wrong offsets, and unaligned data must not become a Rust slice. NumPy flags both
        // as not aligned; such arrays are read through an aligned, contiguous copy.
        if !array.is_aligned() || array.strides()[0] % std::mem::size_of::<T>() as isize != 0 {
            typed = typed.call_method0("copy")?.cast_into::<PyArray1<T>>()?;
        }
        let readonly = typed
            .try_readonly()
            .map_err(|e| PyValueError::new_err(format!("{name}: {e}")))?;
        return Ok(Source::NumPy(readonly));
    }
    if obj.hasattr("__arrow_c_array__")? {
        let data = import_arrow(obj, name)?;
        if data.data_type() != arrow_type {
            return Err(PyTypeError::new_err(format!(
                "{name}: expected an Arrow {type_name} array, got {}",
                data.data_type()
            )));
        }
        return Ok(Source::Arrow(data));
    }
    if obj.hasattr("__arrow_c_stream__")? {
        return Err(PyTypeError::new_err(format!(
            "{name}: chunked Arrow data ({}) is not supported; pass a single array, \
             e.g. chunked.combine_chunks()",
            python_type_name(obj)
        )));
    }
    Err(PyTypeError::new_err(format!(
        "{name}: expected a 1-D NumPy {type_name} array or an Arrow {type_name} array \
         (an object with __arrow_c_array__), got {}",
        python_type_name(obj)
    )))
}

pub fn python_type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type()
        .qualname()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "<unknown type>".to_owned())
}

/// Imports an Arrow array through the PyCapsule interface.
///
/// The `FFI_ArrowArray` is moved out of its capsule (leaving a released struct behind), so the
/// producer's release callback runs exactly once, when the last Rust buffer referencing it drops.
fn import_arrow(obj: &Bound<'_, PyAny>, name: &str) -> PyResult<ArrayData> {
    let (schema, array): (Bound<'_, PyCapsule>, Bound<'_, PyCapsule>) = obj
        .call_method0("__arrow_c_array__")?
        .extract()
        .map_err(|_| {
            PyTypeError::new_err(format!(
                "{name}: __arrow_c_array__() must return a (schema, array) pair of PyCapsules"
            ))
        })?;
    let schema_ptr = schema
        .pointer_checked(Some(ARROW_SCHEMA))?
        .cast::<FFI_ArrowSchema>();
    let array_ptr = array
        .pointer_checked(Some(ARROW_ARRAY))?
        .cast::<FFI_ArrowArray>();
    // SAFETY: the capsule names guarantee the pointee types (Arrow PyCapsule interface);
    // `from_raw` moves the struct out and marks the capsule's copy as released.
    let ffi_array = unsafe { FFI_ArrowArray::from_raw(array_ptr.as_ptr()) };
    if ffi_array.is_released() {
        return Err(PyValueError::new_err(format!(
            "{name}: the Arrow array capsule was already consumed"
        )));
    }
    // SAFETY: the producer guarantees both structs follow the C data interface; the schema
    // stays owned (and later released) by its capsule, which outlives this call.
    let data = unsafe { from_ffi(ffi_array, schema_ptr.as_ref()) }
        .map_err(|e| PyValueError::new_err(format!("{name}: invalid Arrow array: {e}")))?;
    data.validate()
        .map_err(|e| PyValueError::new_err(format!("{name}: invalid Arrow array: {e}")))?;
    Ok(data)
}

/// Values of a NumPy column: borrowed when contiguous, otherwise copied once on demand.
#[derive(Clone)]
enum Values<'a, T> {
    Slice(&'a [T]),
    Strided(ArrayView1<'a, T>),
}

impl<'a, T: Clone> Values<'a, T> {
    fn of(view: ArrayView1<'a, T>) -> Self {
        match view.to_slice() {
            Some(slice) => Values::Slice(slice),
            None => Values::Strided(view),
        }
    }

    fn to_cow(&self) -> Cow<'a, [T]> {
        match self {
            Values::Slice(slice) => Cow::Borrowed(slice),
            Values::Strided(view) => Cow::Owned(view.iter().cloned().collect()),
        }
    }
}

/// An int64 column (ids, positions, offsets, words, batch sizes).
pub struct Int64Column<'py> {
    source: Source<'py, i64, Int64Array>,
}

impl<'py> Int64Column<'py> {
    /// Accepts Arrow nulls; the kernel decides what they mean.
    pub fn extract(obj: &Bound<'py, PyAny>, name: &str) -> PyResult<Self> {
        let source = match extract_source::<i64>(obj, name, &DataType::Int64, "int64")? {
            Source::NumPy(array) => Source::NumPy(array),
            Source::Arrow(data) => Source::Arrow(Int64Array::from(data)),
        };
        Ok(Int64Column { source })
    }

    /// For columns where a null has no meaning (positions, offsets, words, sizes).
    pub fn extract_non_null(obj: &Bound<'py, PyAny>, name: &str) -> PyResult<Self> {
        let column = Self::extract(obj, name)?;
        if let Source::Arrow(array) = &column.source {
            if array.null_count() > 0 {
                return Err(PyValueError::new_err(format!(
                    "{name}: must not contain nulls ({} found)",
                    array.null_count()
                )));
            }
        }
        Ok(column)
    }

    pub fn len(&self) -> usize {
        match &self.source {
            Source::NumPy(array) => array.len(),
            Source::Arrow(array) => array.len(),
        }
    }

    pub fn is_arrow(&self) -> bool {
        matches!(self.source, Source::Arrow(_))
    }

    /// A `Send` view, usable with the GIL released.
    pub fn view(&self) -> Int64View<'_> {
        match &self.source {
            Source::NumPy(array) => Int64View {
                values: Values::of(array.as_array()),
                nulls: None,
            },
            Source::Arrow(array) => Int64View {
                values: Values::Slice(array.values()),
                nulls: array.nulls().filter(|n| n.null_count() > 0),
            },
        }
    }
}

#[derive(Clone)]
pub struct Int64View<'a> {
    values: Values<'a, i64>,
    /// `None` when the column has no null.
    pub nulls: Option<&'a NullBuffer>,
}

impl<'a> Int64View<'a> {
    /// Contiguous values; strided NumPy views are copied here (call it with the GIL released).
    pub fn values(&self) -> Cow<'a, [i64]> {
        self.values.to_cow()
    }
}

/// A boolean column (row flags such as `is_marker`).
pub struct BoolColumn<'py> {
    /// NumPy bools are read as bytes (non-zero = true): NumPy does not guarantee they hold
    /// 0 or 1 (think of a uint8 buffer viewed as bool), which a Rust `bool` must.
    source: Source<'py, u8, BooleanArray>,
}

impl<'py> BoolColumn<'py> {
    pub fn extract(obj: &Bound<'py, PyAny>, name: &str) -> PyResult<Self> {
        let source = match extract_source::<bool>(obj, name, &DataType::Boolean, "bool")? {
            Source::NumPy(array) => Source::NumPy(
                array
                    .call_method1("view", (numpy::dtype::<u8>(obj.py()),))?
                    .cast_into::<PyArray1<u8>>()?
                    .try_readonly()
                    .map_err(|e| PyValueError::new_err(format!("{name}: {e}")))?,
            ),
            Source::Arrow(data) => Source::Arrow(BooleanArray::from(data)),
        };
        Ok(BoolColumn { source })
    }

    pub fn len(&self) -> usize {
        match &self.source {
            Source::NumPy(array) => array.len(),
            Source::Arrow(array) => array.len(),
        }
    }

    pub fn is_arrow(&self) -> bool {
        matches!(self.source, Source::Arrow(_))
    }

    pub fn view(&self) -> BoolView<'_> {
        match &self.source {
            Source::NumPy(array) => BoolView(BoolValues::NumPy(Values::of(array.as_array()))),
            Source::Arrow(array) => BoolView(BoolValues::Arrow(array)),
        }
    }
}

#[derive(Clone)]
pub struct BoolView<'a>(BoolValues<'a>);

#[derive(Clone)]
enum BoolValues<'a> {
    NumPy(Values<'a, u8>),
    Arrow(&'a BooleanArray),
}

/// Row flags in their cheapest readable form: one byte or one bit per row.
pub enum Flags<'a> {
    /// Non-zero = true.
    Bytes(Cow<'a, [u8]>),
    Bits(BitWords),
}

impl<'a> BoolView<'a> {
    /// Null counts as true: an unknown flag is taken as set (a row that may be a marker is
    /// never visible). Copies only strided NumPy views and nullable Arrow arrays (n/8
    /// bytes); call it with the GIL released.
    pub fn flags(&self) -> Flags<'a> {
        match &self.0 {
            BoolValues::NumPy(values) => Flags::Bytes(values.to_cow()),
            BoolValues::Arrow(array) => Flags::Bits(BitWords::new(&match array.nulls() {
                Some(nulls) if nulls.null_count() > 0 => array.values() | &!nulls.inner(),
                _ => array.values().clone(),
            })),
        }
    }
}

/// A bitmap read 64 rows at a time: word `k` holds rows `64k..64k+64`, LSB first.
pub struct BitWords {
    /// Starts at bit 0 (any bit offset of the source is sliced away).
    bytes: Buffer,
}

impl BitWords {
    pub fn new(bits: &BooleanBuffer) -> Self {
        BitWords {
            bytes: bits.sliced(),
        }
    }

    /// Bits past the end of the bitmap are unspecified; callers mask them.
    #[inline(always)]
    pub fn word(&self, k: usize) -> u64 {
        let tail = &self.bytes[k * 8..];
        match tail.first_chunk::<8>() {
            Some(chunk) => u64::from_le_bytes(*chunk),
            None => {
                let mut chunk = [0u8; 8];
                chunk[..tail.len()].copy_from_slice(tail);
                u64::from_le_bytes(chunk)
            }
        }
    }
}

/// Length check shared by the kernels taking parallel columns.
pub fn require_same_len(columns: &[(&str, usize)]) -> PyResult<usize> {
    let (first_name, len) = columns.first().copied().unwrap_or(("", 0));
    for &(name, other) in &columns[1..] {
        if other != len {
            return Err(PyValueError::new_err(format!(
                "length mismatch: {first_name} has {len} rows but {name} has {other}"
            )));
        }
    }
    Ok(len)
}

/// A boolean result, shaped after its inputs.
pub enum BoolOutput {
    /// For NumPy inputs: one byte per row, handed to NumPy without a copy.
    NumPy(Vec<bool>),
    /// For Arrow inputs: bit-packed, exported through the C data interface.
    Arrow(BooleanBuffer),
}

impl BoolOutput {
    pub fn into_py(self, py: Python<'_>) -> PyResult<Bound<'_, PyAny>> {
        match self {
            BoolOutput::NumPy(values) => Ok(PyArray1::from_vec(py, values).into_any()),
            BoolOutput::Arrow(bits) => {
                let data = BooleanArray::new(bits, None).into_data();
                let export = Bound::new(py, ArrowArrayExport { data })?;
                py.import("pyarrow")?.call_method1("array", (export,))
            }
        }
    }
}

/// A Rust-owned Arrow array offered to Python consumers through `__arrow_c_array__`.
#[pyclass(module = "pyengine_kernels", frozen)]
struct ArrowArrayExport {
    data: ArrayData,
}

#[pymethods]
impl ArrowArrayExport {
    /// Each call exports a fresh reference to the same buffers; the capsules release it
    /// unless the consumer moved the struct out.
    #[pyo3(signature = (requested_schema = None))]
    fn __arrow_c_array__<'py>(
        &self,
        py: Python<'py>,
        requested_schema: Option<Bound<'py, PyAny>>,
    ) -> PyResult<(Bound<'py, PyCapsule>, Bound<'py, PyCapsule>)> {
        // The schema is fixed (boolean); a consumer asking for another one will cast itself.
        let _ = requested_schema;
        let (array, schema) =
            to_ffi(&self.data).map_err(|e| PyValueError::new_err(e.to_string()))?;
        Ok((
            PyCapsule::new_with_value(py, schema, ARROW_SCHEMA)?,
            PyCapsule::new_with_value(py, array, ARROW_ARRAY)?,
        ))
    }
}
