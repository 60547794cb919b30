//! The rest of a decoder layer's host step besides the products: attention over a KV cache and
//! SwiGLU, with AVX2 + FMA (detected at run time, as for the products) or portable loops.
//!
//! Written as plain loops these cost as much as a product: SmolLM2's attention over 65–96
//! positions took 34–36 µs a layer and its SwiGLU 8–10 µs (one libm `expf` call per value),
//! against 23–38 µs for its output projection (docs/benchmarks.md as of a707ba9).
//!
//! What a row computes does not depend on the other rows of the step or on masked positions:
//! scores are independent dot products, a masked score (−∞) weighs exactly 0 and is skipped,
//! and the softmax denominator is summed in position order. So on one machine a verification
//! row, a tree path and a single decode step give the same bits, which greedy speculative
//! decoding relies on at near-ties.
//!
//! - `attention`: the driver (shape checks, heads split into parts, blocks of positions);
//! - `swiglu`: SwiGLU rows, split over the kernels' threads for many values;
//! - `dot`: the portable dot product in eight lanes;
//! - `lanes`: the vector operations both are made of (the `Lanes` trait) and their portable
//!   loops; `lanes_avx2` and `lanes_avx512` implement them per instruction set, and `simd`
//!   runs a job inside the best one the CPU has.

mod attention;
mod dot;
mod lanes;
#[cfg(target_arch = "x86_64")]
mod lanes_avx2;
#[cfg(target_arch = "x86_64")]
mod lanes_avx512;
#[cfg(target_arch = "x86_64")]
mod simd;
// Elsewhere the SIMD entry points run the portable loops.
#[cfg(not(target_arch = "x86_64"))]
#[path = "simd_fallback.rs"]
mod simd;
mod swiglu;

pub use attention::{AttentionShape, attention, attention_with};
pub use dot::dot;
pub(crate) use swiglu::silu_mul;
pub use swiglu::{swiglu, swiglu_with};

/// Inputs shared by the unit tests of attention and SwiGLU.
#[cfg(test)]
mod test_inputs {
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    use crate::Isa;

    /// Every instruction set a caller can ask for.
    pub(super) const ISAS: [Isa; 3] = [Isa::Auto, Isa::Avx2, Isa::Scalar];

    /// `n` values drawn uniformly from `[-1, 1)` with seed `seed`.
    pub(super) fn values(n: usize, seed: u64) -> Vec<f32> {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        (0..n).map(|_| rng.random_range(-1.0f32..1.0)).collect()
    }
}
