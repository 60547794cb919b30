//! Loading a checkpoint from a path: a GGUF file or a Hugging Face directory.

use std::path::{Path, PathBuf};

use burn::tensor::backend::Backend;

use crate::config::ModelConfig;
use crate::error::{Result, RuntimeError};
use crate::model::{LoadOptions, Transformer};
use crate::weights::{GgufSource, SafetensorsSource};

/// A model ready to run, with the configuration it was built from.
#[derive(Debug)]
pub struct LoadedModel<B: Backend> {
    pub config: ModelConfig,
    pub model: Transformer<B>,
    pub path: PathBuf,
}

/// The checkpoint formats the runtime reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CheckpointFormat {
    Gguf,
    HuggingFace,
}

/// Tells a GGUF file from a Hugging Face directory.
pub fn detect_format(path: &Path) -> Result<CheckpointFormat> {
    if path.is_dir() {
        return Ok(CheckpointFormat::HuggingFace);
    }
    let mut magic = [0u8; 4];
    let read = std::fs::File::open(path).and_then(|mut f| {
        use std::io::Read;
        f.read_exact(&mut magic)
    });
    match read {
        Ok(()) if &magic == b"GGUF" => Ok(CheckpointFormat::Gguf),
        Ok(()) => Err(RuntimeError::InvalidConfig(format!(
            "{} is neither a GGUF file nor a directory with config.json",
            path.display()
        ))),
        Err(source) => Err(RuntimeError::Io {
            path: path.display().to_string(),
            source,
        }),
    }
}

/// Loads the checkpoint at `path` (GGUF file or Hugging Face directory) onto `device`.
pub fn load_model<B: Backend>(path: &Path, device: &B::Device) -> Result<LoadedModel<B>> {
    load_model_with(path, device, LoadOptions::default())
}

/// [`load_model`] with explicit options (e.g. a draft model's projections packed as Q8_0).
pub fn load_model_with<B: Backend>(
    path: &Path,
    device: &B::Device,
    options: LoadOptions,
) -> Result<LoadedModel<B>> {
    let (config, model) = match detect_format(path)? {
        CheckpointFormat::Gguf => {
            let file = spec_gguf::GgufFile::open(path)?;
            let config = ModelConfig::from_gguf(&file)?;
            let mut source = GgufSource::new(&file, config.clone());
            let model = Transformer::load_with(&config, &mut source, device, options)?;
            (config, model)
        }
        CheckpointFormat::HuggingFace => {
            let (config, mut source) = SafetensorsSource::open(path)?;
            let model = Transformer::load_with(&config, &mut source, device, options)?;
            (config, model)
        }
    };
    Ok(LoadedModel {
        config,
        model,
        path: path.to_path_buf(),
    })
}
