//! The speculative decoding loop that every method shares.
//!
//! A method is a [`Drafter`]: given the sequence so far it proposes a [`TokenTree`] rooted at the
//! last token (a chain is a tree with one child per node) and says how the tokens were proposed
//! ([`Proposal`]: sampled from a draft distribution `q`, or deterministic candidates). The loop
//! in [`generate_speculative`] then does what is the same for every method:
//!
//! 1. the drafter drafts ([`Drafter::draft`]), with the target and its KV cache lent to it
//!    ([`TargetView`]) for methods that draft with the target's own layers; whatever it
//!    appended to the cache is dropped before the next point;
//! 2. [`step`]: the target runs once over the tree (`positions = base + depth`, ancestor mask),
//!    `spec_core::verify::Verifier` accepts a path and draws the next token (exact: the output
//!    follows the target's distribution under the sampling settings; greedy equals argmax), and
//!    the target's cache keeps the accepted path ([`KvCache::keep_path`]), all timed together;
//! 3. the drafter is handed the step's [`StepOutcome`] ([`Drafter::accepted`]): the verdict,
//!    the step's width and seconds, and the target's hidden states or distributions of the
//!    accepted path where it declared it needs them ([`Drafter::needs`]).
//!
//! With a drafter that proposes nothing, a step is one plain decoding step.
//!
//! [`TokenTree`]: spec_core::tree::TokenTree
//! [`Proposal`]: spec_core::verify::Proposal
//! [`KvCache::keep_path`]: spec_runtime::KvCache::keep_path

mod drafter;
mod generate;
mod step;

use spec_runtime::RuntimeError;

pub mod method;

pub use drafter::{Draft, DraftRequest, Drafter, NoDraft, TargetView};
pub use generate::{SpecGeneration, WidthSteps, generate_speculative};
pub use spec_core::step::{StepNeeds, StepOutcome};
pub use spec_core::tree::ROOT;
pub use step::step;

/// Errors of a speculative generation.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
    #[error(transparent)]
    Verify(#[from] spec_core::error::SpecError),
    /// The drafter's own failure (its model, its files), with its message.
    #[error("drafter: {0}")]
    Drafter(String),
    #[error("invalid drafter setup: {0}")]
    Setup(String),
}

pub type Result<T, E = EngineError> = std::result::Result<T, E>;
