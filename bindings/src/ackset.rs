//! Batch-index ack sets: the `long[]` words of a Java `BitSet` where a SET bit marks an index
//! that is still UNACKED (bit i lives in word i / 64, least significant bit first).
//!
//! Results are trimmed of trailing zero words like `BitSet.toLongArray()`, so a fully acked
//! entry is `[]`. Unlike Pulsar's `PositionAckSetUtil.isAckSetOverlap`, conflict detection
//! looks only at indexes below the batch size and treats missing words as acked.

use std::borrow::Cow;

use numpy::{PyArray1, PyUntypedArray};
use pyo3::exceptions::{PyMemoryError, PyOverflowError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyList, PyTuple};

use crate::ackset_merge::{merge_many, merge_row, MergeOp, Sets};
use crate::arrow_io::{python_type_name, require_same_len, Int64Column, Int64View};

const WORD_BITS: usize = 64;

/// Word `i` of an ack set; words past the end are zero, as in `BitSet`.
#[inline]
fn word(words: &[i64], i: usize) -> i64 {
    words.get(i).copied().unwrap_or(0)
}

/// The bits of word `i` that stand for indexes below `batch_size`.
#[inline]
fn batch_mask(i: usize, batch_size: usize) -> i64 {
    match batch_size.saturating_sub(i * WORD_BITS) {
        bits if bits >= WORD_BITS => -1,
        bits => ((1u64 << bits) - 1) as i64,
    }
}

fn is_fully_acked(a: &[i64], batch_size: Option<usize>) -> bool {
    match batch_size {
        None => a.iter().all(|&w| w == 0),
        Some(size) => a
            .iter()
            .take(size.div_ceil(WORD_BITS))
            .enumerate()
            .all(|(i, &w)| w & batch_mask(i, size) == 0),
    }
}

/// Some index below `batch_size` is acked (bit clear) in both sets.
fn conflicts(a: &[i64], b: &[i64], batch_size: usize) -> bool {
    // One word past the longer set is enough: from there on both are all-acked.
    let words = batch_size.div_ceil(WORD_BITS).min(a.len().max(b.len()) + 1);
    (0..words).any(|i| !word(a, i) & !word(b, i) & batch_mask(i, batch_size) != 0)
}

fn unacked_count(a: &[i64], batch_size: usize) -> u64 {
    a.iter()
        .take(batch_size.div_ceil(WORD_BITS))
        .enumerate()
        .map(|(i, &w)| u64::from((w & batch_mask(i, batch_size)).count_ones()))
        .sum()
}

/// Pulsar batch sizes are Java ints.
fn batch_size_arg(batch_size: i64) -> PyResult<usize> {
    usize::try_from(batch_size)
        .ok()
        .filter(|_| batch_size <= i64::from(i32::MAX))
        .ok_or_else(|| {
            PyValueError::new_err(format!(
                "batch_size must be in [0, 2**31-1], got {batch_size}"
            ))
        })
}

/// The most messages a batch holds: it is one entry, which Pulsar's maxMessageSize (a Java int)
/// keeps under 2 GiB, and a batched message takes 6 bytes at least (its size and payload_size).
const MAX_BATCH_SIZE: i64 = i32::MAX as i64 / 6;

/// A batch size that a result grows with (a word per 64 indexes, or an int per index): one
/// that no batch can have is refused before its memory is taken.
fn allocating_batch_size_arg(batch_size: i64) -> PyResult<usize> {
    let size = batch_size_arg(batch_size)?;
    if batch_size > MAX_BATCH_SIZE {
        return Err(PyValueError::new_err(format!(
            "batch_size {batch_size} is more messages than a batch holds (at most {MAX_BATCH_SIZE}: \
             6 bytes each in an entry under 2 GiB)"
        )));
    }
    Ok(size)
}

