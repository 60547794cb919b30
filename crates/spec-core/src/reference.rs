//! A small host-side f64 implementation of every rule in this crate, for tests to compare the
//! backend implementation against and to enumerate exactly.
//!
//! It is written for clarity, not speed: full vectors, no batching. Its tree walk takes a
//! [`Chooser`], so the same code runs on seeded uniforms ([`UniformChooser`]) or explores every
//! random branch with its probability (`tests/analytic.rs`).
//!
//! The backend path of per-child proposals ([`crate::verify::Proposal::PerChild`]) walks the
//! rows it reads back with this walk's rule too, so that rule has one implementation; the
//! backend's agreement with the reference then checks what surrounds it (the rows, the floor,
//! the draws), and `tests/analytic.rs` and `tests/statistical.rs` check the rule itself.

use crate::error::{Result, Source, SpecError};
use crate::rng::{SpecRng, StepUniforms, accepts};
use crate::sampling::SamplingConfig;
use crate::tree::{ChildDraw, NodeId, ROOT, TokenTree};
use crate::verify::{Verdict, check_per_child};

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
    residual_with_floor(p, q, RESIDUAL_FLOOR_F64)
}

/// [`residual`] with the mass below which the residual counts as empty given: rows read back
/// from f32 carry f32 rounding, so the device path walks them with its own floor.
pub(crate) fn residual_with_floor(p: &[f64], q: &[f64], floor: f64) -> Vec<f64> {
    let d: Vec<f64> = p.iter().zip(q).map(|(a, b)| (a - b).max(0.0)).collect();
    let mass: f64 = d.iter().sum();
    if mass <= floor {
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
    /// Each node drawn its own way: `draws[n]` says how node `n` was drawn from its parent
    /// (`draws[ROOT]` is unused), `q[n]` is the draft's distribution at node `n`, needed for every
    /// node with a child that is not [`ChildDraw::Fixed`]. See
    /// [`crate::verify::Proposal::PerChild`].
    PerChild {
        q: Option<Vec<Vec<f64>>>,
        draws: Vec<ChildDraw>,
    },
}

/// How each node was drawn: one way for every node, or one per node.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Draws<'a> {
    All(ChildDraw),
    Each(&'a [ChildDraw]),
}

impl Draws<'_> {
    fn of(&self, node: NodeId) -> ChildDraw {
        match self {
            Draws::All(draw) => *draw,
            Draws::Each(draws) => draws[node],
        }
    }
}

/// Where a walk ends.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Walked {
    /// Accepted nodes from the root's child down.
    pub(crate) accepted: Vec<NodeId>,
    /// The residual to draw the final token from, where every child of the last node was
    /// rejected; `None` after a leaf, where the bonus token is drawn from the target's row.
    pub(crate) residual: Option<Vec<f64>>,
}

impl Walked {
    pub(crate) fn last_node(&self) -> NodeId {
        self.accepted.last().copied().unwrap_or(ROOT)
    }
}

/// The verification walk on processed distributions: `target[n]` is the target's distribution
/// of the token after node `n`.
///
/// At each node the children are tried in order, with `r` starting as the target's distribution
/// there and `q_cur` as the draft's row `q`:
/// - a [`ChildDraw::Fixed`] child `x` (every child of [`HostProposal::Deterministic`]) is
///   accepted with probability `r(x)`; on rejection `r` loses `x` and is renormalized (exact,
///   however little mass is left; a repeated candidate is never accepted twice);
/// - a [`ChildDraw::Iid`] child (every child of [`HostProposal::Sampled`]) is accepted with
///   probability `min(1, r(x) / q(x))`; on rejection `r ← norm(max(0, r − q))` (SpecInfer's
///   multi-step speculative sampling);
/// - a [`ChildDraw::WithoutReplacement`] child is accepted with probability
///   `min(1, r(x) / q_cur(x))`; on rejection `r ← norm(max(0, r − q_cur))`, then `q_cur` loses
///   `x` and is renormalized.
///
/// An accepted child becomes the current node. When every child is rejected the step ends with a
/// draw from `r`; at a leaf, from the target's distribution there (the bonus token). The module
/// docs of [`crate::verify`] prove the rule exact.
pub fn walk<C: Chooser>(
    tree: &TokenTree,
    target: &[Vec<f64>],
    proposal: &HostProposal,
    chooser: &mut C,
) -> Result<Verdict> {
    if target.len() < tree.len() {
        return Err(SpecError::Shape(format!(
            "{} target rows for a tree of {} nodes",
            target.len(),
            tree.len()
        )));
    }
    let (q, draws) = match proposal {
        HostProposal::Sampled(q) => (Some(q.as_slice()), Draws::All(ChildDraw::Iid)),
        HostProposal::Deterministic => (None, Draws::All(ChildDraw::Fixed)),
        HostProposal::PerChild { q, draws } => {
            check_per_child(tree, draws, q.as_ref().map(Vec::len))?;
            (q.as_deref(), Draws::Each(draws))
        }
    };
    let walked = walk_rows(tree, target, q, draws, RESIDUAL_FLOOR_F64, chooser)?;
    let row = walked
        .residual
        .as_deref()
        .unwrap_or(&target[walked.last_node()]);
    let next_token = chooser.choose(row) as u32;
    Ok(Verdict {
        accepted: walked.accepted,
        next_token,
    })
}

