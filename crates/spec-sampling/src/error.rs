//! Errors of setting up speculative sampling. Errors while generating are `spec-engine`'s
//! [`EngineError`]: a runtime failure of the draft model, or `spec-core`'s typed error (e.g. a draft
//! whose logits are NaN gives `SpecError::NonFiniteLogits { what: Source::Draft, .. }`).

use spec_engine::EngineError;

pub type Result<T, E = SamplingError> = std::result::Result<T, E>;

/// What is wrong with a draft model setup.
#[derive(Debug, thiserror::Error)]
pub enum SamplingError {
    #[error("the draft length K must be at least 1; use plain decoding for no drafts")]
    ZeroDraftLength,
    #[error("`{0}` is not a draft length: give a number ≥ 1 or `auto`")]
    BadDraftLength(String),
    #[error("the confidence threshold must lie in (0, 1), got {0}")]
    InvalidThreshold(f64),
    #[error(
        "a confidence threshold stops a chain of at most K drafts: give --k a number, not \
         `auto` (which sets its own lengths)"
    )]
    ThresholdWithAuto,
    #[error(
        "the draft model's vocabulary has {draft} entries and the target's {target}; models of \
         different widths need their tokenizers to show the extra ids are padding \
         (use DraftModelDrafter::with_tokenizers)"
    )]
    VocabularySize { draft: usize, target: usize },
    #[error(
        "the draft and target tokenizers differ at token id {id} (draft: {draft:?}, target: \
         {target:?}); speculative sampling needs the same ids for the same tokens: pick a draft \
         model of the target's family"
    )]
    VocabularyMismatch {
        id: u32,
        draft: Option<String>,
        target: Option<String>,
    },
    #[error("the {which} tokenizer has {tokenizer} tokens but its model only {model} outputs")]
    TokenizerLargerThanModel {
        which: &'static str,
        tokenizer: usize,
        model: usize,
    },
}

impl From<SamplingError> for EngineError {
    fn from(e: SamplingError) -> Self {
        EngineError::Setup(e.to_string())
    }
}
