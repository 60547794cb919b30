//! How many tokens to draft per step.

use spec_core::length::{
    AcceptanceByConfidence, ChainOutlook, ChainTrials, LengthController, WidthCosts, average_time,
    best_length_by, best_length_for,
};
pub use spec_core::length::{best_length, expected_tokens, mean_expected_tokens, speedup_bound};
use spec_core::step::StepOutcome;

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
    /// `K ∈ 0..=max` chosen each step from the run's estimates of `α`, the draft's cost and the
    /// verification's cost by width ([`AutoLength::choose`]): 0, a plain step, where no draft
    /// length is expected to beat plain decoding, with a probe of the best `K ≥ 1` now and then;
    /// and a plain step now and then to measure one.
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

    /// The policy the CLI's `--k` and `--draft-threshold` give: without a threshold, as
    /// [`DraftLength::parse`] (a missing `k` is the default); with one, [`DraftLength::Confident`]
    /// with `k` drafts at most ([`DEFAULT_K_MAX`] when `k` is missing).
    ///
    /// # Errors
    /// A bad `k`, a threshold outside `(0, 1)`, or a threshold with `k` `auto` (which sets its
    /// own lengths).
    pub fn parse_with_threshold(k: Option<&str>, threshold: Option<f64>) -> Result<Self> {
        let Some(threshold) = threshold else {
            return k.map_or(Ok(Self::default()), Self::parse);
        };
        let max = match k.map(Self::parse).transpose()? {
            None => DEFAULT_K_MAX,
            Some(Self::Fixed(k)) => k,
            Some(_) => return Err(SamplingError::ThresholdWithAuto),
        };
        let length = Self::Confident { max, threshold };
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

/// Running estimates of the acceptance rate `α`, the draft's cost and the target's step cost by
/// width, for [`DraftLength::Auto`].
///
/// * `α`: `spec_core`'s [`AcceptanceRate`](spec_core::length::AcceptanceRate) (accepted ÷ tested drafts, decaying counts, a prior),
///   whose counts also give `E[τ]` averaged over how unsure they still are of `α`
///   ([`AcceptanceRate::expected_tokens`](spec_core::length::AcceptanceRate::expected_tokens); above `E[τ]` at the mean `α`, most in a run's first
///   steps);
/// * the draft's time per drafted token (its forwards, the sampling and the catch-up on the
///   previous step's tokens), an exponential moving average;
/// * the target's step time by width `w = K + 1`, `spec_core`'s [`WidthCosts`]: the engine's
///   time of each step (the target's forward over the chain, the verification and the cache
///   rollback, [`StepOutcome::seconds`]), as `r(w) = 1 + s·(w − 1)` times a one-token step.
///
/// These three live in `spec_core`'s [`LengthController`], which every adaptive length shares.
///
/// `c` is the draft token's time over a one-token target step, and a step with `K` drafts costs
/// `K·c + r(K + 1)` one-token steps. Leviathan et al. (2023, Theorem 3.8) take the verification
/// as one step whatever its width (`r ≡ 1`); on a CPU scoring `K + 1` tokens costs more (a
/// Q8_0 1.5B target measured 1.64× a one-token step at `K` 3, 4.2× at `K` 7), and without `r` the
/// policy picked `K` 7 where `K` 2 or 3 was faster. A one-token step is asked for every
/// [`WidthCosts::REFRESH`] steps (`choose` returns 0: a plain step), since a draft-model step is
/// never that narrow otherwise and `t(1)` is the unit of every ratio. Until then (a generation
/// of a few dozen steps never gets there) `t(1)` and the slope are read off the line through
/// the widths measured so far ([`WidthCosts::fitted_line`]), which `auto`'s varying `K` spreads.
///
/// `K` 0 is a candidate too: a plain step yields one token for one step (`E[τ] = 1`, cost
/// `r(1) = 1`), so where every `K ≥ 1` is expected to yield less per unit of time (a draft
/// nearly as slow as the target, a low `α`, or a steep `r`) the policy decodes plainly instead
/// of slowing the run down. Plain steps test no drafts, so `α` would never change again: after
/// a run of plain steps the best `K ≥ 1` is tried once (a probe), which refreshes `α`, `c` and
/// `r`. A probe is expected to cost `K·c + r(K + 1) − E[τ]` steps more than plain decoding of
/// the same tokens, so the run before it is that loss over [`AutoLength::PROBE_SHARE`] (probes
/// take about that share of a plain run's time), within [`AutoLength::PROBE_WAIT`]: probes of a
/// pair near break-even come often, those of a draft far too slow for its target seldom. A
/// probe's draft first catches up on the tokens of the plain run (and, if it never drafted, on
/// the prompt), so its expected loss also counts those tokens at the catch-up's measured cost per
/// token (before one is measured, at `c`, which a batched forward does not exceed).
///
/// A draft that no `K` would make pay even with every draft accepted (`c` of 0.9 or more with a
/// verification's cost growing 0.1 a token) is hopeless: probing it again would only re-measure
/// `α`, which cannot change that, and would pay for a catch-up on every skipped token. Such a
/// draft is not probed; one draft forward is timed instead now and then (after
/// [`AutoLength::PROBE_WAIT`]`.0` plain steps, the wait doubling with each timing that leaves it
/// hopeless, up to `.1`), so that drafting resumes if the draft turns cheap or its verdict came
/// from a stall. Every time here is an [`average_time`], which one stalled measurement moves by
/// at most 2× a measurement and the next ordinary one replaces, if it came first.
///
/// A step that drafts then ends its chain by the same measure taken one draft at a time (up to
/// `K_max` drafts), with `E[τ] = 1 + α_1 + α_1·α_2 + …` and `α_i` the rate of drafts whose row
/// had draft `i`'s confidence (the draft model's top probability, in tenths,
/// [`AutoLength::CONFIDENCE_BUCKETS`]; each bucket starts at its midpoint). The mean rate misses
/// that a draft's own confidence tells a likely rejection from a likely acceptance: on code,
/// K 8's chains run through rows the draft was unsure of, and `K` from the mean rate alone
/// drafted those too. After the first draft (which the step's `K` already chose), the next row
/// is computed only if a draft at the mean rate would raise the chain's
/// `E[τ] / (K·c + r(K + 1))` ([`AutoLength::worth_extending`] with [`AutoLength::alpha`]); a
/// computed row's draft is then proposed if its own rate `α_i` raises it with the row's `c`
/// counted as spent either way ([`AutoLength::worth_proposing`]), so that only the
/// verification's extra width weighs against it.
///
/// Before the draft has been timed, `c` is unknown and `K` is [`DEFAULT_K`]; with a guess of `c`
/// ([`AutoLength::with_cost_prior`], e.g. the ratio of the models' weight bytes, which a
/// bandwidth-bound decode step streams), a draft guessed hopeless starts with plain steps, a
/// drafter whose first step will be plain skips its prefill, and the chain rule prices the
/// first steps by the guess (drafting at least once a step until `c` is measured, which a step
/// without drafts would not do).
#[derive(Debug, Clone)]
pub struct AutoLength {
    /// `α`, the draft's time per row, the target's step times by width and the plain run,
    /// from the engine's step outcomes and the drafter's timings.
    lengths: LengthController,
    /// The acceptance of drafts by their row's confidence (the draft model's top probability),
    /// for the rule that ends a chain before a draft unlikely to pay
    /// ([`AutoLength::worth_extending`]).
    by_confidence: AcceptanceByConfidence,
    /// A guess of `c` for the steps before the draft is timed ([`AutoLength::with_cost_prior`]).
    cost_prior: Option<f64>,
    /// The draft's time per token of a catch-up on context it skipped (see
    /// [`AutoLength::record_catch_up`]), a moving average.
    catch_up_token_seconds: Option<f64>,
    /// Timings of a hopeless draft in a row since it last drafted (see
    /// [`AutoLength::wants_draft_timing`]).
    hopeless_timings: u32,
    /// `(c, s)` given instead of measured ([`AutoLength::with_fixed_costs`]).
    fixed_costs: Option<(f64, f64)>,
}

impl Default for AutoLength {
    fn default() -> Self {
        Self {
            lengths: LengthController::default(),
            by_confidence: AcceptanceByConfidence::new(
                Self::CONFIDENCE_BUCKETS,
                Self::CONFIDENCE_DECAY,
            ),
            cost_prior: None,
            catch_up_token_seconds: None,
            hopeless_timings: 0,
            fixed_costs: None,
        }
    }
}

impl AutoLength {
    /// Confidence buckets of the chain rule: tenths of the draft row's top probability.
    pub const CONFIDENCE_BUCKETS: usize = 10;
    /// Decay of each bucket's counts (a memory of about 20 of its trials): the draft's
    /// calibration against the target drifts with the text less than the mean rate does.
    pub const CONFIDENCE_DECAY: f64 = 0.95;
    /// The weight of a new time measurement in the catch-up's moving average.
    const TIME_WEIGHT: f64 = LengthController::DRAFT_TIME_WEIGHT;
    /// The share of a plain run's time that probes are expected to take (see [`AutoLength`]).
    pub const PROBE_SHARE: f64 = 0.05;
    /// The fewest and the most plain steps in a row before a probe.
    pub const PROBE_WAIT: (usize, usize) = (8, 64);

    /// Learns from a step's outcome, as the engine reports it: its time by width and its
    /// chain's acceptance ([`LengthController::observe`]).
    pub fn observe<B: burn::tensor::backend::Backend>(&mut self, outcome: &StepOutcome<B>) {
        self.lengths.observe(outcome);
    }

    /// Records a verified step's acceptance: `accepted` of `drafted` drafts in a chain.
    pub fn record_step(&mut self, drafted: usize, accepted: usize) {
        self.lengths.record_chain(drafted, accepted);
    }

    /// Records by their rows' confidences what a step's verdict (`accepted` drafts, `context`
    /// after the step) settled of its chain (see [`ChainTrials::record`]).
    pub fn record_chain(&mut self, trials: &ChainTrials, accepted: usize, context: &[u32]) {
        trials.record(accepted, context, &mut self.by_confidence);
    }

    /// The acceptance rate of drafts whose row has `confidence`.
    pub fn alpha_at(&self, confidence: f64) -> f64 {
        self.by_confidence.alpha(confidence)
    }

    /// The per-confidence rates, lowest confidence first.
    pub fn acceptance_by_confidence(&self) -> &AcceptanceByConfidence {
        &self.by_confidence
    }

    /// Whether steps can be priced: `c` measured, guessed or given.
    pub fn prices_steps(&self) -> bool {
        self.working_cost().is_some()
    }

    /// Whether `chain` should take one more draft, accepted with probability `alpha` (given the
    /// ones before it): whether it raises the chain's `E[τ] / (K·c + r(K + 1))`
    /// ([`ChainOutlook::worth_extending`]) at the costs [`AutoLength::choose`] prices steps by.
    /// `None` while `c` is neither measured nor guessed.
    pub fn worth_extending(&self, chain: &ChainOutlook, alpha: f64) -> Option<bool> {
        let c = self.working_cost()?;
        Some(chain.worth_extending(alpha, |k| self.cost(c, k)))
    }

    /// [`AutoLength::worth_extending`] for a draft whose row the draft model has computed: that
    /// row's `c` is spent whether or not the draft is proposed
    /// ([`ChainOutlook::worth_proposing`]), so only the verification's extra width weighs
    /// against it.
    pub fn worth_proposing(&self, chain: &ChainOutlook, alpha: f64) -> Option<bool> {
        let c = self.working_cost()?;
        Some(chain.worth_proposing(alpha, |k| self.cost(c, k), c))
    }

    /// Records the draft's time per drafted token in one step.
    pub fn record_draft(&mut self, seconds_per_token: f64) {
        self.lengths.record_draft_row(seconds_per_token);
        self.hopeless_timings = 0;
    }

    /// `c` as guessed before the draft is timed (see [`AutoLength`]); a guess that is not a
    /// finite number ≥ 0 is ignored.
    pub fn with_cost_prior(mut self, c: f64) -> Self {
        self.cost_prior = (c.is_finite() && c >= 0.0).then_some(c);
        self
    }

    /// Prices every step by the given costs instead of measured ones: a draft token `c`
    /// one-token target steps, a verification of `w` tokens `1 + s·(w − 1)` (no one-token steps
    /// are then asked for). For a machine whose costs are known, and for tests that must not
    /// depend on timings. Costs that are not finite numbers ≥ 0 are ignored.
    pub fn with_fixed_costs(mut self, c: f64, s: f64) -> Self {
        let valid = |x: f64| x.is_finite() && x >= 0.0;
        self.fixed_costs = (valid(c) && valid(s)).then_some((c, s));
        self
    }

    /// `c` as the policy uses it: measured, or else guessed.
    fn working_cost(&self) -> Option<f64> {
        self.cost_ratio().or(self.cost_prior)
    }

    /// Whether no `K ∈ 1..=k_max` would pay at draft cost `c` even with every draft accepted.
    fn hopeless_at(&self, c: f64, k_max: usize) -> bool {
        best_length_by(1.0, 0, k_max, |k| self.cost(c, k)) == 0
    }

    /// Whether the draft, at its measured or guessed `c`, cannot pay with any `K ≤ k_max` even
    /// with every draft accepted: `auto` then decodes plainly, with no probes, and only times
    /// the draft again now and then ([`AutoLength::wants_draft_timing`]).
    pub fn hopeless_draft(&self, k_max: usize) -> bool {
        self.working_cost()
            .is_some_and(|c| self.hopeless_at(c, k_max))
    }

    /// Whether a hopeless draft ([`AutoLength::hopeless_draft`]) is due to be timed again: one
    /// draft forward whose output is not used, recorded with
    /// [`AutoLength::record_draft_timing`], since its cost may have changed (another load on the
    /// machine, a guess that was wrong, a first measurement that met a stall: on cuda, kernels
    /// compiled for a first shape made one draft token take 1 s where it takes 30 ms). The wait
    /// doubles with each timing that leaves the draft hopeless, from
    /// [`AutoLength::PROBE_WAIT`]`.0` plain steps to `.1`, so a verdict that rests on one
    /// measurement is checked soon and a draft that stays hopeless costs one forward in 64 steps.
    pub fn wants_draft_timing(&self, k_max: usize) -> bool {
        let (fewest, most) = Self::PROBE_WAIT;
        // Capped so that the shift cannot overflow in a long run.
        let doublings = self.hopeless_timings.min(usize::BITS / 2);
        let wait = (fewest << doublings).min(most);
        self.hopeless_draft(k_max) && self.lengths.plain_run() >= wait
    }

    /// Records a draft forward timed for [`AutoLength::wants_draft_timing`]; the plain run
    /// starts again.
    pub fn record_draft_timing(&mut self, seconds: f64) {
        self.lengths.record_draft_row(seconds);
        self.hopeless_timings = self.hopeless_timings.saturating_add(1);
        self.lengths.restart_plain_run();
    }

    /// Records a catch-up of the draft on `tokens` tokens of context it skipped during plain
    /// steps, fed in one forward of `seconds`.
    pub fn record_catch_up(&mut self, tokens: usize, seconds: f64) {
        if tokens == 0 || !seconds.is_finite() || seconds < 0.0 {
            return;
        }
        self.catch_up_token_seconds = average_time(
            self.catch_up_token_seconds,
            seconds / tokens as f64,
            Self::TIME_WEIGHT,
        );
    }

    /// Records the time of one target step that scored `width` tokens (drafts + 1).
    pub fn record_target(&mut self, width: usize, seconds: f64) {
        self.lengths.record_step_time(width, seconds);
    }

    /// The smoothed acceptance rate.
    pub fn alpha(&self) -> f64 {
        self.lengths.alpha()
    }

    /// The tokens a step with `k` drafts is expected to yield, averaged over what the run's
    /// counts leave uncertain about `α` ([`AcceptanceRate::expected_tokens`](spec_core::length::AcceptanceRate::expected_tokens)).
    pub fn expected_tokens(&self, k: usize) -> f64 {
        self.lengths.expected_tokens(k)
    }

    /// `c`: the draft's time per token over a one-token target step, once both are known.
    pub fn cost_ratio(&self) -> Option<f64> {
        if let Some((c, _)) = self.fixed_costs {
            return Some(c);
        }
        self.lengths.draft_cost()
    }

    /// The smoothed draft time per drafted token.
    pub fn draft_token_seconds(&self) -> Option<f64> {
        self.lengths.draft_row_seconds()
    }

    /// A one-token target step's time (see [`WidthCosts::one_token_seconds`]).
    pub fn target_step_seconds(&self) -> Option<f64> {
        self.lengths.one_token_seconds()
    }

    /// The target's step times by width.
    pub fn width_costs(&self) -> &WidthCosts {
        self.lengths.widths()
    }

    /// A step's cost in one-token target steps: `K` drafts at `c` and a verification of `K + 1`.
    fn cost(&self, c: f64, k: usize) -> f64 {
        let verification = match self.fixed_costs {
            Some((_, s)) => 1.0 + s * k as f64,
            None => self.lengths.verification_cost(k + 1),
        };
        k as f64 * c + verification
    }

    /// The draft length for the next step, whose draft would first catch up on `catch_up`
    /// skipped tokens: 0 when a one-token step is due, otherwise the `K ∈ 0..=k_max` maximizing
    /// `E[τ] / (K·c + r(K + 1))` once `c` is known (0 being a plain step, whose value is 1), or
    /// the best `K ≥ 1` when a probe is due (see [`AutoLength`]); before `c` is measured,
    /// `min(DEFAULT_K, k_max)`; 0 for a hopeless draft ([`AutoLength::hopeless_draft`]).
    pub fn choose(&self, k_max: usize, catch_up: usize) -> usize {
        if self.fixed_costs.is_none() && self.lengths.wants_one_token_step() {
            return 0;
        }
        let Some(c) = self.working_cost() else {
            return DEFAULT_K.min(k_max).max(1);
        };
        if self.hopeless_at(c, k_max) {
            return 0;
        }
        let expected = |k: usize| self.lengths.expected_tokens(k);
        let cost = |k: usize| self.cost(c, k);
        let best = match self.cost_ratio() {
            Some(_) => best_length_for(expected, 0, k_max, cost),
            None => DEFAULT_K.min(k_max).max(1),
        };
        if best > 0 {
            return best;
        }
        let probe = best_length_for(expected, 1, k_max.max(1), cost);
        // Steps the catch-up costs: measured per token, or at most a draft step's each.
        let catch_up_steps = match (
            self.catch_up_token_seconds,
            self.lengths.one_token_seconds(),
        ) {
            (Some(s), Some(t)) if t > 0.0 => s / t,
            _ => c,
        } * catch_up as f64;
        let loss = cost(probe) + catch_up_steps - expected(probe);
        let (fewest, most) = Self::PROBE_WAIT;
        let wait = (loss / Self::PROBE_SHARE)
            .ceil()
            .clamp(fewest as f64, most as f64);
        if self.lengths.plain_run() as f64 >= wait {
            probe
        } else {
            0
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 100 steps with every draft accepted, a draft token timed at `draft_seconds` and a
    /// one-token target step at 0.1 s.
    fn every_draft_accepted(draft_seconds: f64) -> AutoLength {
        let mut auto = AutoLength::default();
        for _ in 0..100 {
            auto.record_step(4, 4);
        }
        auto.record_draft(draft_seconds);
        auto.record_target(1, 0.1);
        auto
    }

    #[test]
    fn choose_uses_measured_times() {
        let fresh = AutoLength::default();
        assert_eq!(fresh.choose(8, 0), DEFAULT_K);
        assert_eq!(fresh.choose(2, 0), 2);
        let mut auto = every_draft_accepted(0.001);
        assert!((auto.cost_ratio().unwrap_or(0.0) - 0.01).abs() < 1e-12);
        assert_eq!(auto.choose(8, 0), 8);
        // A draft as slow as the target whose drafts are all rejected: plain steps pay more.
        for _ in 0..50 {
            auto.record_draft(0.1);
            auto.record_step(1, 0);
        }
        assert_eq!(auto.choose(8, 0), 0);
    }

    /// A run whose drafts are mostly rejected (`α` about 0.3: 1 of 4 tested drafts accepted) and
    /// whose draft took 0.02 s a token; no target step recorded yet.
    fn low_acceptance_draft_of_0_02_seconds() -> AutoLength {
        let mut auto = AutoLength::default();
        for _ in 0..100 {
            auto.record_step(2, 0);
            auto.record_step(2, 1);
            auto.record_step(3, 0);
        }
        auto.record_draft(0.02);
        auto
    }

    /// Where no draft length beats plain decoding, `auto` decodes plainly, trying the best `K`
    /// again after a run of plain steps; once the probes show drafts paying, it drafts every
    /// step again.
    #[test]
    fn decodes_plainly_where_drafting_loses_and_probes_now_and_then() {
        // c 0.2, α 0.3 and a verification as costly as r(w) = 1 + 0.5 (w − 1) (the 4-bit
        // 1.5B's on an AVX2-only CPU): every K ≥ 1 expects less than a plain step's one token
        // a step.
        let mut auto = low_acceptance_draft_of_0_02_seconds();
        auto.record_target(1, 0.1);
        auto.record_target(3, 0.2);
        auto.record_target(3, 0.2);
        let alpha = auto.alpha();
        assert!((0.2..0.4).contains(&alpha), "α {alpha}");
        assert!((auto.width_costs().slope() - 0.5).abs() < 1e-9);
        let value = |k: usize| expected_tokens(alpha, k) / (k as f64 * 0.2 + 1.0 + 0.5 * k as f64);
        assert!((1..=8).all(|k| value(k) < 1.0));

        // A probe of K 1 is expected to lose 0.2 + 1.5 − (1 + α) ≈ 0.4 steps: about 8 plain
        // steps at 5% each.
        let wait = ((0.7 - alpha) / AutoLength::PROBE_SHARE).ceil() as usize;
        assert!((8..=10).contains(&wait));
        let mut chosen = Vec::new();
        for _ in 0..3 * wait {
            let k = auto.choose(8, 0);
            chosen.push(k);
            // Each step's time as measured: a plain step 0.1 s, a probe of K drafts r(K + 1).
            auto.record_target(k + 1, 0.1 * (1.0 + 0.5 * k as f64));
            auto.record_step(k, 0);
        }
        let probes: Vec<usize> = (0..chosen.len()).filter(|&i| chosen[i] > 0).collect();
        // `wait` plain steps, a probe (of K 1: the least bad), and again (its failure lowered α,
        // so the wait may grow).
        assert_eq!(probes.len(), 2, "{chosen:?}");
        assert_eq!(probes[0], wait, "{chosen:?}");
        assert!(
            (wait..=wait + 3).contains(&(probes[1] - probes[0] - 1)),
            "{chosen:?}"
        );
        assert!(probes.iter().all(|&i| chosen[i] == 1));

        // The text turns predictable and the verification cheap: the probes' drafts are
        // accepted, `α` climbs with each, and drafting resumes for good.
        let mut chosen = Vec::new();
        for _ in 0..150 {
            let k = auto.choose(8, 0);
            auto.record_target(k + 1, 0.1 * (1.0 + 0.1 * k as f64));
            auto.record_step(k, k);
            chosen.push(k);
        }
        let first_run = chosen.iter().position(|&k| k > 1).unwrap_or(chosen.len());
        assert!(auto.alpha() > 0.9, "α {}", auto.alpha());
        // From then on every step drafts, but the one-token steps that refresh t(1).
        let plain_after = chosen[first_run..].iter().filter(|&&k| k == 0).count();
        assert!(
            first_run < 100 && plain_after <= chosen[first_run..].len() / WidthCosts::REFRESH + 1,
            "{chosen:?}"
        );
    }

    /// The more a probe is expected to lose, the longer the plain run before it. With `α` about
    /// 1/3 and `r(2)` 1.3: a draft at `c` 0.3 loses 0.3 + 1.3 − 1.33 ≈ 0.27 steps in a K 1
    /// probe (the fewest, 8 plain steps, before it), one at 0.65 about 0.62 (about 13); one at
    /// 1.8 (the 0.5B in f32 against the 1.5B in 4 bits) is hopeless and never probed.
    #[test]
    fn a_costly_probe_waits_longer() {
        let first_probe = |draft_seconds: f64| {
            let mut auto = AutoLength::default();
            for _ in 0..100 {
                auto.record_step(2, 0);
                auto.record_step(2, 1);
            }
            auto.record_draft(draft_seconds);
            // A width's first step is not averaged (see `WidthCosts`).
            auto.record_target(2, 0.13);
            auto.record_target(2, 0.13);
            auto.record_target(1, 0.1);
            (0..200).find(|_| {
                let k = auto.choose(8, 0);
                auto.record_target(k + 1, if k == 0 { 0.1 } else { 0.13 });
                k > 0
            })
        };
        // The one-token step before the loop counts towards the run.
        assert_eq!(first_probe(0.03), Some(AutoLength::PROBE_WAIT.0 - 1));
        let costly = first_probe(0.065);
        assert!(matches!(costly, Some(10..=14)), "{costly:?}");
        assert_eq!(first_probe(0.18), None);
    }

    /// A guess of `c` decides the first steps: a draft that no `K` makes pay even with every
    /// draft accepted (`(K + 1) / (K·c + 1 + 0.1·K) ≤ 1` for every `K`, i.e. `c ≥ 0.9` with
    /// `r`'s prior slope) starts with plain steps; a cheaper one drafts `DEFAULT_K`, as without
    /// a guess; and a measured `c` overrides the guess.
    #[test]
    fn a_guess_of_the_cost_decides_the_first_steps() {
        assert!(!AutoLength::default().hopeless_draft(8));
        for (guess, plain) in [(0.1, false), (0.85, false), (0.95, true), (5.0, true)] {
            let auto = AutoLength::default().with_cost_prior(guess);
            assert_eq!(auto.hopeless_draft(8), plain, "guess {guess}");
            let k = auto.choose(8, 0);
            assert_eq!(k, if plain { 0 } else { DEFAULT_K }, "guess {guess}");
        }
        assert!(
            !AutoLength::default()
                .with_cost_prior(f64::NAN)
                .hopeless_draft(8)
        );
        let mut auto = AutoLength::default().with_cost_prior(5.0);
        auto.record_draft(0.01);
        auto.record_target(1, 0.1);
        assert!(!auto.hopeless_draft(8));
        assert!(auto.choose(8, 0) > 0);
    }

    /// A hopeless draft (`c` 2, every draft accepted) is never probed, whatever `α`: it is timed
    /// once instead after 8 plain steps, then after 16, 32 and every 64 while it stays hopeless.
    #[test]
    fn a_hopeless_draft_is_only_timed_now_and_then() {
        let mut auto = every_draft_accepted(0.2);
        assert!(auto.hopeless_draft(8) && auto.alpha() > 0.95);
        let mut timings = Vec::new();
        for step in 1..=6000 {
            if auto.wants_draft_timing(8) {
                timings.push(step);
                auto.record_draft_timing(0.2);
            }
            let k = auto.choose(8, 0);
            assert_eq!(k, 0, "step {step}");
            auto.record_target(k + 1, 0.1);
        }
        // The run counts the one-token step before the loop.
        assert_eq!(timings[..5], [8, 24, 56, 120, 184]);
        // And it stays at 64 however long the run (past 61 timings, a shift of 8 would wrap).
        assert_eq!(timings.len(), 5 + (6000 - 184) / 64);
        assert!(timings.windows(2).skip(3).all(|w| w[1] - w[0] == 64));
    }

    /// On cuda the first draft forwards at a new shape compile kernels: one draft token timed at
    /// 1 s where it takes 30 ms (c 10 against a 0.1 s target step) made `auto` decode plainly
    /// for whole runs. The first timing, after 8 plain steps, replaces that average, and with
    /// every draft accepted drafting resumes at once; a draft that does turn 2× slower moves
    /// the average by at most 0.2× a measurement.
    #[test]
    fn a_stall_in_the_first_timing_does_not_stop_drafting() {
        let mut auto = every_draft_accepted(1.0);
        assert!(auto.hopeless_draft(8));
        let resumed = (1..=100).find(|_| {
            if auto.wants_draft_timing(8) {
                auto.record_draft_timing(0.03);
            }
            let k = auto.choose(8, 0);
            auto.record_target(k + 1, 0.1);
            k > 0
        });
        assert_eq!(resumed, Some(8));
        assert!((auto.cost_ratio().unwrap_or(0.0) - 0.3).abs() < 1e-9);
        // Now a stall while drafting: 1 s counts as 60 ms.
        auto.record_draft(1.0);
        assert!((auto.draft_token_seconds().unwrap_or(0.0) - 0.036).abs() < 1e-12);
        assert!(!auto.hopeless_draft(8));
    }

    /// The other stall of that H200 run: `auto`'s first verification of 5 tokens, a shape no
    /// method had met, took about 200 one-token steps (kernels compiled), which priced every
    /// width so high that no draft length could pay. A width's first step is not averaged
    /// ([`WidthCosts`]), so the second step drafts as the first did.
    #[test]
    fn a_stall_in_the_first_wide_step_does_not_stop_drafting() {
        let mut auto = AutoLength::default();
        auto.record_target(1, 0.03);
        let k = auto.choose(8, 0);
        assert_eq!(k, DEFAULT_K);
        auto.record_draft(0.003);
        auto.record_step(k, k);
        auto.record_target(k + 1, 6.0);
        assert!(!auto.hopeless_draft(8));
        assert!(auto.choose(8, 0) > 0);
        auto.record_target(k + 1, 0.033);
        assert!((auto.width_costs().slope() - 0.025).abs() < 1e-9);
    }

    /// A probe whose draft must first catch up on skipped tokens waits longer: with `α` 0.3
    /// and `c` 0.2, a K 1 probe loses about 0.4 steps (a wait of 8); catching up on 20 tokens at
    /// 0.1 step each adds 2 (a wait of about 48); before a catch-up is timed, each token counts
    /// `c`, 0.2.
    #[test]
    fn a_probe_that_must_catch_up_waits_longer() {
        let wait = |catch_up: usize, catch_up_seconds: Option<f64>| {
            let mut auto = low_acceptance_draft_of_0_02_seconds();
            auto.record_target(3, 0.2);
            auto.record_target(3, 0.2);
            if let Some(s) = catch_up_seconds {
                auto.record_catch_up(20, s);
            }
            auto.record_target(1, 0.1);
            (1..200).find(|_| {
                let k = auto.choose(8, catch_up);
                auto.record_target(k + 1, 0.1);
                k > 0
            })
        };
        let alone = wait(0, None).unwrap_or(0);
        assert!((8..=10).contains(&alone), "{alone}");
        let timed = wait(20, Some(0.2)).unwrap_or(0);
        assert!(
            (alone + 38..=alone + 42).contains(&timed),
            "{alone} {timed}"
        );
        assert_eq!(wait(20, None), Some(AutoLength::PROBE_WAIT.1));
    }

    /// `α` 0.9 and `c` 0.37 (about the Qwen 0.5B → 1.5B pair): with a verification as cheap as a
    /// decode step the best `K` is 4–5; where 8 tokens cost 4.2 steps (the Q8_0 1.5B target on
    /// two cores) a longer draft costs more than it yields.
    #[test]
    fn a_costly_wide_verification_shortens_the_draft() {
        let choose = |wide_seconds: f64| {
            let mut auto = AutoLength::default();
            for _ in 0..200 {
                auto.record_step(10, 9);
            }
            auto.record_draft(0.037);
            auto.record_target(1, 0.1);
            auto.record_target(8, wide_seconds);
            auto.record_target(8, wide_seconds);
            assert!((auto.cost_ratio().unwrap_or(0.0) - 0.37).abs() < 1e-9);
            auto.choose(8, 0)
        };
        let flat = choose(0.1);
        let steep = choose(0.42);
        assert!((4..=5).contains(&flat), "flat widths chose {flat}");
        assert!(steep <= 2, "steep widths chose {steep}");
    }

    /// A generation shorter than [`WidthCosts::REFRESH`] steps measures no one-token step. Its
    /// widths' own line prices the steps: the 1.5B target on a Zen 5 (`t(1)` 130 ms, 0.03 more
    /// a token) with the 0.5B draft (13.4 ms a token). The prior slope through the narrowest
    /// width (0.1 a token, `t(1)` 25% low) drafted one token shorter than the best length.
    #[test]
    fn a_short_run_prices_its_steps_by_its_own_widths() {
        let time = |w: usize| 0.13 * (1.0 + 0.03 * (w - 1) as f64);
        let mut auto = AutoLength::default();
        for _ in 0..100 {
            auto.record_step(8, 7);
        }
        auto.record_draft(0.0134);
        for w in [4, 4, 7, 7] {
            auto.record_target(w, time(w));
        }
        let alpha = auto.alpha();
        let expected = |k: usize| auto.expected_tokens(k);
        let best = best_length_for(expected, 0, 8, |k| {
            k as f64 * 0.0134 / 0.13 + time(k + 1) / 0.13
        });
        let one_by_prior = time(4) / (1.0 + 3.0 * WidthCosts::PRIOR_SLOPE);
        let by_prior = best_length_for(expected, 0, 8, |k| {
            k as f64 * 0.0134 / one_by_prior + 1.0 + WidthCosts::PRIOR_SLOPE * k as f64
        });
        assert!(by_prior < best, "{by_prior} {best}");
        assert_eq!(auto.choose(8, 0), best, "α {alpha}");
        assert!((auto.target_step_seconds().unwrap_or(0.0) - 0.13).abs() < 1e-9);
    }

    /// After one step with all 4 drafts accepted, `α` is 5/6 with the prior, but how sure the
    /// run is of it is one step's worth: averaged over that doubt, 8 drafts are expected to
    /// yield more than `E[τ]` at 5/6 says, and `auto` drafts 8 where the mean rate alone would
    /// draft 6 (the 1.5B target's costs on a Zen 5, as above).
    #[test]
    fn drafts_longer_while_the_rate_is_unsure() {
        let time = |w: usize| 0.13 * (1.0 + 0.03 * (w - 1) as f64);
        let mut auto = AutoLength::default();
        auto.record_draft(0.0134);
        // Each width's first step is left out of its average.
        for w in [1, 1, 5, 5] {
            auto.record_target(w, time(w));
        }
        auto.record_step(4, 4);
        assert!((auto.width_costs().slope() - 0.03).abs() < 1e-9);
        let cost = |k: usize| k as f64 * 0.0134 / 0.13 + time(k + 1) / 0.13;
        assert_eq!(best_length_by(auto.alpha(), 0, 8, cost), 6);
        assert_eq!(best_length_for(|k| auto.expected_tokens(k), 0, 8, cost), 8);
        assert_eq!(auto.choose(8, 0), 8);
    }

    /// A draft-model step always scores two or more tokens, so the policy asks for a plain step
    /// now and then to keep the one-token time, the unit of `c` and `r`, current.
    #[test]
    fn asks_for_a_one_token_step_now_and_then() {
        let mut auto = AutoLength::default();
        auto.record_draft(0.01);
        // Before any one-token step, t(1) is inferred from the narrowest width through r's prior
        // (from its second step: the first is not averaged).
        auto.record_target(4, 0.5);
        assert_eq!(auto.target_step_seconds(), None);
        auto.record_target(4, 0.13);
        let t1 = auto.target_step_seconds().unwrap_or(0.0);
        assert!((t1 - 0.13 / (1.0 + 3.0 * WidthCosts::PRIOR_SLOPE)).abs() < 1e-12);
        for _ in 2..WidthCosts::REFRESH {
            assert!(auto.choose(8, 0) >= 1);
            auto.record_target(4, 0.13);
        }
        assert_eq!(auto.choose(8, 0), 0);
        auto.record_target(1, 0.1);
        assert!(auto.choose(8, 0) >= 1);
        assert_eq!(auto.target_step_seconds(), Some(0.1));
        // Measured now: r(4) = 1.3, so the slope is 0.1 per extra token.
        assert!((auto.width_costs().slope() - 0.1).abs() < 1e-9);
    }

    /// The chain rule (`auto` in the drafter): drafts of confident rows (top probability 0.95)
    /// have been accepted and those of unsure rows (0.35) rejected, so a chain takes confident
    /// drafts to the longest and stops before an unsure one, even as the first draft (a plain
    /// step then pays more: 1.03 tokens for 1.13 steps). With `c` neither measured nor guessed
    /// there is no verdict.
    #[test]
    fn a_chain_stops_before_a_draft_its_confidence_says_will_fail() {
        assert_eq!(
            AutoLength::default().worth_extending(&ChainOutlook::new(), 0.9),
            None
        );
        assert!(!AutoLength::default().prices_steps());
        assert!(AutoLength::default().with_cost_prior(0.1).prices_steps());
        let mut auto = AutoLength::default().with_fixed_costs(0.1, 0.03);
        assert!(auto.prices_steps());
        let mut trials = ChainTrials::new(0);
        for confidence in [0.95, 0.95, 0.35] {
            trials.propose(confidence);
        }
        for _ in 0..50 {
            auto.record_chain(&trials, 2, &[]);
        }
        let (sure, unsure) = (auto.alpha_at(0.97), auto.alpha_at(0.31));
        assert!(sure > 0.99 && unsure < 0.05, "{sure} {unsure}");
        // The mean rate does not see these trials: `record_step` keeps it.
        assert!((auto.alpha() - 0.5).abs() < 1e-12);
        let mut chain = ChainOutlook::new();
        for _ in 0..8 {
            assert_eq!(auto.worth_extending(&chain, sure), Some(true));
            chain = chain.extended(sure);
        }
        let one = ChainOutlook::new().extended(sure);
        assert_eq!(auto.worth_extending(&one, unsure), Some(false));
        // Once its row is computed, its `c` (0.1) is spent either way and only the width's 0.03
        // weighs against a draft: one at α 0.15 is then proposed, though a row at that rate
        // would not be computed (it would need α > 0.23), and one at α 0.01 still is not.
        assert_eq!(auto.worth_extending(&one, 0.15), Some(false));
        assert_eq!(auto.worth_proposing(&one, 0.15), Some(true));
        assert_eq!(auto.worth_proposing(&one, 0.01), Some(false));
        assert_eq!(
            auto.worth_extending(&ChainOutlook::new(), unsure),
            Some(false)
        );
        // A free trial of a stopped chain's next draft, accepted, moves its bucket up.
        let mut stopped = ChainTrials::new(0);
        stopped.stop_before(3, 0.35);
        auto.record_chain(&stopped, 0, &[3]);
        assert!(auto.alpha_at(0.35) > unsure);
        // Fixed costs: `c` as given, no one-token steps asked for.
        assert_eq!(auto.cost_ratio(), Some(0.1));
        for _ in 0..2 * WidthCosts::REFRESH {
            auto.record_target(9, 0.2);
        }
        assert!(auto.choose(8, 0) > 0);
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

        let with = DraftLength::parse_with_threshold;
        assert_eq!(with(None, None).ok(), Some(DraftLength::default()));
        assert_eq!(with(Some("6"), None).ok(), Some(DraftLength::Fixed(6)));
        assert_eq!(
            with(Some("6"), Some(0.4)).ok(),
            Some(DraftLength::Confident {
                max: 6,
                threshold: 0.4
            })
        );
        assert_eq!(
            with(None, Some(0.4)).ok(),
            Some(DraftLength::Confident {
                max: DEFAULT_K_MAX,
                threshold: 0.4
            })
        );
        assert!(matches!(
            with(Some("auto"), Some(0.4)),
            Err(SamplingError::ThresholdWithAuto)
        ));
        assert!(matches!(
            with(Some("4"), Some(1.0)),
            Err(SamplingError::InvalidThreshold(_))
        ));
        assert!(matches!(
            with(Some("0"), Some(0.5)),
            Err(SamplingError::ZeroDraftLength)
        ));
    }
}
