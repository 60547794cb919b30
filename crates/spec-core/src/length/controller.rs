//! The one place a drafter's adaptive length learns the run's costs and acceptance from.

use burn::tensor::backend::Backend;

use super::{AcceptanceRate, WidthCosts, average_time};
use crate::step::StepOutcome;

/// The measured costs and acceptance a draft-length rule decides by, fed by the engine's
/// [`StepOutcome`]s and by the drafter's own drafting times.
///
/// Every adaptive rule prices a step with `K` drafts in units of a one-token target step:
/// `K·c + r(K + 1)`, with `r(w)` the verification of `w` tokens ([`WidthCosts`], from the
/// engine's step times by width) and `c` the draft's time per drafted row over a one-token
/// step. The rules differ in how they estimate acceptance (one rate for a draft model's
/// `auto`, one per n-gram size for prompt lookup, one per confidence bucket for the chain rules
/// of `auto` and the bigram), not in how they measure the machine: that lives here.
///
/// The target's step times come from the engine, which times the forward pass, the
/// verification and the rollback alone ([`StepOutcome::seconds`]); a drafter never times the
/// target itself. The drafting time is the drafter's to report
/// ([`LengthController::record_draft_row`]), since only it knows which of its work is drafting
/// (a draft model's catch-up on skipped context is not).
#[derive(Debug, Clone, Default)]
pub struct LengthController {
    widths: WidthCosts,
    acceptance: AcceptanceRate,
    /// Moving average of the seconds to compute one draft row.
    draft_row_seconds: Option<f64>,
    /// One-token steps since the last wider one.
    plain_run: usize,
}

impl LengthController {
    /// The weight of a new drafting time in its moving average.
    pub const DRAFT_TIME_WEIGHT: f64 = 0.2;

    /// A controller whose acceptance rate is `acceptance` (its prior and decay).
    pub fn with_acceptance(acceptance: AcceptanceRate) -> Self {
        Self {
            acceptance,
            ..Self::default()
        }
    }

    /// Learns from one step: its time by width, its chain's acceptance (accepted of the tree's
    /// depth), and whether it was a plain step.
    pub fn observe<B: Backend>(&mut self, outcome: &StepOutcome<B>) {
        self.record_step_time(outcome.width(), outcome.seconds);
        self.record_chain(outcome.depth(), outcome.accepted());
    }

    /// The timing half of [`LengthController::observe`]: a step that scored `width` tokens in
    /// `seconds`.
    pub fn record_step_time(&mut self, width: usize, seconds: f64) {
        self.widths.record(width, seconds);
        self.plain_run = if width == 1 { self.plain_run + 1 } else { 0 };
    }

    /// The acceptance half of [`LengthController::observe`]: `accepted` of a chain of
    /// `drafted` drafts.
    pub fn record_chain(&mut self, drafted: usize, accepted: usize) {
        self.acceptance.record_chain(drafted, accepted);
    }

    /// Records the time of computing one draft row (a draft model's forward and sampling, a
    /// bigram row), as a moving average ([`average_time`]).
    pub fn record_draft_row(&mut self, seconds: f64) {
        self.draft_row_seconds =
            average_time(self.draft_row_seconds, seconds, Self::DRAFT_TIME_WEIGHT);
    }

    /// The target's step times by width.
    pub fn widths(&self) -> &WidthCosts {
        &self.widths
    }

    /// `r(w)`: a verification of `width` tokens in one-token steps.
    pub fn verification_cost(&self, width: usize) -> f64 {
        self.widths.relative(width)
    }

    /// Whether the next step should score one token only, to refresh the unit of every ratio
    /// ([`WidthCosts::wants_one_token_step`]).
    pub fn wants_one_token_step(&self) -> bool {
        self.widths.wants_one_token_step()
    }

    /// A one-token target step's time: measured, or inferred from wider steps
    /// ([`WidthCosts::one_token_seconds`]).
    pub fn one_token_seconds(&self) -> Option<f64> {
        self.widths.one_token_seconds()
    }

    /// The running acceptance of chain drafts (accepted ÷ tested).
    pub fn acceptance(&self) -> &AcceptanceRate {
        &self.acceptance
    }

    /// The smoothed acceptance rate `α`.
    pub fn alpha(&self) -> f64 {
        self.acceptance.alpha()
    }

    /// `E[τ]` of a chain of `k` drafts, averaged over what the counts leave unsure about `α`
    /// ([`AcceptanceRate::expected_tokens`]).
    pub fn expected_tokens(&self, k: usize) -> f64 {
        self.acceptance.expected_tokens(k)
    }

    /// The smoothed time of one draft row, once one was recorded.
    pub fn draft_row_seconds(&self) -> Option<f64> {
        self.draft_row_seconds
    }

    /// `c`: a draft row's time over a one-token target step's, once both are known.
    pub fn draft_cost(&self) -> Option<f64> {
        match (self.draft_row_seconds, self.one_token_seconds()) {
            (Some(d), Some(t)) if t > 0.0 => Some(d / t),
            _ => None,
        }
    }

    /// One-token steps in a row since the last step that drafted.
    pub fn plain_run(&self) -> usize {
        self.plain_run
    }

    /// Starts counting plain steps again (a drafter that spent one of them on something else,
    /// such as timing its draft).
    pub fn restart_plain_run(&mut self) {
        self.plain_run = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tree::TokenTree;
    use crate::verify::Verdict;

    type B = burn::backend::Flex;

    fn outcome(drafted: usize, accepted: usize, seconds: f64) -> StepOutcome<B> {
        let tree = TokenTree::chain(0, &vec![1; drafted]);
        let verdict = Verdict {
            accepted: (1..=accepted).collect(),
            next_token: 2,
        };
        StepOutcome::new(tree, verdict, seconds)
    }

    #[test]
    fn learns_widths_acceptance_and_plain_runs_from_outcomes() {
        let mut c = LengthController::default();
        c.observe(&outcome(0, 0, 0.010));
        c.observe(&outcome(0, 0, 0.010));
        assert_eq!(c.plain_run(), 2);
        assert_eq!(c.widths().seconds(1), Some(0.010));
        // A chain of 3 with 1 accepted: 1 success, 1 failure on top of the prior (1 of 2).
        c.observe(&outcome(3, 1, 0.013));
        assert_eq!(c.plain_run(), 0);
        assert!((c.alpha() - 0.5).abs() < 0.05, "{}", c.alpha());
        // A width's first step is not averaged; the second is.
        c.observe(&outcome(3, 3, 0.014));
        assert_eq!(c.widths().seconds(4), Some(0.014));
        assert!((c.verification_cost(4) - 1.4).abs() < 1e-9);
    }

    #[test]
    fn the_draft_cost_is_a_row_over_a_one_token_step() {
        let mut c = LengthController::default();
        assert_eq!(c.draft_cost(), None);
        c.record_draft_row(0.002);
        assert_eq!(c.draft_cost(), None);
        c.observe(&outcome(0, 0, 0.010));
        assert!((c.draft_cost().unwrap_or(f64::NAN) - 0.2).abs() < 1e-12);
        // A stall moves the average by at most its weight times the average.
        c.record_draft_row(1.0);
        let after = c.draft_row_seconds().unwrap_or(f64::NAN);
        assert!((after - 0.002 * (1.0 + LengthController::DRAFT_TIME_WEIGHT)).abs() < 1e-12);
    }
}
