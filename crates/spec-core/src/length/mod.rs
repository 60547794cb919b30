//! How long a draft should be: the expected-speedup model and the run-time estimates it needs.
//!
//! Drafts are accepted in order until the first rejection. If each is accepted independently with
//! probability `α`, a step with `K` drafts yields (Leviathan et al. 2023, eq. 1)
//!
//! ```text
//! E[τ](α, K) = Σ_{i=0..K} α^i = (1 − α^{K+1}) / (1 − α)
//! ```
//!
//! tokens, and costs `cost(K)` in units of one plain decoding step. Leviathan's Theorem 3.8 takes
//! `cost(K) = K·c + 1` (a draft step costs `c`, the verification one target step, whatever its
//! width); a drafter without a model (prompt lookup) pays nothing to draft, but on a CPU scoring
//! `K + 1` tokens costs more than scoring one, so there `cost(K) = r(K + 1)`, the measured cost of
//! a verification step of width `K + 1` relative to width 1 ([`WidthCosts`]). Either way the
//! draft length is the `K` that maximizes `E[τ] / cost(K)` ([`best_length_by`]).
//!
//! The estimates come from the run itself: [`AcceptanceRate`] counts accepted and tested drafts
//! with decay (and [`AcceptanceRate::expected_tokens`] averages `E[τ]` over what its counts leave
//! unsure about `α`, which a few steps' counts leave wide); [`WidthCosts`] averages step times by
//! width.

/// Expected tokens a step yields with `k` drafts when each is accepted independently with
/// probability `alpha`: `E[τ] = Σ_{i=0..k} α^i = (1 − α^{k+1}) / (1 − α)` (the sum form also holds
/// at `α = 1`, where it is `k + 1`).
pub fn expected_tokens(alpha: f64, k: usize) -> f64 {
    let alpha = alpha.clamp(0.0, 1.0);
    let mut term = 1.0;
    let mut total = 1.0;
    for _ in 0..k {
        term *= alpha;
        total += term;
    }
    total
}

/// [`expected_tokens`] averaged over a run's steps, `steps_by_length[k]` of which drafted `k`
/// tokens: `Σ_k n_k·E[τ](α, k) / Σ_k n_k`; `None` without steps. A run's draft length varies
/// (an adaptive policy; a fixed `K` whose last step is cut short by the tokens left), and
/// `E[τ]` is concave in `K`, so this is below `E[τ]` at the mean length (Jensen's inequality):
/// the mean length would credit the steps with tokens none of them could yield.
pub fn mean_expected_tokens(alpha: f64, steps_by_length: &[u64]) -> Option<f64> {
    let steps: u64 = steps_by_length.iter().sum();
    let tokens: f64 = steps_by_length
        .iter()
        .enumerate()
        .map(|(k, &n)| n as f64 * expected_tokens(alpha, k))
        .sum();
    (steps > 0).then(|| tokens / steps as f64)
}

/// The expected speed-up of Leviathan et al. (2023, Theorem 3.8) over a run's steps,
/// `steps_by_length[k]` of which drafted `k` tokens at `c` target steps a draft token: the
/// steps' mean expected tokens ([`mean_expected_tokens`]) over their mean cost `K̄·c + 1` in
/// target steps (the cost is linear in `K`, so its mean is the cost at the mean length, where
/// `E[τ]`'s is not). With every step at one `K` this is the theorem's `E[τ](α, K) / (K·c + 1)`.
/// `None` without steps, or where `c` is not a finite number ≥ 0.
pub fn speedup_bound(alpha: f64, c: f64, steps_by_length: &[u64]) -> Option<f64> {
    if !(c.is_finite() && c >= 0.0) {
        return None;
    }
    let expected = mean_expected_tokens(alpha, steps_by_length)?;
    let steps: u64 = steps_by_length.iter().sum();
    let drafted: u64 = steps_by_length
        .iter()
        .enumerate()
        .map(|(k, &n)| k as u64 * n)
        .sum();
    Some(expected / (drafted as f64 / steps as f64 * c + 1.0))
}

