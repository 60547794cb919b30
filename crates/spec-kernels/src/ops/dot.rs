//! The portable dot product: attention's scores in the portable loops, and the sums of squares
//! of `spec-runtime`'s RMS norms.

/// `a · b` in eight lanes (lane `l` sums elements `l`, `l + 8`, …; the lanes, then the tail
/// past the last multiple of 8, are added in order): plain Rust, the same bits on every CPU.
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut lanes = [0.0f32; 8];
    let whole = a.len().min(b.len()) / 8 * 8;
    for (x, y) in a[..whole].chunks_exact(8).zip(b[..whole].chunks_exact(8)) {
        for l in 0..8 {
            lanes[l] += x[l] * y[l];
        }
    }
    let tail: f32 = a[whole..].iter().zip(&b[whole..]).map(|(x, y)| x * y).sum();
    lanes.iter().sum::<f32>() + tail
}
