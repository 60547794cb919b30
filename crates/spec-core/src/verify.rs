//! Verification of drafted tokens on a burn backend: chains (Leviathan et al. 2023; Chen et al.
//! 2023) and trees (SpecInfer, Miao et al. 2024), greedy and sampled.
//!
//! The rule is stated on [`crate::reference::walk`], which this module reproduces on the same
//! uniforms. For [`Proposal::Sampled`] and [`Proposal::Deterministic`] the full-vocabulary
//! distributions stay on the device; a step reads back two small tensors: the target's and
//! draft's probabilities of the drafted tokens (one per child), then the final token drawn on the
//! device by inverse CDF.
//!
//! [`Proposal::PerChild`] reads back whole rows, in one transaction: the target's row of every
//! internal node and the draft's row of every node with a drawn (not fixed) child, `(internal +
//! drawn) × vocab` f32 values (a tree with 4 internal nodes over Qwen's 151,936-entry vocabulary:
//! 8 rows, 4.9 MB). The walk then runs on the host, in f64 on those f32 values, with the
//! reference's rule and uniforms; a step that rejects every child of a node draws its last token
//! there on the host, and a step that reaches a leaf draws the bonus token on the device from
//! the leaf's row (a second read back of one token).
//!
//! # Exactness of the per-child rule
//! Fix a node whose children `x_1, …, x_m` are tried in order, child `x_i` drawn from `q_i` given
//! the earlier ones: the draft's row for [`ChildDraw::Iid`], that row without the earlier
//! without-replacement siblings for [`ChildDraw::WithoutReplacement`], the point mass `δ_x` for
//! [`ChildDraw::Fixed`] (for which `min(1, r(x) / q_i(x))` is `r(x)` and `norm(max(0, r − q_i))`
//! is `r` without `x`, renormalized: the fixed rule is this one). Claim: trying `x_i, …, x_m`
//! with residual `r` ends in a token of law `r`, for every `r`. By induction on the children
//! left: with none, the step draws from `r`. Otherwise `x_i = x` comes with probability
//! `q_i(x)` and is accepted with probability `min(1, r(x) / q_i(x))`, so `x` is emitted this way
//! with probability `min(r, q_i)(x)`; the rest, `1 − Σ min(r, q_i) = Σ max(0, r − q_i)`,
//! continues with `r' = norm(max(0, r − q_i))` whatever `x_i` was (`r'` depends on `q_i`, not
//! on `x_i`; the later draws may depend on `x_i`, as without-replacement draws do, and so may
//! the number of children), which by induction ends in law `r'`. In all:
//! `min(r, q_i) + Σ max(0, r − q_i) · r' = min(r, q_i) + max(0, r − q_i) = r`. Starting from the
//! target's `p` at the node, the first token has law `p`; an accepted child starts the same walk
//! at its own node, so every token of the step follows the target's conditional. Where
//! `max(0, r − q_i)` has no mass, rejection has probability 0 and `r'` is never used.

use burn::tensor::{IndexingUpdateOp, Int, Tensor, TensorData, Transaction, backend::Backend};

use crate::error::{Result, Source, SpecError};
use crate::reference::{self, Draws, UniformChooser, walk_rows};
use crate::rng::{SpecRng, StepUniforms, accepts};
use crate::sampling::{
    SamplingConfig, inverse_cdf, probabilities_unchecked, read_greedy, read_samples, read2,
};
use crate::tree::{ChildDraw, NodeId, ROOT, TokenTree};

/// Below this mass (f32 on the device) the residual of a sampled proposal is taken to have
/// rounded away and `p` is used instead; see [`crate::reference::RESIDUAL_FLOOR_F64`] for why.
/// Deterministic proposals have no floor (see `verify_deterministic`).
pub const RESIDUAL_FLOOR_F32: f32 = 1e-6;