/// The `K ∈ k_min..=k_max` that maximizes `E[τ](α, K) / cost(K)`, `cost(K)` being a step with `K`
/// drafts in units of a plain decoding step. Ties (within 1e-12) go to the shorter draft; a
/// non-finite or non-positive cost rules that `K` out. Returns `k_min` when nothing qualifies.
pub fn best_length_by(
    alpha: f64,
    k_min: usize,
    k_max: usize,
    cost: impl Fn(usize) -> f64,
) -> usize {
    best_length_for(|k| expected_tokens(alpha, k), k_min, k_max, cost)
}

/// [`best_length_by`] with the expected tokens of a step with `K` drafts given by `expected`
/// (e.g. [`AcceptanceRate::expected_tokens`], which averages over what the counts leave
/// uncertain about `α`).
pub fn best_length_for(
    expected: impl Fn(usize) -> f64,
    k_min: usize,
    k_max: usize,
    cost: impl Fn(usize) -> f64,
) -> usize {
    let mut best = (k_min, f64::NEG_INFINITY);
    for k in k_min..=k_max.max(k_min) {
        let cost = cost(k);
        if !(cost.is_finite() && cost > 0.0) {
            continue;
        }
        let speed = expected(k) / cost;
        if speed > best.1 + 1e-12 {
            best = (k, speed);
        }
    }
    best.0
}

/// The `K ∈ 1..=k_max` that maximizes Leviathan's expected speed-up `E[τ](α, K) / (K·c + 1)`,
/// where `c` is the cost of one draft token relative to one target step.
pub fn best_length(alpha: f64, c: f64, k_max: usize) -> usize {
    let c = if c.is_finite() { c.max(0.0) } else { 0.0 };
    best_length_by(alpha, 1, k_max.max(1), |k| k as f64 * c + 1.0)
}

mod acceptance;
mod controller;
mod costs;

