//! Who proposed each node, so that the outcome of a step teaches each source how often its
//! candidates are accepted.

use spec_core::step::StepOutcome;
use spec_core::tree::NodeId;

/// A source's claim on a node, with what its acceptance estimate is keyed by.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Proposer {
    /// The draft model, which gave the node's token this probability.
    Draft { probability: f64 },
    /// Prompt lookup, from a match of this many tokens.
    Lookup { n: usize },
    /// The bigram model, which gave the node's token this probability.
    Bigram { probability: f64 },
}

/// Proposers by node of the tree as assembled (before it was cut to size).
#[derive(Debug, Clone, Default)]
pub(crate) struct Provenance {
    by_node: Vec<Vec<Proposer>>,
}

impl Provenance {
    /// Records that `proposer` proposed `node`.
    pub(crate) fn add(&mut self, node: NodeId, proposer: Proposer) {
        if self.by_node.len() <= node {
            self.by_node.resize(node + 1, Vec::new());
        }
        self.by_node[node].push(proposer);
    }

    pub(crate) fn of(&self, node: NodeId) -> &[Proposer] {
        self.by_node.get(node).map_or(&[], Vec::as_slice)
    }
}

/// One trial of a candidate: a node the verification tested, and whether it was accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Trial {
    /// The node in the tree as assembled.
    pub node: NodeId,
    pub accepted: bool,
}

/// The candidates `outcome` tested: the children of the root and of each accepted node. Under
/// greedy verification a child is accepted exactly when it is the target's argmax, so every
/// child of a node on the path is a trial; a sampled walk tries children in order and stops at
/// the accepted one, so only those up to it are. `map` takes the verified tree's nodes to the
/// assembled tree's.
pub fn trials<B: burn::tensor::backend::Backend>(
    outcome: &StepOutcome<B>,
    map: &[NodeId],
    greedy: bool,
) -> Vec<Trial> {
    let path = outcome.path_rows();
    let mut out = Vec::new();
    for (i, &node) in path.iter().enumerate() {
        let next = path.get(i + 1).copied();
        for &child in outcome.tree.children(node) {
            let accepted = Some(child) == next;
            out.push(Trial {
                node: map.get(child).copied().unwrap_or(child),
                accepted,
            });
            if accepted && !greedy {
                break;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use spec_core::tree::{ROOT, TokenTree};
    use spec_core::verify::Verdict;

    type B = burn::backend::Flex;

    #[test]
    fn the_tested_children_are_those_of_the_path() {
        // 0 ─┬─ 1 ─┬─ 3
        //    │     └─ 4
        //    └─ 2
        let mut t = TokenTree::new(0);
        let a = t.push(ROOT, 10).unwrap();
        t.push(ROOT, 11).unwrap();
        t.push(a, 12).unwrap();
        t.push(a, 13).unwrap();
        let verdict = Verdict {
            accepted: vec![1, 4],
            next_token: 7,
        };
        let outcome = StepOutcome::<B>::new(t, verdict, 0.0);
        let map: Vec<NodeId> = (0..5).map(|n| n * 10).collect();
        let greedy = trials(&outcome, &map, true);
        let seen: Vec<(usize, bool)> = greedy.iter().map(|t| (t.node, t.accepted)).collect();
        assert_eq!(seen, vec![(10, true), (20, false), (30, false), (40, true)]);
        // A sampled walk tried 1 and accepted it, then 3 and 4.
        let sampled = trials(&outcome, &map, false);
        let seen: Vec<(usize, bool)> = sampled.iter().map(|t| (t.node, t.accepted)).collect();
        assert_eq!(seen, vec![(10, true), (30, false), (40, true)]);
    }
}
