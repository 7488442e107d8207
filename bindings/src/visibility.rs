//! READ_COMMITTED visibility of stored rows: the hot path of every transactional read.
//!
//! A row is visible iff it is not a txn marker, its position is at or before the transaction
//! buffer's max read position, and it does not belong to an aborted transaction.
//!
//! Rows are processed 64 at a time into one word of visibility bits. The position test and
//! the marker flags are combined without branches; the aborted set is probed only when it is
//! not empty, and then once per run of rows of one txn that has a visible row. Blocks are
//! spread over the rayon pool in tasks of `TASK_BLOCKS` words, each with its own probe cache
//! (rayon measurably helps even on two cores: the kernel is not purely memory-bound).

use std::ops::Range;

use arrow_buffer::{BooleanBuffer, Buffer, NullBuffer};
use pyo3::prelude::*;
use rayon::prelude::*;

use crate::aborted::{AbortedTxnSet, Lookup};
use crate::arrow_io::{require_same_len, BitWords, BoolColumn, BoolOutput, Flags, Int64Column};
use crate::position::Position;

const BLOCK_ROWS: usize = 64;
/// 64K rows per task: large enough to amortise the task overhead and the cold probe cache
/// each task starts with, small enough to balance the load across cores.
const TASK_BLOCKS: usize = 1024;

/// Per-row flags, read a block of 64 rows at a time.
trait BlockFlags: Sync {
    /// Bit j is row `64 * k + j`; bits at or past `len` rows are unspecified.
    fn word(&self, k: usize) -> u64;
}

/// One byte per row, non-zero = true.
impl BlockFlags for [u8] {
    #[inline]
    fn word(&self, k: usize) -> u64 {
        let start = k * BLOCK_ROWS;
        let rows = &self[start..self.len().min(start + BLOCK_ROWS)];
        rows.iter()
            .enumerate()
            .fold(0, |word, (j, &flag)| word | (u64::from(flag != 0) << j))
    }
}

impl BlockFlags for BitWords {
    #[inline]
    fn word(&self, k: usize) -> u64 {
        BitWords::word(self, k)
    }
}

/// Transaction ids of the rows, only consulted when some transaction was aborted.
struct TxnRows<'a> {
    most: &'a [i64],
    least: &'a [i64],
    /// Rows whose ids are both non-null; `None` when there is no null.
    valid: Option<BitWords>,
    aborted: &'a AbortedTxnSet,
}

impl TxnRows<'_> {
    /// Bits of the rows of block `k` (`rows`) that belong to an aborted txn.
    ///
    /// The rows of one txn are adjacent, so the block is cut into runs of equal ids and each
    /// run that has a visible row is probed once, through its first row.
    #[inline]
    fn aborted(&self, k: usize, rows: Range<usize>, visible: u64, lookup: &mut Lookup<'_>) -> u64 {
        let (most, least) = (&self.most[rows.clone()], &self.least[rows]);
        // Bit j: row j starts a run (row 0 always does).
        let mut starts = most
            .windows(2)
            .zip(least.windows(2))
            .enumerate()
            .fold(1u64, |starts, (j, (m, l))| {
                starts | (u64::from((m[0] != m[1]) | (l[0] != l[1])) << (j + 1))
            });
        let mut aborted = 0u64;
        while starts != 0 {
            let first = starts.trailing_zeros() as usize;
            starts &= starts - 1;
            let end = if starts == 0 {
                most.len()
            } else {
                starts.trailing_zeros() as usize
            };
            let run = (u64::MAX >> (BLOCK_ROWS - (end - first))) << first;
            if visible & run != 0 && lookup.contains(most[first], least[first]) {
                aborted |= run;
            }
        }
        // A null id is "not transactional", whatever value sits in its slot.
        aborted & self.valid.as_ref().map_or(u64::MAX, |v| v.word(k))
    }
}

struct Rows<'a, M: ?Sized> {
    len: usize,
    ledger: &'a [i64],
    entry: &'a [i64],
    is_marker: &'a M,
    max: Position,
    txns: Option<TxnRows<'a>>,
}

impl<M: BlockFlags + ?Sized> Rows<'_, M> {
    /// Visibility bits of block `k`; bits past the last row are zero.
    #[inline]
    fn block(&self, k: usize, lookup: &mut Option<Lookup<'_>>) -> u64 {
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

    fn lookup(&self) -> Option<Lookup<'_>> {
        self.txns.as_ref().map(|txns| txns.aborted.lookup())
    }

    /// Bit-packed result, for Arrow.
    fn words(&self) -> Vec<u64> {
        let mut words = vec![0u64; self.len.div_ceil(BLOCK_ROWS)];
        words
            .par_chunks_mut(TASK_BLOCKS)
            .enumerate()
            .for_each(|(task, out)| {
                let mut lookup = self.lookup();
                for (i, word) in out.iter_mut().enumerate() {
                    *word = self.block(task * TASK_BLOCKS + i, &mut lookup);
                }
            });
        words
    }

    /// One byte per row, for NumPy.
    fn bytes(&self) -> Vec<bool> {
        let mut bytes = vec![false; self.len];
        bytes
            .par_chunks_mut(TASK_BLOCKS * BLOCK_ROWS)
            .enumerate()
            .for_each(|(task, out)| {
                let mut lookup = self.lookup();
                for (i, rows) in out.chunks_mut(BLOCK_ROWS).enumerate() {
                    let word = self.block(task * TASK_BLOCKS + i, &mut lookup);
                    for (j, row) in rows.iter_mut().enumerate() {
                        *row = (word >> j) & 1 == 1;
                    }
                }
            });
        bytes
    }

    fn collect(&self, arrow: bool) -> BoolOutput {
        if arrow {
            let bits = BooleanBuffer::new(Buffer::from_vec(self.words()), 0, self.len);
            BoolOutput::Arrow(bits)
        } else {
            BoolOutput::NumPy(self.bytes())
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
        let txn_values = (!aborted.is_empty()).then(|| (most.values(), least.values()));
        let txns = txn_values
            .as_ref()
            .map(|(most_values, least_values)| TxnRows {
                most: most_values,
                least: least_values,
                valid: NullBuffer::union(most.nulls, least.nulls).map(|v| BitWords::new(v.inner())),
                aborted,
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
