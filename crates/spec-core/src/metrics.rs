//! Counters of a speculative run, and the figures derived from them as Spec-Bench defines them.
//!
//! - α (acceptance rate) = accepted drafted tokens ÷ drafted tokens.
//! - α per tested draft = accepted ÷ (accepted + rejections), a rejection being a step whose
//!   drafted path was cut short. A draft after the first rejection of a chain is never tested,
//!   yet α counts it as not accepted, so α reads low for long chains; this one is the
//!   maximum-likelihood estimate of the per-token acceptance rate of Leviathan et al.'s
//!   (2023) i.i.d. model, the α of `E[τ] = (1 − α^{K+1}) / (1 − α)`.
//! - τ (mean accepted length) = tokens produced ÷ target forward passes, counting the token each
//!   verification pass produces itself. Plain decoding has τ = 1.
//! - Acceptance by position: for each draft position (chain index or tree depth, from 1), the
//!   fraction of steps that drafted at that position in which a token there was accepted.
//!
//! Counters add up, so metrics of steps, prompts and runs merge by addition.

use serde::{Deserialize, Serialize};

use crate::tree::TokenTree;
use crate::verify::Verdict;

/// Counts at one draft position.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PositionCounts {
    /// Steps that drafted at least one token at this position.
    pub drafted: u64,
    /// Steps that accepted the token at this position.
    pub accepted: u64,
}

/// Counters of a run; see the module docs for the derived figures.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Metrics {
    /// Verification (or plain decoding) steps.
    pub steps: u64,
    /// Target forward passes spent producing tokens (prompt prefill not included).
    pub target_forwards: u64,
    /// Draft model forward passes (0 for drafters without a model).
    pub draft_forwards: u64,
    /// Drafted tokens: tree nodes, root excluded.
    pub drafted: u64,
    /// Drafted tokens the target accepted.
    pub accepted: u64,
    /// Steps whose accepted path is shorter than the drafted depth (one rejected test each).
    #[serde(default)]
    pub rejections: u64,
    /// Tokens appended to the output: accepted drafts plus one per step.
    pub produced: u64,
    /// Counts by draft position; index 0 is position 1.
    pub by_position: Vec<PositionCounts>,
}

impl Metrics {
    /// Records one step that verified `tree` in one target forward and decided `verdict`.
    pub fn record_step(&mut self, tree: &TokenTree, verdict: &Verdict) {
        self.record_counts(tree.drafted(), tree.max_depth(), verdict.accepted.len());
    }

    /// Records one step from counts: `drafted` tokens over `depth` positions, `accepted` of them
    /// accepted (a path, so one per position), verified in one target forward.
    pub fn record_counts(&mut self, drafted: usize, depth: usize, accepted: usize) {
        debug_assert!(accepted <= depth && depth <= drafted);
        self.steps += 1;
        self.target_forwards += 1;
        self.drafted += drafted as u64;
        self.accepted += accepted as u64;
        self.rejections += u64::from(accepted < depth);
        self.produced += accepted as u64 + 1;
        if self.by_position.len() < depth {
            self.by_position.resize(depth, PositionCounts::default());
        }
        for (position, counts) in self.by_position.iter_mut().take(depth).enumerate() {
            counts.drafted += 1;
            if position < accepted {
                counts.accepted += 1;
            }
        }
    }

    /// Records one step of plain decoding: one forward, one token.
    pub fn record_plain_step(&mut self) {
        self.record_counts(0, 0, 0);
    }

    pub fn add_draft_forwards(&mut self, forwards: u64) {
        self.draft_forwards += forwards;
    }

    /// α = accepted ÷ drafted; `None` before anything was drafted.
    pub fn alpha(&self) -> Option<f64> {
        (self.drafted > 0).then(|| self.accepted as f64 / self.drafted as f64)
    }

    /// α per tested draft = accepted ÷ (accepted + rejections); `None` before anything was
    /// tested.
    pub fn alpha_per_tested_draft(&self) -> Option<f64> {
        let tested = self.accepted + self.rejections;
        (tested > 0).then(|| self.accepted as f64 / tested as f64)
    }

    /// τ = produced ÷ target forwards; `None` before any step.
    pub fn tau(&self) -> Option<f64> {
        (self.target_forwards > 0).then(|| self.produced as f64 / self.target_forwards as f64)
    }

    /// Acceptance rate at each draft position, from position 1.
    pub fn acceptance_by_position(&self) -> Vec<f64> {
        self.by_position
            .iter()
            .map(|c| {
                if c.drafted == 0 {
                    0.0
                } else {
                    c.accepted as f64 / c.drafted as f64
                }
            })
            .collect()
    }

    /// Steps by the depth their draft reached: `[d]` counts the steps whose deepest draft was
    /// at position `d` (a chain of `d` drafts), `[0]` the steps that drafted nothing. A step of
    /// depth `d` counts at positions 1..=d of [`Metrics::by_position`], so the steps of depth
    /// exactly `d` are what position `d` counted and position `d + 1` did not.
    pub fn steps_by_depth(&self) -> Vec<u64> {
        let reached = |position: usize| {
            position.checked_sub(1).map_or(self.steps, |i| {
                self.by_position.get(i).map_or(0, |c| c.drafted)
            })
        };
        (0..=self.by_position.len())
            .map(|d| reached(d).saturating_sub(reached(d + 1)))
            .collect()
    }

