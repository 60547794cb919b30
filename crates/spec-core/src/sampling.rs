//! Sampling settings, and the backend implementation that turns logits into the distribution
//! they define.
//!
//! The same settings are applied to the target's and the draft's logits, so that speculative
//! decoding reproduces the distribution plain decoding would sample from with those settings.
//!
//! # The rule, row by row (the f64 [`reference`](crate::reference) implements it too)
//! 1. `temperature == 0`: greedy, a point mass on the largest logit; ties go to the lowest index.
//! 2. `p = softmax(logits / temperature)`; a `-inf` logit gets probability 0 (masked or padded
//!    vocabulary entries). NaN, `+inf`, or a row that is `-inf` everywhere is an error.
//! 3. `top_k = k`: keep the `k` most probable tokens.
//! 4. `top_p = t < 1`: walk the kept tokens from most to least probable and keep the shortest
//!    prefix whose mass reaches `t` times the kept mass.
//! 5. `min_p = m > 0`: keep the tokens with `p ≥ m · max p`.
//! 6. Renormalize what is kept.
//!
//! Ordering is by probability, then by lower token index, so ties at a cut-off are resolved the
//! same way on every backend, whatever its sort does with equal keys.
//!
//! Validity of the logits is checked where results are read back to the host, at no extra sync:
//! an invalid row turns its whole distribution into NaN, which the readers report as
//! [`SpecError::NonFiniteLogits`].

use burn::tensor::{Int, Tensor, TensorData, Transaction, backend::Backend};
use serde::{Deserialize, Serialize};

use crate::error::{Result, Source, SpecError};
use crate::rng::SpecRng;

/// How tokens are chosen from a model's logits. `temperature == 0` means greedy.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct SamplingConfig {
    pub temperature: f64,
    pub top_k: Option<usize>,
    pub top_p: Option<f64>,
    pub min_p: Option<f64>,
    pub seed: u64,
}

impl Default for SamplingConfig {
    fn default() -> Self {
        Self::greedy()
    }
}

impl SamplingConfig {
    /// Argmax decoding.
    pub fn greedy() -> Self {
        Self {
            temperature: 0.0,
            top_k: None,
            top_p: None,
            min_p: None,
            seed: 0,
        }
    }

    /// Plain sampling at `temperature`, no truncation.
    pub fn with_temperature(temperature: f64) -> Self {
        Self {
            temperature,
            ..Self::greedy()
        }
    }

    pub fn top_k(mut self, k: usize) -> Self {
        self.top_k = Some(k);
        self
    }

    pub fn top_p(mut self, p: f64) -> Self {
        self.top_p = Some(p);
        self
    }

    pub fn min_p(mut self, p: f64) -> Self {
        self.min_p = Some(p);
        self
    }

    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }

    /// Checks every setting; the functions that take a config call this first.
    pub fn validate(&self) -> Result<()> {
        if !self.temperature.is_finite() || self.temperature < 0.0 {
            return Err(SpecError::InvalidTemperature(self.temperature));
        }
        if self.top_k == Some(0) {
            return Err(SpecError::InvalidTopK);
        }
        if let Some(p) = self.top_p
            && !(p > 0.0 && p <= 1.0)
        {
            return Err(SpecError::InvalidTopP(p));
        }
        if let Some(p) = self.min_p
            && !(0.0..=1.0).contains(&p)
        {
            return Err(SpecError::InvalidMinP(p));
        }
        Ok(())
    }

    pub fn is_greedy(&self) -> bool {
        self.temperature == 0.0
    }

    /// The generator for a run with these settings.
    pub fn rng(&self) -> SpecRng {
        SpecRng::new(self.seed)
    }

    /// `top_k` if it truncates a vocabulary of `vocab` entries.
    pub(crate) fn effective_top_k(&self, vocab: usize) -> Option<usize> {
        self.top_k.filter(|&k| k < vocab)
    }

    /// `top_p` if it truncates anything.
    pub(crate) fn effective_top_p(&self) -> Option<f64> {
        self.top_p.filter(|&p| p < 1.0)
    }

    /// `min_p` if it truncates anything.
    pub(crate) fn effective_min_p(&self) -> Option<f64> {
        self.min_p.filter(|&p| p > 0.0)
    }
}

/// Turns logits `[rows, vocab]` into the distributions `[rows, vocab]` that `config` samples from.
///
/// Greedy settings give the point mass on each row's argmax. Invalid rows come out as NaN (see
/// the module docs).
pub fn probabilities<B: Backend>(
    logits: Tensor<B, 2>,
    config: &SamplingConfig,
) -> Result<Tensor<B, 2>> {
    config.validate()?;
    Ok(probabilities_unchecked(logits, config))
}

