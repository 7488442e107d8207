//! Boolean row kernels computed 64 rows (one word of bits) at a time over the rayon pool.
//!
//! Blocks are spread over the pool in tasks of `TASK_BLOCKS` words, each with its own state
//! (such as a probe cache); rayon measurably helps even on two cores, as the kernels are not
//! purely memory-bound. On x86-64 CPUs with AVX2 the tasks run a copy of the kernel compiled
//! for it: the kernels compare 64-bit ints, which baseline x86-64 (SSE2) cannot do in vector
//! registers, so this halves their time. For that, everything a block computes must be
//! inlined into the task (`#[inline(always)]`).

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
    let build = Build::detect();
    words
        .par_chunks_mut(TASK_BLOCKS)
        .enumerate()
        .for_each(|(task, out)| match build {
            Build::Portable => fill_words(blocks, task * TASK_BLOCKS, out),
            // SAFETY: `detect` chose this build, so the CPU has its features.
            #[cfg(target_arch = "x86_64")]
            Build::Avx2 => unsafe { fill_words_avx2(blocks, task * TASK_BLOCKS, out) },
        });
    words
}

/// One byte per row, for NumPy.
pub fn bytes(blocks: &impl Blocks) -> Vec<bool> {
    let mut bytes = vec![false; blocks.rows()];
    let build = Build::detect();
    bytes
        .par_chunks_mut(TASK_BLOCKS * BLOCK_ROWS)
        .enumerate()
        .for_each(|(task, out)| match build {
            Build::Portable => fill_bytes(blocks, task * TASK_BLOCKS, out),
            // SAFETY: `detect` chose this build, so the CPU has its features.
            #[cfg(target_arch = "x86_64")]
            Build::Avx2 => unsafe { fill_bytes_avx2(blocks, task * TASK_BLOCKS, out) },
        });
    bytes
}

/// Which copy of the task loops to run.
#[derive(Clone, Copy)]
enum Build {
    Portable,
    /// Compiled with `target_feature(enable = "avx2,bmi1,bmi2")`.
    #[cfg(target_arch = "x86_64")]
    Avx2,
}

impl Build {
    fn detect() -> Self {
        #[cfg(target_arch = "x86_64")]
        if is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("bmi1")
            && is_x86_feature_detected!("bmi2")
        {
            return Build::Avx2;
        }
        Build::Portable
    }
}

#[inline(always)]
fn fill_words<B: Blocks>(blocks: &B, first: usize, out: &mut [u64]) {
    let mut state = blocks.state();
    for (i, word) in out.iter_mut().enumerate() {
        *word = blocks.block(first + i, &mut state);
    }
}

#[inline(always)]
fn fill_bytes<B: Blocks>(blocks: &B, first: usize, out: &mut [bool]) {
    let mut state = blocks.state();
    // SAFETY: bool has the layout of u8, and only 0 and 1 are written.
    let out = unsafe { &mut *(out as *mut [bool] as *mut [u8]) };
    for (i, rows) in out.chunks_mut(BLOCK_ROWS).enumerate() {
        let word = blocks.block(first + i, &mut state);
        for (j, rows) in rows.chunks_mut(8).enumerate() {
            let ones = spread((word >> (8 * j)) as u8).to_le_bytes();
            rows.copy_from_slice(&ones[..rows.len()]);
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,bmi1,bmi2")]
fn fill_words_avx2<B: Blocks>(blocks: &B, first: usize, out: &mut [u64]) {
    fill_words(blocks, first, out)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,bmi1,bmi2")]
fn fill_bytes_avx2<B: Blocks>(blocks: &B, first: usize, out: &mut [bool]) {
    fill_bytes(blocks, first, out)
}

/// Bit i of `bits` as byte i (0 or 1) of the result.
#[inline(always)]
fn spread(bits: u8) -> u64 {
    const HIGH: u64 = 0x8080_8080_8080_8080;
    // Byte i keeps only bit i of `bits`, in place...
    let picked = (bits as u64).wrapping_mul(0x0101_0101_0101_0101) & 0x8040_2010_0804_0201;
    // ...then any set bit of a byte is carried to its top bit (no carry leaves a byte).
    (((picked & !HIGH).wrapping_add(!HIGH) | picked) & HIGH) >> 7
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `.0` rows; row i is set iff bit i % 64 of a pseudo-random word per block is.
    struct Pattern(usize);

    fn pattern_word(k: usize) -> u64 {
        (k as u64 + 1)
            .wrapping_mul(0x9e37_79b9_7f4a_7c15)
            .rotate_left(k as u32 % 64)
    }

    impl Blocks for Pattern {
        type State<'s> = ();

        fn rows(&self) -> usize {
            self.0
        }

        fn state(&self) {}

        #[inline(always)]
        fn block(&self, k: usize, _: &mut ()) -> u64 {
            let rows = (self.0 - k * BLOCK_ROWS).min(BLOCK_ROWS);
            pattern_word(k) & (u64::MAX >> (BLOCK_ROWS - rows))
        }
    }

    fn expected(rows: usize) -> Vec<bool> {
        (0..rows)
            .map(|i| (pattern_word(i / BLOCK_ROWS) >> (i % BLOCK_ROWS)) & 1 == 1)
            .collect()
    }

    #[test]
    fn both_builds_of_the_kernels_agree() {
        for rows in [0, 1, 63, 64, 65, 1000, TASK_BLOCKS * BLOCK_ROWS + 7] {
            let pattern = Pattern(rows);
            let want = expected(rows);
            let mut portable = vec![true; rows];
            fill_bytes(&pattern, 0, &mut portable);
            assert_eq!(portable, want, "{rows} rows");
            let mut words = vec![0; rows.div_ceil(BLOCK_ROWS)];
            fill_words(&pattern, 0, &mut words);
            #[cfg(target_arch = "x86_64")]
            if matches!(Build::detect(), Build::Avx2) {
                let mut avx2_bytes = vec![true; rows];
                // SAFETY: the CPU has AVX2.
                unsafe { fill_bytes_avx2(&pattern, 0, &mut avx2_bytes) };
                assert_eq!(avx2_bytes, want, "{rows} rows");
                let mut avx2_words = vec![0; words.len()];
                // SAFETY: the CPU has AVX2.
                unsafe { fill_words_avx2(&pattern, 0, &mut avx2_words) };
                assert_eq!(avx2_words, words);
            }
            assert_eq!(super::bytes(&pattern), want);
            let bits: Vec<bool> = (0..rows)
                .map(|i| (words[i / BLOCK_ROWS] >> (i % BLOCK_ROWS)) & 1 == 1)
                .collect();
            assert_eq!(bits, want);
        }
    }

    #[test]
    fn spread_puts_bit_i_in_byte_i() {
        for bits in 0..=u8::MAX {
            let bytes = spread(bits).to_le_bytes();
            for (i, &byte) in bytes.iter().enumerate() {
                assert_eq!(byte, (bits >> i) & 1, "{bits:#010b}");
            }
        }
    }
}
