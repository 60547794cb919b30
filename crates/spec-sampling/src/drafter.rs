//! The draft-model drafter.

use std::time::Instant;

use burn::tensor::{Tensor, backend::Backend};
use spec_core::error::Source;
use spec_core::length::{ChainOutlook, ChainTrials};
use spec_core::sampling::{probabilities, sample_logits, sample_probabilities, top_probabilities};
use spec_core::tree::TokenTree;
use spec_core::verify::Proposal;
use spec_engine::{Draft, DraftRequest, Drafter, EngineError, StepOutcome};
use spec_runtime::{RuntimeError, Transformer};
use spec_tokenizer::TextTokenizer;

use crate::error::{Result, SamplingError};
use crate::length::{AutoLength, DraftLength};
use crate::runner::DraftRunner;
use crate::vocab::check_vocabularies;

/// What the drafter has measured so far (see [`AutoLength`] for what the times cover).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Estimates {
    /// Smoothed acceptance rate of tested drafts.
    pub alpha: f64,
    /// Draft time per drafted token ÷ a one-token target step's time, once both are known.
    pub cost_ratio: Option<f64>,
    pub draft_token_seconds: Option<f64>,
    /// A one-token target step's time (measured, or inferred from a wider step).
    pub target_step_seconds: Option<f64>,
    /// `s` of the target's step cost `r(w) = 1 + s·(w − 1)` for `w` tokens scored.
    pub verify_slope: f64,
    /// The draft length of the last step.
    pub last_length: usize,
    /// Chains `auto` ended before a draft its row's confidence said would not pay.
    pub chains_stopped: u64,
}

/// Drafts a chain with a small model of the target's vocabulary, sampling each token from the
/// draft's distribution `q` under the run's sampling settings, and hands `q` to the verifier.
///
/// The drafter keeps its own KV cache. `begin` fills it with the prompt but its last token; each
/// `draft` first catches up on the context tokens the cache has not seen (after a step: the
/// verdict's next token and, when every draft was accepted, the last draft), then runs the draft
/// one token at a time; `accepted` rolls the cache back to the longest prefix the context still
/// agrees with, and feeds a longer catch-up (tokens skipped by plain steps) when the next step
/// will draft.
#[derive(Debug)]
pub struct DraftModelDrafter<B: Backend> {
    runner: DraftRunner<B>,
    length: DraftLength,
    auto: AutoLength,
    last_length: usize,
    chains_stopped: u64,
    /// The trials of `auto`'s chain in flight, by its rows' confidences (the draft model's top
    /// probability), recorded at the verdict.
    chain: Option<ChainTrials>,
}

impl<B: Backend> DraftModelDrafter<B> {
    /// A drafter for a target whose output layer has `target_vocab` entries. Without tokenizers
    /// there is no way to tell padding from real tokens, so the widths must be equal.
    ///
    /// # Errors
    /// An invalid `length` (K = 0, a bad threshold) or different vocabulary widths.
    pub fn new(model: Transformer<B>, target_vocab: usize, length: DraftLength) -> Result<Self> {
        if model.vocab_size != target_vocab {
            return Err(SamplingError::VocabularySize {
                draft: model.vocab_size,
                target: target_vocab,
            });
        }
        Self::build(model, target_vocab, length)
    }

    /// A drafter whose vocabulary is checked against the target's through both tokenizers
    /// ([`check_vocabularies`]); the model widths may then differ.
    ///
    /// # Errors
    /// An invalid `length`, or tokenizers that do not match.
    pub fn with_tokenizers(
        model: Transformer<B>,
        draft_tokenizer: &TextTokenizer,
        target_vocab: usize,
        target_tokenizer: &TextTokenizer,
        length: DraftLength,
    ) -> Result<Self> {
        check_vocabularies(
            draft_tokenizer,
            model.vocab_size,
            target_tokenizer,
            target_vocab,
        )?;
        Self::build(model, target_vocab, length)
    }

    /// A drafter for a target of a different width whose ids the caller has checked by other
    /// means (e.g. no tokenizer files at hand): ids beyond the narrower model must be unused.
    ///
    /// # Errors
    /// An invalid `length`.
    pub fn with_padded_vocabulary(
        model: Transformer<B>,
        target_vocab: usize,
        length: DraftLength,
    ) -> Result<Self> {
        Self::build(model, target_vocab, length)
    }

    fn build(model: Transformer<B>, target_vocab: usize, length: DraftLength) -> Result<Self> {
        length.validate()?;
        Ok(Self {
            runner: DraftRunner::new(model, target_vocab),
            length,
            auto: AutoLength::default(),
            last_length: 0,
            chains_stopped: 0,
            chain: None,
        })
    }

