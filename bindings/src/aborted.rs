//! Aborted transactions of a topic.
//!
//! Membership lives in one 64-bit roaring bitmap of sequence numbers (least bits) per
//! coordinator (most bits): compact, serialisable, and the source of the dense arrays bulk
//! calls probe (see `aborted_probe`). The abort marker position of every txn is kept beside
//! it so aborts can be dropped together with the ledger that holds their marker, as Pulsar's
//! transaction buffer does.

use std::collections::BTreeMap;
use std::sync::OnceLock;

use arrow_buffer::NullBuffer;
use numpy::PyArray1;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyType};
use roaring::RoaringTreemap;

use crate::aborted_probe::{DenseTables, Probe};
use crate::arrow_io::{require_same_len, BitWords, Int64Column};
use crate::blocks;
use crate::position::Position;
use crate::position_index::TxnPositionIndex;
use crate::txn_rows::TxnRows;
use crate::txnid::TxnId;

const MAGIC: &[u8; 4] = b"PEAB";
const FORMAT_VERSION: u8 = 1;
/// Bytes of one serialised marker position: ledger id and entry id, i64 little-endian.
const MARKER_BYTES: usize = 16;

#[pyclass(module = "pyengine_kernels", eq)]
#[derive(Default)]
pub struct AbortedTxnSet {
    /// Coordinator id -> aborted sequence numbers. Never holds an empty bitmap.
    bitmaps: BTreeMap<i64, RoaringTreemap>,
    markers: TxnPositionIndex,
    /// Built by the first bulk call after a change, reset by every change. Bulk calls hold a
    /// shared borrow of the set while they run, so changing it meanwhile raises RuntimeError
    /// (PyO3's borrow check) rather than racing with the probes.
    dense: OnceLock<DenseTables>,
}

/// The bitmaps are derived from the markers, so the markers alone decide equality.
impl PartialEq for AbortedTxnSet {
    fn eq(&self, other: &Self) -> bool {
        self.markers == other.markers
    }
}

impl AbortedTxnSet {
    fn insert(&mut self, txn: TxnId, marker: Position) -> bool {
        if !self.markers.insert(txn, marker) {
            return false;
        }
        self.dense.take();
        self.bitmaps
            .entry(txn.most_bits)
            .or_default()
            .insert(txn.least_bits as u64);
        true
    }

    /// Drops `txn` from its coordinator's bitmap; the caller drops its marker.
    fn forget(&mut self, txn: TxnId) {
        self.dense.take();
        if let Some(bitmap) = self.bitmaps.get_mut(&txn.most_bits) {
            bitmap.remove(txn.least_bits as u64);
            if bitmap.is_empty() {
                self.bitmaps.remove(&txn.most_bits);
            }
        }
    }

    pub fn is_empty(&self) -> bool {
        self.markers.is_empty()
    }

