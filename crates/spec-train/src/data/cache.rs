//! Distilled sequences on disk, so that a second training run does not generate them again.
//!
//! One folder per [`CacheKey`] (model, prompt source, settings) under a root, named by a hash
//! of the key, holding `manifest.json` and shards `shard-NNNNN.safetensors`. A shard holds a
//! few sequences: `tokens` (u32, all sequences end to end), `token_offsets` (u64, `n + 1`),
//! `answer_starts` (u64, `n`) and `hidden` (f16 `[answer tokens, hidden]`: half the size of
//! f32, and the heads train in f32 from it). The manifest lists each shard's file, its size,
//! and the hash of each sequence's prompt text: entries are found by prompt, so a larger limit
//! or another split reuses every answer already made.
//!
//! A shard is written to a temporary name and renamed, then the manifest likewise: an
//! interrupted run keeps every shard the manifest names, and a rerun makes only the rest. One
//! process writes a folder at a time.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use half::f16;
use safetensors::{Dtype, SafeTensors, tensor::TensorView};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use burn::tensor::backend::Backend;
use spec_runtime::Transformer;

use super::distill::{DistillSettings, hidden_size};
use super::prompts::text_hash;
use super::set::DistilledSequence;
use super::{DataError, Result};

/// What a cache folder's answers depend on.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CacheKey {
    /// The target's identity ([`model_identity`]): its weights, tokenizer and chat template.
    pub model: String,
    /// The prompt source's label ([`super::PromptSource::label`]).
    pub source: String,
    pub settings: DistillSettings,
}

impl CacheKey {
    /// The folder name: the first 16 hex digits of the sha256 of the key as JSON.
    fn folder_name(&self) -> Result<String> {
        let json = serde_json::to_vec(self)
            .map_err(|e| DataError::Settings(format!("the cache key as JSON: {e}")))?;
        Ok(hex(&Sha256::digest(&json)[..8]))
    }
}

