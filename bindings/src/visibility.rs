//! READ_COMMITTED visibility of stored rows: the hot path of every transactional read.
//!
//! A row is visible iff it is not a txn marker, its position is at or before the transaction
//! buffer's max read position, and it does not belong to an aborted transaction.
//!
//! Rows are processed 64 at a time into one word of visibility bits (see `blocks`). The
//! position test and the marker flags are combined without branches; the aborted set is
//! probed only when it is not empty, and then once per run of rows of one txn that has a
//! visible row.

use arrow_buffer::{BooleanBuffer, Buffer, NullBuffer};
use pyo3::prelude::*;

use crate::aborted::AbortedTxnSet;
use crate::aborted_probe::Lookup;
use crate::arrow_io::{require_same_len, BitWords, BoolColumn, BoolOutput, Flags, Int64Column};
use crate::blocks::{self, Blocks, BLOCK_ROWS};
use crate::position::Position;
use crate::txn_rows::TxnRows;

/// Per-row flags, read a block of 64 rows at a time.
trait BlockFlags: Sync {
    /// Bit j is row `64 * k + j`; bits at or past `len` rows are unspecified.
    fn word(&self, k: usize) -> u64;
}

/// One byte per row, non-zero = true.
impl BlockFlags for [u8] {
    #[inline(always)]
    fn word(&self, k: usize) -> u64 {
        let start = k * BLOCK_ROWS;
        let rows = &self[start..self.len().min(start + BLOCK_ROWS)];
        rows.iter()
            .enumerate()
            .fold(0, |word, (j, &flag)| word | (u64::from(flag != 0) << j))
    }
}

impl BlockFlags for BitWords {
    #[inline(always)]
    fn word(&self, k: usize) -> u64 {
        BitWords::word(self, k)
    }
}

struct Rows<'a, M: ?Sized> {
    len: usize,
    ledger: &'a [i64],
    entry: &'a [i64],
    is_marker: &'a M,
    max: Position,
    /// Only when some transaction was aborted.
    txns: Option<TxnRows<'a>>,
}

impl<M: BlockFlags + ?Sized> Blocks for Rows<'_, M> {
    type State<'s>
        = Option<Lookup<'s, 's>>
    where
        Self: 's;

    fn rows(&self) -> usize {
        self.len
    }

    fn state(&self) -> Option<Lookup<'_, '_>> {
        self.txns.as_ref().map(|txns| txns.probe.lookup())
    }

    #[inline(always)]
    fn block(&self, k: usize, lookup: &mut Option<Lookup<'_, '_>>) -> u64 {
        let start = k * BLOCK_ROWS;
        let end = self.len.min(start + BLOCK_ROWS);
        let (ledger, entry) = (&self.ledger[start..end], &self.entry[start..end]);
        let (max_ledger, max_entry) = (self.max.ledger_id, self.max.entry_id);
        let mut visible = ledger
            .iter()
            .zip(entry)
            .enumerate()
            .fold(0u64, |word, (j, (&l, &e))| {
                // Non-short-circuit operators keep the loop branch-free.
                let readable = (l < max_ledger) | ((l == max_ledger) & (e <= max_entry));
                word | (u64::from(readable) << j)
            });
        visible &= !self.is_marker.word(k);
        if let (Some(txns), Some(lookup)) = (&self.txns, lookup) {
            visible &= !txns.aborted(k, start..end, visible, lookup);
        }
        visible
    }
}

impl<M: BlockFlags + ?Sized> Rows<'_, M> {
    fn collect(&self, arrow: bool) -> BoolOutput {
        if arrow {
            let bits = BooleanBuffer::new(Buffer::from_vec(blocks::words(self)), 0, self.len);
            BoolOutput::Arrow(bits)
        } else {
            BoolOutput::NumPy(blocks::bytes(self))
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
    let (ledger, entry, most, least, is_marker) = (
        ledger.view(),
        entry.view(),
        most.view(),
        least.view(),
        is_marker.view(),
    );
    let aborted: &AbortedTxnSet = &aborted;
    let mask = py.detach(|| {
        let (ledger, entry) = (ledger.values(), entry.values());
        // With nothing aborted the txn columns are never read (nor copied if strided).
        let txn_values =
            (!aborted.is_empty()).then(|| (most.values(), least.values(), aborted.probe()));
        let txns = txn_values
            .as_ref()
            .map(|(most_values, least_values, probe)| TxnRows {
                most: most_values,
                least: least_values,
                valid: NullBuffer::union(most.nulls, least.nulls).map(|v| BitWords::new(v.inner())),
                probe,
            });
        match is_marker.flags() {
            Flags::Bytes(flags) => {
                let is_marker = &flags[..];
                Rows {
                    len,
                    ledger: &ledger,
                    entry: &entry,
                    is_marker,
                    max: max_read_position,
                    txns,
                }
                .collect(arrow)
            }
            Flags::Bits(flags) => {
                let is_marker = &flags;
                Rows {
                    len,
                    ledger: &ledger,
                    entry: &entry,
                    is_marker,
                    max: max_read_position,
                    txns,
                }
                .collect(arrow)
            }
        }
    });
    mask.into_py(py)
}
