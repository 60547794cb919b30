//! How big a tree pays: each candidate's estimated chance of acceptance against the measured
//! cost of drafting it and of verifying a wider tree.
//!
//! A step over a tree of `n` drafted nodes yields `E[τ](n) = 1 + Σ v_i` tokens, `v_i` the chance
//! that node `i`'s path is accepted (every accepted node adds its token, and the step adds its
//! own), and costs `D + r(n + 1)` one-token target steps: `D` for drafting, `r(w)` for verifying
//! `w` tokens (`spec_core::length::WidthCosts`, from the engine's step times). Keeping the `n`
//! nodes of highest value maximizes `E[τ]` at each size, since a node's value never exceeds its
//! parent's, and the size is the `n` that maximizes `E[τ](n) / (D + r(n + 1))`: on a CPU, where
//! `r` grows with the width, a small tree; where width is nearly free (a GPU), a large one. A
//! chain is the tree whose best nodes happen to form one, so the rule never prices a tree
//! above the best chain it contains.

use spec_core::length::{LengthController, WidthCosts};

/// The `n ∈ 0..expected.len()` (drafted nodes kept) maximizing `expected[n] / (spent + r(n + 1))`,
/// with `expected[n]` the tokens a step over the `n` best nodes is expected to yield (from
/// `Candidates::expected_tokens_by_size`) and `r` the verification's cost by width. 0 is a plain
/// step. Ties go to the smaller tree.
pub fn best_size(expected: &[f64], spent: f64, r: impl Fn(usize) -> f64) -> usize {
    let mut best = (0, f64::NEG_INFINITY);
    for (n, &e) in expected.iter().enumerate() {
        let cost = spent + r(n + 1);
        if !(cost.is_finite() && cost > 0.0) {
            continue;
        }
        let speed = e / cost;
        if speed > best.1 + 1e-12 {
            best = (n, speed);
        }
    }
    best.0
}

/// The draft model's forward time by rows (the nodes of one level), so that a level's cost can
/// be priced in one-token target steps.
#[derive(Debug, Clone, Default)]
pub struct DraftCosts {
    levels: WidthCosts,
    /// `c` guessed before both times are measured (the models' weight bytes' ratio).
    prior: Option<f64>,
}

impl DraftCosts {
    /// The cost of one draft row in target steps assumed until it is measured, when nothing
    /// better is known: a draft a tenth of its target's size.
    pub const DEFAULT_PRIOR: f64 = 0.1;

    pub fn with_prior(prior: Option<f64>) -> Self {
        Self {
            levels: WidthCosts::default(),
            prior: prior.filter(|c| c.is_finite() && *c >= 0.0),
        }
    }

    /// Records one draft forward over `rows` tree nodes that took `seconds`.
    pub fn record(&mut self, rows: usize, seconds: f64) {
        self.levels.record(rows, seconds);
    }

    /// `c`: one draft row over a one-token target step, measured, else guessed.
    pub fn row_cost(&self, lengths: &LengthController) -> f64 {
        match (self.levels.one_token_seconds(), lengths.one_token_seconds()) {
            (Some(d), Some(t)) if t > 0.0 => d / t,
            _ => self.prior.unwrap_or(Self::DEFAULT_PRIOR),
        }
    }

    /// A level of `rows` draft rows, in one-token target steps.
    pub fn level_cost(&self, rows: usize, lengths: &LengthController) -> f64 {
        if rows == 0 {
            return 0.0;
        }
        self.row_cost(lengths) * self.levels.relative(rows)
    }

    /// What one more row adds to a level that has `rows` already.
    pub fn marginal_row_cost(&self, rows: usize, lengths: &LengthController) -> f64 {
        self.level_cost(rows + 1, lengths) - self.level_cost(rows, lengths)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_best_size_weighs_expected_tokens_against_width() {
        // Values 0.9, 0.8, 0.3, 0.1: E[τ] 1, 1.9, 2.7, 3.0, 3.1.
        let expected = [1.0, 1.9, 2.7, 3.0, 3.1];
        // Width free: keep everything worth anything.
        assert_eq!(best_size(&expected, 0.0, |_| 1.0), 4);
        // Width dear (each node 0.25 of a step): 2.7 / 1.5 beats 3.0 / 1.75.
        assert_eq!(
            best_size(&expected, 0.0, |w| 1.0 + 0.25 * (w - 1) as f64),
            2
        );
        // Drafting already spent makes width relatively cheaper.
        assert_eq!(
            best_size(&expected, 2.0, |w| 1.0 + 0.25 * (w - 1) as f64),
            3
        );
        // Nothing worth drafting: a plain step.
        assert_eq!(best_size(&[1.0, 1.05], 0.0, |w| w as f64), 0);
        assert_eq!(best_size(&[1.0], 0.0, |_| f64::NAN), 0);
    }

    #[test]
    fn draft_levels_are_priced_by_their_rows() {
        let mut lengths = LengthController::default();
        lengths.record_step_time(1, 0.100);
        let mut costs = DraftCosts::with_prior(Some(0.3));
        assert!((costs.row_cost(&lengths) - 0.3).abs() < 1e-12);
        costs.record(1, 0.010);
        costs.record(4, 0.013);
        costs.record(4, 0.013);
        assert!((costs.row_cost(&lengths) - 0.1).abs() < 1e-12);
        assert!((costs.level_cost(4, &lengths) - 0.13).abs() < 1e-9);
        assert!((costs.marginal_row_cost(0, &lengths) - 0.1).abs() < 1e-9);
        assert!(costs.marginal_row_cost(1, &lengths) < 0.02);
    }
}
