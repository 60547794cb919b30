//! Checkpoints: the weights, the optimizer's state and where the run stands, written so that a
//! killed run always leaves a whole checkpoint behind.
//!
//! A checkpoint directory holds one subdirectory per checkpoint, `step-00000100/` after 100
//! steps, each with
//! - `model.safetensors`: the parameters by module path (burn-store's safetensors store), readable
//!   by any tool that reads safetensors;
//! - `optimizer.mpk`: AdamW's moments, with burn's named MessagePack recorder at full precision
//!   (the values round-trip bit for bit);
//! - `checkpoint.json`: [`CheckpointMeta`], including the SHA-256 of both files.
//!
//! A checkpoint is written into `.step-00000100.tmp/` and renamed into place only when complete;
//! older checkpoints are removed after that rename. The latest checkpoint is the complete
//! subdirectory with the highest step.

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};

use burn::module::{AutodiffModule, Module, ParamId};
use burn::optim::adaptor::OptimizerAdaptor;
use burn::optim::{AdamW, Optimizer};
use burn::record::{FullPrecisionSettings, NamedMpkFileRecorder, Recorder};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn_store::{ModuleSnapshot, SafetensorsStore};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::error::TrainError;
use crate::metrics::Evaluation;
use crate::settings::TrainSettings;

/// The version of the layout and of `checkpoint.json` this build writes and reads.
pub const CHECKPOINT_FORMAT: u32 = 1;

/// The weights' file in a checkpoint.
pub const MODEL_FILE: &str = "model.safetensors";
/// The optimizer state's file in a checkpoint.
pub const OPTIMIZER_FILE: &str = "optimizer.mpk";
/// The description of a checkpoint.
pub const META_FILE: &str = "checkpoint.json";

const STEP_PREFIX: &str = "step-";

/// The optimizer the trainer uses, as burn builds it.
pub type AdamWOptimizer<B, M> = OptimizerAdaptor<AdamW, M, B>;

/// `checkpoint.json`: where the run stands and what it trains.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CheckpointMeta {
    /// [`CHECKPOINT_FORMAT`] when written.
    pub format: u32,
    /// Steps done.
    pub step: usize,
    /// The run's settings.
    pub settings: TrainSettings,
    /// The task's identity (target model, method, method settings).
    pub identity: serde_json::Value,
    /// The training loss of each step done.
    #[serde(with = "exact_floats::losses")]
    pub losses: Vec<f64>,
    /// Held-out evaluations so far, after the number of steps given.
    #[serde(with = "exact_floats::evaluations")]
    pub evaluations: Vec<(usize, Evaluation)>,
    /// Each parameter's module path and its id when saved: the optimizer's state is keyed by
    /// id, and a fresh model has fresh ids.
    pub param_ids: BTreeMap<String, u64>,
    /// SHA-256 (hex) of each file beside this one.
    pub sha256: BTreeMap<String, String>,
}

/// The checkpoint with the most steps in `dir`, if any (a missing `dir` holds none).
pub fn latest_checkpoint(dir: &Path) -> Result<Option<PathBuf>, TrainError> {
    Ok(checkpoints(dir)?
        .into_iter()
        .max_by_key(|&(step, _)| step)
        .map(|(_, path)| path))
}

/// Reads and checks `checkpoint.json` of the checkpoint in `checkpoint`.
pub fn read_meta(checkpoint: &Path) -> Result<CheckpointMeta, TrainError> {
    let path = checkpoint.join(META_FILE);
    let bytes = fs::read(&path).map_err(|e| TrainError::io(&path, e))?;
    let meta: CheckpointMeta =
        serde_json::from_slice(&bytes).map_err(|e| TrainError::corrupt(&path, e))?;
    if meta.format != CHECKPOINT_FORMAT {
        return Err(TrainError::corrupt(
            &path,
            format!(
                "format {} (this build reads format {CHECKPOINT_FORMAT})",
                meta.format
            ),
        ));
    }
    if meta.losses.len() != meta.step {
        return Err(TrainError::corrupt(
            &path,
            format!("{} losses for {} steps", meta.losses.len(), meta.step),
        ));
    }
    Ok(meta)
}

