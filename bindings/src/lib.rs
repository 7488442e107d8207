//! Transaction-state kernels of pyengine, exposed to Python as `pyengine_kernels._kernels`.
//!
//! Pulsar semantics (positions, txn ids, the transaction buffer's max read position, batch
//! index ack sets) reimplemented for columnar reads: scalar types for bookkeeping, and bulk
//! kernels over NumPy / Arrow columns that run with the GIL released.

mod aborted;
mod aborted_probe;
mod ackset;
mod ackset_merge;
mod arrow_io;
mod blocks;
mod checksum;
mod ongoing;
mod position;
mod position_index;
mod txn_rows;
mod txnid;
mod visibility;

use pyo3::prelude::*;

#[pymodule]
fn _kernels(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_class::<position::Position>()?;
    m.add_class::<txnid::TxnId>()?;
    m.add_class::<ongoing::OngoingTxnMap>()?;
    m.add_class::<aborted::AbortedTxnSet>()?;
    m.add_function(wrap_pyfunction!(ackset::ackset_new, m)?)?;
    m.add_function(wrap_pyfunction!(ackset::ackset_and, m)?)?;
    m.add_function(wrap_pyfunction!(ackset::ackset_or, m)?)?;
    m.add_function(wrap_pyfunction!(ackset::ackset_andnot, m)?)?;
    m.add_function(wrap_pyfunction!(ackset::ackset_is_fully_acked, m)?)?;
    m.add_function(wrap_pyfunction!(ackset::ackset_conflicts, m)?)?;
    m.add_function(wrap_pyfunction!(ackset::ackset_acked_indexes, m)?)?;
    m.add_function(wrap_pyfunction!(ackset::ackset_unacked_count, m)?)?;
    m.add_function(wrap_pyfunction!(ackset::ackset_merge_many, m)?)?;
    m.add_function(wrap_pyfunction!(ackset::ackset_fully_acked_many, m)?)?;
    m.add_function(wrap_pyfunction!(ackset::ackset_conflicts_many, m)?)?;
    m.add_function(wrap_pyfunction!(visibility::visibility_mask, m)?)?;
    m.add_function(wrap_pyfunction!(checksum::crc32c, m)?)?;
    m.add("_crc32c_capi", checksum::capsule(m.py())?)?;
    Ok(())
}
