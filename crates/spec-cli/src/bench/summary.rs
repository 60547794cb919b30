//! Statistics over a run's records: the Spec-Bench metrics per method and category, the
//! analytic bound of draft-model methods ([`DraftBound`]), and the machine's drift.

use serde::Serialize;
use spec_core::metrics::{Metrics, PositionCounts};
use spec_sampling::{mean_expected_tokens, speedup_bound};

use super::records::{PlainPass, RunRecord};

/// Aggregates of one (target, method, category); `category` "all" covers every prompt.
#[derive(Debug, Clone, Serialize)]
pub(super) struct Summary {
    pub(super) target: String,
    pub(super) method: String,
    pub(super) category: String,
    pub(super) runs: usize,
    pub(super) new_tokens: u64,
    pub(super) tokens_per_second: f64,
    pub(super) speedup: Option<f64>,
    /// The same ratio of decode speeds (after the first step: prefill excluded).
    pub(super) decode_speedup: Option<f64>,
    pub(super) tau: Option<f64>,
    pub(super) alpha: Option<f64>,
    /// accepted ÷ (accepted + rejections): the α of the bound.
    pub(super) alpha_per_tested_draft: Option<f64>,
    pub(super) acceptance_by_position: Vec<f64>,
    /// Drafted tokens per step (a chain's mean K; a tree's mean nodes), where any were drafted.
    pub(super) mean_drafted: Option<f64>,
    /// The verification's time by width ÷ plain decoding's step on the same target and
    /// prompts, `(width, steps, ratio)`, for the widths this method's steps had.
    pub(super) cost_by_width: Vec<(usize, u64, f64)>,
    pub(super) mismatches: usize,
    pub(super) max_peak_rss_bytes: Option<u64>,
    /// Draft-model methods: the measured cost ratio and the analytic speedup bound.
    pub(super) draft_bound: Option<DraftBound>,
    /// Whether these are plain decoding's runs, the baseline (not in `report.json`).
    #[serde(skip)]
    pub(super) plain: bool,
}

/// A draft-model method's measured cost ratio `c` and the speedup `E[τ] / (K·c + 1)` the i.i.d.
/// acceptance model of Leviathan et al. (2023, Theorem 3.8) predicts from the measured α, K and
/// c, against the speedup achieved.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(super) struct DraftBound {
    /// α per tested draft, the model's per-token acceptance rate.
    pub(super) alpha: f64,
    /// K: the mean drafted tokens per step (a fixed K's last step in a generation may draft
    /// fewer, only the tokens left).
    pub(super) k: f64,
    /// Mean seconds of one draft-model step: its forward and the sampling of its token.
    pub(super) draft_forward_seconds: f64,
    /// Mean seconds of one plain decode step (target forward and sampling) of the same target
    /// over the same prompts in the same run.
    pub(super) plain_step_seconds: f64,
    /// c = `draft_forward_seconds` ÷ `plain_step_seconds`.
    pub(super) cost_ratio: f64,
    /// `E[τ] = (1 − α^{K+1}) / (1 − α)` from `alpha`, averaged over the steps at each step's
    /// own K (`spec_core::length::mean_expected_tokens`).
    pub(super) expected_tau: f64,
    /// `E[τ] ÷ (K·c + 1)`: Theorem 3.8 summed over the steps (`spec_core::length::speedup_bound`).
    pub(super) speedup_bound: f64,
    /// The summary's speedup ÷ `speedup_bound` (null without a plain baseline).
    pub(super) achieved_over_bound: Option<f64>,
    /// Decode speed pooled over the row's runs, Σ decode tokens ÷ Σ decode seconds, ÷ the same
    /// of the plain runs. The bound pools α, c and v over every step of every prompt, so this
    /// is the speedup it predicts; the summary's `decode_speedup` (Spec-Bench's mean of
    /// per-prompt speeds) weighs a prompt whose drafts were accepted more by its higher speed.
    pub(super) pooled_decode_speedup: Option<f64>,
    /// `pooled_decode_speedup ÷ speedup_bound`: like the bound, without the prefill.
    pub(super) decode_over_bound: Option<f64>,
    /// The steps' measured τ (produced ÷ steps) ÷ `expected_tau`: below 1 where the i.i.d.
    /// model's steps would yield more than these did (rejections that cluster, where some
    /// passages are easy for the draft and some are not, leave more steps with every draft
    /// accepted and more with none than independent ones, and fewer tokens a step at one α).
    pub(super) tau_over_expected: f64,
    /// v = mean time of one verification step (the target's forward over the K + 1 positions,
    /// verification and cache rollback) ÷ `plain_step_seconds`; the bound takes it as 1.
    pub(super) verify_ratio: f64,
    /// `E[τ] ÷ (K·c + v)`: the bound with the verification's measured cost.
    pub(super) bound_with_verify: f64,
}

