//! [`Lanes`] with AVX-512 ([`Wide`]): two (head, row) pairs of attention in one 16-lane
//! register, each 8-lane half doing what AVX2's lanes do for one pair.

use core::arch::x86_64::__m512;
use pulp::bytemuck::{cast_slice, cast_slice_mut};
use pulp::core_arch::x86::Avx512f;
use pulp::x86::V4;
use pulp::{cast, f32x8};

use super::lanes::{Lanes, scores_each, weighted_sum_each};
use crate::avx2::{pair_halves, split_halves};

/// AVX-512's 16 lanes as two 8-lane halves: two (head, row) pairs at once, each half doing
/// lane for lane what [`V3`] does for one pair (same operands, same order, so the same
/// bits); a lone pair and anything else goes to [`V3`].
///
/// [`V3`]: pulp::x86::V3
#[derive(Clone, Copy)]
pub(super) struct Wide(pub(super) V4);

impl Wide {
    /// `a` in lanes 0-7, `b` in 8-15.
    #[inline(always)]
    fn halves(self, a: f32x8, b: f32x8) -> __m512 {
        pair_halves(self.0, a, b)
    }

    /// [`Wide::halves`] undone.
    #[inline(always)]
    fn split(self, v: __m512) -> (f32x8, f32x8) {
        split_halves(self.0, v)
    }

    /// [`dot8`] of two queries against the same 8 keys: each key's 8-lane vector broadcast
    /// to both halves, each half accumulating as [`dot8`] does, then the same reduction.
    ///
    /// [`dot8`]: super::lanes_avx2::dot8
    #[inline(always)]
    fn dot8_pair(self, qa: &[f32x8], qb: &[f32x8], k: &[f32x8]) -> (f32x8, f32x8) {
        // No closures here: a closure does not inherit `vectorize`'s target features.
        let (f, dq) = (self.0.avx512f, self.0.avx512dq);
        let nv = qa.len().min(qb.len());
        let (k0, k1, k2, k3) = (
            &k[..nv],
            &k[nv..2 * nv],
            &k[2 * nv..3 * nv],
            &k[3 * nv..4 * nv],
        );
        let (k4, k5, k6, k7) = (
            &k[4 * nv..5 * nv],
            &k[5 * nv..6 * nv],
            &k[6 * nv..7 * nv],
            &k[7 * nv..8 * nv],
        );
        let mut acc = [f._mm512_setzero_ps(); 8];
        for c in 0..nv {
            let q = self.halves(qa[c], qb[c]);
            acc[0] = f._mm512_fmadd_ps(q, dq._mm512_broadcast_f32x8(cast(k0[c])), acc[0]);
            acc[1] = f._mm512_fmadd_ps(q, dq._mm512_broadcast_f32x8(cast(k1[c])), acc[1]);
            acc[2] = f._mm512_fmadd_ps(q, dq._mm512_broadcast_f32x8(cast(k2[c])), acc[2]);
            acc[3] = f._mm512_fmadd_ps(q, dq._mm512_broadcast_f32x8(cast(k3[c])), acc[3]);
            acc[4] = f._mm512_fmadd_ps(q, dq._mm512_broadcast_f32x8(cast(k4[c])), acc[4]);
            acc[5] = f._mm512_fmadd_ps(q, dq._mm512_broadcast_f32x8(cast(k5[c])), acc[5]);
            acc[6] = f._mm512_fmadd_ps(q, dq._mm512_broadcast_f32x8(cast(k6[c])), acc[6]);
            acc[7] = f._mm512_fmadd_ps(q, dq._mm512_broadcast_f32x8(cast(k7[c])), acc[7]);
        }
        self.split(self.reduce8_pair(acc))
    }

    /// [`reduce8`](super::lanes_avx2::reduce8) of each half of `acc`, in one: the same additions of the same lanes in
    /// the same order (`vhaddps` adds a lane pair's upper lane to its lower one, and so do
    /// these), in 16 lanes.
    #[inline(always)]
    fn reduce8_pair(self, acc: [__m512; 8]) -> __m512 {
        let f = self.0.avx512f;
        let pairs = [
            hadd16(f, acc[0], acc[1]),
            hadd16(f, acc[2], acc[3]),
            hadd16(f, acc[4], acc[5]),
            hadd16(f, acc[6], acc[7]),
        ];
        let low = hadd16(f, pairs[0], pairs[1]);
        let high = hadd16(f, pairs[2], pairs[3]);
        // Each half: its `low`'s lower 128 bits beside its `high`'s (as `reduce8`'s
        // `lower`), and their upper 128 bits (`upper`); indices 16-31 name `high`'s lanes.
        let lower = f._mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26, 27);
        let upper = f._mm512_setr_epi32(4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15, 28, 29, 30, 31);
        let lower = f._mm512_permutex2var_ps(low, lower, high);
        let upper = f._mm512_permutex2var_ps(low, upper, high);
        f._mm512_add_ps(lower, upper)
    }
}

