//! The AVX2 + FMA kernel (x86-64, through `pulp`'s safe intrinsics; detected at run time).
//!
//! Every format presents a weight row as blocks of 32 weights read as four f32 vectors, so one
//! register tile serves them all: a few weight rows × a few rows of `x`, each pair accumulating
//! an 8-lane partial dot product, reduced once at the end of the row. The integer formats also
//! present a block as 32 bytes, for the tiles that multiply them by `x` rounded to int8 (the
//! `*A8` formats): one a block (Q4's per-block layout), or, for the grouped layouts (`Q8_0A8`,
//! Q4_K and Q6_K superblocks), one that sums 8 blocks at once, each in its own lane, with
//! `vpdpbusd` where the CPU has AVX512-VNNI; the same driver runs every tile.

#[cfg(target_arch = "x86_64")]
pub(crate) mod imp {
    use std::marker::PhantomData;
    use std::ops::Range;

    use core::arch::x86_64::{__m128i, __m256i, __m512, __m512i};
    use pulp::bytemuck::cast_slice;
    use pulp::core_arch::x86::Avx512vnni;
    use pulp::x86::{V3, V4};

    use pulp::{NullaryFnOnce, Simd, cast, f32x8, i8x16, i32x8, u8x16, u32x8};

    use crate::activations::{Interleave, QuantizedRows, RoundOps};
    use crate::pack::{BLOCK, GROUP, PANEL, PackedMatrix, SPAN_GROUP, Storage, span_width};
    use crate::tiles::SpanTile;

    pub(crate) fn available() -> bool {
        V3::is_available()
    }

