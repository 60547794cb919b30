//! Model configuration: one internal [`ModelConfig`], built from a Hugging Face `config.json`
//! ([`HfConfig`] mirrors it) or from GGUF metadata.

use serde::{Deserialize, Serialize};

use crate::error::{Result, RuntimeError};

/// The decoder families the runtime implements.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Architecture {
    /// Llama (SmolLM2): no biases in attention.
    Llama,
    /// Qwen2 (Qwen2.5, Qwen2.5-Coder): biases on the q, k and v projections.
    Qwen2,
}

/// Everything the decoder needs to know about a checkpoint's shape.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelConfig {
    pub architecture: Architecture,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_layers: usize,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub rms_norm_eps: f64,
    pub rope_theta: f64,
    /// The context length the model was trained for; caches are capped at it.
    pub max_position_embeddings: usize,
    /// The output head reuses the token embedding.
    pub tie_word_embeddings: bool,
    /// Biases on the q, k, v projections.
    pub qkv_bias: bool,
}

impl ModelConfig {
    /// Checks the relations the decoder relies on.
    pub fn validate(&self) -> Result<()> {
        let fail = |m: String| Err(RuntimeError::InvalidConfig(m));
        if self.vocab_size == 0 || self.hidden_size == 0 || self.num_layers == 0 {
            return fail("vocab_size, hidden_size and num_layers must be positive".into());
        }
        if self.num_heads == 0
            || self.num_kv_heads == 0
            || !self.num_heads.is_multiple_of(self.num_kv_heads)
        {
            return fail(format!(
                "num_heads ({}) must be a positive multiple of num_kv_heads ({})",
                self.num_heads, self.num_kv_heads
            ));
        }
        if self.head_dim == 0 || !self.head_dim.is_multiple_of(2) {
            return fail(format!(
                "head_dim ({}) must be even for rotary embeddings",
                self.head_dim
            ));
        }
        if !(self.rms_norm_eps > 0.0 && self.rope_theta > 0.0) {
            return fail("rms_norm_eps and rope_theta must be positive".into());
        }
        Ok(())
    }

    /// Query heads per key/value head.
    pub fn group_size(&self) -> usize {
        self.num_heads / self.num_kv_heads
    }

    /// Bytes of f32 weights (for the bandwidth bound and memory planning).
    pub fn num_parameters(&self) -> usize {
        let h = self.hidden_size;
        let q = self.num_heads * self.head_dim;
        let kv = self.num_kv_heads * self.head_dim;
        let attention = h * q + 2 * h * kv + q * h + if self.qkv_bias { q + 2 * kv } else { 0 };
        let mlp = 3 * h * self.intermediate_size;
        let layer = attention + mlp + 2 * h;
        let head = if self.tie_word_embeddings {
            0
        } else {
            self.vocab_size * h
        };
        self.vocab_size * h + self.num_layers * layer + h + head
    }

    /// Fails with [`RuntimeError::WeightTooLarge`] where one weight in f32 takes more than
    /// `limit` bytes (a device's largest buffer; see `LoadOptions::max_buffer_bytes`).
    pub fn check_buffer_limit(&self, limit: u64) -> Result<()> {
        let h = self.hidden_size;
        let weights = [
            ("token embedding", self.vocab_size * h),
            ("MLP projections", self.intermediate_size * h),
            ("query projection", self.num_heads * self.head_dim * h),
        ];
        let largest = weights
            .into_iter()
            .map(|(name, n)| (name, n as u64 * 4))
            .max_by_key(|&(_, bytes)| bytes);
        match largest {
            Some((name, bytes)) if bytes > limit => {
                Err(RuntimeError::WeightTooLarge { name, bytes, limit })
            }
            _ => Ok(()),
        }
    }

