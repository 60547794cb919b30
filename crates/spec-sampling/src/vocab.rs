//! The vocabulary check done once at construction.

use spec_tokenizer::TextTokenizer;

use crate::error::{Result, SamplingError};

/// Checks that a draft can speak for a target: each tokenizer fits its model's output layer, and
/// every id means the same bytes in both tokenizers (ids beyond the shorter one must be unused
/// padding: a padded prefix is fine).
///
/// # Errors
/// [`SamplingError::TokenizerLargerThanModel`] or [`SamplingError::VocabularyMismatch`] (with the
/// first differing id and what each tokenizer calls it).
pub fn check_vocabularies(
    draft: &TextTokenizer,
    draft_model_vocab: usize,
    target: &TextTokenizer,
    target_model_vocab: usize,
) -> Result<()> {
    for (which, tokenizer, model) in [
        ("draft", draft, draft_model_vocab),
        ("target", target, target_model_vocab),
    ] {
        if tokenizer.vocab_size() > model {
            return Err(SamplingError::TokenizerLargerThanModel {
                which,
                tokenizer: tokenizer.vocab_size(),
                model,
            });
        }
    }
    match draft.first_vocab_difference(target) {
        None => Ok(()),
        Some(id) => Err(SamplingError::VocabularyMismatch {
            id,
            draft: draft.id_to_token(id),
            target: target.id_to_token(id),
        }),
    }
}
