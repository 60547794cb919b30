//! Plain autoregressive decoding: the baseline every speculative method is measured against and
//! must reproduce.

use std::time::Instant;

use burn::tensor::backend::Backend;
use serde::Serialize;
use spec_core::error::Source;
use spec_core::sampling::{SamplingConfig, sample_logits};

use crate::error::{Result, RuntimeError};
use crate::model::{ForwardRequest, Transformer};

/// What to generate.
#[derive(Debug, Clone)]
pub struct GenerateOptions {
    pub max_new_tokens: usize,
    pub sampling: SamplingConfig,
    /// Generation ends after producing one of these (it is kept in the output).
    pub stop_tokens: Vec<u32>,
    /// Positions the cache holds; by default what the prompt and `max_new_tokens` need.
    pub cache_capacity: Option<usize>,
}

impl GenerateOptions {
    /// The KV-cache capacity for a prompt of `prompt_len` tokens on a model with a context of
    /// `max_positions`: `cache_capacity` if set, else the prompt plus `max_new_tokens` plus one
    /// (saturating: a request of `usize::MAX` new tokens asks for the whole context); never more
    /// than the context. Sized to the request because a cache is allocated (and zeroed) whole:
    /// the full context of Qwen2.5 (32,768 positions) is about 1.9 GB for the 1.5B, which made
    /// every short generation pay for it.
    pub fn capacity_for(&self, prompt_len: usize, max_positions: usize) -> usize {
        self.cache_capacity
            .unwrap_or(
                prompt_len
                    .saturating_add(self.max_new_tokens)
                    .saturating_add(1),
            )
            .min(max_positions)
    }

    pub fn new(max_new_tokens: usize, sampling: SamplingConfig) -> Self {
        Self {
            max_new_tokens,
            sampling,
            stop_tokens: Vec::new(),
            cache_capacity: None,
        }
    }
}

/// Why generation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    MaxNewTokens,
    StopToken,
    ContextFull,
}

/// Counters of one generation.
#[derive(Debug, Clone, Serialize)]
pub struct GenerationStats {
    pub prompt_tokens: usize,
    pub new_tokens: usize,
    pub target_forwards: usize,
    /// Time to process the prompt and produce the first token.
    pub prompt_seconds: f64,
    pub wall_seconds: f64,
    /// New tokens per second of wall time, prompt included.
    pub tokens_per_second: f64,
    /// Tokens produced after the first step per second after it (decode speed). The first
    /// step gives one token in plain decoding and up to K + 1 in a speculative one, all of them
    /// inside `prompt_seconds`.
    pub decode_tokens_per_second: f64,
    /// The tokens `decode_tokens_per_second` counts: those after the first step, produced in
    /// `wall_seconds − prompt_seconds`.
    pub decode_tokens: usize,
    pub stop_reason: StopReason,
}

/// The output of one generation.
#[derive(Debug, Clone, Serialize)]
pub struct Generation {
    pub tokens: Vec<u32>,
    pub stats: GenerationStats,
}

/// Decodes up to `options.max_new_tokens` tokens after `prompt`, one target forward per token.
/// `on_token` sees each token as soon as it is produced (for streaming).
pub fn generate_plain<B: Backend>(
    model: &Transformer<B>,
    prompt: &[u32],
    options: &GenerateOptions,
    on_token: &mut dyn FnMut(u32),
) -> Result<Generation> {
    options.sampling.validate()?;
    if prompt.is_empty() {
        return Err(RuntimeError::InvalidRequest("the prompt is empty".into()));
    }
    let capacity = options.capacity_for(prompt.len(), model.max_positions());
    if prompt.len() >= capacity {
        return Err(RuntimeError::ContextOverflow {
            needed: prompt.len() + 1,
            capacity,
        });
    }
    let start = Instant::now();
    let mut cache = model.new_cache(capacity);
    let mut rng = options.sampling.rng();
    let mut tokens = Vec::with_capacity(options.max_new_tokens);
    let mut forwards = 0;
    let mut prompt_seconds = 0.0;
    let mut next_input: Vec<u32> = prompt.to_vec();
    let mut stop_reason = StopReason::MaxNewTokens;
    while tokens.len() < options.max_new_tokens {
        if cache.len() + next_input.len() > capacity {
            stop_reason = StopReason::ContextFull;
            break;
        }
        let out = model.forward(ForwardRequest::tokens(&next_input), &mut cache)?;
        forwards += 1;
        let logits = out
            .logits
            .ok_or_else(|| RuntimeError::InvalidRequest("no logits returned".into()))?;
        let token = sample_logits(logits, &options.sampling, &mut rng, Source::Target)?[0];
        if tokens.is_empty() {
            prompt_seconds = start.elapsed().as_secs_f64();
        }
        tokens.push(token);
        on_token(token);
        if options.stop_tokens.contains(&token) {
            stop_reason = StopReason::StopToken;
            break;
        }
        next_input = vec![token];
    }
    let wall_seconds = start.elapsed().as_secs_f64();
    let decode_seconds = wall_seconds - prompt_seconds;
    Ok(Generation {
        stats: GenerationStats {
            prompt_tokens: prompt.len(),
            new_tokens: tokens.len(),
            target_forwards: forwards,
            prompt_seconds,
            wall_seconds,
            tokens_per_second: tokens.len() as f64 / wall_seconds.max(1e-9),
            decode_tokens_per_second: if tokens.len() > 1 {
                (tokens.len() - 1) as f64 / decode_seconds.max(1e-9)
            } else {
                0.0
            },
            decode_tokens: tokens.len().saturating_sub(1),
            stop_reason,
        },
        tokens,
    })
}
