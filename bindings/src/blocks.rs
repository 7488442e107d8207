//! Boolean row kernels computed 64 rows (one word of bits) at a time over the rayon pool.
//!
//! Blocks are spread over the pool in tasks of `TASK_BLOCKS` words, each with its own state
//! (such as a probe cache); rayon measurably helps even on two cores, as the kernels are not
//! purely memory-bound.

use rayon::prelude::*;

pub const BLOCK_ROWS: usize = 64;
/// 64K rows per task: large enough to amortise the task overhead and the cold state each task
/// starts with, small enough to balance the load across cores.
const TASK_BLOCKS: usize = 1024;

pub trait Blocks: Sync {
    /// What a task carries from one block to the next.
    type State<'s>
    where
        Self: 's;

    fn rows(&self) -> usize;

    fn state(&self) -> Self::State<'_>;

    /// Bit j is row `64 * k + j`; bits past the last row must be zero.
    fn block(&self, k: usize, state: &mut Self::State<'_>) -> u64;
}

/// Bit-packed result, for Arrow.
pub fn words(blocks: &impl Blocks) -> Vec<u64> {
    let mut words = vec![0u64; blocks.rows().div_ceil(BLOCK_ROWS)];
    words
        .par_chunks_mut(TASK_BLOCKS)
        .enumerate()
        .for_each(|(task, out)| {
            let mut state = blocks.state();
            for (i, word) in out.iter_mut().enumerate() {
                *word = blocks.block(task * TASK_BLOCKS + i, &mut state);
            }
        });
    words
}

/// One byte per row, for NumPy.
pub fn bytes(blocks: &impl Blocks) -> Vec<bool> {
    let mut bytes = vec![false; blocks.rows()];
    bytes
        .par_chunks_mut(TASK_BLOCKS * BLOCK_ROWS)
        .enumerate()
        .for_each(|(task, out)| {
            let mut state = blocks.state();
            for (i, rows) in out.chunks_mut(BLOCK_ROWS).enumerate() {
                let word = blocks.block(task * TASK_BLOCKS + i, &mut state);
                for (j, row) in rows.iter_mut().enumerate() {
                    *row = (word >> j) & 1 == 1;
                }
            }
        });
    bytes
}
