//! A small host-side f64 implementation of every rule in this crate, for tests to compare the
//! backend implementation against and to enumerate exactly.
//!
//! It is written for clarity, not speed: full vectors, no batching. Its tree walk takes a
//! [`Chooser`], so the same code runs on seeded uniforms ([`UniformChooser`]) or explores every
//! random branch with its probability (`tests/analytic.rs`).

use crate::error::{Result, Source, SpecError};
use crate::rng::{SpecRng, StepUniforms, accepts};
use crate::sampling::SamplingConfig;
use crate::tree::{NodeId, ROOT, TokenTree};
use crate::verify::Verdict;

/// Below this mass the residual of a sampled proposal is taken to have rounded away and `p` is
/// used instead. Mathematically that residual is empty only when `p ≤ q` everywhere, and then no
/// rejection can happen; a rejection with an empty residual is a rounding artefact. Point-mass
/// proposals have no floor: [`remove_token`] is exact.
pub const RESIDUAL_FLOOR_F64: f64 = 1e-12;

/// [`crate::sampling::probabilities`] for one row, in f64, with explicit errors.
pub fn probabilities(
    logits: &[f64],
    config: &SamplingConfig,
    what: Source,
    row: usize,
) -> Result<Vec<f64>> {
    config.validate()?;
    let bad = || SpecError::NonFiniteLogits { what, row };
    if logits.iter().any(|x| x.is_nan() || *x == f64::INFINITY) {
        return Err(bad());
    }
    let max = logits.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    if max == f64::NEG_INFINITY {
        return Err(bad());
    }
    let vocab = logits.len();
    if config.is_greedy() {
        let mut p = vec![0.0; vocab];
        p[argmax(logits)] = 1.0;
        return Ok(p);
    }
    let exp: Vec<f64> = logits
        .iter()
        .map(|x| ((x - max) / config.temperature).exp())
        .collect();
    let total: f64 = exp.iter().sum();
    let mut p: Vec<f64> = exp.iter().map(|e| e / total).collect();

    // Order: probability descending, then index ascending.
    let mut order: Vec<usize> = (0..vocab).collect();
    order.sort_by(|&a, &b| p[b].total_cmp(&p[a]).then(a.cmp(&b)));
    let mut keep = vec![true; vocab];
    let mut kept_order = order.clone();
    if let Some(k) = config.effective_top_k(vocab) {
        for &i in &order[k..] {
            keep[i] = false;
        }
        kept_order.truncate(k);
    }
    if let Some(top_p) = config.effective_top_p() {
        let kept_mass: f64 = kept_order.iter().map(|&i| p[i]).sum();
        let mut cumulative = 0.0;
        let mut reached = kept_order.len();
        for (n, &i) in kept_order.iter().enumerate() {
            cumulative += p[i];
            if cumulative >= top_p * kept_mass {
                reached = n + 1;
                break;
            }
        }
        for &i in &kept_order[reached..] {
            keep[i] = false;
        }
    }
    if let Some(min_p) = config.effective_min_p() {
        let p_max = p[order[0]];
        for i in 0..vocab {
            if p[i] < min_p * p_max {
                keep[i] = false;
            }
        }
    }
    for i in 0..vocab {
        if !keep[i] {
            p[i] = 0.0;
        }
    }
    let mass: f64 = p.iter().sum();
    Ok(p.into_iter().map(|x| x / mass).collect())
}

/// Index of the largest entry; ties go to the lowest index.
pub fn argmax(xs: &[f64]) -> usize {
    let mut best = 0;
    for (i, &x) in xs.iter().enumerate() {
        if x > xs[best] {
            best = i;
        }
    }
    best
}

/// `norm(max(0, p − q))`, or `p` when that residual has (numerically) no mass.
pub fn residual(p: &[f64], q: &[f64]) -> Vec<f64> {
    let d: Vec<f64> = p.iter().zip(q).map(|(a, b)| (a - b).max(0.0)).collect();
    let mass: f64 = d.iter().sum();
    if mass <= RESIDUAL_FLOOR_F64 {
        return p.to_vec();
    }
    d.into_iter().map(|x| x / mass).collect()
}