/// A stable identity of the model at `path`: `sha256:<hex>` of the file, or for a folder (a
/// Hugging Face checkpoint) of the names and hashes of its files. Hashing reads the whole
/// model, a small part of any distillation: 1.0-1.7 s for Qwen2.5-Coder-1.5B's 1.07 GB file in
/// release on a 2-core machine (`tests/smollm2_distill.rs` prints it).
pub fn model_identity(path: &Path) -> Result<String> {
    if !path.is_dir() {
        return Ok(format!("sha256:{}", spec_models::sha256_file(path)?));
    }
    let mut files: Vec<PathBuf> = std::fs::read_dir(path)
        .map_err(DataError::io("listing", path))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    let mut hasher = Sha256::new();
    for file in files {
        let name = file.file_name().map(|n| n.to_string_lossy().into_owned());
        hasher.update(name.unwrap_or_default().as_bytes());
        hasher.update([0]);
        hasher.update(spec_models::sha256_file(&file)?.as_bytes());
        hasher.update([b'\n']);
    }
    Ok(format!("sha256-dir:{}", hex(&hasher.finalize())))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The hash a cached sequence is found by.
fn prompt_key(text: &str) -> String {
    hex(&text_hash("spec-train cache entry", text))
}

const MANIFEST: &str = "manifest.json";
const FORMAT: u32 = 1;

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Manifest {
    format: u32,
    key: CacheKey,
    hidden_size: usize,
    vocab_size: usize,
    shards: Vec<ShardEntry>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct ShardEntry {
    file: String,
    bytes: u64,
    /// [`prompt_key`] of each sequence, in the shard's order.
    prompts: Vec<String>,
}

/// An open cache folder: what it holds, and the sequences not yet written.
#[derive(Debug)]
pub struct DistillCache {
    dir: PathBuf,
    manifest: Manifest,
    /// Prompt key → (shard, position in it).
    index: HashMap<String, (usize, usize)>,
    pending: Vec<(String, DistilledSequence)>,
    shard_sequences: usize,
}

impl DistillCache {
    /// Sequences a shard holds by default: what an interruption can lose at most.
    pub const SHARD_SEQUENCES: usize = 16;

    /// Opens (or creates) the folder of `key` under `root` for a target of `hidden_size` and
    /// `vocab_size`.
    ///
    /// # Errors
    /// An unreadable or foreign manifest, a shard missing or of the wrong size, or a manifest
    /// made for another key or shape: each names the folder, to delete to distill again.
    pub fn open(root: &Path, key: CacheKey, hidden_size: usize, vocab_size: usize) -> Result<Self> {
        let dir = root.join(key.folder_name()?);
        std::fs::create_dir_all(&dir).map_err(DataError::io("creating", &dir))?;
        let fail = |message: String| DataError::Cache {
            dir: dir.clone(),
            message: format!("{message}; delete the folder to distill again"),
        };
        let manifest_path = dir.join(MANIFEST);
        let manifest = if manifest_path.exists() {
            let text = std::fs::read_to_string(&manifest_path)
                .map_err(DataError::io("reading", &manifest_path))?;
            let manifest: Manifest = serde_json::from_str(&text)
                .map_err(|e| fail(format!("{MANIFEST} is unreadable ({e})")))?;
            if manifest.format != FORMAT {
                return Err(fail(format!(
                    "{MANIFEST} is format {}, this build reads {FORMAT}",
                    manifest.format
                )));
            }
            if manifest.key != key {
                return Err(fail(format!(
                    "{MANIFEST} was made for {:?}, not {key:?}",
                    manifest.key
                )));
            }
            if (manifest.hidden_size, manifest.vocab_size) != (hidden_size, vocab_size) {
                return Err(fail(format!(
                    "made for hidden size {} and vocabulary {}, the target has {hidden_size} and \
                     {vocab_size}",
                    manifest.hidden_size, manifest.vocab_size
                )));
            }
            for shard in &manifest.shards {
                let path = dir.join(&shard.file);
                let found = std::fs::metadata(&path)
                    .map_err(|e| fail(format!("shard {} is missing ({e})", shard.file)))?
                    .len();
                if found != shard.bytes {
                    return Err(fail(format!(
                        "shard {} is {found} bytes, the manifest says {}: it is damaged",
                        shard.file, shard.bytes
                    )));
                }
            }
            manifest
        } else {
            Manifest {
                format: FORMAT,
                key,
                hidden_size,
                vocab_size,
                shards: Vec::new(),
            }
        };
        let mut index = HashMap::new();
        for (s, shard) in manifest.shards.iter().enumerate() {
            for (i, prompt) in shard.prompts.iter().enumerate() {
                index.entry(prompt.clone()).or_insert((s, i));
            }
        }
        Ok(Self {
            dir,
            manifest,
            index,
            pending: Vec::new(),
            shard_sequences: Self::SHARD_SEQUENCES,
        })
    }

    /// [`DistillCache::open`] for `target`'s hidden size and vocabulary.
    pub fn open_for<B: Backend>(
        root: &Path,
        key: CacheKey,
        target: &Transformer<B>,
    ) -> Result<Self> {
        Self::open(root, key, hidden_size(target), target.vocab_size)
    }

    /// The cache with shards of `n` sequences (at least 1).
    pub fn with_shard_sequences(mut self, n: usize) -> Self {
        self.shard_sequences = n.max(1);
        self
    }

    /// The key's folder.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn key(&self) -> &CacheKey {
        &self.manifest.key
    }

    /// Sequences written to disk.
    pub fn len(&self) -> usize {
        self.index.len()
    }

    pub fn is_empty(&self) -> bool {
        self.index.is_empty()
    }

    /// Whether the answer to `prompt_text` is on disk.
    pub fn contains(&self, prompt_text: &str) -> bool {
        self.index.contains_key(&prompt_key(prompt_text))
    }

    /// Adds the answer to `prompt_text`; a shard is written once enough have gathered.
    ///
    /// # Errors
    /// A sequence whose hidden rows do not match its answer, or a failed write.
    pub fn push(&mut self, prompt_text: &str, sequence: DistilledSequence) -> Result<()> {
        let rows = sequence.tokens.len().saturating_sub(sequence.answer_start);
        if sequence.answer_start > sequence.tokens.len()
            || sequence.hidden.len() != rows * self.manifest.hidden_size
        {
            return Err(DataError::Settings(format!(
                "a sequence of {} tokens from {} with {} hidden values does not fit hidden size {}",
                sequence.tokens.len(),
                sequence.answer_start,
                sequence.hidden.len(),
                self.manifest.hidden_size
            )));
        }
        self.pending.push((prompt_key(prompt_text), sequence));
        if self.pending.len() >= self.shard_sequences {
            self.flush()?;
        }
        Ok(())
    }

    /// Writes the sequences gathered so far as a shard, then the manifest.
    pub fn flush(&mut self) -> Result<()> {
        if self.pending.is_empty() {
            return Ok(());
        }
        let pending = std::mem::take(&mut self.pending);
        let number = self.manifest.shards.len();
        let file = format!("shard-{number:05}.safetensors");
        let bytes = encode_shard(
            pending.iter().map(|(_, s)| s),
            self.manifest.hidden_size,
            &self.dir.join(&file),
        )?;
        let path = self.dir.join(&file);
        write_atomically(&path, &bytes)?;
        let prompts: Vec<String> = pending.into_iter().map(|(key, _)| key).collect();
        for (i, prompt) in prompts.iter().enumerate() {
            self.index.entry(prompt.clone()).or_insert((number, i));
        }
        self.manifest.shards.push(ShardEntry {
            file,
            bytes: bytes.len() as u64,
            prompts,
        });
        let json = serde_json::to_vec_pretty(&self.manifest)
            .map_err(|e| DataError::Settings(format!("the manifest as JSON: {e}")))?;
        write_atomically(&self.dir.join(MANIFEST), &json)
    }

    /// The cached answers to `prompt_texts`, in order (`None` where there is none), after
    /// writing what is pending. Each shard is read once; the sequences come back not held out.
    ///
    /// # Errors
    /// A shard that cannot be read or is not a well-formed shard of this cache.
    pub fn load(&mut self, prompt_texts: &[&str]) -> Result<Vec<Option<DistilledSequence>>> {
        self.flush()?;
        let mut wanted: HashMap<usize, Vec<(usize, usize)>> = HashMap::new();
        for (i, text) in prompt_texts.iter().enumerate() {
            if let Some(&(shard, position)) = self.index.get(&prompt_key(text)) {
                wanted.entry(shard).or_default().push((i, position));
            }
        }
        let mut out: Vec<Option<DistilledSequence>> = vec![None; prompt_texts.len()];
        let mut shards: Vec<_> = wanted.into_iter().collect();
        shards.sort_by_key(|(s, _)| *s);
        for (shard, picks) in shards {
            let entry = &self.manifest.shards[shard];
            let path = self.dir.join(&entry.file);
            let bytes = std::fs::read(&path).map_err(DataError::io("reading", &path))?;
            let mut sequences =
                decode_shard(&bytes, self.manifest.hidden_size, entry.prompts.len()).map_err(
                    |message| {
                        DataError::format(
                            &path,
                            format!(
                                "not a readable shard ({message}); delete {} to distill again",
                                self.dir.display()
                            ),
                        )
                    },
                )?;
            for (i, position) in picks {
                out[i] = Some(std::mem::take(&mut sequences[position]));
            }
        }
        Ok(out)
    }
}

fn write_atomically(path: &Path, bytes: &[u8]) -> Result<()> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    std::fs::write(&tmp, bytes).map_err(DataError::io("writing", &tmp))?;
    std::fs::rename(&tmp, path).map_err(DataError::io("renaming into place", path))
}

