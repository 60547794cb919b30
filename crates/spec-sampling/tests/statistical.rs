//! Exactness by sampling, end to end: a tiny random target and a different tiny random draft
//! (vocabulary 8), whole speculative generations of 3 tokens through `spec-engine`, repeated with
//! seeds 0..n. The empirical joint law of the 3 tokens must be within the 99.9% total-variation
//! bound of the target's exact law, enumerated from the runtime's forward on every prefix and
//! turned into probabilities in f64 by `spec_core::reference::probabilities`.
//!
//! Bound (as in spec-core's tests/statistical.rs): with `n` runs over cells of probability `p_i`,
//! E[TV] ≤ ½ Σ √(p_i (1 − p_i) / n), and TV moves by at most 1/n per run, so by McDiarmid
//! P(TV ≥ E[TV] + ε) ≤ exp(−2nε²); with δ = 0.001 the bound is
//! ½ Σ √(p_i (1 − p_i) / n) + √(ln(1/δ) / (2n)).
//!
//! The same samples are also compared with the *draft's* exact law, which they must miss by more
//! than the bound: the test can tell the two models apart, so passing it says something.
//!
//! Runs: `SPEC_SAMPLING_RUNS` (default 100,000).

// Test helpers outside #[test] functions unwrap too; a failure there is a test failure.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::HashMap;
use std::time::Instant;

use common::{B, config, scaled_model};
use spec_core::error::Source;
use spec_core::reference;
use spec_core::sampling::SamplingConfig;
use spec_engine::generate_speculative;
use spec_runtime::{ForwardRequest, GenerateOptions, ModelConfig, Transformer};
use spec_sampling::{DraftLength, DraftModelDrafter};

const VOCAB: usize = 8;
const LENGTH: usize = 3;
const PROMPT: [u32; 2] = [3, 5];

fn models() -> (ModelConfig, Transformer<B>, Transformer<B>) {
    let c = config(VOCAB, 16, 2, 16);
    // Sharper output layers than the default init, so the law has fewer cells that matter and
    // the bound is tight.
    let target = scaled_model(&c, 101, 2.5);
    let draft = scaled_model(&config(VOCAB, 16, 1, 16), 202, 2.5);
    (c, target, draft)
}