/// How the children of the tree's nodes were proposed.
#[derive(Debug, Clone)]
pub enum Proposal<B: Backend> {
    /// The children of node `n` were drawn i.i.d. from row `n` of these draft distributions
    /// `[rows, vocab]` (from [`crate::sampling::probabilities`] with the same settings). Rows
    /// are needed for every node that has children; a chain of `K` drafts needs `K` rows.
    Sampled(Tensor<B, 2>),
    /// The children are fixed candidates (prompt lookup, top-k heads): each is a point mass.
    Deterministic,
    /// Each node drawn its own way: `draws[n]` says how node `n` was drawn from its parent
    /// (`draws[ROOT]` is unused; one entry per tree node). `q` `[rows, vocab]` holds the draft's
    /// distribution at node `n` in row `n` for every node with a child that is not
    /// [`ChildDraw::Fixed`]; it may be `None` when every drafted node is fixed. Siblings may mix
    /// the three ways; the module docs prove the rule exact.
    PerChild {
        q: Option<Tensor<B, 2>>,
        draws: Vec<ChildDraw>,
    },
}

/// Checks the structure of a per-child proposal: one draw per tree node, a draft row for every
/// node with a drawn child (`q_rows`: the rows given, `None` for no draft distributions), and
/// distinct tokens among the siblings drawn without replacement.
pub(crate) fn check_per_child(
    tree: &TokenTree,
    draws: &[ChildDraw],
    q_rows: Option<usize>,
) -> Result<()> {
    if draws.len() != tree.len() {
        return Err(SpecError::Shape(format!(
            "{} child draws for a tree of {} nodes",
            draws.len(),
            tree.len()
        )));
    }
    if let Some(&node) = drawn_parents(tree, draws).last() {
        match q_rows {
            None => {
                return Err(SpecError::Shape(format!(
                    "node {node} has drawn children but the proposal has no draft distributions"
                )));
            }
            Some(rows) if rows <= node => {
                return Err(SpecError::Shape(format!(
                    "draft distributions have {rows} rows; node {node} has drawn children"
                )));
            }
            Some(_) => {}
        }
    }
    for node in 0..tree.len() {
        let mut drawn: Vec<u32> = Vec::new();
        for &child in tree.children(node) {
            if draws[child] == ChildDraw::WithoutReplacement {
                let token = tree.token(child);
                if drawn.contains(&token) {
                    return Err(SpecError::RepeatedDraw { node: child, token });
                }
                drawn.push(token);
            }
        }
    }
    Ok(())
}

/// Nodes with a child that is not fixed, in node order: those whose draft row is read.
fn drawn_parents(tree: &TokenTree, draws: &[ChildDraw]) -> Vec<NodeId> {
    tree.internal_nodes()
        .into_iter()
        .filter(|&n| {
            tree.children(n)
                .iter()
                .any(|&c| draws[c] != ChildDraw::Fixed)
        })
        .collect()
}

/// The outcome of one verification step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    /// Accepted nodes from the root's child down; a path in the tree.
    pub accepted: Vec<NodeId>,
    /// The token that ends the step: drawn from the residual where a draft was rejected, or the
    /// bonus token after a leaf. Never a drafted node.
    pub next_token: u32,
}

impl Verdict {
    /// Tokens this step appends to the sequence: the accepted drafts, then the next token.
    pub fn tokens(&self, tree: &TokenTree) -> Vec<u32> {
        self.accepted
            .iter()
            .map(|&n| tree.token(n))
            .chain(std::iter::once(self.next_token))
            .collect()
    }

    /// The last accepted node, or the root when nothing was accepted.
    pub fn last_node(&self) -> NodeId {
        self.accepted.last().copied().unwrap_or(ROOT)
    }
}

/// Verifies drafts with one set of sampling settings (validated once, at construction).
#[derive(Debug, Clone)]
pub struct Verifier {
    config: SamplingConfig,
}

impl Verifier {
    pub fn new(config: SamplingConfig) -> Result<Self> {
        config.validate()?;
        Ok(Self { config })
    }

    pub fn config(&self) -> &SamplingConfig {
        &self.config
    }