/// Per (target, method) and category, then "all".
pub(super) fn summarize(runs: &[RunRecord], categories: &[String]) -> Vec<Summary> {
    let mut keys: Vec<(String, String)> = Vec::new();
    for r in runs {
        let key = (r.target.clone(), r.method.clone());
        if !keys.contains(&key) {
            keys.push(key);
        }
    }
    let mut out = Vec::new();
    for (target, method) in &keys {
        let plain_label = runs
            .iter()
            .find(|r| r.target == *target && r.plain_pass.is_some())
            .map(|r| r.method.clone());
        for category in categories
            .iter()
            .map(String::as_str)
            .chain(std::iter::once("all"))
        {
            let in_cat = |r: &&RunRecord| category == "all" || r.category == category;
            let mine: Vec<&RunRecord> = runs
                .iter()
                .filter(|r| r.target == *target && r.method == *method)
                .filter(in_cat)
                .collect();
            if mine.is_empty() {
                continue;
            }
            let tps = mean(mine.iter().map(|r| r.tokens_per_second));
            let plain: Option<Vec<&RunRecord>> = plain_label.as_ref().map(|label| {
                runs.iter()
                    .filter(|r| r.target == *target && r.method == *label)
                    .filter(in_cat)
                    .collect()
            });
            // A per-prompt speed's mean ÷ plain decoding's (None without a plain baseline).
            let ratio_to_plain = |speed: fn(&RunRecord) -> f64| {
                let plain_mean = mean(plain.as_ref()?.iter().map(|r| speed(r)));
                (plain_mean > 0.0).then(|| mean(mine.iter().map(|r| speed(r))) / plain_mean)
            };
            let speedup = ratio_to_plain(|r| r.tokens_per_second);
            let decode_speedup = ratio_to_plain(|r| r.decode_tokens_per_second);
            let sum = |f: fn(&RunRecord) -> u64| mine.iter().map(|r| f(r)).sum::<u64>();
            // The runs' summed counters; α, α per tested draft and τ come from `spec_core`.
            let depth = mine
                .iter()
                .map(|r| r.drafted_by_position.len())
                .max()
                .unwrap_or(0);
            let at = |counts: &[u64], i: usize| counts.get(i).copied().unwrap_or(0);
            let counts = Metrics {
                steps: sum(|r| r.steps),
                target_forwards: sum(|r| r.target_forwards),
                draft_forwards: sum(|r| r.draft_forwards),
                drafted: sum(|r| r.drafted),
                accepted: sum(|r| r.accepted),
                rejections: sum(|r| r.rejections),
                produced: sum(|r| r.produced),
                by_position: (0..depth)
                    .map(|i| PositionCounts {
                        drafted: mine.iter().map(|r| at(&r.drafted_by_position, i)).sum(),
                        accepted: mine.iter().map(|r| at(&r.accepted_by_position, i)).sum(),
                    })
                    .collect(),
            };
            let acceptance_by_position = counts.acceptance_by_position();
            let alpha_per_tested_draft = counts.alpha_per_tested_draft();
            let draft_bound = plain
                .as_deref()
                .and_then(|plain| draft_bound(&mine, plain, &counts, speedup));
            let cost_by_width = plain
                .as_deref()
                .map(|plain| cost_by_width(&mine, plain))
                .unwrap_or_default();
            out.push(Summary {
                target: target.clone(),
                method: method.clone(),
                category: category.to_owned(),
                runs: mine.len(),
                new_tokens: mine.iter().map(|r| r.new_tokens as u64).sum(),
                tokens_per_second: tps,
                speedup,
                decode_speedup,
                tau: counts.tau(),
                alpha: counts.alpha(),
                alpha_per_tested_draft,
                acceptance_by_position,
                mean_drafted: (counts.drafted > 0 && counts.steps > 0)
                    .then(|| counts.drafted as f64 / counts.steps as f64),
                cost_by_width,
                mismatches: mine
                    .iter()
                    .filter(|r| r.matches_plain == Some(false))
                    .count(),
                max_peak_rss_bytes: mine.iter().filter_map(|r| r.peak_rss_bytes).max(),
                draft_bound,
                plain: mine.iter().all(|r| r.plain_pass.is_some()),
            });
        }
    }
    out
}

