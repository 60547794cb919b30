//! Candidates from a draft model, expanded one level of the tree per forward pass on the
//! draft's own KV cache (SpecInfer's expansion; EAGLE-2's choice of which nodes to expand).

use std::time::Instant;

use burn::tensor::{Tensor, activation::softmax, backend::Backend};
use spec_core::length::{AcceptanceByConfidence, AcceptanceRate, LengthController};
use spec_core::rng::SpecRng;
use spec_core::sampling::{SamplingConfig, probabilities};
use spec_core::tree::{ChildDraw, NodeId, ROOT, TokenTree};
use spec_engine::EngineError;
use spec_runtime::{ForwardRequest, LogitRows};
use spec_sampling::DraftRunner;

use crate::candidates::Candidates;
use crate::provenance::{Proposer, Provenance};
use crate::shape::TreeShape;
use crate::sizing::DraftCosts;

/// How far and how wide the draft model expands a tree.
#[derive(Debug, Clone, PartialEq)]
pub struct Expansion {
    /// A fixed shape (every node at depth `d` gets `shape[d]` children), or `None` to expand
    /// the nodes worth it, up to the limits below.
    pub shape: Option<TreeShape>,
    /// The deepest a drafted node goes.
    pub depth: usize,
    /// Nodes expanded per level at most (EAGLE-2's beam).
    pub beam: usize,
    /// Candidate children of each expanded node.
    pub branch: usize,
}

/// A step's expansion: what it spent and what the verifier and the learning need.
#[derive(Debug)]
pub(crate) struct Expanded<B: Backend> {
    /// Drafting cost in one-token target steps (by the measured costs).
    pub(crate) spent: f64,
    /// Draft distributions of the expanded nodes, where children were drawn from them.
    pub(crate) q: Option<Tensor<B, 2>>,
    pub(crate) forwards: usize,
}

/// The draft model with its cache, costs and calibration.
#[derive(Debug)]
pub(crate) struct DraftSource<B: Backend> {
    runner: DraftRunner<B>,
    costs: DraftCosts,
    /// Acceptance of the draft's candidates by the probability it gave them.
    calibration: AcceptanceByConfidence,
    /// Acceptance of the draft's most likely child of a node, which prices an expansion.
    top_child: AcceptanceRate,
    /// The tree nodes fed after the root in the step in flight, in cache order.
    fed_nodes: Vec<NodeId>,
}

/// Calibration buckets: tenths of the draft's probability of a candidate.
const BUCKETS: usize = 10;
/// Memory of each bucket (about 50 trials): the draft's calibration against the target
/// drifts with the text slowly.
const DECAY: f64 = 0.98;

impl<B: Backend> DraftSource<B> {
    pub(crate) fn new(runner: DraftRunner<B>, cost_prior: Option<f64>) -> Self {
        Self {
            runner,
            costs: DraftCosts::with_prior(cost_prior),
            calibration: AcceptanceByConfidence::new(BUCKETS, DECAY),
            top_child: AcceptanceRate::with_decay(DECAY),
            fed_nodes: Vec::new(),
        }
    }

    pub(crate) fn begin(&mut self, prompt_len: usize) {
        self.runner.begin(prompt_len);
        self.fed_nodes.clear();
    }

    /// `c`: a draft row over a one-token target step.
    pub(crate) fn row_cost(&self, lengths: &LengthController) -> f64 {
        self.costs.row_cost(lengths)
    }

    /// The chance that a candidate the draft gave `probability` is accepted.
    pub(crate) fn chance(&self, probability: f64) -> f64 {
        self.calibration.alpha(probability)
    }