/// `p` with `token` removed and renormalized: the residual of a point-mass proposal,
/// `norm(max(0, p − δ_token))`, however little mass is left (no floor: a token of probability
/// `1 − 1e-13` that is rejected leaves the other `1e-13`, which is then the whole residual).
///
/// When nothing is left (`p` was the point mass at `token`) the result is all zeros. The walk
/// never gets there: a rejection needs `p(token) < 1`, and a normalized row whose only mass is
/// at `token` holds exactly 1 there (`x / x`), so its test is certain and never rejects.
pub fn remove_token(p: &[f64], token: usize) -> Vec<f64> {
    let mut rest = p.to_vec();
    rest[token] = 0.0;
    let mass: f64 = rest.iter().sum();
    if mass > 0.0 {
        rest.iter_mut().for_each(|x| *x /= mass);
    }
    rest
}

/// The smallest index whose cumulative weight exceeds `uniform · total`, never an index of
/// weight 0.
pub fn inverse_cdf(weights: &[f64], uniform: f64) -> usize {
    let total: f64 = weights.iter().sum();
    let target = uniform * total;
    let mut cumulative = 0.0;
    let mut below = 0;
    for &w in weights {
        cumulative += w;
        if cumulative <= target {
            below += 1;
        }
    }
    let last_nonzero = weights.iter().rposition(|&w| w > 0.0).unwrap_or(0);
    below.min(last_nonzero)
}

/// The source of the two random decisions a verification step makes.
pub trait Chooser {
    /// Decides drafted node `node`'s acceptance test, which passes with `probability` (< 1: a
    /// test of probability 1 passes without asking, as a uniform in `[0, 1)` would pass it).
    fn accept(&mut self, node: NodeId, probability: f64) -> bool;
    /// Draws the token that ends the step from `weights` (not necessarily normalized).
    fn choose(&mut self, weights: &[f64]) -> usize;
}

/// The chooser of real runs: one step's seeded uniforms, used as every backend uses them.
#[derive(Debug)]
pub struct UniformChooser<'a>(pub &'a StepUniforms);

impl Chooser for UniformChooser<'_> {
    fn accept(&mut self, node: NodeId, probability: f64) -> bool {
        accepts(self.0.for_node(node), probability)
    }

    fn choose(&mut self, weights: &[f64]) -> usize {
        inverse_cdf(weights, self.0.final_draw)
    }
}

/// How the children of each node were proposed, with host distributions.
#[derive(Debug, Clone, PartialEq)]
pub enum HostProposal {
    /// The children of node `n` were drawn i.i.d. from `q[n]`.
    Sampled(Vec<Vec<f64>>),
    /// The children are fixed candidates: each is a point mass.
    Deterministic,
}

/// The verification walk on processed distributions: `target[n]` is the target's distribution
/// of the token after node `n`.
///
/// At each node the children are tried in order. A child `c` drawn from `q` is accepted with
/// probability `min(1, r(c) / q(c))`, where `r` starts as the target's distribution and becomes
/// `norm(max(0, r − q))` after each rejection (SpecInfer's multi-step speculative sampling; for a
/// point mass this removes the rejected token). An accepted child becomes the current node. When
/// every child is rejected the step ends with a draw from `r`; at a leaf, from the target's
/// distribution there (the bonus token).
pub fn walk<C: Chooser>(
    tree: &TokenTree,
    target: &[Vec<f64>],
    proposal: &HostProposal,
    chooser: &mut C,
) -> Result<Verdict> {
    let mut node = ROOT;
    let mut accepted = Vec::new();
    'descend: loop {
        let mut r = target[node].clone();
        for &child in tree.children(node) {
            let token = tree.token(child) as usize;
            let probability = match proposal {
                HostProposal::Sampled(q) => {
                    let q_token = q[node][token];
                    if q_token <= 0.0 {
                        return Err(SpecError::ImpossibleDraft {
                            node: child,
                            token: token as u32,
                        });
                    }
                    (r[token] / q_token).min(1.0)
                }
                HostProposal::Deterministic => r[token].min(1.0),
            };
            if probability >= 1.0 || chooser.accept(child, probability) {
                accepted.push(child);
                node = child;
                continue 'descend;
            }
            r = match proposal {
                HostProposal::Sampled(q) => residual(&r, &q[node]),
                HostProposal::Deterministic => remove_token(&r, token),
            };
        }
        let next_token = chooser.choose(&r) as u32;
        return Ok(Verdict {
            accepted,
            next_token,
        });
    }
}