/// The rule of [`walk`] up to the final draw. Only the rows of the nodes it visits are read:
/// `target[n]` for internal nodes, `q[n]` for nodes with a drawn child (`None` where no node has
/// one); the others may be empty. `floor` is the residual floor of drawn children
/// ([`RESIDUAL_FLOOR_F64`] for f64 rows).
pub(crate) fn walk_rows<C: Chooser>(
    tree: &TokenTree,
    target: &[Vec<f64>],
    q: Option<&[Vec<f64>]>,
    draws: Draws<'_>,
    floor: f64,
    chooser: &mut C,
) -> Result<Walked> {
    let mut node = ROOT;
    let mut accepted = Vec::new();
    'descend: loop {
        let children = tree.children(node);
        if children.is_empty() {
            return Ok(Walked {
                accepted,
                residual: None,
            });
        }
        let mut r = target[node].clone();
        if r.iter().any(|x| x.is_nan()) {
            return Err(SpecError::NonFiniteLogits {
                what: Source::Target,
                row: node,
            });
        }
        let drawn = children.iter().any(|&c| draws.of(c) != ChildDraw::Fixed);
        let q_row = if drawn {
            Some(draft_row(q, node, r.len())?)
        } else {
            None
        };
        // The draft's row without the tokens of the node's rejected WithoutReplacement children.
        let mut q_cur: Option<Vec<f64>> = None;
        for &child in children {
            let token = tree.token(child) as usize;
            let draw = draws.of(child);
            if draw == ChildDraw::WithoutReplacement && q_cur.is_none() {
                q_cur = q_row.map(<[f64]>::to_vec);
            }
            let from = match draw {
                ChildDraw::Fixed => None,
                ChildDraw::Iid => q_row,
                ChildDraw::WithoutReplacement => q_cur.as_deref(),
            };
            let probability = match from {
                None => r[token].min(1.0),
                Some(from) => {
                    if from[token] <= 0.0 {
                        return Err(SpecError::ImpossibleDraft {
                            node: child,
                            token: token as u32,
                        });
                    }
                    (r[token] / from[token]).min(1.0)
                }
            };
            if probability >= 1.0 || chooser.accept(child, probability) {
                accepted.push(child);
                node = child;
                continue 'descend;
            }
            r = match from {
                None => remove_token(&r, token),
                Some(from) => residual_with_floor(&r, from, floor),
            };
            if draw == ChildDraw::WithoutReplacement
                && let Some(q_cur) = &mut q_cur
            {
                *q_cur = remove_token(q_cur, token);
            }
        }
        return Ok(Walked {
            accepted,
            residual: Some(r),
        });
    }
}

