//! What the engine lends a drafter and what it hands back: drafting with the target's own
//! layers on its own cache (early exit), the step's outcome with the rows a drafter asked for,
//! and step times that leave the caller's work out.

// Test helpers outside #[test] functions unwrap too; a failure there is a test failure.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use burn::backend::Flex;
use burn::tensor::{Tensor, activation::softmax};
use spec_core::error::Source;
use spec_core::sampling::{SamplingConfig, sample_logits};
use spec_core::tree::TokenTree;
use spec_core::verify::Proposal;
use spec_engine::{
    Draft, DraftRequest, Drafter, NoDraft, Result, StepNeeds, StepOutcome, generate_speculative,
};
use spec_runtime::{
    Architecture, ForwardRequest, GenerateOptions, LogitRows, ModelConfig, RandomSource,
    Transformer, generate_plain,
};

type B = Flex;

fn model(layers: usize) -> Transformer<B> {
    let config = ModelConfig {
        architecture: Architecture::Llama,
        vocab_size: 61,
        hidden_size: 32,
        intermediate_size: 64,
        num_layers: layers,
        num_heads: 4,
        num_kv_heads: 2,
        head_dim: 8,
        rms_norm_eps: 1e-6,
        rope_theta: 10_000.0,
        max_position_embeddings: 256,
        tie_word_embeddings: true,
        qkv_bias: false,
    };
    let mut source = RandomSource::new(config.clone(), 7);
    Transformer::load(&config, &mut source, &Default::default()).unwrap()
}

const PROMPT: [u32; 5] = [3, 41, 17, 8, 29];

/// A toy early-exit drafter: runs the root and each drafted token through the target's first
/// `exit_after` layers on the target's own cache, and drafts the argmax of the target's output
/// head applied there (LayerSkip's self-speculation without its training).
struct EarlyExit {
    exit_after: usize,
    k: usize,
    drafted: usize,
    /// The deepest the target's first layer's cache went during a draft, past its base.
    appended: usize,
}

impl Drafter<B> for EarlyExit {
    fn name(&self) -> &str {
        "early-exit-toy"
    }

    fn begin(&mut self, _prompt: &[u32]) -> Result<()> {
        Ok(())
    }

    fn draft(&mut self, mut request: DraftRequest<'_, B>) -> Result<Draft<B>> {
        let root = request.root()?;
        let k = self.k.min(request.max_depth);
        let greedy = SamplingConfig::greedy();
        let mut rng = greedy.rng();
        let target = request.target()?;
        let mut drafted = Vec::with_capacity(k);
        let mut next = [root];
        for _ in 0..k {
            let out = target.forward(
                ForwardRequest::tokens(&next)
                    .layers(0..self.exit_after)
                    .logits(LogitRows::None),
            )?;
            let logits = target.model().logits(out.last_hidden)?;
            next = [sample_logits(logits, &greedy, &mut rng, Source::Draft)?[0]];
            drafted.push(next[0]);
        }
        self.appended = self.appended.max(target.layer_len(0) - target.base());
        self.drafted += drafted.len();
        Ok(Draft {
            tree: TokenTree::chain(root, &drafted),
            proposal: Proposal::Deterministic,
            draft_forwards: drafted.len(),
        })
    }

    fn accepted(&mut self, _context: &[u32], _outcome: &StepOutcome<B>) -> Result<()> {
        Ok(())
    }
}

