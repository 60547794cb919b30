//! Medusa's candidate tree: head `d`'s likeliest tokens are the candidates at depth `d + 1`
//! under every node of depth `d`, and the nodes kept are the paths of highest estimated value.
//!
//! A path through ranks `(r_1, …, r_d)` is accepted with chance `Π_i c_i(r_i)`, `c_i(r)` the
//! chance that head `i`'s `r`-th candidate is right given that the path before it was (Medusa's
//! sparse tree, Cai et al. 2024, §2.1.2, takes `c` from held-out accuracies). Paths are
//! enumerated best first (a node's first child and next sibling join the frontier when it is
//! taken), so the first `n` taken are the `n` best when each head's chances fall with the rank.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use spec_core::tree::{NodeId, ROOT};
use spec_tree::Candidates;

use crate::error::Result;

/// One head's candidates for this step, likeliest first: `(token, chance)`, chances
/// non-increasing.
pub(crate) type HeadCandidates = Vec<(u32, f64)>;

/// Where a node of the assembled tree came from.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Origin {
    /// The head (0-based) whose candidate the node is: its depth minus one.
    pub(crate) head: usize,
    pub(crate) rank: usize,
}

#[derive(Debug, PartialEq)]
struct Frontier {
    value: f64,
    parent: NodeId,
    head: usize,
    rank: usize,
}

impl Eq for Frontier {}

impl Ord for Frontier {
    fn cmp(&self, other: &Self) -> Ordering {
        // Highest value first; among equals the shallower, then the lower rank.
        self.value
            .total_cmp(&other.value)
            .then(other.head.cmp(&self.head))
            .then(other.rank.cmp(&self.rank))
    }
}

impl PartialOrd for Frontier {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

/// The `max_nodes` best paths through `heads` (at most `max_depth` deep) under `root`, with
/// each node's origin (`origins[ROOT]` is `None`).
pub(crate) fn assemble(
    root: u32,
    heads: &[HeadCandidates],
    max_depth: usize,
    max_nodes: usize,
) -> Result<(Candidates, Vec<Option<Origin>>)> {
    let mut candidates = Candidates::new(root);
    let mut origins = vec![None];
    let depth = heads.len().min(max_depth);
    let mut frontier = BinaryHeap::new();
    let chance = |head: usize, rank: usize| heads[head].get(rank).map(|&(_, c)| c);
    if depth > 0
        && let Some(c) = chance(0, 0)
    {
        frontier.push(Frontier {
            value: c,
            parent: ROOT,
            head: 0,
            rank: 0,
        });
    }
    while origins.len() <= max_nodes {
        let Some(best) = frontier.pop() else { break };
        let token = heads[best.head][best.rank].0;
        let node = candidates.add_fixed(best.parent, token, best.value)?;
        origins.push(Some(Origin {
            head: best.head,
            rank: best.rank,
        }));
        let parent_value = candidates.value(best.parent);
        if let Some(c) = chance(best.head, best.rank + 1) {
            frontier.push(Frontier {
                value: parent_value * c,
                parent: best.parent,
                head: best.head,
                rank: best.rank + 1,
            });
        }
        if best.head + 1 < depth
            && let Some(c) = chance(best.head + 1, 0)
        {
            frontier.push(Frontier {
                value: best.value * c,
                parent: node,
                head: best.head + 1,
                rank: 0,
            });
        }
    }
    Ok((candidates, origins))
}

/// `chances` made non-increasing (each at most the one before), so that the best-first
/// enumeration stays exact when a calibration estimate rises with the rank.
pub(crate) fn non_increasing(chances: &mut [f64]) {
    for i in 1..chances.len() {
        chances[i] = chances[i].min(chances[i - 1]);
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn the_best_paths_are_taken_first() {
        // Head 0: tokens 10 (0.6), 11 (0.3); head 1: 20 (0.5), 21 (0.4).
        let heads = vec![vec![(10, 0.6), (11, 0.3)], vec![(20, 0.5), (21, 0.4)]];
        let (c, origins) = assemble(1, &heads, 8, 3).unwrap();
        // 0.6 (10), 0.3 (10→20), 0.3 (11) or 0.24 (10→21): ties go to the shallower.
        let t = c.tree();
        assert_eq!(t.len(), 4);
        assert_eq!(t.token(1), 10);
        assert_eq!(t.token(2), 11);
        assert_eq!(t.token(3), 20);
        assert_eq!(t.parent(3), Some(1));
        assert_eq!(origins[3], Some(Origin { head: 1, rank: 0 }));
        assert!((c.value(3) - 0.3).abs() < 1e-12);
        // Everything: 2 + 2·2 nodes.
        let (all, _) = assemble(1, &heads, 8, 100).unwrap();
        assert_eq!(all.len(), 7);
        // Depth limited to 1: the two candidates of head 0.
        let (shallow, _) = assemble(1, &heads, 1, 100).unwrap();
        assert_eq!(shallow.len(), 3);
        let (none, _) = assemble(1, &heads, 0, 100).unwrap();
        assert_eq!(none.len(), 1);
    }

    #[test]
    fn chances_are_made_non_increasing() {
        let mut c = [0.5, 0.6, 0.2, 0.3];
        non_increasing(&mut c);
        assert_eq!(c, [0.5, 0.5, 0.2, 0.2]);
    }
}