/// The draft's row at `node`, checked: present, of the target's width, without NaN.
fn draft_row(q: Option<&[Vec<f64>]>, node: NodeId, vocab: usize) -> Result<&[f64]> {
    let row = q.and_then(|q| q.get(node)).ok_or_else(|| {
        SpecError::Shape(format!(
            "node {node} has drawn children but no draft distribution"
        ))
    })?;
    if row.len() != vocab {
        return Err(SpecError::Shape(format!(
            "draft row {node} has {} entries, the target's {vocab}",
            row.len()
        )));
    }
    if row.iter().any(|x| x.is_nan()) {
        return Err(SpecError::NonFiniteLogits {
            what: Source::Draft,
            row: node,
        });
    }
    Ok(row)
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
    if let HostProposal::PerChild { q, draws } = proposal {
        check_per_child(tree, draws, q.as_ref().map(Vec::len))?;
        let vocab = target_logits.first().map_or(0, Vec::len);
        if let Some((row, entries)) = q
            .iter()
            .flatten()
            .map(Vec::len)
            .enumerate()
            .find(|&(_, entries)| entries != vocab)
        {
            return Err(SpecError::Shape(format!(
                "draft row {row} has {entries} entries, the target's {vocab}"
            )));
        }
    }
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

/// How far `counts` of `runs` seeded generations stand from the exact `law` over the same cells,
/// as `(tv, bound)`: the total-variation distance (cells the law gives no mass count in full)
/// and the bound it stays under with probability 99.9% when the generations follow the law,
/// `E[TV] ≤ ½ Σ √(p (1 − p) / n)` plus McDiarmid's `√(ln 1000 / (2n))`.
pub fn empirical_tv<K: Eq + std::hash::Hash>(
    law: &std::collections::HashMap<K, f64>,
    counts: &std::collections::HashMap<K, u64>,
    runs: u64,
) -> (f64, f64) {
    let n = runs as f64;
    let bound = 0.5
        * law
            .values()
            .map(|p| (p * (1.0 - p) / n).sqrt())
            .sum::<f64>()
        + (1000f64.ln() / (2.0 * n)).sqrt();
    let mut tv: f64 = law
        .iter()
        .map(|(cell, &p)| (counts.get(cell).copied().unwrap_or(0) as f64 / n - p).abs())
        .sum();
    tv += counts
        .iter()
        .filter(|(cell, _)| !law.contains_key(*cell))
        .map(|(_, &c)| c as f64 / n)
        .sum::<f64>();
    (tv / 2.0, bound)
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
    fn a_child_without_replacement_is_tested_against_the_draft_without_earlier_draws() {
        // 0 ─┬─ 1 (token 0)
        //    └─ 2 (token 2)
        let mut tree = TokenTree::new(0);
        tree.push(ROOT, 0).unwrap();
        tree.push(ROOT, 2).unwrap();
        let target = vec![vec![0.2, 0.5, 0.3]; 3];
        let q = vec![vec![0.6, 0.2, 0.2]; 3];
        // Node 1 is accepted with 0.2 / 0.6 and rejected by 0.9: r = [0, 0.75, 0.25]. Node 2
        // is then accepted with 0.25 / 0.5 (q without token 0) and rejected by 0.7; the residual
        // max(0, r − [0, 0.5, 0.5]) is token 1 alone. Drawn i.i.d., node 2 would pass with
        // min(1, 0.25 / 0.2) = 1.
        let uniforms = StepUniforms {
            acceptance: vec![0.9, 0.7],
            final_draw: 0.99,
        };
        let run = |second| {
            let proposal = HostProposal::PerChild {
                q: Some(q.clone()),
                draws: vec![ChildDraw::Fixed, ChildDraw::WithoutReplacement, second],
            };
            walk(&tree, &target, &proposal, &mut UniformChooser(&uniforms)).unwrap()
        };
        assert_eq!(
            run(ChildDraw::WithoutReplacement),
            Verdict {
                accepted: vec![],
                next_token: 1
            }
        );
        assert_eq!(run(ChildDraw::Iid).accepted, vec![2]);
    }

    #[test]
    fn per_child_structure_errors() {
        let mut tree = TokenTree::new(0);
        tree.push(ROOT, 1).unwrap();
        tree.push(ROOT, 1).unwrap();
        let target = vec![vec![0.5, 0.5]; 3];
        let uniforms = StepUniforms {
            acceptance: vec![0.5, 0.5],
            final_draw: 0.5,
        };
        let run = |q: Option<Vec<Vec<f64>>>, draws: Vec<ChildDraw>| {
            let proposal = HostProposal::PerChild { q, draws };
            walk(&tree, &target, &proposal, &mut UniformChooser(&uniforms))
        };
        let (iid, wor, fixed) = (
            ChildDraw::Iid,
            ChildDraw::WithoutReplacement,
            ChildDraw::Fixed,
        );
        assert!(matches!(
            run(None, vec![fixed, iid, fixed]),
            Err(SpecError::Shape(_))
        ));
        assert!(matches!(
            run(Some(vec![]), vec![fixed, fixed, wor]),
            Err(SpecError::Shape(_))
        ));
        assert!(matches!(
            run(None, vec![fixed, fixed]),
            Err(SpecError::Shape(_))
        ));
        assert_eq!(
            run(Some(vec![vec![0.5, 0.5]]), vec![fixed, wor, wor]),
            Err(SpecError::RepeatedDraw { node: 2, token: 1 })
        );
        assert_eq!(
            run(Some(vec![vec![1.0, 0.0]]), vec![fixed, fixed, iid]),
            Err(SpecError::ImpossibleDraft { node: 2, token: 1 })
        );
        // Two fixed candidates, or a fixed one and a draw, may share a token.
        assert!(run(None, vec![fixed, fixed, fixed]).is_ok());
        assert!(run(Some(vec![vec![0.5, 0.5]]), vec![fixed, wor, iid]).is_ok());
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
