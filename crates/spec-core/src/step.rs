//! What one verification step did, as the engine reports it to the drafter that proposed it.

use burn::tensor::{Tensor, backend::Backend};

use crate::tree::{ROOT, TokenTree};
use crate::verify::Verdict;

/// What a drafter asks the engine to hand over after each step, beyond the verdict. Declared
/// once, before a generation; the engine computes and reads back nothing a drafter did not ask
/// for.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StepNeeds {
    /// The target's last-layer hidden states of the root and the accepted path
    /// ([`StepOutcome::hidden`]): what Medusa heads and early-exit heads read.
    pub hidden: bool,
    /// The target's distributions of the root and the accepted path
    /// ([`StepOutcome::target_probs`]): what online distillation learns from.
    pub target_probs: bool,
}

impl StepNeeds {
    /// Nothing beyond the verdict.
    pub const NONE: Self = Self {
        hidden: false,
        target_probs: false,
    };
}

/// One verification step: what was proposed, what the target decided, and what it cost.
///
/// `seconds` covers the target's forward pass over the tree, the verification and the cache's
/// rollback: what a step costs the target, measured by the engine and nothing else (not the
/// drafting, not the caller's handling of the new tokens). Every adaptive draft length prices
/// its steps from these times ([`crate::length::LengthController::observe`]).
#[derive(Debug, Clone)]
pub struct StepOutcome<B: Backend> {
    /// The tree the target scored (root = the context's last token).
    pub tree: TokenTree,
    pub verdict: Verdict,
    /// Seconds of the target's forward, the verification and the rollback.
    pub seconds: f64,
    /// `[1 + accepted, hidden]`: the target's last-layer hidden states, after its final norm
    /// (the input of its output head), at the root and at each accepted node, in path order.
    /// Row `i` predicted the token at path position `i + 1` (the last row predicted
    /// `verdict.next_token`). Only when [`StepNeeds::hidden`] was asked for.
    pub hidden: Option<Tensor<B, 2>>,
    /// `[1 + accepted, vocab]`: the target's distributions (softmax of its logits at temperature
    /// 1, untruncated) at the same rows as `hidden`. Only when [`StepNeeds::target_probs`] was
    /// asked for.
    pub target_probs: Option<Tensor<B, 2>>,
}

impl<B: Backend> StepOutcome<B> {
    /// An outcome without the optional rows (a drafter driven by hand, a test).
    pub fn new(tree: TokenTree, verdict: Verdict, seconds: f64) -> Self {
        Self {
            tree,
            verdict,
            seconds,
            hidden: None,
            target_probs: None,
        }
    }

    /// Tokens the target scored in the step: the tree's nodes, root included.
    pub fn width(&self) -> usize {
        self.tree.len()
    }

    /// Drafted tokens on the tree's longest path: the step's draft length `K` (a chain's
    /// length).
    pub fn depth(&self) -> usize {
        self.tree.max_depth()
    }

    /// Drafts accepted.
    pub fn accepted(&self) -> usize {
        self.verdict.accepted.len()
    }

    /// The rows `hidden` and `target_probs` hold: the root, then the accepted nodes. Node `n` is
    /// row `n` of the step's forward pass.
    pub fn path_rows(&self) -> Vec<usize> {
        std::iter::once(ROOT)
            .chain(self.verdict.accepted.iter().copied())
            .collect()
    }
}
