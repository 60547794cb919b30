//! The heads file: the heads' weights as safetensors, with what they were trained for in the
//! header's metadata, so that heads of another model are refused with one clear line.
//!
//! Tensors (burn's layout, `[in, out]`, f32): `head.{k}.residual.weight` `[hidden, hidden]`,
//! `head.{k}.residual.bias` `[hidden]` and, where each head has its own projection,
//! `head.{k}.projection.weight` `[hidden, vocab]` (`vocab`: the draft vocabulary's size where the
//! heads have one). Metadata key `medusa`: [`HeadsInfo`] as JSON.

use std::collections::HashMap;
use std::path::Path;

use burn::module::Param;
use burn::tensor::{Tensor, TensorData, backend::Backend};
use safetensors::tensor::{Dtype, SafeTensors, TensorView};
use serde::{Deserialize, Serialize};
use spec_train::identity::TargetIdentity;

use crate::error::{MedusaError, Result};
use crate::heads::MedusaHeads;
use crate::vocab::DraftVocab;

/// The file format's version.
pub const FORMAT: u32 = 1;
const METADATA_KEY: &str = "medusa";

/// What a heads file says about its heads.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HeadsInfo {
    pub format: u32,
    pub heads: usize,
    pub own_projections: bool,
    pub target: TargetIdentity,
    /// `rank_accuracy[k][r]`: on the held-out split, how often head `k`'s `r`-th likeliest token
    /// was the right one. Medusa's static tree is chosen from these.
    pub rank_accuracy: Vec<Vec<f64>>,
    /// The training run's settings and figures, as the trainer reports them.
    pub training: serde_json::Value,
    /// The tokens the heads draft from ([`DraftVocab`]), ascending; absent: the whole
    /// vocabulary.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub draft_vocab: Option<Vec<u32>>,
}

/// Heads with what their file says of them.
#[derive(Debug)]
pub struct HeadsFile<B: Backend> {
    pub heads: MedusaHeads<B>,
    pub info: HeadsInfo,
    pub vocab: Option<DraftVocab>,
}

fn file_error(path: &Path, message: impl Into<String>) -> MedusaError {
    MedusaError::File {
        path: path.to_path_buf(),
        message: message.into(),
    }
}

/// A tensor's shape and little-endian f32 bytes.
type HostBytes = (Vec<usize>, Vec<u8>);

fn host<B: Backend, const D: usize>(tensor: Tensor<B, D>) -> Result<HostBytes> {
    let shape = tensor.dims().to_vec();
    let values: Vec<f32> = tensor
        .into_data()
        .convert::<f32>()
        .into_vec()
        .map_err(|e| MedusaError::Settings(format!("reading heads back: {e:?}")))?;
    Ok((shape, values.iter().flat_map(|v| v.to_le_bytes()).collect()))
}

/// Writes `heads` and `info` to `path` (through a temporary file renamed into place).
///
/// # Errors
/// I/O, or `info` not describing `heads`.
pub fn save<B: Backend>(heads: &MedusaHeads<B>, info: &HeadsInfo, path: &Path) -> Result<()> {
    if info.heads != heads.num_heads() || info.own_projections != heads.own_projections() {
        return Err(MedusaError::Settings(format!(
            "the heads file's description ({} heads, own projections {}) does not match the heads ({}, {})",
            info.heads,
            info.own_projections,
            heads.num_heads(),
            heads.own_projections()
        )));
    }
    let mut tensors: Vec<(String, HostBytes)> = Vec::new();
    for (k, block) in heads.blocks.iter().enumerate() {
        tensors.push((
            format!("head.{k}.residual.weight"),
            host(block.linear.weight.val())?,
        ));
        let bias = block.linear.bias.as_ref().map(|b| b.val());
        let Some(bias) = bias else {
            return Err(MedusaError::Settings(format!("head {k} has no bias")));
        };
        tensors.push((format!("head.{k}.residual.bias"), host(bias)?));
    }
    for (k, projection) in heads.projections.iter().enumerate() {
        tensors.push((
            format!("head.{k}.projection.weight"),
            host(projection.weight.val())?,
        ));
    }
    let views: Vec<(String, TensorView<'_>)> = tensors
        .iter()
        .map(|(name, (shape, bytes))| {
            TensorView::new(Dtype::F32, shape.clone(), bytes)
                .map(|v| (name.clone(), v))
                .map_err(|e| file_error(path, e.to_string()))
        })
        .collect::<Result<_>>()?;
    let json = serde_json::to_string(info).map_err(|e| file_error(path, e.to_string()))?;
    let metadata = HashMap::from([(METADATA_KEY.to_string(), json)]);
    let bytes = safetensors::serialize(views, Some(metadata))
        .map_err(|e| file_error(path, e.to_string()))?;
    let tmp = path.with_extension("partial");
    let io = |source| MedusaError::Io {
        path: path.to_path_buf(),
        source,
    };
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(io)?;
    }
    std::fs::write(&tmp, bytes).map_err(io)?;
    std::fs::rename(&tmp, path).map_err(io)
}

