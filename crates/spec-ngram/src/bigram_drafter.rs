//! The drafter that samples from a [`BigramModel`].

use std::time::Instant;

use burn::tensor::backend::Backend;
use burn::tensor::{ElementConversion, Tensor, TensorData};
use spec_core::error::Source;
use spec_core::length::{AcceptanceByConfidence, ChainOutlook, ChainTrials, LengthController};
use spec_core::rng::SpecRng;
use spec_core::sampling::{SamplingConfig, probabilities, sample_probabilities};
use spec_core::tree::TokenTree;
use spec_core::verify::Proposal;
use spec_engine::{Draft, DraftRequest, Drafter, StepOutcome};

use crate::bigram::BigramModel;
use crate::error::{NgramError, Result};

/// Default fixed draft length of the bigram drafter.
pub const DEFAULT_BIGRAM_K: usize = 2;
/// Default longest draft of the adaptive length ([`BigramConfig::adaptive`]).
pub const DEFAULT_BIGRAM_K_MAX: usize = 4;
/// Confidence buckets of the adaptive length: tenths of the draft row's top probability.
const CONFIDENCE_BUCKETS: usize = 10;
/// Memory of the per-bucket acceptance (~50 trials): the rates describe the bigram against the
/// target, which changes slowly with the text, so they carry over between requests.
const ACCEPTANCE_DECAY: f64 = 0.98;

/// Settings of [`BigramDrafter`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BigramConfig {
    /// Longest draft (tokens per step).
    pub k: usize,
    /// Decide after each draft token whether one more pays, from the acceptance measured at the
    /// next row's confidence and the measured step costs (see the crate docs); otherwise every
    /// step drafts `k` tokens.
    pub adaptive: bool,
}

/// The adaptive length up to [`DEFAULT_BIGRAM_K_MAX`] drafts.
impl Default for BigramConfig {
    fn default() -> Self {
        Self::adaptive()
    }
}

impl BigramConfig {
    /// The adaptive length, up to [`DEFAULT_BIGRAM_K_MAX`] drafts.
    pub fn adaptive() -> Self {
        Self {
            k: DEFAULT_BIGRAM_K_MAX,
            adaptive: true,
        }
    }

    /// Every step drafts `k` tokens.
    pub fn fixed(k: usize) -> Self {
        Self { k, adaptive: false }
    }
}

/// One row of a draft: the token drawn from it and the row's top probability.
struct DraftRow<B: Backend> {
    token: u32,
    confidence: f64,
    /// The row `q` as the verifier needs it (sampling only).
    q: Option<Tensor<B, 2>>,
}

/// What [`BigramDrafter::propose`] drafted.
struct Proposed<B: Backend> {
    tokens: Vec<u32>,
    /// The drafts' rows `q` `[K, vocab]` (sampling only, when anything was drafted).
    q: Option<Tensor<B, 2>>,
    /// The drafts' confidences, and the row the adaptive rule stopped before.
    trials: ChainTrials,
}

/// Drafts up to `K` tokens from a bigram model (see the crate docs for the rule).
#[derive(Debug)]
pub struct BigramDrafter<B: Backend> {
    model: BigramModel,
    k: usize,
    adaptive: bool,
    device: B::Device,
    row: Vec<f32>,
    acceptance: AcceptanceByConfidence,
    /// The target's step costs by width and the drafting time per row.
    lengths: LengthController,
    /// Costs given instead of measured: `(s, c)` for `cost(K) = 1 + s·K + c·K`.
    fixed_costs: Option<(f64, f64)>,
    /// The chain in flight's trials by its rows' confidences (the bigram's top probability),
    /// recorded at its outcome.
    pending: Option<ChainTrials>,
}

impl<B: Backend> BigramDrafter<B> {
    /// Checks that `model` covers exactly the target's vocabulary (`target_vocab`, the number of
    /// logits per row) and that `config.k ≥ 1`.
    pub fn new(
        model: BigramModel,
        target_vocab: usize,
        config: BigramConfig,
        device: &B::Device,
    ) -> Result<Self> {
        if config.k == 0 {
            return Err(NgramError::InvalidK(config.k));
        }
        if model.vocab_size() != target_vocab {
            return Err(NgramError::VocabMismatch {
                model: model.vocab_size(),
                target: target_vocab,
            });
        }
        Ok(Self {
            model,
            k: config.k,
            adaptive: config.adaptive,
            device: device.clone(),
            row: Vec::new(),
            acceptance: AcceptanceByConfidence::new(CONFIDENCE_BUCKETS, ACCEPTANCE_DECAY),
            lengths: LengthController::default(),
            fixed_costs: None,
            pending: None,
        })
    }

