//! f32 rows stored in spans on a CPU with AVX-512: a panel's piece of a span against all the
//! rows of `x` in one tile, the panel's two rows side by side in 16-lane vectors
//! ([`WideSpanJob`]; two panels a tile up to [`TWO_PANEL_MAX_ROWS`] rows).

use core::arch::x86_64::__m512;
use pulp::bytemuck::cast_slice;
use pulp::x86::V4;
use pulp::{NullaryFnOnce, cast, f32x8};

use crate::pack::{BLOCK, PANEL};

use super::Product;
use super::hints::{Hint, PREFETCH_AHEAD_BYTES, prefetch_lines};
use super::rows::{F32Row, Row, SpanRow};
use super::spans::{AddSpan, SPAN_TILE_MAX_ROWS, SpanOperands, spanned_product};

/// The rows of `x` for which a spanned f32 product may take one tile of one or two panels ×
/// all the rows on a CPU with AVX-512 ([`WideSpanJob`], [`SpanTile::TwoPanels`] and
/// [`SpanTile::TwoPanelStreams`]); 16 registers split 6 or more rows into two tiles (4 + 2
/// up to 4 + 4 + 4 + 4). The 1.5B's products (Zen 5, docs/benchmarks.md at 83f3a5b, "One tile
/// of every row for 6 to 16 rows in f32 on AVX-512"; ÷ one row in the same round): 9 rows
/// 1.28–1.39 → 0.99–1.15 in five alternated rounds, 16 rows 331–340 ms → 229–231 ms. From 4
/// rows the tiles are timed against AVX2's ([`crate::tiles`]).
///
/// [`SpanTile::TwoPanels`]: crate::SpanTile::TwoPanels
/// [`SpanTile::TwoPanelStreams`]: crate::SpanTile::TwoPanelStreams
pub(super) const WIDE_SPAN_ROWS: std::ops::RangeInclusive<usize> = 2..=SPAN_TILE_MAX_ROWS;

/// A product of spanned f32 rows with `M` rows of `x` ([`WIDE_SPAN_ROWS`]) inside `V4`'s
/// target features, each panel's piece of a span in one tile of all `M` rows
/// ([`paired_tile`], `M` 16-lane sums; two panels at once up to [`TWO_PANEL_MAX_ROWS`],
/// [`two_panel_tile`]): each weight vector streamed from memory serves every row at once,
/// where two or more tiles of one panel (16 registers) stop the stream while the later
/// ones read the piece again from L1. One job per `M` and hint layout, compiled apart (as
/// [`VnniJob`]).
/// `STREAMS`: [`SpanTile::TwoPanelStreams`]'s hints, else [`SpanTile::TwoPanels`]'.
///
/// [`VnniJob`]: super::vnni::VnniJob
/// [`SpanTile::TwoPanelStreams`]: crate::SpanTile::TwoPanelStreams
/// [`SpanTile::TwoPanels`]: crate::SpanTile::TwoPanels
pub(super) struct WideSpanJob<'a, 'b, const M: usize, const STREAMS: bool> {
    pub(super) simd: V4,
    pub(super) product: Product<'a, 'b>,
}

impl<const M: usize, const STREAMS: bool> NullaryFnOnce for WideSpanJob<'_, '_, M, STREAMS> {
    type Output = ();

    #[inline(always)]
    fn call(self) {
        let WideSpanJob { simd, product } = self;
        debug_assert_eq!(product.m, M);
        let blocks = product.mat.padded_cols() / BLOCK;
        let by_block = interleave_rows::<M>(cast_slice(product.x), blocks);
        spanned_product(*simd, product, |operands| OneTile::<M, STREAMS> {
            v4: simd,
            by_block: &by_block,
            hint: SpanRow::wide_hint(Hint::of_cpu()),
            operands,
        });
    }
}

/// Each panel's piece of a span against all `M` rows of `x` in one tile ([`WideSpanJob`]),
/// two panels a tile up to [`TWO_PANEL_MAX_ROWS`] rows.
struct OneTile<'a, const M: usize, const STREAMS: bool> {
    v4: V4,
    /// `x` block by block ([`interleave_rows`]).
    by_block: &'a [[f32x8; 4]],
    hint: Hint,
    operands: SpanOperands<'a>,
}

/// The `M` rows of `x` (`[M, blocks]` blocks) block by block, `[blocks, M]`: a tile reads
/// a block's `M` vectors at fixed offsets from one address, with no bounds check. With a
/// slice a row (one address and one check a row in the loop) the 1.5B's products at 9
/// rows took 251-252 ms against 248-249 this way (Intel Xeon, two alternated rounds,
/// docs/benchmarks.md at bab1001, "AVX-512's f32 span tiles keep their sums in registers").
fn interleave_rows<const M: usize>(x: &[[f32x8; 4]], blocks: usize) -> Vec<[f32x8; 4]> {
    let mut by_block = Vec::with_capacity(blocks * M);
    for b in 0..blocks {
        by_block.extend((0..M).map(|u| x[u * blocks + b]));
    }
    by_block
}

