//! The Medusa drafter: after each step, the heads read the target's hidden state at the last
//! accepted position and propose the tree the target verifies in its next pass.

use std::time::Instant;

use burn::tensor::{Int, Tensor, TensorData, backend::Backend};
use spec_core::length::{AcceptanceByConfidence, AcceptanceRate, LengthController};
use spec_core::step::StepNeeds;
use spec_core::tree::NodeId;
use spec_engine::{Draft, DraftRequest, Drafter, EngineError, StepOutcome};
use spec_runtime::HostTensor;
use spec_runtime::model::{Linear as HostLinear, WeightFormat};
use spec_tree::sizing::best_size;
use spec_tree::{Candidates, trials};

use crate::error::MedusaError;
use crate::heads::MedusaHeads;
use crate::tree::{HeadCandidates, Origin, assemble, non_increasing};
use crate::vocab::DraftVocab;

/// How shared heads reach the draft vocabulary's logits.
#[derive(Debug)]
enum VocabHead<B: Backend> {
    /// The target's output rows of the draft vocabulary, as a projection of their own (packed
    /// for the CPU's skinny kernels where the backend is flex).
    Rows(Box<HostLinear<B>>),
    /// The target's whole head, then the draft vocabulary's columns picked (a target whose
    /// head is held packed only).
    Pick(Tensor<B, 1, Int>),
}

/// How the tree is chosen each step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TreeMode {
    /// Candidates valued by the heads' probabilities, calibrated by what the target accepted so
    /// far, and the tree cut to the size the measured verification cost pays for.
    Auto,
    /// Medusa's sparse tree: the `nodes` best rank paths by the heads' held-out accuracies, the
    /// same shape every step.
    Static,
}

/// The drafter's limits.
#[derive(Debug, Clone, PartialEq)]
pub struct MedusaSettings {
    pub tree: TreeMode,
    /// Drafted nodes a step verifies at most (`Static`: exactly, where the heads have them).
    pub max_nodes: usize,
    /// Candidates taken from each head.
    pub top: usize,
}

impl Default for MedusaSettings {
    fn default() -> Self {
        Self {
            tree: TreeMode::Auto,
            max_nodes: 32,
            top: 4,
        }
    }
}

/// Most plain steps `tree=auto` takes between two computations of the heads that did not pay.
const MAX_IDLE: usize = 32;
/// Calibration buckets: tenths of a head's probability of its candidate.
const BUCKETS: usize = 10;
/// Memory of each bucket (about 50 trials).
const DECAY: f64 = 0.98;
/// Heads whose acceptance the report names.
const HEAD_NAMES: [&str; 8] = [
    "head1_alpha",
    "head2_alpha",
    "head3_alpha",
    "head4_alpha",
    "head5_alpha",
    "head6_alpha",
    "head7_alpha",
    "head8_alpha",
];

#[derive(Debug)]
struct Pending {
    origins: Vec<Option<Origin>>,
    /// Each head's candidates' probabilities this step, by rank.
    probabilities: Vec<Vec<f64>>,
    map: Vec<NodeId>,
    greedy: bool,
}

/// Drafts a tree from Medusa heads (see the crate docs).
#[derive(Debug)]
pub struct MedusaDrafter<B: Backend> {
    heads: MedusaHeads<B>,
    settings: MedusaSettings,
    /// The tokens the heads draft from, where they do not draft from the whole vocabulary.
    vocab: Option<(DraftVocab, Option<VocabHead<B>>)>,
    /// `rank_accuracy[head][rank]` on the held-out split: the static tree's values.
    rank_accuracy: Vec<Vec<f64>>,
    /// Acceptance of each head's candidates by the probability the head gave them.
    calibration: Vec<AcceptanceByConfidence>,
    /// Acceptance of each head's likeliest candidate where it was tested (for reports).
    top_alpha: Vec<AcceptanceRate>,
    lengths: LengthController,
    /// The target's hidden state `[1, hidden]` at the last accepted position.
    hidden: Option<Tensor<B, 2>>,
    pending: Option<Pending>,
    /// `tree=auto`: plain steps left before the heads are computed again, and the wait after
    /// the next computation that does not pay (doubling to [`MAX_IDLE`]).
    idle: usize,
    next_idle: usize,
}

