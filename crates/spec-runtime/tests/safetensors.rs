//! Hugging Face checkpoints: `config.json` + safetensors (single file or sharded with an index;
//! bf16, f16, f32; tied or separate head) load into the same model as the weights they hold.

use std::collections::BTreeMap;
use std::path::Path;

use burn::backend::Flex;
use safetensors::Dtype;
use safetensors::tensor::TensorView;
use spec_runtime::{
    Architecture, ForwardRequest, HostTensor, LogitRows, ModelConfig, RandomSource, RuntimeError,
    Transformer, WeightSource, load_model,
};

type B = Flex;

/// Records what a source handed out, so the same tensors can be written to files.
struct Recording<S> {
    inner: S,
    taken: BTreeMap<String, HostTensor>,
    round: fn(f32) -> f32,
}

impl<S: WeightSource> WeightSource for Recording<S> {
    fn take(&mut self, name: &str) -> spec_runtime::Result<HostTensor> {
        let mut t = self.inner.take(name)?;
        // Round to the file's precision so both models hold identical weights.
        t.data.iter_mut().for_each(|x| *x = (self.round)(*x));
        self.taken.insert(name.to_owned(), t.clone());
        Ok(t)
    }
}

fn config(architecture: Architecture, tied: bool) -> ModelConfig {
    ModelConfig {
        architecture,
        vocab_size: 50,
        hidden_size: 16,
        intermediate_size: 24,
        num_layers: 2,
        num_heads: 4,
        num_kv_heads: 2,
        head_dim: 4,
        rms_norm_eps: 1e-5,
        rope_theta: 10_000.0,
        max_position_embeddings: 32,
        tie_word_embeddings: tied,
        qkv_bias: architecture == Architecture::Qwen2,
    }
}

fn hf_config_json(c: &ModelConfig) -> serde_json::Value {
    serde_json::json!({
        "architectures": [if c.architecture == Architecture::Qwen2 { "Qwen2ForCausalLM" } else { "LlamaForCausalLM" }],
        "model_type": if c.architecture == Architecture::Qwen2 { "qwen2" } else { "llama" },
        "vocab_size": c.vocab_size,
        "hidden_size": c.hidden_size,
        "intermediate_size": c.intermediate_size,
        "num_hidden_layers": c.num_layers,
        "num_attention_heads": c.num_heads,
        "num_key_value_heads": c.num_kv_heads,
        "rms_norm_eps": c.rms_norm_eps,
        "rope_theta": c.rope_theta,
        "max_position_embeddings": c.max_position_embeddings,
        "tie_word_embeddings": c.tie_word_embeddings,
        "hidden_act": "silu",
        "torch_dtype": "bfloat16",
        "rope_scaling": null
    })
}

fn encode(t: &HostTensor, dtype: Dtype) -> Vec<u8> {
    match dtype {
        Dtype::BF16 => t
            .data
            .iter()
            .flat_map(|&x| half::bf16::from_f32(x).to_le_bytes())
            .collect(),
        Dtype::F16 => t
            .data
            .iter()
            .flat_map(|&x| half::f16::from_f32(x).to_le_bytes())
            .collect(),
        _ => t.data.iter().flat_map(|x| x.to_le_bytes()).collect(),
    }
}

