//! Running estimates of how often drafts are accepted.

/// A running estimate of the acceptance rate `α`.
///
/// A chain step tests drafts in order until the first rejection, so a step with `a` of `k`
/// accepted made `a` successful trials and, if `a < k`, one failed one; drafts after a rejection
/// were never tested. `α = accepted / trials` is the maximum-likelihood estimate under the i.i.d.
/// model (plain `accepted / drafted` would count the untested drafts as failures). Counts decay (by
/// [`AcceptanceRate::DECAY`] unless set) per record so the estimate follows the text, and a prior of one
/// success in two trials keeps the first steps sane.
#[derive(Debug, Clone)]
pub struct AcceptanceRate {
    accepted: f64,
    trials: f64,
    decay: f64,
    /// Prior successes and trials, added to the counts.
    prior: (f64, f64),
}

impl Default for AcceptanceRate {
    fn default() -> Self {
        Self::with_decay(Self::DECAY)
    }
}

impl AcceptanceRate {
    /// The default weight kept by old counts at each record (a memory of ~10 records).
    pub const DECAY: f64 = 0.9;
    /// The default prior: one success in two trials.
    const PRIOR: (f64, f64) = (1.0, 2.0);

    /// An estimate whose counts keep `decay ∈ (0, 1]` of their weight at each record (clamped).
    pub fn with_decay(decay: f64) -> Self {
        let decay = if decay.is_finite() {
            decay.clamp(0.01, 1.0)
        } else {
            Self::DECAY
        };
        Self {
            accepted: 0.0,
            trials: 0.0,
            decay,
            prior: Self::PRIOR,
        }
    }

    /// An estimate with `decay` as in [`AcceptanceRate::with_decay`] that starts at `alpha`
    /// (clamped to `[0, 1]`) with the weight of `trials` trials (at least 0.1).
    pub fn with_prior(decay: f64, alpha: f64, trials: f64) -> Self {
        let alpha = if alpha.is_finite() {
            alpha.clamp(0.0, 1.0)
        } else {
            0.5
        };
        let trials = if trials.is_finite() {
            trials.max(0.1)
        } else {
            2.0
        };
        Self {
            prior: (alpha * trials, trials),
            ..Self::with_decay(decay)
        }
    }

    /// Records a verified chain: `accepted` of `drafted` drafts (nothing when `drafted` is 0).
    pub fn record_chain(&mut self, drafted: usize, accepted: usize) {
        if drafted == 0 {
            return;
        }
        let accepted = accepted.min(drafted) as f64;
        let failed = if accepted < drafted as f64 { 1.0 } else { 0.0 };
        self.accepted = self.accepted * self.decay + accepted;
        self.trials = self.trials * self.decay + accepted + failed;
    }

    /// Records one trial: a single draft that was (or, for a draft that was not proposed but can
    /// be scored against the output, would have been) accepted or not.
    pub fn record_trial(&mut self, accepted: bool) {
        self.record_chain(1, usize::from(accepted));
    }

    /// The smoothed acceptance rate.
    pub fn alpha(&self) -> f64 {
        (self.accepted + self.prior.0) / (self.trials + self.prior.1)
    }

    /// The expected tokens of a step with `k` drafts, averaged over what the counts leave
    /// uncertain about `α`: the counts (prior included) as a Beta(`s`, `f`) belief about `α`,
    /// `s` successes and `f` failures, under which `E[α^i] = Π_{j<i} (s + j) / (s + f + j)`, so
    /// `E[τ] = Σ_{i=0..k} E[α^i]`.
    ///
    /// `E[τ](α, k)` is convex in `α`, so [`expected_tokens`](super::expected_tokens) at the mean `α` understates this
    /// (Jensen's inequality), the more so the fewer the trials: after one step with 4 of 4
    /// accepted (`α` = 5/6 with the prior), 8 drafts are expected to yield 5.48 tokens, not
    /// 4.84. A policy choosing `K` from `α` alone drafts short while the rate is still unsure;
    /// with many trials the two agree.
    pub fn expected_tokens(&self, k: usize) -> f64 {
        // The prior holds at least 0.1 trials and counts only add trials, so no term divides
        // by zero.
        let successes = self.accepted + self.prior.0;
        let trials = self.trials + self.prior.1;
        let mut moment = 1.0;
        let mut total = 1.0;
        for j in 0..k {
            moment *= (successes + j as f64) / (trials + j as f64);
            total += moment;
        }
        total
    }
}