    /// Verifies the chain `drafted` (K tokens). `target_logits` is `[K + 1, vocab]`: row `i` is
    /// the target's logits after the context and `drafted[..i]`. A sampled proposal holds the
    /// draft's `[K, vocab]` distributions.
    pub fn verify_chain<B: Backend>(
        &self,
        drafted: &[u32],
        target_logits: Tensor<B, 2>,
        proposal: Proposal<B>,
        rng: &mut SpecRng,
    ) -> Result<Verdict> {
        // Verification never reads the root's token.
        let tree = TokenTree::chain(0, drafted);
        self.verify_tree(&tree, target_logits, proposal, rng)
    }

    /// Verifies `tree`. `target_logits` is `[tree.len(), vocab]`: row `n` is the target's logits
    /// after the path root..=n, as one forward pass with the tree's ancestor mask produces them.
    ///
    /// Draws exactly `tree.len()` uniforms from `rng`, whatever is accepted.
    pub fn verify_tree<B: Backend>(
        &self,
        tree: &TokenTree,
        target_logits: Tensor<B, 2>,
        proposal: Proposal<B>,
        rng: &mut SpecRng,
    ) -> Result<Verdict> {
        let [rows, vocab] = target_logits.dims();
        if rows != tree.len() {
            return Err(SpecError::Shape(format!(
                "target logits have {rows} rows for a tree of {} nodes",
                tree.len()
            )));
        }
        if let Some(&token) = tree.tokens()[1..].iter().find(|&&t| t as usize >= vocab) {
            return Err(SpecError::TokenOutOfVocabulary { token, vocab });
        }
        if let Proposal::Sampled(q) = &proposal {
            let [q_rows, q_vocab] = q.dims();
            let needed = tree.internal_nodes().last().map_or(0, |n| n + 1);
            if q_vocab != vocab || q_rows < needed {
                return Err(SpecError::Shape(format!(
                    "draft distributions are [{q_rows}, {q_vocab}]; this tree needs at least [{needed}, {vocab}]"
                )));
            }
        }
        if let Proposal::PerChild { q, draws } = &proposal {
            let dims = q.as_ref().map(Tensor::dims);
            check_per_child(tree, draws, dims.map(|[rows, _]| rows))?;
            if let Some([q_rows, q_vocab]) = dims
                && q_vocab != vocab
            {
                return Err(SpecError::Shape(format!(
                    "draft distributions are [{q_rows}, {q_vocab}]; the target's vocabulary has {vocab} entries"
                )));
            }
        }
        let uniforms = rng.step_uniforms(tree.len());
        if self.config.is_greedy() {
            return verify_greedy(tree, target_logits);
        }
        let target = probabilities_unchecked(target_logits, &self.config);
        match proposal {
            Proposal::Sampled(q) => verify_sampled(tree, target, q, &uniforms),
            Proposal::Deterministic => verify_deterministic(tree, target, &uniforms),
            Proposal::PerChild { q, draws } => verify_per_child(tree, target, q, &draws, &uniforms),
        }
    }
}

fn verify_greedy<B: Backend>(tree: &TokenTree, target_logits: Tensor<B, 2>) -> Result<Verdict> {
    let best = read_greedy(target_logits, Source::Target)?;
    let mut node = ROOT;
    let mut accepted = Vec::new();
    while let Some(&child) = tree
        .children(node)
        .iter()
        .find(|&&c| tree.token(c) == best[node])
    {
        accepted.push(child);
        node = child;
    }
    Ok(Verdict {
        accepted,
        next_token: best[node],
    })
}

/// Column `k` of the children's tokens as a `[rows, 1]` index: row `n` holds the token of node
/// `n`'s child `k`, or 0 where there is none.
///
/// Every gather gets an index tensor of its own: burn 0.21's wgpu fusion mis-evaluates a gather
/// whose index tensor has a second consumer (see `docs/notes/wgpu-lavapipe.md`, "A gather whose
/// index tensor has a second consumer reads a stale index").
fn child_column<B: Backend>(
    tree: &TokenTree,
    rows: usize,
    k: usize,
    device: &B::Device,
) -> Tensor<B, 2, Int> {
    let tokens: Vec<i64> = (0..rows)
        .map(|n| {
            let children = if n < tree.len() {
                tree.children(n)
            } else {
                &[]
            };
            children.get(k).map_or(0, |&c| i64::from(tree.token(c)))
        })
        .collect();
    Tensor::from_data(TensorData::new(tokens, [rows, 1]), device)
}

