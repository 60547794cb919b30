//! f32 rows stored in spans ([`span_width`]) in AVX2's 16 registers: each output's sums
//! carried from span to span ([`spanned_groups`]), a verification's rows in tiles of one or two
//! panels ([`spanned_sweep`]) and a prompt's passes tile by tile ([`SpannedPass`]).

use std::ops::Range;

use pulp::bytemuck::cast_slice;
use pulp::x86::V3;
use pulp::{NullaryFnOnce, Simd, f32x8};

use crate::pack::{BLOCK, PANEL, SPAN_GROUP, Storage, span_width};

use super::Product;
use super::hints::{Hint, hints_weights, prefetch_lines};
use super::rows::{F32Row, Row, SpanRow};
use super::widened::accumulate;

/// The loops that [`spanned_sweep`] and [`SpannedPass`] share: for each group of
/// [`SPAN_GROUP`] rows (`rows` starts at one), span by span, [`AddSpan::add_span`] adds
/// the group's pieces of the span (its panels within `rows`, panel by panel) times `x` to
/// the group's 8-lane sums (`sums[(row in group) * m + i]`, zero at the group's start),
/// which are then reduced into `outs`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn spanned_groups(
    simd: V3,
    w: &[[f32x8; 4]],
    panel_rows: usize,
    rows: Range<usize>,
    blocks: usize,
    m: usize,
    outs: &mut [&mut [f32]],
    add: impl AddSpan,
) {
    debug_assert!(rows.start.is_multiple_of(SPAN_GROUP));
    let width = span_width(blocks);
    let zero = simd.splat_f32x8(0.0);
    // A verification's few rows keep their sums on the stack (8 KB at 16 rows): this runs
    // for every product of every decode step. A prompt's pass allocates them.
    let mut on_stack = [zero; SPAN_GROUP * SPAN_TILE_MAX_ROWS];
    let mut on_heap = Vec::new();
    let sums = if m <= SPAN_TILE_MAX_ROWS {
        &mut on_stack[..SPAN_GROUP * m]
    } else {
        on_heap.resize(SPAN_GROUP * m, zero);
        &mut on_heap[..]
    };
    let mut first = rows.start;
    while first < rows.end {
        let group_rows = SPAN_GROUP.min(panel_rows - first);
        let panels = (rows.end.min(first + group_rows) - first).div_ceil(PANEL);
        let sums = &mut sums[..panels * PANEL * m];
        sums.fill(zero);
        let mut start = 0;
        while start < blocks {
            let span = width.min(blocks - start);
            let at = first * blocks + group_rows * start;
            add.add_span(&w[at..at + panels * PANEL * span], start, span, sums);
            start += span;
        }
        for r in first..rows.end.min(first + group_rows) {
            for (i, out) in outs.iter_mut().enumerate().take(m) {
                out[r - rows.start] = simd.reduce_sum_f32s(sums[(r - first) * m + i]);
            }
        }
        first += group_rows;
    }
}

/// How [`spanned_groups`] multiplies a span's pieces by `x`. A trait, not a closure: a
/// closure's body is not inlined into the SIMD context, and its intrinsics became calls
/// (the 1.5B's products took 4 times as long).
pub(super) trait AddSpan {
    /// Adds the pieces of a span (`span` blocks from block `start`, panel by panel) times
    /// the rows of `x` to `sums` (`sums[(row in group) * m + i]`).
    fn add_span(&self, pieces: &[[f32x8; 4]], start: usize, span: usize, sums: &mut [f32x8]);
}

/// What both orders of [`AddSpan`] multiply the pieces by: `m` rows of `x`, `blocks`
/// blocks a row.
#[derive(Clone, Copy)]
pub(super) struct SpanOperands<'a> {
    pub(super) simd: V3,
    pub(super) x: &'a [[f32x8; 4]],
    pub(super) blocks: usize,
    pub(super) m: usize,
}

/// The rows of `x` of a span, all of them, in one piece, two panels at a time.
struct PieceByPiece<'a>(SpanOperands<'a>);

