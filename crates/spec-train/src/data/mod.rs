//! Training data: prompts from packaged corpora, answers and hidden states from the target.
//!
//! - Prompts: the first human turn of each complete ShareGPT conversation ([`read_sharegpt`]),
//!   the HumanEval problems framed as requests ([`read_humaneval`]), or a file of one's own
//!   ([`PromptSource`]). [`load_prompts`] drops duplicates and anything `spec bench` measures
//!   ([`bench_prompts`]), and orders them by a hash of their text; [`split_held_out`] sets a
//!   fraction apart by the same kind of hash.
//! - Answers, from one of two sources ([`AnswerSource`], part of the cache key):
//!   - [`AnswerSource::Target`] (the default): [`distill_sequence`] lets the target answer a
//!     prompt (rendered with its chat template, as `spec bench` renders it) through the
//!     engine's loop, recording the last-layer hidden state behind every answer token. The
//!     answers are the target's own, at its decoding speed: one pass a token.
//!   - [`AnswerSource::Dataset`]: [`teacher_forced_sequence`] feeds the dataset's reply
//!     ([`Prompt::reply`]) after the prompt and keeps the same hidden states, from passes over
//!     many tokens at once (prefill speed). The tokens are the dataset's writing, not the
//!     target's; the states are the target's reading of them, as Medusa's own recipe trains.
//! - [`distill_set`] does either for a whole split through a [`DistillCache`] on disk, so a
//!   second run with the same model and settings reads what the first made.

mod bench;
mod cache;
mod distill;
mod distill_set;
mod humaneval;
mod prompts;
mod set;
mod sharegpt;
mod split;
mod teacher;

use std::path::PathBuf;

pub use bench::{BENCH_PROMPTS_DIR, bench_prompts, bench_prompts_in};
pub use cache::{CacheKey, DistillCache, model_identity};
pub use distill::{AnswerSource, DistillSettings, PromptEncoder, distill_sequence};
pub use distill_set::{DistillProgress, distill_set};
pub use humaneval::{parse_humaneval, read_humaneval};
pub use prompts::{LoadedPrompts, Prompt, PromptSource, load_prompts};
pub use set::{DistilledSequence, DistilledSet};
pub use sharegpt::{ShareGptPrompts, parse_sharegpt, read_sharegpt};
pub use split::{PromptSplit, is_held_out, split_held_out};
pub use teacher::teacher_forced_sequence;

/// What can go wrong reading prompts, distilling answers or using the cache.
#[derive(Debug, thiserror::Error)]
pub enum DataError {
    #[error("{action} {}: {source}", path.display())]
    Io {
        action: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    /// A file that is not what it should be (not a JSON array, a bad line, a damaged shard).
    #[error("{}: {message}", path.display())]
    Format { path: PathBuf, message: String },
    /// A cache folder that does not match what is asked of it.
    #[error("distillation cache {}: {message}", dir.display())]
    Cache { dir: PathBuf, message: String },
    #[error("invalid settings: {0}")]
    Settings(String),
    #[error(transparent)]
    Tokenizer(#[from] spec_tokenizer::TokenizerError),
    #[error(transparent)]
    Engine(#[from] spec_engine::EngineError),
    #[error(transparent)]
    Runtime(#[from] spec_runtime::RuntimeError),
    /// Hidden states that could not be read back, or not as many as the answer needs.
    #[error("the target's hidden states: {0}")]
    HiddenStates(String),
    #[error(transparent)]
    Models(#[from] spec_models::ModelsError),
}

impl DataError {
    /// An I/O error on `path`, for `map_err`.
    pub(crate) fn io(
        action: &'static str,
        path: impl Into<PathBuf>,
    ) -> impl FnOnce(std::io::Error) -> Self {
        let path = path.into();
        move |source| Self::Io {
            action,
            path,
            source,
        }
    }

    pub(crate) fn format(path: impl Into<PathBuf>, message: impl Into<String>) -> Self {
        Self::Format {
            path: path.into(),
            message: message.into(),
        }
    }
}

pub type Result<T, E = DataError> = std::result::Result<T, E>;
