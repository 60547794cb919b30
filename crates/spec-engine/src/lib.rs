//! The speculative decoding loop that every method shares.
//!
//! A method is a [`Drafter`]: given the sequence so far it proposes a [`TokenTree`] rooted at the
//! last token (a chain is a tree with one child per node) and says how the tokens were proposed
//! ([`Proposal`]: sampled from a draft distribution `q`, or deterministic candidates). The loop
//! in [`generate_speculative`] then does what is the same for every method:
//!
//! 1. the target runs once over the tree (`positions = base + depth`, ancestor mask);
//! 2. `spec_core::verify::Verifier` accepts a path and draws the next token (exact: the output
//!    follows the target's distribution under the sampling settings; greedy equals argmax);
//! 3. the target's cache keeps the accepted path ([`KvCache::keep_path`]);
//! 4. the drafter is told what was accepted, so it can roll back or update itself.
//!
//! With a drafter that proposes nothing, a step is one plain decoding step.

use std::time::Instant;

use burn::tensor::backend::Backend;
use serde::Serialize;
use spec_core::metrics::Metrics;
use spec_core::rng::SpecRng;
use spec_core::sampling::SamplingConfig;
use spec_core::tree::TokenTree;
use spec_core::verify::{Proposal, Verdict, Verifier};
use spec_runtime::model::{ForwardRequest, LogitRows, Transformer};
use spec_runtime::{GenerateOptions, GenerationStats, KvCache, RuntimeError, StopReason};

pub mod method;

pub use spec_core::tree::ROOT;

/// Errors of a speculative generation.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
    #[error(transparent)]
    Verify(#[from] spec_core::error::SpecError),
    /// The drafter's own failure (its model, its files), with its message.
    #[error("drafter: {0}")]
    Drafter(String),
    #[error("invalid drafter setup: {0}")]
    Setup(String),
}

pub type Result<T, E = EngineError> = std::result::Result<T, E>;

/// What a drafter proposes for one step.
#[derive(Debug)]
pub struct Draft<B: Backend> {
    /// Rooted at the last token of the sequence (not yet in the target's cache).
    pub tree: TokenTree,
    pub proposal: Proposal<B>,
    /// Forward passes of a draft model this step took (for the metrics).
    pub draft_forwards: usize,
}

impl<B: Backend> Draft<B> {
    /// A step without drafts: plain decoding.
    pub fn none(root: u32) -> Self {
        Self {
            tree: TokenTree::new(root),
            proposal: Proposal::Deterministic,
            draft_forwards: 0,
        }
    }
}

/// A drafting policy: the only part of a method that is its own.
pub trait Drafter<B: Backend> {
    /// A short name for reports (`prompt-lookup`, `sampling`, …).
    fn name(&self) -> &str;

    /// Called once before generating after `prompt`.
    fn begin(&mut self, prompt: &[u32]) -> Result<()>;

    /// Proposes drafts after `context` (the prompt and every token produced so far; the last one
    /// is the tree's root). The tree may be at most `max_depth` deep. `rng` is the run's one
    /// random stream; a sampling drafter draws from it with the same `sampling` settings the
    /// target is verified with.
    fn draft(
        &mut self,
        context: &[u32],
        max_depth: usize,
        sampling: &SamplingConfig,
        rng: &mut SpecRng,
    ) -> Result<Draft<B>>;

    /// Tells the drafter what the target decided for its last draft; `context` now ends with the
    /// step's tokens (accepted drafts, then the verdict's next token).
    fn accepted(&mut self, context: &[u32], tree: &TokenTree, verdict: &Verdict) -> Result<()>;

    /// Forgets the text of earlier requests, for drafters that keep it (prompt lookup's
    /// cross-request cache); what the drafter measured of the machine may stay. A benchmark
    /// calls this after its warm-up so no prompt is measured against its own earlier answer.
    fn forget_requests(&mut self) {}

    /// The drafter's running estimates by name, for reports (a draft-model drafter's `α`, `c`
    /// and verification slope, from which `auto` picks K); empty where it keeps none.
    fn report_estimates(&self) -> Vec<(&'static str, f64)> {
        Vec::new()
    }
}

/// The drafter of plain decoding: proposes nothing.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoDraft;

impl<B: Backend> Drafter<B> for NoDraft {
    fn name(&self) -> &str {
        "plain"
    }

