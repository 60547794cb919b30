//! [`Lanes`] with AVX2 + FMA ([`V3`], 8 lanes): attention's scores 8 keys at a time, its
//! weighted sums 8 output vectors at a time in registers, and a vectorized `e^x` for the
//! softmax and SwiGLU.

use pulp::bytemuck::{cast_slice, cast_slice_mut};
use pulp::x86::V3;
use pulp::{cast, f32x8, i32x8};

use super::lanes::{Lanes, Portable};

/// `ln 2` split so that `n · LN2_HI` is exact for the `n` [`exp`] meets.
const LN2_HI: f32 = 0.693_145_75;
const LN2_LO: f32 = 1.428_606_8e-6;
/// Below this `e^x` is 0 in f32 (`e^−103.97` is half the smallest subnormal).
const EXP_ZERO_BELOW: f32 = -104.0;
/// Above this `e^x` overflows to +∞ (`ln f32::MAX` is 88.72).
const EXP_CLAMP_ABOVE: f32 = 89.0;

/// `e^x` lane by lane within 2 ulp: `x = n ln 2 + r` with `|r| ≤ ln 2 / 2`, `e^r` by its
/// Taylor polynomial to degree 7 (truncation error `r⁸/8! < 6e-9`), times `2^n` applied as
/// two factors so that subnormal and overflowing results come out as IEEE rounding gives
/// them. −∞ gives 0, +∞ gives +∞, NaN stays NaN.
#[inline(always)]
fn exp(simd: V3, x: f32x8) -> f32x8 {
    let lo = simd.splat_f32x8(EXP_ZERO_BELOW);
    let clamped = simd.min_f32x8(simd.max_f32x8(x, lo), simd.splat_f32x8(EXP_CLAMP_ABOVE));
    let n = simd.round_f32x8(simd.mul_f32x8(clamped, simd.splat_f32x8(std::f32::consts::LOG2_E)));
    let r = simd.negate_mul_add_f32x8(n, simd.splat_f32x8(LN2_HI), clamped);
    let r = simd.negate_mul_add_f32x8(n, simd.splat_f32x8(LN2_LO), r);
    let mut p = simd.splat_f32x8(1.0 / 5040.0);
    for c in [
        1.0 / 720.0,
        1.0 / 120.0,
        1.0 / 24.0,
        1.0 / 6.0,
        0.5,
        1.0,
        1.0,
    ] {
        p = simd.mul_add_f32x8(p, r, simd.splat_f32x8(c));
    }
    let n: i32x8 = simd.convert_f32x8_to_i32x8(n);
    let half: i32x8 = cast(simd.avx2._mm256_srai_epi32::<1>(cast(n)));
    let rest: i32x8 = cast(simd.avx2._mm256_sub_epi32(cast(n), cast(half)));
    let y = simd.mul_f32x8(simd.mul_f32x8(p, two_to(simd, half)), two_to(simd, rest));
    let y = simd.select_f32x8(simd.cmp_lt_f32x8(x, lo), simd.splat_f32x8(0.0), y);
    simd.select_f32x8(simd.is_nan_f32x8(x), x, y)
}

/// `2^e` lane by lane for `−126 ≤ e ≤ 127`. (No closures in this module: a closure does
/// not inherit the target features `vectorize` enables, and its intrinsics become calls.)
#[inline(always)]
fn two_to(simd: V3, e: i32x8) -> f32x8 {
    let biased = simd
        .avx2
        ._mm256_add_epi32(cast(e), cast(simd.splat_i32x8(127)));
    cast(simd.avx2._mm256_slli_epi32::<23>(biased))
}

/// `q · k_l` for the 8 keys `k` (`[8, q.len()]` vectors), lane `l`. Each key's 8 lane sums
/// are reduced in the same order ((0+1)+(2+3)) + ((4+5)+(6+7)), whichever lane it takes.
#[inline(always)]
pub(super) fn dot8(simd: V3, q: &[f32x8], k: &[f32x8]) -> f32x8 {
    let nv = q.len();
    // Eight independent multiply-add chains in registers; slices of length `nv` so that
    // indexing by `c < nv` needs no bounds checks.
    let key = |l: usize| &k[l * nv..(l + 1) * nv];
    let (k0, k1, k2, k3) = (key(0), key(1), key(2), key(3));
    let (k4, k5, k6, k7) = (key(4), key(5), key(6), key(7));
    let mut acc = [simd.splat_f32x8(0.0); 8];
    for (c, &qc) in q.iter().enumerate() {
        acc[0] = simd.mul_add_f32x8(qc, k0[c], acc[0]);
        acc[1] = simd.mul_add_f32x8(qc, k1[c], acc[1]);
        acc[2] = simd.mul_add_f32x8(qc, k2[c], acc[2]);
        acc[3] = simd.mul_add_f32x8(qc, k3[c], acc[3]);
        acc[4] = simd.mul_add_f32x8(qc, k4[c], acc[4]);
        acc[5] = simd.mul_add_f32x8(qc, k5[c], acc[5]);
        acc[6] = simd.mul_add_f32x8(qc, k6[c], acc[6]);
        acc[7] = simd.mul_add_f32x8(qc, k7[c], acc[7]);
    }
    reduce8(simd, acc)
}