/// Each verification width of `mine`'s steps with how many steps had it and their mean time ÷
/// the mean time of `plain`'s decode steps (the same target and prompts); empty without plain
/// steps.
pub(super) fn cost_by_width(mine: &[&RunRecord], plain: &[&RunRecord]) -> Vec<(usize, u64, f64)> {
    let plain_steps: u64 = plain.iter().map(|r| r.steps).sum();
    let plain_seconds: f64 = plain.iter().map(|r| r.step_seconds).sum();
    if plain_steps == 0 || plain_seconds <= 0.0 {
        return Vec::new();
    }
    let plain_step = plain_seconds / plain_steps as f64;
    let mut by_width: Vec<(usize, u64, f64)> = Vec::new();
    for w in mine.iter().flat_map(|r| &r.steps_by_width) {
        match by_width.iter_mut().find(|(width, _, _)| *width == w.width) {
            Some((_, steps, seconds)) => {
                *steps += w.steps;
                *seconds += w.seconds;
            }
            None => by_width.push((w.width, w.steps, w.seconds)),
        }
    }
    by_width.sort_by_key(|&(width, _, _)| width);
    by_width
        .into_iter()
        .map(|(width, steps, seconds)| (width, steps, seconds / steps as f64 / plain_step))
        .collect()
}

/// The [`DraftBound`] of a draft-model method's runs `mine` (one method, one target), with
/// `plain` the plain runs of the same target and prompts, `counts` the counters summed over
/// `mine` (α per tested draft, steps, draft forwards, the steps by draft length) and `speedup`
/// the summary's. `None` for methods without a draft model, or when something it needs was not
/// measured (nothing drafted, no plain steps).
pub(super) fn draft_bound(
    mine: &[&RunRecord],
    plain: &[&RunRecord],
    counts: &Metrics,
    speedup: Option<f64>,
) -> Option<DraftBound> {
    // Only the runs of a method with a draft model have a bound, and only chains: the bound's
    // model is a chain's (a tree drafts more nodes than its depth).
    mine.first()?.draft_model.as_ref()?;
    let depths: u64 = counts
        .steps_by_depth()
        .iter()
        .enumerate()
        .map(|(k, &n)| k as u64 * n)
        .sum();
    if counts.drafted > depths {
        return None;
    }
    let alpha = counts.alpha_per_tested_draft()?;
    let total =
        |runs: &[&RunRecord], f: fn(&RunRecord) -> f64| runs.iter().map(|r| f(r)).sum::<f64>();
    let count =
        |runs: &[&RunRecord], f: fn(&RunRecord) -> u64| runs.iter().map(|r| f(r)).sum::<u64>();
    let (draft_forwards, steps) = (counts.draft_forwards, counts.steps);
    let plain_steps = count(plain, |r| r.steps);
    if draft_forwards == 0 || steps == 0 || plain_steps == 0 {
        return None;
    }
    let draft_forward_seconds = total(mine, |r| r.draft_forward_seconds) / draft_forwards as f64;
    let plain_step_seconds = total(plain, |r| r.step_seconds) / plain_steps as f64;
    if plain_step_seconds <= 0.0 {
        return None;
    }
    // The mean drafted per step: a fixed K's last step of a generation drafts only the tokens
    // left, and `auto` varies.
    let k = counts.drafted as f64 / steps as f64;
    let cost_ratio = draft_forward_seconds / plain_step_seconds;
    let steps_by_length = counts.steps_by_depth();
    let speedup_bound = speedup_bound(alpha, cost_ratio, &steps_by_length)?;
    let expected_tau = mean_expected_tokens(alpha, &steps_by_length)?;
    let verify_ratio = total(mine, |r| r.step_seconds) / steps as f64 / plain_step_seconds;
    let pooled_decode_speed = |runs: &[&RunRecord]| {
        let seconds = total(runs, |r| r.wall_seconds - r.prompt_seconds);
        (seconds > 0.0).then(|| count(runs, |r| r.decode_tokens as u64) as f64 / seconds)
    };
    let pooled_decode_speedup = pooled_decode_speed(mine)
        .zip(pooled_decode_speed(plain).filter(|&s| s > 0.0))
        .map(|(mine, plain)| mine / plain);
    Some(DraftBound {
        alpha,
        k,
        draft_forward_seconds,
        plain_step_seconds,
        cost_ratio,
        expected_tau,
        speedup_bound,
        achieved_over_bound: speedup.map(|s| s / speedup_bound),
        pooled_decode_speedup,
        decode_over_bound: pooled_decode_speedup.map(|s| s / speedup_bound),
        tau_over_expected: counts.tau()? / expected_tau,
        verify_ratio,
        bound_with_verify: expected_tau / (k * cost_ratio + verify_ratio),
    })
}

