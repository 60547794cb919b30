//! One generation's measurements, and a greedy method's first difference from plain decoding.

use std::collections::BTreeMap;

use anyhow::{Result, bail};

use serde::Serialize;
use spec_engine::WidthSteps;
use spec_runtime::StopReason;
use spec_tokenizer::TextTokenizer;

/// One generation's raw measurements (one element of `report.json`'s `runs`).
#[derive(Debug, Clone, Serialize)]
pub(super) struct RunRecord {
    pub(super) target: String,
    pub(super) method: String,
    pub(super) method_name: String,
    pub(super) draft_model: Option<String>,
    pub(super) question_id: String,
    pub(super) category: String,
    pub(super) turn: usize,
    pub(super) repeat: usize,
    pub(super) prompt_tokens: usize,
    pub(super) new_tokens: usize,
    pub(super) stop_reason: StopReason,
    pub(super) wall_seconds: f64,
    pub(super) prompt_seconds: f64,
    pub(super) tokens_per_second: f64,
    /// Tokens after the first step per second after it (`GenerationStats`).
    pub(super) decode_tokens_per_second: f64,
    /// The tokens that speed counts, produced in `wall_seconds − prompt_seconds`.
    pub(super) decode_tokens: usize,
    pub(super) draft_seconds: f64,
    pub(super) target_seconds: f64,
    /// Time in the drafter's `draft` calls that ran the draft model (`draft_forwards` forwards).
    pub(super) draft_forward_seconds: f64,
    /// Time in the `steps` verification steps (target forward and verification), no prefill.
    pub(super) step_seconds: f64,
    /// The fixed draft length K of a draft-model method; `None` for `k=auto` and for methods
    /// without a draft model.
    pub(super) fixed_k: Option<usize>,
    pub(super) steps: u64,
    pub(super) target_forwards: u64,
    pub(super) draft_forwards: u64,
    pub(super) drafted: u64,
    pub(super) accepted: u64,
    /// Steps whose accepted path was shorter than the drafted depth.
    pub(super) rejections: u64,
    pub(super) produced: u64,
    pub(super) alpha: Option<f64>,
    pub(super) alpha_per_tested_draft: Option<f64>,
    pub(super) tau: Option<f64>,
    /// The drafter's running estimates after this run (`Drafter::report_estimates`: for a
    /// draft-model method `auto`'s α, c, verification slope...), carried over from the runs
    /// before it, the warm-up included; absent where the drafter keeps none.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub(super) drafter_estimates: BTreeMap<&'static str, f64>,
    pub(super) drafted_by_position: Vec<u64>,
    pub(super) accepted_by_position: Vec<u64>,
    /// The verification steps by width (tokens scored, root included) and their seconds.
    pub(super) steps_by_width: Vec<WidthSteps>,
    pub(super) rss_before_bytes: Option<u64>,
    pub(super) peak_rss_bytes: Option<u64>,
    /// `generation`: the peak was reset just before this generation; `process`: it could not
    /// be reset, so it is the process's peak so far.
    pub(super) peak_rss_scope: &'static str,
    /// Greedy runs of non-plain methods, and plain decoding's run after the methods: whether
    /// the tokens equal plain decoding's first run on the prompt.
    pub(super) matches_plain: Option<bool>,
    /// Plain decoding's runs: before the prompt's other methods or after them (the bracket
    /// that `--plain-once` leaves out); `None` for the other methods.
    pub(super) plain_pass: Option<PlainPass>,
    /// [`core_round_trip_ns`](super::machine::core_round_trip_ns) just before this generation
    /// and just after it: where the machine's threads sat while it ran.
    pub(super) core_round_trip_ns: [Option<f64>; 2],
    pub(super) tokens: Vec<u32>,
}

/// Where a plain run sits among one prompt's runs ([`RunRecord::plain_pass`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub(super) enum PlainPass {
    Before,
    After,
}

/// A greedy method's first difference from plain decoding on one prompt.
#[derive(Debug, Clone, Serialize)]
pub(super) struct Mismatch {
    pub(super) target: String,
    pub(super) method: String,
    pub(super) question_id: String,
    pub(super) turn: usize,
    pub(super) repeat: usize,
    /// 0-based index into the new tokens.
    pub(super) position: usize,
    pub(super) plain_token: Option<u32>,
    pub(super) method_token: Option<u32>,
    pub(super) plain_text: String,
    pub(super) method_text: String,
}

/// The first index where `b` differs from `a` (a length difference counts).
pub(super) fn first_difference(a: &[u32], b: &[u32]) -> Option<usize> {
    match a.iter().zip(b).position(|(x, y)| x != y) {
        Some(i) => Some(i),
        None if a.len() != b.len() => Some(a.len().min(b.len())),
        None => None,
    }
}

/// A few tokens around `position`, decoded, for the mismatch report.
pub(super) fn around(tokenizer: &TextTokenizer, tokens: &[u32], position: usize) -> String {
    let start = position.saturating_sub(4);
    let end = (position + 4).min(tokens.len());
    if start >= end {
        return String::new();
    }
    tokenizer
        .decode(&tokens[start..end])
        .unwrap_or_else(|_| format!("{:?}", &tokens[start..end]))
}

/// The run's verdict on losslessness: an error where any greedy generation differed from plain
/// decoding's, so that the command fails (after writing the report).
pub(super) fn check_lossless(mismatches: &[Mismatch]) -> Result<()> {
    if !mismatches.is_empty() {
        bail!(
            "{} greedy generation(s) differ from plain decoding (see the report's lossless \
             check); speculative decoding must not change greedy output",
            mismatches.len()
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn any_mismatch_fails_the_run() {
        assert!(check_lossless(&[]).is_ok());
        let mismatch = Mismatch {
            target: "t".into(),
            method: "sampling:k=3".into(),
            question_id: "1".into(),
            turn: 0,
            repeat: 0,
            position: 5,
            plain_token: Some(1),
            method_token: Some(2),
            plain_text: "a".into(),
            method_text: "b".into(),
        };
        let e = check_lossless(&[mismatch.clone(), mismatch]).unwrap_err();
        assert!(
            e.to_string().starts_with("2 greedy generation(s) differ"),
            "{e}"
        );
    }

    #[test]
    fn first_difference_counts_length_changes() {
        assert_eq!(first_difference(&[1, 2, 3], &[1, 2, 3]), None);
        assert_eq!(first_difference(&[1, 2, 3], &[1, 5, 3]), Some(1));
        assert_eq!(first_difference(&[1, 2, 3], &[1, 2]), Some(2));
        assert_eq!(first_difference(&[], &[7]), Some(0));
    }
}
