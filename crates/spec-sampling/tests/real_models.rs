//! Greedy speculative sampling with Qwen2.5-Coder-0.5B drafting for Qwen2.5-Coder-1.5B equals
//! plain greedy decoding of the 1.5B. Skips when the models are not cached (fails when
//! `SPEC_REQUIRE_MODELS=1`).
//!
//! `SPEC_SAMPLING_PROMPTS` (default 1) prompts × `SPEC_SAMPLING_TOKENS` (default 32) tokens; the
//! issue asks for 20 × 64, which takes far too long for CI with the current CPU runtime. Run that
//! with `--release`: `auto` prices its steps by their measured times, and the test profile's
//! wide verifications cost more than a release build's (the 1.5B's 9-token one 0.28 s against
//! 0.16 s, docs/benchmarks.md at bf7e8fd; docs/notes/draft-length.md, "A caveat for tests"), so
//! there it drafts less and may decode a prompt plainly.

// Test helpers outside #[test] functions unwrap too; a failure there is a test failure.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Instant;

use common::{B, cached_model};
use spec_core::sampling::SamplingConfig;
use spec_engine::generate_speculative;
use spec_runtime::{ForwardRequest, GenerateOptions, generate_plain, load_model};
use spec_sampling::{DraftLength, DraftModelDrafter};
use spec_tokenizer::{Message, TextTokenizer};

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

#[test]
fn qwen_half_billion_drafting_for_1_5b_greedy_equals_plain() {
    let (Some(target_path), Some(draft_path)) = (
        cached_model("qwen2.5-coder-1.5b"),
        cached_model("qwen2.5-coder-0.5b"),
    ) else {
        return;
    };
    let prompts = env_count("SPEC_SAMPLING_PROMPTS", 1).min(PROMPTS.len());
    let tokens = env_count("SPEC_SAMPLING_TOKENS", 32);
    let device = Default::default();
    let t = Instant::now();
    let target = load_model::<B>(&target_path, &device).unwrap();
    let draft = load_model::<B>(&draft_path, &device).unwrap();
    let target_tokenizer = TextTokenizer::from_gguf_path(&target_path).unwrap();
    let draft_tokenizer = TextTokenizer::from_gguf_path(&draft_path).unwrap();
    eprintln!("loaded both models in {:.1} s", t.elapsed().as_secs_f64());
    let capacity = 512;
    // A fixed length, and `auto`, whose chains end where the draft's confidence says.
    let mut drafters: Vec<_> = [DraftLength::Fixed(4), DraftLength::Auto { max: 8 }]
        .into_iter()
        .map(|length| {
            DraftModelDrafter::<B>::with_tokenizers(
                draft.model.clone(),
                &draft_tokenizer,
                target.config.vocab_size,
                &target_tokenizer,
                length,
            )
            .unwrap()
            .with_cache_capacity(capacity)
        })
        .collect();
    let mut options = GenerateOptions::new(tokens, SamplingConfig::greedy());
    options.cache_capacity = Some(capacity);
    let (mut drafted, mut accepted) = (0, 0);
    let mut failures = Vec::new();
    for text in &PROMPTS[..prompts] {
        let chat = target_tokenizer
            .apply_chat_template(&[Message::user(*text)], true)
            .unwrap();
        let prompt = target_tokenizer.encode(&chat, true).unwrap();
        let t = Instant::now();
        let plain = generate_plain(&target.model, &prompt, &options, &mut |_| {}).unwrap();
        let plain_s = t.elapsed().as_secs_f64();
        for drafter in &mut drafters {
            let length = drafter.length();
            let t = Instant::now();
            let spec = generate_speculative(&target.model, drafter, &prompt, &options, &mut |_| {})
                .unwrap();
            let spec_s = t.elapsed().as_secs_f64();
            eprintln!(
                "{text:?} {length:?}: plain {plain_s:.1} s, speculative {spec_s:.1} s, {} of {} \
                 drafts accepted",
                spec.metrics.accepted, spec.metrics.drafted
            );
            drafted += spec.metrics.drafted;
            accepted += spec.metrics.accepted;
            if spec.tokens == plain.tokens {
                continue;
            }
            let at = spec
                .tokens
                .iter()
                .zip(&plain.tokens)
                .take_while(|(a, b)| a == b)
                .count();
            // How close the target's top two were there: a near-tie is a float-rounding
            // difference between batched and one-token forwards, not a logic error.
            let mut input = prompt.clone();
            input.extend_from_slice(&plain.tokens[..at]);
            let mut cache = target.model.new_cache(capacity);
            let logits: Vec<f32> = target
                .model
                .forward(ForwardRequest::tokens(&input), &mut cache)
                .unwrap()
                .logits
                .unwrap()
                .into_data()
                .iter::<f32>()
                .collect();
            let mut sorted = logits.clone();
            sorted.sort_by(|a, b| b.total_cmp(a));
            eprintln!(
                "{text:?} {length:?}: differs at token {at}; the target's top-2 logit gap there \
                 is {}",
                sorted[0] - sorted[1]
            );
            failures.push((*text, length));
        }
    }
    eprintln!("α over all prompts: {accepted} of {drafted}");
    assert!(accepted > 0);
    assert!(
        failures.is_empty(),
        "greedy output differs for {failures:?}"
    );
}