    /// A guess of `c`, the draft's time per token over a target step's, for `auto` until the
    /// draft is timed (see [`AutoLength::with_cost_prior`]); [`weight_cost_prior`] gives one.
    pub fn with_cost_prior(mut self, c: f64) -> Self {
        self.auto = self.auto.with_cost_prior(c);
        self
    }

    /// Prices `auto`'s steps by the given costs instead of measured ones (see
    /// [`AutoLength::with_fixed_costs`]): a draft token `c` target steps, a verification of `w`
    /// tokens `1 + s·(w − 1)`.
    pub fn with_fixed_costs(mut self, c: f64, s: f64) -> Self {
        self.auto = self.auto.with_fixed_costs(c, s);
        self
    }

    /// Gives the draft a cache of exactly `capacity` positions (by default it starts at
    /// [`INITIAL_CACHE_POSITIONS`](crate::INITIAL_CACHE_POSITIONS) and grows with the prompt). Past it, steps go on without
    /// drafts.
    pub fn with_cache_capacity(mut self, capacity: usize) -> Self {
        self.runner = self.runner.with_cache_capacity(capacity);
        self
    }

    /// The draft length policy.
    pub fn length(&self) -> DraftLength {
        self.length
    }

    /// Forward passes of the draft model so far (prompt prefills included).
    pub fn draft_forwards(&self) -> u64 {
        self.runner.forwards()
    }

    /// The running estimates of `α` and `c`.
    pub fn estimates(&self) -> Estimates {
        Estimates {
            alpha: self.auto.alpha(),
            cost_ratio: self.auto.cost_ratio(),
            draft_token_seconds: self.auto.draft_token_seconds(),
            target_step_seconds: self.auto.target_step_seconds(),
            verify_slope: self.auto.width_costs().slope(),
            last_length: self.last_length,
            chains_stopped: self.chains_stopped,
        }
    }

    /// Times one draft forward of `root` for `auto` ([`AutoLength::wants_draft_timing`]) and
    /// forgets it: the cache stays as it was.
    fn time_draft(&mut self, root: u32) -> Result<(), EngineError> {
        let kept = self.runner.fed().len();
        if self.runner.room() == 0 {
            return Ok(());
        }
        let start = Instant::now();
        if let Some(logits) = self.runner.feed(&[root], true)? {
            // Read back, as sampling a draft would: the time is then the forward's on any backend.
            logits.into_data();
        }
        self.auto.record_draft_timing(start.elapsed().as_secs_f64());
        self.runner.truncate(kept);
        Ok(())
    }

    /// Feeds the `tokens` tokens of `before` the draft has not seen, a catch-up
    /// ([`catch_up_len`]; nothing when 0), timed for `auto` apart from drafting.
    fn catch_up(&mut self, before: &[u32], tokens: usize) -> Result<(), EngineError> {
        if tokens == 0 {
            return Ok(());
        }
        let start = Instant::now();
        let missing = before[self.runner.fed().len()..].to_vec();
        self.runner.feed(&missing, false)?;
        self.auto
            .record_catch_up(tokens, start.elapsed().as_secs_f64());
        Ok(())
    }

    /// The draft length for a step whose draft would first catch up on `catch_up` tokens.
    fn next_length(&self, catch_up: usize) -> usize {
        match self.length {
            DraftLength::Fixed(k) | DraftLength::Confident { max: k, .. } => k,
            DraftLength::Auto { max } => self.auto.choose(max, catch_up),
        }
    }
}

/// A guess of `c` from the bytes of packed weights each model streams per decode step, which
/// on a CPU bound by memory bandwidth sets a step's time; `None` unless both are packed.
pub fn weight_cost_prior<B: Backend>(
    draft: &Transformer<B>,
    target: &Transformer<B>,
) -> Option<f64> {
    let (draft, target) = (draft.packed_bytes()?, target.packed_bytes()?);
    (target > 0).then(|| draft as f64 / target as f64)
}

/// Report names of `auto`'s acceptance by confidence, one a bucket
/// ([`AutoLength::CONFIDENCE_BUCKETS`]).
const CONFIDENCE_NAMES: [&str; AutoLength::CONFIDENCE_BUCKETS] = [
    "alpha_confidence_0.0",
    "alpha_confidence_0.1",
    "alpha_confidence_0.2",
    "alpha_confidence_0.3",
    "alpha_confidence_0.4",
    "alpha_confidence_0.5",
    "alpha_confidence_0.6",
    "alpha_confidence_0.7",
    "alpha_confidence_0.8",
    "alpha_confidence_0.9",
];

