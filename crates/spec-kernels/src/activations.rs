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
    /// With `interleave`, the quants in [`crate::pack::Storage::Q8_0Groups`]' order (each
    /// row's whole groups of 8 blocks as units holding 4 quants of each block; the blocks after
    /// them as they are), for the tiles that multiply that layout; empty otherwise.
    pub(crate) grouped: Vec<[i8; BLOCK]>,
    /// With `interleave`, per row and whole group of 8 blocks, `−128 · Σ q` of each block:
    /// where the stored quants are `q_w + 128`, the integer sums start from these.
    pub(crate) group_offsets: Vec<[i32; GROUP]>,
}

impl QuantizedRows {
    /// Rounds `x` `[m, padded_cols]` (row-major, `padded_cols` a multiple of [`BLOCK`] and of
    /// `group` blocks): each run of `group` blocks shares one step, `max |x| / 127` over the
    /// run (1 block as llama.cpp's Q8_0, 8 as its Q8_K for Q4_K superblocks, whose integer
    /// sums then need one scaling a superblock). With `interleave`, also fills
    /// [`QuantizedRows::grouped`].
    pub(crate) fn new(x: &[f32], padded_cols: usize, group: usize, interleave: bool) -> Self {
        let n = x.len() / BLOCK;
        let blocks = (padded_cols / BLOCK).max(1);
        let group = group.max(1);
        let sum_stride = blocks.div_ceil(8) * 8;
        let mut quants = Vec::with_capacity(n);
        let mut steps = Vec::with_capacity(n);
        let mut sums = Vec::with_capacity(n.div_ceil(blocks) * sum_stride);
        let superblocks = group == 8;
        let mut half_sums = Vec::with_capacity(if superblocks { n / 8 } else { 0 });
        for run in x.chunks(BLOCK * group) {
            let mut halves = [0i16; 16];
            let finite = run.iter().all(|v| v.is_finite());
            // Loops without calls (libm's `roundf` is one) so that they vectorize: this runs
            // on the calling thread before every product.
            let amax = run
                .iter()
                .fold(0.0f32, |a, v| if v.abs() > a { v.abs() } else { a });
            let step = if !finite {
                f32::NAN
            } else if amax == 0.0 {
                0.0
            } else {
                amax / 127.0
            };
            let inv = if step > 0.0 { 1.0 / step } else { 0.0 };
            for (j, block) in run.chunks_exact(BLOCK).enumerate() {
                let mut q = [0i8; BLOCK];
                if step > 0.0 {
                    for (q, v) in q.iter_mut().zip(block) {
                        // Half away from zero, then truncation; |v · inv| ≤ 127 (to rounding).
                        let r = v * inv;
                        *q = (r + 0.5f32.copysign(r)) as i8;
                    }
                }
                let total: i32 = q.iter().map(|&v| i32::from(v)).sum();
                if superblocks {
                    // 16 values of at most 127 in magnitude: within i16.
                    let first: i32 = q[..16].iter().map(|&v| i32::from(v)).sum();
                    halves[j] = first as i16;
                    halves[8 + j] = (total - first) as i16;
                }
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
        let (grouped, group_offsets) = if interleave {
            (interleaved(&quants, blocks), offsets(&quants, blocks))
        } else {
            (Vec::new(), Vec::new())
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

/// [`QuantizedRows::group_offsets`] of `quants` (rows of `blocks` blocks).
fn offsets(quants: &[[i8; BLOCK]], blocks: usize) -> Vec<[i32; GROUP]> {
    let mut out = Vec::new();
    for row in quants.chunks_exact(blocks) {
        for group in row.chunks_exact(GROUP) {
            out.push(std::array::from_fn(|j| {
                -128 * group[j].iter().map(|&q| i32::from(q)).sum::<i32>()
            }));
        }
    }
    out
}
