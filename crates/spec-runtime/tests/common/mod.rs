//! What the backend comparison tests (`equivalence.rs`, `one_row.rs`) share: how close two
//! backends' results must be, and the check itself.

// Each test file uses a part of this module, and which part depends on the backend features.
#![allow(dead_code)]

/// Relative error allowed where nothing says otherwise (flex, wgpu): f32 rounding of the same
/// sums taken in another order.
pub(crate) const F32_TOLERANCE: f32 = 1e-4;

/// On cuda, burn's matmul (cubek 0.2) runs f32 products on tensor cores in TF32 (10-bit
/// mantissa, unit roundoff 2⁻¹¹ ≈ 4.9e-4) where the GPU has them: on an H100 the equivalence
/// tests differ by up to 1.1e-3 relative and the one-row tests by 6.1e-4 (logits) and 3.5e-4 (a
/// product) (docs/benchmarks.md at 85e2838, "On a lent H100: cuda tests and issue 5's table";
/// docs/notes/cuda-host-dispatch.md, "TF32"). 4e-3 leaves room for that and still fails on a
/// wrong mask, position or misread weight, which move results by tens of percent.
#[cfg(feature = "cuda")]
pub(crate) const TF32_TOLERANCE: f32 = 4e-3;

/// max |got − want| / max |want| over the row, at most `tolerance`.
pub(crate) fn assert_close(got: &[f32], want: &[f32], tolerance: f32, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    let scale = want.iter().fold(0f32, |m, x| m.max(x.abs())).max(1e-6);
    let err = got
        .iter()
        .zip(want)
        .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
    assert!(
        err / scale <= tolerance,
        "{what}: relative error {} (max abs diff {err}, scale {scale})",
        err / scale
    );
}
