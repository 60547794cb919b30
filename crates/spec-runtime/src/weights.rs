//! Where weights come from: GGUF files, Hugging Face safetensors directories, or a seeded random
//! initialization for tests. Every source hands out host f32 tensors under the Hugging Face
//! names (`model.layers.{i}.self_attn.q_proj.weight`, …) in the `[out, in]` layout.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use burn::tensor::{Tensor, TensorData, backend::Backend};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use spec_gguf::GgmlType;
use spec_kernels::{Q4Superblock, Q6Superblock};

use crate::config::{Architecture, HfConfig, ModelConfig};
use crate::error::{Result, RuntimeError};

/// A row-major f32 tensor on the host.
#[derive(Debug, Clone, PartialEq)]
pub struct HostTensor {
    pub shape: Vec<usize>,
    pub data: Vec<f32>,
}

impl HostTensor {
    pub fn into_tensor<B: Backend, const D: usize>(self, device: &B::Device) -> Tensor<B, D> {
        Tensor::from_data(TensorData::new(self.data, self.shape), device)
    }
}

/// Hands out a checkpoint's tensors by Hugging Face name.
pub trait WeightSource {
    /// The tensor `name`, converted to f32; [`RuntimeError::MissingTensor`] if absent.
    fn take(&mut self, name: &str) -> Result<HostTensor>;

    /// The matrix `name` as the checkpoint's Q4_K or Q6_K superblocks (rows of `cols / 256`,
    /// in the `[out, in]` layout, as [`WeightSource::take`] orders rows), when it is stored so;
    /// `None` otherwise. The packed `q4-a8` format keeps them as they are.
    fn take_superblocks(&mut self, _name: &str) -> Result<Option<Superblocks>> {
        Ok(None)
    }
}

/// A matrix as a checkpoint's k-quant superblocks, decoded (see [`WeightSource::take_superblocks`]).
#[derive(Debug, Clone, PartialEq)]
pub enum Superblocks {
    Q4K(Vec<Q4Superblock>),
    Q6K(Vec<Q6Superblock>),
}

/// A GGUF checkpoint (llama.cpp's tensor names, dequantized to f32 on load).
pub struct GgufSource<'a> {
    file: &'a spec_gguf::GgufFile,
    config: ModelConfig,
}

impl std::fmt::Debug for GgufSource<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufSource")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl<'a> GgufSource<'a> {
    pub fn new(file: &'a spec_gguf::GgufFile, config: ModelConfig) -> Self {
        Self { file, config }
    }

    /// llama.cpp's name for a Hugging Face tensor name.
    fn gguf_name(name: &str) -> Option<String> {
        let fixed = match name {
            "model.embed_tokens.weight" => Some("token_embd.weight"),
            "model.norm.weight" => Some("output_norm.weight"),
            "lm_head.weight" => Some("output.weight"),
            _ => None,
        };
        if let Some(n) = fixed {
            return Some(n.to_owned());
        }
        let rest = name.strip_prefix("model.layers.")?;
        let (layer, rest) = rest.split_once('.')?;
        let (module, kind) = rest.rsplit_once('.')?;
        let module = match module {
            "input_layernorm" => "attn_norm",
            "post_attention_layernorm" => "ffn_norm",
            "self_attn.q_proj" => "attn_q",
            "self_attn.k_proj" => "attn_k",
            "self_attn.v_proj" => "attn_v",
            "self_attn.o_proj" => "attn_output",
            "mlp.gate_proj" => "ffn_gate",
            "mlp.up_proj" => "ffn_up",
            "mlp.down_proj" => "ffn_down",
            _ => return None,
        };
        Some(format!("blk.{layer}.{module}.{kind}"))
    }
}

