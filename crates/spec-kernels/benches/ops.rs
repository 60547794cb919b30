//! The rest of a decode step's layer: attention over a KV cache and SwiGLU, SIMD against the
//! portable loops, at the reference models' head shapes.
//!
//! `cargo bench -p spec-kernels --bench ops` (name filter as usual, e.g. `-- attention/smollm2`).
//! Caches and inputs stay in the CPU caches between iterations, so these are compute figures;
//! in a real step each layer's keys and values come from memory.

// A failure in a measurement helper is a failure of the run.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use spec_kernels::{AttentionShape, Isa, attention_with, swiglu_with};

#[path = "common/models.rs"]
mod models;

use models::ReferenceModel;

/// The models whose attention and SwiGLU shapes are timed.
const MODELS: [&str; 2] = ["smollm2-135m", "qwen2.5-coder-1.5b"];

fn reference(name: &str) -> &'static ReferenceModel {
    ReferenceModel::by_name(name).expect("a reference model")
}

fn random(n: usize, seed: u64) -> Vec<f32> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    (0..n).map(|_| rng.random_range(-1.0f32..1.0)).collect()
}

fn isa_name(isa: Isa) -> &'static str {
    match isa {
        Isa::Auto => "simd",
        Isa::Avx2 => "avx2",
        Isa::Scalar => "portable",
    }
}

fn ops(c: &mut Criterion) {
    let mut group = c.benchmark_group("attention");
    for model in MODELS {
        let m = reference(model);
        let (heads, kv_heads, d) = (m.heads, m.kv_heads, m.head_dim);
        // A decode step and a K = 4 verification after 128 cached tokens; a decode step and a
        // K = 1 verification (a self-draft's pass) after 250; one row after 512; one, two and
        // five after 1024 (a long prompt: a kv head's keys and values together outgrow L2).
        for (rows, cached) in [
            (1, 128),
            (5, 128),
            (1, 250),
            (2, 250),
            (1, 512),
            (1, 1024),
            (2, 1024),
            (5, 1024),
        ] {
            let total = cached + rows;
            let shape = AttentionShape {
                rows,
                heads,
                kv_heads,
                head_dim: d,
                capacity: total,
                total,
            };
            let q = random(rows * heads * d, 1);
            let keys = random(kv_heads * total * d, 2);
            let values = random(kv_heads * total * d, 3);
            let mut bias = vec![0.0f32; rows * total];
            for i in 0..rows {
                bias[i * total + cached + i + 1..(i + 1) * total].fill(f32::NEG_INFINITY);
            }
            for isa in [Isa::Auto, Isa::Scalar] {
                let id = format!("{model}/{}/rows{rows}-cached{cached}", isa_name(isa));
                group.bench_function(BenchmarkId::from_parameter(id), |b| {
                    b.iter(|| {
                        attention_with(&q, heads * d, &keys, &values, shape, &bias, isa).unwrap()
                    })
                });
            }
        }
    }
    group.finish();

    let mut group = c.benchmark_group("swiglu");
    // One row (a decode step) and nine (a verification of K = 8), which splits over threads.
    for model in MODELS {
        let ff = reference(model).intermediate;
        for rows in [1, 9] {
            let gate_up = random(rows * 2 * ff, 4);
            for isa in [Isa::Auto, Isa::Scalar] {
                let id = format!("{model}/{rows}/{}", isa_name(isa));
                group.bench_function(BenchmarkId::from_parameter(id), |b| {
                    b.iter(|| swiglu_with(&gate_up, ff, isa))
                });
            }
        }
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    targets = ops
}
criterion_main!(benches);