    pub fn model(&self) -> &BigramModel {
        &self.model
    }

    /// The acceptance measured so far by draft confidence.
    pub fn acceptance(&self) -> &AcceptanceByConfidence {
        &self.acceptance
    }

    /// Uses the given costs instead of measuring them: a verification of `w` tokens costs
    /// `1 + width_slope·(w − 1)` decode steps and a draft token `draft_cost` steps. For a machine
    /// whose costs are known, and for tests that must not depend on timings.
    pub fn with_fixed_costs(mut self, width_slope: f64, draft_cost: f64) -> Self {
        self.fixed_costs = Some((width_slope, draft_cost));
        self
    }

    /// The cost of a step with `k` drafts in plain decoding steps: the verification's width
    /// cost `r(k + 1)` plus `k` draft tokens at their measured share of a one-token step.
    fn step_cost(&self, k: usize) -> f64 {
        if let Some((slope, draft)) = self.fixed_costs {
            return 1.0 + (slope + draft) * k as f64;
        }
        let per_draft = match (
            self.lengths.draft_row_seconds(),
            self.lengths.widths().seconds(1),
        ) {
            (Some(draft), Some(step)) if step > 0.0 => draft / step,
            _ => 0.0,
        };
        self.lengths.verification_cost(k + 1) + k as f64 * per_draft
    }

    /// The next draft row after `prev`: greedy takes the argmax as a point mass; sampling draws
    /// from `probabilities(ln q(· | prev), sampling)`, the settings the verifier applies to the
    /// target.
    fn next_row(
        &mut self,
        prev: u32,
        sampling: &SamplingConfig,
        rng: &mut SpecRng,
    ) -> Result<DraftRow<B>> {
        if sampling.is_greedy() {
            let (token, probability) = self.model.top(prev);
            return Ok(DraftRow {
                token,
                confidence: probability,
                q: None,
            });
        }
        self.model.log_row_into(prev, &mut self.row);
        let vocab = self.model.vocab_size();
        let logits =
            Tensor::<B, 2>::from_data(TensorData::new(self.row.clone(), [1, vocab]), &self.device);
        let q = probabilities(logits, sampling)?;
        let confidence = f64::from(q.clone().max().into_scalar().elem::<f32>());
        let drawn = sample_probabilities(q.clone(), rng, Source::Draft)?;
        let token = drawn.first().copied().ok_or_else(|| {
            NgramError::Spec(spec_core::error::SpecError::Shape(
                "sampling one draft row returned no token".into(),
            ))
        })?;
        Ok(DraftRow {
            token,
            confidence,
            q: Some(q),
        })
    }

    /// Drafts after `root`, the last of `context_len` tokens, up to `depth` tokens.
    ///
    /// The rule decides on draft `i` from its row's confidence before looking at its token, so
    /// which drafts are proposed never depends on their own values (exactness needs each
    /// proposed token to be distributed as its row).
    fn propose(
        &mut self,
        root: u32,
        context_len: usize,
        depth: usize,
        sampling: &SamplingConfig,
        rng: &mut SpecRng,
    ) -> Result<Proposed<B>> {
        let mut tokens = Vec::with_capacity(depth);
        let mut trials = ChainTrials::new(context_len);
        let mut rows = Vec::new();
        let mut chain = ChainOutlook::new();
        let mut prev = root;
        // A plain step now and then keeps the one-token time, every cost's unit, fresh; its
        // first row still makes a free trial.
        let refresh =
            self.adaptive && self.fixed_costs.is_none() && self.lengths.wants_one_token_step();
        for _ in 0..depth {
            let row = self.next_row(prev, sampling, rng)?;
            if refresh {
                trials.stop_before(row.token, row.confidence);
                break;
            }
            if self.adaptive {
                let alpha = self.acceptance.alpha(row.confidence);
                if !chain.worth_extending(alpha, |k| self.step_cost(k)) {
                    trials.stop_before(row.token, row.confidence);
                    break;
                }
                chain = chain.extended(alpha);
            }
            prev = row.token;
            tokens.push(row.token);
            trials.propose(row.confidence);
            rows.extend(row.q);
        }
        Ok(Proposed {
            tokens,
            q: (!rows.is_empty()).then(|| Tensor::cat(rows, 0)),
            trials,
        })
    }
}