    /// Expands `candidates` (holding only the root, the context's last token) from the draft
    /// model, at most `max_depth` deep.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn expand(
        &mut self,
        candidates: &mut Candidates,
        provenance: &mut Provenance,
        context: &[u32],
        max_depth: usize,
        expansion: &Expansion,
        sampling: &SamplingConfig,
        rng: &mut SpecRng,
        lengths: &LengthController,
    ) -> Result<Expanded<B>, EngineError> {
        self.fed_nodes.clear();
        let mut out = Expanded {
            spent: 0.0,
            q: None,
            forwards: 0,
        };
        let Some((&root, before)) = context.split_last() else {
            return Ok(out);
        };
        self.runner.roll_back_to(before);
        let missing = before[self.runner.fed().len()..].to_vec();
        let depth_limit = expansion.depth.min(max_depth);
        if depth_limit == 0 || self.runner.room() < missing.len() + 1 + expansion.beam {
            return Ok(out);
        }
        // The root, after whatever the draft has not seen of the context, in one pass.
        let mut input = missing.clone();
        input.push(root);
        let mut started = Instant::now();
        let Some(mut rows) = self.runner.feed(&input, true)? else {
            return Ok(out);
        };
        out.forwards += 1;
        let mut q_rows: Vec<Tensor<B, 2>> = Vec::new();
        let mut level = vec![ROOT];
        let mut depth = 0;
        loop {
            self.add_children(
                candidates,
                provenance,
                &level,
                rows,
                depth,
                expansion,
                sampling,
                rng,
                &mut q_rows,
            )?;
            // A level's time (its forward and the choice of children); the first level's says
            // nothing of one row when it also caught up on the context.
            if depth > 0 || missing.is_empty() {
                self.costs
                    .record(level.len(), started.elapsed().as_secs_f64());
            }
            out.spent += self.costs.level_cost(level.len(), lengths);
            depth += 1;
            if depth >= depth_limit {
                break;
            }
            level = self.to_expand(candidates, depth, expansion, lengths);
            if level.is_empty() || self.runner.room() < self.fed_nodes.len() + level.len() {
                break;
            }
            started = Instant::now();
            rows = self.feed_level(candidates.tree(), &level)?;
            out.forwards += 1;
        }
        if !q_rows.is_empty() {
            out.q = Some(self.runner.pad_q(Tensor::cat(q_rows, 0)));
        }
        Ok(out)
    }

    /// The children of each node of `level` from its row of `logits`: the draft's most likely
    /// tokens as fixed candidates under greedy settings; otherwise tokens drawn without
    /// replacement from the row's distribution under the run's settings (`q`, handed to the
    /// verifier). Each child's value is its parent's times the calibrated chance of its
    /// probability.
    #[allow(clippy::too_many_arguments)]
    fn add_children(
        &mut self,
        candidates: &mut Candidates,
        provenance: &mut Provenance,
        level: &[NodeId],
        logits: Tensor<B, 2>,
        depth: usize,
        expansion: &Expansion,
        sampling: &SamplingConfig,
        rng: &mut SpecRng,
        q_rows: &mut Vec<Tensor<B, 2>>,
    ) -> Result<(), EngineError> {
        let branch = match &expansion.shape {
            Some(shape) => shape.children_at(depth),
            None => expansion.branch,
        };
        let logits = self.runner.fit_logits(logits);
        let greedy = sampling.is_greedy();
        let q = if greedy {
            softmax(logits, 1)
        } else {
            probabilities(logits, sampling)?
        };
        let vocab = q.dims()[1];
        let host: Vec<f32> = q
            .clone()
            .into_data()
            .to_vec()
            .map_err(|e| EngineError::Drafter(format!("reading draft rows: {e:?}")))?;
        for (i, &node) in level.iter().enumerate() {
            let row = &host[i * vocab..(i + 1) * vocab];
            let parent_value = candidates.value(node);
            if greedy {
                for (token, p) in top_k(row, branch) {
                    let value = parent_value * self.chance(p);
                    let child = candidates.add_fixed(node, token, value)?;
                    provenance.add(child, Proposer::Draft { probability: p });
                }
            } else {
                let row_index = q_rows.len();
                q_rows.push(q.clone().narrow(0, i, 1));
                candidates.set_q_row(node, row_index);
                for (token, p) in draw_without_replacement(row, branch, rng) {
                    let value = parent_value * self.chance(p);
                    let child =
                        candidates.add_drawn(node, token, ChildDraw::WithoutReplacement, value)?;
                    provenance.add(child, Proposer::Draft { probability: p });
                }
            }
        }
        Ok(())
    }

    /// The nodes at `depth` to expand next: all of them for a fixed shape; otherwise the draft's
    /// candidates of highest value, up to the beam, while one more row is expected to pay: the
    /// chance of reaching the node times its best child's acceptance against what a row adds to
    /// the level and a node to the verification.
    fn to_expand(
        &self,
        candidates: &Candidates,
        depth: usize,
        expansion: &Expansion,
        lengths: &LengthController,
    ) -> Vec<NodeId> {
        let tree = candidates.tree();
        let mut at_depth: Vec<NodeId> = (1..tree.len())
            .filter(|&n| tree.depth(n) == depth)
            .collect();
        if let Some(shape) = &expansion.shape {
            if shape.children_at(depth) == 0 {
                return Vec::new();
            }
            return at_depth;
        }
        at_depth.sort_by(|&a, &b| candidates.value(b).total_cmp(&candidates.value(a)));
        let best_child = self.top_child.alpha();
        let node_cost = lengths.verification_cost(2) - 1.0;
        let mut chosen = Vec::new();
        for node in at_depth {
            if chosen.len() >= expansion.beam {
                break;
            }
            let gain = candidates.value(node) * best_child;
            let cost = self.costs.marginal_row_cost(chosen.len(), lengths) + node_cost;
            if gain <= cost {
                break;
            }
            chosen.push(node);
        }
        // Fed in node order, so the cache's order follows the tree's.
        chosen.sort_unstable();
        chosen
    }

    /// Feeds `level`'s nodes after the root and the nodes fed before, each attending to its
    /// ancestors only; returns their logits.
    fn feed_level(
        &mut self,
        tree: &TokenTree,
        level: &[NodeId],
    ) -> Result<Tensor<B, 2>, EngineError> {
        let root_position = self.runner.fed().len() - 1;
        let columns: Vec<NodeId> = self.fed_nodes.iter().chain(level).copied().collect();
        let span = self.fed_nodes.len();
        let mut mask = Vec::with_capacity(level.len() * columns.len());
        for &node in level {
            let ancestors = tree.path_to(node);
            mask.extend(columns.iter().map(|c| ancestors.contains(c)));
        }
        let tokens: Vec<u32> = level.iter().map(|&n| tree.token(n)).collect();
        let tokens = self.runner.embeddable(&tokens);
        let positions: Vec<usize> = level
            .iter()
            .map(|&n| root_position + tree.depth(n))
            .collect();
        let out = self.runner.run(
            ForwardRequest::tokens(&tokens)
                .positions(&positions)
                .mask_with_cached(span, &mask)
                .logits(LogitRows::All),
        )?;
        self.fed_nodes.extend_from_slice(level);
        out.logits
            .ok_or_else(|| EngineError::Drafter("the draft returned no logits".into()))
    }

    /// After the step: keeps in the draft's cache the accepted nodes it was fed (`accepted`:
    /// the accepted path in the assembled tree's nodes), drops the rest of the tree.
    pub(crate) fn keep_path(
        &mut self,
        tree: &Candidates,
        accepted: &[NodeId],
    ) -> Result<(), EngineError> {
        let mut offsets = Vec::new();
        let mut tokens = Vec::new();
        for &node in accepted {
            let Some(offset) = self.fed_nodes.iter().position(|&n| n == node) else {
                break;
            };
            offsets.push(offset);
            tokens.push(tree.tree().token(node));
        }
        if self.fed_nodes.is_empty() {
            return Ok(());
        }
        self.fed_nodes.clear();
        self.runner.keep_fed(&offsets, &tokens)
    }

    /// Learns from one tested candidate of the draft's.
    pub(crate) fn record(&mut self, probability: f64, accepted: bool, top: bool) {
        self.calibration.record(probability, accepted);
        if top {
            self.top_child.record_trial(accepted);
        }
    }

    /// Report figures: the draft row's measured cost and the top child's acceptance.
    pub(crate) fn estimates(&self, lengths: &LengthController) -> Vec<(&'static str, f64)> {
        vec![
            ("draft_row_cost", self.row_cost(lengths)),
            ("top_child_alpha", self.top_child.alpha()),
        ]
    }
}

