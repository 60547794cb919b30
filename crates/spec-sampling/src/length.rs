//! How many tokens to draft per step.

use crate::error::{Result, SamplingError};

/// The default fixed draft length.
pub const DEFAULT_K: usize = 4;
/// The default bound of [`DraftLength::Auto`].
pub const DEFAULT_K_MAX: usize = 8;

/// The draft length policy.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum DraftLength {
    /// Always `K` drafts (fewer only at the end of the generation or of the draft's context).
    Fixed(usize),
    /// Up to `max` drafts; after the first, drafting stops as soon as the draft model's top
    /// probability (softmax of its raw logits, whatever the sampling settings) is below
    /// `threshold`, a sign the next draft would likely be rejected.
    Confident { max: usize, threshold: f64 },
    /// `K ∈ 1..=max` chosen each step by [`best_length`] from the run's estimates ([`AutoLength`]).
    Auto { max: usize },
}

impl Default for DraftLength {
    fn default() -> Self {
        Self::Fixed(DEFAULT_K)
    }
}

impl DraftLength {
    /// `auto` (bounded by [`DEFAULT_K_MAX`]) or a number ≥ 1, as the CLI's `--k` takes it.
    ///
    /// # Errors
    /// Anything else, or 0.
    pub fn parse(text: &str) -> Result<Self> {
        let text = text.trim();
        if text.eq_ignore_ascii_case("auto") {
            return Ok(Self::Auto { max: DEFAULT_K_MAX });
        }
        let k: usize = text
            .parse()
            .map_err(|_| SamplingError::BadDraftLength(text.to_owned()))?;
        let length = Self::Fixed(k);
        length.validate()?;
        Ok(length)
    }

    /// The most drafts one step may propose.
    pub fn max(&self) -> usize {
        match *self {
            Self::Fixed(k) => k,
            Self::Confident { max, .. } | Self::Auto { max } => max,
        }
    }

    /// Checks `K ≥ 1` and the threshold.
    ///
    /// # Errors
    /// [`SamplingError::ZeroDraftLength`], [`SamplingError::InvalidThreshold`].
    pub fn validate(&self) -> Result<()> {
        if self.max() == 0 {
            return Err(SamplingError::ZeroDraftLength);
        }
        if let Self::Confident { threshold, .. } = *self
            && !(threshold > 0.0 && threshold < 1.0)
        {
            return Err(SamplingError::InvalidThreshold(threshold));
        }
        Ok(())
    }
}

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

/// [`expected_tokens`] for a draft length that may be fractional (a mean, e.g. what `auto`
/// drafted on average), in the closed form `(1 − α^{k+1}) / (1 − α)`; `k + 1` at `α = 1`.
pub fn expected_tokens_at(alpha: f64, k: f64) -> f64 {
    let alpha = alpha.clamp(0.0, 1.0);
    if 1.0 - alpha < 1e-12 {
        k + 1.0
    } else {
        (1.0 - alpha.powf(k + 1.0)) / (1.0 - alpha)
    }
}

/// The expected speed-up `E[τ] / (K·c + 1)` of `k` drafts (fractional allowed) whose draft step
/// costs `c` target steps (Leviathan et al. 2023, Theorem 3.8).
pub fn speedup_bound(alpha: f64, k: f64, c: f64) -> f64 {
    expected_tokens_at(alpha, k) / (k * c + 1.0)
}

/// The `K ∈ 1..=k_max` that maximizes the expected speed-up `E[τ](α, K) / (K·c + 1)`, where `c` is
/// the cost of one draft token relative to one target step. Ties go to the shorter draft.
pub fn best_length(alpha: f64, c: f64, k_max: usize) -> usize {
    let c = if c.is_finite() { c.max(0.0) } else { 0.0 };
    let mut best = (1, f64::NEG_INFINITY);
    for k in 1..=k_max.max(1) {
        let speed = expected_tokens(alpha, k) / (k as f64 * c + 1.0);
        if speed > best.1 + 1e-12 {
            best = (k, speed);
        }
    }
    best.0
}

