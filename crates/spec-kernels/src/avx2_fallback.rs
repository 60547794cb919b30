//! The kernel's entry points where the target is not x86-64: no SIMD, so every product runs
//! the portable loop (`crate::scalar`) and nothing is rounded ahead of it.

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