#[test]
fn an_early_exit_drafter_on_the_targets_own_cache_is_lossless() {
    let m = model(3);
    let options = GenerateOptions::new(40, SamplingConfig::greedy());
    let plain = generate_plain(&m, &PROMPT, &options, &mut |_| {}).unwrap();
    for k in [1, 3, 6] {
        let mut drafter = EarlyExit {
            exit_after: 1,
            k,
            drafted: 0,
            appended: 0,
        };
        let spec = generate_speculative(&m, &mut drafter, &PROMPT, &options, &mut |_| {}).unwrap();
        assert_eq!(spec.tokens, plain.tokens, "k {k}");
        // It drafted, with the target's first layer, on the target's cache, and the engine
        // took those entries back before each verification.
        assert!(spec.metrics.drafted > 0, "k {k}");
        assert!(spec.metrics.accepted > 0, "k {k}");
        assert_eq!(drafter.drafted as u64, spec.metrics.drafted);
        assert_eq!(drafter.appended, k, "k {k}");
        println!(
            "early exit after 1 of 3 layers, k {k}: {} of {} drafts accepted",
            spec.metrics.accepted, spec.metrics.drafted
        );
    }
}

/// Runs whole forward passes of junk on the target's cache and proposes nothing.
struct Vandal;

impl Drafter<B> for Vandal {
    fn name(&self) -> &str {
        "vandal"
    }

    fn begin(&mut self, _prompt: &[u32]) -> Result<()> {
        Ok(())
    }

    fn draft(&mut self, mut request: DraftRequest<'_, B>) -> Result<Draft<B>> {
        let root = request.root()?;
        let target = request.target()?;
        target.forward(ForwardRequest::tokens(&[1, 2, 3]).logits(LogitRows::None))?;
        // Truncating below the context is refused: the view clamps to its base.
        target.truncate_layers(0..1, 0);
        assert_eq!(target.layer_len(0), target.base());
        Ok(Draft::none(root))
    }

    fn accepted(&mut self, _context: &[u32], _outcome: &StepOutcome<B>) -> Result<()> {
        Ok(())
    }
}

#[test]
fn what_a_drafter_writes_to_the_targets_cache_never_reaches_the_verification() {
    let m = model(2);
    for sampling in [
        SamplingConfig::greedy(),
        SamplingConfig::with_temperature(0.8).seed(5),
    ] {
        let options = GenerateOptions::new(24, sampling);
        let plain = generate_plain(&m, &PROMPT, &options, &mut |_| {}).unwrap();
        let spec = generate_speculative(&m, &mut Vandal, &PROMPT, &options, &mut |_| {}).unwrap();
        assert_eq!(spec.tokens, plain.tokens, "{sampling:?}");
    }
}

/// Drafts the plain continuation (every draft right) and keeps each outcome.
struct Recording {
    script: Vec<u32>,
    prompt_len: usize,
    needs: StepNeeds,
    /// (context length before the step, outcome)
    outcomes: Vec<(usize, StepOutcome<B>)>,
    drafting_at: usize,
}

impl Drafter<B> for Recording {
    fn name(&self) -> &str {
        "recording"
    }

    fn needs(&self) -> StepNeeds {
        self.needs
    }

    fn begin(&mut self, prompt: &[u32]) -> Result<()> {
        self.prompt_len = prompt.len();
        Ok(())
    }

    fn draft(&mut self, request: DraftRequest<'_, B>) -> Result<Draft<B>> {
        let done = request.context.len() - self.prompt_len;
        self.drafting_at = request.context.len();
        let end = (done + 3)
            .min(self.script.len())
            .min(done + request.max_depth);
        let tokens = &self.script[done.min(end)..end];
        Ok(Draft {
            tree: TokenTree::chain(request.root()?, tokens),
            proposal: Proposal::Deterministic,
            draft_forwards: 0,
        })
    }

    fn accepted(&mut self, _context: &[u32], outcome: &StepOutcome<B>) -> Result<()> {
        self.outcomes.push((self.drafting_at, outcome.clone()));
        Ok(())
    }
}

fn rows(t: &Tensor<B, 2>) -> Vec<Vec<f32>> {
    let [n, width] = t.dims();
    let data: Vec<f32> = t.clone().into_data().to_vec().unwrap();
    (0..n)
        .map(|i| data[i * width..(i + 1) * width].to_vec())
        .collect()
}