/// Loads the weights of the checkpoint in `checkpoint` into `model` (any backend, with or
/// without autodiff: the module paths must match) and returns its description.
pub fn load_model<B: Backend, M: Module<B>>(
    checkpoint: &Path,
    model: &mut M,
) -> Result<CheckpointMeta, TrainError> {
    let meta = read_meta(checkpoint)?;
    load_weights(checkpoint, &meta, model)?;
    Ok(meta)
}

fn load_weights<B: Backend, M: Module<B>>(
    checkpoint: &Path,
    meta: &CheckpointMeta,
    model: &mut M,
) -> Result<(), TrainError> {
    let path = checked_file(checkpoint, meta, MODEL_FILE)?;
    let mut store = SafetensorsStore::from_file(&path);
    model
        .load_from(&mut store)
        .map_err(|e| TrainError::corrupt(&path, e))?;
    Ok(())
}

/// Restores the trainer's model and optimizer from the checkpoint in `checkpoint`, whose
/// description `meta` the caller has read and checked.
pub(crate) fn load_training_state<B, M>(
    checkpoint: &Path,
    meta: &CheckpointMeta,
    mut model: M,
    optimizer: AdamWOptimizer<B, M>,
    device: &B::Device,
) -> Result<(M, AdamWOptimizer<B, M>), TrainError>
where
    B: AutodiffBackend,
    M: AutodiffModule<B>,
{
    load_weights(checkpoint, meta, &mut model)?;
    let path = checked_file(checkpoint, meta, OPTIMIZER_FILE)?;
    let saved: <AdamWOptimizer<B, M> as Optimizer<M, B>>::Record =
        NamedMpkFileRecorder::<FullPrecisionSettings>::new()
            .load(path.clone(), device)
            .map_err(|e| TrainError::corrupt(&path, e))?;
    // Re-key the state from the saved parameters' ids to this model's, by module path.
    let path_of_saved: BTreeMap<u64, &str> = meta
        .param_ids
        .iter()
        .map(|(name, &id)| (id, name.as_str()))
        .collect();
    let current = param_ids(&model);
    let mut state: <AdamWOptimizer<B, M> as Optimizer<M, B>>::Record = Default::default();
    for (saved_id, record) in saved {
        let name = path_of_saved.get(&saved_id.val()).ok_or_else(|| {
            TrainError::corrupt(
                &path,
                format!("optimizer state for unknown parameter id {saved_id}"),
            )
        })?;
        let id = current
            .get(*name)
            .ok_or_else(|| TrainError::CheckpointMismatch {
                path: checkpoint.to_path_buf(),
                difference: format!("the model has no parameter `{name}`"),
            })?;
        state.insert(ParamId::from(*id), record);
    }
    Ok((model, optimizer.load_record(state)))
}