/// Running estimates of the acceptance rate `α` and the cost ratio `c` for [`DraftLength::Auto`].
///
/// * `α`: each step tests drafts in order until the first rejection, so a step with `a` of `k`
///   accepted made `a` successful trials and, if `a < k`, one failed one; drafts after a rejection
///   were never tested. `α = accepted / trials`, which is the maximum-likelihood estimate under the
///   i.i.d. model (plain `accepted / drafted` would count the untested drafts as failures).
///   Counts decay by [`AutoLength::DECAY`] per step so the estimate follows the text, and a prior
///   of one success in two trials keeps the first steps sane.
/// * `c`: the wall time of the draft per drafted token (its forwards, the sampling and the catch-up
///   on the previous step's tokens) divided by the wall time of a target step, measured from
///   [`Drafter::draft`](spec_engine::Drafter::draft) returning to
///   [`Drafter::accepted`](spec_engine::Drafter::accepted) being called: the target's forward over
///   the chain, the verification, the cache rollback and the loop's bookkeeping (streaming output
///   included). Both are exponential moving averages. The target step is measured at the `K` in use,
///   so its cost includes scoring `K + 1` tokens; the model treats it as the unit.
#[derive(Debug, Clone)]
pub struct AutoLength {
    accepted: f64,
    trials: f64,
    draft_token_seconds: Option<f64>,
    target_step_seconds: Option<f64>,
}

impl Default for AutoLength {
    fn default() -> Self {
        Self {
            accepted: 0.0,
            trials: 0.0,
            draft_token_seconds: None,
            target_step_seconds: None,
        }
    }
}

impl AutoLength {
    /// The weight kept by old counts at each step.
    pub const DECAY: f64 = 0.9;
    /// The weight of a new time measurement in the moving averages.
    const TIME_WEIGHT: f64 = 0.2;
    /// Prior successes and trials.
    const PRIOR: (f64, f64) = (1.0, 2.0);

    /// Records a verified step: `accepted` of `drafted` drafts in a chain.
    pub fn record_step(&mut self, drafted: usize, accepted: usize) {
        if drafted == 0 {
            return;
        }
        let failed = if accepted < drafted { 1.0 } else { 0.0 };
        self.accepted = self.accepted * Self::DECAY + accepted as f64;
        self.trials = self.trials * Self::DECAY + accepted as f64 + failed;
    }

    /// Records the draft's time per drafted token in one step.
    pub fn record_draft(&mut self, seconds_per_token: f64) {
        Self::average(&mut self.draft_token_seconds, seconds_per_token);
    }

    /// Records the time of one target step.
    pub fn record_target(&mut self, seconds: f64) {
        Self::average(&mut self.target_step_seconds, seconds);
    }

    fn average(slot: &mut Option<f64>, x: f64) {
        if !x.is_finite() || x < 0.0 {
            return;
        }
        *slot = Some(match *slot {
            None => x,
            Some(old) => old + Self::TIME_WEIGHT * (x - old),
        });
    }

    /// The smoothed acceptance rate.
    pub fn alpha(&self) -> f64 {
        (self.accepted + Self::PRIOR.0) / (self.trials + Self::PRIOR.1)
    }

    /// `c`, once both times have been measured.
    pub fn cost_ratio(&self) -> Option<f64> {
        match (self.draft_token_seconds, self.target_step_seconds) {
            (Some(d), Some(t)) if t > 0.0 => Some(d / t),
            _ => None,
        }
    }

    /// The smoothed draft time per drafted token.
    pub fn draft_token_seconds(&self) -> Option<f64> {
        self.draft_token_seconds
    }

    /// The smoothed target step time.
    pub fn target_step_seconds(&self) -> Option<f64> {
        self.target_step_seconds
    }

