//! Ongoing transactions of a topic and the transaction buffer's max read position.

use pyo3::prelude::*;

use crate::position::Position;
use crate::position_index::TxnPositionIndex;
use crate::txnid::TxnId;

/// Ongoing txn -> position of its first entry in the topic.
#[pyclass(module = "pyengine_kernels")]
#[derive(Default)]
pub struct OngoingTxnMap {
    index: TxnPositionIndex,
}

#[pymethods]
impl OngoingTxnMap {
    #[new]
    fn new() -> Self {
        Self::default()
    }

    /// Later appends of an already-ongoing txn do not move its first position.
    fn add(&mut self, txn: TxnId, position: Position) -> PyResult<bool> {
        let position = position.require_entry("an ongoing txn's first position")?;
        Ok(self.index.insert(txn, position))
    }

    fn remove(&mut self, txn: TxnId) -> Option<Position> {
        self.index.remove(txn)
    }

    fn first_position(&self, txn: TxnId) -> Option<Position> {
        self.index.get(txn)
    }

    fn lowest(&self) -> Option<(TxnId, Position)> {
        self.index.lowest().map(|(position, txn)| (txn, position))
    }

    /// Readers in READ_COMMITTED may see everything strictly before the oldest ongoing txn;
    /// with no ongoing txn they may read up to the last add-confirmed entry.
    fn max_read_position(&self, lac: Position) -> PyResult<Position> {
        match self.index.lowest() {
            Some((position, _)) => position.prev(),
            None => Ok(lac),
        }
    }

    fn items(&self) -> Vec<(TxnId, Position)> {
        self.index
            .iter()
            .map(|(position, txn)| (txn, position))
            .collect()
    }

    fn clear(&mut self) {
        self.index.clear();
    }

    fn __contains__(&self, txn: TxnId) -> bool {
        self.index.contains(txn)
    }

    fn __len__(&self) -> usize {
        self.index.len()
    }

    fn __repr__(&self) -> String {
        format!("OngoingTxnMap(<{} ongoing>)", self.index.len())
    }
}