/// The rows `0..=last internal node`, the only ones whose children are looked up.
fn parent_rows(tree: &TokenTree) -> usize {
    tree.internal_nodes().last().map_or(0, |n| n + 1)
}

/// `max(0, r − q)` row by row, or `r` where that has no mass: the weights of the residual
/// distribution, not normalized (enough for [`draw`]).
fn residual_weights<B: Backend>(r: Tensor<B, 2>, q: Tensor<B, 2>) -> Tensor<B, 2> {
    let dims = r.dims();
    let d = (r.clone() - q).clamp_min(0.0);
    let empty = d.clone().sum_dim(1).lower_equal_elem(RESIDUAL_FLOOR_F32);
    d.mask_where(empty.expand(dims), r)
}

/// `norm(max(0, r − q))` row by row, or `r` where that has no mass.
fn residual<B: Backend>(r: Tensor<B, 2>, q: Tensor<B, 2>) -> Tensor<B, 2> {
    let dims = r.dims();
    let d = (r.clone() - q).clamp_min(0.0);
    let mass = d.clone().sum_dim(1);
    let empty = mass.clone().lower_equal_elem(RESIDUAL_FLOOR_F32);
    (d / mass).mask_where(empty.expand(dims), r)
}

/// Draws the final token from the weights `row` `[1, vocab]`.
fn draw<B: Backend>(row: Tensor<B, 2>, uniforms: &StepUniforms) -> Result<u32> {
    let (tokens, totals) = inverse_cdf(row, &[uniforms.final_draw]);
    Ok(read_samples(tokens, totals, Source::Target)?[0])
}

fn verify_sampled<B: Backend>(
    tree: &TokenTree,
    target: Tensor<B, 2>,
    q: Tensor<B, 2>,
    uniforms: &StepUniforms,
) -> Result<Verdict> {
    let device = target.device();
    let rows = parent_rows(tree);
    let width = tree.max_children();
    let mut ratios = Vec::new();
    if rows > 0 {
        // Column k: target residual after k rejections and draft probability, at child k. The
        // first column gathers from the whole tensors (flex copies a row range before gathering
        // from it); later ones from the residuals of the parent rows.
        let (target_rows, draft_rows) = (target.dims()[0], q.dims()[0]);
        let first = |t: Tensor<B, 2>, n: usize| {
            t.gather(1, child_column(tree, n, 0, &device))
                .narrow(0, 0, rows)
        };
        let mut r_at = vec![first(target.clone(), target_rows)];
        let mut q_at = vec![first(q.clone(), draft_rows)];
        if width > 1 {
            let q_rows = q.clone().narrow(0, 0, rows);
            let mut r = target.clone().narrow(0, 0, rows);
            for k in 1..width {
                r = residual(r, q_rows.clone());
                r_at.push(r.clone().gather(1, child_column(tree, rows, k, &device)));
                q_at.push(
                    q_rows
                        .clone()
                        .gather(1, child_column(tree, rows, k, &device)),
                );
            }
        }
        let [r_at, q_at] = read2(
            Transaction::default()
                .register(Tensor::cat(r_at, 1))
                .register(Tensor::cat(q_at, 1)),
        );
        ratios = r_at.iter::<f64>().zip(q_at.iter::<f64>()).collect();
    }

    let mut node = ROOT;
    let mut accepted = Vec::new();
    let rejected = 'descend: loop {
        let children = tree.children(node);
        for (k, &child) in children.iter().enumerate() {
            let (r_c, q_c) = ratios[node * width + k];
            if r_c.is_nan() {
                return Err(SpecError::NonFiniteLogits {
                    what: Source::Target,
                    row: node,
                });
            }
            if q_c.is_nan() {
                return Err(SpecError::NonFiniteLogits {
                    what: Source::Draft,
                    row: node,
                });
            }
            if q_c <= 0.0 {
                return Err(SpecError::ImpossibleDraft {
                    node: child,
                    token: tree.token(child),
                });
            }
            if accepts(uniforms.for_node(child), (r_c / q_c).min(1.0)) {
                accepted.push(child);
                node = child;
                continue 'descend;
            }
        }
        break children.len();
    };

    let mut row = target.narrow(0, node, 1);
    if rejected > 0 {
        let q_row = q.narrow(0, node, 1);
        for _ in 1..rejected {
            row = residual(row, q_row.clone());
        }
        row = residual_weights(row, q_row);
    }
    Ok(Verdict {
        accepted,
        next_token: draw(row, uniforms)?,
    })
}

