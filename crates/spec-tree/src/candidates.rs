//! A draft tree being assembled from several sources: the token tree, how each node was drawn,
//! and each node's estimated chance of being accepted, from which the tree is cut to size.

use burn::tensor::{Int, Tensor, TensorData, backend::Backend};
use spec_core::tree::{ChildDraw, NodeId, ROOT, TokenTree};
use spec_core::verify::Proposal;

use crate::error::{Result, TreeError};

/// One candidate node besides its token.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Node {
    draw: ChildDraw,
    /// Estimated probability that the target accepts the path to this node (1 for the root).
    value: f64,
    /// Row of this node's draft distribution in the drafter's `q` rows, where the draft model
    /// computed one and drew children from it.
    q_row: Option<usize>,
}

/// A draft tree under construction.
///
/// Fixed candidates (prompt lookup, the bigram, a draft's top-k) are merged as in a trie: a
/// candidate equal to a sibling's token reuses that node, so no token is proposed twice under a
/// parent by the fixed sources. Drawn children (sampled from the draft's `q`) are always added as
/// drawn, since the verifier's rule for them depends on each draw being there
/// (`spec_core::verify`).
#[derive(Debug, Clone)]
pub struct Candidates {
    tree: TokenTree,
    nodes: Vec<Node>,
}

impl Candidates {
    /// A tree of its root alone: the context's last token.
    pub fn new(root: u32) -> Self {
        Self {
            tree: TokenTree::new(root),
            nodes: vec![Node {
                draw: ChildDraw::Fixed,
                value: 1.0,
                q_row: None,
            }],
        }
    }

    pub fn tree(&self) -> &TokenTree {
        &self.tree
    }

    /// Nodes, root included.
    #[allow(clippy::len_without_is_empty)] // never empty: the root always exists
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// The estimated chance that the path to `node` is accepted.
    pub fn value(&self, node: NodeId) -> f64 {
        self.nodes[node].value
    }

    /// How `node` was drawn from its parent.
    pub fn draw(&self, node: NodeId) -> ChildDraw {
        self.nodes[node].draw
    }

    /// Marks `node`'s children as drawn from row `row` of the drafter's `q` rows.
    pub fn set_q_row(&mut self, node: NodeId, row: usize) {
        self.nodes[node].q_row = Some(row);
    }

    /// The child of `parent` holding `token`, if any.
    pub fn child_with(&self, parent: NodeId, token: u32) -> Option<NodeId> {
        self.tree
            .children(parent)
            .iter()
            .copied()
            .find(|&c| self.tree.token(c) == token)
    }

    /// Adds a fixed candidate `token` under `parent` whose path is accepted with chance `value`,
    /// or, where a sibling already holds `token`, raises that node's value to at least `value`
    /// (bounded by its parent's). Returns the node.
    ///
    /// # Errors
    /// A parent that does not exist.
    pub fn add_fixed(&mut self, parent: NodeId, token: u32, value: f64) -> Result<NodeId> {
        let value = value.min(self.parent_value(parent)?);
        if let Some(node) = self.child_with(parent, token) {
            let held = &mut self.nodes[node].value;
            *held = held.max(value);
            return Ok(node);
        }
        self.push(parent, token, ChildDraw::Fixed, value)
    }

    /// Adds `tokens` as a chain of fixed candidates from `parent`, the `i`-th with value
    /// `values(i)`, merging with nodes already there. Returns the chain's last node.
    ///
    /// # Errors
    /// A parent that does not exist.
    pub fn add_fixed_chain(
        &mut self,
        parent: NodeId,
        tokens: &[u32],
        values: impl Fn(usize) -> f64,
    ) -> Result<NodeId> {
        let mut node = parent;
        for (i, &token) in tokens.iter().enumerate() {
            node = self.add_fixed(node, token, values(i))?;
        }
        Ok(node)
    }

    /// Adds a child of `parent` drawn from its draft distribution as `draw` says. A drawn child
    /// is tried after its parent's earlier children, and its value is at most that of the
    /// sibling drawn before it, so that cutting the tree by value keeps a prefix of the draws
    /// (the verifier assumes every earlier without-replacement draw is there).
    ///
    /// # Errors
    /// A parent that does not exist, or `ChildDraw::Fixed` (use [`Candidates::add_fixed`]).
    pub fn add_drawn(
        &mut self,
        parent: NodeId,
        token: u32,
        draw: ChildDraw,
        value: f64,
    ) -> Result<NodeId> {
        if draw == ChildDraw::Fixed {
            return Err(TreeError::Internal(
                "a fixed candidate added as a drawn one".into(),
            ));
        }
        let mut value = value.min(self.parent_value(parent)?);
        if let Some(&last) = self
            .tree
            .children(parent)
            .iter()
            .rev()
            .find(|&&c| self.nodes[c].draw != ChildDraw::Fixed)
        {
            value = value.min(self.nodes[last].value);
        }
        self.push(parent, token, draw, value)
    }

