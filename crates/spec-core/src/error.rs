//! The one error type of `spec-core`.

use crate::tree::NodeId;

/// Everything that can go wrong in sampling and verification.
///
/// Every variant is a caller's mistake or bad model output; none is a bug to `unwrap` away.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SpecError {
    #[error("temperature must be a finite number ≥ 0, got {0}")]
    InvalidTemperature(f64),
    #[error(
        "temperature {0:e} is below the smallest usable temperature {min:e} (use 0 for greedy)",
        min = crate::sampling::MIN_TEMPERATURE
    )]
    TemperatureTooSmall(f64),
    #[error("top_k must be at least 1 (leave it unset to disable it)")]
    InvalidTopK,
    #[error("top_p must lie in (0, 1], got {0}")]
    InvalidTopP(f64),
    #[error("min_p must lie in [0, 1], got {0}")]
    InvalidMinP(f64),
    #[error(
        "row {row} of the {what} logits is not usable: it holds NaN or +inf, or every entry is -inf"
    )]
    NonFiniteLogits { what: Source, row: usize },
    #[error(
        "drafted token {token} at tree node {node} has draft probability 0: it cannot have been drafted from that distribution"
    )]
    ImpossibleDraft { node: NodeId, token: u32 },
    #[error("token {token} is outside the vocabulary of {vocab} entries")]
    TokenOutOfVocabulary { token: u32, vocab: usize },
    #[error("shape mismatch: {0}")]
    Shape(String),
    #[error("tree node {parent} does not exist (the tree has {len} nodes)")]
    NoSuchNode { parent: NodeId, len: usize },
    #[error(
        "drafted token {token} at tree node {node} was drawn without replacement, but an earlier sibling drawn that way holds it already"
    )]
    RepeatedDraw { node: NodeId, token: u32 },
}

/// Which model's numbers an error is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    Target,
    Draft,
}

impl std::fmt::Display for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Source::Target => "target",
            Source::Draft => "draft",
        })
    }
}

pub type Result<T, E = SpecError> = std::result::Result<T, E>;