impl AddSpan for PieceByPiece<'_> {
    #[inline(always)]
    fn add_span(&self, pieces: &[[f32x8; 4]], start: usize, span: usize, sums: &mut [f32x8]) {
        let SpanOperands { simd, x, blocks, m } = self.0;
        let panels = sums.len() / (PANEL * m);
        let hint = SpanRow::hint(Hint::of_cpu());
        let hinted = hints_weights::<SpanRow<'_>>(hint, m);
        for q in 0..panels / 2 {
            let both = &pieces[2 * q * PANEL * span..2 * (q + 1) * PANEL * span];
            let sums = &mut sums[2 * q * PANEL * m..2 * (q + 1) * PANEL * m];
            // The next pair's pieces, asked for during the first tile over these.
            let next = pieces.as_ptr().wrapping_add(2 * (q + 1) * PANEL * span);
            let mut i = 0;
            while i < m {
                let take = (m - i).min(3);
                let hint = (hinted && i == 0).then_some(hint);
                macro_rules! pair_tile {
                    ($m:literal) => {
                        pair_span_tile::<$m>(simd, both, next, hint, x, blocks, start, i, m, sums)
                    };
                }
                match take {
                    1 => pair_tile!(1),
                    2 => pair_tile!(2),
                    _ => pair_tile!(3),
                }
                i += take;
            }
        }
        // A group's odd last panel.
        for p in panels / 2 * 2..panels {
            let piece = &pieces[p * PANEL * span..(p + 1) * PANEL * span];
            let tile_rows = [SpanRow(F32Row(piece, 0)), SpanRow(F32Row(piece, 1))];
            let sums = &mut sums[p * PANEL * m..(p + 1) * PANEL * m];
            let mut i = 0;
            while i < m {
                let left = m - i;
                let take = match left {
                    5 | 3 => left,
                    l if l >= 4 => 4,
                    l => l.min(2),
                };
                macro_rules! span_tile {
                    ($m:literal) => {{
                        let xs = span_xs::<$m>(x, blocks, start, span, i);
                        span_tile(simd, &tile_rows, &xs, span, i, m, sums)
                    }};
                }
                match take {
                    1 => span_tile!(1),
                    2 => span_tile!(2),
                    3 => span_tile!(3),
                    4 => span_tile!(4),
                    _ => span_tile!(5),
                }
                i += take;
            }
        }
    }
}

/// Tiles of 4 rows of `x` in turn, each over all the span's pieces ([`SpannedPass`]).
struct TileByTile<'a>(SpanOperands<'a>);

impl AddSpan for TileByTile<'_> {
    #[inline(always)]
    fn add_span(&self, pieces: &[[f32x8; 4]], start: usize, span: usize, sums: &mut [f32x8]) {
        let SpanOperands { simd, x, blocks, m } = self.0;
        let mut i = 0;
        while i < m {
            let take = if m - i >= 4 { 4 } else { m - i };
            macro_rules! span_panels {
                ($m:literal) => {
                    span_panels::<$m>(simd, pieces, span, x, blocks, start, i, m, sums)
                };
            }
            match take {
                1 => span_panels!(1),
                2 => span_panels!(2),
                3 => span_panels!(3),
                _ => span_panels!(4),
            }
            i += take;
        }
    }
}

/// [`sweep`] for f32 rows stored in spans ([`span_width`]), 1 to [`SPAN_TILE_MAX_ROWS`]
/// rows of `x`: in each span ([`spanned_groups`]) each pair of panels' pieces against
/// every row of `x` in tiles of two panels × 3 rows ([`pair_span_tile`]; 1 or 2 for the
/// last), a group's odd last panel in one-panel tiles (as `sweep::run_rows`), so each output
/// gets the same operations in the same order as from whole rows. The group's data is
/// one sequential stream, and a span of `x` serves its 8 panels from L1.
///
/// [`sweep`]: super::sweep::sweep
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(super) fn spanned_sweep(
    simd: V3,
    w: &[[f32x8; 4]],
    panel_rows: usize,
    rows: Range<usize>,
    x: &[[f32x8; 4]],
    blocks: usize,
    m: usize,
    outs: &mut [&mut [f32]],
) {
    let add = PieceByPiece(SpanOperands { simd, x, blocks, m });
    spanned_groups(simd, w, panel_rows, rows, blocks, m, outs, add);
}