/// Reads the heads at `path` onto `device`, checked against `target`: heads trained for
/// another model (hidden size, vocabulary, fingerprint) are an error.
///
/// # Errors
/// A missing, corrupt or mismatched file.
pub fn load<B: Backend>(
    path: &Path,
    target: &TargetIdentity,
    device: &B::Device,
) -> Result<HeadsFile<B>> {
    let bytes = std::fs::read(path).map_err(|source| MedusaError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let (_, header) = SafeTensors::read_metadata(&bytes)
        .map_err(|e| file_error(path, format!("not a heads file ({e})")))?;
    let json = header
        .metadata()
        .as_ref()
        .and_then(|m| m.get(METADATA_KEY))
        .ok_or_else(|| file_error(path, "not a heads file (no `medusa` metadata)"))?;
    let info: HeadsInfo = serde_json::from_str(json)
        .map_err(|e| file_error(path, format!("unreadable heads description ({e})")))?;
    if info.format != FORMAT {
        return Err(file_error(
            path,
            format!(
                "heads file format {} (this build reads {FORMAT})",
                info.format
            ),
        ));
    }
    if let Some(message) = info.target.mismatch(target) {
        return Err(MedusaError::Mismatch {
            path: path.to_path_buf(),
            message,
        });
    }
    let tensors = SafeTensors::deserialize(&bytes)
        .map_err(|e| file_error(path, format!("corrupt heads file ({e})")))?;
    let draft_vocab = info
        .draft_vocab
        .clone()
        .map(|ids| DraftVocab::new(ids, target.vocab_size))
        .transpose()
        .map_err(|e| file_error(path, e.to_string()))?;
    let hidden = target.hidden_size;
    let vocab = draft_vocab
        .as_ref()
        .map_or(target.vocab_size, DraftVocab::len);
    let read = |name: &str, shape: &[usize]| -> Result<TensorData> {
        let view = tensors
            .tensor(name)
            .map_err(|_| file_error(path, format!("no tensor `{name}`")))?;
        if view.dtype() != Dtype::F32 || view.shape() != shape {
            return Err(file_error(
                path,
                format!(
                    "`{name}` is {:?} {:?}, expected F32 {shape:?}",
                    view.dtype(),
                    view.shape()
                ),
            ));
        }
        let values: Vec<f32> = view
            .data()
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        Ok(TensorData::new(values, shape.to_vec()))
    };
    let mut heads = MedusaHeads::<B>::new(info.heads, hidden, None, device);
    for (k, block) in heads.blocks.iter_mut().enumerate() {
        let w = read(&format!("head.{k}.residual.weight"), &[hidden, hidden])?;
        let b = read(&format!("head.{k}.residual.bias"), &[hidden])?;
        block.linear.weight = Param::from_tensor(Tensor::from_data(w, device));
        block.linear.bias = Some(Param::from_tensor(Tensor::from_data(b, device)));
    }
    if info.own_projections {
        for k in 0..info.heads {
            let w = read(&format!("head.{k}.projection.weight"), &[hidden, vocab])?;
            let mut linear = burn::nn::LinearConfig::new(hidden, vocab)
                .with_bias(false)
                .with_initializer(burn::nn::Initializer::Zeros)
                .init(device);
            linear.weight = Param::from_tensor(Tensor::from_data(w, device));
            heads.projections.push(linear);
        }
    }
    Ok(HeadsFile {
        heads,
        info,
        vocab: draft_vocab,
    })
}
