//! Greedy trees from Qwen2.5-Coder-0.5B (merged with prompt lookup's matches) verified by
//! Qwen2.5-Coder-1.5B equal plain greedy decoding of the 1.5B. Skips when the models are not
//! cached (fails when `SPEC_REQUIRE_MODELS=1`).
//!
//! `SPEC_TREE_PROMPTS` (default 1) prompts × `SPEC_TREE_TOKENS` (default 32) tokens in CI; the
//! full check, 20 × 64, runs by hand in release:
//! `SPEC_TREE_PROMPTS=20 SPEC_TREE_TOKENS=64 cargo test --release -p spec-tree --test real_models`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Instant;

use burn::backend::Flex;
use spec_core::sampling::SamplingConfig;
use spec_engine::generate_speculative;
use spec_runtime::{GenerateOptions, generate_plain, load_model};
use spec_sampling::{DraftRunner, check_vocabularies, weight_cost_prior};
use spec_tokenizer::{Message, TextTokenizer};
use spec_tree::{TreeDrafter, TreeSettings, TreeSources};

type B = Flex;

const PROMPTS: [&str; 20] = [
    "Write a Python function that checks whether a number is prime.",
    "Explain what a hash map is in two sentences.",
    "Write a Rust function that reverses a string.",
    "What does the `git rebase` command do?",
    "Write a SQL query that counts the orders per customer.",
    "Write a bash one-liner that counts the lines of every .rs file.",
    "Implement binary search in C.",
    "What is the difference between a process and a thread?",
    "Write a JavaScript function that debounces another function.",
    "Explain big-O notation briefly.",
    "Write a Python class for a stack with push, pop and peek.",
    "How do I read a file line by line in Go?",
    "Write a regular expression that matches an email address.",
    "What is a closure in programming?",
    "Write a Haskell function that computes Fibonacci numbers.",
    "Explain the CAP theorem.",
    "Write a Python function that merges two sorted lists.",
    "What is tail recursion?",
    "Write a Java method that checks if a string is a palindrome.",
    "Explain what a mutex is.",
];

fn env_count(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

fn cached_model(name: &str) -> Option<std::path::PathBuf> {
    let found = spec_models::resolve(name).ok().filter(|p| p.is_file());
    if found.is_none() {
        assert!(
            std::env::var("SPEC_REQUIRE_MODELS").as_deref() != Ok("1"),
            "SPEC_REQUIRE_MODELS=1 but {name} is not in the model cache"
        );
        eprintln!("skipping: {name} is not in the model cache (cargo xtask fetch-models {name})");
    }
    found
}

#[test]
fn qwen_trees_greedy_equal_plain() {
    let (Some(target_path), Some(draft_path)) = (
        cached_model("qwen2.5-coder-1.5b"),
        cached_model("qwen2.5-coder-0.5b"),
    ) else {
        return;
    };
    let prompts = env_count("SPEC_TREE_PROMPTS", 1).min(PROMPTS.len());
    let tokens = env_count("SPEC_TREE_TOKENS", 32);
    let device = Default::default();
    let target = load_model::<B>(&target_path, &device).unwrap();
    let draft = load_model::<B>(&draft_path, &device).unwrap();
    let target_tokenizer = TextTokenizer::from_gguf_path(&target_path).unwrap();
    let draft_tokenizer = TextTokenizer::from_gguf_path(&draft_path).unwrap();
    let vocab = target.config.vocab_size;
    check_vocabularies(
        &draft_tokenizer,
        draft.config.vocab_size,
        &target_tokenizer,
        vocab,
    )
    .unwrap();
    let mut drafter = TreeDrafter::new(
        TreeSources {
            draft: Some((
                DraftRunner::new(draft.model.clone(), vocab),
                weight_cost_prior(&draft.model, &target.model),
            )),
            lookup: Some((1, 3)),
            bigram: None,
        },
        vocab,
        TreeSettings::default(),
    )
    .unwrap();
    let options = GenerateOptions::new(tokens, SamplingConfig::greedy());
    let (mut drafted, mut accepted, mut steps) = (0, 0, 0);
    let mut failures = Vec::new();
    for text in &PROMPTS[..prompts] {
        let chat = target_tokenizer
            .apply_chat_template(&[Message::user(*text)], true)
            .unwrap();
        let prompt = target_tokenizer.encode(&chat, true).unwrap();
        let t = Instant::now();
        let plain = generate_plain(&target.model, &prompt, &options, &mut |_| {}).unwrap();
        let plain_s = t.elapsed().as_secs_f64();
        let t = Instant::now();
        let spec =
            generate_speculative(&target.model, &mut drafter, &prompt, &options, &mut |_| {})
                .unwrap();
        eprintln!(
            "{text:?}: plain {plain_s:.1} s, tree {:.1} s, τ {:.2}, {} of {} drafted nodes accepted",
            t.elapsed().as_secs_f64(),
            spec.metrics.tau().unwrap_or(0.0),
            spec.metrics.accepted,
            spec.metrics.drafted
        );
        drafted += spec.metrics.drafted;
        accepted += spec.metrics.accepted;
        steps += spec.metrics.steps;
        if spec.tokens != plain.tokens {
            failures.push(*text);
        }
    }
    eprintln!("{accepted} of {drafted} drafted nodes accepted over {steps} steps");
    assert!(accepted > 0, "no tree node was accepted");
    assert!(
        failures.is_empty(),
        "greedy output differs for {failures:?}"
    );
}
