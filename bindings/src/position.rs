//! A managed-ledger position: Pulsar's `(ledgerId, entryId)` pair.

use std::fmt;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyType;

/// `(ledger_id, entry_id)`, ordered lexicographically like Pulsar's `PositionImpl`.
///
/// Field order matters: the derived `Ord` is the lexicographic order.
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
pub struct Position {
    #[pyo3(get)]
    pub ledger_id: i64,
    #[pyo3(get)]
    pub entry_id: i64,
}

impl Position {
    pub const EARLIEST: Position = Position {
        ledger_id: -1,
        entry_id: -1,
    };
    pub const LATEST: Position = Position {
        ledger_id: i64::MAX,
        entry_id: i64::MAX,
    };

    /// Pulsar uses -1 as "before the first" in both components; nothing lower is meaningful.
    pub fn new(ledger_id: i64, entry_id: i64) -> PyResult<Self> {
        if ledger_id < -1 || entry_id < -1 {
            return Err(PyValueError::new_err(format!(
                "Position ids must be >= -1, got ({ledger_id}, {entry_id})"
            )));
        }
        Ok(Position {
            ledger_id,
            entry_id,
        })
    }

    /// Checks that this is the position of a stored entry (both ids >= 0), as opposed to
    /// a boundary such as `(L, -1)` or `EARLIEST`.
    pub fn require_entry(self, what: &str) -> PyResult<Self> {
        if self.ledger_id < 0 || self.entry_id < 0 {
            return Err(PyValueError::new_err(format!(
                "{what} must be an entry position (ledger_id >= 0, entry_id >= 0), got {self}"
            )));
        }
        Ok(self)
    }

    /// The position just before this one within its ledger; `(L, 0)` gives `(L, -1)`,
    /// Pulsar's "before the first entry of L".
    pub fn prev(self) -> PyResult<Self> {
        if self.entry_id == -1 {
            return Err(PyValueError::new_err(format!(
                "{self} is already before the first entry of its ledger; it has no previous position"
            )));
        }
        Ok(Position {
            entry_id: self.entry_id - 1,
            ..self
        })
    }
}

impl fmt::Display for Position {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.ledger_id, self.entry_id)
    }
}

#[pymethods]
impl Position {
    #[new]
    fn py_new(ledger_id: i64, entry_id: i64) -> PyResult<Self> {
        Position::new(ledger_id, entry_id)
    }

    #[classattr]
    #[pyo3(name = "EARLIEST")]
    fn earliest() -> Self {
        Position::EARLIEST
    }

    #[classattr]
    #[pyo3(name = "LATEST")]
    fn latest() -> Self {
        Position::LATEST
    }

    #[pyo3(name = "prev")]
    fn py_prev(&self) -> PyResult<Self> {
        self.prev()
    }

    fn next(&self) -> PyResult<Self> {
        let entry_id = self.entry_id.checked_add(1).ok_or_else(|| {
            PyValueError::new_err(format!(
                "{self} is the last representable position of its ledger"
            ))
        })?;
        Ok(Position { entry_id, ..*self })
    }

    fn __repr__(&self) -> String {
        format!("Position({}, {})", self.ledger_id, self.entry_id)
    }

    fn __reduce__<'py>(slf: &Bound<'py, Self>) -> (Bound<'py, PyType>, (i64, i64)) {
        let p = slf.get();
        (slf.get_type(), (p.ledger_id, p.entry_id))
    }
}
