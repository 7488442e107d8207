//! Word-wise merges of ack sets: one pair (`ackset_and` & co.) or many pairs in the ragged
//! layout (`ackset_merge_many`).
//!
//! The bulk merge splits the rows into tasks spread over the rayon pool. A task whose rows
//! have the same lengths on both sides (the common case: both sets of an entry span its batch
//! size) merges its words in one flat loop that the compiler vectorises; the others merge row
//! by row, whose varying lengths cost a mispredicted branch per row. Each task writes into its
//! own region of the output, sized by the untrimmed result; trimming trailing zero words
//! leaves gaps that one final pass closes, and that pass moves nothing when no word was
//! trimmed.

use std::mem::MaybeUninit;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use rayon::prelude::*;

/// 4K rows (32 KiB of words per side for one-word sets): enough work to amortise a task,
/// small enough to balance two cores on a few thousand rows.
const TASK_ROWS: usize = 4096;

#[derive(Clone, Copy)]
pub enum MergeOp {
    And,
    Or,
    AndNot,
}

impl MergeOp {
    pub fn parse(op: &str) -> PyResult<Self> {
        match op {
            "and" => Ok(MergeOp::And),
            "or" => Ok(MergeOp::Or),
            "andnot" => Ok(MergeOp::AndNot),
            _ => Err(PyValueError::new_err(format!(
                "op must be one of 'and', 'or', 'andnot', got {op:?}"
            ))),
        }
    }

    #[inline]
    fn word(self, a: i64, b: i64) -> i64 {
        match self {
            MergeOp::And => a & b,
            MergeOp::Or => a | b,
            MergeOp::AndNot => a & !b,
        }
    }

    /// Words of the untrimmed result. Past the shorter input, a missing word is zero, so the
    /// result there is the longer input's word (or nothing, for `And` and a shorter `a`).
    #[inline]
    pub fn len(self, a: usize, b: usize) -> usize {
        match self {
            MergeOp::And => a.min(b),
            MergeOp::Or => a.max(b),
            MergeOp::AndNot => a,
        }
    }
}

/// Writes `a op b` to the start of `out` and returns its length once trimmed of trailing
/// zero words: `out[..len]` is initialised. `out` must hold `op.len(a.len(), b.len())` words.
#[inline(always)]
pub fn merge_row(op: MergeOp, a: &[i64], b: &[i64], out: &mut [MaybeUninit<i64>]) -> usize {
    let (common, len) = (a.len().min(b.len()), op.len(a.len(), b.len()));
    let longer = if a.len() >= b.len() { a } else { b };
    let (head, tail) = out[..len].split_at_mut(common);
    for (o, (&x, &y)) in head.iter_mut().zip(a.iter().zip(b)) {
        o.write(op.word(x, y));
    }
    for (o, &x) in tail.iter_mut().zip(&longer[common..len]) {
        o.write(x);
    }
    trimmed_len(0..len, |j| {
        if j < common {
            op.word(a[j], b[j])
        } else {
            longer[j]
        }
    })
}

/// Length of `words` once trimmed of trailing zero words, where `word(j)` is word `j`;
/// recomputing from the inputs spares reading back the (uninitialised-typed) output.
#[inline]
fn trimmed_len(words: std::ops::Range<usize>, word: impl Fn(usize) -> i64) -> usize {
    let start = words.start;
    words
        .rev()
        .find(|&j| word(j) != 0)
        .map_or(0, |j| j + 1 - start)
}

/// Many ack sets: set i is `words[offsets[i]..offsets[i + 1]]`, offsets already validated.
#[derive(Clone, Copy)]
pub struct Sets<'a> {
    pub offsets: &'a [i64],
    pub words: &'a [i64],
}

impl Sets<'_> {
    #[inline]
    fn start(&self, i: usize) -> usize {
        self.offsets[i] as usize
    }

    #[inline]
    fn row(&self, i: usize) -> &[i64] {
        &self.words[self.start(i)..self.start(i + 1)]
    }

    /// Whether rows `rows` have the same lengths here as in `other`.
    fn same_lengths(&self, other: &Self, rows: std::ops::Range<usize>) -> bool {
        let (base, other_base) = (self.offsets[rows.start], other.offsets[rows.start]);
        let range = rows.start..rows.end + 1;
        // A fold rather than `all`: without the early exit the loop vectorises.
        self.offsets[range.clone()]
            .iter()
            .zip(&other.offsets[range])
            .fold(true, |same, (&x, &y)| same & (x - base == y - other_base))
    }
}

/// One task's rows and where its untrimmed result goes in the output words.
struct Task {
    rows: std::ops::Range<usize>,
    /// Merge as one flat run of words (rows of equal lengths on both sides).
    flat: bool,
    start: usize,
    len: usize,
}

/// `items.map(f)`, on the rayon pool when there is more than one item: handing even one job
/// to the pool costs a round trip between threads, tens of rows' worth of work.
fn map_tasks<T: Send, R: Send>(items: Vec<T>, f: impl Fn(T) -> R + Sync + Send) -> Vec<R> {
    if items.len() > 1 {
        items.into_par_iter().map(f).collect()
    } else {
        items.into_iter().map(f).collect()
    }
}