impl Lanes for Wide {
    #[inline(always)]
    fn scores(self, q: &[f32], keys: &[f32], d: usize, out: &mut [f32]) {
        (*self.0).scores(q, keys, d, out);
    }

    #[inline(always)]
    fn scale_bias_max(self, row: &mut [f32], bias: &[f32], scale: f32) -> f32 {
        (*self.0).scale_bias_max(row, bias, scale)
    }

    #[inline(always)]
    fn exp_shifted(self, xs: &mut [f32], shift: f32) {
        (*self.0).exp_shifted(xs, shift);
    }

    #[inline(always)]
    fn weighted_sum(self, weights: &[f32], values: &[f32], d: usize, out: &mut [f32]) {
        (*self.0).weighted_sum(weights, values, d, out);
    }

    #[inline(always)]
    fn silu_mul(self, gate: &[f32], up: &[f32], out: &mut [f32]) {
        (*self.0).silu_mul(gate, up, out);
    }

    #[inline(always)]
    fn scores_pair(self, q: [&[f32]; 2], keys: &[f32], d: usize, out: [&mut [f32]; 2]) {
        let total = out[0].len();
        // Fewer than 8 keys (padded in `V3::scores`) or an odd head size: one at a time.
        if !d.is_multiple_of(8) || d == 0 || total < 8 || out[1].len() != total {
            return scores_each(self, q, keys, d, out);
        }
        let (qa, qb): (&[f32x8], &[f32x8]) = (cast_slice(q[0]), cast_slice(q[1]));
        let [out_a, out_b] = out;
        // As `V3::scores`: blocks of 8 keys, then the last 8 keys again for a remainder.
        let whole = total / 8 * 8;
        let remainder = (whole < total).then_some(total - 8);
        for start in (0..whole).step_by(8).chain(remainder) {
            let block = cast_slice(&keys[start * d..(start + 8) * d]);
            let (a, b) = self.dot8_pair(qa, qb, block);
            out_a[start..start + 8].copy_from_slice(&cast::<f32x8, [f32; 8]>(a));
            out_b[start..start + 8].copy_from_slice(&cast::<f32x8, [f32; 8]>(b));
        }
    }

    #[inline(always)]
    fn weighted_sum_pair(
        self,
        weights: [&[f32]; 2],
        values: &[f32],
        d: usize,
        out: [&mut [f32]; 2],
    ) {
        let (wa, wb) = (weights[0], weights[1]);
        if !d.is_multiple_of(8) || d == 0 || wa.len() != wb.len() {
            return weighted_sum_each(self, weights, values, d, out);
        }
        let [out_a, out_b] = out;
        let nv = d / 8;
        let values: &[f32x8] = cast_slice(values);
        let out_a: &mut [f32x8] = cast_slice_mut(out_a);
        let out_b: &mut [f32x8] = cast_slice_mut(out_b);
        // As `V3::weighted_sum`, each half its own pair's: eight output vectors at a time,
        // a zero weight (a masked position) leaving its half untouched.
        let mut start = 0;
        while start < nv {
            let width = (nv - start).min(8);
            let mut acc = [self.0.avx512f._mm512_setzero_ps(); 8];
            for u in 0..width {
                acc[u] = self.halves(out_a[start + u], out_b[start + u]);
            }
            if width == 8 {
                self.weighted_sum_pair_8(wa, wb, values, nv, start, &mut acc);
            } else {
                for ((&a, &b), value) in wa.iter().zip(wb).zip(values.chunks_exact(nv)) {
                    let w = self.halves(self.0.splat_f32x8(a), self.0.splat_f32x8(b));
                    self.add_weighted(
                        w,
                        nonzero_halves(a, b),
                        &value[start..start + width],
                        &mut acc[..width],
                    );
                }
            }
            for u in 0..width {
                let (a, b) = self.split(acc[u]);
                out_a[start + u] = a;
                out_b[start + u] = b;
            }
            start += width;
        }
    }
}

