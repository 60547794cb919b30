//! Self-distillation on a tiny random-weight model: the recorded hidden rows are the target's
//! own (a teacher-forced pass over the same tokens gives them), the tokens are plain
//! decoding's, and the cache gives back the same set without generating.

// Test helpers outside #[test] functions unwrap too; a failure there is a test failure.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use burn::backend::Flex;
use spec_core::sampling::SamplingConfig;
use spec_runtime::{
    Architecture, ForwardRequest, GenerateOptions, LogitRows, ModelConfig, RandomSource,
    Transformer, generate_plain,
};
use spec_train::data::{
    CacheKey, DistillCache, DistillSettings, Prompt, PromptEncoder, PromptSplit, Result,
    distill_sequence, distill_set,
};

type B = Flex;

const HIDDEN: usize = 32;
const VOCAB: usize = 61;

fn model() -> Transformer<B> {
    let config = ModelConfig {
        architecture: Architecture::Llama,
        vocab_size: VOCAB,
        hidden_size: HIDDEN,
        intermediate_size: 64,
        num_layers: 2,
        num_heads: 4,
        num_kv_heads: 2,
        head_dim: 8,
        rms_norm_eps: 1e-6,
        rope_theta: 10_000.0,
        max_position_embeddings: 256,
        tie_word_embeddings: true,
        qkv_bias: false,
    };
    let mut source = RandomSource::new(config.clone(), 11);
    Transformer::load(&config, &mut source, &Default::default()).unwrap()
}

const PROMPT: [u32; 6] = [3, 41, 17, 8, 29, 5];

/// The target's last-layer states after its final norm, by a teacher-forced pass over
/// `tokens` in one go: row `p` is position `p`.
fn teacher_forced(target: &Transformer<B>, tokens: &[u32]) -> Vec<f32> {
    let mut cache = target.new_cache(tokens.len());
    let out = target
        .forward(
            ForwardRequest::tokens(tokens).logits(LogitRows::None),
            &mut cache,
        )
        .unwrap();
    target
        .norm
        .forward(out.last_hidden)
        .into_data()
        .to_vec()
        .unwrap()
}

#[test]
fn hidden_rows_are_the_targets_and_tokens_are_plain_greedy_decoding() {
    let target = model();
    let settings = DistillSettings {
        max_prompt_tokens: 64,
        max_new_tokens: 40,
        sampling: SamplingConfig::greedy(),
    };
    let plain = generate_plain(
        &target,
        &PROMPT,
        &GenerateOptions::new(40, SamplingConfig::greedy()),
        &mut |_| {},
    )
    .unwrap();
    let sequence = distill_sequence(&target, &PROMPT, &settings, &[]).unwrap();
    assert_eq!(sequence.answer_start, PROMPT.len());
    assert_eq!(sequence.tokens[..PROMPT.len()], PROMPT);
    assert_eq!(sequence.answer(), plain.tokens);
    let answer = sequence.answer().len();
    assert_eq!(sequence.hidden.len(), answer * HIDDEN);

    let reference = teacher_forced(&target, &sequence.tokens[..sequence.tokens.len() - 1]);
    let mut worst = 0f32;
    for i in 0..answer {
        let position = sequence.answer_start - 1 + i;
        let want = &reference[position * HIDDEN..(position + 1) * HIDDEN];
        for (a, b) in sequence.hidden_row(i, HIDDEN).iter().zip(want) {
            worst = worst.max((a - b).abs() / (1.0 + b.abs()));
        }
    }
    println!("{answer} answer tokens, largest relative difference {worst:e}");
    assert!(worst < 1e-4, "largest relative difference {worst}");

    // A stop token ends the answer and is not kept: the engine hands over no state for it.
    let stop = plain.tokens[5];
    let first_stop = plain.tokens.iter().position(|&t| t == stop).unwrap();
    let stopped = distill_sequence(&target, &PROMPT, &settings, &[stop]).unwrap();
    assert_eq!(stopped.answer(), &plain.tokens[..first_stop]);
    assert_eq!(stopped.hidden[..], sequence.hidden[..first_stop * HIDDEN]);
}

