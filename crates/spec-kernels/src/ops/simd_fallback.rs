//! The SIMD entry points where x86-64's are not compiled: the portable loops.

use std::ops::Range;

use super::attention::{Inputs, attend_heads};
use super::lanes::{Lanes, Portable};

pub(super) fn attend_heads_simd(
    inputs: &Inputs<'_>,
    heads: Range<usize>,
    out: &mut [f32],
    _wide: bool,
) {
    attend_heads(Portable, inputs, heads, out);
}

pub(super) fn silu_mul_simd(gate: &[f32], up: &[f32], out: &mut [f32]) {
    Portable.silu_mul(gate, up, out);
}
