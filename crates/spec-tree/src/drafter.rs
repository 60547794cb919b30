//! The tree drafter: candidates from every source it has, merged into one tree, cut to the
//! size the measured costs pay for.

use burn::tensor::backend::Backend;
use spec_core::length::LengthController;
use spec_core::tree::{NodeId, ROOT};
use spec_engine::{Draft, DraftRequest, Drafter, EngineError, StepOutcome};
use spec_ngram::BigramModel;
use spec_sampling::DraftRunner;

use crate::candidates::Candidates;
use crate::draft_source::{DraftSource, Expansion};
use crate::error::{Result, TreeError};
use crate::ngram_sources::{BigramSource, LookupSource};
use crate::provenance::{Proposer, Provenance, trials};
use crate::sizing::best_size;

/// Where a tree's candidates come from; at least one.
#[derive(Debug)]
pub struct TreeSources<B: Backend> {
    /// A draft model following the context (its vocabulary checked against the target's by
    /// the caller), with a guess of its row's cost in target steps until that is measured.
    pub draft: Option<(DraftRunner<B>, Option<f64>)>,
    /// Prompt lookup's n-gram sizes, `(n_min, n_max)`.
    pub lookup: Option<(usize, usize)>,
    /// A bigram model over the target's vocabulary.
    pub bigram: Option<BigramModel>,
}

/// The tree's limits.
#[derive(Debug, Clone, PartialEq)]
pub struct TreeSettings {
    pub expansion: Expansion,
    /// Drafted nodes a step verifies at most.
    pub max_nodes: usize,
    /// Children the bigram proposes under a node.
    pub bigram_branch: usize,
}

impl Default for TreeSettings {
    fn default() -> Self {
        Self {
            expansion: Expansion {
                shape: None,
                depth: 8,
                beam: 4,
                branch: 4,
            },
            max_nodes: 32,
            bigram_branch: 2,
        }
    }
}

/// The step in flight, kept to learn from its outcome.
#[derive(Debug)]
struct Pending {
    /// The tree as assembled, before the cut.
    assembled: Candidates,
    provenance: Provenance,
    /// The verified tree's nodes in `assembled`.
    map: Vec<NodeId>,
    greedy: bool,
}

/// Drafts a token tree per step (see the crate docs for the rule).
#[derive(Debug)]
pub struct TreeDrafter<B: Backend> {
    draft: Option<DraftSource<B>>,
    lookup: Option<LookupSource>,
    bigram: Option<BigramSource>,
    settings: TreeSettings,
    lengths: LengthController,
    pending: Option<Pending>,
}

impl<B: Backend> TreeDrafter<B> {
    /// A drafter over `sources` for a target with `target_vocab` logits a row.
    ///
    /// # Errors
    /// No source; a bigram model of another vocabulary; limits of 0.
    pub fn new(
        sources: TreeSources<B>,
        target_vocab: usize,
        settings: TreeSettings,
    ) -> Result<Self> {
        let TreeSources {
            draft,
            lookup,
            bigram,
        } = sources;
        if draft.is_none() && lookup.is_none() && bigram.is_none() {
            return Err(TreeError::NoSource);
        }
        let e = &settings.expansion;
        if settings.max_nodes == 0 || e.depth == 0 || e.beam == 0 || e.branch == 0 {
            return Err(TreeError::Settings(format!(
                "nodes {}, depth {}, beam {} and branch {} must each be at least 1",
                settings.max_nodes, e.depth, e.beam, e.branch
            )));
        }
        if let Some(model) = &bigram
            && model.vocab_size() != target_vocab
        {
            return Err(TreeError::Ngram(spec_ngram::NgramError::VocabMismatch {
                model: model.vocab_size(),
                target: target_vocab,
            }));
        }
        let lookup = lookup
            .map(|(n_min, n_max)| LookupSource::new(n_min, n_max))
            .transpose()?;
        Ok(Self {
            draft: draft.map(|(runner, prior)| DraftSource::new(runner, prior)),
            lookup,
            bigram: bigram.map(|model| BigramSource::new(model, settings.bigram_branch)),
            settings,
            lengths: LengthController::default(),
            pending: None,
        })
    }

    /// The measured costs and acceptance.
    pub fn lengths(&self) -> &LengthController {
        &self.lengths
    }