impl<const M: usize, const STREAMS: bool> AddSpan for OneTile<'_, M, STREAMS> {
    #[inline(always)]
    fn add_span(&self, pieces: &[[f32x8; 4]], start: usize, span: usize, sums: &mut [f32x8]) {
        // Each hint its own copy of the tiles: with the hint chosen inside their loops,
        // those loops keep their sums on the stack, loading and storing every sum each block
        // (the 9-row tile, Intel Xeon, docs/notes/cpu-kernels.md, "Compiler traps met").
        match self.hint {
            Hint::NonTemporal => self.tiles(Hint::NonTemporal, pieces, start, span, sums),
            Hint::IntoL1 => self.tiles(Hint::IntoL1, pieces, start, span, sums),
            Hint::IntoL2 => self.tiles(Hint::IntoL2, pieces, start, span, sums),
        }
    }
}

impl<const M: usize, const STREAMS: bool> OneTile<'_, M, STREAMS> {
    /// [`AddSpan::add_span`] with `hint`, a constant where it is inlined.
    #[inline(always)]
    fn tiles(
        &self,
        hint: Hint,
        pieces: &[[f32x8; 4]],
        start: usize,
        span: usize,
        sums: &mut [f32x8],
    ) {
        let m = self.operands.m;
        let xs = &self.by_block[start * M..(start + span) * M];
        // Two panels a tile where their 2 M sums fit the registers ([`two_panel_tile`]); a
        // group's odd last panel, and 15 or 16 rows, one.
        let two = if M <= TWO_PANEL_MAX_ROWS { 2 } else { 1 };
        let mut pieces = pieces.chunks_exact(two * PANEL * span);
        let mut sums = sums.chunks_exact_mut(two * PANEL * m);
        for (pieces, sums) in (&mut pieces).zip(&mut sums) {
            if two == 2 {
                two_panel_tile::<M, STREAMS>(self.v4, hint, pieces, xs, span, m, sums);
            } else {
                paired_tile::<M>(self.v4, hint, pieces, xs, span, m, sums);
            }
        }
        let (pieces, sums) = (pieces.remainder(), sums.into_remainder());
        if !pieces.is_empty() {
            paired_tile::<M>(self.v4, hint, pieces, xs, span, m, sums);
        }
    }
}

/// The most rows of `x` that [`two_panel_tile`] takes: `2 M` sums, two weight vectors and
/// one of `x` in AVX-512's 32 registers.
const TWO_PANEL_MAX_ROWS: usize = 14;

/// [`paired_tile`] over two panels' pieces at once (`pieces`: the first panel's piece,
/// then the second's; `sums`: their four rows' sums), each broadcast vector of `x` serving
/// both panels. With `STREAMS` each panel's weights are hinted in a stream of their own two
/// pieces ahead ([`SpanTile::TwoPanelStreams`]), else the next two pieces in address order
/// ([`SpanTile::TwoPanels`]); which is faster has depended on the memory's state
/// ([`crate::tiles`]). On Zen 5 the one-panel tile is bound by issuing its broadcasts (one per
/// multiply-add), not by the multiply-adds: on a product kept in L2 this took 9 rows at
/// 36 GB/s against 25.5 (7 rows 45 against 32). Every output keeps its operations and
/// their order, so its bits. A function of its own, not `paired_tile` generic over the
/// panel count: that one compiled to loops 0.5-0.65 as fast, for one panel as for two.
///
/// [`SpanTile::TwoPanelStreams`]: crate::SpanTile::TwoPanelStreams
/// [`SpanTile::TwoPanels`]: crate::SpanTile::TwoPanels
#[allow(clippy::needless_range_loop)]
#[inline(always)]
fn two_panel_tile<const M: usize, const STREAMS: bool>(
    v4: V4,
    hint: Hint,
    pieces: &[[f32x8; 4]],
    xs: &[[f32x8; 4]],
    span: usize,
    m: usize,
    sums: &mut [f32x8],
) {
    let (f, dq) = (v4.avx512f, v4.avx512dq);
    let pair = |low, high| pair_halves(v4, low, high);
    let (a, b_piece) = pieces.split_at(PANEL * span);
    let blocks = a
        .chunks_exact(PANEL)
        .zip(b_piece.chunks_exact(PANEL))
        .zip(xs.chunks_exact(M));
    let mut acc_a: [__m512; M] = std::array::from_fn(|u| pair(sums[u], sums[m + u]));
    let mut acc_b: [__m512; M] = std::array::from_fn(|u| pair(sums[2 * m + u], sums[3 * m + u]));
    for (b, ((wa, wb), xb)) in blocks.enumerate() {
        if STREAMS {
            // Each panel's own stream of hints, a block a block, two pieces (8 KB at the
            // 1.5B's spans) ahead: block `b` of the next tile's two pieces.
            for piece in [a, b_piece] {
                SpanRow(F32Row(piece, 0)).prefetch(*v4, hint, 2 * span + b);
            }
        } else {
            // The next two pieces in address order, a block of each a block: one stream.
            let next = a.as_ptr().wrapping_add(2 * PANEL * (span + b));
            prefetch_lines(*v4, hint, next.cast(), 2 * SpanRow::PANEL_BLOCK_BYTES);
        }
        for j in 0..4 {
            let (wa, wb) = (pair(wa[0][j], wa[1][j]), pair(wb[0][j], wb[1][j]));
            for u in 0..M {
                let xv = dq._mm512_broadcast_f32x8(cast(xb[u][j]));
                acc_a[u] = f._mm512_fmadd_ps(wa, xv, acc_a[u]);
                acc_b[u] = f._mm512_fmadd_ps(wb, xv, acc_b[u]);
            }
        }
    }
    for u in 0..M {
        (sums[u], sums[m + u]) = split_halves(v4, acc_a[u]);
        (sums[2 * m + u], sums[3 * m + u]) = split_halves(v4, acc_b[u]);
    }
}

