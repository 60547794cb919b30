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
    /// `E[τ](α, k)` is convex in `α`, so [`expected_tokens`] at the mean `α` understates this
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

/// A moving average of a measured time after one more measurement `new` (`old` is `None`
/// before the first, which is taken as it is), with `weight` the share of a new measurement.
///
/// The noise of a time on a shared machine is one-sided: a kernel compiled for a shape met for
/// the first time (wgpu, cuda), a page fault, another process, each only add time. So a
/// measurement over twice the average counts as twice the average (an average moves by at most
/// `weight` of itself a measurement), and one under half of it replaces the average, which was
/// then itself such a stall (typically the first measurement, on a GPU) or the machine has become
/// that much faster. A policy that reads its costs from these averages (`auto`'s draft length, a
/// drafter's time per token) thus recovers from one stall at the next measurement instead of
/// deciding from it for hundreds of steps. A `new` that is not a finite number ≥ 0 leaves `old`.
pub fn average_time(old: Option<f64>, new: f64, weight: f64) -> Option<f64> {
    if !(new.is_finite() && new >= 0.0) {
        return old;
    }
    Some(match old {
        None => new,
        Some(old) if new < old / 2.0 => new,
        Some(old) => old + weight * (new.min(old * 2.0) - old),
    })
}

/// Moving averages of verification step times by width (tokens scored), giving the relative cost
/// `r(w) = t(w) / t(1)` of a step that scores `w` tokens.
///
/// `r` is modelled as `1 + s·(w − 1)`: the slope `s` pools every measured width (each width's
/// `(r(w) − 1)/(w − 1)`, weighted by `w − 1`), so one noisy average cannot lock a width out, and
/// the model stays monotone. Before a one-token step has been measured, `t(1)` and `s` come
/// from the line fitted through the measured widths' averages, once they are
/// [`WidthCosts::FIT_SPAN`] or more apart ([`WidthCosts::fitted_line`]); until then `s` is
/// [`WidthCosts::PRIOR_SLOPE`]. A drafter that always drafts makes no one-token step for
/// [`WidthCosts::REFRESH`] steps, which a short generation never reaches: with the prior alone
/// such a run priced every step by a slope measured on another machine (the 1.5B target on a
/// Zen 5: 0.1 against about 0.03, `t(1)` 25-35% low).
///
/// A drafter that stops making one-token steps would compare new wide steps with a stale
/// one-token time (the machine's speed drifts), and a one-token time measured on a slow moment
/// would make every width look free, so that nothing refreshes it: [`WidthCosts::wants_one_token_step`]
/// asks for a plain step every [`WidthCosts::REFRESH`] steps, and each width's average is an
/// [`average_time`], which a stall moves by at most 2× a measurement and the next ordinary
/// measurement after a stalled first one replaces.
///
/// The first step of each width above 1 is not averaged: it pays for what a shape met for the
/// first time costs (on wgpu and cuda, compiling its kernels: on an H200 `auto`'s first 5-token
/// verification priced the slope at 51, so that no draft length could pay, and a width priced
/// that high is never run again to correct it). A first one-token step is averaged: priced too
/// high, it makes drafting look cheaper, which the one-token steps asked for every
/// [`WidthCosts::REFRESH`] steps correct.
#[derive(Debug, Clone, Default)]
pub struct WidthCosts {
    /// `seconds[w - 1]`: the moving average of steps of width `w`.
    seconds: Vec<Option<f64>>,
    /// `met[w - 1]`: whether a step of width `w` has been seen (its first, not averaged).
    met: Vec<bool>,
    /// Steps recorded since the last one-token step (or since the start).
    since_one: usize,
}

