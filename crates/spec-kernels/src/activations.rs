//! Rows of `x` rounded to int8, for the formats that multiply integer weights by integer
//! activations ([`crate::WeightFormat::Q8_0A8`], [`crate::WeightFormat::Q4A8`]).

use crate::pack::{BLOCK, GROUP};

/// `m` rows of `padded_cols` inputs as blocks of 32 int8 quants, each block with its step
/// (`max |x| / 127` over the block, or over a run of blocks that share it): input `x` becomes
/// `step · q`.
#[derive(Debug, Clone)]
pub(crate) struct QuantizedRows {
    /// Block `b` of row `i` at `i · blocks + b`.
    pub(crate) quants: Vec<[i8; BLOCK]>,
    /// Each block's step; NaN for a block holding a value that is not finite, so that the
    /// product is NaN as the f32 product would be.
    pub(crate) steps: Vec<f32>,
    /// `step · Σ q` of each block (the sum a Q4 block's minimum multiplies): row `i`'s at
    /// `i · sum_stride + b`, each row followed by zeros up to `sum_stride`, a multiple of 8, so
    /// that a row's sums are read in whole vectors of 8.
    pub(crate) sums: Vec<f32>,
    pub(crate) sum_stride: usize,
    /// With runs of 8 blocks (a superblock): per run, the integer sums of its 16 halves of a
    /// block, the first halves' (blocks 0..8) then the second halves', as a Q6_K superblock's
    /// scales are kept; empty otherwise.
    pub(crate) half_sums: Vec<[i16; 16]>,
    /// Unless [`Interleave::No`], the quants in [`crate::pack::Storage::Q8_0Groups`]' order (each
    /// row's whole groups of 8 blocks as units holding 4 quants of each block; the blocks after
    /// them as they are), for the tiles that multiply that layout; empty otherwise.
    pub(crate) grouped: Vec<[i8; BLOCK]>,
    /// With [`Interleave::BiasedGroups`], per row and whole group of 8 blocks, `−128 · Σ q` of
    /// each block:
    /// where the stored quants are `q_w + 128`, the integer sums start from these.
    pub(crate) group_offsets: Vec<[i32; GROUP]>,
}

/// What a product reads of the rounded rows besides the blocks in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Interleave {
    /// Nothing more (per-block layouts, the portable loop).
    No,
    /// [`QuantizedRows::grouped`] (Q4_K and Q6_K superblocks).
    Groups,
    /// [`QuantizedRows::grouped`] and [`QuantizedRows::group_offsets`] (`Q8_0Groups`, whose
    /// quants are stored plus 128).
    BiasedGroups,
}

impl QuantizedRows {
    /// Rounds `x` `[m, padded_cols]` (row-major, `padded_cols` a multiple of [`BLOCK`] and of
    /// `group` blocks): each run of `group` blocks shares one step, `max |x| / 127` over the
    /// run (1 block as llama.cpp's Q8_0, 8 as its Q8_K for Q4_K superblocks, whose integer
    /// sums then need one scaling a superblock); `interleave` says what else to fill.
    pub(crate) fn new(x: &[f32], padded_cols: usize, group: usize, interleave: Interleave) -> Self {
        crate::avx2::round_rows(x, padded_cols, group, interleave)
            .unwrap_or_else(|| Self::with(Portable, x, padded_cols, group, interleave))
    }

