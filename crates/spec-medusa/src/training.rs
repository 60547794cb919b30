//! Training Medusa-1 heads on a frozen target from its own answers (`spec_train::data`): the
//! loss, the batches and the held-out figures, as a [`spec_train::TrainTask`].
//!
//! The backbone never runs here: its hidden states come cached from the fast inference path.
//! A position `t` of an answer (the state that predicted token `t + 1`) teaches head `k`
//! (1-based) the token at `t + k + 1`:
//!
//! ```text
//! L = Σ_k λ_k · CE(p_k(· | h_t), x_{t+k+1}),   λ_k = 0.8^(k−1)
//! ```
//!
//! (Cai et al. 2024, eq. 1, with their decay), over the answer's positions that have that token.

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

/// Each later head's weight in the loss relative to the one before (Medusa's λ decay).
pub const LOSS_DECAY: f64 = 0.8;
/// Ranks whose held-out accuracy is kept for the static tree.
pub const RANKS: usize = 10;
/// Held-out positions evaluated at most (the first ones, in order).
const MAX_EVAL_POSITIONS: usize = 4096;
/// Positions a held-out forward takes at once.
const EVAL_CHUNK: usize = 256;

/// One batch: hidden states and, per head, each row's target and whether it has one.
#[derive(Debug, Clone)]
pub struct MedusaBatch<B: Backend> {
    /// `[n, hidden]`.
    pub hidden: Tensor<B, 2>,
    /// Per head `[n]` (0 where the row has no target).
    pub targets: Vec<Tensor<B, 1, Int>>,
    /// Per head `[n]`: 1 where the row has a target.
    pub masks: Vec<Tensor<B, 1>>,
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
    train: Vec<Position>,
    held_out: Vec<Position>,
    /// The target's output weight `[vocab, hidden]`, frozen, where the heads share it.
    shared: Option<Tensor<B::InnerBackend, 2>>,
    identity: serde_json::Value,
}

impl<B: AutodiffBackend> MedusaTraining<B> {
    /// A task training `heads` heads on `set`; `shared` is the target's output weight where the
    /// heads share it; `identity` names the target and the settings (checkpoints keep it).
    ///
    /// # Errors
    /// A set with no train or no held-out positions.
    pub fn new(
        set: Arc<DistilledSet>,
        heads: usize,
        shared: Option<Tensor<B::InnerBackend, 2>>,
        identity: serde_json::Value,
    ) -> Result<Self, MedusaError> {
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
        Ok(Self {
            set,
            heads,
            train,
            held_out,
            shared,
            identity,
        })
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
        for p in positions {
            let sequence = &self.set.sequences[p.sequence as usize];
            let row = p.row as usize;
            hidden.extend_from_slice(sequence.hidden_row(row, hidden_size));
            let answer = sequence.answer();
            for k in 0..self.heads {
                // Row `row` predicted answer token `row`; head k (0-based) the one k + 1 later.
                match answer.get(row + k + 1) {
                    Some(&t) => {
                        targets[k].push(i64::from(t));
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
        let k = self.heads;
        let mut loss_sums = vec![0.0; k];
        let mut counts = vec![0usize; k];
        let mut at_rank = vec![vec![0usize; RANKS]; k];
        for chunk in self.held_out.chunks(EVAL_CHUNK) {
            let batch = self.batch_of::<B::InnerBackend>(chunk, device);
            let logits = heads.logits(batch.hidden.clone(), self.shared.as_ref());
            for (head, logits) in logits.into_iter().enumerate() {
                let ranks = target_ranks(logits.clone(), &batch.targets[head], &batch.masks[head]);
                let valid = ranks.iter().flatten().count();
                let loss = head_loss(logits, &batch.targets[head], &batch.masks[head]);
                let mean: f64 = loss.into_scalar().elem();
                loss_sums[head] += mean * valid as f64;
                counts[head] += valid;
                for r in ranks.into_iter().flatten() {
                    if r < RANKS {
                        at_rank[head][r] += 1;
                    }
                }
            }
        }
        let head_losses: Vec<f64> = loss_sums
            .iter()
            .zip(&counts)
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