impl<B: Backend> MedusaDrafter<B> {
    /// A drafter over `heads`, with their held-out accuracies by rank.
    ///
    /// # Errors
    /// Limits of 0, or no heads.
    pub fn new(
        heads: MedusaHeads<B>,
        rank_accuracy: Vec<Vec<f64>>,
        settings: MedusaSettings,
    ) -> Result<Self, MedusaError> {
        if settings.max_nodes == 0 || settings.top == 0 || heads.num_heads() == 0 {
            return Err(MedusaError::Settings(format!(
                "nodes {}, top {} and heads {} must each be at least 1",
                settings.max_nodes,
                settings.top,
                heads.num_heads()
            )));
        }
        let n = heads.num_heads();
        Ok(Self {
            heads,
            settings,
            vocab: None,
            rank_accuracy,
            calibration: (0..n)
                .map(|_| AcceptanceByConfidence::new(BUCKETS, DECAY))
                .collect(),
            top_alpha: (0..n).map(|_| AcceptanceRate::with_decay(1.0)).collect(),
            lengths: LengthController::default(),
            hidden: None,
            pending: None,
            idle: 0,
            next_idle: 1,
        })
    }

    /// Drafting from `vocab` only (the heads' logits are over its tokens). Heads that share
    /// the target's head take its rows from `target_head` (`Transformer::output_weight`); without
    /// it they project through the whole head and pick the columns.
    ///
    /// # Errors
    /// Heads with their own projections of another width than `vocab`, or rows unreadable.
    pub fn with_draft_vocab(
        mut self,
        vocab: DraftVocab,
        target_head: Option<Tensor<B, 2>>,
    ) -> Result<Self, MedusaError> {
        if let Some(p) = self.heads.projections.first() {
            let width = p.weight.val().dims()[1];
            if width != vocab.len() {
                return Err(MedusaError::Settings(format!(
                    "the heads project to {width} tokens, the draft vocabulary has {}",
                    vocab.len()
                )));
            }
            self.vocab = Some((vocab, None));
            return Ok(self);
        }
        let head = match target_head {
            Some(weight) => {
                let vocab_size = weight.dims()[0];
                if vocab
                    .ids()
                    .last()
                    .is_some_and(|&t| t as usize >= vocab_size)
                {
                    return Err(MedusaError::Settings(format!(
                        "the draft vocabulary names tokens beyond the target's {vocab_size}"
                    )));
                }
                let device = weight.device();
                let rows = vocab.rows(weight);
                let shape = rows.dims().to_vec();
                let data: Vec<f32> = rows.into_data().convert::<f32>().into_vec().map_err(|e| {
                    MedusaError::Settings(format!("reading the head's rows: {e:?}"))
                })?;
                let rows = HostTensor { shape, data };
                VocabHead::Rows(Box::new(
                    HostLinear::from_host(rows, None, Some(WeightFormat::F32), false, &device)
                        .map_err(|e| MedusaError::Settings(e.to_string()))?,
                ))
            }
            None => {
                let ids: Vec<i64> = vocab.ids().iter().map(|&t| i64::from(t)).collect();
                let device = self
                    .heads
                    .blocks
                    .first()
                    .map(|b| b.linear.weight.val().device())
                    .unwrap_or_default();
                let ids =
                    Tensor::<B, 1, Int>::from_data(TensorData::new(ids, [vocab.len()]), &device);
                VocabHead::Pick(ids)
            }
        };
        self.vocab = Some((vocab, Some(head)));
        Ok(self)
    }

    pub fn lengths(&self) -> &LengthController {
        &self.lengths
    }