/// Acceptance rates kept apart by the drafter's confidence in its draft (e.g. the draft
/// distribution's top probability), in equal-width buckets over `[0, 1]`.
///
/// A drafter whose acceptance is low on average may still be right most of the time when it is
/// confident; one rate per bucket lets a length policy draft only there. Each bucket starts at
/// its midpoint confidence (worth two trials), i.e. the guess that the drafter is calibrated.
#[derive(Debug, Clone)]
pub struct AcceptanceByConfidence {
    rates: Vec<AcceptanceRate>,
}

impl AcceptanceByConfidence {
    /// `buckets ≥ 1` buckets (clamped) whose counts decay as in [`AcceptanceRate::with_decay`].
    pub fn new(buckets: usize, decay: f64) -> Self {
        let buckets = buckets.max(1);
        let rates = (0..buckets)
            .map(|i| AcceptanceRate::with_prior(decay, (i as f64 + 0.5) / buckets as f64, 2.0))
            .collect();
        Self { rates }
    }

    /// The bucket of `confidence` (clamped to `[0, 1]`; NaN goes to the lowest).
    pub fn bucket(&self, confidence: f64) -> usize {
        let n = self.rates.len();
        let c = if confidence.is_nan() {
            0.0
        } else {
            confidence.clamp(0.0, 1.0)
        };
        ((c * n as f64) as usize).min(n - 1)
    }

    /// The acceptance rate of drafts made with `confidence`.
    pub fn alpha(&self, confidence: f64) -> f64 {
        self.rates[self.bucket(confidence)].alpha()
    }

    /// Records one tested draft made with `confidence`.
    pub fn record(&mut self, confidence: f64, accepted: bool) {
        let i = self.bucket(confidence);
        self.rates[i].record_trial(accepted);
    }

    /// Records a chain's tested drafts, made with `confidences` in order, of which the first
    /// `accepted` were accepted: those and the first rejected one (drafts after a rejection were
    /// never tested).
    pub fn record_chain(&mut self, confidences: &[f64], accepted: usize) {
        for (i, &confidence) in confidences.iter().enumerate().take(accepted + 1) {
            self.record(confidence, i < accepted);
        }
    }

    /// The per-bucket rates, lowest confidence first.
    pub fn rates(&self) -> &[AcceptanceRate] {
        &self.rates
    }
}

/// What a step's chain can teach an [`AcceptanceByConfidence`], kept from drafting until the
/// verdict: the confidence of each proposed draft's row and, where a length rule computed a row
/// and then stopped before proposing its token, that token and the row's confidence.
///
/// The verdict tests the proposed drafts in order ([`AcceptanceByConfidence::record_chain`]).
/// When it accepts all of them, the step's next token lands where the stopped row's token would
/// have been: comparing the two is one more trial, which cost nothing. Under greedy settings a
/// point mass on `x` is accepted exactly when the step outputs `x`, so the trial is exact; a
/// sampled `x` drawn from `q` matches with probability `Σ q·p`, a lower bound of the acceptance
/// `Σ min(p, q)`. Either way the trials steer the draft length only, never the output.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ChainTrials {
    /// The context's length when drafting: the step's first output lands at this index.
    context_len: usize,
    confidences: Vec<f64>,
    stopped_before: Option<(u32, f64)>,
}

impl ChainTrials {
    /// A chain drafted after a context of `context_len` tokens.
    pub fn new(context_len: usize) -> Self {
        Self {
            context_len,
            ..Self::default()
        }
    }

