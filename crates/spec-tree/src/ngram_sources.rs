//! Candidates that cost no model call: every match of the context's suffix in the context
//! (prompt lookup's branches) and a bigram model's likeliest continuations.

use spec_core::length::{AcceptanceByConfidence, AcceptanceRate};
use spec_core::tree::{NodeId, ROOT};
use spec_ngram::{BigramModel, NgramIndex};

use crate::candidates::Candidates;
use crate::error::Result;
use crate::provenance::{Proposer, Provenance};

/// Memory of the acceptance estimates (about 50 trials each).
const DECAY: f64 = 0.98;

/// Prompt lookup as a source of branches: the continuation of the latest match of each n-gram
/// size, one branch each, the `i`-th token valued `α_n^{i+1}` (`α_n`: the measured acceptance
/// of tokens from size-`n` matches).
#[derive(Debug, Clone)]
pub(crate) struct LookupSource {
    index: NgramIndex,
    n_min: usize,
    /// `rates[n - n_min]`.
    rates: Vec<AcceptanceRate>,
}

impl LookupSource {
    pub(crate) fn new(n_min: usize, n_max: usize) -> Result<Self> {
        Ok(Self {
            index: NgramIndex::new(n_min, n_max)?,
            n_min,
            rates: vec![AcceptanceRate::with_decay(DECAY); n_max - n_min + 1],
        })
    }

    pub(crate) fn begin(&mut self, prompt: &[u32]) {
        self.index.clear();
        self.index.extend(prompt);
    }

    /// Adds a branch under the root for each match of the context's suffix, `depth` tokens
    /// long at most.
    pub(crate) fn propose(
        &mut self,
        candidates: &mut Candidates,
        provenance: &mut Provenance,
        context: &[u32],
        depth: usize,
    ) -> Result<()> {
        self.index.sync(context);
        for m in self.index.find_each() {
            let alpha = self.rates[m.n - self.n_min].alpha();
            let continuation = self.index.continuation(m.start, depth).to_vec();
            let mut node = ROOT;
            let mut value = 1.0;
            for token in continuation {
                value *= alpha;
                node = candidates.add_fixed(node, token, value)?;
                provenance.add(node, Proposer::Lookup { n: m.n });
            }
        }
        Ok(())
    }

    /// Learns from one tested candidate from a size-`n` match.
    pub(crate) fn record(&mut self, n: usize, accepted: bool) {
        if let Some(rate) = n
            .checked_sub(self.n_min)
            .and_then(|i| self.rates.get_mut(i))
        {
            rate.record_trial(accepted);
        }
    }
}

/// A bigram model as a source of a small tree: from the root, the nodes of highest value are
/// expanded with their `branch` likeliest followers, each valued its parent's value times the
/// measured acceptance of candidates the bigram gave that probability.
#[derive(Debug, Clone)]
pub(crate) struct BigramSource {
    model: BigramModel,
    calibration: AcceptanceByConfidence,
    branch: usize,
}

impl BigramSource {
    pub(crate) fn new(model: BigramModel, branch: usize) -> Self {
        Self {
            model,
            calibration: AcceptanceByConfidence::new(10, DECAY),
            branch,
        }
    }

    /// Adds up to `budget` candidates at most `depth` deep.
    pub(crate) fn propose(
        &mut self,
        candidates: &mut Candidates,
        provenance: &mut Provenance,
        depth: usize,
        budget: usize,
    ) -> Result<()> {
        // (value, node, depth) of the nodes left to expand; the best is taken each time.
        let mut open: Vec<(f64, NodeId, usize)> = vec![(1.0, ROOT, 0)];
        let mut added = 0;
        while added < budget {
            let Some(best) = (0..open.len()).max_by(|&a, &b| open[a].0.total_cmp(&open[b].0))
            else {
                break;
            };
            let (value, node, d) = open.swap_remove(best);
            if d >= depth {
                continue;
            }
            let prev = candidates.tree().token(node);
            for (token, probability) in self.model.top_k(prev, self.branch) {
                if added >= budget {
                    break;
                }
                let child_value = value * self.calibration.alpha(probability);
                let child = candidates.add_fixed(node, token, child_value)?;
                provenance.add(child, Proposer::Bigram { probability });
                open.push((candidates.value(child), child, d + 1));
                added += 1;
            }
        }
        Ok(())
    }

    /// Learns from one tested candidate the bigram gave `probability`.
    pub(crate) fn record(&mut self, probability: f64, accepted: bool) {
        self.calibration.record(probability, accepted);
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use spec_ngram::BigramCounts;

    #[test]
    fn lookup_branches_follow_each_match() {
        let mut lookup = LookupSource::new(1, 3).unwrap();
        let context = [1, 2, 3, 7, 5, 2, 3, 9, 4, 3, 8, 1, 2, 3];
        lookup.begin(&context);
        let mut c = Candidates::new(3);
        let mut p = Provenance::default();
        lookup.propose(&mut c, &mut p, &context, 2).unwrap();
        // Branches 7 5 (n 3), 9 4 (n 2), 8 1 (n 1).
        assert_eq!(c.tree().children(ROOT).len(), 3);
        assert_eq!(c.tree().tokens(), &[3, 7, 5, 9, 4, 8, 1]);
        assert_eq!(p.of(1), &[Proposer::Lookup { n: 3 }]);
        // Values fall along a branch.
        assert!(c.value(2) < c.value(1));
        // A size that is rejected loses value.
        for _ in 0..20 {
            lookup.record(1, false);
        }
        let mut c = Candidates::new(3);
        lookup.propose(&mut c, &mut p, &context, 2).unwrap();
        assert!(c.value(5) < 0.1 && c.value(1) > 0.3);
    }

    #[test]
    fn a_bigram_tree_grows_where_it_is_likely() {
        let mut counts = BigramCounts::new(8).unwrap();
        for _ in 0..10 {
            counts.add_sequence(&[1, 2, 3, 4]).unwrap();
        }
        counts.add_sequence(&[1, 5]).unwrap();
        let mut bigram = BigramSource::new(counts.finish(), 2);
        let mut c = Candidates::new(1);
        let mut p = Provenance::default();
        bigram.propose(&mut c, &mut p, 3, 5).unwrap();
        assert_eq!(c.len(), 6);
        // 2 is the likeliest follower of 1, and its subtree is grown first.
        assert_eq!(c.tree().token(c.tree().children(ROOT)[0]), 2);
        assert!(c.tree().max_depth() >= 2);
        assert!(c.tree().max_depth() <= 3);
    }
}
