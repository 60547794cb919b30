//! Both n-gram drafters through the speculative loop: greedy output equals plain decoding (tiny
//! random models, and SmolLM2-135M when cached), sampled output follows the target's law (a
//! statistical test against exact enumeration), and bad input gives clear errors.

#![allow(clippy::unwrap_used)] // tests: a failure should panic with its message

use std::collections::HashMap;

use burn::backend::Flex;
use burn::tensor::{Tensor, TensorData};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use spec_core::error::Source;
use spec_core::metrics::Metrics;
use spec_core::reference;
use spec_core::rng::SpecRng;
use spec_core::sampling::SamplingConfig;
use spec_core::verify::Verifier;
use spec_engine::{Draft, DraftRequest, Drafter, StepOutcome, generate_speculative};
use spec_ngram::{
    BigramConfig, BigramCounts, BigramDrafter, BigramModel, NgramError, PromptLookup,
    PromptLookupConfig,
};
use spec_runtime::model::{ForwardRequest, LogitRows};
use spec_runtime::{
    Architecture, GenerateOptions, ModelConfig, RandomSource, Transformer, generate_plain,
};

type B = Flex;

fn tiny(vocab: usize, seed: u64, max_positions: usize) -> Transformer<B> {
    let config = ModelConfig {
        architecture: Architecture::Llama,
        vocab_size: vocab,
        hidden_size: 32,
        intermediate_size: 64,
        num_layers: 2,
        num_heads: 4,
        num_kv_heads: 2,
        head_dim: 8,
        rms_norm_eps: 1e-6,
        rope_theta: 10_000.0,
        max_position_embeddings: max_positions,
        tie_word_embeddings: false,
        qkv_bias: false,
    };
    let mut source = RandomSource::new(config.clone(), seed);
    Transformer::load(&config, &mut source, &Default::default()).unwrap()
}

fn lookup(k: usize, ngram_max: usize, ngram_min: usize) -> PromptLookup {
    PromptLookup::new(PromptLookupConfig {
        k,
        ngram_max,
        ngram_min,
        adaptive: false,
        history_tokens: 0,
    })
    .unwrap()
}

/// Prompt lookup with the adaptive length (`--k auto`).
fn adaptive_lookup() -> PromptLookup {
    PromptLookup::new(PromptLookupConfig::adaptive()).unwrap()
}

/// A bigram model of `vocab` tokens counted over seeded random sequences that favour `+1` steps.
fn toy_bigram(vocab: usize, seed: u64) -> BigramModel {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut counts = BigramCounts::new(vocab).unwrap();
    for _ in 0..50 {
        let mut t = rng.random_range(0..vocab as u32);
        let mut seq = vec![t];
        for _ in 0..20 {
            t = if rng.random_bool(0.6) {
                (t + 1) % vocab as u32
            } else {
                rng.random_range(0..vocab as u32)
            };
            seq.push(t);
        }
        counts.add_sequence(&seq).unwrap();
    }
    counts.finish()
}

