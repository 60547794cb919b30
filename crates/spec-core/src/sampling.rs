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
//! same way on every backend.
//!
//! # Where the work happens
//! - Temperature and softmax: on the device (four ops; a `[6, V]` pass each on flex).
//! - Truncation (steps 3 to 5): the probabilities are read back once and each row's kept set is
//!   found on the host without sorting the vocabulary (`truncate.rs` shows why that is exact),
//!   then the truncated rows are uploaded. No device sort: on flex a full-vocabulary sort was the
//!   most expensive op of a step by far.
//! - Greedy: burn's `argmax` plus a row sum for validity, read back together (see
//!   `greedy_tokens`); the point masses of [`probabilities`] are built on the host.
//!
//! Validity of the logits is checked where results are read back to the host: an invalid row
//! turns its whole distribution into NaN, which the readers report as
//! [`SpecError::NonFiniteLogits`].

use burn::tensor::{DType, Int, Tensor, TensorData, Transaction, backend::Backend};
use serde::{Deserialize, Serialize};

use crate::error::{Result, Source, SpecError};
use crate::rng::SpecRng;
use crate::truncate::truncate_row;

/// The smallest positive temperature [`SamplingConfig::validate`] accepts.
///
/// Logits are f32, and [`probabilities`] divides them by the temperature before it subtracts each
/// row's maximum. A quotient `x / T` beyond f32's largest finite value, 3.4e38, rounds to ±inf;
/// once the row's maximum has, `x / T − max` is `inf − inf`, NaN, and the row is reported as
/// unusable logits. Every logit with `|x| ≤ 3.4e38 · T` stays finite: at `T = 1e-30` that is
/// `|x| ≤ 3.4e8`, six orders of magnitude beyond what language models emit (tens, a few hundred
/// at most), while `T = 1e-35` already overflows on a logit of 1e4 (and below 1.4e-45, f32's
/// smallest positive value, `T` itself rounds to 0). Nothing is lost below the bound: at
/// `T = 1e-30` two logits 1e-6 apart end up 1e24 apart, `exp(−1e24)` is 0, and sampling is
/// greedy already, save that exactly equal logits share the mass.
pub const MIN_TEMPERATURE: f64 = 1e-30;

/// How tokens are chosen from a model's logits. `temperature == 0` means greedy; a positive
/// temperature is at least [`MIN_TEMPERATURE`].
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
        if self.temperature > 0.0 && self.temperature < MIN_TEMPERATURE {
            return Err(SpecError::TemperatureTooSmall(self.temperature));
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
/// the module docs). Greedy and truncating settings read the rows back to the host once (a sync)
/// and upload the result; plain temperature sampling stays on the device.
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
        // The point masses are built on the host from the argmax read back: cheaper than any
        // device formulation on flex, and the validity check needs the host anyway.
        let mut values = vec![0.0f32; rows * vocab];
        for (row, token) in greedy_tokens(logits).into_iter().enumerate() {
            match token {
                Some(token) => values[row * vocab + token as usize] = 1.0,
                None => values[row * vocab..(row + 1) * vocab].fill(f32::NAN),
            }
        }
        return Tensor::from_data(TensorData::new(values, [rows, vocab]), &device);
    }

    let scaled = if config.temperature == 1.0 {
        logits
    } else {
        logits.div_scalar(config.temperature)
    };
    // An invalid row comes out NaN everywhere: its denominator is NaN (a NaN or `+inf` entry
    // gives a NaN term; a row of `-inf` gives `-inf - -inf` on flex and 0 / 0 where `max_dim`
    // returns the lowest finite f32).
    let (exp, denominator) = shifted_exp(scaled);
    let top_k = config.effective_top_k(vocab);
    if top_k.is_none() && config.effective_top_p().is_none() && config.effective_min_p().is_none() {
        return exp / denominator;
    }

    // Truncation: one read back, each row's kept set on the host (`truncate`, which shows it
    // exact without sorting the vocabulary), one upload.
    let probs = exp / denominator.clone();
    let [denominators, probs] = read2(Transaction::default().register(denominator).register(probs));
    let denominators: Vec<f32> = denominators.iter::<f32>().collect();
    let mut values: Vec<f32> = if probs.dtype == DType::F32 {
        // Zero-copy on flex.
        probs.into_vec::<f32>().unwrap_or_default()
    } else {
        probs.iter::<f32>().collect()
    };
    if values.len() != rows * vocab {
        // Not reachable: the tensor read back has this shape.
        values = vec![f32::NAN; rows * vocab];
    }
    for (values, &denominator) in values.chunks_mut(vocab).zip(&denominators) {
        if !truncate_row(values, denominator, config) {
            values.fill(f32::NAN);
        }
    }
    Tensor::from_data(TensorData::new(values, [rows, vocab]), &device)
}