    /// Each head's `top` candidates with their probabilities, from the heads' logits.
    fn head_candidates(
        &self,
        request: &mut DraftRequest<'_, B>,
        hidden: Tensor<B, 2>,
    ) -> Result<Vec<Vec<(u32, f64)>>, EngineError> {
        let states = Tensor::cat(self.heads.states(hidden), 0);
        let logits = if self.heads.own_projections() {
            let rows: Vec<Tensor<B, 2>> = self
                .heads
                .projections
                .iter()
                .enumerate()
                .map(|(k, p)| p.forward(states.clone().narrow(0, k, 1)))
                .collect();
            Tensor::cat(rows, 0)
        } else {
            match self.vocab.as_ref().and_then(|(_, head)| head.as_ref()) {
                Some(VocabHead::Rows(rows)) => rows.forward(states)?,
                Some(VocabHead::Pick(ids)) => request
                    .target()?
                    .model()
                    .project(states)?
                    .select(1, ids.clone()),
                None => request.target()?.model().project(states)?,
            }
        };
        let [heads, vocab] = logits.dims();
        let values: Vec<f32> = logits
            .into_data()
            .convert::<f32>()
            .into_vec()
            .map_err(|e| EngineError::Drafter(format!("reading the heads' logits: {e:?}")))?;
        let token = |i: u32| match &self.vocab {
            Some((v, _)) => v.token(i as usize),
            None => Some(i),
        };
        Ok((0..heads)
            .map(|k| {
                top_probabilities(&values[k * vocab..(k + 1) * vocab], self.settings.top)
                    .into_iter()
                    .filter_map(|(i, p)| Some((token(i)?, p)))
                    .collect()
            })
            .collect())
    }

    fn assemble(&mut self, mut request: DraftRequest<'_, B>) -> Result<Draft<B>, EngineError> {
        let root = request.root()?;
        self.pending = None;
        let Some(hidden) = self.hidden.clone() else {
            return Ok(Draft::none(root));
        };
        if request.max_depth == 0 || self.lengths.wants_one_token_step() {
            return Ok(Draft::none(root));
        }
        if self.idle > 0 {
            self.idle -= 1;
            return Ok(Draft::none(root));
        }
        let start = Instant::now();
        let proposed = self.head_candidates(&mut request, hidden)?;
        let probabilities: Vec<Vec<f64>> = proposed
            .iter()
            .map(|c| c.iter().map(|&(_, p)| p).collect())
            .collect();
        let heads: Vec<HeadCandidates> = proposed
            .iter()
            .enumerate()
            .map(|(k, candidates)| {
                let mut chances: Vec<f64> = candidates
                    .iter()
                    .enumerate()
                    .map(|(r, &(_, p))| match self.settings.tree {
                        TreeMode::Auto => self.calibration[k].alpha(p),
                        TreeMode::Static => self
                            .rank_accuracy
                            .get(k)
                            .and_then(|a| a.get(r))
                            .copied()
                            .unwrap_or(0.0),
                    })
                    .collect();
                non_increasing(&mut chances);
                candidates
                    .iter()
                    .zip(chances)
                    .map(|(&(t, _), c)| (t, c))
                    .collect()
            })
            .collect();
        let limit = self.settings.max_nodes.min(request.max_nodes);
        let (candidates, origins) =
            assemble(root, &heads, request.max_depth, limit).map_err(drafter_error)?;
        self.lengths.record_draft_row(start.elapsed().as_secs_f64());
        let keep = match self.settings.tree {
            TreeMode::Static => candidates.len() - 1,
            TreeMode::Auto => {
                let spent = self.lengths.draft_cost().unwrap_or(0.0);
                let expected = candidates.expected_tokens_by_size();
                let r = |w| self.lengths.verification_cost(w);
                let keep = best_size(&expected, spent, r);
                // Computing the heads paid if the step is expected to beat a plain one with
                // their cost counted; if not, plain steps follow, more of them each time.
                if expected[keep] / (spent + r(keep + 1)) > 1.0 / r(1) {
                    self.next_idle = 1;
                } else {
                    self.idle = self.next_idle;
                    self.next_idle = (self.next_idle * 2).min(MAX_IDLE);
                }
                keep
            }
        }
        .min(limit);
        let (cut, map): (Candidates, Vec<NodeId>) = candidates.best(keep);
        let (tree, proposal) = cut.into_proposal(None).map_err(drafter_error)?;
        self.pending = Some(Pending {
            origins,
            probabilities,
            map,
            greedy: request.sampling.is_greedy(),
        });
        Ok(Draft {
            tree,
            proposal,
            draft_forwards: 0,
        })
    }

