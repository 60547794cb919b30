//! Training Medusa-1 heads on a frozen target from answers with its hidden states
//! (`spec_train::data`): the loss, the batches and the held-out figures, as a
//! [`spec_train::TrainTask`].
//!
//! The backbone never runs here: its hidden states come cached from the fast inference path.
//! A position `t` of an answer (the state that predicted token `t + 1`) teaches head `k`
//! (1-based) the token at `t + k + 1`:
//!
//! ```text
//! L = Σ_k λ_k · CE(p_k(· | h_t), y_{t+k+1}),   λ_k = 0.8^(k−1)
//! ```
//!
//! (Cai et al. 2024, eq. 1, with their decay), over the answer's positions that have that token.
//! The labels `y` are the answer's tokens ([`LabelSource::Answer`]) or what the target itself
//! predicts at each position, `argmax W h` ([`LabelSource::Target`]): on answers the target
//! wrote greedily the two agree; on a dataset's answers, teacher-forced, the second teaches
//! the heads the target's own next tokens, which is what they must guess when drafting. With a
//! [`DraftVocab`], the softmax runs over its tokens only and a label outside it teaches nothing
//! (it still counts as a miss in the accuracies).

use std::sync::Arc;

use burn::module::AutodiffModule;
use burn::tensor::activation::log_softmax;
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{ElementConversion, Int, Tensor, TensorData};
use rand::Rng;
use rand_chacha::ChaCha8Rng;
use spec_train::data::DistilledSet;
use spec_train::{Evaluation, TrainTask};

use crate::error::MedusaError;
use crate::heads::MedusaHeads;
use crate::vocab::DraftVocab;

/// Each later head's weight in the loss relative to the one before (Medusa's λ decay).
pub const LOSS_DECAY: f64 = 0.8;
/// Ranks whose held-out accuracy is kept for the static tree.
pub const RANKS: usize = 10;
/// Held-out positions evaluated at most (the first ones, in order).
const MAX_EVAL_POSITIONS: usize = 4096;
/// Positions a held-out forward takes at once.
const EVAL_CHUNK: usize = 256;
/// Rows whose target predictions one product computes.
const LABEL_CHUNK: usize = 512;

/// Where the tokens the heads learn come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LabelSource {
    /// The answer's own tokens.
    #[default]
    Answer,
    /// The target's prediction at each position of the answer (`argmax W h`).
    Target,
}

/// How the heads are set up for training.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TrainingSetup {
    pub heads: usize,
    /// Each head a projection of its own (initialised from the target's head), or the target's
    /// head shared and frozen.
    pub own_projections: bool,
    /// The draft vocabulary's size: the train labels' most frequent tokens; 0 keeps the whole
    /// vocabulary.
    pub draft_vocab: usize,
    pub labels: LabelSource,
}

/// One batch: hidden states and, per head, each row's target and whether it has one.
#[derive(Debug, Clone)]
pub struct MedusaBatch<B: Backend> {
    /// `[n, hidden]`.
    pub hidden: Tensor<B, 2>,
    /// Per head `[n]` (0 where the row has no target).
    pub targets: Vec<Tensor<B, 1, Int>>,
    /// Per head `[n]`: 1 where the row has a target in the draft vocabulary.
    pub masks: Vec<Tensor<B, 1>>,
    /// Per head: rows with a label, in the draft vocabulary or not.
    pub labelled: Vec<usize>,
    pub rows: usize,
}

/// A position of the training set: sequence and hidden row.
#[derive(Debug, Clone, Copy)]
struct Position {
    sequence: u32,
    row: u32,
}

/// The Medusa training task over a distilled set.
#[derive(Debug)]
pub struct MedusaTraining<B: AutodiffBackend> {
    set: Arc<DistilledSet>,
    heads: usize,
    /// Per sequence, the label of each answer row.
    labels: Vec<Vec<u32>>,
    vocab: Option<DraftVocab>,
    /// The label counts of the train split by token, and the draft vocabulary's share of them
    /// on each split.
    coverage: (f64, f64),
    train: Vec<Position>,
    held_out: Vec<Position>,
    /// A sample of the train positions, evaluated as the held-out ones are (for seeing the
    /// heads overfit).
    train_sample: Vec<Position>,
    /// The target's output rows `[draft vocab, hidden]`, frozen, where the heads share them.
    shared: Option<Tensor<B::InnerBackend, 2>>,
    /// The same rows, what a head's own projection starts from.
    projection: Tensor<B::InnerBackend, 2>,
    identity: serde_json::Value,
}

