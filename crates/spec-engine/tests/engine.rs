//! The loop with scripted drafters on a small random model: whatever is drafted (right, wrong,
//! chains, trees), greedy output equals plain decoding, and with no drafts sampled output equals
//! plain sampling token for token.

// Test helpers outside #[test] functions unwrap too; a failure there is a test failure.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::needless_range_loop)]

use burn::backend::Flex;
use spec_core::sampling::SamplingConfig;
use spec_core::tree::TokenTree;
use spec_core::verify::Proposal;
use spec_engine::{
    Draft, DraftRequest, Drafter, NoDraft, Result, StepOutcome, generate_speculative,
};
use spec_runtime::{
    Architecture, GenerateOptions, ModelConfig, RandomSource, Transformer, generate_plain,
};

type B = Flex;

fn model() -> Transformer<B> {
    let config = ModelConfig {
        architecture: Architecture::Qwen2,
        vocab_size: 97,
        hidden_size: 32,
        intermediate_size: 64,
        num_layers: 2,
        num_heads: 4,
        num_kv_heads: 2,
        head_dim: 8,
        rms_norm_eps: 1e-6,
        rope_theta: 10_000.0,
        max_position_embeddings: 128,
        tie_word_embeddings: false,
        qkv_bias: true,
    };
    let mut source = RandomSource::new(config.clone(), 3);
    Transformer::load(&config, &mut source, &Default::default()).unwrap()
}

const PROMPT: [u32; 4] = [5, 61, 17, 88];

/// Drafts from a known continuation, corrupting every `corrupt_every`-th drafted token; with
/// `branch`, adds a sibling with a wrong token at every level (a tree).
struct Scripted {
    script: Vec<u32>,
    prompt_len: usize,
    k: usize,
    corrupt_every: usize,
    branch: bool,
    drafted: usize,
}

impl Drafter<B> for Scripted {
    fn name(&self) -> &str {
        "scripted"
    }
    fn begin(&mut self, prompt: &[u32]) -> Result<()> {
        self.prompt_len = prompt.len();
        Ok(())
    }
    fn draft(&mut self, request: DraftRequest<'_, B>) -> Result<Draft<B>> {
        let (context, max_depth) = (request.context, request.max_depth);
        let done = context.len() - self.prompt_len;
        let mut tree = TokenTree::new(*context.last().unwrap());
        let mut parent = 0;
        for i in 0..self.k.min(max_depth) {
            let Some(&right) = self.script.get(done + i) else {
                break;
            };
            self.drafted += 1;
            let wrong = (right + 1) % 97;
            let token = if self.drafted.is_multiple_of(self.corrupt_every) {
                wrong
            } else {
                right
            };
            if self.branch {
                // The sibling goes first, so the walk must reject it and move on.
                let other = if token == right { wrong } else { right };
                tree.push(parent, other).unwrap();
            }
            parent = tree.push(parent, token).unwrap();
        }
        Ok(Draft {
            tree,
            proposal: Proposal::Deterministic,
            draft_forwards: 0,
        })
    }
    fn accepted(&mut self, _context: &[u32], _outcome: &StepOutcome<B>) -> Result<()> {
        Ok(())
    }
}

#[test]
fn greedy_output_equals_plain_whatever_is_drafted() {
    let m = model();
    let options = GenerateOptions::new(40, SamplingConfig::greedy());
    let plain = generate_plain(&m, &PROMPT, &options, &mut |_| {}).unwrap();
    for (k, corrupt_every, branch) in [(1, 2, false), (4, 3, false), (6, 1000, false), (3, 4, true)]
    {
        let mut drafter = Scripted {
            script: plain.tokens.clone(),
            prompt_len: 0,
            k,
            corrupt_every,
            branch,
            drafted: 0,
        };
        let spec = generate_speculative(&m, &mut drafter, &PROMPT, &options, &mut |_| {}).unwrap();
        assert_eq!(
            spec.tokens, plain.tokens,
            "k={k} corrupt_every={corrupt_every} branch={branch}"
        );
        let metrics = &spec.metrics;
        assert!(metrics.accepted > 0);
        assert_eq!(metrics.produced as usize, plain.tokens.len());
        // Fewer target forwards than tokens, since drafts were accepted.
        assert!(metrics.target_forwards < plain.tokens.len() as u64);
        if corrupt_every == 1000 {
            // Nothing corrupted: every draft accepted.
            assert_eq!(metrics.accepted, metrics.drafted);
        } else if !branch {
            assert!(metrics.accepted < metrics.drafted);
        }
    }
}

#[test]
fn no_draft_equals_plain_decoding_sampled_and_greedy() {
    let m = model();
    for sampling in [
        SamplingConfig::greedy(),
        SamplingConfig::with_temperature(1.0).seed(11),
        SamplingConfig::with_temperature(0.7).top_p(0.9).seed(12),
    ] {
        let options = GenerateOptions::new(30, sampling);
        let plain = generate_plain(&m, &PROMPT, &options, &mut |_| {}).unwrap();
        let spec = generate_speculative(&m, &mut NoDraft, &PROMPT, &options, &mut |_| {}).unwrap();
        assert_eq!(spec.tokens, plain.tokens, "{sampling:?}");
        assert_eq!(spec.metrics.drafted, 0);
    }
}

