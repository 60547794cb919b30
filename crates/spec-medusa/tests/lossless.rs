//! Medusa trees on small random models: greedy output equals plain decoding token for token
//! whatever the heads and whatever their draft vocabulary, and sampled output follows the
//! target's law (a total-variation bound over many seeded generations).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;

use burn::backend::Flex;
use burn::module::Param;
use burn::tensor::{Distribution, Tensor};
use spec_core::sampling::SamplingConfig;
use spec_engine::generate_speculative;
use spec_medusa::{DraftVocab, MedusaDrafter, MedusaHeads, MedusaSettings, TreeMode};
use spec_runtime::{
    Architecture, ForwardRequest, GenerateOptions, LogitRows, ModelConfig, RandomSource,
    Transformer, generate_plain,
};

type B = Flex;

const HIDDEN: usize = 32;

fn model(vocab: usize, layers: usize, seed: u64) -> Transformer<B> {
    let c = ModelConfig {
        architecture: Architecture::Qwen2,
        vocab_size: vocab,
        hidden_size: HIDDEN,
        intermediate_size: 64,
        num_layers: layers,
        num_heads: 4,
        num_kv_heads: 2,
        head_dim: 8,
        rms_norm_eps: 1e-6,
        rope_theta: 10_000.0,
        max_position_embeddings: 256,
        tie_word_embeddings: true,
        qkv_bias: true,
    };
    let mut source = RandomSource::new(c.clone(), seed);
    Transformer::load(&c, &mut source, &Default::default()).unwrap()
}

/// Heads with random residual blocks (new heads are the identity, which would only repeat the
/// target's next-token guess), sharing the target's head or with projections of their own
/// (over `vocab`'s rows where given).
fn random_heads(
    target: &Transformer<B>,
    heads: usize,
    own: bool,
    vocab: Option<&DraftVocab>,
) -> MedusaHeads<B> {
    let device = Default::default();
    let rows = |weight: Tensor<B, 2>| match vocab {
        Some(v) => v.rows(weight),
        None => weight,
    };
    let own = own.then(|| rows(target.output_weight().unwrap()));
    let mut h = MedusaHeads::<B>::new(heads, HIDDEN, own, &device);
    for block in &mut h.blocks {
        block.linear.weight = Param::from_tensor(Tensor::random(
            [HIDDEN, HIDDEN],
            Distribution::Normal(0.0, 0.5),
            &device,
        ));
    }
    h
}

const PROMPT: [u32; 6] = [4, 19, 7, 33, 4, 19];

#[test]
fn greedy_medusa_equals_plain_decoding() {
    let target = model(61, 2, 1);
    let options = GenerateOptions::new(40, SamplingConfig::greedy());
    let plain = generate_plain(&target, &PROMPT, &options, &mut |_| {}).unwrap();
    let static_tree = MedusaSettings {
        tree: TreeMode::Static,
        max_nodes: 12,
        top: 3,
    };
    let accuracy = vec![vec![0.6, 0.2, 0.1]; 4];
    // Every third token and the ones the plain output uses, so that drafts can be accepted.
    let mut ids: Vec<u32> = (0..61).step_by(3).collect();
    ids.extend(&plain.tokens);
    ids.sort_unstable();
    ids.dedup();
    let vocab = DraftVocab::new(ids, 61).unwrap();
    #[derive(Clone, Copy)]
    enum Vocab {
        Whole,
        /// The draft vocabulary's rows taken from the target's head.
        Rows,
        /// The whole head's logits, the draft vocabulary's columns picked.
        Picked,
    }
    for (what, own, settings, draft) in [
        (
            "shared head, auto",
            false,
            MedusaSettings::default(),
            Vocab::Whole,
        ),
        (
            "shared head, static",
            false,
            static_tree.clone(),
            Vocab::Whole,
        ),
        (
            "own projections, static",
            true,
            static_tree.clone(),
            Vocab::Whole,
        ),
        (
            "draft vocabulary, rows, auto",
            false,
            MedusaSettings::default(),
            Vocab::Rows,
        ),
        (
            "draft vocabulary, picked, static",
            false,
            static_tree.clone(),
            Vocab::Picked,
        ),
        (
            "draft vocabulary, own projections",
            true,
            static_tree.clone(),
            Vocab::Rows,
        ),
    ] {
        let subset = (!matches!(draft, Vocab::Whole)).then_some(&vocab);
        let heads = random_heads(&target, 4, own, subset);
        let mut drafter = MedusaDrafter::new(heads, accuracy.clone(), settings).unwrap();
        drafter = match draft {
            Vocab::Whole => drafter,
            Vocab::Rows => drafter
                .with_draft_vocab(vocab.clone(), target.output_weight())
                .unwrap(),
            Vocab::Picked => drafter.with_draft_vocab(vocab.clone(), None).unwrap(),
        };
        let spec =
            generate_speculative(&target, &mut drafter, &PROMPT, &options, &mut |_| {}).unwrap();
        assert_eq!(spec.tokens, plain.tokens, "{what}");
        assert!(spec.metrics.drafted > 0, "{what}: nothing drafted");
        println!(
            "{what}: {} drafted, {} accepted over {} steps",
            spec.metrics.drafted, spec.metrics.accepted, spec.metrics.steps
        );
    }
}