fn encode_shard<'a>(
    sequences: impl Iterator<Item = &'a DistilledSequence>,
    hidden_size: usize,
    path: &Path,
) -> Result<Vec<u8>> {
    let (mut tokens, mut offsets, mut starts, mut hidden) =
        (Vec::new(), vec![0u8; 8], Vec::new(), Vec::new());
    let (mut token_count, mut rows, mut count) = (0usize, 0usize, 0usize);
    for s in sequences {
        tokens.extend(s.tokens.iter().flat_map(|t| t.to_le_bytes()));
        token_count += s.tokens.len();
        offsets.extend((token_count as u64).to_le_bytes());
        starts.extend((s.answer_start as u64).to_le_bytes());
        hidden.extend(
            s.hidden
                .iter()
                .flat_map(|&v| f16::from_f32(v).to_le_bytes()),
        );
        rows += s.tokens.len() - s.answer_start;
        count += 1;
    }
    let fail = |e: safetensors::SafeTensorError| DataError::format(path, format!("{e}"));
    let views = [
        (
            "tokens",
            TensorView::new(Dtype::U32, vec![token_count], &tokens).map_err(fail)?,
        ),
        (
            "token_offsets",
            TensorView::new(Dtype::U64, vec![count + 1], &offsets).map_err(fail)?,
        ),
        (
            "answer_starts",
            TensorView::new(Dtype::U64, vec![count], &starts).map_err(fail)?,
        ),
        (
            "hidden",
            TensorView::new(Dtype::F16, vec![rows, hidden_size], &hidden).map_err(fail)?,
        ),
    ];
    safetensors::serialize(views, None).map_err(fail)
}

