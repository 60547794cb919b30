//! Token trees: the drafted candidates of one step, verified in one target pass (SpecInfer,
//! Miao et al. 2024). A chain is the tree in which every node has one child.
//!
//! Node 0 is the root: the last token already accepted, fed to the target with the drafts so that
//! the target's distribution after it is scored in the same pass. Nodes are appended after their
//! parent, so node order is a topological order: a model can lay the nodes out in that order, at
//! positions `start + depth`, with [`TokenTree::ancestor_mask`] as the attention mask.

use burn::tensor::{Bool, Tensor, TensorData, backend::Backend};

use crate::error::{Result, SpecError};

/// Index of a node in a [`TokenTree`]; the root is 0.
pub type NodeId = usize;

/// The root of every tree.
pub const ROOT: NodeId = 0;

/// How a drafted node was drawn from its parent; see [`crate::verify::Proposal::PerChild`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ChildDraw {
    /// From the parent's draft distribution `q`, independently of its siblings (SpecInfer).
    Iid,
    /// From the parent's `q` with the tokens of the earlier `WithoutReplacement` siblings removed
    /// and renormalized: sampling without replacement (Recursive Speculative Decoding, Jeon et
    /// al. 2024). Siblings drawn this way hold distinct tokens.
    WithoutReplacement,
    /// A point mass fixed in advance (prompt lookup, top-k, merged candidates); it may depend on
    /// the earlier siblings' tokens, never on a draw of its own.
    Fixed,
}

/// A tree of drafted tokens. Children keep the order in which they were added, which is the
/// order verification tries them in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenTree {
    tokens: Vec<u32>,
    parents: Vec<Option<NodeId>>,
    depths: Vec<usize>,
    children: Vec<Vec<NodeId>>,
}

impl TokenTree {
    /// A tree holding only its root, `root_token`.
    pub fn new(root_token: u32) -> Self {
        Self {
            tokens: vec![root_token],
            parents: vec![None],
            depths: vec![0],
            children: vec![Vec::new()],
        }
    }

    /// The chain `root → drafted[0] → drafted[1] → …`.
    pub fn chain(root_token: u32, drafted: &[u32]) -> Self {
        let mut tree = Self::new(root_token);
        let mut parent = ROOT;
        for &token in drafted {
            parent = tree.push_unchecked(parent, token);
        }
        tree
    }

    /// Adds `token` as the last child of `parent` and returns the new node.
    pub fn push(&mut self, parent: NodeId, token: u32) -> Result<NodeId> {
        if parent >= self.len() {
            return Err(SpecError::NoSuchNode {
                parent,
                len: self.len(),
            });
        }
        Ok(self.push_unchecked(parent, token))
    }

    fn push_unchecked(&mut self, parent: NodeId, token: u32) -> NodeId {
        let id = self.tokens.len();
        self.tokens.push(token);
        self.parents.push(Some(parent));
        self.depths.push(self.depths[parent] + 1);
        self.children.push(Vec::new());
        self.children[parent].push(id);
        id
    }

    /// Number of nodes, root included.
    #[allow(clippy::len_without_is_empty)] // never empty: the root always exists
    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    /// Number of drafted nodes (the root excluded).
    pub fn drafted(&self) -> usize {
        self.len() - 1
    }

    pub fn token(&self, node: NodeId) -> u32 {
        self.tokens[node]
    }

    /// All tokens in node order, root first: the model input of the verification pass.
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    pub fn parent(&self, node: NodeId) -> Option<NodeId> {
        self.parents[node]
    }

    /// Distance from the root; the root has depth 0.
    pub fn depth(&self, node: NodeId) -> usize {
        self.depths[node]
    }

    /// Depth of the deepest node: the longest run of tokens one step can accept.
    pub fn max_depth(&self) -> usize {
        self.depths.iter().copied().max().unwrap_or(0)
    }

    /// Children of `node` in verification order.
    pub fn children(&self, node: NodeId) -> &[NodeId] {
        &self.children[node]
    }

    /// Positions of the nodes when the root sits at position `root_position`.
    pub fn positions(&self, root_position: usize) -> Vec<usize> {
        self.depths.iter().map(|d| root_position + d).collect()
    }

