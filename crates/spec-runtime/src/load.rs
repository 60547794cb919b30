//! Loading a model: from a [`WeightSource`] ([`Transformer::load_with`], which checks every
//! tensor's shape against the config and packs the weights as [`LoadOptions`] say), or from a
//! path, a GGUF file or a Hugging Face directory ([`load_model`]).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use burn::module::Param;
use burn::tensor::backend::Backend;
use spec_kernels::WeightFormat;

use crate::config::ModelConfig;
use crate::error::{Result, RuntimeError};
use crate::host::is_flex;
use crate::model::linear::HostProjection;
use crate::model::rope::rope_tables;
use crate::model::{Attention, Block, Head, Linear, Mlp, PackedCopy, RmsNorm, Transformer};
use crate::pack::{PackedBlock, Projection, SkinnyLinear, stack};
use crate::weights::{GgufSource, HostTensor, SafetensorsSource, Superblocks, WeightSource};

/// How [`Transformer::load_with`] prepares the weights.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoadOptions {
    /// On the flex backend, keep every projection and the output head packed in this format
    /// for the host path (f32 by default: exact; `Bf16` and `Q8_0` round the weights; `Q4`
    /// keeps a 4-bit checkpoint's weights exactly and stores any matrix that is not 4-bit as
    /// Q8_0; `Q8_0A8` and `Q4A8` also round the activations to int8, a different model again).
    /// `None` runs burn's matmul everywhere. Ignored on other backends.
    pub skinny_format: Option<WeightFormat>,
    /// With a packed copy, also keep burn's tensors of the packed projections (the default
    /// drops them: every forward pass of a packed model then runs on the host, in passes of
    /// at most [`HOST_PASS_ROWS`](crate::model::HOST_PASS_ROWS) rows where the attention pattern allows, so they would go
    /// unused, and an f32 model would be held twice). Keeping them allows repacking a
    /// non-f32 copy in another format without reloading.
    pub keep_unpacked: bool,
    /// In `Q4A8` (and `Q4A8Lossy`), pack a checkpoint's Q4_K and Q6_K matrices from their
    /// superblocks as they are (the default: fewer bytes, integer sums over a superblock,
    /// activations rounded one step a superblock of 256 inputs); `false` packs their f32 values
    /// as other matrices are (Q4_K as Q4 blocks, Q6_K as Q8_0, or rounded to Q4 blocks in
    /// `Q4A8Lossy`; activations rounded one step a block of 32).
    pub keep_superblocks: bool,
    /// The most bytes the device holds in one buffer (on wgpu, the adapter's largest storage
    /// buffer binding: 128 MiB on Mesa's lavapipe). A model with a weight larger in f32 (the
    /// Qwen2.5 0.5B's embedding: 544.5 MB) is refused at load with
    /// [`RuntimeError::WeightTooLarge`]: past the limit the backend fails in its device thread,
    /// and the first read of a result panics.
    pub max_buffer_bytes: Option<u64>,
}

impl Default for LoadOptions {
    fn default() -> Self {
        Self {
            skinny_format: Some(WeightFormat::F32),
            keep_unpacked: false,
            keep_superblocks: true,
            max_buffer_bytes: None,
        }
    }
}

/// A block's projections under their Hugging Face names (`model.layers.{i}.{name}.weight`), in
/// the order q, k, v, o, gate, up, down.
pub const BLOCK_PROJECTIONS: [&str; 7] = [
    "self_attn.q_proj",
    "self_attn.k_proj",
    "self_attn.v_proj",
    "self_attn.o_proj",
    "mlp.gate_proj",
    "mlp.up_proj",
    "mlp.down_proj",
];

impl<B: Backend> Transformer<B> {
    /// Builds the model from `source`, checking every tensor's shape against `config`, with the
    /// default [`LoadOptions`].
    pub fn load(
        config: &ModelConfig,
        source: &mut dyn WeightSource,
        device: &B::Device,
    ) -> Result<Self> {
        Self::load_with(config, source, device, LoadOptions::default())
    }

