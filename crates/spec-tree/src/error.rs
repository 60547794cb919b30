//! Errors of tree drafting.

use spec_engine::EngineError;

#[derive(Debug, thiserror::Error)]
pub enum TreeError {
    /// A tree shape that is not `N[xN]...` with every N ≥ 1.
    #[error("bad tree shape `{0}`: write children per node at each depth, e.g. 4x2x2x1")]
    BadShape(String),
    #[error("invalid tree settings: {0}")]
    Settings(String),
    /// A tree without any source of candidates.
    #[error("a tree needs a source of candidates: a draft model, prompt lookup or a bigram model")]
    NoSource,
    #[error(transparent)]
    Spec(#[from] spec_core::error::SpecError),
    #[error(transparent)]
    Sampling(#[from] spec_sampling::SamplingError),
    #[error(transparent)]
    Ngram(#[from] spec_ngram::NgramError),
    /// A broken invariant of the tree's own bookkeeping.
    #[error("tree drafter: {0}")]
    Internal(String),
}

pub type Result<T, E = TreeError> = std::result::Result<T, E>;

impl From<TreeError> for EngineError {
    fn from(e: TreeError) -> Self {
        match e {
            TreeError::Settings(_) | TreeError::BadShape(_) | TreeError::NoSource => {
                EngineError::Setup(e.to_string())
            }
            other => EngineError::Drafter(other.to_string()),
        }
    }
}