#[test]
fn stop_tokens_and_limits() {
    let m = model();
    let options = GenerateOptions::new(12, SamplingConfig::greedy());
    let plain = generate_plain(&m, &PROMPT, &options, &mut |_| {}).unwrap();
    let mut drafter = Scripted {
        script: plain.tokens.clone(),
        prompt_len: 0,
        k: 5,
        corrupt_every: 1000,
        branch: false,
        drafted: 0,
    };
    // A stop token in the middle of an accepted draft ends the output right after it.
    let mut stop = options.clone();
    stop.stop_tokens = vec![plain.tokens[6]];
    let first = plain
        .tokens
        .iter()
        .position(|&t| t == plain.tokens[6])
        .unwrap();
    let mut streamed = Vec::new();
    let spec = generate_speculative(&m, &mut drafter, &PROMPT, &stop, &mut |t| {
        streamed.extend_from_slice(t)
    })
    .unwrap();
    assert_eq!(spec.tokens, plain.tokens[..=first]);
    assert_eq!(streamed, spec.tokens);

    // A prompt that does not fit is an error, not a panic.
    let mut small = options.clone();
    small.cache_capacity = Some(4);
    assert!(generate_speculative(&m, &mut NoDraft, &PROMPT, &small, &mut |_| {}).is_err());
    // Generation stops when the cache is full.
    small.cache_capacity = Some(8);
    let spec = generate_speculative(&m, &mut NoDraft, &PROMPT, &small, &mut |_| {}).unwrap();
    assert_eq!(spec.tokens, plain.tokens[..spec.tokens.len()]);
    assert!(spec.tokens.len() <= 5);
}

/// A [`Scripted`] drafter that reports one draft-model forward per drafted token.
struct Forwarding(Scripted);

impl Drafter<B> for Forwarding {
    fn name(&self) -> &str {
        "forwarding"
    }
    fn begin(&mut self, prompt: &[u32]) -> Result<()> {
        self.0.begin(prompt)
    }
    fn draft(&mut self, request: DraftRequest<'_, B>) -> Result<Draft<B>> {
        let mut draft = self.0.draft(request)?;
        draft.draft_forwards = draft.tree.drafted();
        Ok(draft)
    }
    fn accepted(&mut self, context: &[u32], outcome: &StepOutcome<B>) -> Result<()> {
        self.0.accepted(context, outcome)
    }
}

#[test]
fn step_and_draft_forward_times_are_parts_of_the_totals() {
    let m = model();
    let options = GenerateOptions::new(20, SamplingConfig::greedy());
    let plain = generate_speculative(&m, &mut NoDraft, &PROMPT, &options, &mut |_| {}).unwrap();
    // No draft model ran; the steps are the target's time without the prefill.
    assert_eq!(plain.draft_forward_seconds, 0.0);
    assert_eq!(plain.metrics.steps, 20);
    assert_eq!(plain.steps_by_width.len(), 1);
    assert_eq!(
        (plain.steps_by_width[0].width, plain.steps_by_width[0].steps),
        (1, 20)
    );
    assert!((plain.steps_by_width[0].seconds - plain.step_seconds).abs() < 1e-12);
    assert!(plain.step_seconds > 0.0 && plain.step_seconds < plain.target_seconds);

    let mut drafter = Forwarding(Scripted {
        script: plain.tokens.clone(),
        prompt_len: 0,
        k: 3,
        corrupt_every: 4,
        branch: false,
        drafted: 0,
    });
    let spec = generate_speculative(&m, &mut drafter, &PROMPT, &options, &mut |_| {}).unwrap();
    assert_eq!(spec.tokens, plain.tokens);
    assert_eq!(spec.metrics.draft_forwards, spec.metrics.drafted);
    assert!(spec.draft_forward_seconds > 0.0);
    assert!(spec.draft_forward_seconds <= spec.draft_seconds);
    assert!(spec.step_seconds > 0.0 && spec.step_seconds < spec.target_seconds);
    // Steps of every width add up to all the steps.
    let by_width: u64 = spec.steps_by_width.iter().map(|w| w.steps).sum();
    assert_eq!(by_width, spec.metrics.steps);
    assert!(
        spec.steps_by_width
            .windows(2)
            .all(|w| w[0].width < w[1].width)
    );

    // The decode counts leave out the first step's tokens: one in plain decoding, up to K + 1
    // (here 4, the script's first drafts all right) in a speculative one.
    assert_eq!(plain.stats.decode_tokens, 19);
    assert_eq!(spec.stats.decode_tokens, 20 - 4);
    for g in [&plain, &spec] {
        let decode_seconds = g.stats.wall_seconds - g.stats.prompt_seconds;
        let speed = g.stats.decode_tokens as f64 / decode_seconds;
        assert!((speed - g.stats.decode_tokens_per_second).abs() < 1e-9 * speed);
    }
}