/// Point-mass candidates. The residual after rejecting candidates is `p` restricted to the
/// tokens not rejected, renormalized (exact, no floor): candidate `k` of a node is accepted with
/// probability `p(c) / m_k`, where `m_k` is the device's own sum of the node's row without the
/// tokens of candidates `0..k` (never `1 − Σ p`, which cancels to noise when the rejected tokens
/// held nearly all the mass), and the final draw is from the row with those tokens zeroed.
///
/// An empty residual is unreachable: a row summed in f32 is at least each of its entries, so a
/// rejection (`u ≥ p(c) / m_k` with `u < 1`) needs `m_k > p(c)`, which needs another token with
/// mass > 0 outside the rejected ones; it stays in the final row.
fn verify_deterministic<B: Backend>(
    tree: &TokenTree,
    target: Tensor<B, 2>,
    uniforms: &StepUniforms,
) -> Result<Verdict> {
    let device = target.device();
    let rows = parent_rows(tree);
    let width = tree.max_children();
    let (mut p_at, mut mass_at) = (Vec::new(), Vec::new());
    if rows > 0 {
        // The whole tensor is gathered from and summed, not its parent rows: flex copies a row
        // range before gathering from it. Rows past `rows` and columns past a node's children
        // are never read.
        let target_rows = target.dims()[0];
        let column = |k| child_column(tree, target_rows, k, &device);
        let p_columns: Vec<_> = (0..width)
            .map(|k| target.clone().gather(1, column(k)).narrow(0, 0, rows))
            .collect();
        // Column k: each row's mass without its first k children's tokens. Zeroing adds minus
        // the entry (x + (−x) is exactly 0); a repeated token gathers its 0 and stays 0.
        let mut left = target.clone();
        let mut masses = vec![left.clone().sum_dim(1).narrow(0, 0, rows)];
        for k in 1..width {
            let at = left.clone().gather(1, column(k - 1));
            left = left.scatter(1, column(k - 1), at.neg(), IndexingUpdateOp::Add);
            masses.push(left.clone().sum_dim(1).narrow(0, 0, rows));
        }
        let [p, masses] = read2(
            Transaction::default()
                .register(Tensor::cat(p_columns, 1))
                .register(Tensor::cat(masses, 1)),
        );
        p_at = p.iter::<f64>().collect();
        mass_at = masses.iter::<f64>().collect();
    }

    let mut node = ROOT;
    let mut accepted = Vec::new();
    // The rejected candidates of the current node and their probabilities.
    let mut removed: Vec<(u32, f64)> = Vec::new();
    'descend: loop {
        removed.clear();
        for (k, &child) in tree.children(node).iter().enumerate() {
            let (p_c, mass) = (p_at[node * width + k], mass_at[node * width + k]);
            if p_c.is_nan() || mass.is_nan() {
                return Err(SpecError::NonFiniteLogits {
                    what: Source::Target,
                    row: node,
                });
            }
            let token = tree.token(child);
            let seen = removed.iter().any(|&(t, _)| t == token);
            // A repeated token has no mass left. `mass ≥ p_c`, and `mass > 0` whenever a child
            // is tested (see above); the guard keeps 0 / 0 out all the same.
            let probability = if seen || mass <= 0.0 {
                0.0
            } else {
                (p_c / mass).min(1.0)
            };
            if accepts(uniforms.for_node(child), probability) {
                accepted.push(child);
                node = child;
                continue 'descend;
            }
            if !seen {
                removed.push((token, p_c));
            }
        }
        break;
    }

    let mut row = target.narrow(0, node, 1);
    if !removed.is_empty() {
        // Zero the removed tokens by adding minus their probabilities (x + (−x) is exactly 0);
        // the probabilities are the device's own values, read back above.
        let n = removed.len();
        let tokens: Vec<i64> = removed.iter().map(|&(t, _)| i64::from(t)).collect();
        let minus: Vec<f32> = removed.iter().map(|&(_, p)| -(p as f32)).collect();
        let tokens = Tensor::<B, 2, Int>::from_data(TensorData::new(tokens, [1, n]), &device);
        let minus = Tensor::<B, 2>::from_data(TensorData::new(minus, [1, n]), &device);
        row = row.scatter(1, tokens, minus, IndexingUpdateOp::Add);
    }
    Ok(Verdict {
        accepted,
        next_token: draw(row, uniforms)?,
    })
}

