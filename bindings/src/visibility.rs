//! READ_COMMITTED visibility of stored rows: the hot path of every transactional read.
//!
//! A row is visible iff it is not a txn marker, its position is at or before the transaction
//! buffer's max read position, and it does not belong to an aborted transaction.

use arrow_buffer::{BooleanBuffer, NullBuffer};
use pyo3::prelude::*;

use crate::aborted::{AbortedTxnSet, Lookup};
use crate::arrow_io::{require_same_len, BoolColumn, BoolOutput, Flags, Int64Column};
use crate::position::Position;

/// Per-row boolean input, read without branching on its representation.
trait RowFlag: Sync {
    fn get(&self, i: usize) -> bool;
}

impl RowFlag for [bool] {
    #[inline(always)]
    fn get(&self, i: usize) -> bool {
        self[i]
    }
}

impl RowFlag for BooleanBuffer {
    #[inline(always)]
    fn get(&self, i: usize) -> bool {
        self.value(i)
    }
}

/// Transaction ids of the rows, only consulted when some transaction was aborted.
struct TxnRows<'a> {
    most: &'a [i64],
    least: &'a [i64],
    /// Rows whose ids are both non-null; `None` when there is no null.
    valid: Option<&'a NullBuffer>,
    lookup: Lookup<'a>,
}

struct Rows<'a, M: ?Sized> {
    ledger: &'a [i64],
    entry: &'a [i64],
    is_marker: &'a M,
    max: Position,
    txns: Option<TxnRows<'a>>,
}

impl<M: RowFlag + ?Sized> Rows<'_, M> {
    #[inline(always)]
    fn visible(&mut self, i: usize) -> bool {
        let (ledger, entry) = (self.ledger[i], self.entry[i]);
        // Non-short-circuit operators: no branch per row on data-dependent comparisons.
        let readable = (ledger < self.max.ledger_id)
            | ((ledger == self.max.ledger_id) & (entry <= self.max.entry_id));
        let visible = readable & !self.is_marker.get(i);
        match &mut self.txns {
            // Invisible rows need no lookup.
            Some(txns) if visible => {
                let transactional = txns.valid.is_none_or(|v| v.is_valid(i));
                !(transactional && txns.lookup.contains(txns.most[i], txns.least[i]))
            }
            _ => visible,
        }
    }

    fn collect(mut self, len: usize, arrow: bool) -> BoolOutput {
        if arrow {
            BoolOutput::Arrow(BooleanBuffer::collect_bool(len, |i| self.visible(i)))
        } else {
            BoolOutput::NumPy((0..len).map(|i| self.visible(i)).collect())
        }
    }
}

#[pyfunction]
#[allow(clippy::too_many_arguments)]
pub fn visibility_mask<'py>(
    py: Python<'py>,
    ledger_id: &Bound<'py, PyAny>,
    entry_id: &Bound<'py, PyAny>,
    txnid_most: &Bound<'py, PyAny>,
    txnid_least: &Bound<'py, PyAny>,
    is_marker: &Bound<'py, PyAny>,
    max_read_position: Position,
    aborted: PyRef<'py, AbortedTxnSet>,
) -> PyResult<Bound<'py, PyAny>> {
    let ledger = Int64Column::extract_non_null(ledger_id, "ledger_id")?;
    let entry = Int64Column::extract_non_null(entry_id, "entry_id")?;
    let most = Int64Column::extract(txnid_most, "txnid_most")?;
    let least = Int64Column::extract(txnid_least, "txnid_least")?;
    let is_marker = BoolColumn::extract(is_marker, "is_marker")?;
    let len = require_same_len(&[
        ("ledger_id", ledger.len()),
        ("entry_id", entry.len()),
        ("txnid_most", most.len()),
        ("txnid_least", least.len()),
        ("is_marker", is_marker.len()),
    ])?;
    let arrow = ledger.is_arrow()
        || entry.is_arrow()
        || most.is_arrow()
        || least.is_arrow()
        || is_marker.is_arrow();
    let (ledger, entry, most, least, is_marker) =
        (ledger.view(), entry.view(), most.view(), least.view(), is_marker.view());
    let aborted: &AbortedTxnSet = &aborted;
    let mask = py.detach(|| {
        let (ledger, entry) = (ledger.values(), entry.values());
        let (most_values, least_values) = (most.values(), least.values());
        let valid = NullBuffer::union(most.nulls, least.nulls);
        let txns = (!aborted.is_empty()).then(|| TxnRows {
            most: &most_values[..len],
            least: &least_values[..len],
            valid: valid.as_ref(),
            lookup: aborted.lookup(),
        });
        let (ledger, entry) = (&ledger[..len], &entry[..len]);
        match is_marker.flags() {
            Flags::Bytes(flags) => {
                Rows { ledger, entry, is_marker: &flags[..], max: max_read_position, txns }
                    .collect(len, arrow)
            }
            Flags::Bits(flags) => {
                Rows { ledger, entry, is_marker: &flags, max: max_read_position, txns }
                    .collect(len, arrow)
            }
        }
    });
    mask.into_py(py)
}