fn plan(op: MergeOp, a: Sets<'_>, b: Sets<'_>) -> Vec<Task> {
    let rows = a.offsets.len() - 1;
    let mut tasks = map_tasks((0..rows.div_ceil(TASK_ROWS)).collect(), |t| {
        let rows = t * TASK_ROWS..rows.min((t + 1) * TASK_ROWS);
        let flat = a.same_lengths(&b, rows.clone());
        let len = if flat {
            a.start(rows.end) - a.start(rows.start)
        } else {
            rows.clone()
                .map(|i| op.len(a.row(i).len(), b.row(i).len()))
                .sum()
        };
        Task {
            rows,
            flat,
            start: 0,
            len,
        }
    });
    let mut start = 0;
    for task in &mut tasks {
        task.start = start;
        start += task.len;
    }
    tasks
}

impl Task {
    /// Merges the task's rows into `out` (its region), each row's trimmed result right after
    /// the previous one, and writes each row's end offset (as if every region before were
    /// full) to `ends`. Returns how many words it kept.
    fn run_op(
        &self,
        op: MergeOp,
        a: Sets<'_>,
        b: Sets<'_>,
        out: &mut [MaybeUninit<i64>],
        ends: &mut [MaybeUninit<i64>],
    ) -> usize {
        match op {
            MergeOp::And => self.run(MergeOp::And, a, b, out, ends),
            MergeOp::Or => self.run(MergeOp::Or, a, b, out, ends),
            MergeOp::AndNot => self.run(MergeOp::AndNot, a, b, out, ends),
        }
    }

    /// Always inlined into `run_op`'s arms, so that each op gets its own loops.
    #[inline(always)]
    fn run(
        &self,
        op: MergeOp,
        a: Sets<'_>,
        b: Sets<'_>,
        out: &mut [MaybeUninit<i64>],
        ends: &mut [MaybeUninit<i64>],
    ) -> usize {
        let mut kept = 0;
        if self.flat {
            let (a_base, b_base) = (a.start(self.rows.start), b.start(self.rows.start));
            let (a_words, b_words) = (&a.words[a_base..], &b.words[b_base..]);
            for (o, (&x, &y)) in out.iter_mut().zip(a_words.iter().zip(b_words)) {
                o.write(op.word(x, y));
            }
            for (i, end) in self.rows.clone().zip(ends) {
                let row = a.start(i) - a_base..a.start(i + 1) - a_base;
                let len = trimmed_len(row.clone(), |j| op.word(a_words[j], b_words[j]));
                // Only a trimmed row before this one leaves a gap to close.
                if kept != row.start {
                    out.copy_within(row.start..row.start + len, kept);
                }
                kept += len;
                end.write((self.start + kept) as i64);
            }
        } else {
            for (i, end) in self.rows.clone().zip(ends) {
                kept += merge_row(op, a.row(i), b.row(i), &mut out[kept..]);
                end.write((self.start + kept) as i64);
            }
        }
        kept
    }
}

/// Row-wise `a op b` of two validated ragged columns with the same number of rows, as
/// `(offsets, words)`.
pub fn merge_many(op: MergeOp, a: Sets<'_>, b: Sets<'_>) -> (Vec<i64>, Vec<i64>) {
    let rows = a.offsets.len() - 1;
    let tasks = plan(op, a, b);
    let mut offsets = Vec::with_capacity(rows + 1);
    let mut words = Vec::with_capacity(tasks.last().map_or(0, |t| t.start + t.len));
    offsets.push(0);
    let mut jobs = Vec::with_capacity(tasks.len());
    let mut rest = words.spare_capacity_mut();
    let ends = offsets.spare_capacity_mut()[..rows].chunks_mut(TASK_ROWS);
    for (task, ends) in tasks.iter().zip(ends) {
        let (region, tail) = rest.split_at_mut(task.len);
        jobs.push((task, region, ends));
        rest = tail;
    }
    let kept = map_tasks(jobs, |(task, region, ends)| {
        task.run_op(op, a, b, region, ends)
    });
    // SAFETY: every task wrote the end offset of each of its rows, and the tasks cover the
    // rows (`TASK_ROWS` each, in order), so offsets 1..=rows are initialised.
    unsafe { offsets.set_len(rows + 1) };

    // Close the gaps left by trimmed words, shifting the offsets of the moved rows.
    let out = words.spare_capacity_mut();
    let mut len = 0;
    for (task, kept) in tasks.iter().zip(kept) {
        if task.start != len {
            out.copy_within(task.start..task.start + kept, len);
            let shift = (task.start - len) as i64;
            for end in &mut offsets[task.rows.start + 1..=task.rows.end] {
                *end -= shift;
            }
        }
        len += kept;
    }
    // SAFETY: each task initialised the first `kept` words of its region, and the loop above
    // moved them, in task order, to one contiguous run from 0 to `len`.
    unsafe { words.set_len(len) };
    words.shrink_to_fit();
    (offsets, words)
}