    fn begin(&mut self, _prompt: &[u32]) -> Result<()> {
        Ok(())
    }

    fn draft(
        &mut self,
        context: &[u32],
        _max_depth: usize,
        _sampling: &SamplingConfig,
        _rng: &mut SpecRng,
    ) -> Result<Draft<B>> {
        let root = context.last().copied().unwrap_or(0);
        Ok(Draft::none(root))
    }

    fn accepted(&mut self, _context: &[u32], _tree: &TokenTree, _verdict: &Verdict) -> Result<()> {
        Ok(())
    }
}

/// The output of one speculative generation.
#[derive(Debug, Clone, Serialize)]
pub struct SpecGeneration {
    pub tokens: Vec<u32>,
    pub stats: GenerationStats,
    pub metrics: Metrics,
    /// Seconds spent in the drafter (drafting and updates).
    pub draft_seconds: f64,
    /// Seconds spent in target forwards and verification.
    pub target_seconds: f64,
    /// Seconds of the [`Drafter::draft`] calls that ran a draft model (returned
    /// `draft_forwards > 0`): their forwards and the sampling of each drafted token, without the
    /// drafter's `begin` (the draft's prefill) and `accepted`. Divided by
    /// `metrics.draft_forwards`, the mean time of one draft-model step.
    pub draft_forward_seconds: f64,
    /// Seconds of the verification steps (`metrics.steps` of them: the target forward over the
    /// step's tree and the verification), the prompt's prefill excluded. For plain decoding
    /// (no drafts), divided by `metrics.steps`, the mean time of one decode step.
    pub step_seconds: f64,
}

/// Generates after `prompt` with `drafter` proposing and `target` verifying. `on_tokens` sees
/// each step's new tokens as soon as they are decided.
pub fn generate_speculative<B: Backend>(
    target: &Transformer<B>,
    drafter: &mut dyn Drafter<B>,
    prompt: &[u32],
    options: &GenerateOptions,
    on_tokens: &mut dyn FnMut(&[u32]),
) -> Result<SpecGeneration> {
    let verifier = Verifier::new(options.sampling)?;
    if prompt.is_empty() {
        return Err(RuntimeError::InvalidRequest("the prompt is empty".into()).into());
    }
    let capacity = options.capacity_for(prompt.len(), target.max_positions());
    if prompt.len() >= capacity {
        return Err(RuntimeError::ContextOverflow {
            needed: prompt.len() + 1,
            capacity,
        }
        .into());
    }
    let start = Instant::now();
    let mut rng = options.sampling.rng();
    let mut cache = target.new_cache(capacity);
    let mut metrics = Metrics::default();
    let (mut draft_seconds, mut target_seconds) = (0.0, 0.0);
    let (mut draft_forward_seconds, mut step_seconds) = (0.0, 0.0);

    // Everything but the last prompt token goes in now; the last one is the first step's root.
    let split = prompt.len() - 1;
    if split > 0 {
        let t = Instant::now();
        target.forward(
            ForwardRequest::tokens(&prompt[..split]).logits(LogitRows::None),
            &mut cache,
        )?;
        target_seconds += t.elapsed().as_secs_f64();
    }
    let t = Instant::now();
    drafter.begin(prompt)?;
    draft_seconds += t.elapsed().as_secs_f64();

    let mut context = prompt.to_vec();
    let mut produced: Vec<u32> = Vec::with_capacity(options.max_new_tokens);
    let mut prompt_seconds = 0.0;
    // Tokens the first step gave (up to K + 1), inside `prompt_seconds`.
    let mut first_step_tokens = 0;
    let mut stop_reason = StopReason::MaxNewTokens;
    while produced.len() < options.max_new_tokens {
        let base = cache.len();
        if base + 1 > capacity {
            stop_reason = StopReason::ContextFull;
            break;
        }
        let remaining = options.max_new_tokens - produced.len();
        let max_depth = (remaining - 1).min(capacity - base - 1);

        let t = Instant::now();
        let draft = drafter.draft(&context, max_depth, &options.sampling, &mut rng)?;
        let elapsed = t.elapsed().as_secs_f64();
        draft_seconds += elapsed;
        if draft.draft_forwards > 0 {
            draft_forward_seconds += elapsed;
        }
        let tree = &draft.tree;
        if tree.max_depth() > max_depth || tree.token(ROOT) != *context.last().unwrap_or(&0) {
            return Err(EngineError::Drafter(format!(
                "{} proposed a tree of depth {} rooted at {} (allowed depth {max_depth}, root {:?})",
                drafter.name(),
                tree.max_depth(),
                tree.token(ROOT),
                context.last()
            )));
        }

        let t = Instant::now();
        let verdict = step(target, &mut cache, &verifier, &draft, &mut rng)?;
        let elapsed = t.elapsed().as_secs_f64();
        target_seconds += elapsed;
        step_seconds += elapsed;
        metrics.record_step(tree, &verdict);
        metrics.add_draft_forwards(draft.draft_forwards as u64);

        let mut new_tokens = verdict.tokens(tree);
        new_tokens.truncate(remaining);
        if let Some(stop) = new_tokens
            .iter()
            .position(|t| options.stop_tokens.contains(t))
        {
            new_tokens.truncate(stop + 1);
            stop_reason = StopReason::StopToken;
        }
        if produced.is_empty() {
            prompt_seconds = start.elapsed().as_secs_f64();
            first_step_tokens = new_tokens.len();
        }
        produced.extend(&new_tokens);
        context.extend(&new_tokens);
        on_tokens(&new_tokens);
        if stop_reason == StopReason::StopToken {
            break;
        }
        let t = Instant::now();
        drafter.accepted(&context, tree, &verdict)?;
        draft_seconds += t.elapsed().as_secs_f64();
    }
    let wall_seconds = start.elapsed().as_secs_f64();
    let decode_seconds = wall_seconds - prompt_seconds;
    let n = produced.len();
    Ok(SpecGeneration {
        stats: GenerationStats {
            prompt_tokens: prompt.len(),
            new_tokens: n,
            target_forwards: metrics.target_forwards as usize + usize::from(split > 0),
            prompt_seconds,
            wall_seconds,
            tokens_per_second: n as f64 / wall_seconds.max(1e-9),
            decode_tokens_per_second: if n > first_step_tokens {
                (n - first_step_tokens) as f64 / decode_seconds.max(1e-9)
            } else {
                0.0
            },
            decode_tokens: n.saturating_sub(first_step_tokens),
            stop_reason,
        },
        tokens: produced,
        metrics,
        draft_seconds,
        target_seconds,
        draft_forward_seconds,
        step_seconds,
    })
}