/// The `k` most probable tokens of `row`, most probable first (lower id on ties).
fn top_k(row: &[f32], k: usize) -> Vec<(u32, f64)> {
    let mut ids: Vec<u32> = (0..row.len() as u32).collect();
    let k = k.min(ids.len());
    if k == 0 {
        return Vec::new();
    }
    let by_probability =
        |a: &u32, b: &u32| row[*b as usize].total_cmp(&row[*a as usize]).then(a.cmp(b));
    ids.select_nth_unstable_by(k - 1, by_probability);
    ids.truncate(k);
    ids.sort_by(by_probability);
    ids.into_iter()
        .map(|t| (t, f64::from(row[t as usize])))
        .filter(|&(_, p)| p > 0.0)
        .collect()
}

/// `k` tokens drawn one after another from `row` without replacement (each draw from the row
/// with the tokens drawn before removed and the rest renormalized), with their probabilities in
/// `row`; fewer where the row has fewer tokens of nonzero mass. The verifier's rule for
/// `ChildDraw::WithoutReplacement` assumes exactly these draws.
fn draw_without_replacement(row: &[f32], k: usize, rng: &mut SpecRng) -> Vec<(u32, f64)> {
    let mut drawn: Vec<(u32, f64)> = Vec::with_capacity(k);
    let mut left: f64 = row.iter().map(|&p| f64::from(p)).sum();
    for _ in 0..k {
        if left <= 0.0 {
            break;
        }
        let target = rng.uniform() * left;
        let mut cumulative = 0.0;
        let mut pick = None;
        for (t, &p) in row.iter().enumerate() {
            let p = f64::from(p);
            if p <= 0.0 || drawn.iter().any(|&(d, _)| d as usize == t) {
                continue;
            }
            cumulative += p;
            pick = Some((t as u32, p));
            if cumulative > target {
                break;
            }
        }
        let Some((token, p)) = pick else { break };
        left -= p;
        drawn.push((token, p));
    }
    drawn
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn top_k_orders_by_probability_then_id() {
        let row = [0.1, 0.4, 0.0, 0.4, 0.1];
        assert_eq!(
            top_k(&row, 3),
            vec![(1, 0.4f32 as f64), (3, 0.4f32 as f64), (0, 0.1f32 as f64)]
        );
        // Tokens of no mass are never candidates.
        assert_eq!(top_k(&[1.0, 0.0], 2), vec![(0, 1.0)]);
    }

    #[test]
    fn draws_without_replacement_follow_the_sequential_law() {
        // P(first = a, second = b) = q(a) · q(b) / (1 − q(a)).
        let row = [0.5f32, 0.3, 0.2];
        let mut rng = SpecRng::new(3);
        let n = 200_000;
        let mut counts = [[0u32; 3]; 3];
        for _ in 0..n {
            let d = draw_without_replacement(&row, 2, &mut rng);
            assert_eq!(d.len(), 2);
            assert_ne!(d[0].0, d[1].0);
            counts[d[0].0 as usize][d[1].0 as usize] += 1;
        }
        for a in 0..3 {
            for b in 0..3 {
                let want = if a == b {
                    0.0
                } else {
                    f64::from(row[a]) * f64::from(row[b]) / (1.0 - f64::from(row[a]))
                };
                let got = f64::from(counts[a][b]) / f64::from(n);
                // Five standard deviations of a proportion over 200,000 draws.
                let sd = (want * (1.0 - want) / f64::from(n)).sqrt();
                assert!(
                    (got - want).abs() <= 5.0 * sd + 1e-9,
                    "({a}, {b}): {got} vs {want}"
                );
            }
        }
        // A row with fewer tokens of mass than asked for gives them all.
        assert_eq!(draw_without_replacement(&[0.0, 1.0], 3, &mut rng).len(), 1);
    }
}