/// `exp(l − max)` of each row and its sum `[rows, 1]`: softmax's numerator and denominator. Not
/// burn's `softmax`: flex's fused kernel measured 2-3x slower than these four ops on `[6, V]`
/// rows (its exp loop is single-threaded and slower per element).
fn shifted_exp<B: Backend>(logits: Tensor<B, 2>) -> (Tensor<B, 2>, Tensor<B, 2>) {
    let max = logits.clone().max_dim(1);
    let exp = (logits - max).exp();
    let sum = exp.clone().sum_dim(1);
    (exp, sum)
}

/// Each row's largest probability under `softmax(logits)` at temperature 1, `1 / Σ exp(l − max)`
/// (the max contributes 1 to the sum): a draft model's confidence in its row. NaN for a row
/// with a NaN or `+inf` entry or with every entry `-inf`.
///
/// The same four ops as [`probabilities`] (`shifted_exp`), not burn's `softmax` then `max`:
/// on flex a 151,936-entry row takes 250 µs against 450 µs (measured at 989cbe4), a share of a
/// small draft model's step that a drafter asking this every row would pay.
pub fn top_probabilities<B: Backend>(logits: Tensor<B, 2>) -> Vec<f64> {
    let (_, denominator) = shifted_exp(logits);
    denominator
        .into_data()
        .iter::<f64>()
        // A valid row's sum is at least its max's 1; an all-`-inf` row may give 0 (flex's
        // `max_dim` returns the lowest finite f32 there) or NaN.
        .map(|sum| {
            if sum >= 1.0 && sum.is_finite() {
                1.0 / sum
            } else {
                f64::NAN
            }
        })
        .collect()
}

/// Each row's greedy token (the largest logit, ties to the lowest index), or `None` for an
/// invalid row (see the module docs).
///
/// burn's `argmax` picks the lowest index among equal maxima on flex (a left-to-right scan) and
/// on the cubecl backends, wgpu and cuda (their reduction keeps the smaller coordinate on ties);
/// `tests/backend.rs` checks it on every backend it runs on.
///
/// Validity costs one more pass in the common case: the row sum is finite exactly when every
/// entry is finite. A `-inf` sum (masked entries, no NaN or `+inf`: either would make the sum NaN
/// or `+inf`) leaves only "is every entry `-inf`?", answered by the logit at the argmax. Only a
/// NaN or `+inf` sum, which a valid row reaches only by overflow, takes the full check.
pub(crate) fn greedy_tokens<B: Backend>(logits: Tensor<B, 2>) -> Vec<Option<u32>> {
    let [rows, vocab] = logits.dims();
    let device = logits.device();
    let argmax = logits.clone().argmax(1);
    let sums = logits.clone().sum_dim(1);
    let [argmax, sums] = read2(Transaction::default().register(argmax).register(sums));
    let argmax: Vec<i64> = argmax.iter::<i64>().collect();
    let sums: Vec<f64> = sums.iter::<f64>().collect();
    let mut valid: Vec<bool> = sums.iter().map(|s| s.is_finite()).collect();

    if sums.contains(&f64::NEG_INFINITY) {
        // A backend may return an out-of-range index for a row of `-inf`; any in-range index
        // then reads `-inf`, as it should. A fresh index tensor: see
        // `docs/notes/wgpu-lavapipe.md` on gathers in wgpu's fusion.
        let index: Vec<i64> = argmax
            .iter()
            .map(|&i| i.clamp(0, vocab as i64 - 1))
            .collect();
        let index = Tensor::<B, 2, Int>::from_data(TensorData::new(index, [rows, 1]), &device);
        let at = logits.clone().gather(1, index).into_data();
        for ((valid, &sum), at) in valid.iter_mut().zip(&sums).zip(at.iter::<f64>()) {
            if sum == f64::NEG_INFINITY {
                *valid = at > f64::NEG_INFINITY;
            }
        }
    }
    if sums.iter().any(|s| s.is_nan() || *s == f64::INFINITY) {
        let no_nan_or_inf = logits.clone().lower_elem(f32::INFINITY).all_dim(1);
        let not_all_masked = logits.greater_elem(f32::NEG_INFINITY).any_dim(1);
        let [a, b] = read2(
            Transaction::default()
                .register(no_nan_or_inf)
                .register(not_all_masked),
        );
        for (((valid, &sum), a), b) in valid
            .iter_mut()
            .zip(&sums)
            .zip(a.iter::<bool>())
            .zip(b.iter::<bool>())
        {
            if sum.is_nan() || sum == f64::INFINITY {
                *valid = a && b;
            }
        }
    }
    argmax
        .into_iter()
        .zip(valid)
        .map(|(token, valid)| valid.then_some(token as u32))
        .collect()
}