#[test]
fn greedy_equals_plain_on_a_tiny_model() {
    let vocab = 97;
    let m = tiny(vocab, 5, 256);
    let device = Default::default();
    let prompts: [&[u32]; 3] = [
        &[5, 61, 17, 88, 5, 61, 17, 88, 5, 61],
        &[1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 3, 4, 9],
        &[40, 41, 42, 40, 41],
    ];
    let options = GenerateOptions::new(60, SamplingConfig::greedy());
    let mut lookup_accepted = 0;
    for prompt in prompts {
        let plain = generate_plain(&m, prompt, &options, &mut |_| {}).unwrap();
        for (k, ngram_max, ngram_min) in [(5, 3, 1), (2, 2, 2), (8, 4, 1)] {
            let mut drafter = lookup(k, ngram_max, ngram_min);
            let spec =
                generate_speculative(&m, &mut drafter, prompt, &options, &mut |_| {}).unwrap();
            assert_eq!(
                spec.tokens, plain.tokens,
                "lookup k={k} n={ngram_min}..{ngram_max}"
            );
            lookup_accepted += spec.metrics.accepted;
            assert!(
                spec.metrics.drafted > 0,
                "lookups never fired on {prompt:?}"
            );
        }
        let mut drafter = adaptive_lookup();
        let spec = generate_speculative(&m, &mut drafter, prompt, &options, &mut |_| {}).unwrap();
        assert_eq!(spec.tokens, plain.tokens, "adaptive lookup");
        for k in [1, 3] {
            let mut drafter = BigramDrafter::<B>::new(
                toy_bigram(vocab, 1),
                vocab,
                BigramConfig::fixed(k),
                &device,
            )
            .unwrap();
            let spec =
                generate_speculative(&m, &mut drafter, prompt, &options, &mut |_| {}).unwrap();
            assert_eq!(spec.tokens, plain.tokens, "bigram k={k}");
            assert!(spec.metrics.drafted > 0);
        }
        let mut drafter = BigramDrafter::<B>::new(
            toy_bigram(vocab, 1),
            vocab,
            BigramConfig::adaptive(),
            &device,
        )
        .unwrap();
        let spec = generate_speculative(&m, &mut drafter, prompt, &options, &mut |_| {}).unwrap();
        assert_eq!(spec.tokens, plain.tokens, "adaptive bigram");
    }
    // The random model falls into loops, which prompt lookup must exploit.
    assert!(lookup_accepted > 0);
}

/// The target's logits for every prefix, computed once per prefix with a full forward.
struct Oracle {
    model: Transformer<B>,
    vocab: usize,
    logits: HashMap<Vec<u32>, Vec<f32>>,
}

impl Oracle {
    fn logits(&mut self, prefix: &[u32]) -> Vec<f32> {
        if let Some(row) = self.logits.get(prefix) {
            return row.clone();
        }
        let mut cache = self.model.new_cache(prefix.len() + 1);
        let out = self
            .model
            .forward(
                ForwardRequest::tokens(prefix).logits(LogitRows::Last),
                &mut cache,
            )
            .unwrap();
        let row: Vec<f32> = out.logits.unwrap().into_data().to_vec().unwrap();
        self.logits.insert(prefix.to_vec(), row.clone());
        row
    }

    /// The exact law of `length` tokens after `prompt` under `sampling`.
    fn exact(&mut self, prompt: &[u32], length: usize, sampling: &SamplingConfig) -> Vec<f64> {
        let vocab = self.vocab;
        let mut law = vec![1.0];
        let mut prefixes = vec![prompt.to_vec()];
        for _ in 0..length {
            let mut next_law = Vec::with_capacity(law.len() * vocab);
            let mut next_prefixes = Vec::with_capacity(law.len() * vocab);
            for (mass, prefix) in law.iter().zip(&prefixes) {
                let logits: Vec<f64> = self.logits(prefix).iter().map(|&x| f64::from(x)).collect();
                let p = reference::probabilities(&logits, sampling, Source::Target, 0).unwrap();
                for (t, pt) in p.iter().enumerate() {
                    next_law.push(mass * pt);
                    let mut longer = prefix.clone();
                    longer.push(t as u32);
                    next_prefixes.push(longer);
                }
            }
            law = next_law;
            prefixes = next_prefixes;
        }
        law
    }
}