/// [`hadd`](super::lanes_avx2::hadd) in each half of 16 lanes: lane pairs summed upper lane plus lower, as
/// `vhaddps` sums them.
#[inline(always)]
fn hadd16(f: Avx512f, a: __m512, b: __m512) -> __m512 {
    let lower = f._mm512_shuffle_ps::<0b10_00_10_00>(a, b);
    let upper = f._mm512_shuffle_ps::<0b11_01_11_01>(a, b);
    f._mm512_add_ps(upper, lower)
}

/// The mask of the halves whose weight is not zero (NaN included, as `!=` counts it).
#[inline(always)]
fn nonzero_halves(a: f32, b: f32) -> u16 {
    halves_mask(a != 0.0, b != 0.0)
}

/// The lanes of the lower half where `low`, and of the upper half where `high`.
#[inline(always)]
fn halves_mask(low: bool, high: bool) -> u16 {
    (u16::from(low) * 0x00ff) | (u16::from(high) * 0xff00)
}

impl Wide {
    /// `acc[u] += w · value[u]` in the halves `mask` keeps: one position's multiply-adds,
    /// each half [`V3::weighted_sum`](pulp::x86::V3::weighted_sum)'s for its pair, nothing where `mask` is 0.
    #[inline(always)]
    fn add_weighted(self, w: __m512, mask: u16, value: &[f32x8], acc: &mut [__m512]) {
        if mask == 0 {
            return;
        }
        let (f, dq) = (self.0.avx512f, self.0.avx512dq);
        for (acc, &v) in acc.iter_mut().zip(value) {
            let v = dq._mm512_broadcast_f32x8(cast(v));
            *acc = f._mm512_mask3_fmadd_ps(w, v, *acc, mask);
        }
    }

    /// The positions of [`Lanes::weighted_sum_pair`] for the eight output vectors from
    /// `start` (of `nv` a value row), into `acc`. Eight positions at a time, both pairs'
    /// weights in one register: where none of the sixteen is zero (a block of positions
    /// neither row masks), each position's weights are spread to the halves by one
    /// permutation and its multiply-adds go unmasked, which is what the masked ones do
    /// with every lane kept; otherwise, and for the last positions, one position at a
    /// time with its mask. The same multiply-adds in the same order either way.
    #[inline(always)]
    fn weighted_sum_pair_8(
        self,
        wa: &[f32],
        wb: &[f32],
        values: &[f32x8],
        nv: usize,
        start: usize,
        acc: &mut [__m512; 8],
    ) {
        let f = self.0.avx512f;
        let dq = self.0.avx512dq;
        let positions = wa.len().min(wb.len()).min(values.len() / nv.max(1));
        let whole = positions / 8 * 8;
        let zero = f._mm512_setzero_ps();
        // `spread[p]` takes lane `p` of each half to the whole half.
        let mut spread = [f._mm512_setzero_si512(); 8];
        for (p, spread) in (0..8).zip(&mut spread) {
            let (low, high) = (f._mm512_set1_epi32(p), f._mm512_set1_epi32(8 + p));
            *spread = f._mm512_mask_blend_epi32(0xff00, low, high);
        }
        let rows = values.chunks_exact(8 * nv);
        let weights = cast_slice::<f32, f32x8>(&wa[..whole])
            .iter()
            .zip(cast_slice::<f32, f32x8>(&wb[..whole]));
        for ((&a, &b), rows) in weights.zip(rows) {
            let ab = self.halves(a, b);
            // `_CMP_NEQ_UQ`: true for NaN, as `!=` is.
            let nonzero = f._mm512_cmp_ps_mask::<4>(ab, zero);
            for (p, (value, &spread)) in rows.chunks_exact(nv).zip(&spread).enumerate() {
                let w = f._mm512_permutexvar_ps(spread, ab);
                let value = &value[start..start + 8];
                if nonzero == 0xffff {
                    for (acc, &v) in acc.iter_mut().zip(value) {
                        let v = dq._mm512_broadcast_f32x8(cast(v));
                        *acc = f._mm512_fmadd_ps(w, v, *acc);
                    }
                } else {
                    let kept = |lane: usize| nonzero >> lane & 1 != 0;
                    self.add_weighted(w, halves_mask(kept(p), kept(8 + p)), value, acc);
                }
            }
        }
        let tail = wa[whole..positions]
            .iter()
            .zip(&wb[whole..positions])
            .zip(values[whole * nv..].chunks_exact(nv));
        for ((&a, &b), value) in tail {
            let w = self.halves(self.0.splat_f32x8(a), self.0.splat_f32x8(b));
            self.add_weighted(w, nonzero_halves(a, b), &value[start..start + 8], acc);
        }
    }
}