/// Reads greedy tokens of every row, failing on invalid rows.
pub(crate) fn read_greedy<B: Backend>(logits: Tensor<B, 2>, what: Source) -> Result<Vec<u32>> {
    greedy_tokens(logits)
        .into_iter()
        .enumerate()
        .map(|(row, token)| token.ok_or(SpecError::NonFiniteLogits { what, row }))
        .collect()
}

/// The largest f32 below 1. A uniform rounded to f32 is capped here so that `u · total` stays
/// below `total` (for a normal `total`, `total · (1 − 2⁻²⁴)` rounds to at most its predecessor).
const BELOW_ONE: f32 = 1.0 - f32::EPSILON / 2.0;

/// Draws one token per row of `weights` `[rows, vocab]` (not necessarily normalized) by inverse
/// CDF: the smallest index whose cumulative weight exceeds `uniform · total`. That token always
/// has weight > 0: its cumulative weight exceeds the one before it.
///
/// Returns the tokens `[rows, 1]` and each row's total weight `[rows, 1]` (NaN for a bad row).
pub(crate) fn inverse_cdf<B: Backend>(
    weights: Tensor<B, 2>,
    uniforms: &[f64],
) -> (Tensor<B, 2, Int>, Tensor<B, 2>) {
    let [rows, vocab] = weights.dims();
    let device = weights.device();
    let cumulative = weights.cumsum(1);
    let total = cumulative.clone().narrow(1, vocab - 1, 1);
    let uniforms: Vec<f32> = uniforms
        .iter()
        .map(|&u| (u as f32).min(BELOW_ONE))
        .collect();
    let uniforms = Tensor::<B, 2>::from_data(TensorData::new(uniforms, [rows, 1]), &device);
    // The first entry above the target: argmax of a 0/1 row is its first 1. The last cumulative
    // entry is `total`, above the target, so there is one. `c − target > 0` is `c > target`
    // exactly (a difference of floats is 0 only when they are equal); flex's comparison with a
    // broadcast operand measured 10x slower than this subtraction and a scalar comparison.
    let tokens = (cumulative - total.clone() * uniforms)
        .greater_elem(0.0)
        .float()
        .argmax(1);
    (tokens, total)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn temperatures_below_the_usable_minimum_are_refused() {
        for t in [0.0, MIN_TEMPERATURE, 1e-6, 1.0, 7.5] {
            assert_eq!(
                SamplingConfig::with_temperature(t).validate(),
                Ok(()),
                "{t}"
            );
        }
        for t in [
            1e-300,
            f64::MIN_POSITIVE,
            5e-324,
            MIN_TEMPERATURE / 2.0,
            1e-31,
        ] {
            assert_eq!(
                SamplingConfig::with_temperature(t).validate(),
                Err(SpecError::TemperatureTooSmall(t)),
                "{t}"
            );
        }
        let message = SamplingConfig::with_temperature(1e-300)
            .validate()
            .unwrap_err()
            .to_string();
        assert_eq!(
            message,
            "temperature 1e-300 is below the smallest usable temperature 1e-30 (use 0 for greedy)"
        );
        assert!(matches!(
            SamplingConfig::with_temperature(-1e-300).validate(),
            Err(SpecError::InvalidTemperature(_))
        ));
    }

    /// The bound is needed: a little below it, logits of ±1e4 overflow f32 and the row turns NaN.
    #[cfg(feature = "flex")]
    #[test]
    fn below_the_minimum_large_logits_overflow() {
        type B = burn::backend::Flex;
        let logits = Tensor::<B, 2>::from_data(
            TensorData::new(vec![1e4f32, -1e4, 0.0], [1, 3]),
            &Default::default(),
        );
        let probs = probabilities_unchecked(logits, &SamplingConfig::with_temperature(1e-35));
        assert!(probs.into_data().iter::<f32>().any(f32::is_nan));
    }
}