    fn learn(&mut self, outcome: &StepOutcome<B>, pending: Pending) {
        for trial in trials(outcome, &pending.map, pending.greedy) {
            let Some(Some(origin)) = pending.origins.get(trial.node) else {
                continue;
            };
            let probability = pending.probabilities[origin.head][origin.rank];
            self.calibration[origin.head].record(probability, trial.accepted);
            if origin.rank == 0 {
                self.top_alpha[origin.head].record_trial(trial.accepted);
            }
        }
    }
}

fn drafter_error(e: impl std::fmt::Display) -> EngineError {
    EngineError::Drafter(e.to_string())
}

/// The `k` likeliest tokens of logits `row` with their softmax probabilities, likeliest first
/// (lower id on ties).
pub(crate) fn top_probabilities(row: &[f32], k: usize) -> Vec<(u32, f64)> {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let total: f64 = row.iter().map(|&v| f64::from(v - max).exp()).sum();
    let mut best: Vec<(u32, f32)> = Vec::with_capacity(k + 1);
    for (id, &v) in row.iter().enumerate() {
        if best.len() == k && best.last().is_some_and(|&(_, w)| v <= w) {
            continue;
        }
        let at = best.partition_point(|&(_, w)| w >= v);
        best.insert(at, (id as u32, v));
        best.truncate(k);
    }
    best.into_iter()
        .map(|(id, v)| (id, f64::from(v - max).exp() / total))
        .collect()
}

impl<B: Backend> Drafter<B> for MedusaDrafter<B> {
    fn name(&self) -> &str {
        "medusa"
    }

    fn needs(&self) -> StepNeeds {
        StepNeeds {
            hidden: true,
            target_probs: false,
        }
    }

    fn begin(&mut self, _prompt: &[u32]) -> Result<(), EngineError> {
        self.pending = None;
        self.hidden = None;
        self.idle = 0;
        Ok(())
    }

    fn draft(&mut self, request: DraftRequest<'_, B>) -> Result<Draft<B>, EngineError> {
        self.assemble(request)
    }

    fn accepted(&mut self, _context: &[u32], outcome: &StepOutcome<B>) -> Result<(), EngineError> {
        self.lengths.observe(outcome);
        let Some(hidden) = &outcome.hidden else {
            return Err(EngineError::Drafter(
                "the engine handed no hidden states to Medusa heads".into(),
            ));
        };
        let rows = hidden.dims()[0];
        self.hidden = Some(hidden.clone().narrow(0, rows - 1, 1));
        if let Some(pending) = self.pending.take() {
            self.learn(outcome, pending);
        }
        Ok(())
    }

    /// The verification's slope, the heads' cost in target steps and each head's likeliest
    /// candidate's acceptance where it was tested.
    fn report_estimates(&self) -> Vec<(&'static str, f64)> {
        let mut named = vec![
            ("verify_slope", self.lengths.widths().slope()),
            ("heads_cost", self.lengths.draft_cost().unwrap_or(f64::NAN)),
        ];
        named.extend(
            self.top_alpha
                .iter()
                .zip(HEAD_NAMES)
                .map(|(rate, name)| (name, rate.alpha())),
        );
        named
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn top_probabilities_are_the_likeliest_in_order() {
        let row = [0.0f32, 2.0, 1.0, 2.0, -1.0];
        let top = top_probabilities(&row, 3);
        let ids: Vec<u32> = top.iter().map(|&(t, _)| t).collect();
        assert_eq!(ids, vec![1, 3, 2]);
        let total: f64 = row.iter().map(|&v| f64::from(v).exp()).sum();
        assert!((top[0].1 - 2f64.exp() / total).abs() < 1e-9);
        assert!((top[2].1 - 1f64.exp() / total).abs() < 1e-9);
    }
}
