//! Weights widened to f32 against f32 rows of `x`: the register tile ([`tile`],
//! [`accumulate`]) every format's [`Row`] takes.

use std::marker::PhantomData;
use std::ops::Range;

use pulp::x86::V3;
use pulp::{Simd, f32x8};

use crate::pack::PANEL;

use super::hints::{Hint, PREFETCH_AHEAD_BYTES, hints_weights};
use super::rows::Row;
use super::sweep::{Tiles, sweep};

/// The dot products of `rows` with `xs`, `out[r][i] = rows[r] · xs[i]`.
///
/// Per vector of a block, the `M` vectors of `x` are loaded once and each widened weight
/// vector is used `M` times: `RR + M` loads for `RR × M` FMAs, and the `RR × M` accumulators,
/// `M` vectors of `x` and one of weights fit in the 16 AVX registers for the shapes used
/// (2 × 1 to 2 × 5 in f32). For 2 × 5 in bf16 and
/// Q8_0 they do not (widening needs a mask or a scale too; that tile spilled), so it holds
/// the `RR` widened weight vectors instead and reads each vector of `x` where an FMA uses
/// it; so do the tiles of two and three panels (4 × 3 to 6 × 5), whose sums take
/// AVX-512's 32 registers. Every shape does the same operations in the same order for a
/// given output, so a
/// row's bits do not depend on the tile. Sums are reduced horizontally once, at the end of
/// the rows.
// Index loops over the register tile: fixed trip counts the compiler unrolls.
#[allow(clippy::needless_range_loop)]
#[inline(always)]
pub(super) fn tile<W: Row, const RR: usize, const M: usize>(
    simd: V3,
    rows: &[W; RR],
    xs: &[&[[f32x8; 4]]; M],
    blocks: usize,
) -> [[f32; M]; RR] {
    let mut acc = [[simd.splat_f32x8(0.0); M]; RR];
    accumulate(simd, rows, xs, blocks, &mut acc);
    let mut out = [[0.0f32; M]; RR];
    for r in 0..RR {
        for i in 0..M {
            out[r][i] = simd.reduce_sum_f32s(acc[r][i]);
        }
    }
    out
}

/// [`tile`]'s sums before their reduction: adds `blocks` blocks of each pair's products
/// to its 8 lanes in `sums`, so a row may be summed in pieces (spans of f32 rows) with
/// the same operations in the same order as in one.
#[allow(clippy::needless_range_loop)]
#[inline(always)]
pub(super) fn accumulate<W: Row, const RR: usize, const M: usize>(
    simd: V3,
    rows: &[W; RR],
    xs: &[&[[f32x8; 4]]; M],
    blocks: usize,
    sums: &mut [[f32x8; M]; RR],
) {
    // Accumulators, `x`, a weight vector and its temporaries within the 16 registers.
    let hold_x = RR * M + M + 1 + W::TEMPORARIES <= 16;
    let zero = simd.splat_f32x8(0.0);
    let mut acc = *sums;
    let hint = W::hint(Hint::of_cpu());
    let hinted = hints_weights::<W>(hint, M);
    for b in 0..blocks {
        if hinted {
            let ahead = PREFETCH_AHEAD_BYTES / W::PANEL_BLOCK_BYTES;
            // One hint per panel of the tile (rows r and r + 1 share a panel).
            for r in (0..RR).step_by(PANEL) {
                rows[r].prefetch(simd, hint, b + ahead);
            }
        }
        for j in 0..4 {
            if !hold_x {
                let mut wv = [zero; RR];
                for r in 0..RR {
                    wv[r] = rows[r].part(simd, b, j);
                }
                for i in 0..M {
                    let xv = xs[i][b][j];
                    for r in 0..RR {
                        acc[r][i] = simd.mul_add_f32x8(wv[r], xv, acc[r][i]);
                    }
                }
                continue;
            }
            let mut xv = [zero; M];
            for i in 0..M {
                xv[i] = xs[i][b][j];
            }
            for r in 0..RR {
                let w = rows[r].part(simd, b, j);
                for i in 0..M {
                    acc[r][i] = simd.mul_add_f32x8(w, xv[i], acc[r][i]);
                }
            }
        }
    }
    *sums = acc;
}

/// Weights widened to f32 against f32 rows of `x` ([`tile`]).
#[derive(Clone, Copy)]
struct Widened<'x, W>(PhantomData<(&'x (), W)>);

impl<'x, W: Row> Tiles for Widened<'x, W> {
    type W = W;
    type X = &'x [[f32x8; 4]];
    const TALL: bool = true;
    const THREE_PANELS: bool = W::TEMPORARIES == 0;

    #[inline(always)]
    fn tile<const RR: usize, const M: usize>(
        self,
        simd: V3,
        rows: &[W; RR],
        xs: &[Self::X; M],
        blocks: usize,
    ) -> [[f32; M]; RR] {
        tile(simd, rows, xs, blocks)
    }
}

/// Weights widened to f32 against the f32 rows of `x`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(super) fn widened_sweep<W: Row>(
    simd: V3,
    tall: bool,
    row: impl Fn(usize) -> W,
    rows: Range<usize>,
    x: &[[f32x8; 4]],
    blocks: usize,
    m: usize,
    outs: &mut [&mut [f32]],
) {
    let x_row = |i: usize| &x[i * blocks..(i + 1) * blocks];
    sweep(
        simd,
        tall,
        Widened(PhantomData),
        row,
        rows,
        x_row,
        blocks,
        m,
        outs,
    );
}