/// An ack set given as a sequence of signed 64-bit ints, or a NumPy/Arrow int64 array.
fn words_arg(obj: &Bound<'_, PyAny>, name: &str) -> PyResult<Vec<i64>> {
    // A list or tuple (the broker's ack sets) goes straight to the extraction: asking it for
    // `__arrow_c_array__` raised and cleared an AttributeError, most of a small call's cost.
    let plain = obj.is_exact_instance_of::<PyList>() || obj.is_exact_instance_of::<PyTuple>();
    if !plain && (obj.cast::<PyUntypedArray>().is_ok() || obj.hasattr("__arrow_c_array__")?) {
        return Ok(Int64Column::extract_non_null(obj, name)?
            .view()
            .values()
            .into_owned());
    }
    obj.extract::<Vec<i64>>().map_err(|e| {
        if e.is_instance_of::<PyOverflowError>(obj.py()) {
            PyValueError::new_err(format!("{name}: words must be signed 64-bit ints: {e}"))
        } else {
            PyTypeError::new_err(format!(
                "{name}: expected a sequence of ints or an int64 array, got {}",
                python_type_name(obj)
            ))
        }
    })
}

/// Pairs of ragged columns at least this long are validated side by side on the rayon pool:
/// reading 64K offsets takes longer than handing a job to it.
const PARALLEL_VALIDATION_ROWS: usize = 1 << 16;

/// Many ack sets in one ragged layout: set i is `words[offsets[i]..offsets[i + 1]]`.
struct RaggedView<'a> {
    /// Argument name prefix for messages: "a_", "b_" or "".
    prefix: &'static str,
    rows: usize,
    offsets: Int64View<'a>,
    words: Int64View<'a>,
}

struct Ragged<'a> {
    offsets: Cow<'a, [i64]>,
    words: Cow<'a, [i64]>,
}

impl<'a> RaggedView<'a> {
    /// Validates the offsets; call it with the GIL released (it reads every offset).
    fn materialise(&self) -> PyResult<Ragged<'a>> {
        let (offsets, words) = (self.offsets.values(), self.words.values());
        let prefix = self.prefix;
        let invalid = |what: String| PyValueError::new_err(format!("{prefix}offsets: {what}"));
        if offsets.first() != Some(&0) {
            return Err(invalid(
                "must start with 0 (n + 1 offsets for n ack sets)".into(),
            ));
        }
        if let Some(i) = offsets.windows(2).position(|pair| pair[1] < pair[0]) {
            return Err(invalid(format!(
                "must be non-decreasing, but offset {} ({}) < offset {i} ({})",
                i + 1,
                offsets[i + 1],
                offsets[i]
            )));
        }
        let last = *offsets.last().expect("starts with 0");
        if usize::try_from(last).ok() != Some(words.len()) {
            return Err(invalid(format!(
                "last offset ({last}) must equal len({prefix}words) ({})",
                words.len()
            )));
        }
        Ok(Ragged { offsets, words })
    }

    /// Both materialised, `a`'s error first.
    fn materialise_pair(a: &Self, b: &Self) -> PyResult<(Ragged<'a>, Ragged<'a>)> {
        let (a, b) = if a.rows >= PARALLEL_VALIDATION_ROWS {
            rayon::join(|| a.materialise(), || b.materialise())
        } else {
            (a.materialise(), b.materialise())
        };
        Ok((a?, b?))
    }
}

impl Ragged<'_> {
    fn rows(&self) -> usize {
        self.offsets.len() - 1
    }

    /// Offsets were validated as 0 <= offsets[i] <= offsets[i + 1] <= len(words).
    fn row(&self, i: usize) -> &[i64] {
        &self.words[self.offsets[i] as usize..self.offsets[i + 1] as usize]
    }

    fn sets(&self) -> Sets<'_> {
        Sets {
            offsets: &self.offsets,
            words: &self.words,
        }
    }
}

struct RaggedColumn<'py> {
    prefix: &'static str,
    offsets: Int64Column<'py>,
    words: Int64Column<'py>,
}

impl<'py> RaggedColumn<'py> {
    fn extract(
        prefix: &'static str,
        offsets: &Bound<'py, PyAny>,
        words: &Bound<'py, PyAny>,
    ) -> PyResult<Self> {
        let offsets = Int64Column::extract_non_null(offsets, &format!("{prefix}offsets"))?;
        if offsets.len() == 0 {
            return Err(PyValueError::new_err(format!(
                "{prefix}offsets: must hold n + 1 >= 1 offsets, got an empty array"
            )));
        }
        let words = Int64Column::extract_non_null(words, &format!("{prefix}words"))?;
        Ok(RaggedColumn {
            prefix,
            offsets,
            words,
        })
    }