    /// Adds `other`'s counters to these.
    pub fn merge(&mut self, other: &Metrics) {
        self.steps += other.steps;
        self.target_forwards += other.target_forwards;
        self.draft_forwards += other.draft_forwards;
        self.drafted += other.drafted;
        self.accepted += other.accepted;
        self.rejections += other.rejections;
        self.produced += other.produced;
        if self.by_position.len() < other.by_position.len() {
            self.by_position
                .resize(other.by_position.len(), PositionCounts::default());
        }
        for (mine, theirs) in self.by_position.iter_mut().zip(&other.by_position) {
            mine.drafted += theirs.drafted;
            mine.accepted += theirs.accepted;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tree::ROOT;

    #[test]
    fn chain_steps() {
        let mut m = Metrics::default();
        // K = 4: accept 2, then accept all 4.
        m.record_counts(4, 4, 2);
        m.record_counts(4, 4, 4);
        assert_eq!(m.produced, 3 + 5);
        assert_eq!(m.alpha(), Some(6.0 / 8.0));
        // Tested: the 6 accepted and the third draft of the first step.
        assert_eq!(m.rejections, 1);
        assert_eq!(m.alpha_per_tested_draft(), Some(6.0 / 7.0));
        assert_eq!(m.tau(), Some(4.0));
        assert_eq!(m.acceptance_by_position(), vec![1.0, 1.0, 0.5, 0.5]);
    }

    /// Chains of K = 8 whose drafts are each accepted with probability 0.9 until the first
    /// rejection: α per tested draft recovers 0.9 and predicts τ; α does neither.
    #[test]
    fn alpha_per_tested_draft_recovers_the_iid_rate() {
        let (rate, k) = (0.9, 8);
        let mut state = 0x9E37_79B9_7F4A_7C15u64;
        let mut uniform = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 11) as f64 / (1u64 << 53) as f64
        };
        let mut m = Metrics::default();
        for _ in 0..20_000 {
            let accepted = (0..k).take_while(|_| uniform() < rate).count();
            m.record_counts(k, k, accepted);
        }
        let tested = m.alpha_per_tested_draft().unwrap();
        assert!((tested - rate).abs() < 0.005, "{tested}");
        let expected_tau = |a: f64| (1.0 - a.powi(k as i32 + 1)) / (1.0 - a);
        let tau = m.tau().unwrap();
        assert!((expected_tau(tested) - tau).abs() < 0.05, "{tau}");
        // E[accepted] / K = (0.9 + ... + 0.9^8) / 8 = 0.64.
        let alpha = m.alpha().unwrap();
        assert!((alpha - 0.64).abs() < 0.01, "{alpha}");
        assert!(expected_tau(alpha) < tau - 1.0);
    }

    #[test]
    fn steps_by_depth_counts_each_step_once() {
        let mut m = Metrics::default();
        // A fixed K 4 whose last step had 2 tokens left to draft, and an adaptive policy's
        // plain step and K 1.
        for (drafted, accepted) in [(4, 4), (4, 1), (2, 2), (0, 0), (1, 0)] {
            m.record_counts(drafted, drafted, accepted);
        }
        assert_eq!(m.steps_by_depth(), vec![1, 1, 1, 0, 2]);
        assert_eq!(m.steps_by_depth().iter().sum::<u64>(), m.steps);
        let drafted: u64 = m
            .steps_by_depth()
            .iter()
            .enumerate()
            .map(|(d, &n)| d as u64 * n)
            .sum();
        assert_eq!(drafted, m.drafted);
        assert_eq!(Metrics::default().steps_by_depth(), vec![0]);
    }

    #[test]
    fn plain_decoding_has_tau_one_and_no_alpha() {
        let mut m = Metrics::default();
        for _ in 0..3 {
            m.record_plain_step();
        }
        assert_eq!(m.tau(), Some(1.0));
        assert_eq!(m.alpha(), None);
    }

    #[test]
    fn tree_step_counts_nodes_and_depth() {
        let mut tree = TokenTree::new(0);
        let a = tree.push(ROOT, 1).unwrap();
        tree.push(ROOT, 2).unwrap();
        tree.push(a, 3).unwrap();
        let mut m = Metrics::default();
        m.record_step(
            &tree,
            &Verdict {
                accepted: vec![a],
                next_token: 9,
            },
        );
        assert_eq!((m.drafted, m.accepted, m.produced), (3, 1, 2));
        assert_eq!(m.acceptance_by_position(), vec![1.0, 0.0]);
    }

    #[test]
    fn merge_equals_recording_everything_in_one() {
        let steps = [(4, 4, 1), (4, 4, 4), (6, 3, 2), (0, 0, 0)];
        let mut all = Metrics::default();
        let mut a = Metrics::default();
        let mut b = Metrics::default();
        for (i, &(d, k, acc)) in steps.iter().enumerate() {
            all.record_counts(d, k, acc);
            if i % 2 == 0 { &mut a } else { &mut b }.record_counts(d, k, acc);
        }
        a.add_draft_forwards(5);
        all.add_draft_forwards(5);
        a.merge(&b);
        assert_eq!(a, all);
    }

    #[test]
    fn serde_round_trip() {
        let mut m = Metrics::default();
        m.record_counts(3, 3, 1);
        let json = serde_json::to_string(&m).unwrap();
        assert_eq!(serde_json::from_str::<Metrics>(&json).unwrap(), m);
    }
}
