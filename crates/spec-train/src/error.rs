//! What can go wrong while training: each variant prints as one line that names its cause.

use std::path::{Path, PathBuf};

use thiserror::Error;

/// An error of the training loop, its checkpoints or its plots.
#[derive(Debug, Error)]
pub enum TrainError {
    /// A setting is out of range.
    #[error("invalid training setting `{setting}`: {reason}")]
    InvalidSetting {
        /// The setting's name as written in the settings file.
        setting: &'static str,
        /// What is wrong with its value.
        reason: String,
    },
    /// Reading or writing a file failed.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },
    /// A checkpoint's files are truncated, altered or unreadable.
    #[error("corrupt checkpoint {}: {reason}", path.display())]
    CorruptCheckpoint {
        /// The checkpoint's directory or file.
        path: PathBuf,
        /// What failed.
        reason: String,
    },
    /// A checkpoint was written for another model, method or settings than this run's.
    #[error("checkpoint {} is of another run: {difference}", path.display())]
    CheckpointMismatch {
        /// The checkpoint's directory.
        path: PathBuf,
        /// The first difference found.
        difference: String,
    },
    /// The checkpoint directory already holds a run and resuming was not asked for.
    #[error(
        "{} already holds a checkpoint at step {step}: resume it or choose another directory",
        path.display()
    )]
    CheckpointExists {
        /// The checkpoint directory.
        path: PathBuf,
        /// Steps completed by that checkpoint.
        step: usize,
    },
    /// The training loss is NaN or infinite.
    #[error(
        "the training loss is {loss} at step {step} (learning rate {learning_rate:.3e}): lower the learning rate or clip gradients"
    )]
    NonFiniteLoss {
        /// The step (0-based) whose loss it is.
        step: usize,
        /// The loss read back.
        loss: f64,
        /// The learning rate of that step.
        learning_rate: f64,
    },
    /// The task failed to build a batch or to evaluate.
    #[error("the training task failed at step {step}: {source}")]
    Task {
        /// Steps completed when it failed.
        step: usize,
        /// The task's own error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// Drawing a plot failed.
    #[error("drawing {}: {reason}", path.display())]
    Plot {
        /// The SVG file.
        path: PathBuf,
        /// The plotting library's message.
        reason: String,
    },
}

impl TrainError {
    pub(crate) fn io(path: &Path, source: std::io::Error) -> Self {
        Self::Io {
            path: path.to_path_buf(),
            source,
        }
    }

    pub(crate) fn corrupt(path: &Path, reason: impl std::fmt::Display) -> Self {
        // Some underlying messages span lines; the error stays on one.
        let reason = reason
            .to_string()
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ");
        Self::CorruptCheckpoint {
            path: path.to_path_buf(),
            reason,
        }
    }

    pub(crate) fn invalid(setting: &'static str, reason: impl Into<String>) -> Self {
        Self::InvalidSetting {
            setting,
            reason: reason.into(),
        }
    }
}