/// Two rows' 8-lane sums (or weights) side by side in one 16-lane vector: `low` in lanes
/// 0-7, `high` in 8-15 ([`paired_tile`], [`two_panel_tile`]; attention's paired heads).
#[inline(always)]
pub(crate) fn pair_halves(v4: V4, low: f32x8, high: f32x8) -> __m512 {
    let (f, dq) = (v4.avx512f, v4.avx512dq);
    dq._mm512_insertf32x8::<1>(f._mm512_castps256_ps512(cast(low)), cast(high))
}

/// [`pair_halves`] undone: lanes 0-7 and 8-15 of `v`.
#[inline(always)]
pub(crate) fn split_halves(v4: V4, v: __m512) -> (f32x8, f32x8) {
    let (f, dq) = (v4.avx512f, v4.avx512dq);
    (
        cast(f._mm512_castps512_ps256(v)),
        cast(dq._mm512_extractf32x8_ps::<1>(v)),
    )
}

/// A panel's piece (`span` blocks) against the `M` rows of `x` in `xs`, adding to the
/// panel's sums (`sums[r * m + i]`), the panel's two weight rows side by side in 16-lane
/// vectors: lanes 0-7 hold row 0's 8-lane sums, lanes 8-15 row 1's, and each vector of
/// `x` is broadcast to both halves. Lane for lane, one 16-lane multiply-add is what two of
/// [`accumulate`]'s 8-lane ones do (same operands in the same order, so the same bits), in
/// half the instructions. Against one tile of `2 M` 8-lane sums, the 1.5B's products at 12
/// rows took 1.17–1.39 of one row's time against 1.21–1.57 (at 9 rows 0.99–1.15 against
/// 0.98–1.16; five alternated rounds, Zen 5, which issues two 16-lane multiply-adds a
/// cycle as it does 8-lane ones).
///
/// [`accumulate`]: super::widened::accumulate
#[allow(clippy::needless_range_loop)]
#[inline(always)]
fn paired_tile<const M: usize>(
    v4: V4,
    hint: Hint,
    piece: &[[f32x8; 4]],
    xs: &[[f32x8; 4]],
    span: usize,
    m: usize,
    sums: &mut [f32x8],
) {
    let (f, dq) = (v4.avx512f, v4.avx512dq);
    let pair = |low, high| pair_halves(v4, low, high);
    let mut acc: [__m512; M] = std::array::from_fn(|u| pair(sums[u], sums[m + u]));
    let row = SpanRow(F32Row(piece, 0));
    let ahead = PREFETCH_AHEAD_BYTES / SpanRow::PANEL_BLOCK_BYTES;
    let blocks = piece[..PANEL * span]
        .chunks_exact(PANEL)
        .zip(xs.chunks_exact(M));
    for (b, (w, xb)) in blocks.enumerate() {
        row.prefetch(*v4, hint, b + ahead);
        for j in 0..4 {
            let w = pair(w[0][j], w[1][j]);
            for u in 0..M {
                let xv = dq._mm512_broadcast_f32x8(cast(xb[u][j]));
                acc[u] = f._mm512_fmadd_ps(w, xv, acc[u]);
            }
        }
    }
    for u in 0..M {
        (sums[u], sums[m + u]) = split_halves(v4, acc[u]);
    }
}
