//! How many tokens to draft per step.

use spec_core::length::AcceptanceRate;
pub use spec_core::length::{best_length, expected_tokens, expected_tokens_at, speedup_bound};

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

/// Running estimates of the acceptance rate `α` and the cost ratio `c` for [`DraftLength::Auto`].
///
/// * `α`: `spec_core`'s [`AcceptanceRate`] (accepted ÷ tested drafts, decaying counts, a prior).
/// * `c`: the wall time of the draft per drafted token (its forwards, the sampling and the catch-up
///   on the previous step's tokens) divided by the wall time of a target step, measured from
///   [`Drafter::draft`](spec_engine::Drafter::draft) returning to
///   [`Drafter::accepted`](spec_engine::Drafter::accepted) being called: the target's forward over
///   the chain, the verification, the cache rollback and the loop's bookkeeping (streaming output
///   included). Both are exponential moving averages. The target step is measured at the `K` in use,
///   so its cost includes scoring `K + 1` tokens; the model treats it as the unit.
#[derive(Debug, Clone, Default)]
pub struct AutoLength {
    acceptance: AcceptanceRate,
    draft_token_seconds: Option<f64>,
    target_step_seconds: Option<f64>,
}

impl AutoLength {
    /// The weight of a new time measurement in the moving averages.
    const TIME_WEIGHT: f64 = 0.2;

    /// Records a verified step: `accepted` of `drafted` drafts in a chain.
    pub fn record_step(&mut self, drafted: usize, accepted: usize) {
        self.acceptance.record_chain(drafted, accepted);
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
        self.acceptance.alpha()
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