/// The most rows of `x` that [`spanned_sweep`] takes a piece at a time; more (a prompt's
/// passes) run as [`SpannedPass`]. A verification of 9 tokens (K 8) took 1.76-1.78 of one
/// row's time in the 1.5B's products as passes, 1.42-1.45 piece by piece (its span of `x`
/// 18 KB); 12 rows 1.89-2.05 and 1.81-1.86; 16 rows the same either way (alternated
/// rounds, Zen 3, docs/benchmarks.md at a7ffb84, "Verifications of 9 to 16 tokens in spans").
pub(super) const SPAN_TILE_MAX_ROWS: usize = 16;

/// A product of spanned f32 rows ([`span_width`]) with more than [`SPAN_TILE_MAX_ROWS`]
/// rows of `x`, in its own SIMD context. Span by span, each tile of 4 rows of `x` runs
/// over the group's panels in turn, so the tile's span of `x` (8 KB) stays in L1 while the
/// group's pieces of the span (32 KB) are read again from L2 for each tile. Piece by
/// piece instead (all the rows' span of `x` read from L2 for each piece, 128 KB at 64 rows),
/// the 1.5B's products at 64 rows took 1.2-1.6 of the time of whole rows, this way
/// 0.67-1.17 (alternated rounds, Zen 3, docs/benchmarks.md at d7069f5, "f32 rows in spans").
/// Compiled apart from [`Job`]: in the same function it slows the tiles of 4 and 8 rows to
/// the whole rows' time.
///
/// [`Job`]: super::Job
pub(super) struct SpannedPass<'a, 'b> {
    pub(super) simd: V3,
    pub(super) product: Product<'a, 'b>,
}

impl NullaryFnOnce for SpannedPass<'_, '_> {
    type Output = ();

    #[inline(always)]
    fn call(self) {
        spanned_product(self.simd, self.product, TileByTile);
    }
}

/// A product of spanned f32 rows: [`spanned_groups`] over `product`'s rows, each span's
/// pieces taken as `add` (made from the product's operands) takes them.
#[inline(always)]
pub(super) fn spanned_product<'a, A: AddSpan>(
    simd: V3,
    product: Product<'a, '_>,
    add: impl FnOnce(SpanOperands<'a>) -> A,
) {
    let Product {
        mat,
        rows,
        x,
        m,
        outs,
        ..
    } = product;
    let Storage::F32(w) = &mat.storage else {
        return;
    };
    let w: &[[f32x8; 4]] = cast_slice(w);
    let x: &'a [[f32x8; 4]] = cast_slice(x);
    let blocks = mat.padded_cols() / BLOCK;
    let add = add(SpanOperands { simd, x, blocks, m });
    spanned_groups(simd, w, mat.panel_rows(), rows, blocks, m, outs, add);
}

/// Every panel's piece of a span (`pieces`, up to the panels that `sums` holds) against
/// rows `i..i + M` of `x`, a one-panel tile each, adding to the sums (`sums[r * m + i]`
/// for the group's row `r`).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn span_panels<const M: usize>(
    simd: V3,
    pieces: &[[f32x8; 4]],
    span: usize,
    x: &[[f32x8; 4]],
    blocks: usize,
    start: usize,
    i: usize,
    m: usize,
    sums: &mut [f32x8],
) {
    let xs = span_xs::<M>(x, blocks, start, span, i);
    for (piece, sums) in pieces
        .chunks_exact(PANEL * span)
        .zip(sums.chunks_exact_mut(PANEL * m))
    {
        let rows = [SpanRow(F32Row(piece, 0)), SpanRow(F32Row(piece, 1))];
        span_tile(simd, &rows, &xs, span, i, m, sums);
    }
}