    /// The membership structure of bulk calls, building the dense arrays if needed.
    pub fn probe(&self) -> Probe<'_> {
        let dense = self.dense.get_or_init(|| DenseTables::new(&self.bitmaps));
        Probe::new(&self.bitmaps, dense)
    }

    /// Format version 1 (all integers little-endian):
    ///
    /// ```text
    /// magic "PEAB" | version u8 = 1 | coordinator count u64
    /// per coordinator, by increasing id:
    ///   most bits i64 | bitmap length u64 | bitmap (roaring 64-bit portable format)
    ///   one marker position (ledger id i64, entry id i64) per bitmap member, by increasing
    ///   least bits
    /// ```
    fn serialize(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(
            MAGIC.len()
                + 9
                + self.markers.len() * MARKER_BYTES
                + self
                    .bitmaps
                    .values()
                    .map(|b| 16 + b.serialized_size())
                    .sum::<usize>(),
        );
        out.extend_from_slice(MAGIC);
        out.push(FORMAT_VERSION);
        out.extend_from_slice(&(self.bitmaps.len() as u64).to_le_bytes());
        for (&most, bitmap) in &self.bitmaps {
            out.extend_from_slice(&most.to_le_bytes());
            out.extend_from_slice(&(bitmap.serialized_size() as u64).to_le_bytes());
            bitmap
                .serialize_into(&mut out)
                .expect("writing to a Vec cannot fail");
            for least in bitmap {
                let txn = TxnId {
                    most_bits: most,
                    least_bits: least as i64,
                };
                let marker = self.markers.get(txn).expect("bitmaps mirror the markers");
                out.extend_from_slice(&marker.ledger_id.to_le_bytes());
                out.extend_from_slice(&marker.entry_id.to_le_bytes());
            }
        }
        out
    }

    /// Parses [`Self::serialize`]'s format, rejecting anything it would not produce.
    fn deserialize(bytes: &[u8]) -> Result<Self, String> {
        let mut input = Reader(bytes);
        if input.take(MAGIC.len())? != MAGIC {
            return Err("not an AbortedTxnSet serialisation (bad magic)".into());
        }
        let version = input.take(1)?[0];
        if version != FORMAT_VERSION {
            return Err(format!(
                "unsupported AbortedTxnSet format version {version}"
            ));
        }
        let coordinators = input.u64()?;
        let mut set = AbortedTxnSet::default();
        let mut previous_most = -1;
        for _ in 0..coordinators {
            let most = input.i64()?;
            if most <= previous_most {
                return Err(format!("coordinator id {most} is negative or out of order"));
            }
            previous_most = most;
            let bitmap_len = usize::try_from(input.u64()?).map_err(|_| "bitmap too large")?;
            let bitmap_bytes = input.take(bitmap_len)?;
            let bitmap = RoaringTreemap::deserialize_from(bitmap_bytes)
                .map_err(|e| format!("coordinator {most}: corrupt bitmap: {e}"))?;
            // Only the canonical encoding is accepted: the roaring reader silently lets
            // duplicate high keys overwrite each other and ignores container offsets.
            let mut canonical = Vec::with_capacity(bitmap_len);
            bitmap
                .serialize_into(&mut canonical)
                .expect("writing to a Vec cannot fail");
            // An empty 32-bit bitmap serialises back the same, but no set writes one.
            if canonical != bitmap_bytes || bitmap.bitmaps().any(|(_, b)| b.is_empty()) {
                return Err(format!("coordinator {most}: non-canonical bitmap encoding"));
            }
            match bitmap.max() {
                None => return Err(format!("coordinator {most}: empty bitmap")),
                Some(max) if max > i64::MAX as u64 => {
                    return Err(format!(
                        "coordinator {most}: sequence {max} exceeds 2**63-1"
                    ))
                }
                Some(_) => {}
            }
            let marker_bytes = usize::try_from(bitmap.len())
                .ok()
                .and_then(|n| n.checked_mul(MARKER_BYTES))
                .ok_or("too many markers")?;
            let mut markers = Reader(input.take(marker_bytes)?);
            for least in &bitmap {
                let (ledger_id, entry_id) = (markers.i64()?, markers.i64()?);
                if ledger_id < 0 || entry_id < 0 {
                    return Err(format!("invalid marker position {ledger_id}:{entry_id}"));
                }
                let txn = TxnId {
                    most_bits: most,
                    least_bits: least as i64,
                };
                set.markers.insert(
                    txn,
                    Position {
                        ledger_id,
                        entry_id,
                    },
                );
            }
            set.bitmaps.insert(most, bitmap);
        }
        if !input.0.is_empty() {
            return Err(format!("{} trailing bytes", input.0.len()));
        }
        Ok(set)
    }
}

/// Bounds-checked little-endian reads over a byte slice.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        if n > self.0.len() {
            return Err(format!(
                "truncated input: needed {n} more bytes, {} left",
                self.0.len()
            ));
        }
        let (head, tail) = self.0.split_at(n);
        self.0 = tail;
        Ok(head)
    }

    fn u64(&mut self) -> Result<u64, String> {
        Ok(u64::from_le_bytes(
            self.take(8)?.try_into().expect("took 8 bytes"),
        ))
    }

    fn i64(&mut self) -> Result<i64, String> {
        Ok(i64::from_le_bytes(
            self.take(8)?.try_into().expect("took 8 bytes"),
        ))
    }
}

#[pymethods]
impl AbortedTxnSet {
    #[new]
    fn new() -> Self {
        Self::default()
    }

    /// Records an abort; a txn already recorded keeps its first marker position.
    fn add(&mut self, txn: TxnId, marker_position: Position) -> PyResult<bool> {
        let marker = marker_position.require_entry("an abort marker position")?;
        Ok(self.insert(txn, marker))
    }

    fn remove(&mut self, txn: TxnId) -> bool {
        let known = self.markers.remove(txn).is_some();
        if known {
            self.forget(txn);
        }
        known
    }

    fn __contains__(&self, txn: TxnId) -> bool {
        self.markers.contains(txn)
    }

    /// Negative ids are "not transactional", hence never aborted.
    fn contains(&self, most: i64, least: i64) -> bool {
        most >= 0
            && least >= 0
            && self
                .bitmaps
                .get(&most)
                .is_some_and(|b| b.contains(least as u64))
    }

    /// Negative or null ids give False. Probes once per run of equal ids, in parallel.
    fn contains_many<'py>(
        &self,
        py: Python<'py>,
        most: &Bound<'py, PyAny>,
        least: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyArray1<bool>>> {
        let (most, least) = (
            Int64Column::extract(most, "most")?,
            Int64Column::extract(least, "least")?,
        );
        require_same_len(&[("most", most.len()), ("least", least.len())])?;
        let (most, least) = (most.view(), least.view());
        let hits = py.detach(|| {
            let (most_values, least_values) = (most.values(), least.values());
            let probe = self.probe();
            blocks::bytes(&TxnRows {
                most: &most_values,
                least: &least_values,
                valid: NullBuffer::union(most.nulls, least.nulls).map(|v| BitWords::new(v.inner())),
                probe: &probe,
            })
        });
        Ok(PyArray1::from_vec(py, hits))
    }

