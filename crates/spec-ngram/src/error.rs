//! The error type of `spec-ngram`.

use std::path::PathBuf;

/// Everything that can go wrong setting up or running an n-gram drafter.
#[derive(Debug, thiserror::Error)]
pub enum NgramError {
    #[error("the draft length K must be at least 1 (got {0})")]
    InvalidK(usize),
    #[error(
        "n-gram sizes must satisfy 1 ≤ ngram_min ≤ ngram_max ≤ {max} (got ngram_min = {min_n}, ngram_max = {max_n})"
    )]
    InvalidNgram {
        min_n: usize,
        max_n: usize,
        max: usize,
    },
    #[error(
        "the bigram model has a vocabulary of {model} tokens but the target model has {target}: \
         train it with the target's tokenizer (`cargo xtask train-bigram --model <target>`)"
    )]
    VocabMismatch { model: usize, target: usize },
    #[error("token {token} is outside the vocabulary of {vocab} tokens")]
    TokenOutOfRange { token: u32, vocab: usize },
    #[error("the vocabulary size must be between 1 and {max} (got {got})")]
    InvalidVocab { got: usize, max: usize },
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: not a valid bigram model file: {reason}")]
    Corrupt { path: PathBuf, reason: String },
    #[error(transparent)]
    Spec(#[from] spec_core::error::SpecError),
}

pub type Result<T, E = NgramError> = std::result::Result<T, E>;

impl From<NgramError> for spec_engine::EngineError {
    fn from(e: NgramError) -> Self {
        spec_engine::EngineError::Drafter(e.to_string())
    }
}