impl WidthCosts {
    /// The weight of a new measurement in a width's moving average.
    const WEIGHT: f64 = 0.2;
    /// The slope assumed before it is measured: a verification of 8 tokens at 1.7× a decode step,
    /// about what `spec bench-forward` measures for the reference models on a 2-core CPU.
    pub const PRIOR_SLOPE: f64 = 0.1;
    /// Widths above this share its bucket (the model is linear anyway).
    const MAX_WIDTH: usize = 64;
    /// Steps after which [`WidthCosts::wants_one_token_step`] asks for a one-token step.
    pub const REFRESH: usize = 32;
    /// How far apart (in tokens) the narrowest and the widest measured width must lie for
    /// [`WidthCosts::fitted_line`]: nearer widths leave the slope to the steps' noise.
    pub const FIT_SPAN: usize = 2;

    /// Records one step of `width ≥ 1` tokens that took `seconds`.
    pub fn record(&mut self, width: usize, seconds: f64) {
        if width == 0 || !seconds.is_finite() || seconds <= 0.0 {
            return;
        }
        let w = width.min(Self::MAX_WIDTH);
        if self.seconds.len() < w {
            self.seconds.resize(w, None);
            self.met.resize(w, false);
        }
        self.since_one = if w == 1 { 0 } else { self.since_one + 1 };
        if w > 1 && !std::mem::replace(&mut self.met[w - 1], true) {
            return;
        }
        let slot = &mut self.seconds[w - 1];
        *slot = average_time(*slot, seconds, Self::WEIGHT);
    }

    /// Whether the next step should score one token only, because none did in the last
    /// [`WidthCosts::REFRESH`] steps: the one-token time is every ratio's denominator.
    pub fn wants_one_token_step(&self) -> bool {
        self.since_one >= Self::REFRESH
    }

    /// The average time of a width-`w` step, if measured.
    pub fn seconds(&self, width: usize) -> Option<f64> {
        let w = width.clamp(1, Self::MAX_WIDTH);
        self.seconds.get(w - 1).copied().flatten()
    }

    /// The slope `s` of `r(w) = 1 + s·(w − 1)`.
    pub fn slope(&self) -> f64 {
        let Some(one) = self.seconds(1) else {
            return self
                .fitted_line()
                .map_or(Self::PRIOR_SLOPE, |(_, slope)| slope);
        };
        let (mut sum, mut weight) = (0.0, 0.0);
        for (i, t) in self.seconds.iter().enumerate().skip(1) {
            if let Some(t) = t {
                // Σ (r(w) − 1) / Σ (w − 1): each width's slope weighted by w − 1.
                sum += t / one - 1.0;
                weight += i as f64;
            }
        }
        if weight == 0.0 {
            Self::PRIOR_SLOPE
        } else {
            (sum / weight).max(0.0)
        }
    }

    /// `r(w)`: a step of `width` tokens in units of a one-token step.
    pub fn relative(&self, width: usize) -> f64 {
        1.0 + self.slope() * width.saturating_sub(1) as f64
    }

    /// The time of a one-token step: measured, or until then the fitted line's
    /// ([`WidthCosts::fitted_line`]), or else the narrowest measured width's time divided by its
    /// `r(w)` (a drafter that always drafts sees only wide steps at first).
    pub fn one_token_seconds(&self) -> Option<f64> {
        if self.seconds(1).is_none()
            && let Some((one, _)) = self.fitted_line()
        {
            return Some(one);
        }
        self.seconds
            .iter()
            .enumerate()
            .find_map(|(i, t)| t.map(|t| t / self.relative(i + 1)))
    }

