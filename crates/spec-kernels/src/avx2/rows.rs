//! Each format's weight rows as the widened tiles read them ([`Row`]): a block of 32 weights
//! as four f32 vectors, and the prefetch of the block's panel.

use pulp::x86::V3;
use pulp::{cast, f32x8, i8x16, u8x16, u32x8};

use crate::pack::PANEL;

use super::hints::{Hint, prefetch_lines, prefetch_quantized};

/// A weight row as 32-weight blocks, each read as four f32 vectors of 8 consecutive weights.
pub(super) trait Row: Copy {
    /// Weights `32 b + 8 j .. 32 b + 8 j + 8` widened to f32, `j < 4`.
    fn part(self, simd: V3, b: usize, j: usize) -> f32x8;
    /// Asks for block `b` of this row's panel (every row of it) with `hint`'s instruction.
    fn prefetch(self, simd: V3, hint: Hint, b: usize);
    /// Bytes of one block of a whole panel (what [`Row::prefetch`] asks for).
    const PANEL_BLOCK_BYTES: usize;
    /// The fewest rows of `x` for which a tile hints its weights ahead ([`Row::prefetch`])
    /// where the hints are non-temporal; hinted into L1, every tile hints
    /// ([`hints_weights`]).
    ///
    /// [`hints_weights`]: super::hints::hints_weights
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

/// A row's panel (its blocks interleaved with the panel's other rows) and its place in it.
#[derive(Clone, Copy)]
pub(super) struct F32Row<'a>(pub(super) &'a [[f32x8; 4]], pub(super) usize);

impl Row for F32Row<'_> {
    const PANEL_BLOCK_BYTES: usize = PANEL * 128;
    // On AMD f32's tiles of one and two rows stream fast enough for the hardware
    // prefetcher alone: hints measured 0-7% slower at one row (Zen 4), and at two the
    // 1.5B's products took 1.24-1.27 of one row's time with them against 1.15 without
    // (Zen 3, docs/benchmarks.md at 295319a, "f32 tiles of two rows without hints"). From
    // three rows on they pay.
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
///
/// [`spanned_sweep`]: super::spans::spanned_sweep
#[derive(Clone, Copy)]
pub(super) struct SpanRow<'a>(pub(super) F32Row<'a>);

impl SpanRow<'_> {
    /// The hint of AVX-512's tiles of a span (`wide_spans::two_panel_tile` and `paired_tile`):
    /// as [`SpanRow::hint`], but for AMD, where they are non-temporal as measured on the Zen 5
    /// (docs/notes/cpu-kernels.md, "Prefetch hints"; docs/benchmarks.md at 83f3a5b, "One tile
    /// of every row for 6 to 16 rows in f32 on AVX-512", and at 5609f70, "Each panel its own
    /// stream of hints"); into L2 is not measured there.
    #[inline(always)]
    pub(super) fn wide_hint(cpu: Hint) -> Hint {
        match cpu {
            Hint::NonTemporal => Hint::NonTemporal,
            other => <Self as Row>::hint(other),
        }
    }
}

impl Row for SpanRow<'_> {
    const PANEL_BLOCK_BYTES: usize = F32Row::PANEL_BLOCK_BYTES;
    // Not consulted: `hints_weights` sees spans hint only into L2 ([`SpanRow::hint`]; the
    // AVX-512 tiles hint without asking it). Non-temporal from two rows, on AMD two rows
    // took 0.88-1.01 of one row's time against 1.05-1.12 from three (the 1.5B's products,
    // Zen 3, docs/benchmarks.md at d7069f5, "f32 rows in spans").
    const NON_TEMPORAL_FROM_ROWS: usize = 2;
    const TEMPORARIES: usize = 0;

    #[inline(always)]
    fn part(self, simd: V3, b: usize, j: usize) -> f32x8 {
        self.0.part(simd, b, j)
    }

    /// Into L2 (`prefetcht1`) on every CPU, at every row count. On AMD not non-temporal: on a Zen 4
    /// (AVX2 only) the 1.5B's products from memory (`model_products`, one-panel tiles, three
    /// alternated runs) took 181-237 ms against 221-253 at 2 rows, 272-320 against 346-384 at 5 and
    /// 471-547 against 580-616 at 9 (docs/benchmarks.md at c3e1215, "AVX2 tiles of two panels × 3
    /// rows for f32 spans"). On Intel not into L1: on a Xeon (family 6, model 167 as its VM reports
    /// it) the 1.5B's f32 passes (`spec bench-forward`, two alternated rounds) took 216 ms against
    /// 232-237 at one row, 234-236 against 269-270 at 3 rows, 242-243 against 256-260 at 5 and
    /// 273-276 against 281-288 at 9 (docs/notes/cpu-kernels.md, "Prefetch hints";
    /// docs/benchmarks.md at fea6e67, "f32 spans hinted into L2 on every CPU").
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
pub(super) struct Bf16Row<'a>(pub(super) &'a [[u32x8; 2]], pub(super) usize);

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
pub(super) struct Q8Row<'a> {
    /// A block's quants in order, as four words of 8.
    pub(super) quants: &'a [[u64; 4]],
    pub(super) scales: &'a [f32],
    pub(super) lane: usize,
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
pub(super) struct Pairs<'a>(pub(super) &'a [[f32; 2]]);

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
pub(super) struct Apart<'a> {
    pub(super) scales: &'a [f32],
    pub(super) mins: &'a [f32],
    pub(super) first_min: usize,
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
pub(super) struct Q4Row<'a, S> {
    /// A block's quants as two words of 16 nibbles (see `Storage::Q4`).
    pub(super) quants: &'a [[u64; 2]],
    pub(super) side: S,
    pub(super) lane: usize,
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
