//! Rows of Q4_K and Q6_K superblocks kept as they are ([`Q4KRow`], [`Q6KRow`]), as the
//! grouped tiles read them ([`GroupRow`]).

use core::arch::x86_64::{__m128i, __m256i};
use pulp::x86::V3;
use pulp::{cast, f32x8, u8x16};

use crate::pack::PANEL;

use super::grouped::GroupRow;
use super::hints::{GROUPED_PREFETCH_AHEAD_BYTES, Hint, prefetch_lines};
use super::int8::Int8Row;

/// A row of Q4_K superblocks kept as they are (see `Storage::Q4K`).
#[derive(Clone, Copy)]
pub(super) struct Q4KRow<'a> {
    /// The panel's grouped nibbles, 32-byte loads (see `Storage::Q4K`).
    pub(super) quants: &'a [[u64; 4]],
    /// The panel's superblocks' 6-bit scales (8 bytes a word) and steps.
    pub(super) scales: &'a [u64],
    pub(super) steps: &'a [f32],
    /// This row's superblocks' minimums (8 bytes a word) and negated minimum steps.
    pub(super) mins: &'a [u64],
    pub(super) neg_min_steps: &'a [f32],
    pub(super) lane: usize,
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
pub(super) struct Q6KRow<'a> {
    /// The panel's grouped low nibbles and high bits, 32-byte loads.
    pub(super) lows: &'a [[u64; 4]],
    pub(super) highs: &'a [[u64; 4]],
    pub(super) scales: &'a [[u64; 2]],
    pub(super) steps: &'a [f32],
    pub(super) lane: usize,
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