    /// The draft length for the next step: [`best_length`] once `c` is known, before that
    /// `min(DEFAULT_K, k_max)`.
    pub fn choose(&self, k_max: usize) -> usize {
        match self.cost_ratio() {
            Some(c) => best_length(self.alpha(), c, k_max),
            None => DEFAULT_K.min(k_max).max(1),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bound_is_leviathans_expected_speedup() {
        // α = 0.5, K = 2: E[τ] = 1 + 0.5 + 0.25 = 1.75; c = 0.25: bound = 1.75 / (2·0.25 + 1).
        assert!((expected_tokens_at(0.5, 2.0) - 1.75).abs() < 1e-12);
        assert!((speedup_bound(0.5, 2.0, 0.25) - 1.75 / 1.5).abs() < 1e-12);
        // Every draft accepted: K + 1 tokens a step; free drafts: the bound is E[τ] itself.
        assert_eq!(expected_tokens_at(1.0, 4.0), 5.0);
        assert!((speedup_bound(0.8, 3.0, 0.0) - expected_tokens_at(0.8, 3.0)).abs() < 1e-12);
        // Nothing accepted: one token a step, slowed by the drafting.
        assert!((speedup_bound(0.0, 4.0, 0.1) - 1.0 / 1.4).abs() < 1e-12);
        // Whole K agrees with spec-sampling's sum (what `auto` maximizes); a mean K lies between.
        for alpha in [0.0, 0.3, 0.75, 0.999] {
            for k in 0..9 {
                let sum = expected_tokens(alpha, k);
                assert!(
                    (expected_tokens_at(alpha, k as f64) - sum).abs() < 1e-9,
                    "{alpha} {k}"
                );
            }
            let mid = expected_tokens_at(alpha, 2.5);
            assert!(mid >= expected_tokens_at(alpha, 2.0) && mid <= expected_tokens_at(alpha, 3.0));
        }
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
        // Leviathan et al., Table/Figure 3 regime: α = 0.8, c = 0.05 favours a long draft; c = 0.5
        // a short one.
        let long = best_length(0.8, 0.05, 8);
        let short = best_length(0.8, 0.5, 8);
        assert!(long > short, "{long} vs {short}");
        // Brute force agrees.
        for (alpha, c) in [(0.6, 0.1), (0.9, 0.2), (0.5, 0.02)] {
            let k = best_length(alpha, c, 8);
            let speed = |k: usize| expected_tokens(alpha, k) / (k as f64 * c + 1.0);
            assert!((1..=8).all(|j| speed(j) <= speed(k) + 1e-12));
        }
        // Bounds hold.
        assert_eq!(best_length(1.0, 0.0, 3), 3);
        assert_eq!(best_length(0.5, f64::NAN, 0), 1);
    }

    #[test]
    fn alpha_counts_only_tested_drafts() {
        let mut auto = AutoLength::default();
        assert_eq!(auto.alpha(), 0.5);
        for _ in 0..200 {
            // Two accepted, the third rejected, the fourth never tested: α = 2/3, not 2/4.
            auto.record_step(4, 2);
        }
        // The prior (1 of 2) still weighs against ~30 decayed trials: within 0.02.
        assert!((auto.alpha() - 2.0 / 3.0).abs() < 0.02, "{}", auto.alpha());
        for _ in 0..200 {
            auto.record_step(4, 4);
        }
        assert!(auto.alpha() > 0.97);
    }

    #[test]
    fn choose_uses_measured_times() {
        let mut auto = AutoLength::default();
        assert_eq!(auto.choose(8), DEFAULT_K);
        assert_eq!(auto.choose(2), 2);
        for _ in 0..100 {
            auto.record_step(4, 4);
        }
        auto.record_draft(0.001);
        auto.record_target(0.1);
        assert!((auto.cost_ratio().unwrap_or(0.0) - 0.01).abs() < 1e-12);
        assert_eq!(auto.choose(8), 8);
        // A draft as slow as the target is never worth more than one token.
        for _ in 0..50 {
            auto.record_draft(0.1);
            auto.record_step(1, 0);
        }
        assert_eq!(auto.choose(8), 1);
    }

    #[test]
    fn parse_and_validate() {
        assert_eq!(DraftLength::parse("3").ok(), Some(DraftLength::Fixed(3)));
        assert_eq!(
            DraftLength::parse("auto").ok(),
            Some(DraftLength::Auto { max: DEFAULT_K_MAX })
        );
        assert!(matches!(
            DraftLength::parse("0"),
            Err(SamplingError::ZeroDraftLength)
        ));
        assert!(matches!(
            DraftLength::parse("four"),
            Err(SamplingError::BadDraftLength(_))
        ));
        assert!(
            DraftLength::Confident {
                max: 4,
                threshold: 1.5
            }
            .validate()
            .is_err()
        );
        assert!(DraftLength::Auto { max: 0 }.validate().is_err());
    }
}
