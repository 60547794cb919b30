//! Rounding rows of `x` to int8 with AVX2 ([`RoundOps`] for `V3`, [`round_rows`]), the same
//! bits as the portable loops.

use pulp::x86::V3;
use pulp::{NullaryFnOnce, Simd, cast};

use crate::activations::{Interleave, QuantizedRows, RoundOps};
use crate::pack::BLOCK;

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