    /// Nodes from the root's child down to `node`, in order.
    pub fn path_to(&self, node: NodeId) -> Vec<NodeId> {
        let mut path = Vec::with_capacity(self.depths[node]);
        let mut at = node;
        while let Some(parent) = self.parents[at] {
            path.push(at);
            at = parent;
        }
        path.reverse();
        path
    }

    /// Row-major `len × len` matrix: entry `(i, j)` is true when node `i` may attend to node `j`,
    /// i.e. `j` is `i` or one of its ancestors.
    pub fn ancestor_mask(&self) -> Vec<bool> {
        let n = self.len();
        let mut mask = vec![false; n * n];
        for i in 0..n {
            // Parents precede children, so row `parent` is complete when row `i` is filled.
            if let Some(parent) = self.parents[i] {
                let (done, rest) = mask.split_at_mut(i * n);
                rest[..n].copy_from_slice(&done[parent * n..parent * n + n]);
            }
            mask[i * n + i] = true;
        }
        mask
    }

    /// [`Self::ancestor_mask`] as a `[len, len]` boolean tensor on `device`.
    pub fn ancestor_mask_tensor<B: Backend>(&self, device: &B::Device) -> Tensor<B, 2, Bool> {
        let n = self.len();
        Tensor::from_data(TensorData::new(self.ancestor_mask(), [n, n]), device)
    }

    /// Nodes that have children, in node order.
    pub(crate) fn internal_nodes(&self) -> Vec<NodeId> {
        (0..self.len())
            .filter(|&n| !self.children[n].is_empty())
            .collect()
    }

    /// The largest number of children any node has.
    pub(crate) fn max_children(&self) -> usize {
        self.children.iter().map(Vec::len).max().unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample_tree() -> TokenTree {
        // 0 ─┬─ 1 ─┬─ 3
        //    │     └─ 4 ── 5
        //    └─ 2
        let mut t = TokenTree::new(100);
        let a = t.push(ROOT, 10).unwrap();
        let b = t.push(ROOT, 20).unwrap();
        let c = t.push(a, 30).unwrap();
        let d = t.push(a, 40).unwrap();
        let e = t.push(d, 50).unwrap();
        assert_eq!((a, b, c, d, e), (1, 2, 3, 4, 5));
        t
    }

    #[test]
    fn structure() {
        let t = sample_tree();
        assert_eq!(t.len(), 6);
        assert_eq!(t.drafted(), 5);
        assert_eq!(t.children(ROOT), &[1, 2]);
        assert_eq!(t.children(1), &[3, 4]);
        assert_eq!(t.depth(5), 3);
        assert_eq!(t.max_depth(), 3);
        assert_eq!(t.path_to(5), vec![1, 4, 5]);
        assert_eq!(t.path_to(ROOT), Vec::<NodeId>::new());
        assert_eq!(t.positions(7), vec![7, 8, 8, 9, 9, 10]);
        assert_eq!(t.internal_nodes(), vec![0, 1, 4]);
        assert_eq!(t.max_children(), 2);
    }

    #[test]
    fn ancestor_mask_is_ancestors_or_self() {
        let t = sample_tree();
        let n = t.len();
        let mask = t.ancestor_mask();
        for i in 0..n {
            for j in 0..n {
                let expected = i == j || t.path_to(i).contains(&j) || j == ROOT;
                assert_eq!(mask[i * n + j], expected, "({i}, {j})");
            }
        }
    }

    #[test]
    fn chain_mask_is_causal() {
        let t = TokenTree::chain(1, &[2, 3, 4]);
        let n = t.len();
        let mask = t.ancestor_mask();
        for i in 0..n {
            for j in 0..n {
                assert_eq!(mask[i * n + j], j <= i);
            }
        }
    }

    #[test]
    fn push_to_missing_parent_is_an_error() {
        let mut t = TokenTree::new(0);
        assert_eq!(
            t.push(3, 1),
            Err(SpecError::NoSuchNode { parent: 3, len: 1 })
        );
    }
}