/// Plain decoding's speed on one target before a prompt's other methods and after them: how
/// far the machine drifted over those runs.
#[derive(Debug, PartialEq)]
pub(super) struct PlainDrift {
    pub(super) target: String,
    /// Mean (tok/s, decode tok/s) of the runs before the methods.
    pub(super) before: (f64, f64),
    /// The same of the runs after them.
    pub(super) after: (f64, f64),
}

/// [`PlainDrift`] of each target whose plain runs were bracketed (none with `--plain-once`).
pub(super) fn plain_drift(runs: &[RunRecord]) -> Vec<PlainDrift> {
    let mut targets: Vec<&str> = Vec::new();
    for r in runs
        .iter()
        .filter(|r| r.plain_pass == Some(PlainPass::After))
    {
        if !targets.contains(&r.target.as_str()) {
            targets.push(&r.target);
        }
    }
    let speeds = |target: &str, pass: PlainPass| {
        let of = |speed: fn(&RunRecord) -> f64| {
            mean(
                runs.iter()
                    .filter(|r| r.target == target && r.plain_pass == Some(pass))
                    .map(speed),
            )
        };
        (
            of(|r| r.tokens_per_second),
            of(|r| r.decode_tokens_per_second),
        )
    };
    targets
        .into_iter()
        .map(|target| PlainDrift {
            target: target.to_owned(),
            before: speeds(target, PlainPass::Before),
            after: speeds(target, PlainPass::After),
        })
        .collect()
}

/// The least, median and greatest of the runs' [`RunRecord::core_round_trip_ns`]; `None`
/// where none was measured.
pub(super) fn round_trip_spread(runs: &[RunRecord]) -> Option<(f64, f64, f64)> {
    let mut all: Vec<f64> = runs
        .iter()
        .flat_map(|r| r.core_round_trip_ns.iter().flatten().copied())
        .collect();
    all.sort_by(f64::total_cmp);
    Some((*all.first()?, all[all.len() / 2], *all.last()?))
}