    /// Drops every abort whose marker lies strictly before `position` (its ledger is gone).
    fn trim_before(&mut self, py: Python<'_>, position: Position) -> usize {
        py.detach(|| {
            let drained = self.markers.drain_before(position);
            for &(_, txn) in &drained {
                self.forget(txn);
            }
            drained.len()
        })
    }

    /// A new set of the aborts whose marker lies at or after `position` (the part of this
    /// one a trim before `position` would keep).
    fn since(&self, py: Python<'_>, position: Position) -> Self {
        py.detach(|| {
            let mut kept = Self::default();
            for (marker, txn) in self.markers.iter_from(position) {
                kept.insert(txn, marker);
            }
            kept
        })
    }

    /// Adds every abort of `other` (a txn already recorded keeps its first marker); how many
    /// were new.
    fn update(&mut self, py: Python<'_>, other: PyRef<'_, Self>) -> usize {
        let other: &Self = &other;
        py.detach(|| {
            other
                .markers
                .iter()
                .filter(|&(marker, txn)| self.insert(txn, marker))
                .count()
        })
    }

    /// The highest abort marker position (None when empty).
    fn last_marker_position(&self) -> Option<Position> {
        self.markers.highest().map(|(position, _)| position)
    }

    fn __len__(&self) -> usize {
        self.markers.len()
    }

    /// Ordered by marker position.
    fn items(&self) -> Vec<(TxnId, Position)> {
        self.markers
            .iter()
            .map(|(position, txn)| (txn, position))
            .collect()
    }

    fn coordinator_ids(&self) -> Vec<i64> {
        self.bitmaps.keys().copied().collect()
    }

    /// The coordinator's bitmap in the roaring 64-bit portable format (empty if unknown).
    fn bitmap_bytes<'py>(&self, py: Python<'py>, most: i64) -> PyResult<Bound<'py, PyBytes>> {
        if most < 0 {
            return Err(PyValueError::new_err(format!(
                "coordinator id must be >= 0, got {most}"
            )));
        }
        let empty = RoaringTreemap::new();
        let bitmap = self.bitmaps.get(&most).unwrap_or(&empty);
        let mut out = Vec::with_capacity(bitmap.serialized_size());
        bitmap
            .serialize_into(&mut out)
            .expect("writing to a Vec cannot fail");
        Ok(PyBytes::new(py, &out))
    }

    fn to_bytes<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        let bytes = py.detach(|| self.serialize());
        PyBytes::new(py, &bytes)
    }

    #[classmethod]
    fn from_bytes(_cls: &Bound<'_, PyType>, py: Python<'_>, data: &[u8]) -> PyResult<Self> {
        py.detach(|| Self::deserialize(data))
            .map_err(|e| PyValueError::new_err(format!("AbortedTxnSet.from_bytes: {e}")))
    }

    /// Pickles (e.g. Spark broadcasts) through the compact binary format.
    fn __reduce__<'py>(
        slf: &Bound<'py, Self>,
    ) -> PyResult<(Bound<'py, PyAny>, (Bound<'py, PyBytes>,))> {
        let from_bytes = slf.get_type().getattr("from_bytes")?;
        Ok((from_bytes, (slf.borrow().to_bytes(slf.py()),)))
    }

    fn __repr__(&self) -> String {
        format!(
            "AbortedTxnSet(<{} aborted across {} coordinators>)",
            self.markers.len(),
            self.bitmaps.len()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_32_bit_bitmap_is_not_canonical() {
        let mut bitmaps = Vec::new();
        bitmaps.extend_from_slice(&2u64.to_le_bytes());
        for (high, lows) in [(0u32, vec![]), (1, vec![5u32])] {
            bitmaps.extend_from_slice(&high.to_le_bytes());
            let inner: roaring::RoaringBitmap = lows.into_iter().collect();
            inner.serialize_into(&mut bitmaps).unwrap();
        }
        let mut data = b"PEAB\x01".to_vec();
        data.extend_from_slice(&1u64.to_le_bytes());
        data.extend_from_slice(&3i64.to_le_bytes());
        data.extend_from_slice(&(bitmaps.len() as u64).to_le_bytes());
        data.extend_from_slice(&bitmaps);
        data.extend_from_slice(&1i64.to_le_bytes());
        data.extend_from_slice(&2i64.to_le_bytes());
        let error = AbortedTxnSet::deserialize(&data).err().expect("refused");
        assert!(error.contains("non-canonical"), "{error}");
    }
}
