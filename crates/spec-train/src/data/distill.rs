//! Self-distillation of one prompt: the target answers through the engine's loop with a
//! drafter that proposes nothing and asks for the target's hidden states, so each step is
//! one plain decoding step and hands over the state that predicted its token.

use burn::tensor::backend::Backend;
use serde::{Deserialize, Serialize};
use spec_core::sampling::SamplingConfig;
use spec_engine::{
    Draft, DraftRequest, Drafter, EngineError, StepNeeds, StepOutcome, generate_speculative,
};
use spec_runtime::{GenerateOptions, StopReason, Transformer};
use spec_tokenizer::{Message, TextTokenizer};

use super::set::DistilledSequence;
use super::{DataError, Result};

/// How answers are generated. Part of the cache's key: other settings, other answers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DistillSettings {
    /// Prompts longer than this (in tokens, chat template included) lose the end of their
    /// text (see [`PromptEncoder::encode_prompt`]).
    pub max_prompt_tokens: usize,
    /// The longest answer; an answer also ends at a stop token or when the context is full.
    pub max_new_tokens: usize,
    /// Greedy by default; with a temperature, each prompt draws from its own stream (the seed
    /// mixed with a hash of the prompt's text, so an answer depends on nothing but its prompt).
    /// Unused with [`AnswerSource::Dataset`].
    pub sampling: SamplingConfig,
    /// Who writes the answers. Left out of the key's JSON when it is [`AnswerSource::Target`],
    /// so caches made before the field existed keep their folders.
    #[serde(default, skip_serializing_if = "AnswerSource::is_target")]
    pub answers: AnswerSource,
}

/// Where the answers the heads learn from come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AnswerSource {
    /// The target answers each prompt itself, one decoding step a token
    /// ([`distill_sequence`]).
    #[default]
    Target,
    /// The dataset's reply ([`super::Prompt::reply`]), teacher-forced through the target in
    /// one pass at prefill speed ([`super::teacher_forced_sequence`]); prompts without one are
    /// skipped.
    Dataset,
}

impl AnswerSource {
    pub fn is_target(&self) -> bool {
        *self == Self::Target
    }

    /// `target` or `dataset`, as in the cache key and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Self::Target => "target",
            Self::Dataset => "dataset",
        }
    }
}

impl Default for DistillSettings {
    fn default() -> Self {
        Self {
            max_prompt_tokens: 512,
            max_new_tokens: 256,
            sampling: SamplingConfig::greedy(),
            answers: AnswerSource::Target,
        }
    }
}

impl DistillSettings {
    /// # Errors
    /// A zero length, or sampling settings the engine refuses.
    pub fn validate(&self) -> Result<()> {
        if self.max_prompt_tokens == 0 || self.max_new_tokens == 0 {
            return Err(DataError::Settings(
                "max_prompt_tokens and max_new_tokens must be positive".into(),
            ));
        }
        self.sampling
            .validate()
            .map_err(|e| DataError::Settings(e.to_string()))
    }
}

/// Turns a prompt's text into the tokens the target answers, and says which tokens end an
/// answer. [`TextTokenizer`] does it with the model's chat template; tests use toys.
pub trait PromptEncoder {
    /// The prompt as the target sees it, at most `max_tokens` long.
    fn encode_prompt(&self, text: &str, max_tokens: usize) -> Result<Vec<u32>>;

    /// A reply's tokens, to follow [`PromptEncoder::encode_prompt`]'s: what the target's
    /// answer holds where it writes this text (no stop token).
    fn encode_reply(&self, text: &str) -> Result<Vec<u32>>;

    /// Tokens that end an answer.
    fn stop_tokens(&self) -> &[u32];
}

impl PromptEncoder for TextTokenizer {
    /// The text as one user message, rendered with the chat template and the assistant's
    /// header, then encoded with the special tokens: exactly what `spec bench` does. A longer
    /// prompt keeps the beginning of its text: it is cut by tokens, decoded, and rendered
    /// again until the whole fits.
    fn encode_prompt(&self, text: &str, max_tokens: usize) -> Result<Vec<u32>> {
        let render = |text: &str| -> Result<Vec<u32>> {
            let chat = self.apply_chat_template(&[Message::user(text)], true)?;
            Ok(self.encode(&chat, true)?)
        };
        let ids = render(text)?;
        if ids.len() <= max_tokens {
            return Ok(ids);
        }
        let body = self.encode(text, false)?;
        let mut keep = body.len().saturating_sub(ids.len() - max_tokens);
        loop {
            let ids = render(&self.decode(&body[..keep])?)?;
            if ids.len() <= max_tokens {
                return Ok(ids);
            }
            if keep == 0 {
                return Err(DataError::Settings(format!(
                    "the chat template alone takes {} tokens, more than max_prompt_tokens = \
                     {max_tokens}",
                    ids.len()
                )));
            }
            keep = keep.saturating_sub((ids.len() - max_tokens).max(1));
        }
    }

