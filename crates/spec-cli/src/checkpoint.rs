//! What `spec` reads of a checkpoint before its weights: the tokenizer and the context length.

use std::path::Path;

use anyhow::{Context, Result};
use spec_runtime::{HfConfig, ModelConfig};
use spec_tokenizer::TextTokenizer;

/// A checkpoint's tokenizer and configuration, read without its weights.
pub(crate) struct CheckpointHeader {
    pub(crate) tokenizer: TextTokenizer,
    pub(crate) config: ModelConfig,
}

/// Reads the tokenizer and configuration of the GGUF file or Hugging Face directory at
/// `path`: enough to check a request against the model's context before loading it.
pub(crate) fn read_header(path: &Path) -> Result<CheckpointHeader> {
    if path.is_dir() {
        let json = path.join("config.json");
        let text = std::fs::read_to_string(&json)
            .with_context(|| format!("reading {}", json.display()))?;
        let config: HfConfig =
            serde_json::from_str(&text).with_context(|| format!("reading {}", json.display()))?;
        let config = config
            .into_model_config()
            .with_context(|| format!("in {}", json.display()))?;
        Ok(CheckpointHeader {
            tokenizer: load_tokenizer(path)?,
            config,
        })
    } else {
        let file = open_gguf(path)?;
        let config = ModelConfig::from_gguf(&file)
            .with_context(|| format!("reading the configuration of {}", path.display()))?;
        Ok(CheckpointHeader {
            tokenizer: gguf_tokenizer(&file, path)?,
            config,
        })
    }
}

/// The tokenizer stored with a checkpoint: in the GGUF file, or `tokenizer.json` beside a
/// Hugging Face checkpoint.
pub(crate) fn load_tokenizer(path: &Path) -> Result<TextTokenizer> {
    if path.is_dir() {
        let json = path.join("tokenizer.json");
        Ok(TextTokenizer::from_tokenizer_json(&json)
            .with_context(|| format!("loading {}", json.display()))?)
    } else {
        gguf_tokenizer(&open_gguf(path)?, path)
    }
}

/// Opened before anything is read from it, so that a damaged file (a truncated download) is
/// reported as the file's fault, not the tokenizer's.
fn open_gguf(path: &Path) -> Result<spec_gguf::GgufFile> {
    spec_gguf::GgufFile::open(path).with_context(|| format!("reading {}", path.display()))
}

fn gguf_tokenizer(file: &spec_gguf::GgufFile, path: &Path) -> Result<TextTokenizer> {
    TextTokenizer::from_gguf(file)
        .with_context(|| format!("loading the tokenizer of {}", path.display()))
}
