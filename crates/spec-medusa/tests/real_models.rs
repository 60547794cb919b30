//! Greedy Medusa decoding of a reference model with trained heads equals its plain greedy
//! decoding. Runs where the heads exist: `SPEC_MEDUSA_HEADS` (default: the heads `cargo xtask
//! train-medusa` writes for `SPEC_MEDUSA_MODEL`, default `smollm2-135m`); skips otherwise, and
//! where the model is not cached (fails then under `SPEC_REQUIRE_MODELS=1`).
//!
//! `SPEC_MEDUSA_PROMPTS` (default 2) of the bench's prompts × `SPEC_MEDUSA_TOKENS` (default 32)
//! tokens; the full check, 20 × 64, runs by hand in release, e.g.
//! `SPEC_MEDUSA_MODEL=qwen2.5-coder-1.5b SPEC_MEDUSA_PROMPTS=20 SPEC_MEDUSA_TOKENS=64 cargo test
//! --release -p spec-medusa --test real_models -- --nocapture`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::time::Instant;

use burn::backend::Flex;
use spec_core::sampling::SamplingConfig;
use spec_engine::generate_speculative;
use spec_engine::method::{BuildContext, DraftModelSource, MethodSpec};
use spec_medusa::MedusaSpec;
use spec_runtime::{GenerateOptions, generate_plain, load_model};
use spec_tokenizer::{Message, TextTokenizer};

type B = Flex;

fn env_count(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

/// A draft-model source for methods that take none.
struct NoDrafts;

impl DraftModelSource<B> for NoDrafts {
    fn draft_model(
        &mut self,
        name: &str,
        _format: spec_runtime::model::WeightFormat,
    ) -> Result<spec_engine::method::DraftModel<'_, B>, spec_engine::method::BoxError> {
        Err(format!("no draft model here ({name})").into())
    }
}

#[test]
fn medusa_greedy_equals_plain() {
    let model = std::env::var("SPEC_MEDUSA_MODEL").unwrap_or_else(|_| "smollm2-135m".into());
    let Ok(target_path) = spec_models::resolve(&model) else {
        assert!(
            std::env::var("SPEC_REQUIRE_MODELS").as_deref() != Ok("1"),
            "SPEC_REQUIRE_MODELS=1 but {model} is not cached"
        );
        eprintln!("skipping: {model} is not cached");
        return;
    };
    let heads = match std::env::var("SPEC_MEDUSA_HEADS") {
        Ok(path) => PathBuf::from(path),
        Err(_) => {
            let dir = spec_models::models_dir().unwrap();
            let root = dir.parent().unwrap_or(&dir).to_path_buf();
            root.join("medusa").join(format!("{model}-4h.safetensors"))
        }
    };
    if !heads.is_file() {
        eprintln!(
            "skipping: no heads at {} (cargo xtask train-medusa --model {model})",
            heads.display()
        );
        return;
    }
    let device = Default::default();
    let target = load_model::<B>(&target_path, &device).unwrap();
    let tokenizer = TextTokenizer::from_gguf_path(&target_path).unwrap();
    let spec: MedusaSpec = format!("medusa:heads={}", heads.display()).parse().unwrap();
    let mut drafter = spec
        .build(&mut BuildContext {
            target: &target.model,
            target_path: &target_path,
            tokenizer: &tokenizer,
            device: &device,
            drafts: &mut NoDrafts,
        })
        .unwrap();
    let prompts = spec_train::data::bench_prompts().unwrap();
    let count = env_count("SPEC_MEDUSA_PROMPTS", 2).min(prompts.len());
    let tokens = env_count("SPEC_MEDUSA_TOKENS", 32);
    let options = GenerateOptions::new(tokens, SamplingConfig::greedy());
    let (mut drafted, mut accepted, mut steps, mut generated) = (0, 0, 0, 0);
    for text in prompts.iter().take(count) {
        let chat = tokenizer
            .apply_chat_template(&[Message::user(text.clone())], true)
            .unwrap();
        let prompt = tokenizer.encode(&chat, true).unwrap();
        let start = Instant::now();
        let plain = generate_plain(&target.model, &prompt, &options, &mut |_| {}).unwrap();
        let plain_seconds = start.elapsed().as_secs_f64();
        let start = Instant::now();
        let medusa = generate_speculative(
            &target.model,
            drafter.as_mut(),
            &prompt,
            &options,
            &mut |_| {},
        )
        .unwrap();
        let medusa_seconds = start.elapsed().as_secs_f64();
        assert_eq!(medusa.tokens, plain.tokens, "{text:?}");
        drafted += medusa.metrics.drafted;
        accepted += medusa.metrics.accepted;
        steps += medusa.metrics.steps;
        generated += medusa.tokens.len();
        println!(
            "{text:?}: plain {plain_seconds:.1} s, medusa {medusa_seconds:.1} s, τ {:.2}",
            medusa.metrics.tau().unwrap_or(0.0)
        );
    }
    println!(
        "{count} prompts × {tokens} tokens equal; {accepted} of {drafted} drafted accepted, \
         {generated} tokens in {steps} steps"
    );
}
