//! The cases of `benches/verify.rs`, timed by hand: minimum, first quartile and median of `n`
//! runs each. On a machine shared with other work the minimum is the figure least disturbed by
//! it, so A/B comparisons of the verification step are best made with this.
//!
//! Run: `cargo run --release -p spec-benches --example step_timings -- [filter] [runs]`, e.g.
//! `-- top_p 60` for the top-p cases only.

// A failure in a test or measurement helper is a failure of the run.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Instant;

use burn::backend::Flex;
use burn::tensor::{Tensor, TensorData};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use spec_core::error::Source;
use spec_core::rng::SpecRng;
use spec_core::sampling::{self, SamplingConfig};
use spec_core::verify::{Proposal, Verifier};

type B = Flex;
const K: usize = 5;

/// As in `benches/verify.rs`: a broad background with a few strong candidates.
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

fn time(name: &str, runs: usize, mut f: impl FnMut()) {
    for _ in 0..3 {
        f();
    }
    let mut ms: Vec<f64> = (0..runs)
        .map(|_| {
            let start = Instant::now();
            f();
            start.elapsed().as_secs_f64() * 1e3
        })
        .collect();
    ms.sort_by(f64::total_cmp);
    println!(
        "{name:45} min {:8.3}  q1 {:8.3}  median {:8.3} ms",
        ms[0],
        ms[runs / 4],
        ms[runs / 2]
    );
}

fn main() {
    let filter = std::env::args().nth(1).unwrap_or_default();
    let runs: usize = std::env::args()
        .nth(2)
        .and_then(|s| s.parse().ok())
        .unwrap_or(40)
        .max(1);
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
            let label = format!("verify/{name}/{vocab}");
            if label.contains(&filter) {
                time(&label, runs, || {
                    let logits = tensor(target.clone(), K + 1, vocab);
                    verifier
                        .verify_chain(
                            &drafted,
                            logits,
                            Proposal::Sampled(q.clone()),
                            &mut spec_rng,
                        )
                        .expect("valid step");
                });
            }
            let label = format!("draft_probabilities/{name}/{vocab}");
            if name != "greedy" && label.contains(&filter) {
                time(&label, runs, || {
                    let q = sampling::probabilities(
                        tensor(draft[..K * vocab].to_vec(), K, vocab),
                        &config,
                    )
                    .expect("valid settings");
                    let _ = q.narrow(1, 0, 1).into_data();
                });
            }
        }
    }
}
