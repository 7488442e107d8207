//! Membership probes of an aborted set for bulk kernels.
//!
//! A roaring lookup costs tens of nanoseconds (a map lookup for the coordinator, then a
//! search among containers); with one probe per run of rows of a txn, it dominated the
//! visibility filter. Bulk calls therefore probe a dense bit array per coordinator over the
//! span of its aborted sequence numbers when that span is small enough, which it stays while
//! aborts are trimmed with their ledgers: sequence numbers grow with time, so the live ones
//! form a window. Coordinators beyond the limits keep their roaring bitmap.

use std::collections::BTreeMap;

use roaring::RoaringTreemap;

/// Largest dense array of one coordinator: 8 MiB, a span of 64M sequence numbers.
const MAX_COORDINATOR_BITS: u64 = 8 << 23;
/// Largest total of the dense arrays of a set: 64 MiB. Smaller spans get theirs first.
const MAX_TOTAL_BITS: u64 = 64 << 23;
/// Coordinator ids below this are found by indexing an array (Pulsar numbers them from 0);
/// larger ones by searching the maps.
const DIRECT_COORDINATORS: usize = 1024;

/// One bit per sequence number in `[min, min + 64 * words.len())`.
pub struct DenseBits {
    min: u64,
    words: Box<[u64]>,
}

impl DenseBits {
    fn new(bitmap: &RoaringTreemap, min: u64, max: u64) -> Self {
        let mut words = vec![0u64; ((max - min) / 64 + 1) as usize].into_boxed_slice();
        for least in bitmap {
            let i = least - min;
            words[(i / 64) as usize] |= 1 << (i % 64);
        }
        DenseBits { min, words }
    }

    #[inline(always)]
    fn contains(&self, least: u64) -> bool {
        let i = least.wrapping_sub(self.min);
        self.words
            .get((i / 64) as usize)
            .is_some_and(|word| (word >> (i % 64)) & 1 == 1)
    }
}

/// The dense arrays of an aborted set's coordinators, by coordinator id.
pub struct DenseTables(BTreeMap<i64, DenseBits>);

impl DenseTables {
    pub fn new(bitmaps: &BTreeMap<i64, RoaringTreemap>) -> Self {
        let mut spans: Vec<(u64, i64, u64, u64)> = bitmaps
            .iter()
            .filter_map(|(&most, bitmap)| {
                let (min, max) = (bitmap.min()?, bitmap.max()?);
                Some(((max - min) / 64 * 64 + 64, most, min, max))
            })
            .filter(|&(bits, ..)| bits <= MAX_COORDINATOR_BITS)
            .collect();
        spans.sort_unstable();
        let mut total = 0;
        let mut tables = BTreeMap::new();
        for (bits, most, min, max) in spans {
            total += bits;
            if total > MAX_TOTAL_BITS {
                break;
            }
            tables.insert(most, DenseBits::new(&bitmaps[&most], min, max));
        }
        DenseTables(tables)
    }
}

/// Where a coordinator's aborted sequence numbers are looked up.
#[derive(Clone, Copy)]
enum Members<'a> {
    None,
    Dense(&'a DenseBits),
    Roaring(&'a RoaringTreemap),
}

impl Members<'_> {
    #[inline(always)]
    fn contains(self, least: u64) -> bool {
        match self {
            Members::None => false,
            Members::Dense(bits) => bits.contains(least),
            Members::Roaring(bitmap) => bitmap.contains(least),
        }
    }
}

/// Everything a bulk call probes, resolved once per call.
pub struct Probe<'a> {
    bitmaps: &'a BTreeMap<i64, RoaringTreemap>,
    dense: &'a DenseTables,
    /// Entry `i`: coordinator `i`.
    direct: Vec<Members<'a>>,
}

impl<'a> Probe<'a> {
    pub fn new(bitmaps: &'a BTreeMap<i64, RoaringTreemap>, dense: &'a DenseTables) -> Self {
        let mut probe = Probe {
            bitmaps,
            dense,
            direct: Vec::new(),
        };
        let direct = bitmaps
            .range(..DIRECT_COORDINATORS as i64)
            .next_back()
            .map_or(0, |(&most, _)| most as usize + 1);
        probe.direct = (0..direct).map(|most| probe.resolve(most as i64)).collect();
        probe
    }

