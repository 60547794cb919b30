//! What can go wrong with Medusa heads: their file, their fit to the target, their settings.

use std::path::PathBuf;

/// Errors of the Medusa heads and their drafter.
#[derive(Debug, thiserror::Error)]
pub enum MedusaError {
    #[error("{path}: {message}")]
    File { path: PathBuf, message: String },
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// Heads trained for another model: their hidden size, vocabulary or fingerprint differ.
    #[error("{path}: heads of another model: {message}")]
    Mismatch { path: PathBuf, message: String },
    #[error("invalid medusa settings: {0}")]
    Settings(String),
    #[error(transparent)]
    Runtime(#[from] spec_runtime::RuntimeError),
    #[error(transparent)]
    Tree(#[from] spec_tree::TreeError),
}

pub type Result<T, E = MedusaError> = std::result::Result<T, E>;