    /// [`QuantizedRows::new`] with `ops`' loops (the same bits whichever: a maximum, and
    /// per value one multiply, one add and a truncation).
    #[inline(always)]
    pub(crate) fn with<O: RoundOps>(
        ops: O,
        x: &[f32],
        padded_cols: usize,
        group: usize,
        interleave: Interleave,
    ) -> Self {
        let n = x.len() / BLOCK;
        let blocks = (padded_cols / BLOCK).max(1);
        let group = group.max(1);
        let sum_stride = blocks.div_ceil(8) * 8;
        let mut quants = Vec::with_capacity(n);
        let mut steps = Vec::with_capacity(n);
        let mut sums = Vec::with_capacity(n.div_ceil(blocks) * sum_stride);
        let superblocks = group == 8;
        let mut half_sums = Vec::with_capacity(if superblocks { n / 8 } else { 0 });
        let mut totals = Vec::with_capacity(n);
        for run in x.chunks(BLOCK * group) {
            let mut halves = [0i16; 16];
            let (amax, finite) = ops.abs_max(run);
            let step = if !finite {
                f32::NAN
            } else if amax == 0.0 {
                0.0
            } else {
                amax / 127.0
            };
            let inv = if step > 0.0 { 1.0 / step } else { 0.0 };
            for (j, block) in run.chunks_exact(BLOCK).enumerate() {
                let q = if step > 0.0 {
                    ops.round_block(block, inv)
                } else {
                    [0i8; BLOCK]
                };
                let [first, second] = ops.half_sums(&q);
                let total = first + second;
                if superblocks {
                    // 16 values of at most 127 in magnitude: within i16.
                    halves[j] = first as i16;
                    halves[8 + j] = second as i16;
                }
                totals.push(total);
                quants.push(q);
                steps.push(step);
                sums.push(step * total as f32);
                if quants.len() % blocks == 0 {
                    sums.resize(sums.len() + sum_stride - blocks, 0.0);
                }
            }
            if superblocks {
                half_sums.push(halves);
            }
        }
        let grouped = match interleave {
            Interleave::No => Vec::new(),
            Interleave::Groups | Interleave::BiasedGroups => interleaved(&quants, blocks),
        };
        let group_offsets = match interleave {
            Interleave::BiasedGroups => offsets(&totals, blocks),
            Interleave::No | Interleave::Groups => Vec::new(),
        };
        Self {
            quants,
            steps,
            sums,
            sum_stride,
            half_sums,
            grouped,
            group_offsets,
        }
    }

    /// The rounded rows as f32, `[m, padded_cols]`: what the product multiplies.
    pub(crate) fn dequantize(&self) -> Vec<f32> {
        let mut out = Vec::with_capacity(self.quants.len() * BLOCK);
        for (q, &step) in self.quants.iter().zip(&self.steps) {
            out.extend(q.iter().map(|&v| step * f32::from(v)));
        }
        out
    }
}

/// The loops of rounding `x`: the portable ones ([`Portable`]) or SIMD ones that give the same
/// bits (`crate::avx2`). They run on the calling thread before every product.
pub(crate) trait RoundOps: Copy {
    /// `max |v|` over `values` (whole blocks) and whether every value is finite.
    fn abs_max(self, values: &[f32]) -> (f32, bool);
    /// A block's 32 values times `inv`, rounded half away from zero (an add of ±0.5, then
    /// truncation) to int8; `|v · inv| ≤ 127` to rounding.
    fn round_block(self, block: &[f32], inv: f32) -> [i8; BLOCK];
    /// `Σ q` over a block's first 16 quants and over its last 16 (exact: integers).
    #[inline(always)]
    fn half_sums(self, q: &[i8; BLOCK]) -> [i32; 2] {
        Portable.half_sums(q)
    }
}

/// [`RoundOps`] in plain Rust.
#[derive(Clone, Copy)]
pub(crate) struct Portable;

impl RoundOps for Portable {
    fn abs_max(self, values: &[f32]) -> (f32, bool) {
        let finite = values.iter().all(|v| v.is_finite());
        let amax = values
            .iter()
            .fold(0.0f32, |a, v| if v.abs() > a { v.abs() } else { a });
        (amax, finite)
    }

    fn round_block(self, block: &[f32], inv: f32) -> [i8; BLOCK] {
        let mut q = [0i8; BLOCK];
        for (q, v) in q.iter_mut().zip(block) {
            let r = v * inv;
            *q = (r + 0.5f32.copysign(r)) as i8;
        }
        q
    }