    fn parent_value(&self, parent: NodeId) -> Result<f64> {
        self.nodes
            .get(parent)
            .map(|n| n.value)
            .ok_or_else(|| TreeError::Internal(format!("no node {parent}")))
    }

    fn push(&mut self, parent: NodeId, token: u32, draw: ChildDraw, value: f64) -> Result<NodeId> {
        let node = self.tree.push(parent, token)?;
        self.nodes.push(Node {
            draw,
            value: value.max(0.0),
            q_row: None,
        });
        Ok(node)
    }

    /// Keeps the root and the `keep` nodes of highest value (ties to the earlier node), which
    /// form a tree: a node's value never exceeds its parent's, nor a drawn child's that of the
    /// sibling drawn before it. Children keep their order. Returns the kept tree with, for each
    /// of its nodes, the node it was here.
    pub fn best(&self, keep: usize) -> (Candidates, Vec<NodeId>) {
        let mut order: Vec<NodeId> = (1..self.len()).collect();
        order.sort_by(|&a, &b| {
            self.nodes[b]
                .value
                .total_cmp(&self.nodes[a].value)
                .then(a.cmp(&b))
        });
        let mut kept = vec![false; self.len()];
        kept[ROOT] = true;
        for &node in order.iter().take(keep) {
            kept[node] = true;
        }
        // Values are monotone, so a kept node's parent is kept; guard against ties all the same.
        let mut out = Candidates::new(self.tree.token(ROOT));
        let mut map = vec![ROOT];
        let mut new_id = vec![None; self.len()];
        new_id[ROOT] = Some(ROOT);
        for node in 1..self.len() {
            let parent = self.tree.parent(node).unwrap_or(ROOT);
            if let (true, Some(p)) = (kept[node], new_id[parent]) {
                let id = out.tree.len();
                // A fresh tree: pushing under an existing parent cannot fail.
                if out.tree.push(p, self.tree.token(node)).is_ok() {
                    out.nodes.push(self.nodes[node]);
                    new_id[node] = Some(id);
                    map.push(node);
                }
            }
        }
        out.nodes[ROOT].q_row = self.nodes[ROOT].q_row;
        (out, map)
    }

    /// Expected tokens of a step over the `n` best nodes: `1 + Σ value` (each node is accepted
    /// with its path's chance, and the step adds its own token).
    pub fn expected_tokens_by_size(&self) -> Vec<f64> {
        let mut values: Vec<f64> = self.nodes[1..].iter().map(|n| n.value).collect();
        values.sort_by(|a, b| b.total_cmp(a));
        let mut sums = Vec::with_capacity(values.len() + 1);
        let mut total = 1.0;
        sums.push(total);
        for v in values {
            total += v;
            sums.push(total);
        }
        sums
    }