impl WeightSource for GgufSource<'_> {
    fn take(&mut self, name: &str) -> Result<HostTensor> {
        let gguf_name =
            Self::gguf_name(name).ok_or_else(|| RuntimeError::MissingTensor(name.into()))?;
        let info = self
            .file
            .tensor(&gguf_name)
            .ok_or_else(|| RuntimeError::MissingTensor(gguf_name.clone()))?;
        let shape: Vec<usize> = info.shape().iter().map(|&d| d as usize).collect();
        let data = self.in_model_order(name, &shape, self.file.dequantize(info)?)?;
        Ok(HostTensor { shape, data })
    }

    fn take_superblocks(&mut self, name: &str) -> Result<Option<Superblocks>> {
        let Some(info) = Self::gguf_name(name).and_then(|n| self.file.tensor(&n)) else {
            return Ok(None);
        };
        let shape: Vec<usize> = info.shape().iter().map(|&d| d as usize).collect();
        if shape.len() != 2 || !matches!(info.ggml_type, GgmlType::Q4_K | GgmlType::Q6_K) {
            return Ok(None);
        }
        let raw = self.file.read_raw(info)?;
        // A row of superblocks moves as a row of values does.
        let rows = [shape[0], shape[1] / spec_kernels::SUPERBLOCK];
        let superblocks = if info.ggml_type == GgmlType::Q4_K {
            let blocks = spec_gguf::decode_q4_k_blocks(&raw)?
                .into_iter()
                .map(|b| Q4Superblock {
                    scale: b.d,
                    min_scale: b.dmin,
                    scales: b.scales,
                    mins: b.mins,
                    quants: b.quants,
                })
                .collect();
            Superblocks::Q4K(self.in_model_order(name, &rows, blocks)?)
        } else {
            let blocks = spec_gguf::decode_q6_k_blocks(&raw)?
                .into_iter()
                .map(|b| Q6Superblock {
                    scale: b.d,
                    scales: b.scales,
                    quants: b.quants,
                })
                .collect();
            Superblocks::Q6K(self.in_model_order(name, &rows, blocks)?)
        };
        Ok(Some(superblocks))
    }
}

impl GgufSource<'_> {
    /// `rows` (shape `[rows, units]`) of tensor `name` in the decoder's order (see
    /// [`GgufSource::rotary_heads`]).
    fn in_model_order<T: Clone>(
        &self,
        name: &str,
        shape: &[usize],
        rows: Vec<T>,
    ) -> Result<Vec<T>> {
        match self.rotary_heads(name) {
            Some(heads) => unpermute_rotary_rows(&rows, shape, heads, self.config.head_dim),
            None => Ok(rows),
        }
    }

    /// llama.cpp's converter reorders the rows of Llama's q and k projections so that rotary
    /// pairs are adjacent; the decoder uses Hugging Face's half-split pairs, so the rows of
    /// these tensors (of this many heads) are put back.
    fn rotary_heads(&self, name: &str) -> Option<usize> {
        if self.config.architecture != Architecture::Llama {
            return None;
        }
        if name.ends_with("q_proj.weight") || name.ends_with("q_proj.bias") {
            Some(self.config.num_heads)
        } else if name.ends_with("k_proj.weight") || name.ends_with("k_proj.bias") {
            Some(self.config.num_kv_heads)
        } else {
            None
        }
    }
}

/// Inverse of llama.cpp's Llama q/k permutation: within each head, GGUF row `2j + s` is
/// Hugging Face row `s · d/2 + j`.
fn unpermute_rotary_rows<T: Clone>(
    data: &[T],
    shape: &[usize],
    heads: usize,
    head_dim: usize,
) -> Result<Vec<T>> {
    let rows = shape.first().copied().unwrap_or(0);
    let cols: usize = shape.iter().skip(1).product();
    if rows != heads * head_dim || data.len() != rows * cols {
        return Err(RuntimeError::ShapeMismatch {
            name: "rotary projection".into(),
            expected: vec![heads * head_dim, cols],
            found: shape.to_vec(),
        });
    }
    let half = head_dim / 2;
    let mut out = Vec::with_capacity(data.len());
    // Row `h · d + s · d/2 + j` of the result is GGUF row `h · d + 2j + s`.
    for h in 0..heads {
        for s in 0..2 {
            for j in 0..half {
                let src = h * head_dim + 2 * j + s;
                out.extend_from_slice(&data[src * cols..(src + 1) * cols]);
            }
        }
    }
    Ok(out)
}