    /// [`Transformer::load`] with explicit options.
    pub fn load_with(
        config: &ModelConfig,
        source: &mut dyn WeightSource,
        device: &B::Device,
        options: LoadOptions,
    ) -> Result<Self> {
        config.validate()?;
        if let Some(limit) = options.max_buffer_bytes {
            config.check_buffer_limit(limit)?;
        }
        let (hd, h, kv, ff) = (
            config.hidden_size,
            config.num_heads * config.head_dim,
            config.num_kv_heads * config.head_dim,
            config.intermediate_size,
        );
        let get =
            |source: &mut dyn WeightSource, name: &str, shape: &[usize]| -> Result<HostTensor> {
                let t = source.take(name)?;
                if t.shape != shape {
                    return Err(RuntimeError::ShapeMismatch {
                        name: name.into(),
                        expected: shape.to_vec(),
                        found: t.shape,
                    });
                }
                Ok(t)
            };
        let param2 = |t: HostTensor| Param::from_tensor(t.into_tensor::<B, 2>(device));
        let param1 = |t: HostTensor| Param::from_tensor(t.into_tensor::<B, 1>(device));

        let skinny_format = options.skinny_format.filter(|_| is_flex::<B>());
        // `q4-a8` (and `q4-a8-lossy`) keep a checkpoint's superblocks as they are, unless told
        // not to.
        let keep_superblocks =
            options.keep_superblocks && skinny_format.is_some_and(WeightFormat::keeps_superblocks);
        let embedding = get(
            source,
            "model.embed_tokens.weight",
            &[config.vocab_size, hd],
        )?;
        let tied_packed =
            match skinny_format {
                Some(format) if config.tie_word_embeddings => Some(PackedCopy::new(
                    SkinnyLinear::new(&embedding.data, config.vocab_size, hd, None, format)?,
                )),
                _ => None,
            };
        let embedding = param2(embedding);
        let mut blocks = Vec::with_capacity(config.num_layers);
        for i in 0..config.num_layers {
            let p = format!("model.layers.{i}");
            let mut take =
                |name: &str, out: usize, inp: usize, bias: bool| -> Result<HostProjection> {
                    let weight = get(source, &format!("{p}.{name}.weight"), &[out, inp])?;
                    let bias = if bias {
                        Some(get(source, &format!("{p}.{name}.bias"), &[out])?)
                    } else {
                        None
                    };
                    Ok((weight, bias))
                };
            let names = BLOCK_PROJECTIONS;
            let host = [
                take(names[0], h, hd, config.qkv_bias)?,
                take(names[1], kv, hd, config.qkv_bias)?,
                take(names[2], kv, hd, config.qkv_bias)?,
                take(names[3], hd, h, false)?,
                take(names[4], ff, hd, false)?,
                take(names[5], ff, hd, false)?,
                take(names[6], hd, ff, false)?,
            ];
            let mut superblocks: [Option<Superblocks>; 7] = Default::default();
            if keep_superblocks {
                for (slot, name) in superblocks.iter_mut().zip(names) {
                    *slot = source.take_superblocks(&format!("{p}.{name}.weight"))?;
                }
            }
            let packed = match skinny_format {
                Some(format) => {
                    let mut parts = superblocks.iter();
                    let projections = host.each_ref().map(|(w, b)| {
                        Projection::of(w, b.as_ref())
                            .with_superblocks(parts.next().and_then(Option::as_ref))
                    });
                    Some(Arc::new(PackedBlock::new(projections, format)?))
                }
                None => None,
            };
            drop(superblocks);
            // The block's own projections run burn's matmul where the packed copy does not
            // serve; without `keep_unpacked` it serves every request and they hold nothing.
            let [q, k, v, o, gate, up, down] = if packed.is_some() && !options.keep_unpacked {
                drop(host);
                std::array::from_fn(|_| Linear::in_block())
            } else {
                host.map(|(w, b)| Linear::dense(w, b, device))
            };
            let attention = Attention {
                q_proj: q,
                k_proj: k,
                v_proj: v,
                o_proj: o,
                num_heads: config.num_heads,
                num_kv_heads: config.num_kv_heads,
                head_dim: config.head_dim,
            };
            let mlp = Mlp {
                gate_proj: gate,
                up_proj: up,
                down_proj: down,
            };
            let norm = |t| RmsNorm {
                weight: param1(t),
                eps: config.rms_norm_eps,
            };
            blocks.push(Block {
                input_norm: norm(get(source, &format!("{p}.input_layernorm.weight"), &[hd])?),
                attention,
                post_attention_norm: norm(get(
                    source,
                    &format!("{p}.post_attention_layernorm.weight"),
                    &[hd],
                )?),
                mlp,
                packed,
            });
        }
        let norm = RmsNorm {
            weight: param1(get(source, "model.norm.weight", &[hd])?),
            eps: config.rms_norm_eps,
        };
        let head = if config.tie_word_embeddings {
            Head::Tied(tied_packed)
        } else {
            let weight = get(source, "lm_head.weight", &[config.vocab_size, hd])?;
            let superblocks = if keep_superblocks {
                source.take_superblocks("lm_head.weight")?
            } else {
                None
            };
            Head::Own(match (skinny_format, &superblocks) {
                (Some(format), Some(_)) => {
                    let part = Projection::of(&weight, None).with_superblocks(superblocks.as_ref());
                    let packed = stack(&[part], format, None)?;
                    Linear::with_packed(weight, None, Some(packed), options.keep_unpacked, device)
                }
                _ => Linear::from_host(weight, None, skinny_format, options.keep_unpacked, device)?,
            })
        };
        let (rope_cos, rope_sin) = rope_tables(config, device);
        Ok(Self {
            embedding,
            blocks,
            norm,
            head,
            rope_cos,
            rope_sin,
            vocab_size: config.vocab_size,
        })
    }
}

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
