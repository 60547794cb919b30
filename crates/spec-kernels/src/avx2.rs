//! The AVX2 + FMA kernel (x86-64, through `pulp`'s safe intrinsics; detected at run time).
//!
//! Every format presents a weight row as blocks of 32 weights read as four f32 vectors, so one
//! register tile serves all three: a few weight rows × a few rows of `x`, each pair accumulating
//! an 8-lane partial dot product, reduced once at the end of the row.

#[cfg(target_arch = "x86_64")]
mod imp {
    use std::ops::Range;

    use pulp::bytemuck::cast_slice;
    use pulp::x86::V3;
    use pulp::{NullaryFnOnce, Simd, cast, f32x8, i8x16, u8x16, u32x8};

    use crate::pack::{BLOCK, PANEL, PackedMatrix, Storage};

    pub(crate) fn available() -> bool {
        V3::is_available()
    }

    /// A weight row as 32-weight blocks, each read as four f32 vectors of 8 consecutive weights.
    trait Row: Copy {
        /// Weights `32 b + 8 j .. 32 b + 8 j + 8` widened to f32, `j < 4`.
        fn part(self, simd: V3, b: usize, j: usize) -> f32x8;
        /// Asks for block `b` of this row's panel (every row of it) to be brought into L1.
        fn prefetch(self, simd: V3, b: usize);
        /// Bytes of one block of a whole panel (what [`Row::prefetch`] asks for).
        const PANEL_BLOCK_BYTES: usize;
        /// Whether a one-row tile (a decode step) prefetches too.
        const PREFETCH_ONE_ROW: bool;
        /// Registers [`Row::part`] needs besides the widened vector (a mask, a scale).
        const TEMPORARIES: usize = 1;
    }

    /// How far ahead of a tile its panels' weights are asked for: 4 KB of each panel. Measured
    /// on a 1.5B-sized product streamed from memory by both cores (docs/benchmarks.md): Q8_0 at
    /// one row 1.9 → 1.2 ms and bf16 2.4–2.9 → 2.2–2.3 ms against 8 blocks ahead for tiles of
    /// two or more rows only; 0.5–2 KB ahead was too little for the narrow formats, whose tiles
    /// consume few bytes per cycle, to cover memory latency.
    const PREFETCH_AHEAD_BYTES: usize = 4096;

    /// Hints the cache lines of the `bytes` bytes from `start` into L1. Only an address: nothing
    /// is read, so a hint past the end of the weights is harmless.
    #[inline(always)]
    fn prefetch_lines(simd: V3, start: *const u8, bytes: usize) {
        for line in (0..bytes).step_by(64) {
            simd.sse
                ._mm_prefetch::<{ core::arch::x86_64::_MM_HINT_T0 }>(
                    start.wrapping_add(line).cast(),
                );
        }
    }

