//! A whole split distilled through the cache: answers already on disk are read, the others
//! generated and written shard by shard.

use burn::tensor::backend::Backend;
use spec_runtime::Transformer;

use super::cache::DistillCache;
use super::distill::{PromptEncoder, distill_sequence, hidden_size};
use super::prompts::text_hash;
use super::set::DistilledSet;
use super::split::PromptSplit;
use super::{DataError, Result};

/// Where a distillation stands, after each sequence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DistillProgress {
    /// Sequences done (1-based), of `of`.
    pub sequence: usize,
    pub of: usize,
    /// Answer tokens generated so far in this run (not counting those read from the cache).
    pub generated_tokens: usize,
    /// Whether this sequence was on disk already.
    pub cached: bool,
}

/// The target's answers to every prompt of `split`, with its hidden states: those in `cache`
/// read, the others generated with the cache's settings and added to it (see
/// [`super::distill_sequence`]). `progress` is called after each sequence, cached or not.
///
/// Every sequence comes back from the cache, freshly generated or not, so a first run and a
/// second give the same set (hidden states rounded to f16 both times).
///
/// # Errors
/// A cache made for another target shape, a prompt that cannot be encoded, or a failed
/// generation or write (what was written before it stays).
pub fn distill_set<B: Backend>(
    target: &Transformer<B>,
    encoder: &dyn PromptEncoder,
    split: &PromptSplit,
    cache: &mut DistillCache,
    progress: &mut dyn FnMut(DistillProgress),
) -> Result<DistilledSet> {
    let settings = cache.key().settings.clone();
    settings.validate()?;
    // Room for at least one new token in the target's context.
    let max_prompt = settings
        .max_prompt_tokens
        .min(target.max_positions().saturating_sub(1));
    let prompts: Vec<(&str, bool)> = split
        .train
        .iter()
        .map(|p| (p.text.as_str(), false))
        .chain(split.held_out.iter().map(|p| (p.text.as_str(), true)))
        .collect();
    let of = prompts.len();
    let mut generated_tokens = 0;
    for (i, &(text, _)) in prompts.iter().enumerate() {
        let cached = cache.contains(text);
        if !cached {
            let ids = encoder.encode_prompt(text, max_prompt)?;
            let mut sequence_settings = settings.clone();
            sequence_settings.sampling.seed ^= seed_of(text);
            let sequence =
                distill_sequence(target, &ids, &sequence_settings, encoder.stop_tokens())?;
            generated_tokens += sequence.answer().len();
            cache.push(text, sequence)?;
        }
        progress(DistillProgress {
            sequence: i + 1,
            of,
            generated_tokens,
            cached,
        });
    }
    let texts: Vec<&str> = prompts.iter().map(|(t, _)| *t).collect();
    let loaded = cache.load(&texts)?;
    let mut sequences = Vec::with_capacity(of);
    for ((text, held_out), sequence) in prompts.iter().zip(loaded) {
        let mut sequence = sequence.ok_or_else(|| DataError::Cache {
            dir: cache.dir().to_owned(),
            message: format!("the answer to {text:?} was written but is not found"),
        })?;
        sequence.held_out = *held_out;
        sequences.push(sequence);
    }
    Ok(DistilledSet {
        hidden_size: hidden_size(target),
        vocab_size: target.vocab_size,
        sequences,
    })
}

/// A prompt's own share of the seed: sampled answers depend on the prompt alone, not on
/// which prompts came before it.
fn seed_of(text: &str) -> u64 {
    let hash = text_hash("spec-train sampling seed", text);
    let mut first = [0u8; 8];
    first.copy_from_slice(&hash[..8]);
    u64::from_le_bytes(first)
}
