//! Attention's heads and SwiGLU's values run inside `vectorize` on the best [`Lanes`] the CPU
//! has: AVX-512 ([`Wide`]) where the caller allows it, else AVX2 + FMA, else the portable loops.

use std::ops::Range;

use pulp::NullaryFnOnce;
use pulp::x86::{V3, V4};

use super::attention::{Inputs, attend_heads};
use super::lanes::{Lanes, Portable};
use super::lanes_avx512::Wide;

struct HeadJob<'a, 'b, S> {
    simd: S,
    inputs: &'a Inputs<'a>,
    heads: Range<usize>,
    out: &'b mut [f32],
}

impl<S: Lanes> NullaryFnOnce for HeadJob<'_, '_, S> {
    type Output = ();

    #[inline(always)]
    fn call(self) {
        attend_heads(self.simd, self.inputs, self.heads, self.out);
    }
}

struct SiluJob<'a> {
    simd: V3,
    gate: &'a [f32],
    up: &'a [f32],
    out: &'a mut [f32],
}

impl NullaryFnOnce for SiluJob<'_> {
    type Output = ();

    #[inline(always)]
    fn call(self) {
        self.simd.silu_mul(self.gate, self.up, self.out);
    }
}

/// [`attend_heads`] with AVX2 + FMA (the caller checked that the CPU has them).
pub(super) fn attend_heads_simd(
    inputs: &Inputs<'_>,
    heads: Range<usize>,
    out: &mut [f32],
    wide: bool,
) {
    if let Some(v4) = V4::try_new().filter(|_| wide) {
        return v4.vectorize(HeadJob {
            simd: Wide(v4),
            inputs,
            heads,
            out,
        });
    }
    match V3::try_new() {
        Some(simd) => simd.vectorize(HeadJob {
            simd,
            inputs,
            heads,
            out,
        }),
        None => attend_heads(Portable, inputs, heads, out),
    }
}

pub(super) fn silu_mul_simd(gate: &[f32], up: &[f32], out: &mut [f32]) {
    match V3::try_new() {
        Some(simd) => simd.vectorize(SiluJob {
            simd,
            gate,
            up,
            out,
        }),
        None => Portable.silu_mul(gate, up, out),
    }
}
