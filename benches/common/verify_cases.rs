//! The verification steps that `verify.rs` (criterion) and `examples/step_timings.rs` (by hand)
//! time: K = 5 drafts over the reference models' vocabulary sizes (SmolLM2: 49,152; Qwen2.5:
//! 151,936), on flex, greedy, sampled at temperature 1, and sampled with top-p 0.9.

use burn::backend::Flex;
use burn::tensor::{Tensor, TensorData};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use spec_core::error::Source;
use spec_core::rng::SpecRng;
use spec_core::sampling::{self, SamplingConfig};
use spec_core::verify::{Proposal, Verifier};

type B = Flex;

/// Drafts a step.
const K: usize = 5;

/// Logits shaped like a language model's: a broad background with a few strong candidates.
fn lm_logits(rng: &mut ChaCha8Rng, rows: usize, vocab: usize) -> Vec<f32> {
    let mut out = Vec::with_capacity(rows * vocab);
    for _ in 0..rows {
        let start = out.len();
        out.extend((0..vocab).map(|_| rng.random_range(-4.0f32..4.0)));
        for _ in 0..8 {
            let at = start + rng.random_range(0..vocab);
            out[at] += rng.random_range(6.0f32..12.0);
        }
    }
    out
}

fn tensor(values: Vec<f32>, rows: usize, vocab: usize) -> Tensor<B, 2> {
    Tensor::from_data(TensorData::new(values, [rows, vocab]), &Default::default())
}

/// One step's inputs under one sampling setting.
pub(crate) struct Case {
    /// The setting's name: `greedy`, `t1`, `t0.7_top_p0.9`.
    pub(crate) name: &'static str,
    pub(crate) vocab: usize,
    config: SamplingConfig,
    verifier: Verifier,
    /// The target's logits, `K + 1` rows.
    target: Vec<f32>,
    /// The draft's logits, `K` rows.
    draft: Vec<f32>,
    q: Tensor<B, 2>,
    drafted: Vec<u32>,
    rng: SpecRng,
}

impl Case {
    /// Whether the draft's side of the step ([`Case::draft_probabilities`]) does any work
    /// worth timing: greedy drafts need no distribution.
    pub(crate) fn samples(&self) -> bool {
        !self.config.is_greedy()
    }

    /// One verification of the chain, the target's logits turned into a tensor first.
    pub(crate) fn verify(&mut self) {
        let logits = tensor(self.target.clone(), K + 1, self.vocab);
        self.verifier
            .verify_chain(
                &self.drafted,
                logits,
                Proposal::Sampled(self.q.clone()),
                &mut self.rng,
            )
            .expect("valid step");
    }

    /// The draft's K rows turned into distributions under the setting, as a drafter does
    /// once a step.
    pub(crate) fn draft_probabilities(&self) {
        let q = sampling::probabilities(tensor(self.draft.clone(), K, self.vocab), &self.config)
            .expect("valid settings");
        // Force the computation: flex is eager, but read one value back anyway.
        let _ = q.narrow(1, 0, 1).into_data();
    }
}

/// Every case, by vocabulary size and then by setting.
pub(crate) fn cases() -> Vec<Case> {
    let settings = [
        ("greedy", SamplingConfig::greedy()),
        ("t1", SamplingConfig::with_temperature(1.0)),
        (
            "t0.7_top_p0.9",
            SamplingConfig::with_temperature(0.7).top_p(0.9),
        ),
    ];
    let mut cases = Vec::new();
    for vocab in [49_152usize, 151_936] {
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        let target = lm_logits(&mut rng, K + 1, vocab);
        // The draft: the target's logits plus noise, so some drafts are accepted.
        let draft: Vec<f32> = target[..K * vocab]
            .iter()
            .map(|x| x + rng.random_range(-1.0f32..1.0))
            .collect();
        for (name, config) in settings {
            let verifier = Verifier::new(config).expect("valid settings");
            let q = sampling::probabilities(tensor(draft.clone(), K, vocab), &config)
                .expect("valid settings");
            let mut rng = SpecRng::new(3);
            let drafted = sampling::sample_probabilities(q.clone(), &mut rng, Source::Draft)
                .expect("finite draft");
            cases.push(Case {
                name,
                vocab,
                config,
                verifier,
                target: target.clone(),
                draft: draft.clone(),
                q,
                drafted,
                rng,
            });
        }
    }
    cases
}