/// The draft model's top probability in a `[1, vocab]` row of logits (softmax at temperature 1).
fn top_probability<B: Backend>(logits: Tensor<B, 2>) -> f64 {
    top_probabilities(logits)
        .first()
        .copied()
        .unwrap_or(f64::NAN)
}

impl<B: Backend> Drafter<B> for DraftModelDrafter<B> {
    fn name(&self) -> &str {
        "sampling"
    }

    /// [`DraftModelDrafter::estimates`] by name (those not yet known left out), and for `auto`
    /// whether it takes the draft for hopeless (1) or not (0), the chains its confidence rule
    /// ended, and the acceptance rate by the draft row's confidence (`alpha_confidence_0.9`:
    /// rows whose top probability is in [0.9, 1]).
    fn report_estimates(&self) -> Vec<(&'static str, f64)> {
        let e = self.estimates();
        let mut named = vec![
            ("alpha", e.alpha),
            ("verify_slope", e.verify_slope),
            ("last_length", e.last_length as f64),
        ];
        named.extend(e.cost_ratio.map(|c| ("cost_ratio", c)));
        named.extend(e.draft_token_seconds.map(|s| ("draft_token_seconds", s)));
        named.extend(e.target_step_seconds.map(|s| ("target_step_seconds", s)));
        if let DraftLength::Auto { max } = self.length {
            named.push((
                "hopeless",
                f64::from(u8::from(self.auto.hopeless_draft(max))),
            ));
            named.push(("chains_stopped", e.chains_stopped as f64));
            let rates = self.auto.acceptance_by_confidence().rates();
            named.extend(
                CONFIDENCE_NAMES
                    .iter()
                    .zip(rates)
                    .map(|(&name, rate)| (name, rate.alpha())),
            );
        }
        named
    }

    fn begin(&mut self, prompt: &[u32]) -> Result<(), EngineError> {
        self.runner.begin(prompt.len());
        let split = prompt.len().saturating_sub(1);
        // Where `auto`'s first step will be plain, the prompt waits: a later step that drafts
        // catches up on it.
        if let DraftLength::Auto { max } = self.length
            && self.auto.choose(max, split) == 0
        {
            return Ok(());
        }
        // A prompt too long for the draft's cache is not an error: the steps go without drafts.
        if split > 0 && split < self.runner.capacity() {
            self.runner.feed(&prompt[..split], false)?;
        }
        Ok(())
    }

