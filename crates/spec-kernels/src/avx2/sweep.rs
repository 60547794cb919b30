//! What every register tile shares: [`Tiles`] (a tile's arithmetic) and [`sweep`], which runs
//! it over a product's weight rows and rows of `x` in tiles of one to three panels.

use std::ops::Range;

use pulp::x86::V3;

/// A register tile's arithmetic: `out[r][i] = rows[r] · xs[i]` for `RR` weight rows and
/// `M` rows of `x`, each handed over as the tile reads it.
pub(super) trait Tiles: Copy {
    type W: Copy;
    type X: Copy;
    /// Whether [`tall_tiles`] may ask for tiles of two panels. Not for the integer tiles:
    /// compiled in at all, the 4 × 4 shape made their other shapes 1.09–1.18 slower
    /// (superblocks, 3 to 8 rows, with the 4 × 4 tile never run), and run, it gained nothing.
    ///
    /// [`tall_tiles`]: super::tall_tiles
    const TALL: bool = false;
    /// Whether tall tiles take three panels (6 weight rows) for up to
    /// [`THREE_PANELS_MAX_ROWS`] rows of `x`: f32 weights, which need no registers to widen.
    const THREE_PANELS: bool = false;
    fn tile<const RR: usize, const M: usize>(
        self,
        simd: V3,
        rows: &[Self::W; RR],
        xs: &[Self::X; M],
        blocks: usize,
    ) -> [[f32; M]; RR];
}

/// Weight rows `r..r + RR` against rows `i..i + M` of `x`, written into `outs`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(super) fn run_tile<T: Tiles, const RR: usize, const M: usize>(
    simd: V3,
    tiles: T,
    row: &impl Fn(usize) -> T::W,
    r: usize,
    col: usize,
    i: usize,
    x_row: &impl Fn(usize) -> T::X,
    blocks: usize,
    outs: &mut [&mut [f32]],
) {
    // Plain loops rather than `array::from_fn`, whose wrapper around `row` the compiler does
    // not inline for a Q4 row, which holds a slice of minimums (2.4% of a `q4-a8` pass).
    let mut ws = [row(r); RR];
    for (t, w) in ws.iter_mut().enumerate().skip(1) {
        *w = row(r + t);
    }
    let mut xs = [x_row(i); M];
    for (t, x) in xs.iter_mut().enumerate().skip(1) {
        *x = x_row(i + t);
    }
    let out = tiles.tile(simd, &ws, &xs, blocks);
    for (t, o) in out.iter().enumerate() {
        for (u, v) in o.iter().enumerate() {
            outs[i + u][col + t] = *v;
        }
    }
}

/// Weight rows `r..r + RR` against every row of `x`: tiles of `MX` (4 or 2) rows of `x`
/// (with `MX` 4, a last 3 or 5 in one tile), then 2 and 1 for the rest.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn run_rows<T: Tiles, const RR: usize, const MX: usize>(
    simd: V3,
    tiles: T,
    row: &impl Fn(usize) -> T::W,
    r: usize,
    col: usize,
    x_row: &impl Fn(usize) -> T::X,
    blocks: usize,
    m: usize,
    outs: &mut [&mut [f32]],
) {
    let mut i = 0;
    if MX == 4 {
        // Three or five rows left (a verification of K = 2 or 4) take one pass over these
        // weight rows, not two.
        while m - i >= 3 {
            if m - i == 3 {
                run_tile::<T, RR, 3>(simd, tiles, row, r, col, i, x_row, blocks, outs);
                i += 3;
            } else if m - i == 5 {
                run_tile::<T, RR, 5>(simd, tiles, row, r, col, i, x_row, blocks, outs);
                i += 5;
            } else {
                run_tile::<T, RR, 4>(simd, tiles, row, r, col, i, x_row, blocks, outs);
                i += 4;
            }
        }
    }
    while i + 2 <= m {
        run_tile::<T, RR, 2>(simd, tiles, row, r, col, i, x_row, blocks, outs);
        i += 2;
    }
    if i < m {
        run_tile::<T, RR, 1>(simd, tiles, row, r, col, i, x_row, blocks, outs);
    }
}

/// Runs the tiles over weight rows `rows` for every row of `x`: tiles of one panel (2
/// weight rows) × every row of `x` (4 at a time, 5 when 5 are left), so each weight vector
/// serves several multiply-adds; with `tall` (see [`tall_tiles`]), tiles of three panels
/// (f32 up to 5 rows: 6 weight rows) or two (4 weight rows) × 4 rows of `x` (3 or 5 for the
/// last), then two and one for the panels left.
///
/// A tile of one panel reads its weights as one sequential stream. Against tiles of two
/// panels (two streams, each a few KB long before the next tile) and f32's passes of 8
/// weight rows, a reference model's products took 0.70–0.89 of the time at one row in every
/// format and 0.77–0.91 at two rows (SmolLM2 in `q4-a8` 1.04) (docs/benchmarks.md at eb9f17b,
/// "Tiles of one panel"). For the grouped superblocks tiles of 4 × 2 took 1.2 of 2 × 2's time
/// (the 1.5B's forward(2) 48.7–50.3 ms against 40.1–41.1; docs/benchmarks.md at 6aef5e8,
/// "Integer sums 8 blocks at a time").
///
/// [`tall_tiles`]: super::tall_tiles
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(super) fn sweep<T: Tiles>(
    simd: V3,
    tall: bool,
    tiles: T,
    row: impl Fn(usize) -> T::W,
    rows: Range<usize>,
    x_row: impl Fn(usize) -> T::X,
    blocks: usize,
    m: usize,
    outs: &mut [&mut [f32]],
) {
    let start = rows.start;
    let mut r = rows.start;
    if T::TALL && tall {
        while T::THREE_PANELS && m <= THREE_PANELS_MAX_ROWS && rows.end - r >= 6 {
            run_rows::<T, 6, 4>(simd, tiles, &row, r, r - start, &x_row, blocks, m, outs);
            r += 6;
        }
        while rows.end - r >= 4 {
            run_rows::<T, 4, 4>(simd, tiles, &row, r, r - start, &x_row, blocks, m, outs);
            r += 4;
        }
    }
    while rows.end - r >= 2 {
        run_rows::<T, 2, 4>(simd, tiles, &row, r, r - start, &x_row, blocks, m, outs);
        r += 2;
    }
    while r < rows.end {
        run_rows::<T, 1, 2>(simd, tiles, &row, r, r - start, &x_row, blocks, m, outs);
        r += 1;
    }
}

/// The most rows of `x` (a verification of K = 4) that f32's tall tiles take in three
/// panels: against two, the 1.5B's f32 products took 0.87–0.94 of the time at 4 and 5 rows
/// (`bench-forward`: forward(4) and forward(5) 0.86–0.97), 0.97–1.0 at 6 to 16, and a
/// 128-token prompt in passes of 64 1.12 (bf16 and Q4 took 1.02–1.17 from 5 rows).
const THREE_PANELS_MAX_ROWS: usize = 5;