/// Writes a checkpoint of `model` and `optimizer` into `dir` as `step-<meta.step>/`, then
/// removes the older checkpoints there. `meta.param_ids` and `meta.sha256` are filled in here.
pub(crate) fn save_checkpoint<B, M>(
    dir: &Path,
    mut meta: CheckpointMeta,
    model: &M,
    optimizer: &AdamWOptimizer<B, M>,
) -> Result<PathBuf, TrainError>
where
    B: AutodiffBackend,
    M: AutodiffModule<B>,
{
    fs::create_dir_all(dir).map_err(|e| TrainError::io(dir, e))?;
    let name = format!("{STEP_PREFIX}{:08}", meta.step);
    let staging = dir.join(format!(".{name}.tmp"));
    if staging.exists() {
        fs::remove_dir_all(&staging).map_err(|e| TrainError::io(&staging, e))?;
    }
    fs::create_dir(&staging).map_err(|e| TrainError::io(&staging, e))?;

    let model_path = staging.join(MODEL_FILE);
    let mut store = SafetensorsStore::from_file(&model_path);
    model
        .save_into(&mut store)
        .map_err(|e| TrainError::io(&model_path, std::io::Error::other(e.to_string())))?;

    let optimizer_path = staging.join(OPTIMIZER_FILE);
    NamedMpkFileRecorder::<FullPrecisionSettings>::new()
        .record(optimizer.to_record(), optimizer_path.clone())
        .map_err(|e| TrainError::io(&optimizer_path, std::io::Error::other(e.to_string())))?;

    meta.format = CHECKPOINT_FORMAT;
    meta.param_ids = param_ids(model)
        .into_iter()
        .collect::<BTreeMap<String, u64>>();
    meta.sha256 = BTreeMap::new();
    for file in [MODEL_FILE, OPTIMIZER_FILE] {
        let path = staging.join(file);
        sync_file(&path)?;
        meta.sha256.insert(file.to_string(), sha256_hex(&path)?);
    }
    let meta_path = staging.join(META_FILE);
    let json = serde_json::to_vec_pretty(&meta)
        .map_err(|e| TrainError::io(&meta_path, std::io::Error::other(e)))?;
    let mut file = File::create(&meta_path).map_err(|e| TrainError::io(&meta_path, e))?;
    file.write_all(&json)
        .and_then(|()| file.sync_all())
        .map_err(|e| TrainError::io(&meta_path, e))?;
    sync_dir(&staging)?;

    let target = dir.join(&name);
    if target.exists() {
        // The same step written again: set the old copy aside until the new one is in place.
        let aside = dir.join(format!(".{name}.old"));
        if aside.exists() {
            fs::remove_dir_all(&aside).map_err(|e| TrainError::io(&aside, e))?;
        }
        fs::rename(&target, &aside).map_err(|e| TrainError::io(&target, e))?;
        fs::rename(&staging, &target).map_err(|e| TrainError::io(&target, e))?;
        fs::remove_dir_all(&aside).map_err(|e| TrainError::io(&aside, e))?;
    } else {
        fs::rename(&staging, &target).map_err(|e| TrainError::io(&target, e))?;
    }
    sync_dir(dir)?;

    for (step, path) in checkpoints(dir)? {
        if step < meta.step {
            fs::remove_dir_all(&path).map_err(|e| TrainError::io(&path, e))?;
        }
    }
    Ok(target)
}

/// `checkpoint.json` keeps losses and metrics as strings in Rust's shortest round-trip form:
/// serde_json's default number parser may land one ulp off, and a resumed run's report must
/// hold the values the uninterrupted run computed. NaN and infinities survive too.
mod exact_floats {
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    use crate::metrics::Evaluation;

    fn text(value: f64) -> String {
        format!("{value:?}")
    }

    fn parse<E: serde::de::Error>(text: &str) -> Result<f64, E> {
        text.parse::<f64>()
            .map_err(|e| E::custom(format!("`{text}` is no number: {e}")))
    }

    pub(super) mod losses {
        use super::*;

        pub(crate) fn serialize<S: Serializer>(values: &[f64], s: S) -> Result<S::Ok, S::Error> {
            s.collect_seq(values.iter().map(|&v| text(v)))
        }

        pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<f64>, D::Error> {
            Vec::<String>::deserialize(d)?
                .iter()
                .map(|t| parse(t))
                .collect()
        }
    }

    #[derive(Serialize, Deserialize)]
    struct StoredEvaluation {
        loss: String,
        metrics: Vec<(String, String)>,
    }

    pub(super) mod evaluations {
        use super::*;