/// A Hugging Face checkpoint directory: `config.json` and `model.safetensors` or shards listed
/// in `model.safetensors.index.json`. f32, f16 and bf16 tensors.
#[derive(Debug)]
pub struct SafetensorsSource {
    /// Tensor name → shard file.
    shard_of: HashMap<String, PathBuf>,
    /// Shard contents, read once when first needed.
    loaded: HashMap<PathBuf, Vec<u8>>,
}

impl SafetensorsSource {
    /// Reads `dir/config.json` and indexes the shards.
    pub fn open(dir: &Path) -> Result<(ModelConfig, Self)> {
        let config_path = dir.join("config.json");
        let text = read_to_string(&config_path)?;
        let hf: HfConfig = serde_json::from_str(&text).map_err(|source| RuntimeError::Config {
            path: config_path.display().to_string(),
            source,
        })?;
        let config = hf.into_model_config()?;

        let index_path = dir.join("model.safetensors.index.json");
        let mut shard_of = HashMap::new();
        if index_path.exists() {
            let index: serde_json::Value = serde_json::from_str(&read_to_string(&index_path)?)
                .map_err(|source| RuntimeError::Config {
                    path: index_path.display().to_string(),
                    source,
                })?;
            let map = index
                .get("weight_map")
                .and_then(|m| m.as_object())
                .ok_or_else(|| {
                    RuntimeError::Safetensors(format!(
                        "{} has no weight_map object",
                        index_path.display()
                    ))
                })?;
            for (name, file) in map {
                let file = file.as_str().ok_or_else(|| {
                    RuntimeError::Safetensors(format!("weight_map entry {name} is not a file name"))
                })?;
                shard_of.insert(name.clone(), dir.join(file));
            }
        } else {
            let single = dir.join("model.safetensors");
            let bytes = read(&single)?;
            let tensors = safetensors::SafeTensors::deserialize(&bytes)
                .map_err(|e| RuntimeError::Safetensors(format!("{}: {e}", single.display())))?;
            for name in tensors.names() {
                shard_of.insert(name.to_string(), single.clone());
            }
            let mut source = Self {
                shard_of,
                loaded: HashMap::new(),
            };
            source.loaded.insert(single, bytes);
            return Ok((config, source));
        }
        Ok((
            config,
            Self {
                shard_of,
                loaded: HashMap::new(),
            },
        ))
    }
}

impl WeightSource for SafetensorsSource {
    fn take(&mut self, name: &str) -> Result<HostTensor> {
        let path = self
            .shard_of
            .get(name)
            .ok_or_else(|| RuntimeError::MissingTensor(name.into()))?
            .clone();
        if !self.loaded.contains_key(&path) {
            let bytes = read(&path)?;
            self.loaded.insert(path.clone(), bytes);
        }
        let bytes = self
            .loaded
            .get(&path)
            .ok_or_else(|| RuntimeError::MissingTensor(name.into()))?;
        let tensors = safetensors::SafeTensors::deserialize(bytes)
            .map_err(|e| RuntimeError::Safetensors(format!("{}: {e}", path.display())))?;
        let view = tensors
            .tensor(name)
            .map_err(|_| RuntimeError::MissingTensor(name.into()))?;
        let raw = view.data();
        let data: Vec<f32> = match view.dtype() {
            safetensors::Dtype::F32 => raw
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect(),
            safetensors::Dtype::F16 => raw
                .chunks_exact(2)
                .map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32())
                .collect(),
            safetensors::Dtype::BF16 => raw
                .chunks_exact(2)
                .map(|b| half::bf16::from_le_bytes([b[0], b[1]]).to_f32())
                .collect(),
            other => {
                return Err(RuntimeError::Safetensors(format!(
                    "tensor {name} has dtype {other:?}; f32, f16 and bf16 are supported"
                )));
            }
        };
        Ok(HostTensor {
            shape: view.shape().to_vec(),
            data,
        })
    }
}

