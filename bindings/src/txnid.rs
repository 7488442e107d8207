//! A transaction id: Pulsar's `TxnID(mostSigBits, leastSigBits)`.

use std::fmt;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyType;

/// `most_bits` is the transaction coordinator id, `least_bits` the coordinator's sequence.
///
/// Both are non-negative signed 64-bit values (Pulsar never issues negative ones), which lets
/// NumPy/Arrow columns use negative values or nulls for "not transactional".
#[pyclass(
    module = "pyengine_kernels",
    frozen,
    eq,
    ord,
    hash,
    str,
    from_py_object
)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TxnId {
    #[pyo3(get)]
    pub most_bits: i64,
    #[pyo3(get)]
    pub least_bits: i64,
}

impl TxnId {
    pub fn new(most_bits: i64, least_bits: i64) -> PyResult<Self> {
        if most_bits < 0 || least_bits < 0 {
            return Err(PyValueError::new_err(format!(
                "TxnId bits must be >= 0, got ({most_bits}, {least_bits})"
            )));
        }
        Ok(TxnId {
            most_bits,
            least_bits,
        })
    }
}

impl fmt::Display for TxnId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "({},{})", self.most_bits, self.least_bits)
    }
}

#[pymethods]
impl TxnId {
    #[new]
    fn py_new(most_bits: i64, least_bits: i64) -> PyResult<Self> {
        TxnId::new(most_bits, least_bits)
    }

    fn __repr__(&self) -> String {
        format!("TxnId({}, {})", self.most_bits, self.least_bits)
    }

    fn __reduce__<'py>(slf: &Bound<'py, Self>) -> (Bound<'py, PyType>, (i64, i64)) {
        let t = slf.get();
        (slf.get_type(), (t.most_bits, t.least_bits))
    }
}