pub(crate) fn probabilities_unchecked<B: Backend>(
    logits: Tensor<B, 2>,
    config: &SamplingConfig,
) -> Tensor<B, 2> {
    let [rows, vocab] = logits.dims();
    let device = logits.device();
    if config.is_greedy() {
        let (argmax, witness) = greedy_argmax(logits);
        let columns = Tensor::<B, 1, Int>::arange(0..vocab as i64, &device).reshape([1, vocab]);
        // The witness is finite or -inf for a valid row, so `exp(witness) · 0` is 0 there and NaN
        // for an invalid row.
        return columns.equal(argmax).float() + witness.exp().mul_scalar(0.0);
    }

    let scaled = if config.temperature == 1.0 {
        logits
    } else {
        logits.div_scalar(config.temperature)
    };
    let max = scaled.clone().max_dim(1);
    let exp = (scaled - max).exp();
    // The softmax denominator lies in [1, vocab] for a valid row and is NaN otherwise.
    let denominator = exp.clone().sum_dim(1);
    let probs = exp / denominator.clone();

    let mut keep = None;
    let top_k = config.effective_top_k(vocab);
    let top_p = config.effective_top_p();
    if top_k.is_some() || top_p.is_some() {
        let sorted = probs.clone().sort_descending(1);
        let mut kept_sorted = sorted.clone();
        if let Some(k) = top_k {
            let kth = sorted.narrow(1, k - 1, 1);
            let count = Tensor::<B, 2>::full([rows, 1], k as f32, &device);
            keep = Some(keep_first(probs.clone(), kth, count));
            kept_sorted = kept_sorted.narrow(1, 0, k);
        }
        if let Some(p) = top_p {
            let width = kept_sorted.dims()[1];
            let cumulative = kept_sorted.clone().cumsum(1);
            let total = cumulative.clone().narrow(1, width - 1, 1);
            // A sorted entry is in the nucleus when the mass before it is still below p · total.
            // (Formulated without a gather: burn 0.21's wgpu fusion mis-evaluates a gather whose
            // index tensor has a second consumer; see docs/ARCHITECTURE.md.)
            let inside = (cumulative - kept_sorted.clone()).lower(total.mul_scalar(p));
            let count = inside.clone().float().sum_dim(1);
            let last = kept_sorted.mask_fill(inside.bool_not(), 2.0).min_dim(1);
            let keep_p = keep_first(probs.clone(), last, count);
            keep = Some(match keep {
                Some(k) => k.bool_and(keep_p),
                None => keep_p,
            });
        }
    }
    if let Some(m) = config.effective_min_p() {
        // The most probable token has exp(0) / denominator.
        let floor = denominator.clone().recip().mul_scalar(m);
        let keep_m = probs.clone().greater_equal(floor);
        keep = Some(match keep {
            Some(k) => k.bool_and(keep_m),
            None => keep_m,
        });
    }
    match keep {
        None => probs,
        Some(keep) => {
            let kept = probs.mask_fill(keep.bool_not(), 0.0);
            let mass = kept.clone().sum_dim(1) + denominator.mul_scalar(0.0);
            kept / mass
        }
    }
}

/// Keeps, in each row of `probs`, the first `count` tokens in (probability descending, index
/// ascending) order, given the probability `last` of the `count`-th of them. Sorting is done by
/// the caller; this only resolves ties at `last` by index, so the result does not depend on the
/// backend's sort being stable.
fn keep_first<B: Backend>(
    probs: Tensor<B, 2>,
    last: Tensor<B, 2>,
    count: Tensor<B, 2>,
) -> Tensor<B, 2, burn::tensor::Bool> {
    let above = probs.clone().greater(last.clone());
    let above_count = above.clone().float().sum_dim(1);
    let tied = probs.equal(last);
    let tie_rank = tied.clone().float().cumsum(1);
    let tied_kept = tied.bool_and(tie_rank.lower_equal(count - above_count));
    above.bool_or(tied_kept)
}

/// Each row's largest logit's index `[rows, 1]` (ties to the lowest index), and a validity
/// witness `[rows, 1]` that is NaN exactly when the row is invalid.
pub(crate) fn greedy_argmax<B: Backend>(logits: Tensor<B, 2>) -> (Tensor<B, 2, Int>, Tensor<B, 2>) {
    let [_, vocab] = logits.dims();
    let device = logits.device();
    let max = logits.clone().max_dim(1);
    // Σ (x - max) is finite or -inf for a valid row; NaN when a NaN or +inf is present or when
    // every entry is -inf (then -inf - -inf = NaN).
    let witness = (logits.clone() - max.clone()).sum_dim(1);
    // Score vocab - j at the maxima and 0 elsewhere: the largest score is the lowest index.
    let reversed = Tensor::<B, 1, Int>::arange(0..vocab as i64, &device)
        .neg()
        .add_scalar(vocab as i64)
        .reshape([1, vocab]);
    let score = logits.equal(max).int() * reversed;
    let argmax = score.max_dim(1).neg().add_scalar(vocab as i64);
    (argmax, witness)
}