impl<B: AutodiffBackend> MedusaTraining<B> {
    /// A task training heads as `setup` says on `set`; `target_head` is the target's output
    /// weight `[vocab, hidden]`; `identity` names the target and the settings (checkpoints keep
    /// it).
    ///
    /// # Errors
    /// A set with no train or no held-out positions, a head of another shape than the set's.
    pub fn new(
        set: Arc<DistilledSet>,
        target_head: Tensor<B::InnerBackend, 2>,
        setup: &TrainingSetup,
        identity: serde_json::Value,
    ) -> Result<Self, MedusaError> {
        let [vocab_size, hidden] = target_head.dims();
        if hidden != set.hidden_size || vocab_size != set.vocab_size {
            return Err(MedusaError::Settings(format!(
                "the target's head is [{vocab_size}, {hidden}], the answers' states have {} \
                 features over {} tokens",
                set.hidden_size, set.vocab_size
            )));
        }
        let (mut train, mut held_out) = (Vec::new(), Vec::new());
        for (s, sequence) in set.sequences.iter().enumerate() {
            let into = if sequence.held_out {
                &mut held_out
            } else {
                &mut train
            };
            // Row i predicts answer token i; head 1 needs the token after it.
            for row in 0..sequence.answer().len().saturating_sub(1) {
                into.push(Position {
                    sequence: s as u32,
                    row: row as u32,
                });
            }
        }
        if train.is_empty() || held_out.is_empty() {
            return Err(MedusaError::Settings(format!(
                "the training data has {} train and {} held-out positions; both must be positive",
                train.len(),
                held_out.len()
            )));
        }
        held_out.truncate(MAX_EVAL_POSITIONS);
        let stride = train.len().div_ceil(MAX_EVAL_POSITIONS);
        let train_sample = train.iter().step_by(stride).copied().collect();

        let labels = match setup.labels {
            LabelSource::Answer => set.sequences.iter().map(|s| s.answer().to_vec()).collect(),
            LabelSource::Target => target_predictions(&set, &target_head)?,
        };
        let mut counts = [vec![0u64; vocab_size], vec![0u64; vocab_size]];
        for (sequence, labels) in set.sequences.iter().zip(&labels) {
            for &t in labels {
                counts[usize::from(sequence.held_out)][t as usize] += 1;
            }
        }
        let vocab = (setup.draft_vocab > 0 && setup.draft_vocab < vocab_size)
            .then(|| DraftVocab::most_frequent(&counts[0], setup.draft_vocab))
            .transpose()?;
        let coverage = vocab.as_ref().map_or((1.0, 1.0), |v| {
            (v.coverage(&counts[0]), v.coverage(&counts[1]))
        });
        let projection = match &vocab {
            Some(v) => v.rows(target_head),
            None => target_head,
        };
        Ok(Self {
            set,
            heads: setup.heads,
            labels,
            vocab,
            coverage,
            train,
            held_out,
            train_sample,
            shared: (!setup.own_projections).then(|| projection.clone()),
            projection,
            identity,
        })
    }

    /// The draft vocabulary, where the heads have one.
    pub fn draft_vocab(&self) -> Option<&DraftVocab> {
        self.vocab.as_ref()
    }

    /// The share of the train and of the held-out labels the draft vocabulary holds (1 without
    /// one).
    pub fn coverage(&self) -> (f64, f64) {
        self.coverage
    }

    /// What a head's own projection starts from: the target's output rows of the draft
    /// vocabulary `[draft vocab, hidden]`.
    pub fn initial_projection(&self) -> Tensor<B::InnerBackend, 2> {
        self.projection.clone()
    }

    /// Train positions (answer tokens with at least head 1's target).
    pub fn train_positions(&self) -> usize {
        self.train.len()
    }

    /// The batch of `positions` on backend `C`.
    fn batch_of<C: Backend>(&self, positions: &[Position], device: &C::Device) -> MedusaBatch<C> {
        let hidden_size = self.set.hidden_size;
        let n = positions.len();
        let mut hidden = Vec::with_capacity(n * hidden_size);
        let mut targets = vec![Vec::with_capacity(n); self.heads];
        let mut masks = vec![Vec::with_capacity(n); self.heads];
        let mut labelled = vec![0; self.heads];
        for p in positions {
            let sequence = &self.set.sequences[p.sequence as usize];
            let row = p.row as usize;
            hidden.extend_from_slice(sequence.hidden_row(row, hidden_size));
            let labels = &self.labels[p.sequence as usize];
            for k in 0..self.heads {
                // Row `row` predicted answer token `row`; head k (0-based) the one k + 1 later.
                let label = labels.get(row + k + 1);
                labelled[k] += usize::from(label.is_some());
                let index = label.and_then(|&t| match &self.vocab {
                    Some(v) => v.index_of(t),
                    None => Some(t as usize),
                });
                match index {
                    Some(i) => {
                        targets[k].push(i as i64);
                        masks[k].push(1.0f32);
                    }
                    None => {
                        targets[k].push(0);
                        masks[k].push(0.0);
                    }
                }
            }
        }
        MedusaBatch {
            hidden: Tensor::from_data(TensorData::new(hidden, [n, hidden_size]), device),
            targets: targets
                .into_iter()
                .map(|t| Tensor::from_data(TensorData::new(t, [n]), device))
                .collect(),
            masks: masks
                .into_iter()
                .map(|m| Tensor::from_data(TensorData::new(m, [n]), device))
                .collect(),
            labelled,
            rows: n,
        }
    }
}

