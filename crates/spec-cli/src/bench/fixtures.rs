//! Records for the tests of the statistics and the report.

use std::collections::BTreeMap;

use spec_runtime::StopReason;

use super::records::{PlainPass, RunRecord};

pub(super) fn record(
    method: &str,
    category: &str,
    tps: f64,
    drafted: &[u64],
    accepted: &[u64],
) -> RunRecord {
    // Chains: the tests at position p are the steps that accepted p − 1 and drafted p.
    let mut rejections = 0;
    let mut reached = drafted.first().copied().unwrap_or(0);
    for (&d, &a) in drafted.iter().zip(accepted) {
        rejections += reached.min(d) - a;
        reached = a;
    }
    RunRecord {
        target: "t".into(),
        method: method.into(),
        method_name: method.split(':').next().unwrap().into(),
        // The draft-model method of these tests is `sampling`.
        draft_model: method.starts_with("sampling").then(|| "d".to_owned()),
        question_id: "1".into(),
        category: category.into(),
        turn: 0,
        repeat: 0,
        prompt_tokens: 5,
        new_tokens: 10,
        stop_reason: StopReason::MaxNewTokens,
        // 10 tokens at `tps`, the 9 after the first step at twice that.
        wall_seconds: 10.0 / tps,
        prompt_seconds: 5.5 / tps,
        tokens_per_second: tps,
        decode_tokens_per_second: 2.0 * tps,
        decode_tokens: 9,
        draft_seconds: 0.0,
        target_seconds: 0.0,
        draft_forward_seconds: 0.0,
        step_seconds: 0.0,
        fixed_k: None,
        steps: 0,
        target_forwards: 10 - accepted.iter().sum::<u64>(),
        draft_forwards: 0,
        drafted: drafted.iter().sum(),
        accepted: accepted.iter().sum(),
        rejections,
        produced: 10,
        alpha: None,
        alpha_per_tested_draft: None,
        tau: None,
        drafter_estimates: BTreeMap::new(),
        drafted_by_position: drafted.to_vec(),
        accepted_by_position: accepted.to_vec(),
        steps_by_width: Vec::new(),
        rss_before_bytes: None,
        peak_rss_bytes: Some(1 << 20),
        peak_rss_scope: "generation",
        matches_plain: (method != "plain").then_some(category != "b"),
        plain_pass: (method == "plain").then_some(PlainPass::Before),
        core_round_trip_ns: [None, None],
        tokens: vec![],
    }
}

/// A draft-model run: `steps` steps of 0.3 s, `forwards` draft forwards taking `seconds` in
/// all.
pub(super) fn draft_run(
    mut r: RunRecord,
    fixed_k: Option<usize>,
    steps: u64,
    forwards: u64,
    seconds: f64,
) -> RunRecord {
    r.fixed_k = fixed_k;
    r.steps = steps;
    r.step_seconds = 0.3 * steps as f64;
    r.draft_forwards = forwards;
    r.draft_forward_seconds = seconds;
    r
}

/// A plain run of `steps` decode steps taking `seconds` in all.
pub(super) fn plain_run(category: &str, tps: f64, steps: u64, seconds: f64) -> RunRecord {
    let mut r = record("plain", category, tps, &[], &[]);
    r.steps = steps;
    r.step_seconds = seconds;
    r
}

pub(super) fn bound_runs() -> Vec<RunRecord> {
    vec![
        // Plain decode steps: (1 + 3 + 2) s over 30 steps, 0.2 s each (0.2 s in "a" too).
        plain_run("a", 10.0, 10, 1.0),
        plain_run("a", 20.0, 10, 3.0),
        plain_run("b", 8.0, 10, 2.0),
        // K = 2 over 4 steps: α = 4 / 8, 3 rejections, α tested = 4 / 7; 8 draft forwards
        // of 0.05 s: c = 0.05 / 0.2; verification 0.3 s: v = 1.5.
        draft_run(
            record("sampling:k=2", "a", 21.0, &[4, 4], &[3, 1]),
            Some(2),
            4,
            8,
            0.4,
        ),
        // auto: one step each of K 0, 1, 2 and 3 (6 drafted in 4 steps, K = 1.5); α = 3 / 6,
        // 3 rejections, α tested = 3 / 6; forwards of 0.1 s: c = 0.5.
        draft_run(
            record("sampling:k=auto", "a", 12.0, &[3, 2, 1], &[2, 1, 0]),
            None,
            4,
            6,
            0.6,
        ),
        // Not a draft-model method: no bound, even with forwards.
        draft_run(record("pl", "a", 30.0, &[4], &[2]), None, 4, 4, 0.4),
    ]
}