fn runs() -> usize {
    std::env::var("SPEC_SAMPLING_RUNS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(100_000)
}

/// The exact law of the next `LENGTH` tokens after `PROMPT` under `model` and `sampling`.
fn exact_law(model: &Transformer<B>, sampling: &SamplingConfig) -> HashMap<Vec<u32>, f64> {
    let mut law = HashMap::new();
    let mut frontier = vec![(Vec::<u32>::new(), 1.0f64)];
    for _ in 0..LENGTH {
        let mut next = Vec::new();
        for (tokens, mass) in frontier {
            let input: Vec<u32> = PROMPT.iter().chain(&tokens).copied().collect();
            let mut cache = model.new_cache(16);
            let logits = model
                .forward(ForwardRequest::tokens(&input), &mut cache)
                .unwrap()
                .logits
                .unwrap();
            let logits: Vec<f64> = logits.into_data().iter::<f64>().collect();
            let p = reference::probabilities(&logits, sampling, Source::Target, 0).unwrap();
            for (t, &pt) in p.iter().enumerate() {
                if pt > 0.0 {
                    let mut extended = tokens.clone();
                    extended.push(t as u32);
                    next.push((extended, mass * pt));
                }
            }
        }
        frontier = next;
    }
    for (tokens, mass) in frontier {
        law.insert(tokens, mass);
    }
    law
}

/// Total variation between the counts and `law`, and the 99.9% bound for `n` runs.
fn tv_and_bound(
    counts: &HashMap<Vec<u32>, usize>,
    law: &HashMap<Vec<u32>, f64>,
    n: usize,
) -> (f64, f64) {
    let n = n as f64;
    let mut tv = 0.0;
    let mut spread = 0.0;
    for (cell, &p) in law {
        let observed = counts.get(cell).copied().unwrap_or(0) as f64 / n;
        tv += (observed - p).abs() / 2.0;
        spread += (p * (1.0 - p) / n).sqrt() / 2.0;
    }
    // Samples outside the law's support (impossible under the target) count fully.
    tv += counts
        .iter()
        .filter(|(cell, _)| !law.contains_key(*cell))
        .map(|(_, &c)| c as f64 / n / 2.0)
        .sum::<f64>();
    (tv, spread + (1000f64.ln() / (2.0 * n)).sqrt())
}

fn check(sampling: SamplingConfig, length: DraftLength) {
    let (c, _, draft) = models();
    let drafter = DraftModelDrafter::<B>::new(draft, c.vocab_size, length).unwrap();
    check_with(sampling, drafter);
}

/// Runs `drafter` and checks the law; returns it for what it learned.
fn check_with(sampling: SamplingConfig, mut drafter: DraftModelDrafter<B>) -> DraftModelDrafter<B> {
    let (_, target, draft) = models();
    let length = drafter.length();
    let n = runs();
    let law = exact_law(&target, &sampling);
    let draft_law = exact_law(&draft, &sampling);
    let mut counts: HashMap<Vec<u32>, usize> = HashMap::new();
    let (mut drafted, mut accepted) = (0u64, 0u64);
    let start = Instant::now();
    for seed in 0..n as u64 {
        let mut options = GenerateOptions::new(LENGTH, sampling.seed(seed));
        options.cache_capacity = Some(16);
        let out =
            generate_speculative(&target, &mut drafter, &PROMPT, &options, &mut |_| {}).unwrap();
        assert_eq!(out.tokens.len(), LENGTH);
        drafted += out.metrics.drafted;
        accepted += out.metrics.accepted;
        *counts.entry(out.tokens).or_default() += 1;
    }
    let seconds = start.elapsed().as_secs_f64();
    let (tv, bound) = tv_and_bound(&counts, &law, n);
    let (tv_draft, _) = tv_and_bound(&counts, &draft_law, n);
    eprintln!(
        "{sampling:?} {length:?}: {n} runs in {seconds:.1} s; α = {:.3}; TV to target {tv:.5}, \
         99.9% bound {bound:.5}; TV to the draft's law {tv_draft:.5}; {} cells",
        accepted as f64 / drafted.max(1) as f64,
        law.len()
    );
    assert!(
        drafted > 0 && accepted > 0 && accepted < drafted,
        "rejections must occur"
    );
    assert!(tv < bound, "TV {tv} ≥ bound {bound}");
    assert!(
        tv_draft > bound,
        "the samples are as close to the draft's law ({tv_draft}) as the bound {bound}: the test cannot tell the models apart"
    );
    drafter
}

#[test]
fn joint_law_of_three_tokens_at_temperature_one() {
    check(SamplingConfig::with_temperature(1.0), DraftLength::Fixed(2));
}

/// `auto`'s chain rule decides on each draft from its row's confidence before its token is
/// drawn, with rates learned from earlier runs: chains of 0 to 2 drafts in the first step, and
/// the law must not move. Fixed costs keep the decisions off the machine's timings: a draft
/// token 0.05 of a target step and 0.3 more a token verified, so that a computed row's draft,
/// whose row is paid either way, is still declined where its rate is under about 0.3.
#[test]
fn joint_law_of_three_tokens_with_auto_ending_chains_by_confidence() {
    let (c, _, draft) = models();
    let drafter = DraftModelDrafter::<B>::new(draft, c.vocab_size, DraftLength::Auto { max: 3 })
        .unwrap()
        .with_fixed_costs(0.05, 0.3);
    let drafter = check_with(SamplingConfig::with_temperature(1.0), drafter);
    let stopped = drafter.estimates().chains_stopped;
    assert!(stopped > 0, "the confidence rule never ended a chain");
}

#[test]
fn joint_law_of_three_tokens_at_temperature_07_top_p_09() {
    check(
        SamplingConfig::with_temperature(0.7).top_p(0.9),
        DraftLength::Fixed(2),
    );
}