#[test]
fn bad_settings_are_refused() {
    let target = model(61, 2, 1);
    let heads = random_heads(&target, 2, true, None);
    let narrow = DraftVocab::new(vec![1, 2, 3], 61).unwrap();
    let drafter = MedusaDrafter::new(heads, Vec::new(), MedusaSettings::default()).unwrap();
    let error = drafter.with_draft_vocab(narrow, None).unwrap_err();
    assert!(
        error
            .to_string()
            .contains("project to 61 tokens, the draft vocabulary has 3"),
        "{error}"
    );
    let heads = random_heads(&target, 2, false, None);
    let beyond = DraftVocab::new(vec![1, 70], 80).unwrap();
    let drafter = MedusaDrafter::new(heads, Vec::new(), MedusaSettings::default()).unwrap();
    let error = drafter
        .with_draft_vocab(beyond, target.output_weight())
        .unwrap_err();
    assert!(
        error.to_string().contains("beyond the target's 61"),
        "{error}"
    );
    let heads = random_heads(&target, 2, false, None);
    let settings = MedusaSettings {
        top: 0,
        ..MedusaSettings::default()
    };
    let error = MedusaDrafter::new(heads, Vec::new(), settings).unwrap_err();
    assert!(error.to_string().contains("at least 1"), "{error}");
}

/// The exact law of the first three generated tokens under `sampling`.
fn three_token_law(
    target: &Transformer<B>,
    prompt: &[u32],
    sampling: &SamplingConfig,
) -> HashMap<Vec<u32>, f64> {
    let probs = |context: &[u32]| -> Vec<f64> {
        let mut cache = target.new_cache(64);
        let logits = target
            .forward(
                ForwardRequest::tokens(context).logits(LogitRows::Last),
                &mut cache,
            )
            .unwrap()
            .logits
            .unwrap();
        let row: Vec<f64> = logits.into_data().iter::<f64>().collect();
        spec_core::reference::probabilities(&row, sampling, spec_core::error::Source::Target, 0)
            .unwrap()
    };
    let mut law: HashMap<Vec<u32>, f64> = HashMap::from([(Vec::new(), 1.0)]);
    for _ in 0..3 {
        let mut next = HashMap::new();
        for (tokens, p) in law {
            let mut context = prompt.to_vec();
            context.extend(&tokens);
            for (t, &q) in probs(&context).iter().enumerate() {
                if q > 0.0 {
                    let mut longer = tokens.clone();
                    longer.push(t as u32);
                    next.insert(longer, p * q);
                }
            }
        }
        law = next;
    }
    law
}

#[test]
fn sampled_medusa_follows_the_targets_law() {
    // A tiny vocabulary, so that 40,000 generations pin the law of three tokens down. The first
    // step has no hidden state yet (a plain step); the second drafts the second and third
    // tokens from the heads (depths 1 and 2 under the first; a fourth token is generated so
    // that the step may draft two deep).
    let vocab = 5;
    let prompt = [1, 4, 2, 1, 4];
    // The first random model whose law at temperature 1 is spread (most are nearly
    // deterministic at this size), so that the test can tell a wrong rule from a right one.
    let target = (0..64)
        .map(|seed| model(vocab, 1, seed))
        .find(|m| {
            let law = three_token_law(m, &prompt, &SamplingConfig::with_temperature(1.0));
            law.values().copied().fold(0.0, f64::max) < 0.3
        })
        .expect("a random model with a spread law");
    // The second case drafts from three of the five tokens only.
    let three = DraftVocab::new(vec![0, 2, 3], vocab).unwrap();
    for (sampling, draft_vocab) in [
        (SamplingConfig::with_temperature(1.0), None),
        (SamplingConfig::with_temperature(0.8).top_k(3), Some(three)),
    ] {
        let law = three_token_law(&target, &prompt, &sampling);
        let runs = 40_000;
        let mut counts: HashMap<Vec<u32>, u64> = HashMap::new();
        let mut drafter = MedusaDrafter::new(
            random_heads(&target, 3, false, None),
            vec![vec![0.5, 0.3]; 3],
            MedusaSettings {
                tree: TreeMode::Static,
                max_nodes: 6,
                top: 2,
            },
        )
        .unwrap();
        if let Some(v) = draft_vocab {
            drafter = drafter.with_draft_vocab(v, target.output_weight()).unwrap();
        }
        let mut drafted = 0;
        for seed in 0..runs {
            let options = GenerateOptions::new(4, sampling.seed(seed));
            let spec = generate_speculative(&target, &mut drafter, &prompt, &options, &mut |_| {})
                .unwrap();
            drafted += spec.metrics.drafted;
            *counts.entry(spec.tokens[..3].to_vec()).or_default() += 1;
        }
        assert!(drafted > runs, "{drafted} drafted over {runs} runs");
        let (tv, bound) = spec_core::reference::empirical_tv(&law, &counts, runs);
        assert!(tv < bound, "{sampling:?}: TV {tv:.4} ≥ bound {bound:.4}");
        // A law spread over many cells, or the test could not tell a wrong rule from a right one.
        let largest = law.values().copied().fold(0.0, f64::max);
        assert!(
            largest < 0.5,
            "{sampling:?}: a cell of probability {largest}"
        );
        println!(
            "{sampling:?}: TV {tv:.4} < {bound:.4} over {} cells (largest {largest:.3}), {drafted} drafted",
            law.len()
        );
    }
}