    fn rows(&self) -> usize {
        self.offsets.len() - 1
    }

    fn view(&self) -> RaggedView<'_> {
        RaggedView {
            prefix: self.prefix,
            rows: self.rows(),
            offsets: self.offsets.view(),
            words: self.words.view(),
        }
    }
}

/// One batch size per ack set.
fn batch_sizes_arg<'py>(obj: &Bound<'py, PyAny>, rows: usize) -> PyResult<Int64Column<'py>> {
    let sizes = Int64Column::extract_non_null(obj, "batch_sizes")?;
    require_same_len(&[("the ack sets", rows), ("batch_sizes", sizes.len())])?;
    Ok(sizes)
}

/// Validated like the scalar `batch_size` argument; call it with the GIL released.
fn batch_sizes_values(sizes: &Int64View<'_>) -> PyResult<Vec<usize>> {
    sizes.values().iter().map(|&b| batch_size_arg(b)).collect()
}

#[pyfunction]
pub fn ackset_new(batch_size: i64) -> PyResult<Vec<i64>> {
    let size = allocating_batch_size_arg(batch_size)?;
    Ok((0..size.div_ceil(WORD_BITS))
        .map(|i| batch_mask(i, size))
        .collect())
}

fn merge_scalar(op: MergeOp, a: &Bound<'_, PyAny>, b: &Bound<'_, PyAny>) -> PyResult<Vec<i64>> {
    let (a, b) = (words_arg(a, "a")?, words_arg(b, "b")?);
    let mut out = Vec::with_capacity(op.len(a.len(), b.len()));
    let len = merge_row(op, &a, &b, out.spare_capacity_mut());
    // SAFETY: merge_row initialised the first `len` words.
    unsafe { out.set_len(len) };
    Ok(out)
}

#[pyfunction]
pub fn ackset_and(a: &Bound<'_, PyAny>, b: &Bound<'_, PyAny>) -> PyResult<Vec<i64>> {
    merge_scalar(MergeOp::And, a, b)
}

#[pyfunction]
pub fn ackset_or(a: &Bound<'_, PyAny>, b: &Bound<'_, PyAny>) -> PyResult<Vec<i64>> {
    merge_scalar(MergeOp::Or, a, b)
}

#[pyfunction]
pub fn ackset_andnot(a: &Bound<'_, PyAny>, b: &Bound<'_, PyAny>) -> PyResult<Vec<i64>> {
    merge_scalar(MergeOp::AndNot, a, b)
}

#[pyfunction]
#[pyo3(signature = (a, batch_size = None))]
pub fn ackset_is_fully_acked(a: &Bound<'_, PyAny>, batch_size: Option<i64>) -> PyResult<bool> {
    let size = batch_size.map(batch_size_arg).transpose()?;
    Ok(is_fully_acked(&words_arg(a, "a")?, size))
}

#[pyfunction]
pub fn ackset_conflicts(
    a: &Bound<'_, PyAny>,
    b: &Bound<'_, PyAny>,
    batch_size: i64,
) -> PyResult<bool> {
    let size = batch_size_arg(batch_size)?;
    Ok(conflicts(&words_arg(a, "a")?, &words_arg(b, "b")?, size))
}

#[pyfunction]
pub fn ackset_acked_indexes(a: &Bound<'_, PyAny>, batch_size: i64) -> PyResult<Vec<i64>> {
    let size = allocating_batch_size_arg(batch_size)?;
    let a = words_arg(a, "a")?;
    // Reserved up front, fallibly: a failed allocation aborts the process, a MemoryError does not.
    let acked = size - unacked_count(&a, size) as usize;
    let mut out = Vec::new();
    out.try_reserve_exact(acked).map_err(|_| {
        PyMemoryError::new_err(format!("{acked} acked indexes of a batch of {size}"))
    })?;
    out.extend(
        (0..size)
            .filter(|&i| word(&a, i / WORD_BITS) >> (i % WORD_BITS) & 1 == 0)
            .map(|i| i as i64),
    );
    Ok(out)
}

