//! The vector operations attention and SwiGLU are made of ([`Lanes`]), and their plain loops
//! for any CPU ([`Portable`]). `lanes_avx2` and `lanes_avx512` implement them per instruction
//! set.

use super::dot;

/// The vector operations attention is made of, per instruction set.
pub(super) trait Lanes: Copy {
    /// `out[j] = q · keys[j]` for the `out.len()` keys of `keys` (`[_, d]`).
    fn scores(self, q: &[f32], keys: &[f32], d: usize, out: &mut [f32]);
    /// `row[j] = row[j] · scale + bias[j]`, then the largest of them (NaNs ignored, as
    /// `f32::max` does; a zero's sign is immaterial to the shift it becomes).
    fn scale_bias_max(self, row: &mut [f32], bias: &[f32], scale: f32) -> f32;
    /// `xs[j] = e^(xs[j] − shift)`.
    fn exp_shifted(self, xs: &mut [f32], shift: f32);
    /// `out += Σ_j weights[j] · values[j]` in position order, skipping zero weights (masked
    /// positions), over the `weights.len()` rows of `values` (`[_, d]`).
    fn weighted_sum(self, weights: &[f32], values: &[f32], d: usize, out: &mut [f32]);
    /// [`Lanes::scores`] of two queries against the same keys, each bit for bit as alone.
    // Inlined like every method here: a default method is compiled once, without the target
    // features of the `vectorize` call it serves, and its intrinsics would become calls.
    #[inline(always)]
    fn scores_pair(self, q: [&[f32]; 2], keys: &[f32], d: usize, out: [&mut [f32]; 2]) {
        scores_each(self, q, keys, d, out);
    }
    /// [`Lanes::weighted_sum`] of two rows of weights over the same values, each bit for bit as
    /// alone.
    #[inline(always)]
    fn weighted_sum_pair(
        self,
        weights: [&[f32]; 2],
        values: &[f32],
        d: usize,
        out: [&mut [f32]; 2],
    ) {
        weighted_sum_each(self, weights, values, d, out);
    }
    /// `out = silu(gate) · up`.
    fn silu_mul(self, gate: &[f32], up: &[f32], out: &mut [f32]);
}

/// [`Lanes::scores_pair`] as two [`Lanes::scores`]: the default, and where a pairing does not
/// apply.
#[inline(always)]
pub(super) fn scores_each<L: Lanes>(
    lanes: L,
    q: [&[f32]; 2],
    keys: &[f32],
    d: usize,
    out: [&mut [f32]; 2],
) {
    let [out_a, out_b] = out;
    lanes.scores(q[0], keys, d, out_a);
    lanes.scores(q[1], keys, d, out_b);
}

/// [`Lanes::weighted_sum_pair`] as two [`Lanes::weighted_sum`]: the default, and where a
/// pairing does not apply.
#[inline(always)]
pub(super) fn weighted_sum_each<L: Lanes>(
    lanes: L,
    weights: [&[f32]; 2],
    values: &[f32],
    d: usize,
    out: [&mut [f32]; 2],
) {
    let [out_a, out_b] = out;
    lanes.weighted_sum(weights[0], values, d, out_a);
    lanes.weighted_sum(weights[1], values, d, out_b);
}

/// Plain loops, for any CPU.
#[derive(Clone, Copy)]
pub(super) struct Portable;

impl Lanes for Portable {
    fn scale_bias_max(self, row: &mut [f32], bias: &[f32], scale: f32) -> f32 {
        let mut max = f32::NEG_INFINITY;
        for (score, &b) in row.iter_mut().zip(bias) {
            *score = *score * scale + b;
            max = max.max(*score);
        }
        max
    }

    fn scores(self, q: &[f32], keys: &[f32], d: usize, out: &mut [f32]) {
        for (score, key) in out.iter_mut().zip(keys.chunks_exact(d)) {
            *score = dot(q, key);
        }
    }

    fn exp_shifted(self, xs: &mut [f32], shift: f32) {
        for x in xs {
            *x = (*x - shift).exp();
        }
    }

    fn weighted_sum(self, weights: &[f32], values: &[f32], d: usize, out: &mut [f32]) {
        for (&w, value) in weights.iter().zip(values.chunks_exact(d)) {
            if w != 0.0 {
                for (o, &v) in out.iter_mut().zip(value) {
                    *o += w * v;
                }
            }
        }
    }

    fn silu_mul(self, gate: &[f32], up: &[f32], out: &mut [f32]) {
        for ((o, &g), &u) in out.iter_mut().zip(gate).zip(up) {
            *o = g / (1.0 + (-g).exp()) * u;
        }
    }
}