impl<B: Backend> Drafter<B> for BigramDrafter<B> {
    fn name(&self) -> &str {
        "bigram"
    }

    fn begin(&mut self, _prompt: &[u32]) -> spec_engine::Result<()> {
        self.pending = None;
        Ok(())
    }

    fn draft(&mut self, request: DraftRequest<'_, B>) -> spec_engine::Result<Draft<B>> {
        let root = request.root()?;
        let depth = self.k.min(request.max_depth);
        let started = Instant::now();
        let Proposed { tokens, q, trials } = self.propose(
            root,
            request.context.len(),
            depth,
            request.sampling,
            request.rng,
        )?;
        // Rows computed: the drafts plus the one the chain stopped before.
        let rows = tokens.len() + usize::from(trials.stopped());
        if rows > 0 {
            self.lengths
                .record_draft_row(started.elapsed().as_secs_f64() / rows as f64);
        }
        self.pending = Some(trials);
        Ok(Draft {
            tree: TokenTree::chain(root, &tokens),
            proposal: q.map_or(Proposal::Deterministic, Proposal::Sampled),
            draft_forwards: 0,
        })
    }

    fn accepted(&mut self, context: &[u32], outcome: &StepOutcome<B>) -> spec_engine::Result<()> {
        self.lengths.observe(outcome);
        if let Some(trials) = self.pending.take() {
            trials.record(outcome.accepted(), context, &mut self.acceptance);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::bigram::BigramCounts;
    use crate::scripted::scripted_step;

    type B = burn::backend::Flex;

    /// After 1 comes 2 and after 2 comes 3, certainly; after 3 one of 4..=7, evenly (the
    /// argmax, 4, has q ≈ 0.23); after those, 1.
    fn model() -> BigramModel {
        let mut counts = BigramCounts::new(8).unwrap();
        for _ in 0..10 {
            for x in 4..=7 {
                counts.add_sequence(&[1, 2, 3, x, 1]).unwrap();
            }
        }
        counts.finish()
    }

    #[test]
    fn adaptive_length_drafts_where_the_bigram_is_confident_and_right() {
        let device = Default::default();
        let mut drafter = BigramDrafter::<B>::new(model(), 8, BigramConfig::adaptive(), &device)
            .unwrap()
            .with_fixed_costs(0.1, 0.0);
        let mut context = vec![3];
        drafter.begin(&context).unwrap();
        // Phase 1: the text is 3 5 1 2 3 5 1 2 …; the bigram guesses 4 after 3 and is wrong.
        let five = |c: &[u32]| -> u32 {
            match c.last() {
                Some(1) => 2,
                Some(2) => 3,
                Some(3) => 5,
                _ => 1,
            }
        };
        let steps: Vec<_> = (0..150)
            .map(|_| scripted_step(&mut drafter, &mut context, &five))
            .collect();
        // The unsure guess after 3 was tried at first (its bucket starts at α 0.25) …
        assert!(steps[0].0 >= 1 && steps[0].1 == 0, "{steps:?}");
        // … then chains stop before it: 5 → 1 2 3, all accepted, and the step makes the 5.
        assert!(steps[50..].iter().all(|&s| s == (3, 3)), "{steps:?}");
        let unsure = drafter.acceptance().alpha(0.23);
        assert!(unsure < 0.1, "{unsure}");
        // Phase 2: now 4 follows 3, as the bigram guesses; only the free shadow trials (the
        // draft a chain stopped before, scored against the step's output) can show it.
        let four = |c: &[u32]| -> u32 {
            match c.last() {
                Some(1) => 2,
                Some(2) => 3,
                Some(3) => 4,
                _ => 1,
            }
        };
        let steps: Vec<_> = (0..200)
            .map(|_| scripted_step(&mut drafter, &mut context, &four))
            .collect();
        // Chains run through 3 again, to the longest draft, all accepted.
        assert!(
            steps[150..]
                .iter()
                .all(|&s| s == (DEFAULT_BIGRAM_K_MAX, DEFAULT_BIGRAM_K_MAX)),
            "{steps:?}"
        );
        assert!(drafter.acceptance().alpha(0.23) > 0.5);
        // The fixed rule drafts K tokens whatever happened.
        let mut fixed =
            BigramDrafter::<B>::new(model(), 8, BigramConfig::fixed(2), &device).unwrap();
        let mut context = vec![3];
        let steps: Vec<_> = (0..50)
            .map(|_| scripted_step(&mut fixed, &mut context, &five))
            .collect();
        assert!(steps.iter().all(|&(d, _)| d == 2));
    }
}