        pub(crate) fn serialize<S: Serializer>(
            values: &[(usize, Evaluation)],
            s: S,
        ) -> Result<S::Ok, S::Error> {
            s.collect_seq(values.iter().map(|(done, e)| {
                let stored = StoredEvaluation {
                    loss: text(e.loss),
                    metrics: e
                        .metrics
                        .iter()
                        .map(|(name, v)| (name.clone(), text(*v)))
                        .collect(),
                };
                (*done, stored)
            }))
        }

        pub(crate) fn deserialize<'de, D: Deserializer<'de>>(
            d: D,
        ) -> Result<Vec<(usize, Evaluation)>, D::Error> {
            Vec::<(usize, StoredEvaluation)>::deserialize(d)?
                .into_iter()
                .map(|(done, stored)| {
                    let metrics = stored
                        .metrics
                        .iter()
                        .map(|(name, v)| Ok((name.clone(), parse::<D::Error>(v)?)))
                        .collect::<Result<_, D::Error>>()?;
                    Ok((
                        done,
                        Evaluation {
                            loss: parse::<D::Error>(&stored.loss)?,
                            metrics,
                        },
                    ))
                })
                .collect()
        }
    }
}

/// The complete checkpoints in `dir` with their steps.
fn checkpoints(dir: &Path) -> Result<Vec<(usize, PathBuf)>, TrainError> {
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(TrainError::io(dir, e)),
    };
    let mut found = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| TrainError::io(dir, e))?;
        let name = entry.file_name();
        let Some(step) = name
            .to_str()
            .and_then(|n| n.strip_prefix(STEP_PREFIX))
            .and_then(|n| n.parse::<usize>().ok())
        else {
            continue;
        };
        if entry.path().is_dir() {
            found.push((step, entry.path()));
        }
    }
    Ok(found)
}

/// Each parameter's module path and current id.
fn param_ids<B: Backend, M: Module<B>>(model: &M) -> BTreeMap<String, u64> {
    model
        .collect(None, None, false)
        .into_iter()
        .filter_map(|snapshot| Some((snapshot.full_path(), snapshot.tensor_id?.val())))
        .collect()
}

/// `file` in `checkpoint`, after checking it against the SHA-256 in `meta`.
fn checked_file(
    checkpoint: &Path,
    meta: &CheckpointMeta,
    file: &str,
) -> Result<PathBuf, TrainError> {
    let path = checkpoint.join(file);
    let expected = meta.sha256.get(file).ok_or_else(|| {
        TrainError::corrupt(
            &checkpoint.join(META_FILE),
            format!("no checksum for {file}"),
        )
    })?;
    let actual = sha256_hex(&path)?;
    if &actual != expected {
        return Err(TrainError::corrupt(
            &path,
            format!(
                "SHA-256 {actual} differs from {expected} in {META_FILE} (truncated or altered)"
            ),
        ));
    }
    Ok(path)
}

fn sha256_hex(path: &Path) -> Result<String, TrainError> {
    let mut file = File::open(path).map_err(|e| TrainError::io(path, e))?;
    let mut hasher = Sha256::new();
    std::io::copy(&mut file, &mut hasher).map_err(|e| TrainError::io(path, e))?;
    Ok(hasher
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect())
}

fn sync_file(path: &Path) -> Result<(), TrainError> {
    File::open(path)
        .and_then(|f| f.sync_all())
        .map_err(|e| TrainError::io(path, e))
}

/// Makes a rename inside `dir` durable; some platforms cannot open a directory, which is fine.
fn sync_dir(dir: &Path) -> Result<(), TrainError> {
    if let Ok(handle) = File::open(dir) {
        handle.sync_all().map_err(|e| TrainError::io(dir, e))?;
    }
    Ok(())
}