    /// `(t(1), s)` of the least-squares line `t(w) = t(1)·(1 + s·(w − 1))` through the measured
    /// widths' averages, each width one point; `None` with fewer than two widths, with widths
    /// less than [`WidthCosts::FIT_SPAN`] apart, or where the line does not meet width 1 at a
    /// positive time (a steep line through noisy points). A falling line (a wide step measured
    /// faster than a narrower one, as a GPU can be) is taken as flat, through the mean time.
    pub fn fitted_line(&self) -> Option<(f64, f64)> {
        let points: Vec<(f64, f64)> = self
            .seconds
            .iter()
            .enumerate()
            .filter_map(|(i, t)| t.map(|t| ((i + 1) as f64, t)))
            .collect();
        let (first, last) = (points.first()?.0, points.last()?.0);
        if points.len() < 2 || last - first < Self::FIT_SPAN as f64 {
            return None;
        }
        let n = points.len() as f64;
        let mean_width = points.iter().map(|p| p.0).sum::<f64>() / n;
        let mean_time = points.iter().map(|p| p.1).sum::<f64>() / n;
        let (mut spread, mut covariance) = (0.0, 0.0);
        for &(w, t) in &points {
            spread += (w - mean_width) * (w - mean_width);
            covariance += (w - mean_width) * (t - mean_time);
        }
        let per_token = (covariance / spread).max(0.0);
        let one = mean_time - per_token * (mean_width - 1.0);
        (one.is_finite() && one > 0.0).then_some((one, per_token / one))
    }
}

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

    #[test]
    fn width_costs_fit_a_slope() {
        let mut costs = WidthCosts::default();
        assert_eq!(costs.slope(), WidthCosts::PRIOR_SLOPE);
        assert!((costs.relative(5) - (1.0 + 4.0 * WidthCosts::PRIOR_SLOPE)).abs() < 1e-12);
        // Only wide steps measured: still the prior.
        costs.record(4, 0.03);
        costs.record(4, 0.03);
        assert_eq!(costs.slope(), WidthCosts::PRIOR_SLOPE);
        // t(1) = 10 ms, t(4) = 13 ms, t(3) = 12 ms: r = 1 + 0.1 (w − 1) for both.
        costs.record(1, 0.010);
        costs.record(4, 0.013);
        costs.record(4, 0.013);
        for _ in 0..100 {
            costs.record(4, 0.013);
        }
        // A width's first step is not averaged (a shape's first compile on a GPU).
        costs.record(3, 5.0);
        assert_eq!(costs.seconds(3), None);
        costs.record(3, 0.012);
        assert!((costs.slope() - 0.1).abs() < 1e-6, "{}", costs.slope());
        assert!((costs.relative(1) - 1.0).abs() < 1e-12);
        assert!((costs.relative(9) - 1.8).abs() < 1e-5);
        // A wider step measured faster than one token does not make the slope negative.
        let mut odd = WidthCosts::default();
        odd.record(1, 0.02);
        odd.record(2, 0.01);
        odd.record(2, 0.01);
        assert_eq!(odd.slope(), 0.0);
        // Garbage is ignored.
        odd.record(0, 1.0);
        odd.record(3, f64::NAN);
        odd.record(3, -1.0);
        assert_eq!(odd.seconds(3), None);
    }

    #[test]
    fn width_costs_fit_a_line_until_a_one_token_step_is_measured() {
        let close = |a: f64, b: f64| (a - b).abs() < 1e-9;
        // t(w) = 130 ms · (1 + 0.03 (w − 1)); each width's first step is not averaged.
        let time = |w: usize| 0.13 * (1.0 + 0.03 * (w - 1) as f64);
        let mut costs = WidthCosts::default();
        for w in [4, 4, 5, 5] {
            costs.record(w, time(w));
        }
        // Widths 4 and 5, less than FIT_SPAN apart: the prior through the narrowest.
        assert_eq!(costs.fitted_line(), None);
        assert_eq!(costs.slope(), WidthCosts::PRIOR_SLOPE);
        let prior_one = time(4) / (1.0 + 3.0 * WidthCosts::PRIOR_SLOPE);
        assert!(close(costs.one_token_seconds().unwrap_or(0.0), prior_one));
        // Widths 4, 5 and 7: the line, without a one-token step.
        costs.record(7, time(7));
        costs.record(7, time(7));
        let (one, slope) = costs.fitted_line().unwrap_or_default();
        assert!(close(one, 0.13) && close(slope, 0.03), "{one} {slope}");
        assert!(close(costs.slope(), 0.03));
        assert!(close(costs.one_token_seconds().unwrap_or(0.0), 0.13));
        assert!(close(costs.relative(9), 1.24));
        // A measured one-token step is the unit again (r(4) = 0.1339 / 0.12: s = 0.0383...).
        costs.record(1, 0.12);
        assert_eq!(costs.one_token_seconds(), Some(0.12));
        let pooled = (time(4) / 0.12 - 1.0 + time(5) / 0.12 - 1.0 + time(7) / 0.12 - 1.0) / 13.0;
        assert!(close(costs.slope(), pooled), "{}", costs.slope());

        // A wide step faster than a narrower one: flat, through the mean.
        let mut falling = WidthCosts::default();
        for (w, t) in [(3, 0.02), (3, 0.02), (6, 0.01), (6, 0.01)] {
            falling.record(w, t);
        }
        assert_eq!(falling.fitted_line(), Some((0.015, 0.0)));
        assert_eq!(falling.slope(), 0.0);
        // A line too steep to meet width 1 above zero: the prior.
        let mut steep = WidthCosts::default();
        for (w, t) in [(3, 0.01), (3, 0.01), (5, 0.1), (5, 0.1)] {
            steep.record(w, t);
        }
        assert_eq!(steep.fitted_line(), None);
        assert_eq!(steep.slope(), WidthCosts::PRIOR_SLOPE);
        assert!(close(steep.one_token_seconds().unwrap_or(0.0), 0.01 / 1.2));
    }

    #[test]
    fn a_time_average_is_moved_little_by_a_stall_and_replaced_after_one() {
        assert_eq!(average_time(None, 0.5, 0.2), Some(0.5));
        // Within 2× either way: an exponential moving average.
        assert!((average_time(Some(0.1), 0.15, 0.2).unwrap() - 0.11).abs() < 1e-12);
        assert!((average_time(Some(0.1), 0.06, 0.2).unwrap() - 0.092).abs() < 1e-12);
        // Over 2×: counts as 2×.
        assert!((average_time(Some(0.1), 5.0, 0.2).unwrap() - 0.12).abs() < 1e-12);
        // Under half: the average was a stall, or the machine got that much faster.
        assert_eq!(average_time(Some(1.0), 0.03, 0.2), Some(0.03));
        // Not a time: nothing changes.
        assert_eq!(average_time(Some(0.1), f64::NAN, 0.2), Some(0.1));
        assert_eq!(average_time(Some(0.1), -1.0, 0.2), Some(0.1));
        assert_eq!(average_time(None, f64::INFINITY, 0.2), None);
    }

    #[test]
    fn width_costs_clip_outliers_and_ask_for_fresh_one_token_steps() {
        let mut costs = WidthCosts::default();
        costs.record(1, 0.010);
        // A 50× stall counts as 2×: the average moves by 0.2 · 10 ms, not by 0.2 · 490 ms.
        costs.record(1, 0.5);
        assert!((costs.seconds(1).unwrap() - 0.012).abs() < 1e-12);
        // A first one-token step that stalled (50 × 10 ms) made every width look free; the
        // next one replaces it.
        let mut stalled = WidthCosts::default();
        stalled.record(1, 0.5);
        stalled.record(4, 0.013);
        stalled.record(4, 0.013);
        assert_eq!(stalled.slope(), 0.0);
        stalled.record(1, 0.010);
        assert!((stalled.slope() - 0.1).abs() < 1e-9, "{}", stalled.slope());
        // Wide steps only: after REFRESH of them, a one-token step is wanted, until one is made.
        for i in 0..WidthCosts::REFRESH {
            assert!(!costs.wants_one_token_step(), "{i}");
            costs.record(3, 0.013);
        }
        assert!(costs.wants_one_token_step());
        costs.record(1, 0.010);
        assert!(!costs.wants_one_token_step());
    }
}