/// Each head's mean cross-entropy over its masked rows, `[1]` each.
fn head_losses<C: Backend>(logits: Vec<Tensor<C, 2>>, batch: &MedusaBatch<C>) -> Vec<Tensor<C, 1>> {
    logits
        .into_iter()
        .zip(batch.targets.iter().zip(&batch.masks))
        .map(|(logits, (targets, mask))| head_loss(logits, targets, mask))
        .collect()
}

/// One head's mean cross-entropy over the rows `mask` keeps, `[1]`.
fn head_loss<C: Backend>(
    logits: Tensor<C, 2>,
    targets: &Tensor<C, 1, Int>,
    mask: &Tensor<C, 1>,
) -> Tensor<C, 1> {
    let [n, _] = logits.dims();
    let picked = log_softmax(logits, 1)
        .gather(1, targets.clone().reshape([n, 1]))
        .reshape([n]);
    let count = mask.clone().sum().clamp_min(1.0);
    -(picked * mask.clone()).sum() / count
}

/// `Σ_k λ_k · loss_k`.
fn weighted<C: Backend>(losses: Vec<Tensor<C, 1>>) -> Option<Tensor<C, 1>> {
    losses
        .into_iter()
        .enumerate()
        .map(|(k, l)| l.mul_scalar(LOSS_DECAY.powi(k as i32)))
        .reduce(|a, b| a + b)
}

/// Each row's rank of its target among the head's logits (0 = the likeliest), `None` where
/// the row has no target.
fn target_ranks<C: Backend>(
    logits: Tensor<C, 2>,
    targets: &Tensor<C, 1, Int>,
    mask: &Tensor<C, 1>,
) -> Vec<Option<usize>> {
    let [n, vocab] = logits.dims();
    let target_logit = logits.clone().gather(1, targets.clone().reshape([n, 1]));
    let ranks: Vec<i64> = logits
        .greater(target_logit.expand([n, vocab]))
        .int()
        .sum_dim(1)
        .into_data()
        .convert::<i64>()
        .into_vec()
        .unwrap_or_default();
    let mask: Vec<f32> = mask
        .clone()
        .into_data()
        .convert::<f32>()
        .into_vec()
        .unwrap_or_default();
    ranks
        .into_iter()
        .zip(mask)
        .map(|(r, m)| (m > 0.0).then_some(r as usize))
        .collect()
}

/// The target's prediction `argmax W h` at every answer row of `set`, per sequence.
fn target_predictions<C: Backend>(
    set: &DistilledSet,
    head: &Tensor<C, 2>,
) -> Result<Vec<Vec<u32>>, MedusaError> {
    let hidden = set.hidden_size;
    let weight = head.clone().transpose();
    let rows: Vec<(usize, usize)> = set
        .sequences
        .iter()
        .enumerate()
        .flat_map(|(s, q)| (0..q.answer().len()).map(move |r| (s, r)))
        .collect();
    let mut labels: Vec<Vec<u32>> = set
        .sequences
        .iter()
        .map(|q| Vec::with_capacity(q.answer().len()))
        .collect();
    for chunk in rows.chunks(LABEL_CHUNK) {
        let mut values = Vec::with_capacity(chunk.len() * hidden);
        for &(s, r) in chunk {
            values.extend_from_slice(set.sequences[s].hidden_row(r, hidden));
        }
        let states = Tensor::<C, 2>::from_data(
            TensorData::new(values, [chunk.len(), hidden]),
            &head.device(),
        );
        let best: Vec<i64> = states
            .matmul(weight.clone())
            .argmax(1)
            .into_data()
            .convert::<i64>()
            .into_vec()
            .map_err(|e| {
                MedusaError::Settings(format!("reading the target's predictions: {e:?}"))
            })?;
        for (&(s, _), t) in chunk.iter().zip(best) {
            labels[s].push(t as u32);
        }
    }
    Ok(labels)
}

/// Held-out figures of a set of heads: each head's loss and, per rank, how often its target
/// sat there.
#[derive(Debug, Clone, PartialEq)]
pub struct HeldOut {
    pub loss: f64,
    pub head_losses: Vec<f64>,
    /// `rank_accuracy[k][r]` for `r < RANKS`.
    pub rank_accuracy: Vec<Vec<f64>>,
}