/// Reads greedy tokens of every row, failing on invalid rows.
pub(crate) fn read_greedy<B: Backend>(logits: Tensor<B, 2>, what: Source) -> Result<Vec<u32>> {
    let (argmax, witness) = greedy_argmax(logits);
    let [argmax, witness] = read2(Transaction::default().register(argmax).register(witness));
    let witness: Vec<f64> = witness.iter::<f64>().collect();
    argmax
        .iter::<i64>()
        .zip(witness)
        .enumerate()
        .map(|(row, (token, w))| {
            if w.is_nan() {
                Err(SpecError::NonFiniteLogits { what, row })
            } else {
                Ok(token as u32)
            }
        })
        .collect()
}

/// Draws one token per row of `probs` `[rows, vocab]` by inverse CDF: the smallest index whose
/// cumulative mass exceeds `uniform · total`, never a token of probability 0.
///
/// Returns the tokens `[rows, 1]` and each row's total mass `[rows, 1]` (NaN for a bad row).
pub(crate) fn inverse_cdf<B: Backend>(
    probs: Tensor<B, 2>,
    uniforms: &[f64],
) -> (Tensor<B, 2, Int>, Tensor<B, 2>) {
    let [rows, vocab] = probs.dims();
    let device = probs.device();
    let cumulative = probs.clone().cumsum(1);
    let total = cumulative.clone().narrow(1, vocab - 1, 1);
    let uniforms: Vec<f32> = uniforms.iter().map(|&u| u as f32).collect();
    let uniforms = Tensor::<B, 2>::from_data(TensorData::new(uniforms, [rows, 1]), &device);
    let below = cumulative
        .lower_equal(total.clone() * uniforms)
        .int()
        .sum_dim(1);
    // Rounding can put the target past the last step of the CDF; the last token with mass is the
    // one it belongs to.
    let one_based = Tensor::<B, 1, Int>::arange(1..vocab as i64 + 1, &device).reshape([1, vocab]);
    let last_nonzero = (probs.greater_elem(0.0).int() * one_based)
        .max_dim(1)
        .sub_scalar(1);
    (below.min_pair(last_nonzero), total)
}

/// Reads the tokens and totals of [`inverse_cdf`], failing on rows without usable mass.
pub(crate) fn read_samples<B: Backend>(
    tokens: Tensor<B, 2, Int>,
    totals: Tensor<B, 2>,
    what: Source,
) -> Result<Vec<u32>> {
    let [tokens, totals] = read2(Transaction::default().register(tokens).register(totals));
    let totals: Vec<f64> = totals.iter::<f64>().collect();
    tokens
        .iter::<i64>()
        .zip(totals)
        .enumerate()
        .map(|(row, (token, total))| {
            if total.is_finite() && total > 0.0 && token >= 0 {
                Ok(token as u32)
            } else {
                Err(SpecError::NonFiniteLogits { what, row })
            }
        })
        .collect()
}

/// Samples one token per row of `logits` `[rows, vocab]` with `config`, drawing one uniform per
/// row from `rng` (none when greedy). This is plain decoding's sampler.
pub fn sample_logits<B: Backend>(
    logits: Tensor<B, 2>,
    config: &SamplingConfig,
    rng: &mut SpecRng,
    what: Source,
) -> Result<Vec<u32>> {
    config.validate()?;
    if config.is_greedy() {
        return read_greedy(logits, what);
    }
    sample_probabilities(probabilities_unchecked(logits, config), rng, what)
}

/// Samples one token per row of distributions `[rows, vocab]` from [`probabilities`], drawing one
/// uniform per row from `rng`. A drafter uses this to sample from the `q` it later hands to the
/// verifier.
pub fn sample_probabilities<B: Backend>(
    probs: Tensor<B, 2>,
    rng: &mut SpecRng,
    what: Source,
) -> Result<Vec<u32>> {
    let rows = probs.dims()[0];
    let uniforms: Vec<f64> = (0..rows).map(|_| rng.uniform()).collect();
    let (tokens, totals) = inverse_cdf(probs, &uniforms);
    read_samples(tokens, totals, what)
}

pub(crate) fn read2<B: Backend>(transaction: Transaction<B>) -> [TensorData; 2] {
    let data = transaction.execute();
    let mut it = data.into_iter();
    match (it.next(), it.next()) {
        (Some(a), Some(b)) => [a, b],
        // A transaction returns one entry per registered tensor.
        _ => unreachable!("a transaction of two tensors returned fewer"),
    }
}
