//! Integer weights against rows of `x` rounded to int8, a block of 32 at a time
//! ([`tile_int8`]): `q4-a8`'s per-block layout.

use std::marker::PhantomData;
use std::ops::Range;

use core::arch::x86_64::{__m128i, __m256i};
use pulp::bytemuck::cast_slice;
use pulp::x86::V3;
use pulp::{Simd, cast, f32x8, i32x8};

use crate::activations::QuantizedRows;
use crate::pack::{BLOCK, GROUP, PANEL};

use super::hints::{Hint, PREFETCH_AHEAD_BYTES};
use super::rows::{Apart, Q4Row, Row};
use super::sweep::{Tiles, sweep};
use super::widened::widened_sweep;

/// A row of `x` rounded to int8 (see [`QuantizedRows`]).
#[derive(Clone, Copy)]
pub(super) struct Int8Row<'x> {
    pub(super) quants: &'x [[i8; BLOCK]],
    pub(super) steps: &'x [f32],
    /// The blocks' `step · Σ q` in vectors of 8, zeros past the row's blocks.
    pub(super) sums: &'x [f32x8],
    /// Per superblock, the sums of `q` over halves of a block (see `QuantizedRows`).
    pub(super) half_sums: &'x [[i16; 16]],
    /// Per whole group of 8 blocks, the blocks' `−128 · Σ q` (see `QuantizedRows`); empty
    /// but for [`grouped_sweep`].
    ///
    /// [`grouped_sweep`]: super::grouped::grouped_sweep
    pub(super) group_offsets: &'x [[i32; GROUP]],
}

/// A weight row whose quants multiply int8 activations with integer multiply-adds.
pub(super) trait IntRow: Row {
    /// Whether blocks have a minimum (`w = scale · q + min`, unsigned `q`) rather than
    /// signed quants (`w = scale · q`).
    const OFFSET: bool;
    /// Block `b`'s 32 quants in order (unsigned when [`IntRow::OFFSET`]) and its scale
    /// (the f32 factor of its integer sum).
    fn block(self, simd: V3, b: usize) -> (__m256i, f32);
    /// `total` plus the row's minimums times `sums`, `x`'s block sums in vectors of 8
    /// (zeros past the row's blocks); `total` itself without [`IntRow::OFFSET`].
    fn add_mins(self, simd: V3, sums: &[f32x8], total: f32x8) -> f32x8;
}

/// A Q4 block's two words of nibbles (see `Storage::Q4`) as its 32 quants in order:
/// bytes 0..16 hold weights 0..16 in their low nibbles and 16..32 in their high ones, so
/// the 16 bytes go to both halves (one broadcasting load), the upper half is shifted down
/// by a nibble, and both are masked.
#[inline(always)]
fn unpack_nibbles(simd: V3, words: [u64; 2]) -> __m256i {
    let packed: __m128i = cast(words);
    let both = simd.avx2._mm256_broadcastsi128_si256(packed);
    let shifts = simd.avx._mm256_set_epi64x(4, 4, 0, 0);
    simd.avx2._mm256_and_si256(
        simd.avx2._mm256_srlv_epi64(both, shifts),
        simd.avx._mm256_set1_epi8(0x0F),
    )
}

impl IntRow for Q4Row<'_, Apart<'_>> {
    const OFFSET: bool = true;

    #[inline(always)]
    fn block(self, simd: V3, b: usize) -> (__m256i, f32) {
        let at = b * PANEL + self.lane;
        (unpack_nibbles(simd, self.quants[at]), self.side.scales[at])
    }

    #[inline(always)]
    fn add_mins(self, simd: V3, sums: &[f32x8], mut total: f32x8) -> f32x8 {
        let first = self.side.first_min;
        let mins: &[f32x8] = cast_slice(&self.side.mins[first..first + sums.len() * 8]);
        for (&min, &sum) in mins.iter().zip(sums) {
            total = simd.mul_add_f32x8(min, sum, total);
        }
        total
    }
}

/// Integer weights against int8 rows of `x` ([`tile_int8`]).
#[derive(Clone, Copy)]
struct Int8<'x, W>(PhantomData<(&'x (), W)>);

impl<'x, W: IntRow> Tiles for Int8<'x, W> {
    type W = W;
    type X = Int8Row<'x>;

