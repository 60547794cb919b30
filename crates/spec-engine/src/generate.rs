//! The generation loop: prefill, then draft → step → report until done.

use std::time::Instant;

use burn::tensor::backend::Backend;
use serde::Serialize;
use spec_core::metrics::Metrics;
use spec_core::tree::ROOT;
use spec_core::verify::Verifier;
use spec_runtime::model::{ForwardRequest, LogitRows, Transformer};
use spec_runtime::{GenerateOptions, GenerationStats, RuntimeError, StopReason};

use crate::drafter::{DraftRequest, Drafter, TargetView};
use crate::step::step;
use crate::{EngineError, Result};

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
    /// step's tree, the verification and the rollback; [`spec_core::step::StepOutcome::seconds`]
    /// summed), the prompt's prefill excluded. For plain decoding (no drafts), divided by
    /// `metrics.steps`, the mean time of one decode step.
    pub step_seconds: f64,
    /// The verification steps by width (tokens the target scored, root included): how many,
    /// and their seconds, for a step's cost by width (a tree's width varies step by step).
    pub steps_by_width: Vec<WidthSteps>,
}

/// Steps of one width and their total time.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct WidthSteps {
    pub width: usize,
    pub steps: u64,
    pub seconds: f64,
}

/// Adds a step of `width` tokens that took `seconds` to `by_width` (kept sorted by width).
fn record_width(by_width: &mut Vec<WidthSteps>, width: usize, seconds: f64) {
    match by_width.binary_search_by_key(&width, |w| w.width) {
        Ok(i) => {
            by_width[i].steps += 1;
            by_width[i].seconds += seconds;
        }
        Err(i) => by_width.insert(
            i,
            WidthSteps {
                width,
                steps: 1,
                seconds,
            },
        ),
    }
}

/// Generates after `prompt` with `drafter` proposing and `target` verifying. `on_tokens` sees
/// each step's new tokens as soon as they are decided; its time is in no step's.
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
    let needs = drafter.needs();
    let start = Instant::now();
    let mut rng = options.sampling.rng();
    let mut cache = target.new_cache(capacity);
    let mut metrics = Metrics::default();
    let (mut draft_seconds, mut target_seconds) = (0.0, 0.0);
    let (mut draft_forward_seconds, mut step_seconds) = (0.0, 0.0);
    let mut steps_by_width = Vec::new();

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
    // Grows with the output: `max_new_tokens` may be far more than the context can hold.
    let mut produced: Vec<u32> = Vec::new();
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
        let room = capacity - base - 1;
        let max_depth = (remaining - 1).min(room);

        let t = Instant::now();
        let request = DraftRequest::new(&context, max_depth, &options.sampling, &mut rng)
            .with_max_nodes(room)
            .with_target(TargetView::new(target, &mut cache));
        let draft = drafter.draft(request);
        // Whatever the drafter ran on the target's cache goes; the context stays.
        cache.truncate(base);
        let draft = draft?;
        let elapsed = t.elapsed().as_secs_f64();
        draft_seconds += elapsed;
        if draft.draft_forwards > 0 {
            draft_forward_seconds += elapsed;
        }
        let tree = &draft.tree;
        if tree.max_depth() > max_depth
            || tree.drafted() > room
            || tree.token(ROOT) != *context.last().unwrap_or(&0)
        {
            return Err(EngineError::Drafter(format!(
                "{} proposed a tree of {} nodes, {} deep, rooted at {} (allowed: {room} nodes, \
                 {max_depth} deep, root {:?})",
                drafter.name(),
                tree.drafted(),
                tree.max_depth(),
                tree.token(ROOT),
                context.last()
            )));
        }
        metrics.add_draft_forwards(draft.draft_forwards as u64);

        let t = Instant::now();
        let outcome = step(target, &mut cache, &verifier, draft, needs, &mut rng)?;
        target_seconds += t.elapsed().as_secs_f64();
        step_seconds += outcome.seconds;
        record_width(&mut steps_by_width, outcome.width(), outcome.seconds);
        metrics.record_step(&outcome.tree, &outcome.verdict);

        let mut new_tokens = outcome.verdict.tokens(&outcome.tree);
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
        drafter.accepted(&context, &outcome)?;
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
        steps_by_width,
    })
}