/// Refuses a checkpoint written for another task identity or another trajectory.
pub(crate) fn check_same_run(
    checkpoint: &Path,
    meta: &CheckpointMeta,
    settings: &TrainSettings,
    identity: &serde_json::Value,
) -> Result<(), TrainError> {
    let mismatch = |difference: String| TrainError::CheckpointMismatch {
        path: checkpoint.to_path_buf(),
        difference,
    };
    if let Some(difference) = json_difference(&meta.identity, identity, String::new()) {
        return Err(mismatch(format!("identity {difference}")));
    }
    if let Some(difference) = meta.settings.trajectory_difference(settings) {
        return Err(mismatch(format!("setting {difference}")));
    }
    Ok(())
}

/// The first place where `saved` and `current` differ, as `path: saved vs current`.
fn json_difference(
    saved: &serde_json::Value,
    current: &serde_json::Value,
    path: String,
) -> Option<String> {
    use serde_json::Value;
    let here = || {
        if path.is_empty() {
            "/".to_string()
        } else {
            path.clone()
        }
    };
    match (saved, current) {
        (Value::Object(a), Value::Object(b)) => {
            let keys: std::collections::BTreeSet<&String> = a.keys().chain(b.keys()).collect();
            keys.into_iter().find_map(|key| {
                let sub = format!("{path}/{key}");
                match (a.get(key), b.get(key)) {
                    (Some(x), Some(y)) => json_difference(x, y, sub),
                    (Some(x), None) => Some(format!("{sub}: {x} vs absent")),
                    (None, Some(y)) => Some(format!("{sub}: absent vs {y}")),
                    (None, None) => None,
                }
            })
        }
        (Value::Array(a), Value::Array(b)) if a.len() == b.len() => a
            .iter()
            .zip(b)
            .enumerate()
            .find_map(|(i, (x, y))| json_difference(x, y, format!("{path}/{i}"))),
        _ if saved == current => None,
        _ => Some(format!("{}: {saved} vs {current}", here())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn json_difference_names_the_first_differing_path() {
        let a = json!({"target": {"sha256": "ab", "layers": 28}, "heads": 4});
        let b = json!({"target": {"sha256": "cd", "layers": 28}, "heads": 4});
        assert_eq!(
            json_difference(&a, &b, String::new()).as_deref(),
            Some("/target/sha256: \"ab\" vs \"cd\"")
        );
        assert_eq!(json_difference(&a, &a, String::new()), None);
        let c = json!({"heads": 4});
        assert_eq!(
            json_difference(&c, &json!({"heads": 4, "x": [1]}), String::new()).as_deref(),
            Some("/x: absent vs [1]")
        );
        assert_eq!(
            json_difference(&json!(1), &json!(2), String::new()).as_deref(),
            Some("/: 1 vs 2")
        );
    }

    #[test]
    fn floats_survive_checkpoint_json_bit_for_bit() {
        // Values of f32 losses widened to f64 need 17 digits, where a fast parser may slip.
        let losses: Vec<f64> = (1..2000)
            .map(|i| f64::from((i as f32).ln() / 7.0 + 0.1))
            .chain([f64::NAN, f64::INFINITY, 1e-300, -0.0])
            .collect();
        let meta = CheckpointMeta {
            format: CHECKPOINT_FORMAT,
            step: losses.len(),
            settings: TrainSettings::default(),
            identity: json!({}),
            losses: losses.clone(),
            evaluations: vec![(
                3,
                Evaluation {
                    loss: 0.1 + 0.2,
                    metrics: vec![("top1".into(), 2.0 / 3.0)],
                },
            )],
            param_ids: BTreeMap::new(),
            sha256: BTreeMap::new(),
        };
        let text = serde_json::to_string(&meta).unwrap_or_default();
        let back: CheckpointMeta = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}"));
        let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&back.losses), bits(&losses));
        assert_eq!(back.evaluations, meta.evaluations);
    }

    #[test]
    fn a_missing_directory_holds_no_checkpoint() {
        let dir = std::env::temp_dir().join("spec-train-no-such-dir-for-checkpoints");
        assert!(matches!(latest_checkpoint(&dir), Ok(None)));
    }
}
