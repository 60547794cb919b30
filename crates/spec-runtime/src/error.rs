//! The runtime's error type.

use thiserror::Error;

pub type Result<T, E = RuntimeError> = std::result::Result<T, E>;

#[derive(Debug, Error)]
pub enum RuntimeError {
    #[error(transparent)]
    Gguf(#[from] spec_gguf::GgufError),
    #[error("reading {path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} is not a valid config.json: {source}")]
    Config {
        path: String,
        #[source]
        source: serde_json::Error,
    },
    #[error("{0}")]
    Safetensors(String),
    #[error("the checkpoint has no tensor `{0}`")]
    MissingTensor(String),
    #[error("tensor `{name}` has shape {found:?}; the model config needs {expected:?}")]
    ShapeMismatch {
        name: String,
        expected: Vec<usize>,
        found: Vec<usize>,
    },
    #[error("the checkpoint's metadata has no `{0}`")]
    MissingMetadata(String),
    #[error("architecture `{0}` is not supported (supported: llama, qwen2)")]
    UnsupportedArchitecture(String),
    #[error("invalid model config: {0}")]
    InvalidConfig(String),
    #[error(
        "{needed} positions do not fit the cache of {capacity} (the model's context or the cache size given)"
    )]
    ContextOverflow { needed: usize, capacity: usize },
    #[error("token id {token} is outside the model's vocabulary of {vocab}")]
    TokenOutOfVocabulary { token: u32, vocab: usize },
    #[error(transparent)]
    Sampling(#[from] spec_core::error::SpecError),
    #[error("invalid forward request: {0}")]
    InvalidRequest(String),
    #[error(
        "the model's {name} takes {bytes} bytes in f32, more than the {limit} bytes this device \
         holds in one buffer"
    )]
    WeightTooLarge {
        name: &'static str,
        bytes: u64,
        limit: u64,
    },
}