/// `generate_speculative`'s loop for `length` tokens, with the target's logits from the oracle
/// (so 100,000 runs need no model calls beyond the few hundred distinct prefixes).
fn run_once(
    oracle: &mut Oracle,
    drafter: &mut dyn Drafter<B>,
    verifier: &Verifier,
    prompt: &[u32],
    length: usize,
    seed: u64,
) -> Vec<u32> {
    let sampling = *verifier.config();
    let vocab = oracle.vocab;
    let mut rng = SpecRng::new(seed);
    drafter.begin(prompt).unwrap();
    let mut context = prompt.to_vec();
    let mut produced = Vec::new();
    while produced.len() < length {
        let remaining = length - produced.len();
        let draft = drafter
            .draft(DraftRequest::new(
                &context,
                remaining - 1,
                &sampling,
                &mut rng,
            ))
            .unwrap();
        let tree = &draft.tree;
        // The drafters make chains: node i's prefix is the context and the first i drafts.
        let mut rows = Vec::with_capacity(tree.len() * vocab);
        for i in 0..tree.len() {
            let mut prefix = context.clone();
            prefix.extend(&tree.tokens()[1..=i]);
            rows.extend(oracle.logits(&prefix));
        }
        let logits = Tensor::<B, 2>::from_data(
            TensorData::new(rows, [tree.len(), vocab]),
            &Default::default(),
        );
        let verdict = verifier
            .verify_tree(tree, logits, draft.proposal.clone(), &mut rng)
            .unwrap();
        let mut new = verdict.tokens(tree);
        new.truncate(remaining);
        produced.extend(&new);
        context.extend(&new);
        drafter
            .accepted(&context, &StepOutcome::new(draft.tree, verdict, 0.0))
            .unwrap();
    }
    produced
}

/// 99.9% bound on the TV distance of an n-sample empirical law from `law` (the derivation is in
/// `crates/spec-core/tests/statistical.rs`): ½ Σ √(p(1−p)/n) + √(ln(1000) / (2n)).
fn tv_bound(law: &[f64], n: usize) -> f64 {
    let n = n as f64;
    0.5 * law.iter().map(|p| (p * (1.0 - p) / n).sqrt()).sum::<f64>()
        + ((1000.0f64).ln() / (2.0 * n)).sqrt()
}

fn check_law(
    name: &str,
    oracle: &mut Oracle,
    drafter: &mut dyn Drafter<B>,
    prompt: &[u32],
    sampling: SamplingConfig,
    runs: usize,
) {
    const LENGTH: usize = 3;
    let vocab = oracle.vocab;
    let verifier = Verifier::new(sampling).unwrap();
    let law = oracle.exact(prompt, LENGTH, &sampling);
    let mut counts = vec![0usize; law.len()];
    for seed in 0..runs as u64 {
        let tokens = run_once(oracle, drafter, &verifier, prompt, LENGTH, seed);
        let cell = tokens.iter().fold(0, |acc, &t| acc * vocab + t as usize);
        counts[cell] += 1;
    }
    let tv = 0.5
        * law
            .iter()
            .zip(&counts)
            .map(|(p, &c)| (p - c as f64 / runs as f64).abs())
            .sum::<f64>();
    let bound = tv_bound(&law, runs);
    println!("{name}: TV {tv:.5} (bound {bound:.5}) over {runs} runs");
    assert!(tv < bound, "{name}: TV {tv} ≥ bound {bound}");
}