pub(super) fn mean(values: impl Iterator<Item = f64>) -> f64 {
    let (sum, n) = values.fold((0.0, 0usize), |(s, n), v| (s + v, n + 1));
    if n == 0 { 0.0 } else { sum / n as f64 }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::fixtures::{bound_runs, record};

    #[test]
    fn summaries_follow_the_spec_bench_definitions() {
        let runs = vec![
            record("plain", "a", 10.0, &[], &[]),
            record("plain", "a", 20.0, &[], &[]),
            record("plain", "b", 8.0, &[], &[]),
            record("pl", "a", 30.0, &[4, 2], &[3, 1]),
            record("pl", "a", 15.0, &[2], &[0]),
            record("pl", "b", 4.0, &[1], &[1]),
        ];
        let cats = vec!["a".to_owned(), "b".to_owned()];
        let s = summarize(&runs, &cats);
        let get = |m: &str, c: &str| s.iter().find(|x| x.method == m && x.category == c).unwrap();
        let a = get("pl", "a");
        assert!((a.tokens_per_second - 22.5).abs() < 1e-9);
        assert!((a.speedup.unwrap() - 22.5 / 15.0).abs() < 1e-9);
        // τ = 20 produced / (6 + 10) forwards; α = 4 / 8.
        assert!((a.tau.unwrap() - 20.0 / 16.0).abs() < 1e-9);
        assert!((a.alpha.unwrap() - 0.5).abs() < 1e-9);
        assert_eq!(a.acceptance_by_position, vec![3.0 / 6.0, 1.0 / 2.0]);
        assert_eq!(a.mismatches, 0);
        let b = get("pl", "b");
        assert!((b.speedup.unwrap() - 0.5).abs() < 1e-9);
        assert_eq!(b.mismatches, 1);
        let all = get("pl", "all");
        assert_eq!(all.runs, 3);
        assert!((all.speedup.unwrap() - (49.0 / 3.0) / (38.0 / 3.0)).abs() < 1e-9);
        assert_eq!(all.mismatches, 1);
        let plain = get("plain", "all");
        assert!((plain.speedup.unwrap() - 1.0).abs() < 1e-9);
        assert_eq!(plain.tau, Some(1.0));
        assert_eq!(plain.alpha, None);
    }

    #[test]
    fn round_trips_spread_over_every_measured_one() {
        let mut runs = vec![record("plain", "a", 10.0, &[], &[]); 3];
        assert_eq!(round_trip_spread(&runs), None);
        runs[0].core_round_trip_ns = [Some(400.0), Some(80.0)];
        runs[2].core_round_trip_ns = [None, Some(90.0)];
        assert_eq!(round_trip_spread(&runs), Some((80.0, 90.0, 400.0)));
    }

    #[test]
    fn plain_drift_sets_the_runs_after_the_methods_against_those_before() {
        let mut after = record("plain", "a", 12.0, &[], &[]);
        after.plain_pass = Some(PlainPass::After);
        let mut other_target = record("plain", "a", 50.0, &[], &[]);
        other_target.target = "u".into();
        let runs = vec![
            record("plain", "a", 10.0, &[], &[]),
            record("plain", "b", 20.0, &[], &[]),
            record("pl", "a", 30.0, &[4, 2], &[3, 1]),
            after,
            other_target,
        ];
        // Only target `t` was bracketed; its two runs before average 15 tok/s.
        assert_eq!(
            plain_drift(&runs),
            vec![PlainDrift {
                target: "t".into(),
                before: (15.0, 30.0),
                after: (12.0, 24.0),
            }]
        );
        // Both plain passes make the baseline: (10 + 20 + 12) / 3 tok/s.
        let s = summarize(&runs, &["a".to_owned(), "b".to_owned()]);
        let pl = s
            .iter()
            .find(|x| x.method == "pl" && x.category == "all")
            .unwrap();
        assert!((pl.speedup.unwrap() - 30.0 / 14.0).abs() < 1e-9);
        // `--plain-once` runs have nothing to set against each other.
        let once: Vec<RunRecord> = runs
            .into_iter()
            .filter(|r| r.plain_pass != Some(PlainPass::After))
            .collect();
        assert_eq!(plain_drift(&once), vec![]);
    }

    #[test]
    fn draft_model_methods_get_the_measured_bound() {
        let runs = bound_runs();
        let cats = vec!["a".to_owned(), "b".to_owned()];
        let s = summarize(&runs, &cats);
        let get = |m: &str, c: &str| s.iter().find(|x| x.method == m && x.category == c).unwrap();
        for c in ["a", "all"] {
            let x = get("sampling:k=2", c);
            let b = x.draft_bound.as_ref().unwrap();
            assert_eq!(b.k, 2.0);
            assert!((b.draft_forward_seconds - 0.05).abs() < 1e-12);
            assert!((b.plain_step_seconds - 0.2).abs() < 1e-12, "{c}");
            assert!((b.cost_ratio - 0.25).abs() < 1e-12);
            // E[τ] from α tested = 4/7, not from α = 1/2 (which gives 1.75).
            assert!((x.alpha.unwrap() - 0.5).abs() < 1e-12);
            assert!((b.alpha - 4.0 / 7.0).abs() < 1e-12);
            let tau = (1.0 - (4.0f64 / 7.0).powi(3)) / (3.0 / 7.0);
            assert!((b.expected_tau - tau).abs() < 1e-12);
            assert!((b.speedup_bound - tau / 1.5).abs() < 1e-12);
            // Achieved: 21 tok/s ÷ plain's mean 15 tok/s in "a" (all: 38/3) = 1.4 in "a".
            let achieved = x.speedup.unwrap();
            assert!((b.achieved_over_bound.unwrap() - achieved / (tau / 1.5)).abs() < 1e-12);
            // Decode pooled: every run makes 9 tokens after its first step in 4.5 ÷ tok/s
            // seconds; the plain runs at 10 and 20 tok/s ("a"), and 8 ("all").
            let plain_tps: &[f64] = if c == "a" {
                &[10.0, 20.0]
            } else {
                &[10.0, 20.0, 8.0]
            };
            let plain_pooled =
                9.0 * plain_tps.len() as f64 / plain_tps.iter().map(|t| 4.5 / t).sum::<f64>();
            let pooled = (9.0 / (4.5 / 21.0)) / plain_pooled;
            assert!(
                (b.pooled_decode_speedup.unwrap() - pooled).abs() < 1e-12,
                "{c}"
            );
            assert!((b.decode_over_bound.unwrap() - pooled / (tau / 1.5)).abs() < 1e-12);
            // Spec-Bench's mean of per-prompt speeds is another figure: 42 ÷ 30 in "a".
            assert!((x.decode_speedup.unwrap() - pooled).abs() > 0.1);
            // τ = 10 produced ÷ 6 target forwards.
            assert!((b.tau_over_expected - (10.0 / 6.0) / tau).abs() < 1e-12);
            assert!((b.verify_ratio - 1.5).abs() < 1e-12);
            assert!((b.bound_with_verify - tau / 2.0).abs() < 1e-12);
        }
        assert!((get("sampling:k=2", "a").speedup.unwrap() - 1.4).abs() < 1e-12);

        let b = get("sampling:k=auto", "a").draft_bound.clone().unwrap();
        assert_eq!(b.k, 1.5);
        assert!((b.cost_ratio - 0.5).abs() < 1e-12);
        // Each step's E[τ] at its own K, α tested 1/2: 1, 1.5, 1.75 and 1.875; not E[τ] at
        // K 1.5 (1.65), which no step could yield on average.
        let tau = (1.0 + 1.5 + 1.75 + 1.875) / 4.0;
        assert!((b.expected_tau - tau).abs() < 1e-12);
        assert!((b.speedup_bound - tau / (1.5 * 0.5 + 1.0)).abs() < 1e-12);

        assert!(get("pl", "a").draft_bound.is_none());
        assert!(get("plain", "all").draft_bound.is_none());
        // A draft-model method with nothing drafted has no α, so no bound.
        let mut idle = bound_runs();
        idle.retain(|r| r.plain_pass.is_some() || r.method == "sampling:k=2");
        idle[3].drafted = 0;
        idle[3].accepted = 0;
        idle[3].rejections = 0;
        assert!(summarize(&idle, &cats)[3].draft_bound.is_none());
    }
}