    /// A row's panel (its blocks interleaved with the panel's other rows) and its place in it.
    #[derive(Clone, Copy)]
    struct F32Row<'a>(&'a [[f32x8; 4]], usize);

    impl Row for F32Row<'_> {
        const PANEL_BLOCK_BYTES: usize = PANEL * 128;
        // f32's one-row tile streams fast enough for the hardware prefetcher alone; hints
        // measured 0-7% slower.
        const PREFETCH_ONE_ROW: bool = false;
        const TEMPORARIES: usize = 0;

        #[inline(always)]
        fn part(self, _simd: V3, b: usize, j: usize) -> f32x8 {
            self.0[b * PANEL + self.1][j]
        }

        #[inline(always)]
        fn prefetch(self, simd: V3, b: usize) {
            prefetch_lines(
                simd,
                self.0.as_ptr().wrapping_add(b * PANEL).cast(),
                Self::PANEL_BLOCK_BYTES,
            );
        }
    }

    #[derive(Clone, Copy)]
    struct Bf16Row<'a>(&'a [[u32x8; 2]], usize);

    impl Row for Bf16Row<'_> {
        const PANEL_BLOCK_BYTES: usize = PANEL * 64;
        const PREFETCH_ONE_ROW: bool = true;

        #[inline(always)]
        fn part(self, simd: V3, b: usize, j: usize) -> f32x8 {
            let w = self.0[b * PANEL + self.1][j / 2];
            // High halves are weights 0..8 of each 16-chunk, low halves 8..16.
            if j.is_multiple_of(2) {
                cast(simd.and_u32x8(w, simd.splat_u32x8(0xFFFF_0000)))
            } else {
                cast(simd.shl_const_u32x8::<16>(w))
            }
        }

        #[inline(always)]
        fn prefetch(self, simd: V3, b: usize) {
            prefetch_lines(
                simd,
                self.0.as_ptr().wrapping_add(b * PANEL).cast(),
                Self::PANEL_BLOCK_BYTES,
            );
        }
    }

    #[derive(Clone, Copy)]
    struct Q8Row<'a> {
        /// A block's quants in order, as four words of 8.
        quants: &'a [[u64; 4]],
        scales: &'a [f32],
        lane: usize,
    }

    impl Row for Q8Row<'_> {
        const PANEL_BLOCK_BYTES: usize = PANEL * 32;
        const PREFETCH_ONE_ROW: bool = true;

        #[inline(always)]
        fn part(self, simd: V3, b: usize, j: usize) -> f32x8 {
            let word = self.quants[b * PANEL + self.lane][j];
            // One load that sign-extends the 8 quants to i32 lanes (`vpmovsxbd ymm, m64`).
            let q: i8x16 = cast([word, 0u64]);
            let q = simd.convert_i8x16_to_i32x8(q);
            let scale = simd.splat_f32x8(self.scales[b * PANEL + self.lane]);
            simd.mul_f32x8(simd.convert_i32x8_to_f32x8(q), scale)
        }

        #[inline(always)]
        fn prefetch(self, simd: V3, b: usize) {
            prefetch_lines(
                simd,
                self.quants.as_ptr().wrapping_add(b * PANEL).cast(),
                Self::PANEL_BLOCK_BYTES,
            );
            // A panel's scales: 8 bytes a block, a cache line every 8 blocks.
            if b.is_multiple_of(8) {
                prefetch_lines(
                    simd,
                    self.scales.as_ptr().wrapping_add(b * PANEL).cast(),
                    64,
                );
            }
        }
    }

    #[derive(Clone, Copy)]
    struct Q4Row<'a> {
        /// A block's quants as two words of 16 nibbles (see `Storage::Q4`).
        quants: &'a [[u64; 2]],
        /// A block's `[scale, min]`.
        params: &'a [[f32; 2]],
        lane: usize,
    }

    impl Row for Q4Row<'_> {
        const PANEL_BLOCK_BYTES: usize = PANEL * 16;
        const PREFETCH_ONE_ROW: bool = true;
        // Scale, minimum and the nibble mask.
        const TEMPORARIES: usize = 3;

        #[inline(always)]
        fn part(self, simd: V3, b: usize, j: usize) -> f32x8 {
            let at = b * PANEL + self.lane;
            // Vectors j and j + 2 come from the same word (the compiler loads it once).
            let word: u8x16 = cast([self.quants[at][j % 2], 0u64]);
            let bytes = simd.convert_u8x16_to_u32x8(word);
            let q = if j < 2 {
                simd.and_u32x8(bytes, simd.splat_u32x8(0xF))
            } else {
                simd.shr_const_u32x8::<4>(bytes)
            };
            let [scale, min] = self.params[at];
            simd.mul_add_f32x8(
                simd.convert_i32x8_to_f32x8(cast(q)),
                simd.splat_f32x8(scale),
                simd.splat_f32x8(min),
            )
        }

        #[inline(always)]
        fn prefetch(self, simd: V3, b: usize) {
            prefetch_lines(
                simd,
                self.quants.as_ptr().wrapping_add(b * PANEL).cast(),
                Self::PANEL_BLOCK_BYTES,
            );
            // A panel's parameters: 16 bytes a block, a cache line every 4 blocks.
            if b.is_multiple_of(4) {
                prefetch_lines(
                    simd,
                    self.params.as_ptr().wrapping_add(b * PANEL).cast(),
                    64,
                );
            }
        }
    }

    /// The dot products of `rows` with `xs`, `out[r][i] = rows[r] · xs[i]`.
    ///
    /// Per vector of a block, the `M` vectors of `x` are loaded once and each widened weight
    /// vector is used `M` times: `RR + M` loads for `RR × M` FMAs, and the `RR × M` accumulators,
    /// `M` vectors of `x` and one of weights fit in the 16 AVX registers for the shapes used
    /// (4 × 1, 4 × 2, 2 × 3, 2 × 4, and 2 × 5 in f32). For 2 × 5 in bf16 and Q8_0 they do not
    /// (widening needs a mask or a scale too; that tile spilled), so it holds the `RR` widened
    /// weight vectors instead and reads each vector of `x` where an FMA uses it. Every shape
    /// does the same operations in the same order for a given output, so a row's bits do not
    /// depend on the tile. Sums are reduced horizontally once, at the end of the rows.
    // Index loops over the register tile: fixed trip counts the compiler unrolls.
    #[allow(clippy::needless_range_loop)]
    #[inline(always)]
    fn tile<W: Row, const RR: usize, const M: usize>(
        simd: V3,
        rows: &[W; RR],
        xs: &[&[[f32x8; 4]]; M],
        blocks: usize,
    ) -> [[f32; M]; RR] {
        // Accumulators, `x`, a weight vector and its temporaries within the 16 registers.
        let hold_x = RR * M + M + 1 + W::TEMPORARIES <= 16;
        let zero = simd.splat_f32x8(0.0);
        let mut acc = [[zero; M]; RR];
        for b in 0..blocks {
            if M >= 2 || W::PREFETCH_ONE_ROW {
                let ahead = PREFETCH_AHEAD_BYTES / W::PANEL_BLOCK_BYTES;
                // One hint per panel of the tile (rows r and r + 1 share a panel).
                for r in (0..RR).step_by(PANEL) {
                    rows[r].prefetch(simd, b + ahead);
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
        let mut out = [[0.0f32; M]; RR];
        for r in 0..RR {
            for i in 0..M {
                out[r][i] = simd.reduce_sum_f32s(acc[r][i]);
            }
        }
        out
    }

    /// Weight rows `r..r + RR` against rows `i..i + M` of `x`, written into `outs`.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    fn run_tile<'x, W: Row, const RR: usize, const M: usize>(
        simd: V3,
        row: &impl Fn(usize) -> W,
        r: usize,
        col: usize,
        i: usize,
        x_row: &impl Fn(usize) -> &'x [[f32x8; 4]],
        blocks: usize,
        outs: &mut [&mut [f32]],
    ) {
        let ws: [W; RR] = std::array::from_fn(|t| row(r + t));
        let xs: [&[[f32x8; 4]]; M] = std::array::from_fn(|t| x_row(i + t));
        let out = tile(simd, &ws, &xs, blocks);
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
    fn run_rows<'x, W: Row, const RR: usize, const MX: usize>(
        simd: V3,
        row: &impl Fn(usize) -> W,
        r: usize,
        col: usize,
        x_row: &impl Fn(usize) -> &'x [[f32x8; 4]],
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
                    run_tile::<W, RR, 3>(simd, row, r, col, i, x_row, blocks, outs);
                    i += 3;
                } else if m - i == 5 {
                    run_tile::<W, RR, 5>(simd, row, r, col, i, x_row, blocks, outs);
                    i += 5;
                } else {
                    run_tile::<W, RR, 4>(simd, row, r, col, i, x_row, blocks, outs);
                    i += 4;
                }
            }
        }
        while i + 2 <= m {
            run_tile::<W, RR, 2>(simd, row, r, col, i, x_row, blocks, outs);
            i += 2;
        }
        if i < m {
            run_tile::<W, RR, 1>(simd, row, r, col, i, x_row, blocks, outs);
        }
    }

    /// Runs the tiles over weight rows `rows` for every row of `x`: 4 weight rows × 1 or 2 rows
    /// of `x` for one or two rows; from three rows on, 2 weight rows (one panel) × up to 4 rows
    /// of `x` (5 when 5 are left), so each widened weight vector serves several FMAs.
    #[inline(always)]
    fn sweep<W: Row>(
        simd: V3,
        row: impl Fn(usize) -> W,
        rows: Range<usize>,
        x: &[[f32x8; 4]],
        blocks: usize,
        m: usize,
        outs: &mut [&mut [f32]],
    ) {
        let x_row = |i: usize| &x[i * blocks..(i + 1) * blocks];
        let start = rows.start;
        let mut r = rows.start;
        if m >= 3 {
            while rows.end - r >= 2 {
                run_rows::<W, 2, 4>(simd, &row, r, r - start, &x_row, blocks, m, outs);
                r += 2;
            }
        }
        while rows.end - r >= 4 {
            run_rows::<W, 4, 2>(simd, &row, r, r - start, &x_row, blocks, m, outs);
            r += 4;
        }
        while r < rows.end {
            run_rows::<W, 1, 2>(simd, &row, r, r - start, &x_row, blocks, m, outs);
            r += 1;
        }
    }

    /// The blocks of the panel holding row `r` (`blocks` blocks a row, one unit each).
    #[inline(always)]
    fn panel<T>(all: &[T], r: usize, blocks: usize) -> &[T] {
        let p = r / PANEL;
        &all[p * blocks * PANEL..(p + 1) * blocks * PANEL]
    }

    struct Job<'a, 'b> {
        simd: V3,
        mat: &'a PackedMatrix,
        rows: Range<usize>,
        x: &'a [f32],
        m: usize,
        outs: &'a mut [&'b mut [f32]],
    }

    impl NullaryFnOnce for Job<'_, '_> {
        type Output = ();

        #[inline(always)]
        fn call(self) {
            let Job {
                simd,
                mat,
                rows,
                x,
                m,
                outs,
            } = self;
            let kp = mat.padded_cols();
            let blocks = kp / BLOCK;
            let x: &[[f32x8; 4]] = cast_slice(x);

            match &mat.storage {
                Storage::F32(w) => {
                    let w: &[[f32x8; 4]] = cast_slice(w);
                    let row = |r: usize| F32Row(panel(w, r, blocks), r % PANEL);
                    sweep(simd, row, rows, x, blocks, m, outs);
                }
                Storage::Bf16(w) => {
                    let w: &[[u32x8; 2]] = cast_slice(w);
                    let row = |r: usize| Bf16Row(panel(w, r, blocks), r % PANEL);
                    sweep(simd, row, rows, x, blocks, m, outs);
                }
                Storage::Q8_0 { quants, scales } => {
                    let quants: &[[u64; 4]] = cast_slice(quants);
                    let row = |r: usize| Q8Row {
                        quants: panel(quants, r, blocks),
                        scales: panel(scales, r, blocks),
                        lane: r % PANEL,
                    };
                    sweep(simd, row, rows, x, blocks, m, outs);
                }
                Storage::Q4 { quants, params } => {
                    let quants: &[[u64; 2]] = cast_slice(quants);
                    let row = |r: usize| Q4Row {
                        quants: panel(quants, r, blocks),
                        params: panel(params, r, blocks),
                        lane: r % PANEL,
                    };
                    sweep(simd, row, rows, x, blocks, m, outs);
                }
            }
        }
    }

    /// `outs[i][r - rows.start] = x[i] · W[r]`; `x` is `[m, padded_cols]`.
    pub(crate) fn run(
        mat: &PackedMatrix,
        rows: Range<usize>,
        x: &[f32],
        m: usize,
        outs: &mut [&mut [f32]],
    ) {
        match V3::try_new() {
            Some(simd) => simd.vectorize(Job {
                simd,
                mat,
                rows,
                x,
                m,
                outs,
            }),
            None => crate::scalar::run(mat, rows, x, m, outs),
        }
    }
}

#[cfg(not(target_arch = "x86_64"))]
mod imp {
    use std::ops::Range;

    use crate::pack::PackedMatrix;

    pub(crate) fn available() -> bool {
        false
    }

    pub(crate) fn run(
        mat: &PackedMatrix,
        rows: Range<usize>,
        x: &[f32],
        m: usize,
        outs: &mut [&mut [f32]],
    ) {
        crate::scalar::run(mat, rows, x, m, outs);
    }
}

pub(crate) use imp::{available, run};
