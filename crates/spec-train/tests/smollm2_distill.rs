//! Distills ShareGPT prompts with SmolLM2-135M through the cache, twice, and reports the time,
//! the throughput and the cache's size. By hand, in release:
//!
//! `cargo test --release -p spec-train --test smollm2_distill -- --ignored --nocapture`
//!
//! `SPEC_DISTILL_PROMPTS` (default 20) prompts × `SPEC_DISTILL_TOKENS` (default 128) tokens;
//! the ShareGPT file from `SPEC_SHAREGPT_JSON`, else `cargo xtask fetch-training-data`'s place.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::time::Instant;

use burn::backend::Flex;
use spec_core::sampling::SamplingConfig;
use spec_runtime::load_model;
use spec_tokenizer::TextTokenizer;
use spec_train::data::{
    CacheKey, DistillCache, DistillSettings, PromptSource, bench_prompts, distill_set,
    load_prompts, model_identity, split_held_out,
};

fn env_count(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

fn sharegpt_file() -> PathBuf {
    if let Ok(path) = std::env::var("SPEC_SHAREGPT_JSON") {
        return path.into();
    }
    let models = spec_models::models_dir().unwrap();
    models
        .parent()
        .unwrap()
        .join("training-data/sharegpt/ShareGPT_V3_unfiltered_cleaned_split.json")
}

fn folder_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().metadata().unwrap().len())
        .sum()
}

#[test]
#[ignore = "minutes in debug; run by hand in release"]
fn smollm2_distills_sharegpt_prompts_once() {
    let prompts = env_count("SPEC_DISTILL_PROMPTS", 20);
    let tokens = env_count("SPEC_DISTILL_TOKENS", 128);
    let model_path = spec_models::resolve("smollm2-135m").unwrap();
    let t = Instant::now();
    let identity = model_identity(&model_path).unwrap();
    println!(
        "model identity of {} ({} MB): {:.2} s",
        model_path.display(),
        std::fs::metadata(&model_path).unwrap().len() >> 20,
        t.elapsed().as_secs_f64()
    );
    if let Ok(big) = spec_models::resolve("qwen2.5-coder-1.5b") {
        let t = Instant::now();
        model_identity(&big).unwrap();
        println!(
            "model identity of {} ({} MB): {:.2} s",
            big.display(),
            std::fs::metadata(&big).unwrap().len() >> 20,
            t.elapsed().as_secs_f64()
        );
    }

    let source = PromptSource::ShareGpt(sharegpt_file());
    let t = Instant::now();
    let loaded = load_prompts(&source, &bench_prompts().unwrap(), Some(prompts)).unwrap();
    println!(
        "{} prompts loaded in {:.2} s ({} bench prompts excluded, {} repeats)",
        loaded.prompts.len(),
        t.elapsed().as_secs_f64(),
        loaded.excluded_bench,
        loaded.duplicates
    );
    let split = split_held_out(loaded.prompts, 0.05).unwrap();

    let device = Default::default();
    let target = load_model::<Flex>(&model_path, &device).unwrap();
    let tokenizer = TextTokenizer::from_gguf_path(&model_path).unwrap();
    let root = tempfile::tempdir().unwrap();
    let key = CacheKey {
        model: identity,
        source: source.label(),
        settings: DistillSettings {
            max_prompt_tokens: 512,
            max_new_tokens: tokens,
            sampling: SamplingConfig::greedy(),
            ..DistillSettings::default()
        },
    };

    let t = Instant::now();
    let mut cache = DistillCache::open_for(root.path(), key.clone(), &target.model).unwrap();
    let mut generated = 0;
    let first = distill_set(&target.model, &tokenizer, &split, &mut cache, &mut |p| {
        generated = p.generated_tokens;
        eprint!(
            "\r{} of {} sequences, {} tokens",
            p.sequence, p.of, p.generated_tokens
        );
    })
    .unwrap();
    eprintln!();
    let first_seconds = t.elapsed().as_secs_f64();
    let prompt_tokens: usize = first.sequences.iter().map(|s| s.answer_start).sum();
    println!(
        "first run: {} sequences ({} train, {} held out), {prompt_tokens} prompt tokens, \
         {generated} answer tokens in {first_seconds:.1} s ({:.1} answer tokens/s)",
        first.sequences.len(),
        first.train().count(),
        first.held_out().count(),
        generated as f64 / first_seconds
    );
    let answer = tokenizer.decode(first.sequences[0].answer()).unwrap();
    println!(
        "first answer: {:?}",
        answer.chars().take(240).collect::<String>()
    );
    println!(
        "cache: {} bytes in {}",
        folder_bytes(cache.dir()),
        cache.dir().display()
    );

    let t = Instant::now();
    let mut cache = DistillCache::open_for(root.path(), key, &target.model).unwrap();
    let mut regenerated = 0;
    let second = distill_set(&target.model, &tokenizer, &split, &mut cache, &mut |p| {
        regenerated += usize::from(!p.cached);
    })
    .unwrap();
    println!(
        "second run: read from the cache in {:.3} s",
        t.elapsed().as_secs_f64()
    );
    assert_eq!(regenerated, 0);
    assert_eq!(second, first);
}
