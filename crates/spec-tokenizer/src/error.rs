//! The one error type of `spec-tokenizer`.

use std::path::PathBuf;

/// Everything that can go wrong while building a tokenizer, encoding, decoding or rendering a
/// chat template.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TokenizerError {
    /// A GGUF metadata key the tokenizer needs is absent.
    #[error(
        "GGUF metadata key `{key}` is missing; the file has no usable tokenizer (was it converted \
         with its tokenizer?)"
    )]
    MissingKey { key: &'static str },
    /// A GGUF metadata key has a value of the wrong type.
    #[error("GGUF metadata key `{key}` should be {expected}, found {found}")]
    WrongType {
        key: &'static str,
        expected: &'static str,
        found: String,
    },
    /// `tokenizer.ggml.model` names a tokenizer family this crate does not build.
    #[error(
        "unsupported tokenizer model `{model}` (tokenizer.ggml.model); only byte-level BPE \
         (`gpt2`) is supported"
    )]
    UnsupportedModel { model: String },
    /// `tokenizer.ggml.pre` names a pre-tokenizer this crate does not know.
    #[error(
        "unsupported pre-tokenizer `{pre}` (tokenizer.ggml.pre); supported values: {supported}. \
         Each value stands for a specific splitting regex, so an unknown one cannot be guessed"
    )]
    UnsupportedPreTokenizer { pre: String, supported: String },
    /// The token list and another per-token array disagree in length.
    #[error("`{key}` has {found} entries but there are {expected} tokens")]
    LengthMismatch {
        key: &'static str,
        expected: usize,
        found: usize,
    },
    /// A token id in the metadata is outside the vocabulary.
    #[error("`{key}` is {id}, outside the vocabulary of {vocab_size} tokens")]
    IdOutOfRange {
        key: &'static str,
        id: u64,
        vocab_size: usize,
    },
    /// A token text appears twice in the vocabulary, so text → id is ambiguous.
    #[error(
        "token text {text:?} appears at ids {first} and {second}; the vocabulary must be unique"
    )]
    DuplicateToken {
        text: String,
        first: u32,
        second: u32,
    },
    /// A merge rule is not of the form `left right`.
    #[error("merge rule {index} ({rule:?}) is not two tokens separated by one space")]
    BadMerge { index: usize, rule: String },
    /// The GGUF file could not be read.
    #[error(transparent)]
    Gguf(#[from] spec_gguf::GgufError),
    /// A tokenizer.json (or its companion config) could not be read.
    #[error("cannot read {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A JSON companion file (tokenizer_config.json) is malformed.
    #[error("cannot parse {path}: {source}")]
    Json {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    /// The tokenizer.json decodes with something other than byte-level BPE.
    #[error(
        "tokenizer.json uses decoder {found}; only byte-level decoders are supported (token pieces \
         for streaming are derived from the byte-level alphabet)"
    )]
    UnsupportedDecoder { found: String },
    /// An error from the `tokenizers` library (building, loading, encoding).
    #[error("tokenizers: {0}")]
    Hf(String),
    /// A token id passed to decode is not in the vocabulary.
    #[error("token id {id} is outside the vocabulary of {vocab_size} tokens")]
    UnknownId { id: u32, vocab_size: usize },
    /// The model has no chat template.
    #[error(
        "the model has no chat template (tokenizer.chat_template / tokenizer_config.json); \
         format the prompt yourself or supply a template with `ChatTemplate::new`"
    )]
    NoChatTemplate,
    /// The chat template did not compile or failed while rendering.
    #[error("chat template: {0}")]
    Template(String),
}

impl From<tokenizers::Error> for TokenizerError {
    fn from(e: tokenizers::Error) -> Self {
        Self::Hf(e.to_string())
    }
}

/// Results of this crate.
pub type Result<T, E = TokenizerError> = std::result::Result<T, E>;
