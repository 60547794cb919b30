//! The decoders against an independent implementation: `tests/reference/numpy_reference.py`, a
//! numpy forward pass over the weights as the Python `gguf` package dequantizes them.
//!
//! For each reference model, five chat prompts: our greedy continuation of 32 tokens
//! (`generate_plain`) must equal numpy's, and our logits at every generated position (one
//! teacher-forced pass) must agree with numpy's to 1e-3 relative (max |ours − ref| / max |ref|
//! per row). Needs the cached models and Python with numpy and gguf (`cargo xtask test` provides
//! both); without them the test says so and passes, unless `SPEC_REQUIRE_MODELS=1`.

// Test helpers outside #[test] functions unwrap too; a failure there is a test failure.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::needless_range_loop)]

use std::path::{Path, PathBuf};
use std::process::Command;

use burn::backend::Flex;
use spec_core::sampling::SamplingConfig;
use spec_runtime::{ForwardRequest, GenerateOptions, LogitRows, generate_plain, load_model};
use spec_tokenizer::{Message, TextTokenizer};

const PROMPTS: [&str; 5] = [
    "Write a Python function that reverses a string.",
    "What is the capital of France? Answer in one sentence.",
    "Explain what a hash map is to a beginner.",
    "Translate to French: The weather is nice today.",
    "List three prime numbers greater than 100.",
];
const NEW_TOKENS: usize = 32;

fn required() -> bool {
    std::env::var("SPEC_REQUIRE_MODELS").is_ok_and(|v| v == "1")
}

fn skip(why: &str) {
    assert!(!required(), "SPEC_REQUIRE_MODELS=1 but {why}");
    eprintln!("skipping the numpy reference check: {why}");
}

fn python_ready() -> bool {
    Command::new("python3")
        .args(["-c", "import numpy, gguf"])
        .status()
        .is_ok_and(|s| s.success())
}

fn check_model(name: &str) {
    let path = match spec_models::resolve(name) {
        Ok(p) => p,
        Err(e) => return skip(&e.to_string()),
    };
    if !python_ready() {
        return skip("python3 cannot import numpy and gguf (`cargo xtask test` installs them)");
    }
    let device = Default::default();
    let tokenizer = TextTokenizer::from_gguf_path(&path).unwrap();
    let loaded = load_model::<Flex>(&path, &device).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut entries = Vec::new();
    for (i, text) in PROMPTS.iter().enumerate() {
        let chat = tokenizer
            .apply_chat_template(&[Message::user(*text)], true)
            .unwrap();
        let prompt = tokenizer.encode(&chat, true).unwrap();
        let options = GenerateOptions::new(NEW_TOKENS, SamplingConfig::greedy());
        let generation = generate_plain(&loaded.model, &prompt, &options, &mut |_| {}).unwrap();
        assert_eq!(generation.tokens.len(), NEW_TOKENS);

        // Logits at every generated position, from one teacher-forced pass.
        let mut all = prompt.clone();
        all.extend(&generation.tokens[..NEW_TOKENS - 1]);
        let rows: Vec<usize> = (prompt.len() - 1..all.len()).collect();
        let mut cache = loaded.model.new_cache(all.len());
        let out = loaded
            .model
            .forward(
                ForwardRequest::tokens(&all).logits(LogitRows::Rows(rows)),
                &mut cache,
            )
            .unwrap();
        let logits: Vec<f32> = out.logits.unwrap().into_data().to_vec().unwrap();
        let file = format!("prompt{i}.f32");
        let bytes: Vec<u8> = logits.iter().flat_map(|x| x.to_le_bytes()).collect();
        std::fs::write(dir.path().join(&file), bytes).unwrap();
        eprintln!(
            "{name} prompt {i}: {:?}",
            tokenizer.decode(&generation.tokens).unwrap()
        );
        entries.push(serde_json::json!({
            "name": format!("prompt{i}"),
            "prompt_tokens": prompt,
            "tokens": generation.tokens,
            "logits_file": file,
        }));
    }
    let ours = dir.path().join("ours.json");
    std::fs::write(&ours, serde_json::to_vec(&entries).unwrap()).unwrap();
    let report = dir.path().join("report.json");
    let status = Command::new("python3")
        .arg(script())
        .args(["compare", "--model"])
        .arg(&path)
        .arg("--ours")
        .arg(&ours)
        .args(["--rel-tol", "1e-3", "--out"])
        .arg(&report)
        .status()
        .unwrap();
    let report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&report).unwrap()).unwrap();
    eprintln!(
        "{name}: max relative logit error {}, greedy equal: {}",
        report["max_rel"], report["all_greedy_equal"]
    );
    assert!(
        status.success(),
        "{name} differs from the numpy reference: {report}"
    );
    assert_eq!(report["all_greedy_equal"], serde_json::Value::Bool(true));
    assert!(report["max_rel"].as_f64().unwrap() <= 1e-3);
}

fn script() -> PathBuf {
    Path::new(&manifest_dir()).join("tests/reference/numpy_reference.py")
}

#[test]
fn smollm2_matches_numpy() {
    check_model("smollm2-135m");
}

#[test]
fn qwen_0_5b_matches_numpy() {
    check_model("qwen2.5-coder-0.5b");
}

/// This package's directory: cargo's run-time `CARGO_MANIFEST_DIR` when set, else the
/// compile-time one. (A target directory shared with a checkout at another path may hold a
/// binary built there, whose compile-time path points into that checkout.)
fn manifest_dir() -> std::path::PathBuf {
    std::env::var_os("CARGO_MANIFEST_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")))
}