pub use acceptance::{AcceptanceByConfidence, AcceptanceRate, ChainOutlook, ChainTrials};
pub use controller::LengthController;
pub use costs::{WidthCosts, average_time};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bound_is_leviathans_expected_speedup() {
        // α = 0.5, K = 2: E[τ] = 1 + 0.5 + 0.25 = 1.75; c = 0.25: bound = 1.75 / (2·0.25 + 1).
        let close = |a: Option<f64>, b: f64| (a.unwrap() - b).abs() < 1e-12;
        assert!(close(mean_expected_tokens(0.5, &[0, 0, 3]), 1.75));
        assert!(close(speedup_bound(0.5, 0.25, &[0, 0, 3]), 1.75 / 1.5));
        // Every draft accepted: K + 1 tokens a step; free drafts: the bound is E[τ] itself.
        assert!(close(mean_expected_tokens(1.0, &[0, 0, 0, 0, 1]), 5.0));
        assert!(close(
            speedup_bound(0.8, 0.0, &[0, 0, 0, 2]),
            expected_tokens(0.8, 3)
        ));
        // Nothing accepted: one token a step, slowed by the drafting.
        assert!(close(speedup_bound(0.0, 0.1, &[0, 0, 0, 0, 7]), 1.0 / 1.4));
        // No steps, no bound.
        assert_eq!(mean_expected_tokens(0.5, &[]), None);
        assert_eq!(speedup_bound(0.5, 0.1, &[0, 0, 0]), None);
    }

    #[test]
    fn a_varying_draft_length_is_bounded_step_by_step() {
        // One step of K 2 and one of K 6 (mean K 4): the steps' own expectations, which lie
        // below E[τ] at K 4 whenever α is strictly between 0 and 1 (E[τ] is concave in K).
        let c = 0.1;
        for alpha in [0.3, 0.75, 0.9] {
            let mean = mean_expected_tokens(alpha, &[0, 0, 1, 0, 0, 0, 1]).unwrap();
            let by_step = (expected_tokens(alpha, 2) + expected_tokens(alpha, 6)) / 2.0;
            assert!((mean - by_step).abs() < 1e-12);
            assert!(mean < expected_tokens(alpha, 4) - 1e-6, "{alpha}");
            let bound = speedup_bound(alpha, c, &[0, 0, 1, 0, 0, 0, 1]).unwrap();
            assert!((bound - by_step / (4.0 * c + 1.0)).abs() < 1e-12);
        }
        // With every draft accepted E[τ] = K + 1 is linear: the mean length is exact.
        let all = mean_expected_tokens(1.0, &[0, 0, 1, 0, 0, 0, 1]).unwrap();
        assert!((all - 5.0).abs() < 1e-12);
        // A plain step (K 0) yields one token at one step's cost.
        assert!((speedup_bound(0.9, c, &[3]).unwrap() - 1.0).abs() < 1e-12);
    }

    #[test]
    fn a_bound_needs_steps_and_a_cost() {
        assert_eq!(speedup_bound(0.9, 0.1, &[]), None);
        assert_eq!(speedup_bound(0.9, 0.1, &[0, 0, 0]), None);
        for c in [-0.1, f64::NAN, f64::INFINITY] {
            assert_eq!(speedup_bound(0.9, c, &[0, 4]), None, "{c}");
        }
        // Free drafts: the bound is E[τ] itself.
        let free = speedup_bound(0.9, 0.0, &[0, 0, 0, 2]).unwrap();
        assert!((free - expected_tokens(0.9, 3)).abs() < 1e-12);
    }

    #[test]
    fn expected_tokens_matches_the_closed_form() {
        for alpha in [0.0, 0.3, 0.8, 0.95] {
            for k in 0..10 {
                let closed = (1.0 - f64::powi(alpha, k as i32 + 1)) / (1.0 - alpha);
                assert!((expected_tokens(alpha, k) - closed).abs() < 1e-12);
            }
        }
        assert_eq!(expected_tokens(1.0, 5), 6.0);
    }

    #[test]
    fn best_length_follows_alpha_and_cost() {
        // Free drafts that are always accepted: draft as far as allowed.
        assert_eq!(best_length(1.0, 0.0, 8), 8);
        // Drafts that are never accepted: as short as allowed.
        assert_eq!(best_length(0.0, 0.1, 8), 1);
        // Leviathan et al.'s regime: α = 0.8 with c = 0.05 favours a long draft, c = 0.5 a short one.
        let long = best_length(0.8, 0.05, 8);
        let short = best_length(0.8, 0.5, 8);
        assert!(long > short, "{long} vs {short}");
        // Brute force agrees.
        for (alpha, c) in [(0.6, 0.1), (0.9, 0.2), (0.5, 0.02)] {
            let k = best_length(alpha, c, 8);
            let speed = |k: usize| expected_tokens(alpha, k) / (k as f64 * c + 1.0);
            assert!((1..=8).all(|j| speed(j) <= speed(k) + 1e-12));
        }
        assert_eq!(best_length(1.0, 0.0, 3), 3);
        assert_eq!(best_length(0.5, f64::NAN, 0), 1);
    }

    #[test]
    fn best_length_by_may_choose_no_draft() {
        // Verification of w tokens costs 1 + 0.1 (w − 1): a draft pays iff α > 0.1.
        let cost = |k: usize| 1.0 + 0.1 * k as f64;
        assert_eq!(best_length_by(0.05, 0, 8, cost), 0);
        assert!(best_length_by(0.2, 0, 8, cost) >= 1);
        // A high α and cheap width: the longest draft.
        assert_eq!(best_length_by(0.95, 0, 8, |k| 1.0 + 0.02 * k as f64), 8);
        // Costs that rule every K out leave k_min.
        assert_eq!(best_length_by(0.9, 2, 5, |_| f64::NAN), 2);
        // Brute force agrees over a grid.
        for alpha in [0.1, 0.3, 0.5, 0.7, 0.9] {
            for slope in [0.0, 0.05, 0.2, 0.5] {
                let cost = |k: usize| 1.0 + slope * k as f64;
                let k = best_length_by(alpha, 0, 8, cost);
                let speed = |k: usize| expected_tokens(alpha, k) / cost(k);
                assert!(
                    (0..=8).all(|j| speed(j) <= speed(k) + 1e-12),
                    "{alpha} {slope}"
                );
            }
        }
    }
}