fn write_shards(dir: &Path, tensors: &BTreeMap<String, HostTensor>, dtype: Dtype, shards: usize) {
    let names: Vec<&String> = tensors.keys().collect();
    let per_shard = names.len().div_ceil(shards);
    let mut weight_map = serde_json::Map::new();
    for (i, chunk) in names.chunks(per_shard).enumerate() {
        let file = if shards == 1 {
            "model.safetensors".to_owned()
        } else {
            format!("model-{:05}-of-{shards:05}.safetensors", i + 1)
        };
        let bytes: Vec<(String, Vec<u8>)> = chunk
            .iter()
            .map(|n| ((*n).clone(), encode(&tensors[*n], dtype)))
            .collect();
        let views: Vec<(String, TensorView<'_>)> = bytes
            .iter()
            .map(|(n, b)| {
                let view = TensorView::new(dtype, tensors[n].shape.clone(), b).unwrap();
                (n.clone(), view)
            })
            .collect();
        safetensors::serialize_to_file(views, None, &dir.join(&file)).unwrap();
        for n in chunk {
            weight_map.insert((*n).clone(), file.clone().into());
        }
    }
    if shards > 1 {
        let index = serde_json::json!({"metadata": {}, "weight_map": weight_map});
        std::fs::write(
            dir.join("model.safetensors.index.json"),
            serde_json::to_vec(&index).unwrap(),
        )
        .unwrap();
    }
}

fn logits(model: &Transformer<B>) -> Vec<f32> {
    let mut cache = model.new_cache(32);
    let out = model
        .forward(
            ForwardRequest::tokens(&[1, 7, 49, 3, 22]).logits(LogitRows::All),
            &mut cache,
        )
        .unwrap();
    out.logits.unwrap().into_data().to_vec().unwrap()
}

fn roundtrip(architecture: Architecture, tied: bool, dtype: Dtype, shards: usize) {
    let device = Default::default();
    let config = config(architecture, tied);
    let round: fn(f32) -> f32 = match dtype {
        Dtype::BF16 => |x| half::bf16::from_f32(x).to_f32(),
        Dtype::F16 => |x| half::f16::from_f32(x).to_f32(),
        _ => |x| x,
    };
    let mut source = Recording {
        inner: RandomSource::new(config.clone(), 5),
        taken: BTreeMap::new(),
        round,
    };
    let expected = Transformer::<B>::load(&config, &mut source, &device).unwrap();
    assert_eq!(
        source.taken.contains_key("lm_head.weight"),
        !tied,
        "a tied model has no separate head"
    );

    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("config.json"),
        serde_json::to_vec(&hf_config_json(&config)).unwrap(),
    )
    .unwrap();
    write_shards(dir.path(), &source.taken, dtype, shards);
    let loaded = load_model::<B>(dir.path(), &device).unwrap();
    assert_eq!(loaded.config, config);
    assert_eq!(
        logits(&loaded.model),
        logits(&expected),
        "{architecture:?} tied={tied} {dtype:?} shards={shards}"
    );
}

#[test]
fn qwen2_bf16_sharded_tied() {
    roundtrip(Architecture::Qwen2, true, Dtype::BF16, 3);
}

#[test]
fn llama_f16_single_file_separate_head() {
    roundtrip(Architecture::Llama, false, Dtype::F16, 1);
}

#[test]
fn llama_f32_sharded() {
    roundtrip(Architecture::Llama, false, Dtype::F32, 2);
}

#[test]
fn missing_or_wrong_tensors_are_named() {
    let device = Default::default();
    let config = config(Architecture::Llama, true);
    let mut source = Recording {
        inner: RandomSource::new(config.clone(), 1),
        taken: BTreeMap::new(),
        round: |x| x,
    };
    Transformer::<B>::load(&config, &mut source, &device).unwrap();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("config.json"),
        serde_json::to_vec(&hf_config_json(&config)).unwrap(),
    )
    .unwrap();

    let mut tensors = source.taken.clone();
    tensors.remove("model.layers.1.mlp.up_proj.weight");
    write_shards(dir.path(), &tensors, Dtype::F32, 1);
    let err = load_model::<B>(dir.path(), &device).unwrap_err();
    assert!(
        matches!(&err, RuntimeError::MissingTensor(n) if n == "model.layers.1.mlp.up_proj.weight"),
        "{err}"
    );

    let mut tensors = source.taken.clone();
    let bad = tensors.get_mut("model.norm.weight").unwrap();
    bad.shape = vec![8, 2];
    write_shards(dir.path(), &tensors, Dtype::F32, 1);
    let err = load_model::<B>(dir.path(), &device).unwrap_err();
    assert!(
        matches!(&err, RuntimeError::ShapeMismatch { name, .. } if name == "model.norm.weight"),
        "{err}"
    );

    std::fs::write(dir.path().join("config.json"), b"{ not json").unwrap();
    let err = load_model::<B>(dir.path(), &device).unwrap_err();
    assert!(matches!(err, RuntimeError::Config { .. }), "{err}");
}
