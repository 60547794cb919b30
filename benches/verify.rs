//! One verification step with K = 5 drafts over the reference models' vocabulary sizes
//! (SmolLM2: 49,152; Qwen2.5: 151,936), on flex: greedy, sampled at temperature 1, and sampled
//! with top-p 0.9 (the target's top-p processing is part of the step). Also the draft side's
//! processing of K rows with top-p, which a drafter pays once per step.
//!
//! Run: `cargo bench -p spec-benches --bench verify`.

use burn::backend::Flex;
use burn::tensor::{Tensor, TensorData};
use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use spec_core::error::Source;
use spec_core::rng::SpecRng;
use spec_core::sampling::{self, SamplingConfig};
use spec_core::verify::{Proposal, Verifier};

type B = Flex;
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

fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("verify_chain_k5");
    group.sample_size(30);
    let settings = [
        ("greedy", SamplingConfig::greedy()),
        ("t1", SamplingConfig::with_temperature(1.0)),
        (
            "t0.7_top_p0.9",
            SamplingConfig::with_temperature(0.7).top_p(0.9),
        ),
    ];
    for vocab in [49_152usize, 151_936] {
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        let target = lm_logits(&mut rng, K + 1, vocab);
        // The draft: the target's logits plus noise, so some drafts are accepted.
        let draft: Vec<f32> = target
            .iter()
            .map(|x| x + rng.random_range(-1.0f32..1.0))
            .collect();
        for (name, config) in settings {
            let verifier = Verifier::new(config).expect("valid settings");
            let q = sampling::probabilities(tensor(draft[..K * vocab].to_vec(), K, vocab), &config)
                .expect("valid settings");
            let mut spec_rng = SpecRng::new(3);
            let drafted = sampling::sample_probabilities(q.clone(), &mut spec_rng, Source::Draft)
                .expect("finite draft");
            group.bench_with_input(BenchmarkId::new(name, vocab), &vocab, |b, &vocab| {
                b.iter(|| {
                    let logits = tensor(target.clone(), K + 1, vocab);
                    verifier
                        .verify_chain(
                            &drafted,
                            logits,
                            Proposal::Sampled(q.clone()),
                            &mut spec_rng,
                        )
                        .expect("valid step")
                })
            });
            if name != "greedy" {
                group.bench_with_input(
                    BenchmarkId::new(format!("draft_probabilities/{name}"), vocab),
                    &vocab,
                    |b, &vocab| {
                        b.iter(|| {
                            let q = sampling::probabilities(
                                tensor(draft[..K * vocab].to_vec(), K, vocab),
                                &config,
                            )
                            .expect("valid settings");
                            // Force the computation: flex is eager, but read one value back anyway.
                            q.narrow(1, 0, 1).into_data()
                        })
                    },
                );
            }
        }
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