/// Seeded random weights with the shapes `config` asks for (tests and benchmarks). Projections
/// are scaled by `1/√in` so activations stay in a sane range through many layers.
#[derive(Debug)]
pub struct RandomSource {
    config: ModelConfig,
    rng: ChaCha8Rng,
}

impl RandomSource {
    pub fn new(config: ModelConfig, seed: u64) -> Self {
        Self {
            config,
            rng: ChaCha8Rng::seed_from_u64(seed),
        }
    }
}

impl WeightSource for RandomSource {
    fn take(&mut self, name: &str) -> Result<HostTensor> {
        let c = &self.config;
        let (hd, q, kv, ff) = (
            c.hidden_size,
            c.num_heads * c.head_dim,
            c.num_kv_heads * c.head_dim,
            c.intermediate_size,
        );
        let shape: Vec<usize> = if name == "model.embed_tokens.weight" || name == "lm_head.weight" {
            vec![c.vocab_size, hd]
        } else if name.ends_with("norm.weight") {
            vec![hd]
        } else if name.contains("q_proj") {
            vec![q, hd]
        } else if name.contains("k_proj") || name.contains("v_proj") {
            vec![kv, hd]
        } else if name.contains("o_proj") {
            vec![hd, q]
        } else if name.contains("gate_proj") || name.contains("up_proj") {
            vec![ff, hd]
        } else if name.contains("down_proj") {
            vec![hd, ff]
        } else {
            return Err(RuntimeError::MissingTensor(name.into()));
        };
        let shape = if name.ends_with(".bias") {
            vec![shape[0]]
        } else {
            shape
        };
        let n: usize = shape.iter().product();
        let data = if name.ends_with("norm.weight") {
            (0..n).map(|_| self.rng.random_range(0.8..1.2)).collect()
        } else {
            let fan_in = if shape.len() == 2 { shape[1] } else { 1 };
            let scale = if name == "model.embed_tokens.weight" {
                1.0
            } else {
                (3.0 / fan_in as f32).sqrt()
            };
            (0..n)
                .map(|_| self.rng.random_range(-scale..scale))
                .collect()
        };
        Ok(HostTensor { shape, data })
    }
}

fn read(path: &Path) -> Result<Vec<u8>> {
    std::fs::read(path).map_err(|source| RuntimeError::Io {
        path: path.display().to_string(),
        source,
    })
}

fn read_to_string(path: &Path) -> Result<String> {
    std::fs::read_to_string(path).map_err(|source| RuntimeError::Io {
        path: path.display().to_string(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unpermute_inverts_llama_cpp_permutation() {
        // llama.cpp: reshape(heads, 2, d/2, cols).swapaxes(1, 2): HF row s·d/2 + j → 2j + s.
        let (heads, d, cols) = (2, 6, 3);
        let hf: Vec<f32> = (0..heads * d * cols).map(|x| x as f32).collect();
        let mut gguf = vec![0.0; hf.len()];
        for h in 0..heads {
            for s in 0..2 {
                for j in 0..d / 2 {
                    let src = h * d + s * (d / 2) + j;
                    let dst = h * d + 2 * j + s;
                    gguf[dst * cols..(dst + 1) * cols]
                        .copy_from_slice(&hf[src * cols..(src + 1) * cols]);
                }
            }
        }
        assert_ne!(gguf, hf);
        let back = unpermute_rotary_rows(&gguf, &[heads * d, cols], heads, d).unwrap();
        assert_eq!(back, hf);
    }

    #[test]
    fn gguf_names() {
        assert_eq!(
            GgufSource::gguf_name("model.layers.3.self_attn.k_proj.bias").as_deref(),
            Some("blk.3.attn_k.bias")
        );
        assert_eq!(
            GgufSource::gguf_name("model.layers.10.mlp.down_proj.weight").as_deref(),
            Some("blk.10.ffn_down.weight")
        );
        assert_eq!(GgufSource::gguf_name("model.unknown"), None);
    }
}