    fn half_sums(self, q: &[i8; BLOCK]) -> [i32; 2] {
        let (first, second) = q.split_at(BLOCK / 2);
        let sum = |half: &[i8]| half.iter().map(|&v| i32::from(v)).sum();
        [sum(first), sum(second)]
    }
}

/// `quants` (rows of `blocks` blocks) in [`crate::pack::Storage::Q8_0Groups`]' order
/// ([`crate::pack::grouped_byte`]: in a whole group, unit `t` holds quants `4 t .. 4 t + 4` of
/// each block).
fn interleaved(quants: &[[i8; BLOCK]], blocks: usize) -> Vec<[i8; BLOCK]> {
    let mut out = quants.to_vec();
    for (row, out) in quants
        .chunks_exact(blocks)
        .zip(out.chunks_exact_mut(blocks))
    {
        for (group, out) in row.chunks_exact(GROUP).zip(out.chunks_exact_mut(GROUP)) {
            for (t, unit) in out.iter_mut().enumerate() {
                for (j, four) in unit.chunks_exact_mut(4).enumerate() {
                    four.copy_from_slice(&group[j][4 * t..4 * t + 4]);
                }
            }
        }
    }
    out
}

/// [`QuantizedRows::group_offsets`] from each block's `Σ q` (rows of `blocks` blocks).
fn offsets(totals: &[i32], blocks: usize) -> Vec<[i32; GROUP]> {
    let mut out = Vec::new();
    for row in totals.chunks_exact(blocks) {
        for group in row.chunks_exact(GROUP) {
            out.push(std::array::from_fn(|j| -128 * group[j]));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Values that exercise the rounding: ties (`amax` 127 makes the step 1, so `k + 0.5`
    /// rounds away from zero), both zeros, an all-zero block, a block with an infinity and one
    /// with a NaN, and a spread of ordinary values.
    fn awkward_rows(padded_cols: usize, rows: usize) -> Vec<f32> {
        let mut x = Vec::with_capacity(rows * padded_cols);
        let mut state = 0x2545_f491_u32;
        for i in 0..rows * padded_cols {
            state ^= state << 13;
            state ^= state >> 17;
            state ^= state << 5;
            let spread = (state as f32 / u32::MAX as f32 - 0.5) * 7.0;
            x.push(match (i / BLOCK) % 6 {
                0 if i % BLOCK == 0 => 127.0,
                0 => (i % 64) as f32 - 31.5,
                1 => 0.0,
                2 if i % 3 == 0 => -0.0,
                3 if i % BLOCK == 5 => f32::INFINITY,
                4 if i % BLOCK == 9 => f32::NAN,
                _ => spread,
            });
        }
        x
    }

    #[test]
    fn every_round_ops_gives_the_portable_bits() {
        let bits = |v: &[f32]| v.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
        for (padded_cols, group) in [(32 * 18, 1), (32 * 19, 1), (256 * 3, 8)] {
            let x = awkward_rows(padded_cols, 5);
            let interleave = Interleave::BiasedGroups;
            let portable = QuantizedRows::with(Portable, &x, padded_cols, group, interleave);
            let chosen = QuantizedRows::new(&x, padded_cols, group, interleave);
            assert_eq!(chosen.quants, portable.quants);
            assert_eq!(bits(&chosen.steps), bits(&portable.steps));
            assert_eq!(bits(&chosen.sums), bits(&portable.sums));
            assert_eq!(chosen.half_sums, portable.half_sums);
            assert_eq!(chosen.grouped, portable.grouped);
            assert_eq!(chosen.group_offsets, portable.group_offsets);
            // A NaN or an infinity gives its block (its run of `group`) a NaN step; with a step
            // of 1, −30.5 and −29.5 went away from zero.
            assert!(portable.steps[3].is_nan() && portable.steps[4].is_nan());
            if group == 1 {
                assert_eq!(portable.quants[0][1..3], [-31, -30]);
            }
        }
    }
}