/// A tensor of `name` with `dtype` and one of its dimensions per entry of `shape` that is
/// `Some`; its bytes.
fn tensor<'a>(
    tensors: &SafeTensors<'a>,
    name: &str,
    dtype: Dtype,
    shape: &[Option<usize>],
) -> Result<(Vec<usize>, &'a [u8]), String> {
    let view = tensors.tensor(name).map_err(|e| format!("`{name}`: {e}"))?;
    let fits = view.shape().len() == shape.len()
        && view
            .shape()
            .iter()
            .zip(shape)
            .all(|(&d, want)| want.is_none_or(|w| w == d));
    if view.dtype() != dtype || !fits {
        return Err(format!(
            "`{name}` is {:?} {:?}, expected {dtype:?} {shape:?}",
            view.dtype(),
            view.shape()
        ));
    }
    Ok((view.shape().to_vec(), view.data()))
}

fn u64s(bytes: &[u8]) -> Vec<usize> {
    bytes
        .chunks_exact(8)
        .map(|c| {
            let mut b = [0u8; 8];
            b.copy_from_slice(c);
            u64::from_le_bytes(b) as usize
        })
        .collect()
}

fn decode_shard(
    bytes: &[u8],
    hidden_size: usize,
    count: usize,
) -> Result<Vec<DistilledSequence>, String> {
    let tensors = SafeTensors::deserialize(bytes).map_err(|e| e.to_string())?;
    let (_, tokens) = tensor(&tensors, "tokens", Dtype::U32, &[None])?;
    let tokens: Vec<u32> = tokens
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    let offsets = u64s(tensor(&tensors, "token_offsets", Dtype::U64, &[Some(count + 1)])?.1);
    let starts = u64s(tensor(&tensors, "answer_starts", Dtype::U64, &[Some(count)])?.1);
    let (shape, hidden) = tensor(&tensors, "hidden", Dtype::F16, &[None, Some(hidden_size)])?;
    let hidden: Vec<f32> = hidden
        .chunks_exact(2)
        .map(|c| f16::from_le_bytes([c[0], c[1]]).to_f32())
        .collect();
    if offsets.first() != Some(&0) || offsets.last() != Some(&tokens.len()) {
        return Err("token offsets do not cover the tokens".into());
    }
    let mut sequences = Vec::with_capacity(count);
    let mut row = 0;
    for i in 0..count {
        let (from, to) = (offsets[i], offsets[i + 1]);
        if to < from || starts[i] > to - from {
            return Err(format!("sequence {i} has bad offsets"));
        }
        let rows = to - from - starts[i];
        let values = hidden
            .get(row * hidden_size..(row + rows) * hidden_size)
            .ok_or_else(|| format!("sequence {i} runs past the hidden rows"))?;
        sequences.push(DistilledSequence {
            tokens: tokens[from..to].to_vec(),
            answer_start: starts[i],
            hidden: values.to_vec(),
            held_out: false,
        });
        row += rows;
    }
    if row != shape[0] {
        return Err(format!("{} hidden rows for {row} answer tokens", shape[0]));
    }
    Ok(sequences)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::data::AnswerSource;

    const HIDDEN: usize = 3;

    fn key() -> CacheKey {
        CacheKey {
            model: "sha256:00".into(),
            source: "file:test".into(),
            settings: DistillSettings::default(),
        }
    }

    fn sequence(seed: u32, prompt: usize, answer: usize) -> DistilledSequence {
        DistilledSequence {
            tokens: (0..(prompt + answer) as u32)
                .map(|t| t * 7 + seed)
                .collect(),
            answer_start: prompt,
            hidden: (0..answer * HIDDEN)
                .map(|v| (v as f32 + seed as f32) * 0.25 - 1.0)
                .collect(),
            held_out: false,
        }
    }

    #[test]
    fn a_reopened_cache_gives_back_what_was_written() {
        let root = tempfile::tempdir().unwrap();
        let texts = ["a", "b", "c", "d", "e"];
        let made: Vec<_> = (0..5)
            .map(|i| sequence(i as u32, 2 + i, i * 3 % 4))
            .collect();
        {
            let mut cache = DistillCache::open(root.path(), key(), HIDDEN, 50)
                .unwrap()
                .with_shard_sequences(2);
            for (text, s) in texts.iter().zip(&made).take(3) {
                cache.push(text, s.clone()).unwrap();
            }
            // Two in a shard on disk, one pending: an interruption here keeps the two.
            assert_eq!(cache.len(), 2);
        }
        let mut cache = DistillCache::open(root.path(), key(), HIDDEN, 50).unwrap();
        assert_eq!(cache.len(), 2);
        assert!(cache.contains("b") && !cache.contains("c"));
        for (text, s) in texts.iter().zip(&made).skip(2) {
            cache.push(text, s.clone()).unwrap();
        }
        cache.flush().unwrap();
        let mut reopened = DistillCache::open(root.path(), key(), HIDDEN, 50).unwrap();
        let loaded = reopened.load(&["e", "zz", "a", "c"]).unwrap();
        // The values are multiples of 1/4 below 2048: f16 holds them exactly.
        assert_eq!(loaded[0].as_ref(), Some(&made[4]));
        assert_eq!(loaded[1], None);
        assert_eq!(loaded[2].as_ref(), Some(&made[0]));
        assert_eq!(loaded[3].as_ref(), Some(&made[2]));
    }

    #[test]
    fn another_key_is_another_folder_and_a_wrong_shape_is_refused() {
        let root = tempfile::tempdir().unwrap();
        let mut cache = DistillCache::open(root.path(), key(), HIDDEN, 50).unwrap();
        cache.push("a", sequence(1, 2, 2)).unwrap();
        cache.flush().unwrap();
        let mut other = key();
        other.settings.max_new_tokens += 1;
        let fresh = DistillCache::open(root.path(), other, HIDDEN, 50).unwrap();
        assert!(fresh.is_empty());
        assert_ne!(fresh.dir(), cache.dir());
        let err = DistillCache::open(root.path(), key(), HIDDEN + 1, 50)
            .unwrap_err()
            .to_string();
        assert!(err.contains("hidden size"), "{err}");
        let bad = cache.push("b", sequence(1, 2, 2).clone_with_hidden(vec![0.0]));
        assert!(bad.is_err());
    }

    #[test]
    fn a_truncated_shard_or_manifest_is_a_clear_error() {
        let root = tempfile::tempdir().unwrap();
        let mut cache = DistillCache::open(root.path(), key(), HIDDEN, 50).unwrap();
        cache.push("a", sequence(1, 4, 5)).unwrap();
        cache.flush().unwrap();
        let shard = cache.dir().join("shard-00000.safetensors");
        let bytes = std::fs::read(&shard).unwrap();
        std::fs::write(&shard, &bytes[..bytes.len() - 10]).unwrap();
        let err = DistillCache::open(root.path(), key(), HIDDEN, 50)
            .unwrap_err()
            .to_string();
        assert!(err.contains("damaged") && err.contains("delete"), "{err}");

        // Damaged inside but of the right size: found when read.
        let mut inside = bytes.clone();
        inside[0] ^= 0xFF;
        std::fs::write(&shard, &inside).unwrap();
        let mut cache = DistillCache::open(root.path(), key(), HIDDEN, 50).unwrap();
        let err = cache.load(&["a"]).unwrap_err().to_string();
        assert!(err.contains("not a readable shard"), "{err}");

        std::fs::write(cache.dir().join(MANIFEST), b"{\"format\": 1, \"key\"").unwrap();
        let err = DistillCache::open(root.path(), key(), HIDDEN, 50)
            .unwrap_err()
            .to_string();
        assert!(err.contains("unreadable"), "{err}");
    }

    /// A key of [`AnswerSource::Target`] hashes as before the answer source existed: the
    /// folder of SmolLM2's 128-token ShareGPT answers made then is found again.
    #[test]
    fn target_answers_keep_their_folder_and_dataset_answers_get_another() {
        let key = CacheKey {
            model: "sha256:b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53".into(),
            source: "sharegpt".into(),
            settings: DistillSettings {
                max_prompt_tokens: 256,
                max_new_tokens: 128,
                ..DistillSettings::default()
            },
        };
        assert_eq!(key.folder_name().unwrap(), "232f5f0ed96a270e");
        let json = serde_json::to_string(&key).unwrap();
        assert!(!json.contains("answers"), "{json}");
        let read: CacheKey = serde_json::from_str(&json).unwrap();
        assert_eq!(read.settings.answers, AnswerSource::Target);

        let mut dataset = key.clone();
        dataset.settings.answers = AnswerSource::Dataset;
        assert_ne!(dataset.folder_name().unwrap(), "232f5f0ed96a270e");
        let json = serde_json::to_string(&dataset).unwrap();
        assert!(json.contains(r#""answers":"dataset""#), "{json}");
        assert_eq!(serde_json::from_str::<CacheKey>(&json).unwrap(), dataset);
    }

    impl DistilledSequence {
        fn clone_with_hidden(mut self, hidden: Vec<f32>) -> Self {
            self.hidden = hidden;
            self
        }
    }
}