    /// Reads the configuration from GGUF metadata (`general.architecture` and `<arch>.*` keys).
    pub fn from_gguf(file: &spec_gguf::GgufFile) -> Result<Self> {
        let arch_name = file
            .architecture()
            .ok_or_else(|| RuntimeError::MissingMetadata("general.architecture".into()))?
            .to_owned();
        let architecture = match arch_name.as_str() {
            "llama" => Architecture::Llama,
            "qwen2" => Architecture::Qwen2,
            other => return Err(RuntimeError::UnsupportedArchitecture(other.into())),
        };
        let key = |k: &str| format!("{arch_name}.{k}");
        let uint = |k: &str| -> Result<usize> {
            let k = key(k);
            file.get(&k)
                .and_then(|v| v.as_u64())
                .map(|v| v as usize)
                .ok_or(RuntimeError::MissingMetadata(k))
        };
        let float = |k: &str| -> Result<f64> {
            let k = key(k);
            file.get(&k)
                .and_then(|v| v.as_f64())
                .ok_or(RuntimeError::MissingMetadata(k))
        };
        let hidden_size = uint("embedding_length")?;
        let num_heads = uint("attention.head_count")?;
        let embedding = file
            .tensor("token_embd.weight")
            .ok_or_else(|| RuntimeError::MissingTensor("token_embd.weight".into()))?;
        // GGUF dims are innermost first: [hidden, vocab].
        let vocab_size = match embedding.dims.as_slice() {
            [_, vocab] => *vocab as usize,
            dims => {
                return Err(RuntimeError::InvalidConfig(format!(
                    "token_embd.weight has dims {dims:?}"
                )));
            }
        };
        let config = Self {
            architecture,
            vocab_size,
            hidden_size,
            intermediate_size: uint("feed_forward_length")?,
            num_layers: uint("block_count")?,
            num_heads,
            num_kv_heads: uint("attention.head_count_kv").unwrap_or(num_heads),
            head_dim: uint("attention.key_length").unwrap_or(hidden_size / num_heads.max(1)),
            rms_norm_eps: float("attention.layer_norm_rms_epsilon")?,
            rope_theta: float("rope.freq_base").unwrap_or(10_000.0),
            max_position_embeddings: uint("context_length")?,
            tie_word_embeddings: file.tensor("output.weight").is_none(),
            qkv_bias: file.tensor("blk.0.attn_q.bias").is_some(),
        };
        if let Some(kind) = file
            .get(&key("rope.scaling.type"))
            .and_then(|v| v.as_str())
            .filter(|k| *k != "none")
        {
            return Err(RuntimeError::InvalidConfig(format!(
                "rope scaling `{kind}` is not supported"
            )));
        }
        config.validate()?;
        Ok(config)
    }
}

/// The fields of a Hugging Face `config.json` that Llama and Qwen2 checkpoints use.
#[derive(Debug, Clone, Deserialize, Serialize)]
pub struct HfConfig {
    #[serde(default)]
    pub architectures: Vec<String>,
    pub model_type: String,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: Option<usize>,
    pub head_dim: Option<usize>,
    pub rms_norm_eps: f64,
    #[serde(default = "default_rope_theta")]
    pub rope_theta: f64,
    pub max_position_embeddings: usize,
    #[serde(default)]
    pub tie_word_embeddings: bool,
    /// Llama's optional attention bias (Qwen2 always has q/k/v biases).
    #[serde(default)]
    pub attention_bias: bool,
    #[serde(default)]
    pub rope_scaling: Option<serde_json::Value>,
    #[serde(default)]
    pub hidden_act: Option<String>,
}

fn default_rope_theta() -> f64 {
    10_000.0
}

impl HfConfig {
    pub fn into_model_config(self) -> Result<ModelConfig> {
        let architecture = match self.model_type.as_str() {
            "llama" => Architecture::Llama,
            "qwen2" => Architecture::Qwen2,
            other => return Err(RuntimeError::UnsupportedArchitecture(other.into())),
        };
        if self.rope_scaling.as_ref().is_some_and(|v| !v.is_null()) {
            return Err(RuntimeError::InvalidConfig(
                "rope_scaling is not supported".into(),
            ));
        }
        if let Some(act) = self.hidden_act.as_deref()
            && act != "silu"
        {
            return Err(RuntimeError::InvalidConfig(format!(
                "hidden_act `{act}` is not supported (silu only)"
            )));
        }
        let num_heads = self.num_attention_heads;
        let config = ModelConfig {
            architecture,
            vocab_size: self.vocab_size,
            hidden_size: self.hidden_size,
            intermediate_size: self.intermediate_size,
            num_layers: self.num_hidden_layers,
            num_heads,
            num_kv_heads: self.num_key_value_heads.unwrap_or(num_heads),
            head_dim: self.head_dim.unwrap_or(self.hidden_size / num_heads.max(1)),
            rms_norm_eps: self.rms_norm_eps,
            rope_theta: self.rope_theta,
            max_position_embeddings: self.max_position_embeddings,
            tie_word_embeddings: self.tie_word_embeddings,
            qkv_bias: architecture == Architecture::Qwen2 || self.attention_bias,
        };
        config.validate()?;
        Ok(config)
    }
}
