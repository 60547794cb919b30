//! Measured step times: a moving average robust to stalls, and verification cost by width.

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
