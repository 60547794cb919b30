//! Tiny seeded random models for the tests.

#![allow(dead_code, unreachable_pub)] // each test file uses part of this
#![allow(clippy::unwrap_used)] // test helpers: a failure is a test failure

use burn::backend::Flex;
use spec_runtime::model::LoadOptions;
use spec_runtime::{
    Architecture, HostTensor, ModelConfig, RandomSource, Result, Transformer, WeightSource,
};

pub type B = Flex;

pub fn config(vocab: usize, hidden: usize, layers: usize, max_positions: usize) -> ModelConfig {
    ModelConfig {
        architecture: Architecture::Qwen2,
        vocab_size: vocab,
        hidden_size: hidden,
        intermediate_size: hidden * 2,
        num_layers: layers,
        num_heads: 4,
        num_kv_heads: 2,
        head_dim: hidden / 4,
        rms_norm_eps: 1e-6,
        rope_theta: 10_000.0,
        max_position_embeddings: max_positions,
        tie_word_embeddings: false,
        qkv_bias: true,
    }
}

pub fn model(config: &ModelConfig, seed: u64) -> Transformer<B> {
    let mut source = RandomSource::new(config.clone(), seed);
    Transformer::load(config, &mut source, &Default::default()).unwrap()
}

/// Random weights with the output layer scaled by `scale` (sharper or flatter distributions).
pub fn scaled_model(config: &ModelConfig, seed: u64, scale: f32) -> Transformer<B> {
    let mut source = Edit {
        inner: RandomSource::new(config.clone(), seed),
        edit: Box::new(move |name, t| {
            if name == "lm_head.weight" {
                t.data.iter_mut().for_each(|x| *x *= scale);
            }
        }),
    };
    Transformer::load(config, &mut source, &Default::default()).unwrap()
}

/// A model whose output layer is NaN.
pub fn poisoned_model(config: &ModelConfig, seed: u64) -> Transformer<B> {
    let mut source = Edit {
        inner: RandomSource::new(config.clone(), seed),
        edit: Box::new(|name, t| {
            if name == "lm_head.weight" {
                t.data.fill(f32::NAN);
            }
        }),
    };
    // The skinny kernel refuses non-finite weights when it packs them (a load-time error), so
    // this model runs burn's matmul and produces the NaN logits at run time, as wanted here.
    let options = LoadOptions {
        skinny_format: None,
        ..Default::default()
    };
    Transformer::load_with(config, &mut source, &Default::default(), options).unwrap()
}

/// Changes a tensor by name as it is loaded.
type EditFn = Box<dyn Fn(&str, &mut HostTensor)>;

struct Edit {
    inner: RandomSource,
    edit: EditFn,
}

impl WeightSource for Edit {
    fn take(&mut self, name: &str) -> Result<HostTensor> {
        let mut t = self.inner.take(name)?;
        (self.edit)(name, &mut t);
        Ok(t)
    }
}

/// `Some(path)` of a cached reference model, `None` (with a message) when it is absent, a panic
/// when it is absent and `SPEC_REQUIRE_MODELS=1`.
pub fn cached_model(name: &str) -> Option<std::path::PathBuf> {
    let found = spec_models::resolve(name).ok().filter(|p| p.is_file());
    if found.is_none() {
        if std::env::var("SPEC_REQUIRE_MODELS").as_deref() == Ok("1") {
            panic!("SPEC_REQUIRE_MODELS=1 but {name} is not in the model cache");
        }
        eprintln!(
            "skipping: {name} is not in the model cache (cargo xtask fetch-models {name}, or set SPEC_MODELS_DIR)"
        );
    }
    found
}