/// Lane `l` of the result: the sum of `acc[l]`'s 8 lanes, in the order
/// ((0+1)+(2+3)) + ((4+5)+(6+7)).
#[inline(always)]
pub(super) fn reduce8(simd: V3, acc: [f32x8; 8]) -> f32x8 {
    let pairs = [
        hadd(simd, acc[0], acc[1]),
        hadd(simd, acc[2], acc[3]),
        hadd(simd, acc[4], acc[5]),
        hadd(simd, acc[6], acc[7]),
    ];
    let (low, high) = (
        hadd(simd, pairs[0], pairs[1]),
        hadd(simd, pairs[2], pairs[3]),
    );
    let lower = simd
        .avx
        ._mm256_permute2f128_ps::<0x20>(cast(low), cast(high));
    let upper = simd
        .avx
        ._mm256_permute2f128_ps::<0x31>(cast(low), cast(high));
    simd.add_f32x8(cast(lower), cast(upper))
}

/// Sums of neighbouring lanes: `[a0+a1, a2+a3, b0+b1, b2+b3]` in each 128-bit half.
#[inline(always)]
pub(super) fn hadd(simd: V3, a: f32x8, b: f32x8) -> f32x8 {
    cast(simd.avx._mm256_hadd_ps(cast(a), cast(b)))
}

impl Lanes for V3 {
    #[inline(always)]
    fn scores(self, q: &[f32], keys: &[f32], d: usize, out: &mut [f32]) {
        if !d.is_multiple_of(8) || d == 0 {
            return Portable.scores(q, keys, d, out);
        }
        let q: &[f32x8] = cast_slice(q);
        let total = out.len();
        let whole = total / 8 * 8;
        for (block, out) in keys[..whole * d]
            .chunks_exact(8 * d)
            .zip(out[..whole].chunks_exact_mut(8))
        {
            let s: [f32; 8] = cast(dot8(self, q, cast_slice(block)));
            out.copy_from_slice(&s);
        }
        if whole < total && total >= 8 {
            // The last 8 keys again: a key's score does not depend on its slot, so the ones
            // already computed come out the same.
            let start = total - 8;
            let s: [f32; 8] = cast(dot8(self, q, cast_slice(&keys[start * d..total * d])));
            out[start..].copy_from_slice(&s);
        } else if whole < total {
            // Fewer than 8 keys: zero keys after them, through the same reduction.
            let mut block = vec![0.0f32; 8 * d];
            block[..total * d].copy_from_slice(&keys[..total * d]);
            let s: [f32; 8] = cast(dot8(self, q, cast_slice(&block)));
            out.copy_from_slice(&s[..total]);
        }
    }

    #[inline(always)]
    fn scale_bias_max(self, row: &mut [f32], bias: &[f32], scale: f32) -> f32 {
        let len = row.len().min(bias.len());
        let whole = len / 8 * 8;
        let (head, tail) = row[..len].split_at_mut(whole);
        let (bias_head, bias_tail) = bias[..len].split_at(whole);
        let scale_v = self.splat_f32x8(scale);
        let mut max_v = self.splat_f32x8(f32::NEG_INFINITY);
        for (v, &b) in cast_slice_mut::<f32, f32x8>(head)
            .iter_mut()
            .zip(cast_slice::<f32, f32x8>(bias_head))
        {
            // A multiplication, then an addition: the scalar loop's two roundings.
            *v = self.add_f32x8(self.mul_f32x8(*v, scale_v), b);
            // `vmaxps` returns its second operand where either is NaN: a NaN score is
            // passed over, as `f32::max` passes it over.
            max_v = cast(self.avx._mm256_max_ps(cast(*v), cast(max_v)));
        }
        let mut max = Portable.scale_bias_max(tail, bias_tail, scale);
        for m in cast::<f32x8, [f32; 8]>(max_v) {
            max = max.max(m);
        }
        max
    }

