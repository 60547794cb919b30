//! Self-distillation on a tiny random-weight model: the recorded hidden rows are the target's
//! own (a teacher-forced pass over the same tokens gives them), the tokens are plain
//! decoding's, and the cache gives back the same set without generating. Teacher forcing of
//! the dataset's replies gives the same rows as the target's own answer where the reply is
//! that answer.

// Test helpers outside #[test] functions unwrap too; a failure there is a test failure.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use burn::backend::Flex;
use spec_core::sampling::SamplingConfig;
use spec_runtime::{
    Architecture, ForwardRequest, GenerateOptions, LogitRows, ModelConfig, RandomSource,
    Transformer, generate_plain,
};
use spec_train::data::{
    AnswerSource, CacheKey, DistillCache, DistillSettings, Prompt, PromptEncoder, PromptSplit,
    Result, distill_sequence, distill_set, teacher_forced_sequence,
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
        ..DistillSettings::default()
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
        ..DistillSettings::default()
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

    fn encode_reply(&self, text: &str) -> Result<Vec<u32>> {
        Ok(text.bytes().map(|b| u32::from(b) % VOCAB as u32).collect())
    }

    fn stop_tokens(&self) -> &[u32] {
        &self.stop
    }
}

fn split(n: usize) -> PromptSplit {
    let prompt = |i: usize| Prompt {
        id: format!("toy:{i}"),
        text: format!("toy prompt {i}: {}", "x".repeat(i)),
        reply: None,
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
            ..DistillSettings::default()
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

/// The largest difference of `a` and `b`, relative to `1 + |b|`.
fn largest_difference(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs() / (1.0 + y.abs()))
        .fold(0.0, f32::max)
}

#[test]
fn teacher_forcing_the_targets_own_answer_gives_its_hidden_rows() {
    let target = model();
    let settings = DistillSettings {
        max_prompt_tokens: 64,
        max_new_tokens: 40,
        ..DistillSettings::default()
    };
    let own = distill_sequence(&target, &PROMPT, &settings, &[]).unwrap();
    assert_eq!(own.answer().len(), 40);
    let forced = teacher_forced_sequence(&target, &PROMPT, own.answer(), &settings).unwrap();
    assert_eq!(forced.tokens, own.tokens);
    assert_eq!(forced.answer_start, own.answer_start);
    // The same host path as the engine's steps, whose rows do not depend on the other rows
    // of a pass: the same bits.
    let worst = largest_difference(&forced.hidden, &own.hidden);
    assert!(
        forced.hidden == own.hidden,
        "largest relative difference {worst}"
    );

    // Cut to max_new_tokens: the first rows.
    let short = DistillSettings {
        max_new_tokens: 7,
        ..settings.clone()
    };
    let cut = teacher_forced_sequence(&target, &PROMPT, own.answer(), &short).unwrap();
    assert_eq!(cut.answer(), &own.answer()[..7]);
    assert!(largest_difference(&cut.hidden, &own.hidden[..7 * HIDDEN]) < 1e-4);

    // Cut to the context (256 positions): a 250-token prompt leaves room for 6.
    let long: Vec<u32> = (0..250).map(|i| (i * 13 + 5) % VOCAB as u32).collect();
    let cut = teacher_forced_sequence(&target, &long, own.answer(), &settings).unwrap();
    assert_eq!(cut.answer(), &own.answer()[..6]);
    assert_eq!(cut.hidden.len(), 6 * HIDDEN);

    // An empty reply: an empty answer. A one-token prompt works; an empty one does not.
    let empty = teacher_forced_sequence(&target, &PROMPT, &[], &settings).unwrap();
    assert!(empty.answer().is_empty() && empty.hidden.is_empty());
    let one = distill_sequence(&target, &PROMPT[..1], &settings, &[]).unwrap();
    let forced = teacher_forced_sequence(&target, &PROMPT[..1], one.answer(), &settings).unwrap();
    assert_eq!(forced.tokens, one.tokens);
    assert!(largest_difference(&forced.hidden, &one.hidden) < 1e-4);
    assert!(teacher_forced_sequence(&target, &[], &[1], &settings).is_err());
}

#[test]
fn dataset_answers_skip_prompts_without_a_reply_and_come_back_from_the_cache() {
    let target = model();
    let root = tempfile::tempdir().unwrap();
    let settings = DistillSettings {
        max_prompt_tokens: 12,
        max_new_tokens: 10,
        answers: AnswerSource::Dataset,
        ..DistillSettings::default()
    };
    let key = CacheKey {
        model: "random-11".into(),
        source: "toy".into(),
        settings: settings.clone(),
    };
    let encoder = ToyEncoder { stop: vec![] };
    let mut split = split(5);
    // Replies on prompts 0, 2 (longer than max_new_tokens) and the held-out 4.
    split.train[0].reply = Some("short reply".into());
    split.train[2].reply = Some("a reply longer than ten tokens".into());
    split.held_out[0].reply = Some("held".into());

    let mut seen = Vec::new();
    let mut cache = DistillCache::open_for(root.path(), key.clone(), &target).unwrap();
    let set = distill_set(&target, &encoder, &split, &mut cache, &mut |p| seen.push(p)).unwrap();
    let last = seen.last().unwrap();
    assert_eq!((last.sequence, last.of, last.skipped), (5, 5, 2));
    assert_eq!(last.generated_tokens, 10 + 10 + 4);
    assert_eq!(set.sequences.len(), 3);
    assert_eq!(set.held_out().count(), 1);
    for (s, p) in set
        .sequences
        .iter()
        .zip([&split.train[0], &split.train[2], &split.held_out[0]])
    {
        let prompt = encoder.encode_prompt(&p.text, 12).unwrap();
        let reply = encoder.encode_reply(p.reply.as_ref().unwrap()).unwrap();
        assert_eq!(s.tokens[..s.answer_start], prompt);
        assert_eq!(s.answer(), &reply[..reply.len().min(10)]);
        let fresh = teacher_forced_sequence(&target, &prompt, &reply, &settings).unwrap();
        // The cache keeps f16.
        for (a, b) in fresh.hidden.iter().zip(&s.hidden) {
            assert!((a - b).abs() <= 1e-3 * (1.0 + a.abs()), "{a} {b}");
        }
    }
    drop(cache);

    // A second run reads all three and teacher-forces nothing.
    let mut again = Vec::new();
    let mut cache = DistillCache::open_for(root.path(), key.clone(), &target).unwrap();
    let second = distill_set(&target, &encoder, &split, &mut cache, &mut |p| {
        again.push(p)
    })
    .unwrap();
    assert_eq!(second, set);
    assert_eq!(again.iter().filter(|p| p.cached).count(), 3);
    assert_eq!(again.last().unwrap().generated_tokens, 0);

    // The target's own answers live in another folder.
    let mut target_key = key;
    target_key.settings.answers = AnswerSource::Target;
    let other = DistillCache::open_for(root.path(), target_key, &target).unwrap();
    assert!(other.is_empty());
    assert_ne!(other.dir(), cache.dir());
}
