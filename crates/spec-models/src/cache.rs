//! Where reference models are cached, and turning a name or a path into a file.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use crate::error::ModelsError;
use crate::registry::{ReferenceModel, known_names, reference_model};

/// Environment variable that overrides the cache directory.
pub const MODELS_DIR_ENV: &str = "SPEC_MODELS_DIR";

/// The directory that holds the cached reference models: `$SPEC_MODELS_DIR` if set and not
/// empty, else `<user cache dir>/spec-decode/models` (`~/.cache/spec-decode/models` on Linux).
pub fn models_dir() -> Result<PathBuf, ModelsError> {
    models_dir_from(std::env::var_os(MODELS_DIR_ENV), dirs::cache_dir())
}

fn models_dir_from(
    env: Option<OsString>,
    user_cache: Option<PathBuf>,
) -> Result<PathBuf, ModelsError> {
    match env {
        Some(dir) if !dir.is_empty() => Ok(PathBuf::from(dir)),
        _ => user_cache
            .map(|c| c.join("spec-decode").join("models"))
            .ok_or(ModelsError::NoCacheDir),
    }
}

/// Turns what a user typed into a model file: an existing path is returned as is; a reference
/// name becomes its file in [`models_dir`], whose size is checked (not its hash: that is
/// [`verify`](crate::verify)'s job).
///
/// # Errors
/// [`ModelsError::NotFetched`] (the message names `cargo xtask fetch-models <name>`) when a
/// reference model is not cached, [`ModelsError::WrongSize`] when its file is incomplete, and
/// [`ModelsError::Unknown`] (listing the reference names) for anything else.
pub fn resolve(name_or_path: &str) -> Result<PathBuf, ModelsError> {
    // A path needs no cache directory, so it must not fail for the lack of one.
    if Path::new(name_or_path).exists() {
        return Ok(PathBuf::from(name_or_path));
    }
    resolve_in(&models_dir()?, name_or_path)
}

/// [`resolve`] with the cache directory given.
pub fn resolve_in(dir: &Path, name_or_path: &str) -> Result<PathBuf, ModelsError> {
    let as_path = Path::new(name_or_path);
    if as_path.exists() {
        return Ok(as_path.to_path_buf());
    }
    let model = reference_model(name_or_path).ok_or_else(|| ModelsError::Unknown {
        given: name_or_path.to_owned(),
        known: known_names(),
    })?;
    let path = dir.join(model.file_name);
    check_size(model, &path)?;
    Ok(path)
}

/// Checks that `path` exists and has the model's pinned size.
pub(crate) fn check_size(model: &ReferenceModel, path: &Path) -> Result<(), ModelsError> {
    let found = match std::fs::metadata(path) {
        Ok(meta) => meta.len(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(ModelsError::NotFetched {
                name: model.name.to_owned(),
                path: path.to_path_buf(),
            });
        }
        Err(e) => return Err(ModelsError::io("read the metadata of", path)(e)),
    };
    if found != model.size {
        return Err(ModelsError::WrongSize {
            name: model.name.to_owned(),
            path: path.to_path_buf(),
            found,
            expected: model.size,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::REFERENCE_MODELS;

    /// A sparse file of the pinned size: cheap even for a gigabyte.
    fn fake_cached(dir: &Path, model: &ReferenceModel, size: u64) -> PathBuf {
        let path = dir.join(model.file_name);
        let file = std::fs::File::create(&path).unwrap();
        file.set_len(size).unwrap();
        path
    }

    #[test]
    fn existing_path_is_returned_as_is() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("my-model.gguf");
        std::fs::write(&file, b"GGUF").unwrap();
        let given = file.to_str().unwrap();
        let cache = dir.path().join("empty-cache");
        assert_eq!(resolve_in(&cache, given).unwrap(), file);
        // Also through `resolve`, which must not need the cache directory for a path.
        assert_eq!(resolve(given).unwrap(), file);
    }

    #[test]
    fn cached_reference_name_resolves_to_its_file() {
        let dir = tempfile::tempdir().unwrap();
        for model in REFERENCE_MODELS {
            let path = fake_cached(dir.path(), model, model.size);
            assert_eq!(resolve_in(dir.path(), model.name).unwrap(), path);
        }
    }

    #[test]
    fn missing_reference_model_names_the_fetch_command() {
        let dir = tempfile::tempdir().unwrap();
        let err = resolve_in(dir.path(), "qwen2.5-coder-0.5b").unwrap_err();
        assert!(matches!(err, ModelsError::NotFetched { .. }), "{err:?}");
        let msg = err.to_string();
        assert!(
            msg.contains("`cargo xtask fetch-models qwen2.5-coder-0.5b`"),
            "{msg}"
        );
        assert!(msg.contains("qwen2.5-coder-0.5b.gguf"), "{msg}");
    }

    #[test]
    fn truncated_cached_file_is_reported_with_both_sizes() {
        let dir = tempfile::tempdir().unwrap();
        let model = &REFERENCE_MODELS[0];
        fake_cached(dir.path(), model, model.size - 1);
        let err = resolve_in(dir.path(), model.name).unwrap_err();
        match &err {
            ModelsError::WrongSize {
                found, expected, ..
            } => {
                assert_eq!(*found, model.size - 1);
                assert_eq!(*expected, model.size);
            }
            other => panic!("expected WrongSize, got {other:?}"),
        }
        assert!(
            err.to_string()
                .contains("cargo xtask fetch-models smollm2-135m")
        );
    }

    #[test]
    fn unknown_name_lists_the_reference_models() {
        let dir = tempfile::tempdir().unwrap();
        let err = resolve_in(dir.path(), "llama-70b").unwrap_err();
        assert!(matches!(err, ModelsError::Unknown { .. }), "{err:?}");
        let msg = err.to_string();
        assert!(msg.contains("`llama-70b`"), "{msg}");
        for model in REFERENCE_MODELS {
            assert!(msg.contains(model.name), "{msg}");
        }
    }

    #[test]
    fn models_dir_prefers_the_environment_then_the_user_cache() {
        let user = Some(PathBuf::from("/home/u/.cache"));
        assert_eq!(
            models_dir_from(Some("/data/models".into()), user.clone()).unwrap(),
            PathBuf::from("/data/models")
        );
        assert_eq!(
            models_dir_from(Some(OsString::new()), user.clone()).unwrap(),
            PathBuf::from("/home/u/.cache/spec-decode/models")
        );
        assert_eq!(
            models_dir_from(None, user).unwrap(),
            PathBuf::from("/home/u/.cache/spec-decode/models")
        );
        assert!(matches!(
            models_dir_from(None, None),
            Err(ModelsError::NoCacheDir)
        ));
    }
}