/// One verification step: the target scores `draft.tree` in one forward pass over the cache,
/// the verifier decides, and the cache keeps the root and the accepted path.
pub fn step<B: Backend>(
    target: &Transformer<B>,
    cache: &mut KvCache<B>,
    verifier: &Verifier,
    draft: &Draft<B>,
    rng: &mut SpecRng,
) -> Result<Verdict> {
    let tree = &draft.tree;
    let base = cache.len();
    let positions = tree.positions(base);
    let is_chain = (0..tree.len()).all(|n| tree.children(n).len() <= 1);
    let mask;
    let mut request = ForwardRequest::tokens(tree.tokens())
        .positions(&positions)
        .logits(LogitRows::All);
    if !is_chain {
        mask = tree.ancestor_mask();
        request = request.mask(&mask);
    }
    let out = match target.forward(request, cache) {
        Ok(out) => out,
        Err(e) => {
            cache.truncate(base);
            return Err(e.into());
        }
    };
    let logits = out
        .logits
        .ok_or_else(|| RuntimeError::InvalidRequest("no logits returned".into()))?;
    let verdict = match verifier.verify_tree(tree, logits, draft.proposal.clone(), rng) {
        Ok(v) => v,
        Err(e) => {
            cache.truncate(base);
            return Err(e.into());
        }
    };
    if is_chain {
        // A chain's accepted path is a prefix: rolling back is a truncation.
        cache.truncate(base + 1 + verdict.accepted.len());
    } else {
        let mut path = Vec::with_capacity(verdict.accepted.len() + 1);
        path.push(ROOT);
        path.extend(&verdict.accepted);
        cache.keep_path(base, &path)?;
    }
    Ok(verdict)
}

/// Options for plain decoding through the engine (the same loop with [`NoDraft`]).
pub fn plain_options(max_new_tokens: usize, sampling: SamplingConfig) -> GenerateOptions {
    GenerateOptions::new(max_new_tokens, sampling)
}