    /// The text encoded alone, without special tokens: the prompt ends with the assistant's
    /// header, so the reply starts a fresh piece of text, as the target's own answer does.
    fn encode_reply(&self, text: &str) -> Result<Vec<u32>> {
        Ok(self.encode(text, false)?)
    }

    fn stop_tokens(&self) -> &[u32] {
        self.eos_ids()
    }
}

/// The target's hidden size: its final norm's width.
pub(crate) fn hidden_size<B: Backend>(target: &Transformer<B>) -> usize {
    target.norm.weight.val().dims()[0]
}

/// Proposes nothing; keeps each step's first hidden row (the root's: the state that
/// predicted the step's one token).
struct HiddenRecorder {
    hidden_size: usize,
    rows: Vec<f32>,
}

impl<B: Backend> Drafter<B> for HiddenRecorder {
    fn name(&self) -> &str {
        "distill"
    }

    fn needs(&self) -> StepNeeds {
        StepNeeds {
            hidden: true,
            target_probs: false,
        }
    }

    fn begin(&mut self, _prompt: &[u32]) -> spec_engine::Result<()> {
        self.rows.clear();
        Ok(())
    }

    fn draft(&mut self, request: DraftRequest<'_, B>) -> spec_engine::Result<Draft<B>> {
        Ok(Draft::none(request.root()?))
    }

    fn accepted(&mut self, _context: &[u32], outcome: &StepOutcome<B>) -> spec_engine::Result<()> {
        let hidden = outcome
            .hidden
            .as_ref()
            .ok_or_else(|| EngineError::Drafter("the step came without hidden states".into()))?;
        let values: Vec<f32> = hidden
            .clone()
            .into_data()
            .convert::<f32>()
            .to_vec()
            .map_err(|e| EngineError::Drafter(format!("reading a hidden state: {e:?}")))?;
        let row = values.get(..self.hidden_size).ok_or_else(|| {
            EngineError::Drafter(format!(
                "a hidden row of {} values, expected {}",
                values.len(),
                self.hidden_size
            ))
        })?;
        self.rows.extend_from_slice(row);
        Ok(())
    }
}

/// The target's answer to `prompt` (tokens) and the hidden state behind each answer token.
/// Ends at `settings.max_new_tokens`, a full context, or one of `stop_tokens` (not kept, see
/// [`DistilledSequence::tokens`]). The result is not held out; the caller marks it.
pub fn distill_sequence<B: Backend>(
    target: &Transformer<B>,
    prompt: &[u32],
    settings: &DistillSettings,
    stop_tokens: &[u32],
) -> Result<DistilledSequence> {
    settings.validate()?;
    let hidden_size = hidden_size(target);
    let mut recorder = HiddenRecorder {
        hidden_size,
        rows: Vec::with_capacity(settings.max_new_tokens * hidden_size),
    };
    let mut options = GenerateOptions::new(settings.max_new_tokens, settings.sampling);
    options.stop_tokens = stop_tokens.to_vec();
    let generation = generate_speculative(target, &mut recorder, prompt, &options, &mut |_| {})?;
    let mut answer = generation.tokens;
    if generation.stats.stop_reason == StopReason::StopToken {
        answer.pop();
    }
    if recorder.rows.len() != answer.len() * hidden_size {
        return Err(EngineError::Drafter(format!(
            "{} hidden rows for {} answer tokens",
            recorder.rows.len() / hidden_size.max(1),
            answer.len()
        ))
        .into());
    }
    let mut tokens = prompt.to_vec();
    tokens.extend(&answer);
    Ok(DistilledSequence {
        tokens,
        answer_start: prompt.len(),
        hidden: recorder.rows,
        held_out: false,
    })
}