    fn resolve(&self, most: i64) -> Members<'a> {
        match (self.dense.0.get(&most), self.bitmaps.get(&most)) {
            (Some(bits), _) => Members::Dense(bits),
            (None, Some(bitmap)) => Members::Roaring(bitmap),
            (None, None) => Members::None,
        }
    }

    #[inline(always)]
    fn members(&self, most: i64) -> Members<'a> {
        match self.direct.get(most as usize) {
            Some(&members) => members,
            None => self.resolve(most),
        }
    }

    /// A probe cache for one task.
    pub fn lookup(&self) -> Lookup<'_, 'a> {
        // (-1, -1) is not transactional, so "not aborted" is the right cached answer for it.
        Lookup {
            probe: self,
            last: (-1, -1),
            last_hit: false,
        }
    }
}

/// A membership probe that remembers its last answer: the rows of one transaction are
/// adjacent in a topic, so most probes repeat the previous one.
pub struct Lookup<'p, 'a> {
    probe: &'p Probe<'a>,
    last: (i64, i64),
    last_hit: bool,
}

impl Lookup<'_, '_> {
    /// Negative ids mean "not transactional" and are never aborted.
    #[inline(always)]
    pub fn contains(&mut self, most: i64, least: i64) -> bool {
        if (most, least) != self.last {
            self.last = (most, least);
            self.last_hit =
                least >= 0 && most >= 0 && self.probe.members(most).contains(least as u64);
        }
        self.last_hit
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bitmaps(coordinators: &[(i64, &[u64])]) -> BTreeMap<i64, RoaringTreemap> {
        coordinators
            .iter()
            .map(|&(most, members)| (most, members.iter().copied().collect()))
            .collect()
    }

    #[test]
    fn dense_only_within_the_span_limit() {
        let limit = MAX_COORDINATOR_BITS - 1;
        let sets = bitmaps(&[
            (0, &[7, 9, 1000]),
            (1, &[5, 5 + limit]),
            (2, &[5, 6 + limit]),
        ]);
        let dense = DenseTables::new(&sets);
        assert_eq!(dense.0.keys().copied().collect::<Vec<_>>(), [0, 1]);
        let probe = Probe::new(&sets, &dense);
        for (most, least, member) in [(0, 7, true), (0, 8, false), (0, 6, false), (0, 1000, true)]
            .into_iter()
            .chain([(0, 1001, false), (0, 1 << 40, false), (1, 5 + limit, true)])
            .chain([(1, 4 + limit, false), (2, 6 + limit, true), (3, 7, false)])
        {
            assert_eq!(
                probe.members(most).contains(least),
                member,
                "{most} {least}"
            );
        }
    }

    #[test]
    fn smaller_spans_first_within_the_total_limit() {
        let wide: &[u64] = &[0, MAX_COORDINATOR_BITS - 1];
        let mut coordinators: Vec<(i64, &[u64])> = (0..9).map(|most| (most, wide)).collect();
        coordinators.push((100, &[3, 4]));
        let dense = DenseTables::new(&bitmaps(&coordinators));
        // The narrow coordinator leaves room for 7 of the widest ones, not 8.
        assert!(dense.0.contains_key(&100));
        assert_eq!(dense.0.len(), 8);
        assert_eq!(MAX_TOTAL_BITS / MAX_COORDINATOR_BITS, 8);
    }

    #[test]
    fn large_coordinator_ids_are_found_beyond_the_direct_array() {
        let sets = bitmaps(&[(1, &[1]), (5000, &[2]), (i64::MAX, &[3, u64::MAX >> 1])]);
        let dense = DenseTables::new(&sets);
        let probe = Probe::new(&sets, &dense);
        assert_eq!(probe.direct.len(), 2);
        let mut lookup = probe.lookup();
        assert!(lookup.contains(1, 1) && lookup.contains(5000, 2));
        assert!(lookup.contains(i64::MAX, 3) && lookup.contains(i64::MAX, i64::MAX));
        assert!(!lookup.contains(5000, 1) && !lookup.contains(4999, 2) && !lookup.contains(-1, 1));
    }
}