    /// The next draft, from a row with `confidence`, is proposed.
    pub fn propose(&mut self, confidence: f64) {
        self.confidences.push(confidence);
    }

    /// The chain ends before `token`, drawn from a row with `confidence`, without proposing it.
    pub fn stop_before(&mut self, token: u32, confidence: f64) {
        self.stopped_before = Some((token, confidence));
    }

    /// Drafts proposed.
    pub fn proposed(&self) -> usize {
        self.confidences.len()
    }

    /// Whether the chain ended at a row it computed ([`ChainTrials::stop_before`]).
    pub fn stopped(&self) -> bool {
        self.stopped_before.is_some()
    }

    /// Records into `acceptance` what the verdict settled: the first `accepted` proposed drafts
    /// accepted and, if any was not, the next one rejected; when all were accepted, the stopped
    /// row's token against `context` (the context after the step) at its place. A context too
    /// short to reach that place records no such trial.
    pub fn record(
        &self,
        accepted: usize,
        context: &[u32],
        acceptance: &mut AcceptanceByConfidence,
    ) {
        let proposed = self.proposed();
        let accepted = accepted.min(proposed);
        acceptance.record_chain(&self.confidences, accepted);
        if accepted == proposed
            && let (Some((token, confidence)), Some(&produced)) = (
                self.stopped_before,
                context.get(self.context_len + proposed),
            )
        {
            acceptance.record(confidence, produced == token);
        }
    }
}

/// The expected yield of a chain being drafted one token at a time, each draft `i` accepted
/// (given the ones before it) with its own probability `α_i`:
/// `E[τ] = 1 + α_1 + α_1·α_2 + … + α_1⋯α_K` (Leviathan et al. 2023, eq. 1, with the rate per
/// position instead of one `α`).
///
/// [`ChainOutlook::worth_extending`] is the rule of a drafter that decides after each draft
/// token whether one more pays: it looks one token ahead (a myopic rule), which needs only the
/// next draft's rate, known before that token is drawn — so a sampled draft can stop early
/// without biasing the tokens it proposed.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ChainOutlook {
    expected: f64,
    reach: f64,
    drafted: usize,
}

impl Default for ChainOutlook {
    fn default() -> Self {
        Self::new()
    }
}

impl ChainOutlook {
    /// No draft yet: one token (the step's own) expected.
    pub fn new() -> Self {
        Self {
            expected: 1.0,
            reach: 1.0,
            drafted: 0,
        }
    }

    /// Drafts so far.
    pub fn drafted(&self) -> usize {
        self.drafted
    }

    /// `E[τ]` of the chain so far.
    pub fn expected_tokens(&self) -> f64 {
        self.expected
    }

    /// The chain with one more draft, accepted with probability `alpha` (clamped to `[0, 1]`).
    pub fn extended(&self, alpha: f64) -> Self {
        let alpha = if alpha.is_nan() {
            0.0
        } else {
            alpha.clamp(0.0, 1.0)
        };
        let reach = self.reach * alpha;
        Self {
            expected: self.expected + reach,
            reach,
            drafted: self.drafted + 1,
        }
    }

    /// Whether one more draft with acceptance `alpha` raises `E[τ] / cost(K)`, `cost(K)` being a
    /// step with `K` drafts in units of a plain decoding step (a non-finite or non-positive cost
    /// never pays).
    pub fn worth_extending(&self, alpha: f64, cost: impl Fn(usize) -> f64) -> bool {
        self.worth_proposing(alpha, cost, 0.0)
    }