    #[inline(always)]
    fn exp_shifted(self, xs: &mut [f32], shift: f32) {
        let shift = self.splat_f32x8(shift);
        let whole = xs.len() / 8 * 8;
        let (head, tail) = xs.split_at_mut(whole);
        for v in cast_slice_mut::<f32, f32x8>(head) {
            *v = exp(self, self.sub_f32x8(*v, shift));
        }
        if !tail.is_empty() {
            let mut buf = [0.0f32; 8];
            buf[..tail.len()].copy_from_slice(tail);
            let y: [f32; 8] = cast(exp(self, self.sub_f32x8(cast(buf), shift)));
            tail.copy_from_slice(&y[..tail.len()]);
        }
    }

    #[inline(always)]
    fn weighted_sum(self, weights: &[f32], values: &[f32], d: usize, out: &mut [f32]) {
        if !d.is_multiple_of(8) || d == 0 {
            return Portable.weighted_sum(weights, values, d, out);
        }
        let nv = d / 8;
        let values: &[f32x8] = cast_slice(values);
        let out: &mut [f32x8] = cast_slice_mut(out);
        // Eight vectors of the output at a time stay in registers over all positions; the
        // same multiply-adds in the same order as one vector at a time.
        let mut start = 0;
        while start < nv {
            let width = (nv - start).min(8);
            let mut acc = [self.splat_f32x8(0.0); 8];
            acc[..width].copy_from_slice(&out[start..start + width]);
            for (&w, value) in weights.iter().zip(values.chunks_exact(nv)) {
                if w != 0.0 {
                    let w = self.splat_f32x8(w);
                    if width == 8 {
                        for (acc, &v) in acc.iter_mut().zip(&value[start..start + 8]) {
                            *acc = self.mul_add_f32x8(w, v, *acc);
                        }
                    } else {
                        for (acc, &v) in acc.iter_mut().zip(&value[start..start + width]) {
                            *acc = self.mul_add_f32x8(w, v, *acc);
                        }
                    }
                }
            }
            out[start..start + width].copy_from_slice(&acc[..width]);
            start += width;
        }
    }

    #[inline(always)]
    fn silu_mul(self, gate: &[f32], up: &[f32], out: &mut [f32]) {
        let whole = out.len().min(gate.len()).min(up.len()) / 8 * 8;
        let one = self.splat_f32x8(1.0);
        let gates: &[f32x8] = cast_slice(&gate[..whole]);
        let ups: &[f32x8] = cast_slice(&up[..whole]);
        let (outs, out_tail) = out.split_at_mut(whole);
        for ((o, &g), &u) in cast_slice_mut::<f32, f32x8>(outs)
            .iter_mut()
            .zip(gates)
            .zip(ups)
        {
            let e = exp(self, self.sub_f32x8(self.splat_f32x8(0.0), g));
            *o = self.div_f32x8(self.mul_f32x8(g, u), self.add_f32x8(one, e));
        }
        for ((o, &g), &u) in out_tail.iter_mut().zip(&gate[whole..]).zip(&up[whole..]) {
            let e: [f32; 8] = cast(exp(self, self.splat_f32x8(-g)));
            *o = g * u / (1.0 + e[0]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn simd_exp_is_within_two_ulp() {
        let Some(simd) = pulp::x86::V3::try_new() else {
            return;
        };
        let ulps = |a: f32, b: f32| (a.to_bits() as i64 - b.to_bits() as i64).abs();
        let mut xs: Vec<f32> = (0..200_000).map(|i| -110.0 + i as f32 * 0.001).collect();
        xs.extend([
            0.0, -0.0, 1.0, 88.7, 88.72, 88.73, -87.3, -103.0, -103.9, -104.5,
        ]);
        for chunk in xs.chunks(8) {
            let mut lanes = [0.0f32; 8];
            lanes[..chunk.len()].copy_from_slice(chunk);
            let got: [f32; 8] = pulp::cast(simd.vectorize(|| exp(simd, pulp::cast(lanes))));
            for (&x, &y) in chunk.iter().zip(&got) {
                let want = (x as f64).exp() as f32;
                assert!(ulps(y, want) <= 2, "e^{x}: {y} vs {want}");
            }
        }
        let special = [
            f32::NEG_INFINITY,
            f32::INFINITY,
            f32::NAN,
            -1e30,
            1e30,
            0.0,
            0.0,
            0.0,
        ];
        let got: [f32; 8] = pulp::cast(simd.vectorize(|| exp(simd, pulp::cast(special))));
        assert_eq!(got[0], 0.0);
        assert_eq!(got[1], f32::INFINITY);
        assert!(got[2].is_nan());
        assert_eq!(got[3], 0.0);
        assert_eq!(got[4], f32::INFINITY);
        assert_eq!(got[5], 1.0);
    }
}
