//! The one source of randomness: a seeded host RNG whose uniforms are passed to the math.
//!
//! Sampling is done by inverse CDF from these uniforms on every backend, so one seed gives the
//! same tokens on flex, wgpu and cuda up to float rounding, and the f64 reference can replay a
//! backend's step exactly.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// Seeded generator of uniforms in `[0, 1)`. ChaCha8 is used because its stream is fixed by its
/// specification, so seeds stay reproducible across `rand` releases and platforms.
#[derive(Debug, Clone)]
pub struct SpecRng(ChaCha8Rng);

impl SpecRng {
    pub fn new(seed: u64) -> Self {
        Self(ChaCha8Rng::seed_from_u64(seed))
    }

    /// One uniform in `[0, 1)` with 53 random bits.
    pub fn uniform(&mut self) -> f64 {
        (self.0.random::<u64>() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// The uniforms of one verification step over a tree of `tree_len` nodes (root included).
    ///
    /// A step always consumes exactly `tree_len` uniforms, whatever it accepts: one per drafted
    /// node for its acceptance test and one for the final draw. A fixed count keeps every
    /// backend and the reference on the same stream step after step.
    pub fn step_uniforms(&mut self, tree_len: usize) -> StepUniforms {
        let drafted = tree_len.saturating_sub(1);
        let acceptance = (0..drafted).map(|_| self.uniform()).collect();
        StepUniforms {
            acceptance,
            final_draw: self.uniform(),
        }
    }
}

/// The uniforms one verification step uses; see [`SpecRng::step_uniforms`].
#[derive(Debug, Clone, PartialEq)]
pub struct StepUniforms {
    /// `acceptance[n - 1]` decides drafted node `n` (node 0 is the root and is never tested).
    pub acceptance: Vec<f64>,
    /// Drives the inverse-CDF draw of the token that ends the step.
    pub final_draw: f64,
}

impl StepUniforms {
    /// The uniform of drafted node `node` (≥ 1).
    pub fn for_node(&self, node: usize) -> f64 {
        self.acceptance[node - 1]
    }
}

/// The acceptance test shared by every implementation: accept with probability `probability`.
pub fn accepts(uniform: f64, probability: f64) -> bool {
    uniform < probability
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uniforms_are_in_unit_interval_and_reproducible() {
        let mut a = SpecRng::new(7);
        let mut b = SpecRng::new(7);
        let xs: Vec<f64> = (0..10_000).map(|_| a.uniform()).collect();
        assert!(xs.iter().all(|&x| (0.0..1.0).contains(&x)));
        assert_eq!(xs, (0..10_000).map(|_| b.uniform()).collect::<Vec<_>>());
        let mean = xs.iter().sum::<f64>() / xs.len() as f64;
        // 10,000 uniforms: the mean's standard deviation is 0.0029; 5 sigma.
        assert!((mean - 0.5).abs() < 0.015, "mean {mean}");
    }

    #[test]
    fn step_consumes_a_fixed_count() {
        let mut a = SpecRng::new(1);
        let step = a.step_uniforms(5);
        assert_eq!(step.acceptance.len(), 4);
        let mut b = SpecRng::new(1);
        for _ in 0..5 {
            b.uniform();
        }
        assert_eq!(a.uniform(), b.uniform());
    }
}