impl<B: AutodiffBackend> MedusaTraining<B> {
    /// The heads' held-out figures.
    pub fn held_out_figures(
        &self,
        heads: &MedusaHeads<B::InnerBackend>,
        device: &burn::tensor::Device<B::InnerBackend>,
    ) -> HeldOut {
        self.figures(&self.held_out, heads, device)
    }

    /// The same figures on a sample of the train positions: far above the held-out ones, the
    /// heads learnt their answers rather than the target.
    pub fn train_figures(
        &self,
        heads: &MedusaHeads<B::InnerBackend>,
        device: &burn::tensor::Device<B::InnerBackend>,
    ) -> HeldOut {
        self.figures(&self.train_sample, heads, device)
    }

    fn figures(
        &self,
        positions: &[Position],
        heads: &MedusaHeads<B::InnerBackend>,
        device: &burn::tensor::Device<B::InnerBackend>,
    ) -> HeldOut {
        let k = self.heads;
        let mut loss_sums = vec![0.0; k];
        let mut loss_counts = vec![0usize; k];
        let mut counts = vec![0usize; k];
        let mut at_rank = vec![vec![0usize; RANKS]; k];
        for chunk in positions.chunks(EVAL_CHUNK) {
            let batch = self.batch_of::<B::InnerBackend>(chunk, device);
            let logits = heads.logits(batch.hidden.clone(), self.shared.as_ref());
            for (head, logits) in logits.into_iter().enumerate() {
                let ranks = target_ranks(logits.clone(), &batch.targets[head], &batch.masks[head]);
                let valid = ranks.iter().flatten().count();
                let loss = head_loss(logits, &batch.targets[head], &batch.masks[head]);
                let mean: f64 = loss.into_scalar().elem();
                loss_sums[head] += mean * valid as f64;
                loss_counts[head] += valid;
                counts[head] += batch.labelled[head];
                for r in ranks.into_iter().flatten() {
                    if r < RANKS {
                        at_rank[head][r] += 1;
                    }
                }
            }
        }
        let head_losses: Vec<f64> = loss_sums
            .iter()
            .zip(&loss_counts)
            .map(|(s, &c)| if c > 0 { s / c as f64 } else { f64::NAN })
            .collect();
        let loss = head_losses
            .iter()
            .enumerate()
            .map(|(i, l)| l * LOSS_DECAY.powi(i as i32))
            .sum();
        let rank_accuracy = at_rank
            .iter()
            .zip(&counts)
            .map(|(ranks, &c)| {
                ranks
                    .iter()
                    .map(|&r| if c > 0 { r as f64 / c as f64 } else { 0.0 })
                    .collect()
            })
            .collect();
        HeldOut {
            loss,
            head_losses,
            rank_accuracy,
        }
    }
}

impl<B: AutodiffBackend> TrainTask<B> for MedusaTraining<B> {
    type Model = MedusaHeads<B>;
    type Batch = MedusaBatch<B>;
    type Error = MedusaError;

    fn batch(
        &self,
        _step: usize,
        rng: &mut ChaCha8Rng,
        batch_size: usize,
        device: &B::Device,
    ) -> Result<Self::Batch, Self::Error> {
        let positions: Vec<Position> = (0..batch_size)
            .map(|_| self.train[rng.random_range(0..self.train.len())])
            .collect();
        Ok(self.batch_of::<B>(&positions, device))
    }

    fn batch_tokens(&self, batch: &Self::Batch) -> usize {
        batch.rows
    }

    fn loss(&self, model: &Self::Model, batch: Self::Batch) -> Tensor<B, 1> {
        let shared = self.shared.clone().map(Tensor::<B, 2>::from_inner);
        let logits = model.logits(batch.hidden.clone(), shared.as_ref());
        weighted(head_losses(logits, &batch))
            .unwrap_or_else(|| Tensor::zeros([1], &batch.hidden.device()))
    }

    fn evaluate(
        &self,
        model: &<Self::Model as AutodiffModule<B>>::InnerModule,
        device: &B::Device,
    ) -> Result<Evaluation, Self::Error> {
        let inner_device = Tensor::<B, 1>::zeros([1], device).inner().device();
        let figures = self.held_out_figures(model, &inner_device);
        let mut metrics = Vec::new();
        for (k, (loss, ranks)) in figures
            .head_losses
            .iter()
            .zip(&figures.rank_accuracy)
            .enumerate()
        {
            metrics.push((format!("head{}_loss", k + 1), *loss));
            metrics.push((format!("head{}_top1", k + 1), ranks[0]));
            metrics.push((format!("head{}_top5", k + 1), ranks[..5].iter().sum()));
        }
        Ok(Evaluation {
            loss: figures.loss,
            metrics,
        })
    }

    fn identity(&self) -> serde_json::Value {
        self.identity.clone()
    }
}