/// One panel's piece of a span against rows `i..i + M` of `x` (`xs`, [`span_xs`]), adding
/// to the panel's two rows' sums (`sums[r * m + i]`).
#[inline(always)]
pub(super) fn span_tile<const M: usize>(
    simd: V3,
    rows: &[SpanRow<'_>; PANEL],
    xs: &[&[[f32x8; 4]]; M],
    span: usize,
    i: usize,
    m: usize,
    sums: &mut [f32x8],
) {
    let mut acc = load_sums::<PANEL, M>(sums, i, m);
    accumulate(simd, rows, xs, span, &mut acc);
    store_sums(&acc, sums, i, m);
}

/// Rows `i..i + M` of `x` (`blocks` blocks a row), each the `span` blocks from `start` on:
/// what a tile over a span's pieces multiplies them by.
#[inline(always)]
fn span_xs<const M: usize>(
    x: &[[f32x8; 4]],
    blocks: usize,
    start: usize,
    span: usize,
    i: usize,
) -> [&[[f32x8; 4]]; M] {
    std::array::from_fn(|u| {
        let at = (i + u) * blocks + start;
        &x[at..at + span]
    })
}

/// The sums of `R` weight rows against rows `i..i + M` of `x`, kept as `sums[r * m + i]`.
#[inline(always)]
fn load_sums<const R: usize, const M: usize>(
    sums: &[f32x8],
    i: usize,
    m: usize,
) -> [[f32x8; M]; R] {
    std::array::from_fn(|r| std::array::from_fn(|u| sums[r * m + i + u]))
}

/// [`load_sums`] undone: `acc` written back to `sums`.
#[inline(always)]
fn store_sums<const R: usize, const M: usize>(
    acc: &[[f32x8; M]; R],
    sums: &mut [f32x8],
    i: usize,
    m: usize,
) {
    for (r, acc) in acc.iter().enumerate() {
        sums[r * m + i..r * m + i + M].copy_from_slice(acc);
    }
}

/// Two panels' pieces of a span (`both`: the first panel's piece, then the second's, each
/// `span` blocks) against rows `i..i + M` of `x`, `M` up to 3, adding to the four rows'
/// sums (`sums[r * m + i]`); with `hint`, asking for the pieces from `next` on (as many
/// bytes as `both`) on the way. Each output takes the same operations in the same order
/// as in a one-panel tile ([`span_tile`]), so the same bits.
///
/// Four weight rows × 3 rows of `x` take 12 sums, 3 vectors of `x` and a weight vector
/// (the 16 registers) and load 7 vectors a 12 multiply-adds, where one panel × 4 or 5
/// rows loads 6 a 8 or 7 a 10; perf annotate showed the one-panel tiles storing and
/// reloading all their 8 or 10 sums every block, this one 4 of its 12 (the 3-row loop). On
/// a Zen 4, whose loads (about one a cycle beside multiply-adds) bound these tiles, one
/// thread on a product held in L2 (`hot_product`) went from 5.2-7.1 to 10.2-13.5 GB/s at 9
/// rows, 11-13 to 19-23 at 5, and 22 to 50-65 at one (docs/benchmarks.md at c3e1215, "AVX2
/// tiles of two panels × 3 rows for f32 spans", with the model's products; the finding in
/// docs/notes/cpu-kernels.md, "Layouts and tiles").
#[allow(clippy::needless_range_loop, clippy::too_many_arguments)]
#[inline(always)]
fn pair_span_tile<const M: usize>(
    simd: V3,
    both: &[[f32x8; 4]],
    next: *const [f32x8; 4],
    hint: Option<Hint>,
    x: &[[f32x8; 4]],
    blocks: usize,
    start: usize,
    i: usize,
    m: usize,
    sums: &mut [f32x8],
) {
    const ROWS: usize = 2 * PANEL;
    let span = both.len() / ROWS;
    let (first, second) = both.split_at(PANEL * span);
    let xs = span_xs::<M>(x, blocks, start, span, i);
    let mut acc = load_sums::<ROWS, M>(sums, i, m);
    for b in 0..span {
        if let Some(hint) = hint {
            let lines = next.wrapping_add(b * ROWS).cast::<u8>();
            prefetch_lines(simd, hint, lines, ROWS * 128);
        }
        for j in 0..4 {
            let mut xv = [simd.splat_f32x8(0.0); M];
            for u in 0..M {
                xv[u] = xs[u][b][j];
            }
            for r in 0..ROWS {
                let w = if r < PANEL {
                    first[b * PANEL + r][j]
                } else {
                    second[b * PANEL + r - PANEL][j]
                };
                for u in 0..M {
                    acc[r][u] = simd.mul_add_f32x8(w, xv[u], acc[r][u]);
                }
            }
        }
    }
    store_sums(&acc, sums, i, m);
}