#[test]
fn sampled_answers_follow_the_seed() {
    let target = model();
    let settings = DistillSettings {
        max_prompt_tokens: 64,
        max_new_tokens: 24,
        sampling: SamplingConfig::with_temperature(0.9).seed(4),
    };
    let a = distill_sequence(&target, &PROMPT, &settings, &[]).unwrap();
    let b = distill_sequence(&target, &PROMPT, &settings, &[]).unwrap();
    assert_eq!(a, b);
    let mut options = GenerateOptions::new(24, settings.sampling);
    options.stop_tokens.clear();
    let plain = generate_plain(&target, &PROMPT, &options, &mut |_| {}).unwrap();
    assert_eq!(a.answer(), plain.tokens);
}

/// Bytes of the text, as tokens of the toy vocabulary.
struct ToyEncoder {
    stop: Vec<u32>,
}

impl PromptEncoder for ToyEncoder {
    fn encode_prompt(&self, text: &str, max_tokens: usize) -> Result<Vec<u32>> {
        Ok(text
            .bytes()
            .map(|b| u32::from(b) % VOCAB as u32)
            .take(max_tokens)
            .collect())
    }

    fn stop_tokens(&self) -> &[u32] {
        &self.stop
    }
}

fn split(n: usize) -> PromptSplit {
    let prompt = |i: usize| Prompt {
        id: format!("toy:{i}"),
        text: format!("toy prompt {i}: {}", "x".repeat(i)),
    };
    PromptSplit {
        train: (0..n - 1).map(prompt).collect(),
        held_out: vec![prompt(n - 1)],
    }
}

#[test]
fn the_cache_continues_an_interrupted_run_and_a_second_run_generates_nothing() {
    let target = model();
    let root = tempfile::tempdir().unwrap();
    let key = CacheKey {
        model: "random-11".into(),
        source: "toy".into(),
        settings: DistillSettings {
            max_prompt_tokens: 12,
            max_new_tokens: 10,
            sampling: SamplingConfig::greedy(),
        },
    };
    let encoder = ToyEncoder { stop: vec![] };
    let open = || {
        DistillCache::open_for(root.path(), key.clone(), &target)
            .unwrap()
            .with_shard_sequences(2)
    };

    // A run over 3 of the 5 prompts (as if stopped there): the next run makes only the rest.
    let mut partial = split(5);
    partial.train.truncate(3);
    partial.held_out.clear();
    let mut cache = open();
    let first = distill_set(&target, &encoder, &partial, &mut cache, &mut |_| {}).unwrap();
    assert_eq!(first.sequences.len(), 3);
    assert_eq!(cache.len(), 3);
    drop(cache);

    let full = split(5);
    let mut seen = Vec::new();
    let mut cache = open();
    let set = distill_set(&target, &encoder, &full, &mut cache, &mut |p| seen.push(p)).unwrap();
    assert_eq!(seen.iter().filter(|p| p.cached).count(), 3);
    assert_eq!(seen.last().unwrap().sequence, 5);
    assert_eq!(set.sequences.len(), 5);
    assert_eq!(set.train().count(), 4);
    assert_eq!(set.held_out().count(), 1);
    assert_eq!((set.hidden_size, set.vocab_size), (HIDDEN, VOCAB));
    for (s, p) in set
        .sequences
        .iter()
        .zip(full.train.iter().chain(&full.held_out))
    {
        let prompt = encoder.encode_prompt(&p.text, 12).unwrap();
        assert_eq!(s.tokens[..s.answer_start], prompt);
        assert_eq!(s.hidden.len(), s.answer().len() * HIDDEN);
    }

    // A second run reads everything and generates nothing: the same set.
    let mut again = Vec::new();
    let mut cache = open();
    let second = distill_set(&target, &encoder, &full, &mut cache, &mut |p| again.push(p)).unwrap();
    assert!(again.iter().all(|p| p.cached && p.generated_tokens == 0));
    assert_eq!(second, set);

    // The stored states are the f16 rounding of the generated ones.
    let fresh = distill_sequence(
        &target,
        &set.sequences[0].tokens[..set.sequences[0].answer_start],
        &key.settings,
        &[],
    )
    .unwrap();
    for (a, b) in fresh.hidden.iter().zip(&set.sequences[0].hidden) {
        assert!((a - b).abs() <= 1e-3 * (1.0 + a.abs()), "{a} {b}");
    }
}
