//! One verification step with K = 5 drafts over the reference models' vocabulary sizes
//! (SmolLM2: 49,152; Qwen2.5: 151,936), on flex: greedy, sampled at temperature 1, and sampled
//! with top-p 0.9 (the target's top-p processing is part of the step). Also the draft side's
//! processing of K rows with top-p, which a drafter pays once per step. The cases are
//! `common/verify_cases.rs`'s.
//!
//! Run: `cargo bench -p spec-benches --bench verify`.

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};

#[path = "common/verify_cases.rs"]
mod verify_cases;

fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("verify_chain_k5");
    group.sample_size(30);
    for mut case in verify_cases::cases() {
        let (name, vocab) = (case.name, case.vocab);
        group.bench_function(BenchmarkId::new(name, vocab), |b| b.iter(|| case.verify()));
        if case.samples() {
            group.bench_function(
                BenchmarkId::new(format!("draft_probabilities/{name}"), vocab),
                |b| b.iter(|| case.draft_probabilities()),
            );
        }
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
