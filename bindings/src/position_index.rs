//! Transactions keyed by id and ordered by a position, shared by the ongoing map (first
//! position of each txn) and the aborted set (abort marker position of each txn).

use std::collections::{BTreeSet, HashMap};

use crate::position::Position;
use crate::txnid::TxnId;

/// Sorts before every txn id: `(position, TXN_MIN)` is the smallest key at `position`.
const TXN_MIN: TxnId = TxnId {
    most_bits: i64::MIN,
    least_bits: i64::MIN,
};

/// O(1) lookup by txn plus O(log n) access to the lowest positions.
///
/// Ties between equal positions are broken by txn id, so iteration order is total.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct TxnPositionIndex {
    by_txn: HashMap<TxnId, Position>,
    by_position: BTreeSet<(Position, TxnId)>,
}

impl TxnPositionIndex {
    /// Records `position` for `txn` unless the txn is already known; the first position wins.
    pub fn insert(&mut self, txn: TxnId, position: Position) -> bool {
        if self.by_txn.contains_key(&txn) {
            return false;
        }
        self.by_txn.insert(txn, position);
        self.by_position.insert((position, txn));
        true
    }

    pub fn remove(&mut self, txn: TxnId) -> Option<Position> {
        let position = self.by_txn.remove(&txn)?;
        self.by_position.remove(&(position, txn));
        Some(position)
    }

    pub fn get(&self, txn: TxnId) -> Option<Position> {
        self.by_txn.get(&txn).copied()
    }

    pub fn contains(&self, txn: TxnId) -> bool {
        self.by_txn.contains_key(&txn)
    }

    pub fn lowest(&self) -> Option<(Position, TxnId)> {
        self.by_position.first().copied()
    }

    /// All entries, ordered by position then txn.
    pub fn iter(&self) -> impl Iterator<Item = (Position, TxnId)> + '_ {
        self.by_position.iter().copied()
    }

    /// Entries at or above `bound`, ordered by position then txn.
    pub fn iter_from(&self, bound: Position) -> impl Iterator<Item = (Position, TxnId)> + '_ {
        self.by_position.range((bound, TXN_MIN)..).copied()
    }

    pub fn highest(&self) -> Option<(Position, TxnId)> {
        self.by_position.last().copied()
    }

    /// Removes and returns every entry whose position is strictly below `bound`.
    pub fn drain_before(&mut self, bound: Position) -> Vec<(Position, TxnId)> {
        // Everything at or above the smallest possible key at `bound` stays.
        let kept = self.by_position.split_off(&(bound, TXN_MIN));
        let drained = std::mem::replace(&mut self.by_position, kept);
        for (_, txn) in &drained {
            self.by_txn.remove(txn);
        }
        drained.into_iter().collect()
    }

    pub fn len(&self) -> usize {
        self.by_txn.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_txn.is_empty()
    }

    pub fn clear(&mut self) {
        self.by_txn.clear();
        self.by_position.clear();
    }
}
