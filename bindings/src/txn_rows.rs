//! Transaction ids of rows, probed against an aborted set a block of 64 rows at a time.

use std::ops::Range;

use crate::aborted_probe::{Lookup, Probe};
use crate::arrow_io::BitWords;
use crate::blocks::{Blocks, BLOCK_ROWS};

pub struct TxnRows<'a> {
    pub most: &'a [i64],
    pub least: &'a [i64],
    /// Rows whose ids are both non-null; `None` when there is no null.
    pub valid: Option<BitWords>,
    pub probe: &'a Probe<'a>,
}

impl TxnRows<'_> {
    /// Bits of the rows of block `k` (`rows`) that belong to an aborted txn, among the rows
    /// set in `wanted` (others may or may not be set).
    ///
    /// The rows of one txn are adjacent, so the block is cut into runs of equal ids and each
    /// run that has a wanted row is probed once, through its first row.
    #[inline(always)]
    pub fn aborted(&self, k: usize, rows: Range<usize>, wanted: u64, lookup: &mut Lookup) -> u64 {
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
            if wanted & run != 0 && lookup.contains(most[first], least[first]) {
                aborted |= run;
            }
        }
        // A null id is "not transactional", whatever value sits in its slot.
        aborted & self.valid.as_ref().map_or(u64::MAX, |v| v.word(k))
    }
}

/// Each row's membership in the aborted set (`AbortedTxnSet.contains_many`).
impl Blocks for TxnRows<'_> {
    type State<'s>
        = Lookup<'s, 's>
    where
        Self: 's;

    fn rows(&self) -> usize {
        self.most.len()
    }

    fn state(&self) -> Lookup<'_, '_> {
        self.probe.lookup()
    }

    #[inline(always)]
    fn block(&self, k: usize, lookup: &mut Lookup<'_, '_>) -> u64 {
        let start = k * BLOCK_ROWS;
        let rows = start..self.rows().min(start + BLOCK_ROWS);
        let all = u64::MAX >> (BLOCK_ROWS - rows.len());
        self.aborted(k, rows, all, lookup) & all
    }
}