#[pyfunction]
pub fn ackset_unacked_count(a: &Bound<'_, PyAny>, batch_size: i64) -> PyResult<u64> {
    let size = batch_size_arg(batch_size)?;
    Ok(unacked_count(&words_arg(a, "a")?, size))
}

/// `(offsets, words)` of a ragged result.
type RaggedArrays<'py> = (Bound<'py, PyArray1<i64>>, Bound<'py, PyArray1<i64>>);

#[pyfunction]
pub fn ackset_merge_many<'py>(
    py: Python<'py>,
    op: &str,
    a_offsets: &Bound<'py, PyAny>,
    a_words: &Bound<'py, PyAny>,
    b_offsets: &Bound<'py, PyAny>,
    b_words: &Bound<'py, PyAny>,
) -> PyResult<RaggedArrays<'py>> {
    let op = MergeOp::parse(op)?;
    let a = RaggedColumn::extract("a_", a_offsets, a_words)?;
    let b = RaggedColumn::extract("b_", b_offsets, b_words)?;
    require_same_len(&[("a", a.rows()), ("b", b.rows())])?;
    let (a, b) = (a.view(), b.view());
    let (offsets, words) = py.detach(|| -> PyResult<_> {
        let (a, b) = RaggedView::materialise_pair(&a, &b)?;
        Ok(merge_many(op, a.sets(), b.sets()))
    })?;
    Ok((
        PyArray1::from_vec(py, offsets),
        PyArray1::from_vec(py, words),
    ))
}

#[pyfunction]
#[pyo3(signature = (offsets, words, batch_sizes = None))]
pub fn ackset_fully_acked_many<'py>(
    py: Python<'py>,
    offsets: &Bound<'py, PyAny>,
    words: &Bound<'py, PyAny>,
    batch_sizes: Option<&Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyArray1<bool>>> {
    let sets = RaggedColumn::extract("", offsets, words)?;
    let sizes = batch_sizes
        .map(|s| batch_sizes_arg(s, sets.rows()))
        .transpose()?;
    let (sets, sizes) = (sets.view(), sizes.as_ref().map(Int64Column::view));
    let acked = py.detach(|| -> PyResult<Vec<bool>> {
        let sets = sets.materialise()?;
        Ok(match sizes.as_ref().map(batch_sizes_values).transpose()? {
            None => (0..sets.rows())
                .map(|i| is_fully_acked(sets.row(i), None))
                .collect(),
            Some(sizes) => (0..sets.rows())
                .map(|i| is_fully_acked(sets.row(i), Some(sizes[i])))
                .collect(),
        })
    })?;
    Ok(PyArray1::from_vec(py, acked))
}

#[pyfunction]
pub fn ackset_conflicts_many<'py>(
    py: Python<'py>,
    a_offsets: &Bound<'py, PyAny>,
    a_words: &Bound<'py, PyAny>,
    b_offsets: &Bound<'py, PyAny>,
    b_words: &Bound<'py, PyAny>,
    batch_sizes: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyArray1<bool>>> {
    let a = RaggedColumn::extract("a_", a_offsets, a_words)?;
    let b = RaggedColumn::extract("b_", b_offsets, b_words)?;
    require_same_len(&[("a", a.rows()), ("b", b.rows())])?;
    let sizes = batch_sizes_arg(batch_sizes, a.rows())?;
    let (a, b, sizes) = (a.view(), b.view(), sizes.view());
    let hits = py.detach(|| -> PyResult<Vec<bool>> {
        let (a, b) = RaggedView::materialise_pair(&a, &b)?;
        let sizes = batch_sizes_values(&sizes)?;
        Ok((0..a.rows())
            .map(|i| conflicts(a.row(i), b.row(i), sizes[i]))
            .collect())
    })?;
    Ok(PyArray1::from_vec(py, hits))
}