    /// The tree and how the verifier must read it: every node fixed is
    /// `Proposal::Deterministic`; otherwise per child, with `q` the drafter's distribution rows
    /// (`[rows, vocab]`, row `r` of node `n` where [`Candidates::set_q_row`] said `r`), gathered
    /// into one row per node.
    ///
    /// # Errors
    /// Drawn children without a `q` row, or without `q`.
    pub fn into_proposal<B: Backend>(
        self,
        q: Option<Tensor<B, 2>>,
    ) -> Result<(TokenTree, Proposal<B>)> {
        let drawn = self.nodes[1..].iter().any(|n| n.draw != ChildDraw::Fixed);
        if !drawn {
            return Ok((self.tree, Proposal::Deterministic));
        }
        let Some(q) = q else {
            return Err(TreeError::Internal(
                "drawn children without draft distributions".into(),
            ));
        };
        let mut rows = Vec::with_capacity(self.len());
        for (node, info) in self.nodes.iter().enumerate() {
            let needs = self
                .tree
                .children(node)
                .iter()
                .any(|&c| self.nodes[c].draw != ChildDraw::Fixed);
            match (needs, info.q_row) {
                (true, None) => {
                    return Err(TreeError::Internal(format!(
                        "node {node} has drawn children but no draft row"
                    )));
                }
                (_, Some(row)) => rows.push(row as i64),
                // Unread by the verifier: any row will do.
                (false, None) => rows.push(0),
            }
        }
        let n = rows.len();
        let index = Tensor::<B, 1, Int>::from_data(TensorData::new(rows, [n]), &q.device());
        let draws = self.nodes.iter().map(|n| n.draw).collect();
        Ok((
            self.tree,
            Proposal::PerChild {
                q: Some(q.select(0, index)),
                draws,
            },
        ))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn fixed_candidates_merge_like_a_trie() {
        let mut c = Candidates::new(9);
        let end = c
            .add_fixed_chain(ROOT, &[1, 2, 3], |i| 0.9 - 0.1 * i as f64)
            .unwrap();
        assert_eq!(end, 3);
        // A second source shares the first token, then branches.
        let end = c.add_fixed_chain(ROOT, &[1, 5], |_| 0.95).unwrap();
        assert_eq!(c.len(), 5);
        assert_eq!(c.tree().children(1), &[2, 4]);
        assert_eq!(end, 4);
        // Values are bounded by the parent's and raised by a second proposer.
        assert_eq!(c.value(1), 0.95);
        assert_eq!(c.value(4), 0.95);
        assert!((c.value(3) - 0.7).abs() < 1e-12);
    }

    #[test]
    fn the_best_nodes_form_a_tree_that_keeps_each_prefix_of_draws() {
        let mut c = Candidates::new(0);
        let a = c
            .add_drawn(ROOT, 10, ChildDraw::WithoutReplacement, 0.5)
            .unwrap();
        // Drawn after `a`: its value is capped at a's, so it cannot be kept without `a`.
        let b = c
            .add_drawn(ROOT, 11, ChildDraw::WithoutReplacement, 0.8)
            .unwrap();
        assert_eq!(c.value(b), 0.5);
        let f = c.add_fixed(ROOT, 12, 0.6).unwrap();
        let aa = c.add_fixed(a, 20, 0.4).unwrap();
        let (best, map) = c.best(2);
        // 12 (0.6) and the first draw 10 (0.5, before its equal sibling).
        assert_eq!(best.tree().tokens(), &[0, 10, 12]);
        assert_eq!(map, vec![ROOT, a, f]);
        let (best, _) = c.best(4);
        assert_eq!(best.tree().tokens(), &[0, 10, 11, 12, 20]);
        assert_eq!(best.tree().children(ROOT).len(), 3);
        assert_eq!(best.tree().parent(4), Some(1));
        let _ = aa;
        // E[τ] by size: 1, then the values in decreasing order.
        let sums = c.expected_tokens_by_size();
        assert_eq!(sums.len(), 5);
        assert!((sums[1] - 1.6).abs() < 1e-12 && (sums[4] - 3.0).abs() < 1e-12);
    }

    #[test]
    fn a_tree_of_fixed_candidates_is_deterministic_and_drawn_children_need_rows() {
        type B = burn::backend::Flex;
        let mut c = Candidates::new(0);
        c.add_fixed_chain(ROOT, &[1, 2], |_| 0.5).unwrap();
        let (tree, proposal) = c.clone().into_proposal::<B>(None).unwrap();
        assert_eq!(tree.len(), 3);
        assert!(matches!(proposal, Proposal::Deterministic));
        c.add_drawn(ROOT, 3, ChildDraw::Iid, 0.2).unwrap();
        assert!(c.clone().into_proposal::<B>(None).is_err());
        let q = Tensor::<B, 2>::from_data(
            TensorData::new(vec![0.25f32; 8], [2, 4]),
            &Default::default(),
        );
        assert!(
            c.clone().into_proposal(Some(q.clone())).is_err(),
            "no row for the root"
        );
        c.set_q_row(ROOT, 1);
        let (_, proposal) = c.into_proposal(Some(q)).unwrap();
        let Proposal::PerChild { q, draws } = proposal else {
            panic!("a tree with a drawn child is read per child")
        };
        assert_eq!(q.unwrap().dims(), [4, 4]);
        assert_eq!(
            draws,
            vec![
                ChildDraw::Fixed,
                ChildDraw::Fixed,
                ChildDraw::Fixed,
                ChildDraw::Iid
            ]
        );
    }
}