/// Children drawn each their own way: the rows the walk may read are read back in one
/// transaction and walked on the host with the reference's rule (see the module docs), with the
/// device's residual floor, [`RESIDUAL_FLOOR_F32`], since the rows carry f32 rounding.
fn verify_per_child<B: Backend>(
    tree: &TokenTree,
    target: Tensor<B, 2>,
    q: Option<Tensor<B, 2>>,
    draws: &[ChildDraw],
    uniforms: &StepUniforms,
) -> Result<Verdict> {
    let device = target.device();
    let vocab = target.dims()[1];
    let internal = tree.internal_nodes();
    let drawn = drawn_parents(tree, draws);
    // Each select gets an index tensor of its own (see `child_column`).
    let index = |nodes: &[NodeId]| {
        let ids: Vec<i64> = nodes.iter().map(|&n| n as i64).collect();
        Tensor::<B, 1, Int>::from_data(TensorData::new(ids, [nodes.len()]), &device)
    };
    let mut target_rows = vec![Vec::new(); tree.len()];
    let mut q_rows = vec![Vec::new(); tree.len()];
    if !internal.is_empty() {
        let target_at = target.clone().select(0, index(&internal));
        let (target_data, q_data) = match &q {
            Some(q) if !drawn.is_empty() => {
                let [t, d] = read2(
                    Transaction::default()
                        .register(target_at)
                        .register(q.clone().select(0, index(&drawn))),
                );
                (t, Some(d))
            }
            _ => (target_at.into_data(), None),
        };
        scatter_rows(&mut target_rows, &internal, &target_data, vocab);
        if let Some(q_data) = &q_data {
            scatter_rows(&mut q_rows, &drawn, q_data, vocab);
        }
    }

    let walked = walk_rows(
        tree,
        &target_rows,
        q.is_some().then_some(q_rows.as_slice()),
        Draws::Each(draws),
        f64::from(RESIDUAL_FLOOR_F32),
        &mut UniformChooser(uniforms),
    )?;
    let next_token = match &walked.residual {
        Some(r) => {
            // Never empty: a rejection leaves mass (see `reference::remove_token` and the floor).
            let total: f64 = r.iter().sum();
            if !(total > 0.0 && total.is_finite()) {
                return Err(SpecError::NonFiniteLogits {
                    what: Source::Target,
                    row: walked.last_node(),
                });
            }
            reference::inverse_cdf(r, uniforms.final_draw) as u32
        }
        None => draw(target.narrow(0, walked.last_node(), 1), uniforms)?,
    };
    Ok(Verdict {
        accepted: walked.accepted,
        next_token,
    })
}

/// Puts the rows of `data` (`[nodes.len(), vocab]`) at `rows[nodes[i]]`, as f64.
fn scatter_rows(rows: &mut [Vec<f64>], nodes: &[NodeId], data: &TensorData, vocab: usize) {
    let values: Vec<f64> = data.iter::<f64>().collect();
    for (&node, row) in nodes.iter().zip(values.chunks(vocab)) {
        rows[node] = row.to_vec();
    }
}