#[test]
fn sampled_output_follows_the_target_law() {
    const VOCAB: usize = 12;
    let runs: usize = std::env::var("SPEC_NGRAM_STAT_RUNS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(100_000);
    let mut oracle = Oracle {
        model: tiny(VOCAB, 9, 64),
        vocab: VOCAB,
        logits: HashMap::new(),
    };
    // The oracle loop is the engine's: on a few seeds they agree token for token.
    let prompt = [1u32, 2, 3, 1, 2, 3, 1, 2];
    let sampling = SamplingConfig::with_temperature(1.0).top_p(0.95);
    for seed in 0..5 {
        let s = sampling.seed(seed);
        let mut a = lookup(2, 3, 1);
        let mut b = lookup(2, 3, 1);
        let options = GenerateOptions::new(3, s);
        let engine =
            generate_speculative(&oracle.model, &mut a, &prompt, &options, &mut |_| {}).unwrap();
        let verifier = Verifier::new(s).unwrap();
        assert_eq!(
            engine.tokens,
            run_once(&mut oracle, &mut b, &verifier, &prompt, 3, seed)
        );
    }

    let mut drafter = lookup(2, 3, 1);
    check_law(
        "prompt lookup",
        &mut oracle,
        &mut drafter,
        &prompt,
        sampling,
        runs,
    );

    // The adaptive length: the choice depends on earlier steps (and on timings), never on the
    // step's own draws.
    let mut drafter = PromptLookup::new(PromptLookupConfig {
        k: 2,
        ngram_max: 3,
        ngram_min: 1,
        adaptive: true,
        history_tokens: 0,
    })
    .unwrap();
    check_law(
        "adaptive prompt lookup",
        &mut oracle,
        &mut drafter,
        &prompt,
        sampling,
        runs,
    );

    let sampling = SamplingConfig::with_temperature(0.8).top_k(9);
    let device = Default::default();
    let mut drafter =
        BigramDrafter::<B>::new(toy_bigram(VOCAB, 4), VOCAB, BigramConfig::fixed(2), &device)
            .unwrap();
    check_law("bigram", &mut oracle, &mut drafter, &[3, 4], sampling, runs);

    // The adaptive length decides on each draft from its row's confidence before drawing it.
    // Counted, so the test shows that it both drafted and stopped early. Fixed costs: the
    // oracle's steps take microseconds, so measured ones would say drafting never pays.
    let mut drafter = LengthCount::new(
        BigramDrafter::<B>::new(
            toy_bigram(VOCAB, 4),
            VOCAB,
            BigramConfig {
                k: 2,
                adaptive: true,
            },
            &device,
        )
        .unwrap()
        .with_fixed_costs(0.05, 0.0),
    );
    check_law(
        "adaptive bigram",
        &mut oracle,
        &mut drafter,
        &[3, 4],
        sampling,
        runs,
    );
    println!("adaptive bigram draft lengths: {:?}", drafter.by_length);
    let steps: usize = drafter.by_length.iter().sum();
    for (k, &n) in drafter.by_length.iter().enumerate() {
        assert!(n * 100 >= steps, "draft length {k} in {n} of {steps} steps");
    }
}

/// A drafter wrapped to count its steps by draft length.
struct LengthCount<D> {
    inner: D,
    by_length: Vec<usize>,
}

impl<D> LengthCount<D> {
    fn new(inner: D) -> Self {
        Self {
            inner,
            by_length: Vec::new(),
        }
    }
}

impl<D: Drafter<B>> Drafter<B> for LengthCount<D> {
    fn name(&self) -> &str {
        self.inner.name()
    }

    fn begin(&mut self, prompt: &[u32]) -> spec_engine::Result<()> {
        self.inner.begin(prompt)
    }

    fn draft(&mut self, request: DraftRequest<'_, B>) -> spec_engine::Result<Draft<B>> {
        let draft = self.inner.draft(request)?;
        let k = draft.tree.drafted();
        if self.by_length.len() <= k {
            self.by_length.resize(k + 1, 0);
        }
        self.by_length[k] += 1;
        Ok(draft)
    }

    fn accepted(&mut self, context: &[u32], outcome: &StepOutcome<B>) -> spec_engine::Result<()> {
        self.inner.accepted(context, outcome)
    }
}

#[test]
fn bad_input_is_a_clear_error() {
    let device = Default::default();
    let err = BigramDrafter::<B>::new(toy_bigram(12, 1), 13, BigramConfig::fixed(2), &device)
        .unwrap_err();
    assert!(matches!(
        err,
        NgramError::VocabMismatch {
            model: 12,
            target: 13
        }
    ));
    assert!(err.to_string().contains("train-bigram"), "{err}");
    let err = BigramDrafter::<B>::new(toy_bigram(12, 1), 12, BigramConfig::fixed(0), &device)
        .unwrap_err();
    assert!(matches!(err, NgramError::InvalidK(0)), "{err}");

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("model.bigram");
    toy_bigram(12, 1).save(&path).unwrap();
    assert_eq!(BigramModel::load(&path).unwrap().vocab_size(), 12);
    let mut bytes = std::fs::read(&path).unwrap();
    bytes.truncate(bytes.len() - 1);
    std::fs::write(&path, &bytes).unwrap();
    let err = BigramModel::load(&path).unwrap_err();
    assert!(matches!(err, NgramError::Corrupt { .. }), "{err}");
    assert!(err.to_string().contains("model.bigram"), "{err}");
    let err = BigramModel::load(&dir.path().join("missing")).unwrap_err();
    assert!(matches!(err, NgramError::Io { .. }), "{err}");
}

#[test]
fn greedy_equals_plain_on_smollm2() {
    let Ok(dir) = spec_models::models_dir() else {
        return skip("no model cache directory");
    };
    let path = dir.join("smollm2-135m.gguf");
    if !path.exists() {
        return skip(&format!("{} is not cached", path.display()));
    }
    let device = Default::default();
    let loaded = spec_runtime::load::load_model::<B>(&path, &device).unwrap();
    let tokenizer = spec_tokenizer::TextTokenizer::from_gguf_path(&path).unwrap();
    let vocab = loaded.config.vocab_size;
    let texts = [
        "Repeat this sentence exactly, then translate it: The quick brown fox jumps over the lazy dog. The quick brown fox",
        "fn add(a: i32, b: i32) -> i32 { a + b }\n// Rewrite add as sub:\nfn sub(a: i32, b: i32) -> i32 {",
    ];
    // A bigram model counted over the prompts themselves: enough to draft, and exactness does
    // not depend on its quality.
    let mut counts = BigramCounts::new(vocab).unwrap();
    for text in texts {
        counts
            .add_sequence(&tokenizer.encode(text, false).unwrap())
            .unwrap();
    }
    let bigram = counts.finish();
    let options = GenerateOptions::new(32, SamplingConfig::greedy());
    // Drafts proposed and accepted by each drafter over both prompts: exactness alone would also
    // hold for a drafter that never drafts.
    let mut drafts: HashMap<String, (u64, u64)> = HashMap::new();
    let mut record = |name: String, metrics: &Metrics| {
        let (drafted, accepted) = drafts.entry(name).or_default();
        *drafted += metrics.drafted;
        *accepted += metrics.accepted;
    };
    for text in texts {
        let prompt = tokenizer.encode(text, true).unwrap();
        let plain = generate_plain(&loaded.model, &prompt, &options, &mut |_| {}).unwrap();
        let mut lookup = lookup(4, 3, 1);
        let spec = generate_speculative(&loaded.model, &mut lookup, &prompt, &options, &mut |_| {})
            .unwrap();
        assert_eq!(spec.tokens, plain.tokens, "prompt lookup on {text:?}");
        record("prompt lookup".into(), &spec.metrics);
        let mut adaptive = adaptive_lookup();
        let spec =
            generate_speculative(&loaded.model, &mut adaptive, &prompt, &options, &mut |_| {})
                .unwrap();
        assert_eq!(
            spec.tokens, plain.tokens,
            "adaptive prompt lookup on {text:?}"
        );
        record("adaptive prompt lookup".into(), &spec.metrics);
        for config in [BigramConfig::fixed(2), BigramConfig::adaptive()] {
            let mut drafter =
                BigramDrafter::<B>::new(bigram.clone(), vocab, config, &device).unwrap();
            let spec =
                generate_speculative(&loaded.model, &mut drafter, &prompt, &options, &mut |_| {})
                    .unwrap();
            assert_eq!(spec.tokens, plain.tokens, "bigram {config:?} on {text:?}");
            record(format!("bigram {config:?}"), &spec.metrics);
        }
    }
    assert_eq!(drafts.len(), 4, "{drafts:?}");
    for (name, (drafted, accepted)) in &drafts {
        assert!(
            *drafted > 0 && *accepted > 0,
            "{name}: {drafted} drafted, {accepted} accepted"
        );
    }
}

fn skip(why: &str) {
    assert!(
        std::env::var("SPEC_REQUIRE_MODELS").as_deref() != Ok("1"),
        "SPEC_REQUIRE_MODELS=1 but {why}"
    );
    println!("skipped: {why}");
}