    /// Which tiles [`run`] takes with `avx512` on this CPU (see [`crate::instruction_set`]).
    pub(crate) fn instruction_set() -> &'static str {
        if V3::try_new().is_none() {
            "portable"
        } else if V4::try_new().is_none() {
            "AVX2 + FMA"
        } else if vnni().is_some() {
            "AVX-512 with VNNI"
        } else {
            "AVX-512"
        }
    }

    /// A weight row as 32-weight blocks, each read as four f32 vectors of 8 consecutive weights.
    trait Row: Copy {
        /// Weights `32 b + 8 j .. 32 b + 8 j + 8` widened to f32, `j < 4`.
        fn part(self, simd: V3, b: usize, j: usize) -> f32x8;
        /// Asks for block `b` of this row's panel (every row of it) with `hint`'s instruction.
        fn prefetch(self, simd: V3, hint: Hint, b: usize);
        /// Bytes of one block of a whole panel (what [`Row::prefetch`] asks for).
        const PANEL_BLOCK_BYTES: usize;
        /// The fewest rows of `x` for which a tile hints its weights ahead ([`Row::prefetch`])
        /// where the hints are non-temporal; hinted into L1, every tile hints
        /// ([`hints_weights`]).
        const NON_TEMPORAL_FROM_ROWS: usize;
        /// Registers [`Row::part`] needs besides the widened vector (a mask, a scale).
        const TEMPORARIES: usize = 1;
        /// The instruction this row's tiles hint with where the CPU's is `cpu`
        /// ([`Hint::of_cpu`]).
        #[inline(always)]
        fn hint(cpu: Hint) -> Hint {
            cpu
        }
    }

    /// How far ahead of a tile its panels' weights are asked for: 4 KB of each panel. Measured
    /// on a 1.5B-sized product streamed from memory by both cores (docs/benchmarks.md): Q8_0 at
    /// one row 1.9 → 1.2 ms and bf16 2.4–2.9 → 2.2–2.3 ms against 8 blocks ahead for tiles of
    /// two or more rows only; 0.5–2 KB ahead was too little for the narrow formats, whose tiles
    /// consume few bytes per cycle, to cover memory latency.
    const PREFETCH_AHEAD_BYTES: usize = 4096;

    /// How far ahead the grouped tiles ([`tile_grouped`]) ask for their panels' weights: 8 KB
    /// of each panel. Chosen when these hints went into L2 only (`T1`): against 4 KB into L1,
    /// on a 1.5B-sized product streamed from memory by both cores, 1536 × 8960 at 4 rows 66 →
    /// 101 G multiply-adds a second, 8960 × 1536 105 → 122, one row 29 → 37 and 33 → 38
    /// (docs/benchmarks.md, twenty-first session); the hint is now the CPU vendor's
    /// ([`weights_hint_non_temporal`]).
    const GROUPED_PREFETCH_AHEAD_BYTES: usize = 8192;

    /// How tiles hint their weights, chosen once a process by the CPU's vendor
    /// ([`weights_hint_non_temporal`]).
    ///
    /// On AMD, non-temporal (`prefetchnta`). A decode step reads each weight once, and weights
    /// hinted into L1 or L2 (`T0`, `T1`) were written back into L2 and AMD's victim L3 on
    /// eviction, pushing out what the next product and the next step read again (the KV
    /// cache, the rows of `x`, the outputs); AMD describes a non-temporal prefetch that misses
    /// L2 as filling L1 alone, dropped on eviction (its K8 guide). Against `T0` / `T1` on the
    /// Zen 5 (`spec bench-forward`, alternated builds, docs/benchmarks.md, forty-eighth
    /// session): SmolLM2 in `q8_0-a8` one row 3.69 → 3.48 ms, the 0.5B one row 12.5 → 11.7 ms;
    /// the 1.5B in f32 (hints from 3 rows on) level.
    ///
    /// Elsewhere into L1 (`prefetcht0`): on an Intel Xeon (family 6, model 207) non-temporal
    /// hints took the 0.5B's one-row pass in `q8_0-a8` from 31-34 ms to 50-62 ms and the 1.5B's
    /// 9-row pass in f32 from 1.05-1.10 of a one-row pass to 2.46 (docs/benchmarks.md,
    /// forty-ninth session): Intel's non-temporal prefetch fills L1 without the L2 streamer's
    /// help, and a core's few L1 fill buffers then bound the bytes in flight.
    fn weights_hint_non_temporal() -> bool {
        static NON_TEMPORAL: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        *NON_TEMPORAL.get_or_init(|| {
            // The vendor's name, "AuthenticAMD", in EBX, EDX, ECX.
            let vendor = core::arch::x86_64::__cpuid(0);
            let word = |name: &[u8; 4]| u32::from_le_bytes(*name);
            (vendor.ebx, vendor.edx, vendor.ecx) == (word(b"Auth"), word(b"enti"), word(b"cAMD"))
        })
    }

    /// Whether a tile of `rows` rows of `x` over weight rows `W` hints its weights ahead.
    /// Non-temporal hints (AMD) pay only from [`Row::NON_TEMPORAL_FROM_ROWS`]; hints into L1
    /// or L2 ([`SpanRow::hint`]) from one row. Into L1, against none: on the Intel Xeon
    /// (family 6, model 207) f32 passes of one row took 312-319 ms against 334-377 ms unhinted
    /// for the 1.5B (whose spans now hint into L2), 22-28 ms against 27-33 ms for SmolLM2
    /// (`spec bench-forward`, alternated, docs/benchmarks.md, fiftieth session).
    #[inline(always)]
    fn hints_weights<W: Row>(hint: Hint, rows: usize) -> bool {
        matches!(hint, Hint::IntoL1 | Hint::IntoL2) || rows >= W::NON_TEMPORAL_FROM_ROWS
    }

    /// The instruction a tile hints its weights with ([`weights_hint_non_temporal`]), looked
    /// up once a tile, outside its loops: looked up at each hint, the lookup's first-use path
    /// (a call) stayed in the loops, which then kept their sums on the stack across it; the
    /// one-row `q8_0-a8` group loop took 186 instructions against 80, and on the Intel Xeon
    /// (family 6, model 207) ran 26.8 against 37.7 GB/s held in L2 (docs/benchmarks.md,
    /// fifty-first session).
    #[derive(Clone, Copy)]
    enum Hint {
        /// `prefetchnta` (AMD).
        NonTemporal,
        /// `prefetcht0` (elsewhere).
        IntoL1,
        /// `prefetcht1`: f32 rows in spans ([`SpanRow::hint`]).
        IntoL2,
    }

    impl Hint {
        #[inline(always)]
        fn of_cpu() -> Hint {
            if weights_hint_non_temporal() {
                Hint::NonTemporal
            } else {
                Hint::IntoL1
            }
        }
    }

    /// Hints the cache lines of the `bytes` bytes from `start` with `hint`'s instruction. Only
    /// an address: nothing is read, so a hint past the end of the weights is harmless.
    #[inline(always)]
    fn prefetch_lines(simd: V3, hint: Hint, start: *const u8, bytes: usize) {
        use core::arch::x86_64::{_MM_HINT_NTA, _MM_HINT_T0, _MM_HINT_T1};
        let lines = (0..bytes)
            .step_by(64)
            .map(|line| start.wrapping_add(line).cast());
        match hint {
            Hint::NonTemporal => lines.for_each(|a| simd.sse._mm_prefetch::<_MM_HINT_NTA>(a)),
            Hint::IntoL1 => lines.for_each(|a| simd.sse._mm_prefetch::<_MM_HINT_T0>(a)),
            Hint::IntoL2 => lines.for_each(|a| simd.sse._mm_prefetch::<_MM_HINT_T1>(a)),
        }
    }

    /// Asks for block `b` of a quantized panel: its quants (`PANEL` units of `Q` a block) and,
    /// once a cache line, its per-block scales (`PANEL` units of `S` a block; Q8_0's 8 bytes a
    /// block fill a line every 8 blocks, Q4's 16 bytes every 4).
    #[inline(always)]
    fn prefetch_quantized<Q, S>(simd: V3, hint: Hint, quants: &[Q], side: &[S], b: usize) {
        prefetch_lines(
            simd,
            hint,
            quants.as_ptr().wrapping_add(b * PANEL).cast(),
            PANEL * size_of::<Q>(),
        );
        let blocks_a_line = (64 / (PANEL * size_of::<S>())).max(1);
        if b.is_multiple_of(blocks_a_line) {
            prefetch_lines(simd, hint, side.as_ptr().wrapping_add(b * PANEL).cast(), 64);
        }
    }

    /// A row's panel (its blocks interleaved with the panel's other rows) and its place in it.
    #[derive(Clone, Copy)]
    struct F32Row<'a>(&'a [[f32x8; 4]], usize);

    impl Row for F32Row<'_> {
        const PANEL_BLOCK_BYTES: usize = PANEL * 128;
        // On AMD f32's tiles of one and two rows stream fast enough for the hardware
        // prefetcher alone: hints measured 0-7% slower at one row (Zen 4), and at two the
        // 1.5B's products took 1.24-1.27 of one row's time with them against 1.15 without
        // (Zen 3, docs/benchmarks.md, twenty-fourth session). From three rows on they pay.
        const NON_TEMPORAL_FROM_ROWS: usize = 3;
        const TEMPORARIES: usize = 0;

        #[inline(always)]
        fn part(self, _simd: V3, b: usize, j: usize) -> f32x8 {
            self.0[b * PANEL + self.1][j]
        }

        #[inline(always)]
        fn prefetch(self, simd: V3, hint: Hint, b: usize) {
            prefetch_lines(
                simd,
                hint,
                self.0.as_ptr().wrapping_add(b * PANEL).cast(),
                Self::PANEL_BLOCK_BYTES,
            );
        }
    }

    /// An [`F32Row`] in a span's piece of a panel ([`spanned_sweep`]).
    #[derive(Clone, Copy)]
    struct SpanRow<'a>(F32Row<'a>);

    impl SpanRow<'_> {
        /// The hint of AVX-512's tiles of a span ([`two_panel_tile`], [`paired_tile`]): as
        /// [`SpanRow::hint`], but for AMD, where they stay non-temporal as they were measured on
        /// the Zen 5 (thirty-first to thirty-third sessions); into L2 there is not measured.
        #[inline(always)]
        fn wide_hint(cpu: Hint) -> Hint {
            match cpu {
                Hint::NonTemporal => Hint::NonTemporal,
                other => <Self as Row>::hint(other),
            }
        }
    }

    impl Row for SpanRow<'_> {
        const PANEL_BLOCK_BYTES: usize = F32Row::PANEL_BLOCK_BYTES;
        // Not consulted: `hints_weights` sees spans hint only into L2 ([`SpanRow::hint`]; the
        // AVX-512 tiles hint without asking it). Before, on AMD
        // two rows took 0.88-1.01 of one row's time hinted so against 1.05-1.12 unhinted (the
        // 1.5B's products, Zen 3, docs/benchmarks.md, twenty-fifth session).
        const NON_TEMPORAL_FROM_ROWS: usize = 2;
        const TEMPORARIES: usize = 0;

        #[inline(always)]
        fn part(self, simd: V3, b: usize, j: usize) -> f32x8 {
            self.0.part(simd, b, j)
        }

        /// Into L2 (`prefetcht1`) on every CPU, at every row count. On AMD not non-temporal: on
        /// the Zen 4 of the fifty-fourth session (AVX2 only) the 1.5B's products from memory
        /// (`model_products`, one-panel tiles, three alternated runs) took 181-237 ms against
        /// 221-253 at 2 rows, 272-320 against 346-384 at 5 and 471-547 against 580-616 at 9.
        /// On Intel not into L1: on the Xeon of the fifty-sixth session (family 6, model 167 as
        /// its VM reports it) the 1.5B's f32 passes (`spec bench-forward`, two alternated
        /// rounds) took 216 ms against 232-237 at one row, 234-236 against 269-270 at 3 rows,
        /// 242-243 against 256-260 at 5 and 273-276 against 281-288 at 9 (docs/benchmarks.md).
        #[inline(always)]
        fn hint(_cpu: Hint) -> Hint {
            Hint::IntoL2
        }

        #[inline(always)]
        fn prefetch(self, simd: V3, hint: Hint, b: usize) {
            self.0.prefetch(simd, hint, b);
        }
    }

    #[derive(Clone, Copy)]
    struct Bf16Row<'a>(&'a [[u32x8; 2]], usize);

    impl Row for Bf16Row<'_> {
        const PANEL_BLOCK_BYTES: usize = PANEL * 64;
        const NON_TEMPORAL_FROM_ROWS: usize = 1;

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
        fn prefetch(self, simd: V3, hint: Hint, b: usize) {
            prefetch_lines(
                simd,
                hint,
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
        const NON_TEMPORAL_FROM_ROWS: usize = 1;

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
        fn prefetch(self, simd: V3, hint: Hint, b: usize) {
            prefetch_quantized(simd, hint, self.quants, self.scales, b);
        }
    }

    /// Where a Q4 row's block scales and minimums are kept (see `Storage::Q4` and
    /// `Storage::Q4A8`).
    trait Q4Side: Copy {
        /// Block `at` of the panel (block `b` of the row): its scale and minimum.
        fn scale_min(self, at: usize, b: usize) -> (f32, f32);
        fn prefetch(self, simd: V3, hint: Hint, quants: &[[u64; 2]], b: usize);
    }

    /// `[scale, min]` a block in the panels (`q4`, which widens the weights).
    #[derive(Clone, Copy)]
    struct Pairs<'a>(&'a [[f32; 2]]);

    impl Q4Side for Pairs<'_> {
        #[inline(always)]
        fn scale_min(self, at: usize, _b: usize) -> (f32, f32) {
            let [scale, min] = self.0[at];
            (scale, min)
        }

        #[inline(always)]
        fn prefetch(self, simd: V3, hint: Hint, quants: &[[u64; 2]], b: usize) {
            prefetch_quantized(simd, hint, quants, self.0, b);
        }
    }

    /// Scales in the panels, every row's minimums apart and where this row's begin (`q4-a8`).
    #[derive(Clone, Copy)]
    struct Apart<'a> {
        scales: &'a [f32],
        mins: &'a [f32],
        first_min: usize,
    }

    impl Q4Side for Apart<'_> {
        #[inline(always)]
        fn scale_min(self, at: usize, b: usize) -> (f32, f32) {
            (self.scales[at], self.mins[self.first_min + b])
        }

        #[inline(always)]
        fn prefetch(self, simd: V3, hint: Hint, quants: &[[u64; 2]], b: usize) {
            prefetch_quantized(simd, hint, quants, self.scales, b);
        }
    }

    #[derive(Clone, Copy)]
    struct Q4Row<'a, S> {
        /// A block's quants as two words of 16 nibbles (see `Storage::Q4`).
        quants: &'a [[u64; 2]],
        side: S,
        lane: usize,
    }

    impl<S: Q4Side> Row for Q4Row<'_, S> {
        const PANEL_BLOCK_BYTES: usize = PANEL * 16;
        const NON_TEMPORAL_FROM_ROWS: usize = 1;
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
            let (scale, min) = self.side.scale_min(at, b);
            simd.mul_add_f32x8(
                simd.convert_i32x8_to_f32x8(cast(q)),
                simd.splat_f32x8(scale),
                simd.splat_f32x8(min),
            )
        }

        #[inline(always)]
        fn prefetch(self, simd: V3, hint: Hint, b: usize) {
            self.side.prefetch(simd, hint, self.quants, b);
        }
    }

    /// A row of Q4_K superblocks kept as they are (see `Storage::Q4K`).
    #[derive(Clone, Copy)]
    struct Q4KRow<'a> {
        /// The panel's grouped nibbles, 32-byte loads (see `Storage::Q4K`).
        quants: &'a [[u64; 4]],
        /// The panel's superblocks' 6-bit scales (8 bytes a word) and steps.
        scales: &'a [u64],
        steps: &'a [f32],
        /// This row's superblocks' minimums (8 bytes a word) and negated minimum steps.
        mins: &'a [u64],
        neg_min_steps: &'a [f32],
        lane: usize,
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
    fn tile<W: Row, const RR: usize, const M: usize>(
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
    fn accumulate<W: Row, const RR: usize, const M: usize>(
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

    /// A register tile's arithmetic: `out[r][i] = rows[r] · xs[i]` for `RR` weight rows and
    /// `M` rows of `x`, each handed over as the tile reads it.
    trait Tiles: Copy {
        type W: Copy;
        type X: Copy;
        /// Whether [`tall_tiles`] may ask for tiles of two panels. Not for the integer tiles:
        /// compiled in at all, the 4 × 4 shape made their other shapes 1.09–1.18 slower
        /// (superblocks, 3 to 8 rows, with the 4 × 4 tile never run), and run, it gained nothing.
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

    /// Weight rows `r..r + RR` against rows `i..i + M` of `x`, written into `outs`.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    fn run_tile<T: Tiles, const RR: usize, const M: usize>(
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
        // Plain loops rather than `array::from_fn`, whose wrapper around `row` the compiler
        // stopped inlining once a Q4 row grew a slice of minimums (2.4% of a `q4-a8` pass).
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
    /// serves several multiply-adds; with `tall` (see [`tall_tiles`]), tiles of three panels (f32 up to 5 rows: 6 weight
    /// rows) or two (4 weight rows) × 4 rows of `x` (3 or 5 for the last), then two and one for
    /// the panels left.
    ///
    /// A tile of one panel reads its weights as one sequential stream. Against tiles of two
    /// panels (two streams, each a few KB long before the next tile) and f32's passes of 8
    /// weight rows, a reference model's products took 0.70–0.89 of the time at one row in every
    /// format and 0.77–0.91 at two rows (SmolLM2 in `q4-a8` 1.04) (docs/benchmarks.md,
    /// seventeenth session). Superblocks, whose old tile took 4 × 2 for two rows, run grouped
    /// since the twentieth session, where 4 × 2 took 1.2 of 2 × 2's time (the 1.5B's
    /// forward(2) 48.7–50.3 ms against 40.1–41.1).
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    fn sweep<T: Tiles>(
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

    /// A row of `x` rounded to int8 (see [`QuantizedRows`]).
    #[derive(Clone, Copy)]
    struct Int8Row<'x> {
        quants: &'x [[i8; BLOCK]],
        steps: &'x [f32],
        /// The blocks' `step · Σ q` in vectors of 8, zeros past the row's blocks.
        sums: &'x [f32x8],
        /// Per superblock, the sums of `q` over halves of a block (see `QuantizedRows`).
        half_sums: &'x [[i16; 16]],
        /// Per whole group of 8 blocks, the blocks' `−128 · Σ q` (see `QuantizedRows`); empty
        /// but for [`grouped_sweep`].
        group_offsets: &'x [[i32; GROUP]],
    }

    /// A weight row whose quants multiply int8 activations with integer multiply-adds.
    trait IntRow: Row {
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
    /// slower at two, level at five and eight; docs/benchmarks.md). A row's operations do not
    /// depend on the tile.
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

    /// How a tile sums products of bytes, 4 into each 32-bit lane. Every sum is exact, so
    /// the implementations give the same bits.
    trait IntDot: Copy {
        /// Whether [`IntDot::group_dot`] multiplies the stored quants as they are (`q + 128`),
        /// so that a group's sums start from `x`'s `−128 · Σ q` instead of zero.
        const BIASED: bool;
        /// What [`IntDot::group_dot`] needs of a unit of stored quants (`q + 128`).
        type Unit: Copy;
        fn unit(self, simd: V3, stored: __m256i) -> Self::Unit;
        /// `acc` plus, in each lane, the 4 products of the unit's quants by `x`'s in it (plus
        /// 128 times `x`'s with [`IntDot::BIASED`]).
        fn group_dot(self, simd: V3, acc: __m256i, unit: Self::Unit, x: __m256i) -> __m256i;
        /// `acc` plus, in each lane, the 4 products of `unsigned` (at most 127) by `signed`.
        fn dot(self, simd: V3, acc: __m256i, unsigned: __m256i, signed: __m256i) -> __m256i;
        /// `vpdpbusd` on 16 lanes, where this dot has it ([`paired_grouped_tile`]).
        #[inline(always)]
        fn paired(self) -> Option<Vnni> {
            None
        }
    }

    /// The signed quants of a unit of stored ones (`q + 128`).
    #[inline(always)]
    fn unbiased(simd: V3, stored: __m256i) -> __m256i {
        simd.avx2
            ._mm256_xor_si256(stored, simd.avx._mm256_set1_epi8(i8::MIN))
    }

    /// AVX2: `vpmaddubsw` into 16-bit pairs (at most 2 · 127 · 127: no saturation with the
    /// unsigned side at most 127, so signed weights give their sign to `x` and their absolute
    /// value to the unsigned side), `vpmaddwd` by ones into lanes, then an add.
    #[derive(Clone, Copy)]
    struct PairSums;

    impl IntDot for PairSums {
        const BIASED: bool = false;
        type Unit = (__m256i, __m256i);

        #[inline(always)]
        fn unit(self, simd: V3, stored: __m256i) -> Self::Unit {
            let signed = unbiased(simd, stored);
            (simd.avx2._mm256_abs_epi8(signed), signed)
        }

        #[inline(always)]
        fn group_dot(self, simd: V3, acc: __m256i, unit: Self::Unit, x: __m256i) -> __m256i {
            let (magnitude, signs) = unit;
            self.dot(simd, acc, magnitude, simd.avx2._mm256_sign_epi8(x, signs))
        }

        #[inline(always)]
        fn dot(self, simd: V3, acc: __m256i, unsigned: __m256i, signed: __m256i) -> __m256i {
            let pairs = simd.avx2._mm256_maddubs_epi16(unsigned, signed);
            let ones = simd.avx._mm256_set1_epi16(1);
            let lanes = simd.avx2._mm256_madd_epi16(pairs, ones);
            simd.avx2._mm256_add_epi32(acc, lanes)
        }
    }

    /// AVX512-VNNI's `vpdpbusd` (unsigned by signed bytes, 4 a lane, into 32 bits without
    /// saturation): a group's stored quants `q + 128` times `x` in one instruction, no sign
    /// juggling (the 128 · Σ x it adds is taken off by starting from the group's offsets).
    #[derive(Clone, Copy)]
    struct Vnni(Avx512vnni, V4);

    impl Vnni {
        #[inline(always)]
        #[allow(unsafe_code)]
        fn dpbusd(self, acc: __m256i, unsigned: __m256i, signed: __m256i) -> __m256i {
            let Vnni(_proof, _) = self;
            // SAFETY: an `Avx512vnni` exists only where the CPU has AVX512-VNNI and AVX512-VL
            // (`Avx512vnni::try_new` detects both), the features this intrinsic needs; it reads
            // no memory. pulp wraps no VNNI instruction, hence this one call of our own.
            unsafe { core::arch::x86_64::_mm256_dpbusd_epi32(acc, unsigned, signed) }
        }

        /// [`Vnni::dpbusd`] on 16 lanes.
        #[inline(always)]
        #[allow(unsafe_code)]
        fn dpbusd_pair(self, acc: __m512i, unsigned: __m512i, signed: __m512i) -> __m512i {
            let Vnni(_proof, _) = self;
            // SAFETY: as for `dpbusd`; `V4` (AVX512F), which this intrinsic also needs, is
            // detected with it (`vnni`).
            unsafe { core::arch::x86_64::_mm512_dpbusd_epi32(acc, unsigned, signed) }
        }
    }

    impl IntDot for Vnni {
        const BIASED: bool = true;
        type Unit = __m256i;

        #[inline(always)]
        fn unit(self, _simd: V3, stored: __m256i) -> __m256i {
            stored
        }

        #[inline(always)]
        fn group_dot(self, _simd: V3, acc: __m256i, unit: __m256i, x: __m256i) -> __m256i {
            self.dpbusd(acc, unit, x)
        }

        #[inline(always)]
        fn dot(self, _simd: V3, acc: __m256i, unsigned: __m256i, signed: __m256i) -> __m256i {
            self.dpbusd(acc, unsigned, signed)
        }

        #[inline(always)]
        fn paired(self) -> Option<Vnni> {
            Some(self)
        }
    }

    /// The context and the instruction the grouped tiles take `vpdpbusd` in, where the CPU
    /// has AVX512-VNNI (with AVX-512's F, BW, CD, DQ and VL): what [`run`] dispatches on and
    /// [`instruction_set`] reports.
    fn vnni() -> Option<(V4Vnni, Vnni)> {
        Some((
            V4Vnni::try_new()?,
            Vnni(Avx512vnni::try_new()?, V4::try_new()?),
        ))
    }

    pulp::simd_type! {
        /// `V4` with AVX512-VNNI: the target features [`Vnni`]'s tiles are compiled with, so
        /// that its intrinsic is inlined into them.
        struct V4Vnni {
            pub sse: "sse",
            pub sse2: "sse2",
            pub fxsr: "fxsr",
            pub sse3: "sse3",
            pub ssse3: "ssse3",
            pub sse4_1: "sse4.1",
            pub sse4_2: "sse4.2",
            pub popcnt: "popcnt",
            pub avx: "avx",
            pub avx2: "avx2",
            pub bmi1: "bmi1",
            pub bmi2: "bmi2",
            pub fma: "fma",
            pub lzcnt: "lzcnt",
            pub avx512f: "avx512f",
            pub avx512bw: "avx512bw",
            pub avx512cd: "avx512cd",
            pub avx512dq: "avx512dq",
            pub avx512vl: "avx512vl",
            pub avx512vnni: "avx512vnni",
        }
    }

    /// A weight row stored in groups of [`GROUP`] blocks whose 32-byte units hold 4 quants of
    /// each block of the group (`Storage::Q8_0Groups`, `Q4K`, `Q6K`), for [`tile_grouped`].
    trait GroupRow: Copy {
        /// Whether the units hold signed quants stored plus 128 (Q8_0) rather than unsigned
        /// ones.
        const SIGNED: bool;
        /// Runs of a group's units with scales of their own: 1, or 2 for Q6_K (a block's
        /// halves, units 0..4 and 4..8).
        const SEGMENTS: usize;
        /// Asks for the weights a few KB ahead of group `g` of the row's panel (every row of it)
        /// with `hint`'s instruction.
        fn prefetch(self, simd: V3, hint: Hint, g: usize);
        /// Units `4 q .. 4 q + 4` of group `g`, as bytes.
        fn quad(self, simd: V3, g: usize, q: usize) -> [__m256i; 4];
        /// Units `4 q .. 4 q + 4` of group `g` of a panel's two rows (`rows[0]` in lane 0),
        /// the first row's in the lower half of each vector and the second's in the upper.
        #[inline(always)]
        fn pair_quad(rows: [Self; PANEL], simd: V3, v4: V4, g: usize, q: usize) -> [__m512i; 4] {
            let f = v4.avx512f;
            let (lows, highs) = (rows[0].quad(simd, g, q), rows[1].quad(simd, g, q));
            // No closure: it would not inherit the target features, and the intrinsic would
            // become a call.
            let mut pair = [f._mm512_setzero_si512(); 4];
            for (pair, (&low, &high)) in pair.iter_mut().zip(lows.iter().zip(&highs)) {
                *pair = f._mm512_inserti64x4::<1>(f._mm512_castsi256_si512(low), high);
            }
            pair
        }
        /// The f32 factor of each block's integer sum in segment `seg` of group `g`.
        fn scales(self, simd: V3, g: usize, seg: usize) -> f32x8;
        /// Where the integer sums of segment `seg` of group `g` with `x` start: what the stored
        /// offsets add, taken off (Q8_0's 128 when `biased`, Q6_K's 32).
        fn start(simd: V3, x: &Int8Row<'_>, g: usize, seg: usize, biased: bool) -> __m256i;
        /// Block `b` after the last whole group: its signed quants and scale. Only
        /// `Q8_0Groups` has such blocks (a superblock is a whole group).
        fn tail(self, simd: V3, b: usize) -> (__m256i, f32);
        /// Block `b` after the last whole group of a panel's two rows (`rows[0]` in lane 0)
        /// side by side, their stored quants (`q + 128`, the first row's in the lower half),
        /// and their scales; `None` where the layout has no such blocks or the rows do not
        /// hold block `b`.
        #[inline(always)]
        fn pair_tail(_rows: [Self; PANEL], _b: usize) -> Option<(__m512i, [f32; PANEL])> {
            None
        }
        /// `total` plus the row's minimums times `x`'s block sums (vectors of 8).
        #[inline(always)]
        fn add_mins(self, _simd: V3, _sums: &[f32x8], total: f32x8) -> f32x8 {
            total
        }
        /// The row's place in its panel.
        fn lane(self) -> usize;
    }

    impl GroupRow for Q8Row<'_> {
        const SIGNED: bool = true;
        const SEGMENTS: usize = 1;

        #[inline(always)]
        fn prefetch(self, simd: V3, hint: Hint, g: usize) {
            let ahead = GROUPED_PREFETCH_AHEAD_BYTES / <Self as Row>::PANEL_BLOCK_BYTES;
            for t in 0..GROUP {
                prefetch_quantized(simd, hint, self.quants, self.scales, g * GROUP + t + ahead);
            }
        }

        #[inline(always)]
        fn quad(self, _simd: V3, g: usize, q: usize) -> [__m256i; 4] {
            let group = &self.quants.as_chunks::<{ GROUP * PANEL }>().0[g];
            std::array::from_fn(|u| cast(group[(4 * q + u) * PANEL + self.lane]))
        }

        /// A unit of the panel's two rows is 64 bytes in a row (unit `t` of lane 0, then of
        /// lane 1): one load a vector, where the default takes two and an insertion.
        #[inline(always)]
        fn pair_quad(rows: [Self; PANEL], _simd: V3, _v4: V4, g: usize, q: usize) -> [__m512i; 4] {
            debug_assert!(rows[0].lane == 0 && rows[1].lane == 1);
            let group = &rows[0].quants.as_chunks::<{ GROUP * PANEL }>().0[g];
            std::array::from_fn(|u| {
                let t = (4 * q + u) * PANEL;
                cast([group[t], group[t + 1]])
            })
        }

        #[inline(always)]
        fn scales(self, _simd: V3, g: usize, _seg: usize) -> f32x8 {
            cast(self.scales.as_chunks::<GROUP>().0[g * PANEL + self.lane])
        }

        #[inline(always)]
        fn start(simd: V3, x: &Int8Row<'_>, g: usize, _seg: usize, biased: bool) -> __m256i {
            if biased {
                cast(x.group_offsets[g])
            } else {
                simd.avx._mm256_setzero_si256()
            }
        }

        #[inline(always)]
        fn tail(self, simd: V3, b: usize) -> (__m256i, f32) {
            let at = b * PANEL + self.lane;
            (unbiased(simd, cast(self.quants[at])), self.scales[at])
        }

        /// The panel's two rows of a block are 64 bytes in a row, as a group's units are.
        #[inline(always)]
        fn pair_tail(rows: [Self; PANEL], b: usize) -> Option<(__m512i, [f32; PANEL])> {
            debug_assert!(rows[0].lane == 0 && rows[1].lane == 1);
            let at = b * PANEL;
            let (quants, scales) = (rows[0].quants, rows[0].scales);
            Some((
                cast([*quants.get(at)?, *quants.get(at + 1)?]),
                [*scales.get(at)?, *scales.get(at + 1)?],
            ))
        }

        #[inline(always)]
        fn lane(self) -> usize {
            self.lane
        }
    }

    /// A 32-byte load of grouped nibbles as its two units: the low nibbles, then the high.
    #[inline(always)]
    fn nibble_units(simd: V3, load: [u64; 4]) -> [__m256i; 2] {
        let bytes: __m256i = cast(load);
        let mask = simd.avx._mm256_set1_epi8(0x0F);
        [
            simd.avx2._mm256_and_si256(bytes, mask),
            simd.avx2
                ._mm256_and_si256(simd.avx2._mm256_srli_epi16::<4>(bytes), mask),
        ]
    }

    /// A superblock's 8 scales (bytes of a word) as f32 times its step.
    #[inline(always)]
    fn superblock_scales(simd: V3, word: u64, step: f32, signed: bool) -> f32x8 {
        let bytes: __m128i = cast([word, 0u64]);
        let wide = if signed {
            simd.avx2._mm256_cvtepi8_epi32(bytes)
        } else {
            simd.avx2._mm256_cvtepu8_epi32(bytes)
        };
        simd.mul_f32x8(
            simd.convert_i32x8_to_f32x8(cast(wide)),
            simd.splat_f32x8(step),
        )
    }

    /// Asks for the superblock `SUPER_AHEAD` ahead of `s`: `bytes` bytes a superblock of
    /// `data`, and its scales and steps.
    #[inline(always)]
    fn prefetch_superblock<T, S, U>(
        simd: V3,
        hint: Hint,
        data: &[T],
        bytes: usize,
        scales: &[S],
        steps: &[U],
        s: usize,
    ) {
        let ahead = (s + SUPER_AHEAD) * bytes;
        prefetch_lines(
            simd,
            hint,
            data.as_ptr().cast::<u8>().wrapping_add(ahead),
            bytes,
        );
        let side = (s + SUPER_AHEAD) * PANEL;
        prefetch_lines(simd, hint, scales.as_ptr().wrapping_add(side).cast(), 1);
        prefetch_lines(simd, hint, steps.as_ptr().wrapping_add(side).cast(), 1);
    }

    impl GroupRow for Q4KRow<'_> {
        const SIGNED: bool = false;
        const SEGMENTS: usize = 1;

        #[inline(always)]
        fn prefetch(self, simd: V3, hint: Hint, s: usize) {
            let bytes = 4 * PANEL * 32;
            prefetch_superblock(simd, hint, self.quants, bytes, self.scales, self.steps, s);
        }

        #[inline(always)]
        fn quad(self, simd: V3, s: usize, q: usize) -> [__m256i; 4] {
            let loads = &self.quants.as_chunks::<{ 4 * PANEL }>().0[s];
            let [a, b] = nibble_units(simd, loads[2 * q * PANEL + self.lane]);
            let [c, d] = nibble_units(simd, loads[(2 * q + 1) * PANEL + self.lane]);
            [a, b, c, d]
        }

        #[inline(always)]
        fn scales(self, simd: V3, s: usize, _seg: usize) -> f32x8 {
            let at = s * PANEL + self.lane;
            superblock_scales(simd, self.scales[at], self.steps[at], false)
        }

        #[inline(always)]
        fn start(simd: V3, _x: &Int8Row<'_>, _s: usize, _seg: usize, _biased: bool) -> __m256i {
            simd.avx._mm256_setzero_si256()
        }

        #[inline(always)]
        fn tail(self, simd: V3, _b: usize) -> (__m256i, f32) {
            (simd.avx._mm256_setzero_si256(), 0.0)
        }

        /// A superblock's 8 minimums are one word of bytes: widened, converted and scaled by
        /// its step, they meet `x`'s sums of its 8 blocks.
        #[inline(always)]
        fn add_mins(self, simd: V3, sums: &[f32x8], mut total: f32x8) -> f32x8 {
            for ((&word, &neg_step), &sum) in self.mins.iter().zip(self.neg_min_steps).zip(sums) {
                let bytes: u8x16 = cast([word, 0u64]);
                let mins = simd.convert_i32x8_to_f32x8(cast(simd.convert_u8x16_to_u32x8(bytes)));
                let mins = simd.mul_f32x8(mins, simd.splat_f32x8(neg_step));
                total = simd.mul_add_f32x8(mins, sum, total);
            }
            total
        }

        #[inline(always)]
        fn lane(self) -> usize {
            self.lane
        }
    }

    /// A row of Q6_K superblocks kept as they are (see `Storage::Q6K`).
    #[derive(Clone, Copy)]
    struct Q6KRow<'a> {
        /// The panel's grouped low nibbles and high bits, 32-byte loads.
        lows: &'a [[u64; 4]],
        highs: &'a [[u64; 4]],
        scales: &'a [[u64; 2]],
        steps: &'a [f32],
        lane: usize,
    }

    impl GroupRow for Q6KRow<'_> {
        const SIGNED: bool = false;
        const SEGMENTS: usize = 2;

        #[inline(always)]
        fn prefetch(self, simd: V3, hint: Hint, s: usize) {
            let (lows, steps) = (self.lows, self.steps);
            prefetch_superblock(simd, hint, lows, 4 * PANEL * 32, self.scales, steps, s);
            let ahead = (s + SUPER_AHEAD) * 2 * PANEL;
            prefetch_lines(
                simd,
                hint,
                self.highs.as_ptr().wrapping_add(ahead).cast(),
                2 * PANEL * 32,
            );
        }

        /// Units `4 q .. 4 q + 4`: the nibbles of loads `2 q` and `2 q + 1`, and unit `4 q + f`'s
        /// high bits from bits `2 f` of high load `q`, moved to bits 4 and 5.
        #[inline(always)]
        fn quad(self, simd: V3, s: usize, q: usize) -> [__m256i; 4] {
            let lows = &self.lows.as_chunks::<{ 4 * PANEL }>().0[s];
            let [a, b] = nibble_units(simd, lows[2 * q * PANEL + self.lane]);
            let [c, d] = nibble_units(simd, lows[(2 * q + 1) * PANEL + self.lane]);
            let highs: __m256i =
                cast(self.highs.as_chunks::<{ 2 * PANEL }>().0[s][q * PANEL + self.lane]);
            let mask = simd.avx._mm256_set1_epi8(0x30);
            let field = |moved: __m256i| simd.avx2._mm256_and_si256(moved, mask);
            let high = [
                field(simd.avx2._mm256_slli_epi16::<4>(highs)),
                field(simd.avx2._mm256_slli_epi16::<2>(highs)),
                field(highs),
                field(simd.avx2._mm256_srli_epi16::<2>(highs)),
            ];
            let mut units = [a, b, c, d];
            for (unit, high) in units.iter_mut().zip(high) {
                *unit = simd.avx2._mm256_or_si256(*unit, high);
            }
            units
        }

        #[inline(always)]
        fn scales(self, simd: V3, s: usize, seg: usize) -> f32x8 {
            let at = s * PANEL + self.lane;
            superblock_scales(simd, self.scales[at][seg], self.steps[at], true)
        }

        /// `−32 · Σ q` of `x` over each block's half `seg` (the quants are stored plus 32).
        #[inline(always)]
        fn start(simd: V3, x: &Int8Row<'_>, s: usize, seg: usize, _biased: bool) -> __m256i {
            let halves: __m128i = cast(x.half_sums[s].as_chunks::<8>().0[seg]);
            let sums = simd.avx2._mm256_cvtepi16_epi32(halves);
            simd.avx2._mm256_sub_epi32(
                simd.avx._mm256_setzero_si256(),
                simd.avx2._mm256_slli_epi32::<5>(sums),
            )
        }

        #[inline(always)]
        fn tail(self, simd: V3, _b: usize) -> (__m256i, f32) {
            (simd.avx._mm256_setzero_si256(), 0.0)
        }

        #[inline(always)]
        fn lane(self) -> usize {
            self.lane
        }
    }

    /// How many superblocks ahead a tile asks for its panels' weights: 8 KB of nibbles.
    const SUPER_AHEAD: usize = GROUPED_PREFETCH_AHEAD_BYTES / (4 * PANEL * 32);

    /// Grouped rows against int8 rows of `x` interleaved the same way ([`tile_grouped`]).
    #[derive(Clone, Copy)]
    struct Grouped<'x, W, D>(D, PhantomData<(&'x (), W)>);

    impl<'x, W: GroupRow, D: IntDot> Tiles for Grouped<'x, W, D> {
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
            tile_grouped(simd, self.0, rows, xs, blocks)
        }
    }

    /// The dot products of grouped integer weight rows with int8 rows of `x` interleaved the
    /// same way ([`QuantizedRows::grouped`]): each integer multiply-add of a unit adds 4
    /// products of each block of the group into that block's own lane, so after a segment's
    /// units lane `j` holds block `j`'s exact sum (Q4_K: `Σ q · q_x`; Q6_K and, with
    /// `vpdpbusd`, Q8_0 from a start that takes the stored offset off), and one multiply-add a
    /// segment, 8 blocks a vector, scales them into f32 (`sums · scales · steps`) where a
    /// per-block layout takes one a block. Q8_0's blocks after the last whole group go one at
    /// a time. A row's operations do not depend on the tile, and its bits not on `D` (exact
    /// integer sums). With `vpdpbusd`, a tile of one panel's two rows takes them side by side
    /// in 16 lanes ([`paired_grouped_tile`], Q8_0's last blocks too), the same operations lane
    /// for lane.
    #[allow(clippy::needless_range_loop)]
    #[inline(always)]
    fn tile_grouped<W: GroupRow, D: IntDot, const RR: usize, const M: usize>(
        simd: V3,
        dot: D,
        rows: &[W; RR],
        xs: &[Int8Row<'_>; M],
        blocks: usize,
    ) -> [[f32; M]; RR] {
        let hint = Hint::of_cpu();
        if RR == PANEL
            && rows[0].lane() == 0
            && let Some(vnni) = dot.paired()
        {
            let (acc, tail_from) =
                paired_grouped_tile(simd, vnni, hint, &[rows[0], rows[1]], xs, blocks);
            let mut all = [[simd.splat_f32x8(0.0); M]; RR];
            all[..PANEL].copy_from_slice(&acc);
            return finish_grouped(simd, dot, hint, rows, xs, tail_from..blocks, all);
        }
        let zero = simd.splat_f32x8(0.0);
        let zero_i = simd.avx._mm256_setzero_si256();
        let mut acc = [[zero; M]; RR];
        let groups = blocks / GROUP;
        let quads = 2 / W::SEGMENTS;
        for g in 0..groups {
            for r in (0..RR).step_by(PANEL) {
                rows[r].prefetch(simd, hint, g);
            }
            let mut x_units = [&[[0i8; BLOCK]; GROUP]; M];
            for i in 0..M {
                x_units[i] = &xs[i].quants.as_chunks::<GROUP>().0[g];
            }
            for seg in 0..W::SEGMENTS {
                let mut sums = [[zero_i; M]; RR];
                for i in 0..M {
                    let start = W::start(simd, &xs[i], g, seg, D::BIASED);
                    for r in 0..RR {
                        sums[r][i] = start;
                    }
                }
                // A trip count the compiler cannot see: unrolled whole, a group's loads of
                // `x` were all hoisted to its top and spilled.
                for quad in 0..std::hint::black_box(quads) {
                    let q = seg * quads + quad;
                    for r in 0..RR {
                        let units = rows[r].quad(simd, g, q);
                        for (u, &unit) in units.iter().enumerate() {
                            let t = 4 * q + u;
                            if W::SIGNED {
                                let unit = dot.unit(simd, unit);
                                for i in 0..M {
                                    let x: __m256i = cast(x_units[i][t]);
                                    sums[r][i] = dot.group_dot(simd, sums[r][i], unit, x);
                                }
                            } else {
                                for i in 0..M {
                                    let x: __m256i = cast(x_units[i][t]);
                                    sums[r][i] = dot.dot(simd, sums[r][i], unit, x);
                                }
                            }
                        }
                    }
                }
                for r in 0..RR {
                    let scales = rows[r].scales(simd, g, seg);
                    for i in 0..M {
                        let steps: f32x8 = cast(xs[i].steps.as_chunks::<GROUP>().0[g]);
                        acc[r][i] = simd.mul_add_f32x8(
                            simd.convert_i32x8_to_f32x8(cast(sums[r][i])),
                            simd.mul_f32x8(scales, steps),
                            acc[r][i],
                        );
                    }
                }
            }
        }
        finish_grouped(simd, dot, hint, rows, xs, groups * GROUP..blocks, acc)
    }

    /// [`tile_grouped`]'s end: the blocks `tail` after the last whole group (Q8_0's, one at a
    /// time; none left where [`paired_grouped_tile`] took them) added to `acc`, then the rows'
    /// minimums, and each sum's 8 lanes reduced.
    #[allow(clippy::needless_range_loop)]
    #[inline(always)]
    fn finish_grouped<W: GroupRow, D: IntDot, const RR: usize, const M: usize>(
        simd: V3,
        dot: D,
        hint: Hint,
        rows: &[W; RR],
        xs: &[Int8Row<'_>; M],
        tail: Range<usize>,
        mut acc: [[f32x8; M]; RR],
    ) -> [[f32; M]; RR] {
        let zero_i = simd.avx._mm256_setzero_si256();
        if !tail.is_empty() {
            for r in (0..RR).step_by(PANEL) {
                rows[r].prefetch(simd, hint, tail.start / GROUP);
            }
        }
        for b in tail {
            for r in 0..RR {
                let (quants, scale) = rows[r].tail(simd, b);
                let scale = simd.splat_f32x8(scale);
                let unsigned = simd.avx2._mm256_abs_epi8(quants);
                for i in 0..M {
                    let x: __m256i = cast(xs[i].quants[b]);
                    let signed = simd.avx2._mm256_sign_epi8(x, quants);
                    let sums: i32x8 = cast(dot.dot(simd, zero_i, unsigned, signed));
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

    /// [`tile_grouped`]'s groups for one panel's two rows side by side in 16-lane vectors:
    /// lanes 0-7 hold row 0's sums, lanes 8-15 row 1's, and each unit of `x` is broadcast to
    /// both halves, so one `vpdpbusd` on 16 lanes does what two on 8 lanes do (exact integer
    /// sums), and the f32 scaling is lane for lane the same multiply and multiply-add: the
    /// same bits in half the instructions. Q8_0's blocks after the last whole group go the
    /// same way ([`GroupRow::pair_tail`]), each 32-bit lane of a block's sums starting from
    /// `−128 ·` the 4 values of `x` it multiplies. Returns each row's accumulators, for
    /// [`finish_grouped`], and the first block left to it.
    #[allow(clippy::needless_range_loop)]
    #[inline(always)]
    fn paired_grouped_tile<W: GroupRow, const M: usize>(
        simd: V3,
        vnni: Vnni,
        hint: Hint,
        rows: &[W; PANEL],
        xs: &[Int8Row<'_>; M],
        blocks: usize,
    ) -> ([[f32x8; M]; PANEL], usize) {
        let v4 = vnni.1;
        let (f, dq) = (v4.avx512f, v4.avx512dq);
        let mut acc = [f._mm512_setzero_ps(); M];
        let groups = blocks / GROUP;
        let quads = 2 / W::SEGMENTS;
        for g in 0..groups {
            rows[0].prefetch(simd, hint, g);
            let mut x_units = [&[[0i8; BLOCK]; GROUP]; M];
            for i in 0..M {
                x_units[i] = &xs[i].quants.as_chunks::<GROUP>().0[g];
            }
            for seg in 0..W::SEGMENTS {
                let mut sums = [f._mm512_setzero_si512(); M];
                for i in 0..M {
                    let start = W::start(simd, &xs[i], g, seg, Vnni::BIASED);
                    sums[i] = f._mm512_broadcast_i64x4(start);
                }
                for quad in 0..quads {
                    let q = seg * quads + quad;
                    let pair = W::pair_quad(*rows, simd, v4, g, q);
                    for (u, &w) in pair.iter().enumerate() {
                        let t = 4 * q + u;
                        for i in 0..M {
                            let x = f._mm512_broadcast_i64x4(cast(x_units[i][t]));
                            sums[i] = vnni.dpbusd_pair(sums[i], w, x);
                        }
                    }
                }
                let scales = pair_halves(
                    v4,
                    rows[0].scales(simd, g, seg),
                    rows[1].scales(simd, g, seg),
                );
                for i in 0..M {
                    let steps: f32x8 = cast(xs[i].steps.as_chunks::<GROUP>().0[g]);
                    let steps = dq._mm512_broadcast_f32x8(cast(steps));
                    acc[i] = f._mm512_fmadd_ps(
                        f._mm512_cvtepi32_ps(sums[i]),
                        f._mm512_mul_ps(scales, steps),
                        acc[i],
                    );
                }
            }
        }
        let mut tail_from = groups * GROUP;
        if tail_from < blocks {
            rows[0].prefetch(simd, hint, groups);
            // Unsigned bytes of 128: `vpdpbusd` of these by `x` is what the stored quants'
            // offset adds to each lane, taken off first.
            let offset = f._mm512_set1_epi8(i8::MIN);
            let zero = f._mm512_setzero_si512();
            while tail_from < blocks {
                let Some((w, [low, high])) = W::pair_tail(*rows, tail_from) else {
                    break;
                };
                let scales = pair_halves(v4, simd.splat_f32x8(low), simd.splat_f32x8(high));
                for i in 0..M {
                    let x = f._mm512_broadcast_i64x4(cast(xs[i].quants[tail_from]));
                    let start = f._mm512_sub_epi32(zero, vnni.dpbusd_pair(zero, offset, x));
                    // Lane for lane [`finish_grouped`]'s sums (exact) and its f32 operations.
                    let sums = vnni.dpbusd_pair(start, w, x);
                    let steps = f._mm512_set1_ps(xs[i].steps[tail_from]);
                    acc[i] = f._mm512_fmadd_ps(
                        f._mm512_cvtepi32_ps(sums),
                        f._mm512_mul_ps(scales, steps),
                        acc[i],
                    );
                }
                tail_from += 1;
            }
        }
        let mut out = [[simd.splat_f32x8(0.0); M]; PANEL];
        for i in 0..M {
            (out[0][i], out[1][i]) = split_halves(v4, acc[i]);
        }
        (out, tail_from)
    }

    /// The blocks of the panel holding row `r` (`blocks` blocks a row, one unit each).
    #[inline(always)]
    fn panel<T>(all: &[T], r: usize, blocks: usize) -> &[T] {
        let p = r / PANEL;
        &all[p * blocks * PANEL..(p + 1) * blocks * PANEL]
    }

    /// One product's operands (see [`run`]), as the jobs carry them into a SIMD context.
    struct Product<'a, 'b> {
        mat: &'a PackedMatrix,
        rows: Range<usize>,
        x: &'a [f32],
        int8: Option<&'a QuantizedRows>,
        /// The first row of `int8` that row 0 of `x` and `outs` is (a [`VnniJob`] takes at
        /// most [`GROUPED_JOB_MAX_ROWS`] rows of a product at a time).
        first: usize,
        m: usize,
        outs: &'a mut [&'b mut [f32]],
    }

    /// Every layout's product, inside `V3` or `V4`.
    struct Job<'a, 'b> {
        simd: V3,
        product: Product<'a, 'b>,
        /// Tiles of two or three panels (see [`tall_tiles`]); only inside `V4`, whose 32
        /// registers hold their 12 to 30 sums.
        tall: bool,
    }

    impl NullaryFnOnce for Job<'_, '_> {
        type Output = ();

        #[inline(always)]
        fn call(self) {
            let Job {
                simd,
                product:
                    Product {
                        mat,
                        rows,
                        x,
                        int8,
                        first: _,
                        m,
                        outs,
                    },
                tall,
            } = self;
            let kp = mat.padded_cols();
            let blocks = kp / BLOCK;
            let x: &[[f32x8; 4]] = cast_slice(x);

            match &mat.storage {
                Storage::F32(w) if mat.spanned() => {
                    spanned_sweep(
                        simd,
                        cast_slice(w),
                        mat.panel_rows(),
                        rows,
                        x,
                        blocks,
                        m,
                        outs,
                    );
                }
                Storage::F32(w) => {
                    let w: &[[f32x8; 4]] = cast_slice(w);
                    let row = |r: usize| F32Row(panel(w, r, blocks), r % PANEL);
                    widened_sweep(simd, tall, row, rows, x, blocks, m, outs);
                }
                Storage::Bf16(w) => {
                    let w: &[[u32x8; 2]] = cast_slice(w);
                    let row = |r: usize| Bf16Row(panel(w, r, blocks), r % PANEL);
                    widened_sweep(simd, tall, row, rows, x, blocks, m, outs);
                }
                Storage::Q8_0 { quants, scales } => {
                    let quants: &[[u64; 4]] = cast_slice(quants);
                    let row = |r: usize| Q8Row {
                        quants: panel(quants, r, blocks),
                        scales: panel(scales, r, blocks),
                        lane: r % PANEL,
                    };
                    widened_sweep(simd, tall, row, rows, x, blocks, m, outs);
                }
                Storage::Q8_0Groups { .. } => {
                    grouped_sweep::<_, 0>(simd, PairSums, mat, rows, x, int8, 0, m, outs);
                }
                Storage::Q4 { quants, params } => {
                    let quants: &[[u64; 2]] = cast_slice(quants);
                    let row = |r: usize| Q4Row {
                        quants: panel(quants, r, blocks),
                        side: Pairs(panel(params, r, blocks)),
                        lane: r % PANEL,
                    };
                    widened_sweep(simd, tall, row, rows, x, blocks, m, outs);
                }
                Storage::Q4A8 {
                    quants,
                    scales,
                    mins,
                } => {
                    let quants: &[[u64; 2]] = cast_slice(quants);
                    let row = |r: usize| Q4Row {
                        quants: panel(quants, r, blocks),
                        side: Apart {
                            scales: panel(scales, r, blocks),
                            mins,
                            first_min: r * blocks,
                        },
                        lane: r % PANEL,
                    };
                    integer_sweep(simd, tall, row, rows, x, int8, blocks, m, outs);
                }
                Storage::Q4K { .. } | Storage::Q6K { .. } => {
                    grouped_sweep::<_, 0>(simd, PairSums, mat, rows, x, int8, 0, m, outs);
                }
            }
        }
    }

    /// The grouped layouts (`Storage::Q8_0Groups`, `Q4K`, `Q6K`) against the int8 rows of
    /// `x`, interleaved as the weights ([`QuantizedRows::grouped`]); `matmul_with` always
    /// rounds and interleaves `x` for them on the SIMD path, and without that the portable
    /// loop multiplies `x` as given.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    fn grouped_sweep<D: IntDot, const M: usize>(
        simd: V3,
        dot: D,
        mat: &PackedMatrix,
        rows: Range<usize>,
        x: &[[f32x8; 4]],
        int8: Option<&QuantizedRows>,
        first: usize,
        m: usize,
        outs: &mut [&mut [f32]],
    ) {
        let blocks = mat.padded_cols() / BLOCK;
        let Some(q) = int8 else {
            return crate::scalar::run(mat, rows, cast_slice(x), m, outs);
        };
        let groups = blocks / GROUP;
        let offsets = q.group_offsets.len() == q.quants.len() / blocks * groups;
        let biased = mat.storage.interleave() == Interleave::BiasedGroups;
        if q.grouped.len() != q.quants.len() || (biased && !offsets) {
            let cols = mat.padded_cols();
            let x = &q.dequantize()[first * cols..(first + m) * cols];
            return crate::scalar::run(mat, rows, x, m, outs);
        }
        // Built once: a tile then copies its rows of `x` instead of calling a closure per row
        // (which the compiler kept out of line).
        let x_rows: Vec<Int8Row<'_>> = (first..first + m)
            .map(|i| Int8Row {
                quants: &q.grouped[i * blocks..(i + 1) * blocks],
                // Empty unless the storage's quants are biased (only `Q8Row` reads them).
                group_offsets: q
                    .group_offsets
                    .get(i * groups..(i + 1) * groups)
                    .unwrap_or(&[]),
                ..int8_row(q, blocks)(i)
            })
            .collect();
        let x_row = |i: usize| x_rows[i];
        macro_rules! go {
            ($row:expr) => {
                grouped_tiles::<_, M>(
                    simd,
                    Grouped(dot, PhantomData),
                    $row,
                    rows,
                    x_row,
                    blocks,
                    m,
                    outs,
                )
            };
        }
        match &mat.storage {
            Storage::Q8_0Groups { quants, scales } => {
                let quants: &[[u64; 4]] = cast_slice(quants);
                go!(|r: usize| Q8Row {
                    quants: panel(quants, r, blocks),
                    scales: panel(scales, r, blocks),
                    lane: r % PANEL,
                })
            }
            Storage::Q4K {
                quants,
                scales,
                steps,
                mins,
                neg_min_steps,
            } => {
                let quants: &[[u64; 4]] = cast_slice(quants);
                let per_row = groups;
                go!(|r: usize| Q4KRow {
                    quants: panel(quants, r, 4 * per_row),
                    scales: panel(scales, r, per_row),
                    steps: panel(steps, r, per_row),
                    mins: &mins[r * per_row..(r + 1) * per_row],
                    neg_min_steps: &neg_min_steps[r * per_row..(r + 1) * per_row],
                    lane: r % PANEL,
                })
            }
            Storage::Q6K {
                lows,
                highs,
                scales,
                steps,
            } => {
                let (lows, highs): (&[[u64; 4]], &[[u64; 4]]) =
                    (cast_slice(lows), cast_slice(highs));
                let per_row = groups;
                go!(|r: usize| Q6KRow {
                    lows: panel(lows, r, 4 * per_row),
                    highs: panel(highs, r, 2 * per_row),
                    scales: panel(scales, r, per_row),
                    steps: panel(steps, r, per_row),
                    lane: r % PANEL,
                })
            }
            _ => crate::scalar::run(mat, rows, &q.dequantize(), m, outs),
        }
    }

    /// The grouped tiles for exactly `M` rows of `x`, 1 to [`GROUPED_JOB_MAX_ROWS`]: one
    /// tile of one panel × all `M` rows, so each weight vector streamed from memory serves every
    /// row (with `vpdpbusd`, [`paired_grouped_tile`]). `M` 0 is any `m` (without `vpdpbusd`),
    /// in [`sweep`]'s tiles for 16 registers. With `vpdpbusd` each `M` is a job of its own
    /// ([`VnniJob`]), so it compiles only its own tile shapes: compiled into one function, each
    /// shape ran slower for the others' presence (docs/benchmarks.md, twenty-first session).
    /// The tiles go through [`panels`] as they are: written as one loop of one-panel tiles,
    /// the 1.5B's `q4-a8` pass of 16 rows took 130-137 ms against 111-115 ms (codegen; the
    /// same operations).
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    fn grouped_tiles<T: Tiles, const M: usize>(
        simd: V3,
        tiles: T,
        row: impl Fn(usize) -> T::W,
        rows: Range<usize>,
        x_row: impl Fn(usize) -> T::X,
        blocks: usize,
        m: usize,
        outs: &mut [&mut [f32]],
    ) {
        debug_assert!(M == 0 || M == m);
        if M > 0 {
            panels::<T, PANEL, M, M>(simd, tiles, row, rows, x_row, blocks, m, outs)
        } else {
            sweep(simd, false, tiles, row, rows, x_row, blocks, m, outs)
        }
    }

    /// Tiles of `RR` weight rows (then 2, then 1 for the rows left) × `MT` rows of `x` while
    /// `MT` are left, then `REST` at a time (`REST` divides what is left), every row of `x`
    /// against a panel before the next panel.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    fn panels<T: Tiles, const RR: usize, const MT: usize, const REST: usize>(
        simd: V3,
        tiles: T,
        row: impl Fn(usize) -> T::W,
        rows: Range<usize>,
        x_row: impl Fn(usize) -> T::X,
        blocks: usize,
        m: usize,
        outs: &mut [&mut [f32]],
    ) {
        let start = rows.start;
        let mut r = start;
        macro_rules! x_tiles {
            ($rr:literal) => {{
                let mut i = 0;
                while m - i >= MT {
                    run_tile::<T, $rr, MT>(
                        simd,
                        tiles,
                        &row,
                        r,
                        r - start,
                        i,
                        &x_row,
                        blocks,
                        outs,
                    );
                    i += MT;
                }
                while i < m {
                    run_tile::<T, $rr, REST>(
                        simd,
                        tiles,
                        &row,
                        r,
                        r - start,
                        i,
                        &x_row,
                        blocks,
                        outs,
                    );
                    i += REST;
                }
                r += $rr;
            }};
        }
        while RR == 2 * PANEL && rows.end - r >= 2 * PANEL {
            x_tiles!(4);
        }
        while rows.end - r >= 2 {
            x_tiles!(2);
        }
        while r < rows.end {
            x_tiles!(1);
        }
    }

    /// [`grouped_sweep`] with `vpdpbusd` for `M` rows of `x` (1 to [`GROUPED_JOB_MAX_ROWS`]),
    /// run inside [`V4Vnni`]: a job of its own, so that neither the other layouts' tiles nor
    /// the other row counts' are compiled into its function.
    struct VnniJob<'a, 'b, const M: usize> {
        simd: V3,
        vnni: Vnni,
        product: Product<'a, 'b>,
    }

    impl<const M: usize> NullaryFnOnce for VnniJob<'_, '_, M> {
        type Output = ();

        #[inline(always)]
        fn call(self) {
            let VnniJob {
                simd,
                vnni,
                product:
                    Product {
                        mat,
                        rows,
                        x,
                        int8,
                        first,
                        m,
                        outs,
                    },
            } = self;
            grouped_sweep::<_, M>(simd, vnni, mat, rows, cast_slice(x), int8, first, m, outs);
        }
    }

    /// [`RoundOps`] in AVX2, the portable loops' operations on 8 values at a time (so the same
    /// bits): a vector maximum of `|v|` with a finiteness mask; per block `v · inv`, plus 0.5
    /// with `r`'s sign, truncated to i32 and narrowed with saturating packs (values are within
    /// ±127.5) back into order.
    impl RoundOps for V3 {
        #[inline(always)]
        fn abs_max(self, values: &[f32]) -> (f32, bool) {
            let (eights, rest) = values.as_chunks::<8>();
            let inf = self.splat_f32x8(f32::INFINITY);
            let mut amax = self.splat_f32x8(0.0);
            let mut finite = self.cmp_lt_f32x8(amax, inf);
            for &eight in eights {
                let a = self.abs_f32x8(cast(eight));
                amax = self.max_f32x8(amax, a);
                finite = self.and_m32x8(finite, self.cmp_lt_f32x8(a, inf));
            }
            let (tail, tail_finite) = crate::activations::Portable.abs_max(rest);
            let all = self.avx._mm256_movemask_ps(cast(finite)) == 0xFF;
            (self.reduce_max_f32s(amax).max(tail), all && tail_finite)
        }

        #[inline(always)]
        fn round_block(self, block: &[f32], inv: f32) -> [i8; BLOCK] {
            let Some(block) = block.as_chunks::<8>().0.get(..BLOCK / 8) else {
                return crate::activations::Portable.round_block(block, inv);
            };
            let inv = self.splat_f32x8(inv);
            let half = self.splat_f32x8(0.5);
            let sign = self.splat_f32x8(-0.0);
            let mut ints = [self.avx._mm256_setzero_si256(); 4];
            for (int, &eight) in ints.iter_mut().zip(block) {
                let r = self.mul_f32x8(cast(eight), inv);
                let half = self.or_f32x8(self.and_f32x8(r, sign), half);
                *int = self.avx._mm256_cvttps_epi32(cast(self.add_f32x8(r, half)));
            }
            let low = self.avx2._mm256_packs_epi32(ints[0], ints[1]);
            let high = self.avx2._mm256_packs_epi32(ints[2], ints[3]);
            let bytes = self.avx2._mm256_packs_epi16(low, high);
            // Packing works within 128-bit halves: dword `d` of `bytes` holds values
            // 4 · [0, 2, 4, 6, 1, 3, 5, 7][d] ..; put them back in order.
            let order = self.avx._mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
            cast(self.avx2._mm256_permutevar8x32_epi32(bytes, order))
        }

        #[inline(always)]
        fn half_sums(self, q: &[i8; BLOCK]) -> [i32; 2] {
            // Neighbouring quants summed in 16 bits (ones times signed bytes), then in fours
            // in 32 bits: exact, so the same sums as one by one.
            let pairs = self
                .avx2
                ._mm256_maddubs_epi16(self.avx._mm256_set1_epi8(1), cast(*q));
            let fours: [i32; 8] = cast(
                self.avx2
                    ._mm256_madd_epi16(pairs, self.avx._mm256_set1_epi16(1)),
            );
            let (first, second) = fours.split_at(4);
            [first.iter().sum(), second.iter().sum()]
        }
    }

    struct RoundJob<'a> {
        simd: V3,
        x: &'a [f32],
        padded_cols: usize,
        group: usize,
        interleave: Interleave,
    }

    impl NullaryFnOnce for RoundJob<'_> {
        type Output = QuantizedRows;

        #[inline(always)]
        fn call(self) -> QuantizedRows {
            let RoundJob {
                simd,
                x,
                padded_cols,
                group,
                interleave,
            } = self;
            QuantizedRows::with(simd, x, padded_cols, group, interleave)
        }
    }

    /// [`QuantizedRows::new`] with AVX2's loops, or `None` without AVX2.
    pub(crate) fn round_rows(
        x: &[f32],
        padded_cols: usize,
        group: usize,
        interleave: Interleave,
    ) -> Option<QuantizedRows> {
        let simd = V3::try_new()?;
        Some(simd.vectorize(RoundJob {
            simd,
            x,
            padded_cols,
            group,
            interleave,
        }))
    }

    /// Weights widened to f32 against the f32 rows of `x`.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    fn widened_sweep<W: Row>(
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
    trait AddSpan {
        /// Adds the pieces of a span (`span` blocks from block `start`, panel by panel) times
        /// the rows of `x` to `sums` (`sums[(row in group) * m + i]`).
        fn add_span(&self, pieces: &[[f32x8; 4]], start: usize, span: usize, sums: &mut [f32x8]);
    }

    /// What both orders of [`AddSpan`] multiply the pieces by: `m` rows of `x`, `blocks`
    /// blocks a row.
    #[derive(Clone, Copy)]
    struct SpanOperands<'a> {
        simd: V3,
        x: &'a [[f32x8; 4]],
        blocks: usize,
        m: usize,
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
                            pair_span_tile::<$m>(
                                simd, both, next, hint, x, blocks, start, i, m, sums,
                            )
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
    /// last), a group's odd last panel in one-panel tiles (as [`run_rows`]), so each output
    /// gets the same operations in the same order as from whole rows. The group's data is
    /// one sequential stream, and a span of `x` serves its 8 panels from L1.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    fn spanned_sweep(
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
    /// rounds, Zen 3, docs/benchmarks.md, twenty-sixth session).
    const SPAN_TILE_MAX_ROWS: usize = 16;

    /// A product of spanned f32 rows ([`span_width`]) with more than [`SPAN_TILE_MAX_ROWS`]
    /// rows of `x`, in its own SIMD context. Span by span, each tile of 4 rows of `x` runs
    /// over the group's panels in turn, so the tile's span of `x` (8 KB) stays in L1 while the
    /// group's pieces of the span (32 KB) are read again from L2 for each tile. Piece by
    /// piece instead (all the rows' span of `x` read from L2 for each piece, 128 KB at 64 rows),
    /// the 1.5B's products at 64 rows took 1.2-1.6 of the time of whole rows, this way
    /// 0.67-1.17 (alternated rounds, Zen 3, docs/benchmarks.md, twenty-fifth session).
    /// Compiled apart from [`Job`]: in the same function it slowed the tiles of 4 and 8 rows
    /// to the whole rows' time.
    struct SpannedPass<'a, 'b> {
        simd: V3,
        product: Product<'a, 'b>,
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
    fn spanned_product<'a, A: AddSpan>(
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

    /// The rows of `x` for which a spanned f32 product may take one tile of one or two panels ×
    /// all the rows on a CPU with AVX-512 ([`WideSpanJob`], [`SpanTile::TwoPanels`] and
    /// [`SpanTile::TwoPanelStreams`]); 16 registers split 6 or more rows into two tiles (4 + 2
    /// up to 4 + 4 + 4 + 4). The 1.5B's products (Zen 5, docs/benchmarks.md, thirty-first
    /// session; ÷ one row in the same round): 9 rows 1.28–1.39 → 0.99–1.15 in five alternated
    /// rounds, 16 rows 331–340 ms → 229–231 ms. From 4 rows the tiles are timed against AVX2's
    /// ([`crate::tiles`]).
    const WIDE_SPAN_ROWS: std::ops::RangeInclusive<usize> = 2..=SPAN_TILE_MAX_ROWS;

    /// A product of spanned f32 rows with `M` rows of `x` ([`WIDE_SPAN_ROWS`]) inside `V4`'s
    /// target features, each panel's piece of a span in one tile of all `M` rows
    /// ([`paired_tile`], `M` 16-lane sums; two panels at once up to [`TWO_PANEL_MAX_ROWS`],
    /// [`two_panel_tile`]): each weight vector streamed from memory serves every row at once,
    /// where two or more tiles of one panel (16 registers) stop the stream while the later
    /// ones read the piece again from L1. One job per `M` and hint layout, compiled apart (as
    /// [`VnniJob`]).
    /// `STREAMS`: [`SpanTile::TwoPanelStreams`]'s hints, else [`SpanTile::TwoPanels`]'.
    struct WideSpanJob<'a, 'b, const M: usize, const STREAMS: bool> {
        simd: V4,
        product: Product<'a, 'b>,
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
    /// docs/benchmarks.md, fifty-seventh session).
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
            // those loops kept their sums on the stack, loading and storing every sum each
            // block (the 9-row tile, Intel Xeon, fifty-seventh session).
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
        let mut acc_b: [__m512; M] =
            std::array::from_fn(|u| pair(sums[2 * m + u], sums[3 * m + u]));
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
    fn span_tile<const M: usize>(
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
    /// reloading all their 8 or 10 sums every block, this one 4 of its 12 (the 3-row loop). On the Zen 4 of the fifty-fourth session, whose loads (about one
    /// a cycle beside multiply-adds) bound these tiles, one thread on a product held in L2
    /// (`hot_product`) went from 5.2-7.1 to 10.2-13.5 GB/s at 9 rows, 11-13 to 19-23 at 5, and
    /// 22 to 50-65 at one; see docs/benchmarks.md for the model's products.
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

    /// Row `i` of `x` rounded to int8, `blocks` blocks a row.
    #[inline(always)]
    fn int8_row<'q>(q: &'q QuantizedRows, blocks: usize) -> impl Fn(usize) -> Int8Row<'q> + Copy {
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
    fn integer_sweep<W: IntRow>(
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

    /// The most rows of `x` that a grouped product with `vpdpbusd` takes in one tile (a job of
    /// its own for each count, see [`grouped_tiles`]); [`run`] gives more in near-equal chunks.
    /// Against the two-panel 4 × 4 tiles that took more than 8 rows before, the chunks of
    /// paired tiles took the 1.5B's `q4-a8` pass of 9 rows from 95-105 ms to 67-68 ms, of 16
    /// from 146-154 to 108-115, and its prefill from 140-149 to 181-185 tokens a second
    /// (docs/benchmarks.md, forty-sixth session).
    const GROUPED_JOB_MAX_ROWS: usize = 8;

    /// The most rows of `x` (a verification of K = 4) that f32's tall tiles take in three
    /// panels: against two, the 1.5B's f32 products took 0.87–0.94 of the time at 4 and 5 rows
    /// (`bench-forward`: forward(4) and forward(5) 0.86–0.97), 0.97–1.0 at 6 to 16, and a
    /// 128-token prompt in passes of 64 1.12 (bf16 and Q4 took 1.02–1.17 from 5 rows).
    const THREE_PANELS_MAX_ROWS: usize = 5;

    /// Rows of `x` at least this many bytes in all (f32) no longer sit in L1 beside a panel, so
    /// that tiles of two panels, which read each vector of `x` for 4 weight rows instead of 2,
    /// pay for f32 and bf16 weights (see [`tall_tiles`]).
    const TALL_X_BYTES: usize = 24 * 1024;

    /// Whether `m` rows of `x` against `mat` run in tiles of two panels (4 weight rows × 4
    /// rows of `x`; three for f32, [`Tiles::THREE_PANELS`]), given 32 registers for their
    /// sums. Each output keeps its operations and their order, so its bits, whatever the tile.
    /// Measured in one process against one-panel tiles, both orders of each pair
    /// (docs/benchmarks.md, nineteenth session):
    /// - f32 and bf16 pay once the rows of `x` leave L1 (0.78–0.94 of the time where they
    ///   fill 24 KB or more; 1.07–1.46 where they fit, as for SmolLM2 at up to 8 rows);
    /// - Q4 widened pays from 3 rows (0.71–0.93), Q8_0 widened from 16 (0.86–1.00: a prompt's
    ///   passes);
    /// - the integer tiles of the `*A8` formats do not take them ([`Tiles::TALL`]; per block
    ///   they took 1.01–1.20 of the time).
    fn tall_tiles(mat: &PackedMatrix, m: usize) -> bool {
        let x_bytes = m * mat.padded_cols() * size_of::<f32>();
        match &mat.storage {
            // Spanned f32 rows read `x` a span at a time, which fits L1.
            Storage::F32(_) if mat.spanned() => false,
            Storage::F32(_) | Storage::Bf16(_) => m >= 3 && x_bytes >= TALL_X_BYTES,
            Storage::Q4 { .. } => m >= 3,
            Storage::Q8_0 { .. } => m >= 16,
            Storage::Q8_0Groups { .. }
            | Storage::Q4A8 { .. }
            | Storage::Q4K { .. }
            | Storage::Q6K { .. } => false,
        }
    }

    /// Whether a product of `mat` with `avx512` set takes the tile it is given ([`run`]'s
    /// `span_tile`): f32 rows stored in spans, on a CPU with AVX-512.
    pub(crate) fn span_tiles_apply(mat: &PackedMatrix, avx512: bool) -> bool {
        avx512 && mat.spanned() && V4::try_new().is_some()
    }

    /// `outs[i][r - rows.start] = x[i] · W[r]`; `x` is `[m, padded_cols]`, and `int8` the same
    /// rows rounded to int8, which integer weights multiply instead when given (f32 and bf16
    /// weights, which have no integer path, then multiply `x`). With `avx512`, on a CPU with
    /// AVX-512, the integer tiles and the tiles of two panels ([`tall_tiles`]) are compiled for
    /// it (inside `V4`'s target features): the operations stay AVX2's (lane for lane; a
    /// [`paired_tile`] does two rows' in one 16-lane instruction), but 32 registers hold
    /// the sums that 16 would spill (the 1.5B's superblock products took 0.87–0.93 of the time
    /// at 3 to 8 rows, docs/benchmarks.md, eighteenth session; the one-panel tiles of the
    /// widened formats gain nothing, 0.98–1.06, but spanned f32 rows at 6 to 16 rows of `x`
    /// take one tile of all of them, [`WideSpanJob`]); the grouped layouts with VNNI too run inside
    /// [`V4Vnni`] with `vpdpbusd` (2.3× the multiply-adds a second of the per-block tile at 4 to
    /// 64 rows, one thread, docs/benchmarks.md, twentieth session).
    /// `span_tile` is the tile of a product of spanned f32 rows where the CPU has AVX-512 and
    /// `avx512` is set ([`span_tiles_apply`]); elsewhere it is not used.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn run(
        mat: &PackedMatrix,
        rows: Range<usize>,
        x: &[f32],
        int8: Option<&QuantizedRows>,
        m: usize,
        outs: &mut [&mut [f32]],
        avx512: bool,
        span_tile: SpanTile,
    ) {
        let tall = tall_tiles(mat, m);
        let grouped = mat.storage.interleave() != Interleave::No;
        if let (true, true, Some((context, vnni)), Some(simd)) =
            (avx512, grouped, vnni(), V3::try_new())
        {
            // More rows than a job takes go in near-equal chunks, each streaming this part's
            // weights again (from the caches after the first).
            let cols = mat.padded_cols();
            let chunks = m.div_ceil(GROUPED_JOB_MAX_ROWS).max(1);
            let mut first = 0;
            for chunk in 0..chunks {
                let size = (m - first).div_ceil(chunks - chunk);
                let product = Product {
                    mat,
                    rows: rows.clone(),
                    x: &x[first * cols..(first + size) * cols],
                    int8,
                    first,
                    m: size,
                    outs: &mut outs[first..first + size],
                };
                macro_rules! job {
                    ($m:literal) => {
                        context.vectorize(VnniJob::<$m> {
                            simd,
                            vnni,
                            product,
                        })
                    };
                }
                match size {
                    1 => job!(1),
                    2 => job!(2),
                    3 => job!(3),
                    4 => job!(4),
                    5 => job!(5),
                    6 => job!(6),
                    7 => job!(7),
                    _ => {
                        debug_assert_eq!(size, GROUPED_JOB_MAX_ROWS);
                        job!(8)
                    }
                }
                first += size;
            }
            return;
        }
        let product = Product {
            mat,
            rows,
            x,
            int8,
            first: 0,
            m,
            outs,
        };
        if let Some(v4) = V4::try_new().filter(|_| avx512 && (int8.is_some() || tall)) {
            return v4.vectorize(Job {
                simd: *v4,
                product,
                tall,
            });
        }
        if let Some(v4) = V4::try_new().filter(|_| {
            avx512
                && mat.spanned()
                && WIDE_SPAN_ROWS.contains(&m)
                && span_tile != SpanTile::EightLanes
        }) {
            macro_rules! wide {
                ($m:literal) => {
                    if span_tile == SpanTile::TwoPanelStreams {
                        v4.vectorize(WideSpanJob::<$m, true> { simd: v4, product })
                    } else {
                        v4.vectorize(WideSpanJob::<$m, false> { simd: v4, product })
                    }
                };
            }
            return match m {
                2 => wide!(2),
                3 => wide!(3),
                4 => wide!(4),
                5 => wide!(5),
                6 => wide!(6),
                7 => wide!(7),
                8 => wide!(8),
                9 => wide!(9),
                10 => wide!(10),
                11 => wide!(11),
                12 => wide!(12),
                13 => wide!(13),
                14 => wide!(14),
                15 => wide!(15),
                _ => wide!(16),
            };
        }
        if let Some(simd) = V3::try_new().filter(|_| mat.spanned() && m > SPAN_TILE_MAX_ROWS) {
            return simd.vectorize(SpannedPass { simd, product });
        }
        let Some(simd) = V3::try_new() else {
            let Product {
                mat,
                rows,
                x,
                int8,
                first: _,
                m,
                outs,
            } = product;
            return match int8 {
                Some(q) => crate::scalar::run(mat, rows, &q.dequantize(), m, outs),
                None => crate::scalar::run(mat, rows, x, m, outs),
            };
        };
        simd.vectorize(Job {
            simd,
            product,
            tall: false,
        })
    }
}

#[cfg(not(target_arch = "x86_64"))]
mod imp {
    use std::ops::Range;

    use crate::activations::QuantizedRows;
    use crate::pack::PackedMatrix;

    pub(crate) fn available() -> bool {
        false
    }

    pub(crate) fn instruction_set() -> &'static str {
        "portable"
    }

    pub(crate) fn round_rows(
        _x: &[f32],
        _padded_cols: usize,
        _group: usize,
        _interleave: crate::activations::Interleave,
    ) -> Option<QuantizedRows> {
        None
    }

    pub(crate) fn span_tiles_apply(_mat: &PackedMatrix, _avx512: bool) -> bool {
        false
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn run(
        mat: &PackedMatrix,
        rows: Range<usize>,
        x: &[f32],
        int8: Option<&QuantizedRows>,
        m: usize,
        outs: &mut [&mut [f32]],
        _avx512: bool,
        _span_tile: crate::tiles::SpanTile,
    ) {
        match int8 {
            Some(q) => crate::scalar::run(mat, rows, &q.dequantize(), m, outs),
            None => crate::scalar::run(mat, rows, x, m, outs),
        }
    }
}

pub(crate) use imp::{available, instruction_set, round_rows, run, span_tiles_apply};
