//! Teacher forcing: the dataset's reply to a prompt fed through the target as if the target had
//! written it, so that every hidden state comes from passes over many tokens at once (the
//! prompt's speed) instead of one decoding step a token.

use burn::tensor::backend::Backend;
use spec_runtime::{ForwardRequest, LogitRows, Transformer};

use super::distill::{DistillSettings, hidden_size};
use super::set::DistilledSequence;
use super::{DataError, Result};

/// `prompt` followed by `reply`, with the target's hidden state behind each reply token: the
/// same sequence [`super::distill_sequence`] makes had the target answered `reply` itself
/// (row `i` is the state after the final norm at the position before answer token `i`).
///
/// The reply is cut to `settings.max_new_tokens` and so that prompt and answer fit the
/// target's context; it may come back empty (nothing to train on). Sampling settings are not
/// used. The prompt goes in one pass and the answer in a second on the same cache, as the
/// engine's prefill and steps do; on flex the host path runs both in passes of
/// [`spec_runtime::model::HOST_PASS_ROWS`].
///
/// # Errors
/// An empty prompt or one that fills the context, a token outside the vocabulary, or a failed
/// pass.
pub fn teacher_forced_sequence<B: Backend>(
    target: &Transformer<B>,
    prompt: &[u32],
    reply: &[u32],
    settings: &DistillSettings,
) -> Result<DistilledSequence> {
    settings.validate()?;
    if prompt.is_empty() || prompt.len() >= target.max_positions() {
        return Err(DataError::Settings(format!(
            "a prompt of {} tokens for a context of {}: it needs at least one token and room \
             for one more",
            prompt.len(),
            target.max_positions()
        )));
    }
    let n = reply
        .len()
        .min(settings.max_new_tokens)
        .min(target.max_positions() - prompt.len());
    let mut tokens = Vec::with_capacity(prompt.len() + n);
    tokens.extend_from_slice(prompt);
    tokens.extend_from_slice(&reply[..n]);
    let answer_start = prompt.len();
    if n == 0 {
        return Ok(DistilledSequence {
            tokens,
            answer_start,
            hidden: Vec::new(),
            held_out: false,
        });
    }

    // Every position but the last holds a token the target reads; the states at the prompt's
    // last position and at the answer's tokens but the last predict the answer.
    let mut cache = target.new_cache(answer_start + n - 1);
    if answer_start > 1 {
        target.forward(
            ForwardRequest::tokens(&tokens[..answer_start - 1]).logits(LogitRows::None),
            &mut cache,
        )?;
    }
    let out = target.forward(
        ForwardRequest::tokens(&tokens[answer_start - 1..answer_start + n - 1])
            .logits(LogitRows::None),
        &mut cache,
    )?;
    let hidden: Vec<f32> = target
        .norm
        .forward(out.last_hidden)
        .into_data()
        .convert::<f32>()
        .to_vec()
        .map_err(|e| DataError::HiddenStates(format!("reading them back: {e:?}")))?;
    if hidden.len() != n * hidden_size(target) {
        return Err(DataError::HiddenStates(format!(
            "{} values for {n} answer tokens of width {}",
            hidden.len(),
            hidden_size(target)
        )));
    }
    Ok(DistilledSequence {
        tokens,
        answer_start,
        hidden,
        held_out: false,
    })
}