    #[inline(always)]
    fn tile<const RR: usize, const M: usize>(
        self,
        simd: V3,
        rows: &[W; RR],
        xs: &[Int8Row<'x>; M],
        blocks: usize,
    ) -> [[f32; M]; RR] {
        tile_int8(simd, rows, xs, blocks)
    }
}

/// The dot products of integer weight rows with int8 rows of `x`. Per block, 32 products
/// are summed exactly in integers (`vpmaddubsw`, which multiplies unsigned by signed bytes,
/// then `vpmaddwd` by ones; signed weights give the sign to `x` and their absolute value to
/// the unsigned side, as llama.cpp does, and |q| ≤ 127 keeps the pairs from saturating),
/// then scaled by the weight's scale times the block of `x`'s step into f32 accumulators.
/// Rows with minimums add `Σ_b min_b · step_b · Σ q_x` into the same accumulator after the
/// blocks, 8 blocks a multiply-add (the row's minimums against `x`'s block sums) instead of
/// one a block (SmolLM2's `q4-a8` products measured 4–8% faster at one row of `x`, 3–4%
/// slower at two, level at five and eight; docs/benchmarks.md at ede8bc8, "Q4 minimums once a
/// row"). A row's operations do not depend on the tile.
#[allow(clippy::needless_range_loop)]
#[inline(always)]
fn tile_int8<W: IntRow, const RR: usize, const M: usize>(
    simd: V3,
    rows: &[W; RR],
    xs: &[Int8Row<'_>; M],
    blocks: usize,
) -> [[f32; M]; RR] {
    let zero = simd.splat_f32x8(0.0);
    let ones = simd.avx._mm256_set1_epi16(1);
    let mut acc = [[zero; M]; RR];
    let hint = Hint::of_cpu();
    for b in 0..blocks {
        let ahead = PREFETCH_AHEAD_BYTES / W::PANEL_BLOCK_BYTES;
        for r in (0..RR).step_by(PANEL) {
            rows[r].prefetch(simd, hint, b + ahead);
        }
        for r in 0..RR {
            let (quants, scale) = rows[r].block(simd, b);
            let scale = simd.splat_f32x8(scale);
            let unsigned = if W::OFFSET {
                quants
            } else {
                simd.avx2._mm256_abs_epi8(quants)
            };
            for i in 0..M {
                let x: __m256i = cast(xs[i].quants[b]);
                let signed = if W::OFFSET {
                    x
                } else {
                    simd.avx2._mm256_sign_epi8(x, quants)
                };
                let pairs = simd.avx2._mm256_maddubs_epi16(unsigned, signed);
                let sums: i32x8 = cast(simd.avx2._mm256_madd_epi16(pairs, ones));
                // A broadcast from memory and a multiply: no shuffle in the FP pipes.
                let step = simd.splat_f32x8(xs[i].steps[b]);
                acc[r][i] = simd.mul_add_f32x8(
                    simd.convert_i32x8_to_f32x8(sums),
                    simd.mul_f32x8(scale, step),
                    acc[r][i],
                );
            }
        }
    }
    let mut out = [[0.0f32; M]; RR];
    for r in 0..RR {
        for i in 0..M {
            let total = rows[r].add_mins(simd, xs[i].sums, acc[r][i]);
            out[r][i] = simd.reduce_sum_f32s(total);
        }
    }
    out
}

/// Row `i` of `x` rounded to int8, `blocks` blocks a row.
#[inline(always)]
pub(super) fn int8_row<'q>(
    q: &'q QuantizedRows,
    blocks: usize,
) -> impl Fn(usize) -> Int8Row<'q> + Copy {
    move |i: usize| Int8Row {
        quants: &q.quants[i * blocks..(i + 1) * blocks],
        steps: &q.steps[i * blocks..(i + 1) * blocks],
        sums: cast_slice(&q.sums[i * q.sum_stride..(i + 1) * q.sum_stride]),
        half_sums: q
            .half_sums
            .get(i * blocks / 8..(i + 1) * blocks / 8)
            .unwrap_or(&[]),
        group_offsets: &[],
    }
}

/// Integer weights against the int8 rows of `x` when given, else against `x` widened.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(super) fn integer_sweep<W: IntRow>(
    simd: V3,
    tall: bool,
    row: impl Fn(usize) -> W,
    rows: Range<usize>,
    x: &[[f32x8; 4]],
    int8: Option<&QuantizedRows>,
    blocks: usize,
    m: usize,
    outs: &mut [&mut [f32]],
) {
    match int8 {
        Some(q) => {
            let x_row = int8_row(q, blocks);
            // The integer tiles never take tall tiles (`Tiles::TALL`); `tall` is for the
            // widened fallback below (Q4A8 without the rounded rows: the portable loop's).
            sweep(
                simd,
                false,
                Int8(PhantomData),
                row,
                rows,
                x_row,
                blocks,
                m,
                outs,
            );
        }
        None => widened_sweep(simd, tall, row, rows, x, blocks, m, outs),
    }
}