    fn draft(&mut self, request: DraftRequest<'_, B>) -> Result<Draft<B>, EngineError> {
        let DraftRequest {
            context,
            max_depth,
            sampling,
            rng,
            ..
        } = request;
        let Some((&root, before)) = context.split_last() else {
            return Err(EngineError::Drafter("the context is empty".into()));
        };
        self.chain = None;
        self.runner.roll_back_to(before);
        let pending_len = context.len() - self.runner.fed().len();
        let catch_up = catch_up_len(pending_len);
        let room = self.runner.room();
        // `auto` ends a chain before a draft its row's confidence says would not pay (see
        // `AutoLength::worth_proposing`), so a step that drafts may go up to the longest chain;
        // until `c` is measured or guessed it drafts the length chosen.
        let chosen = self.next_length(catch_up);
        let chain_rule = match self.length {
            DraftLength::Auto { max } if chosen > 0 && self.auto.prices_steps() => Some(max),
            _ => None,
        };
        // The root and the first k − 1 drafts go through the draft: k ≤ room − pending + 1.
        let k = chain_rule
            .unwrap_or(chosen)
            .min(max_depth)
            .min((room + 1).saturating_sub(pending_len));
        self.last_length = k;
        if k == 0 {
            if let DraftLength::Auto { max } = self.length
                && self.auto.wants_draft_timing(max)
            {
                self.time_draft(root)?;
            }
            return Ok(Draft::none(root));
        }

        let forwards_before = self.runner.forwards();
        // `accepted` catches up before a step that drafts; this is for callers that skip it.
        self.catch_up(before, catch_up)?;
        let start = Instant::now();
        let mut pending = context[self.runner.fed().len()..].to_vec();
        let mut rows = Vec::with_capacity(k);
        let mut drafted = Vec::with_capacity(k);
        let mut computed = 0;
        let mut chain = ChainOutlook::new();
        let mut trials = ChainTrials::new(context.len());
        for i in 0..k {
            // After the first draft (the step's length policy chose to draft, a probe
            // included), a row is computed only if a draft at the run's mean rate would pay
            // there: a row the rule then declines has cost a forward for nothing, and with a
            // dear draft (the 0.5B in f32, `c` 0.3) chains run to the longest decoded at
            // 0.96-1.02 of `K` 4 against 1.03-1.09 for `K` from the mean rate
            // (docs/benchmarks.md at daa7da8, "A dear draft"; docs/notes/draft-length.md,
            // "The rule").
            if chain_rule.is_some()
                && !drafted.is_empty()
                && self.auto.worth_extending(&chain, self.auto.alpha()) != Some(true)
            {
                break;
            }
            let logits = self
                .runner
                .feed(&pending, true)?
                .ok_or_else(|| RuntimeError::InvalidRequest("no logits returned".into()))?;
            computed += 1;
            // Both rules decide on a draft from its row alone, before its token is drawn, so
            // which drafts are proposed never depends on their own values.
            let confidence = match self.length {
                DraftLength::Confident { threshold, .. } if i > 0 => {
                    if top_probability(logits.clone()) < threshold {
                        break;
                    }
                    None
                }
                DraftLength::Auto { .. } if chain_rule.is_some() => {
                    Some(top_probability(logits.clone()))
                }
                _ => None,
            };
            let (token, q) = if sampling.is_greedy() {
                // Greedy settings make q the point mass on the argmax: the verifier reads the
                // draft as a fixed candidate (`Proposal::Deterministic`), so no `[1, vocab]`
                // row is built or drawn from (on flex, several parallel tensor operations a
                // draft, whose thread-pool wake-ups competed with the kernels' threads).
                let token =
                    sample_logits(self.runner.fit_logits(logits), sampling, rng, Source::Draft)?;
                (token[0], None)
            } else {
                // Sampled settings draw from q, the distribution the verifier is handed.
                let q = probabilities(self.runner.fit_logits(logits), sampling)?;
                (
                    sample_probabilities(q.clone(), rng, Source::Draft)?[0],
                    Some(q),
                )
            };
            if let Some(confidence) = confidence {
                let alpha = self.auto.alpha_at(confidence);
                // Until `c` is measured a step drafts at least once, or it would time nothing
                // (a guess of `c` and the buckets' calibrated priors may say no draft pays).
                let must_draft = drafted.is_empty() && self.auto.cost_ratio().is_none();
                if !must_draft && self.auto.worth_proposing(&chain, alpha) != Some(true) {
                    self.chains_stopped += 1;
                    trials.stop_before(token, confidence);
                    break;
                }
                chain = chain.extended(alpha);
                trials.propose(confidence);
            }
            rows.extend(q);
            drafted.push(token);
            pending = vec![token];
        }
        // Per row computed (at least the first): a row the chain stopped at cost a forward too.
        self.auto
            .record_draft(start.elapsed().as_secs_f64() / computed as f64);
        self.last_length = drafted.len();
        if chain_rule.is_some() {
            self.chain = Some(trials);
        }
        let draft_forwards = (self.runner.forwards() - forwards_before) as usize;
        if drafted.is_empty() {
            // The first draft would not pay: a plain step (its row still makes a free trial).
            return Ok(Draft {
                draft_forwards,
                ..Draft::none(root)
            });
        }
        let proposal = if rows.is_empty() {
            Proposal::Deterministic
        } else {
            Proposal::Sampled(self.runner.pad_q(Tensor::cat(rows, 0)))
        };
        Ok(Draft {
            tree: TokenTree::chain(root, &drafted),
            proposal,
            draft_forwards,
        })
    }

    fn accepted(&mut self, context: &[u32], outcome: &StepOutcome<B>) -> Result<(), EngineError> {
        self.auto.observe(outcome);
        if let Some(trials) = self.chain.take() {
            self.auto.record_chain(&trials, outcome.accepted(), context);
        }
        self.runner.roll_back_to(context);
        // A catch-up before a step that will draft is fed here, outside `draft`, whose time
        // is the draft's steps (the engine's `draft_forward_seconds`).
        let catch_up = catch_up_len(context.len() - self.runner.fed().len());
        if catch_up > 0
            && context.len() <= self.runner.capacity()
            && self.next_length(catch_up) > 0
            && let Some((_, before)) = context.split_last()
        {
            self.catch_up(before, catch_up)?;
        }
        Ok(())
    }
}

/// Tokens of a catch-up for a draft `pending` tokens behind its context (the root included):
/// a step leaves it one or two behind (the next token, and the last draft when all were
/// accepted); more were skipped by plain steps or by a prompt not prefilled, and are fed in a
/// forward of their own so that the draft's per-token time stays a drafting time.
fn catch_up_len(pending: usize) -> usize {
    if pending > 2 { pending - 1 } else { 0 }
}