/// Greedy verification: follow the child that equals the target's argmax; the argmax where no
/// child does is the next token.
pub fn walk_greedy(tree: &TokenTree, target_logits: &[Vec<f64>]) -> Verdict {
    let mut node = ROOT;
    let mut accepted = Vec::new();
    loop {
        let best = argmax(&target_logits[node]) as u32;
        match tree.children(node).iter().find(|&&c| tree.token(c) == best) {
            Some(&child) => {
                accepted.push(child);
                node = child;
            }
            None => {
                return Verdict {
                    accepted,
                    next_token: best,
                };
            }
        }
    }
}

/// One verification step from logits, as [`crate::verify::Verifier::verify_tree`] does it:
/// `target_logits[n]` are the target's logits after node `n`; a sampled proposal carries the
/// draft's processed distributions.
pub fn verify_tree(
    config: &SamplingConfig,
    tree: &TokenTree,
    target_logits: &[Vec<f64>],
    proposal: &HostProposal,
    rng: &mut SpecRng,
) -> Result<Verdict> {
    config.validate()?;
    let uniforms = rng.step_uniforms(tree.len());
    for (row, logits) in target_logits.iter().enumerate() {
        probabilities(logits, config, Source::Target, row)?;
    }
    if config.is_greedy() {
        return Ok(walk_greedy(tree, target_logits));
    }
    let target = target_logits
        .iter()
        .enumerate()
        .map(|(row, logits)| probabilities(logits, config, Source::Target, row))
        .collect::<Result<Vec<_>>>()?;
    walk(tree, &target, proposal, &mut UniformChooser(&uniforms))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn residual_of_point_mass_removes_the_token() {
        let p = [0.5, 0.3, 0.2];
        let r = remove_token(&p, 0);
        assert!((r[0]).abs() < 1e-15 && (r[1] - 0.6).abs() < 1e-15 && (r[2] - 0.4).abs() < 1e-15);
    }

    #[test]
    fn removing_a_near_certain_token_leaves_the_rest() {
        // 1e-13 left elsewhere: less than the floor of sampled proposals' residuals.
        assert_eq!(
            remove_token(&[1.0 - 1e-13, 1e-13, 0.0], 0),
            vec![0.0, 1.0, 0.0]
        );
        let r = remove_token(&[1.0 - 1e-13, 2.5e-14, 7.5e-14], 0);
        assert!(r[0] == 0.0 && (r[1] - 0.25).abs() < 1e-12 && (r[2] - 0.75).abs() < 1e-12);
        // Nothing left: the walk never asks (see `remove_token`).
        assert_eq!(remove_token(&[0.0, 1.0], 1), vec![0.0, 0.0]);
    }

    #[test]
    fn a_rejected_near_certain_candidate_is_not_emitted() {
        let tree = TokenTree::chain(0, &[0]);
        let target = vec![vec![1.0 - 1e-13, 1e-13]; 2];
        // The largest uniform below 1 rejects token 0.
        let uniforms = StepUniforms {
            acceptance: vec![1.0 - f64::EPSILON / 2.0],
            final_draw: 0.5,
        };
        let verdict = walk(
            &tree,
            &target,
            &HostProposal::Deterministic,
            &mut UniformChooser(&uniforms),
        )
        .unwrap();
        assert_eq!(
            verdict,
            Verdict {
                accepted: vec![],
                next_token: 1
            }
        );
    }

    #[test]
    fn empty_residual_falls_back_to_p() {
        let p = [0.25, 0.75];
        assert_eq!(residual(&p, &p), p.to_vec());
    }

    #[test]
    fn inverse_cdf_skips_zero_mass() {
        let w = [0.0, 0.5, 0.0, 0.5, 0.0];
        assert_eq!(inverse_cdf(&w, 0.0), 1);
        assert_eq!(inverse_cdf(&w, 0.49), 1);
        assert_eq!(inverse_cdf(&w, 0.5), 3);
        assert_eq!(inverse_cdf(&w, 0.999_999), 3);
        // A target at the very top of the CDF still lands on a token with mass.
        assert_eq!(inverse_cdf(&w, 1.0), 3);
    }

    #[test]
    fn top_k_top_p_min_p_truncate_as_documented() {
        // Probabilities 0.4, 0.3, 0.2, 0.1 at temperature 1.
        let logits: Vec<f64> = [0.4f64, 0.3, 0.2, 0.1].iter().map(|p| p.ln()).collect();
        let run = |c: SamplingConfig| probabilities(&logits, &c, Source::Target, 0).unwrap();
        let base = SamplingConfig::with_temperature(1.0);
        let close = |a: &[f64], b: &[f64]| a.iter().zip(b).all(|(x, y)| (x - y).abs() < 1e-12);
        assert!(close(
            &run(base.top_k(2)),
            &[4.0 / 7.0, 3.0 / 7.0, 0.0, 0.0]
        ));
        // 0.4 + 0.3 = 0.7 reaches 0.7: two tokens; 0.71 needs a third.
        assert!(close(
            &run(base.top_p(0.7)),
            &[4.0 / 7.0, 3.0 / 7.0, 0.0, 0.0]
        ));
        assert!(close(
            &run(base.top_p(0.71)),
            &[4.0 / 9.0, 3.0 / 9.0, 2.0 / 9.0, 0.0]
        ));
        // top-p acts on the top-k-renormalized mass: 0.4 / 0.7 = 0.57 < 0.6.
        assert!(close(
            &run(base.top_k(2).top_p(0.6)),
            &[4.0 / 7.0, 3.0 / 7.0, 0.0, 0.0]
        ));
        assert!(close(&run(base.top_k(2).top_p(0.5)), &[1.0, 0.0, 0.0, 0.0]));
        // min_p 0.5: keep p ≥ 0.2.
        assert!(close(
            &run(base.min_p(0.5)),
            &[4.0 / 9.0, 3.0 / 9.0, 2.0 / 9.0, 0.0]
        ));
        assert!(close(&run(SamplingConfig::greedy()), &[1.0, 0.0, 0.0, 0.0]));
    }

    #[test]
    fn ties_at_a_cut_go_to_the_lower_index() {
        let logits = [0.0, 1.0, 1.0, 1.0];
        let p = probabilities(
            &logits,
            &SamplingConfig::with_temperature(1.0).top_k(2),
            Source::Target,
            0,
        )
        .unwrap();
        assert_eq!(p, vec![0.0, 0.5, 0.5, 0.0]);
        assert_eq!(argmax(&logits), 1);
    }

    #[test]
    fn bad_logits_are_errors() {
        let c = SamplingConfig::with_temperature(1.0);
        for logits in [
            vec![0.0, f64::NAN],
            vec![0.0, f64::INFINITY],
            vec![f64::NEG_INFINITY, f64::NEG_INFINITY],
        ] {
            assert_eq!(
                probabilities(&logits, &c, Source::Draft, 3),
                Err(SpecError::NonFiniteLogits {
                    what: Source::Draft,
                    row: 3
                })
            );
        }
        // A -inf entry is a masked token, not an error.
        let p = probabilities(&[0.0, f64::NEG_INFINITY], &c, Source::Target, 0).unwrap();
        assert_eq!(p, vec![1.0, 0.0]);
    }
}