    /// [`ChainOutlook::worth_extending`] for a draft whose row has been computed already, at
    /// `row_cost` in the units of `cost`: the row is paid for whether or not its token is
    /// proposed, so the chain without it costs `cost(K) + row_cost`, and proposing it adds only
    /// the rest of `cost(K + 1)` (the verification's extra width).
    pub fn worth_proposing(&self, alpha: f64, cost: impl Fn(usize) -> f64, row_cost: f64) -> bool {
        let next = self.extended(alpha);
        let row_cost = if row_cost.is_finite() {
            row_cost.max(0.0)
        } else {
            0.0
        };
        let (now, then) = (cost(self.drafted) + row_cost, cost(next.drafted));
        if !(then.is_finite() && then > 0.0) {
            return false;
        }
        if !(now.is_finite() && now > 0.0) {
            return true;
        }
        next.expected / then > self.expected / now + 1e-12
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::length::expected_tokens;

    #[test]
    fn alpha_counts_only_tested_drafts() {
        let mut rate = AcceptanceRate::default();
        assert_eq!(rate.alpha(), 0.5);
        for _ in 0..200 {
            // Two accepted, the third rejected, the fourth never tested: α = 2/3, not 2/4.
            rate.record_chain(4, 2);
        }
        // The prior (1 of 2) still weighs against ~30 decayed trials: within 0.02.
        assert!((rate.alpha() - 2.0 / 3.0).abs() < 0.02, "{}", rate.alpha());
        for _ in 0..200 {
            rate.record_chain(4, 4);
        }
        assert!(rate.alpha() > 0.97);
        for _ in 0..100 {
            rate.record_trial(false);
        }
        // Decayed counts sum to ~10 trials, so the prior floors α at ~1/12.
        assert!(rate.alpha() < 0.09, "{}", rate.alpha());
        let mut slow = AcceptanceRate::with_decay(0.95);
        for _ in 0..200 {
            slow.record_trial(false);
        }
        assert!(slow.alpha() < 0.05, "{}", slow.alpha());
        // A record without drafts changes nothing.
        let before = rate.alpha();
        rate.record_chain(0, 0);
        assert_eq!(rate.alpha(), before);
    }

    /// `E[τ]` averaged over the Beta belief the counts give: exact after one chain, the Beta
    /// density integrated numerically for decayed (non-integer) counts, above `E[τ]` at the
    /// mean `α`, and equal to it once the counts leave no doubt.
    #[test]
    fn expected_tokens_average_over_what_the_counts_leave_unsure() {
        // One chain of 4 accepted with the prior of 1 in 2: Beta(5, 1), E[α^i] = 5 / (5 + i).
        let mut rate = AcceptanceRate::default();
        rate.record_chain(4, 4);
        let exact: f64 = (0..=8).map(|i| 5.0 / (5.0 + i as f64)).sum();
        assert!((rate.expected_tokens(8) - exact).abs() < 1e-12);
        assert!((exact - 5.484).abs() < 1e-3);
        assert!((expected_tokens(rate.alpha(), 8) - 4.837).abs() < 1e-3);

        let mut rate = AcceptanceRate::default();
        for (drafted, accepted) in [(4, 2), (6, 6), (3, 0), (8, 7), (5, 5)] {
            rate.record_chain(drafted, accepted);
        }
        let successes = rate.accepted + rate.prior.0;
        let failures = rate.trials + rate.prior.1 - successes;
        assert!(successes.fract() != 0.0 && failures > 1.0);
        // Midpoint rule over the unnormalized Beta(successes, failures) density.
        let points = 200_000;
        let moments = |i: i32| {
            let (mut weight, mut moment) = (0.0, 0.0);
            for j in 0..points {
                let a = (j as f64 + 0.5) / points as f64;
                let density = a.powf(successes - 1.0) * (1.0 - a).powf(failures - 1.0);
                weight += density;
                moment += density * a.powi(i);
            }
            moment / weight
        };
        for k in [1, 3, 8] {
            let integrated: f64 = (0..=k).map(|i| moments(i as i32)).sum();
            let closed = rate.expected_tokens(k);
            assert!(
                (closed - integrated).abs() < 1e-6,
                "{k}: {closed} {integrated}"
            );
            // One draft's expectation is the mean rate's; beyond, Jensen's gap.
            let at_mean = expected_tokens(rate.alpha(), k);
            if k == 1 {
                assert!((closed - at_mean).abs() < 1e-12);
            } else {
                assert!(closed > at_mean + 1e-3, "{k}: {closed} {at_mean}");
            }
        }
        assert_eq!(rate.expected_tokens(0), 1.0);

        // Many undecayed trials: the belief narrows to α, and so does the average.
        let mut sure = AcceptanceRate::with_decay(1.0);
        for _ in 0..5000 {
            sure.record_chain(8, 7);
        }
        let gap = sure.expected_tokens(8) - expected_tokens(sure.alpha(), 8);
        assert!((0.0..0.005).contains(&gap), "{gap}");
        // A prior of certainty: every draft expected to be accepted.
        assert_eq!(
            AcceptanceRate::with_prior(0.9, 1.0, 2.0).expected_tokens(5),
            6.0
        );
        assert_eq!(
            AcceptanceRate::with_prior(0.9, 0.0, 2.0).expected_tokens(5),
            1.0
        );
    }

    #[test]
    fn a_prior_sets_the_starting_rate_and_fades() {
        let mut rate = AcceptanceRate::with_prior(0.9, 0.2, 4.0);
        assert!((rate.alpha() - 0.2).abs() < 1e-12);
        for _ in 0..200 {
            rate.record_trial(true);
        }
        // ~10 decayed successes against a prior worth 4 trials at 0.2.
        assert!(rate.alpha() > 0.75, "{}", rate.alpha());
        assert!((AcceptanceRate::with_prior(0.9, f64::NAN, -1.0).alpha() - 0.5).abs() < 1e-12);
    }

    #[test]
    fn confidence_buckets_learn_apart() {
        let mut by = AcceptanceByConfidence::new(4, 0.95);
        // Calibrated start: the midpoints.
        assert!((by.alpha(0.1) - 0.125).abs() < 1e-12);
        assert!((by.alpha(0.9) - 0.875).abs() < 1e-12);
        assert_eq!(by.bucket(1.0), 3);
        assert_eq!(by.bucket(-3.0), 0);
        assert_eq!(by.bucket(f64::NAN), 0);
        assert_eq!(by.bucket(0.25), 1);
        // Confident drafts that fail and unsure ones that succeed: each bucket follows its own.
        for _ in 0..100 {
            by.record(0.95, false);
            by.record(0.05, true);
        }
        assert!(by.alpha(0.9) < 0.1, "{}", by.alpha(0.9));
        assert!(by.alpha(0.1) > 0.9, "{}", by.alpha(0.1));
        assert!((by.alpha(0.4) - 0.375).abs() < 1e-12);
        assert_eq!(by.rates().len(), 4);

        // A chain of three drafts, the second rejected: the third was never tested.
        let mut chain = AcceptanceByConfidence::new(4, 0.95);
        chain.record_chain(&[0.1, 0.4, 0.9], 1);
        let mut expected = AcceptanceByConfidence::new(4, 0.95);
        expected.record(0.1, true);
        expected.record(0.4, false);
        for at in [0.1, 0.4, 0.9] {
            assert!((chain.alpha(at) - expected.alpha(at)).abs() < 1e-12, "{at}");
        }
        assert!(chain.alpha(0.1) > 0.125 && chain.alpha(0.4) < 0.375);
        assert!((chain.alpha(0.9) - 0.875).abs() < 1e-12);
    }

    /// A chain of two proposed drafts (confidences 0.9 and 0.6) after a context of 5 tokens
    /// stopped before token 7 (confidence 0.3): the stopped row is a trial only when both
    /// proposed drafts were accepted, and then it passes iff the step's next token is 7.
    #[test]
    fn a_stopped_row_is_a_trial_only_after_every_proposed_draft_is_accepted() {
        let mut trials = ChainTrials::new(5);
        trials.propose(0.9);
        trials.propose(0.6);
        assert!(!trials.stopped());
        trials.stop_before(7, 0.3);
        assert!(trials.stopped());
        assert_eq!(trials.proposed(), 2);
        let fresh = || AcceptanceByConfidence::new(10, 0.95);
        // Whether `trials.record(accepted, context)` leaves the rates that recording the chain
        // with `accepted`, then the stopped row's trial `trial` (if any), directly leaves.
        let records_as = |accepted: usize, context: &[u32], trial: Option<bool>| {
            let mut recorded = fresh();
            trials.record(accepted, context, &mut recorded);
            let mut expected = fresh();
            expected.record_chain(&[0.9, 0.6], accepted.min(2));
            if let Some(passed) = trial {
                expected.record(0.3, passed);
            }
            (0..10).all(|i| {
                let at = (i as f64 + 0.5) / 10.0;
                (recorded.alpha(at) - expected.alpha(at)).abs() < 1e-12
            })
        };
        // Context after the step: 5 tokens, the two accepted drafts, then the step's own token.
        let after = |next: u32| [0, 0, 0, 0, 0, 11, 12, next];
        assert!(records_as(2, &after(7), Some(true)));
        assert!(records_as(2, &after(8), Some(false)));
        // The trial counts: recording the chain alone is not what happens.
        assert!(!records_as(2, &after(7), None));
        // The second draft rejected: the stopped row was never reached, so only the chain counts.
        assert!(records_as(1, &after(7), None));
        // A context that ends before the stopped row's place, and an accepted count beyond the
        // chain (clamped), record the chain alone.
        assert!(records_as(9, &after(7)[..7], None));

        // A plain step whose only row was declined: the row against the step's token.
        let mut plain = ChainTrials::new(3);
        plain.stop_before(4, 0.75);
        let mut by = fresh();
        plain.record(0, &[1, 2, 3, 4], &mut by);
        assert!(by.alpha(0.75) > fresh().alpha(0.75));
    }

    #[test]
    fn a_chain_outlook_sums_per_position_rates() {
        let chain = ChainOutlook::new()
            .extended(0.5)
            .extended(0.4)
            .extended(1.5);
        // 1 + 0.5 + 0.5·0.4 + 0.5·0.4·1 (the last rate clamped to 1).
        assert!((chain.expected_tokens() - 1.9).abs() < 1e-12);
        assert_eq!(chain.drafted(), 3);
        // Equal rates agree with the closed form.
        let mut same = ChainOutlook::new();
        for _ in 0..5 {
            same = same.extended(0.7);
        }
        assert!((same.expected_tokens() - expected_tokens(0.7, 5)).abs() < 1e-12);
        // Verification of w tokens costs 1 + 0.1 (w − 1): a first draft pays iff α > 0.1.
        let cost = |k: usize| 1.0 + 0.1 * k as f64;
        assert!(!ChainOutlook::new().worth_extending(0.05, cost));
        assert!(ChainOutlook::new().worth_extending(0.15, cost));
        // Deeper in a chain the bar rises with what is already expected.
        let deep = ChainOutlook::new().extended(0.9).extended(0.9);
        assert!(!deep.worth_extending(0.15, cost));
        assert!(deep.worth_extending(0.9, cost));
        // A cost that rules the next length out stops the chain; a bad current cost does not.
        assert!(!ChainOutlook::new().worth_extending(0.9, |k| if k == 1 { f64::NAN } else { 1.0 }));
        assert!(ChainOutlook::new().worth_extending(0.9, |k| if k == 0 { 0.0 } else { 1.0 }));
        // A computed row is paid either way. At cost(K) = 1 + 0.13·K (a row 0.1, a token of
        // width 0.03), a draft at α 0.05 does not pay as one more row (1.05 for 1.13 against 1
        // for 1) but pays once its row is spent (1.05 for 1.13 against 1 for 1.1); one at α 0.02
        // (1.02 for 1.13) still does not. A row cost that is not a number counts as none.
        let rows = |k: usize| 1.0 + 0.13 * k as f64;
        assert!(!ChainOutlook::new().worth_extending(0.05, rows));
        assert!(ChainOutlook::new().worth_proposing(0.05, rows, 0.1));
        assert!(!ChainOutlook::new().worth_proposing(0.02, rows, 0.1));
        assert!(!ChainOutlook::new().worth_proposing(0.05, rows, f64::NAN));
    }
}