#[test]
fn the_outcome_holds_the_rows_of_the_accepted_path_only_when_asked() {
    let m = model(2);
    let options = GenerateOptions::new(12, SamplingConfig::greedy());
    let plain = generate_plain(&m, &PROMPT, &options, &mut |_| {}).unwrap();
    let mut drafter = Recording {
        script: plain.tokens.clone(),
        prompt_len: 0,
        needs: StepNeeds {
            hidden: true,
            target_probs: true,
        },
        outcomes: Vec::new(),
        drafting_at: 0,
    };
    let spec = generate_speculative(&m, &mut drafter, &PROMPT, &options, &mut |_| {}).unwrap();
    assert_eq!(spec.tokens, plain.tokens);
    assert!(spec.metrics.accepted > 0);

    // The same rows from one fresh pass over the whole sequence.
    let mut sequence = PROMPT.to_vec();
    sequence.extend(&plain.tokens);
    let mut cache = m.new_cache(64);
    let out = m
        .forward(
            ForwardRequest::tokens(&sequence).logits(LogitRows::All),
            &mut cache,
        )
        .unwrap();
    let hidden = rows(&m.norm.forward(out.last_hidden));
    let probs = rows(&softmax(out.logits.unwrap(), 1));
    let close = |a: &[f32], b: &[f32]| a.iter().zip(b).all(|(x, y)| (x - y).abs() < 1e-4);
    for (at, outcome) in &drafter.outcomes {
        let h = rows(
            outcome
                .hidden
                .as_ref()
                .expect("hidden states were asked for"),
        );
        let p = rows(
            outcome
                .target_probs
                .as_ref()
                .expect("distributions were asked for"),
        );
        assert_eq!(h.len(), outcome.accepted() + 1);
        assert_eq!(p.len(), outcome.accepted() + 1);
        // Row i is the sequence's row at the root's position plus i.
        for i in 0..h.len() {
            assert!(close(&h[i], &hidden[at - 1 + i]), "hidden row {i} at {at}");
            assert!(
                close(&p[i], &probs[at - 1 + i]),
                "probability row {i} at {at}"
            );
        }
    }

    // Nothing is handed over to a drafter that did not ask.
    drafter.needs = StepNeeds::NONE;
    drafter.outcomes.clear();
    generate_speculative(&m, &mut drafter, &PROMPT, &options, &mut |_| {}).unwrap();
    assert!(!drafter.outcomes.is_empty());
    assert!(
        drafter
            .outcomes
            .iter()
            .all(|(_, o)| o.hidden.is_none() && o.target_probs.is_none())
    );
}

/// Plain decoding that keeps each step's measured time.
struct StepTimes(Vec<f64>);

impl Drafter<B> for StepTimes {
    fn name(&self) -> &str {
        "step-times"
    }

    fn begin(&mut self, _prompt: &[u32]) -> Result<()> {
        Ok(())
    }

    fn draft(&mut self, request: DraftRequest<'_, B>) -> Result<Draft<B>> {
        Drafter::<B>::draft(&mut NoDraft, request)
    }

    fn accepted(&mut self, _context: &[u32], outcome: &StepOutcome<B>) -> Result<()> {
        self.0.push(outcome.seconds);
        Ok(())
    }
}

#[test]
fn a_steps_time_leaves_out_what_the_caller_does_with_its_tokens() {
    let m = model(2);
    let options = GenerateOptions::new(6, SamplingConfig::greedy());
    let pause = std::time::Duration::from_millis(60);
    let mut times = StepTimes(Vec::new());
    let spec = generate_speculative(&m, &mut times, &PROMPT, &options, &mut |_| {
        std::thread::sleep(pause)
    })
    .unwrap();
    assert_eq!(times.0.len(), 6);
    // A step of this tiny model takes well under a millisecond; the caller's pause is not in it.
    assert!(
        times.0.iter().all(|&s| s > 0.0 && s < pause.as_secs_f64()),
        "{:?}",
        times.0
    );
    assert!(spec.step_seconds < pause.as_secs_f64());
}