    /// Assembles this step's candidates and cuts them to size.
    fn assemble(&mut self, request: DraftRequest<'_, B>) -> Result<Draft<B>, EngineError> {
        let root = request.root()?;
        let DraftRequest {
            context,
            max_depth,
            max_nodes,
            sampling,
            rng,
            ..
        } = request;
        self.pending = None;
        // A plain step now and then keeps the one-token time, every cost's unit, fresh.
        if max_depth == 0 || self.lengths.wants_one_token_step() {
            return Ok(Draft::none(root));
        }
        let depth = self.settings.expansion.depth.min(max_depth);
        let mut candidates = Candidates::new(root);
        let mut provenance = Provenance::default();
        let (mut spent, mut q, mut forwards) = (0.0, None, 0);
        if let Some(draft) = &mut self.draft {
            let expanded = draft.expand(
                &mut candidates,
                &mut provenance,
                context,
                depth,
                &self.settings.expansion,
                sampling,
                rng,
                &self.lengths,
            )?;
            (spent, q, forwards) = (expanded.spent, expanded.q, expanded.forwards);
        }
        if let Some(lookup) = &mut self.lookup {
            lookup.propose(&mut candidates, &mut provenance, context, depth)?;
        }
        if let Some(bigram) = &mut self.bigram {
            let budget = self.settings.max_nodes;
            bigram.propose(&mut candidates, &mut provenance, depth, budget)?;
        }
        let keep = if self.settings.expansion.shape.is_some() {
            candidates.len() - 1
        } else {
            best_size(&candidates.expected_tokens_by_size(), spent, |w| {
                self.lengths.verification_cost(w)
            })
        }
        .min(self.settings.max_nodes)
        .min(max_nodes);
        let (cut, map) = candidates.best(keep);
        let (tree, proposal) = cut.into_proposal(q)?;
        self.pending = Some(Pending {
            assembled: candidates,
            provenance,
            map,
            greedy: sampling.is_greedy(),
        });
        Ok(Draft {
            tree,
            proposal,
            draft_forwards: forwards,
        })
    }

    /// Teaches each source from the candidates the step tested, and keeps the accepted path in
    /// the draft's cache.
    fn learn(&mut self, outcome: &StepOutcome<B>, pending: Pending) -> Result<(), EngineError> {
        let Pending {
            assembled,
            provenance,
            map,
            greedy,
        } = pending;
        for trial in trials(outcome, &map, greedy) {
            let top_draft = self.is_first_draft_child(&assembled, &provenance, trial.node);
            for proposer in provenance.of(trial.node) {
                match *proposer {
                    Proposer::Draft { probability } => {
                        if let Some(draft) = &mut self.draft {
                            draft.record(probability, trial.accepted, top_draft);
                        }
                    }
                    Proposer::Lookup { n } => {
                        if let Some(lookup) = &mut self.lookup {
                            lookup.record(n, trial.accepted);
                        }
                    }
                    Proposer::Bigram { probability } => {
                        if let Some(bigram) = &mut self.bigram {
                            bigram.record(probability, trial.accepted);
                        }
                    }
                }
            }
        }
        if let Some(draft) = &mut self.draft {
            let accepted: Vec<NodeId> = outcome.verdict.accepted.iter().map(|&n| map[n]).collect();
            draft.keep_path(&assembled, &accepted)?;
        }
        Ok(())
    }

    /// Whether `node` is the first child of its parent that the draft model proposed: its most
    /// likely one under greedy settings, its first draw otherwise.
    fn is_first_draft_child(
        &self,
        tree: &Candidates,
        provenance: &Provenance,
        node: NodeId,
    ) -> bool {
        let parent = tree.tree().parent(node).unwrap_or(ROOT);
        tree.tree().children(parent).iter().find(|&&c| {
            provenance
                .of(c)
                .iter()
                .any(|p| matches!(p, Proposer::Draft { .. }))
        }) == Some(&node)
    }
}

impl<B: Backend> Drafter<B> for TreeDrafter<B> {
    fn name(&self) -> &str {
        "tree"
    }

    fn begin(&mut self, prompt: &[u32]) -> Result<(), EngineError> {
        self.pending = None;
        if let Some(draft) = &mut self.draft {
            draft.begin(prompt.len());
        }
        if let Some(lookup) = &mut self.lookup {
            lookup.begin(prompt);
        }
        Ok(())
    }

    fn draft(&mut self, request: DraftRequest<'_, B>) -> Result<Draft<B>, EngineError> {
        self.assemble(request)
    }

    fn accepted(&mut self, _context: &[u32], outcome: &StepOutcome<B>) -> Result<(), EngineError> {
        self.lengths.observe(outcome);
        match self.pending.take() {
            Some(pending) => self.learn(outcome, pending),
            None => Ok(()),
        }
    }

    /// The verification's slope and, with a draft model, its row's cost and its most likely
    /// child's acceptance.
    fn report_estimates(&self) -> Vec<(&'static str, f64)> {
        let mut named = vec![("verify_slope", self.lengths.widths().slope())];
        if let Some(draft) = &self.draft {
            named.extend(draft.estimates(&self.lengths));
        }
        named
    }
}
