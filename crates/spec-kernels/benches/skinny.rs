//! `y[M, n] = x[M, k] · Wᵀ` for every projection shape of the reference models at M = 1…16: this
//! crate's kernel in each weight format, burn's flex matmul (the runtime's `Linear`), and the
//! `gemm` crate. Throughput is the bytes of weights each one reads (its own format's size). The
//! weights are random on 16 levels a block, as a 4-bit checkpoint's, so Q4 can hold them.
//!
//! `SKINNY_MODELS` (comma-separated; default `smollm2-135m`; also `qwen2.5-coder-0.5b`,
//! `qwen2.5-coder-1.5b`) and `SKINNY_ROWS` (default `1,2,4,8,16`) pick the cases; criterion's
//! name filter narrows further, e.g. `cargo bench -p spec-kernels --bench skinny -- head`.

// A failure in a test or measurement helper is a failure of the run.
#![allow(clippy::unwrap_used, clippy::expect_used)]
// The `gemm` crate's entry point is an `unsafe fn` over raw pointers; the comparison needs it,
// and only this benchmark calls it.
#![allow(unsafe_code)]

use std::time::Duration;

use burn::backend::Flex;
use burn::tensor::{Tensor, TensorData};
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use spec_kernels::{PackedMatrix, WeightFormat};

#[path = "common/models.rs"]
mod models;

use models::MODELS;

fn env_list(name: &str, default: &str) -> Vec<String> {
    std::env::var(name)
        .unwrap_or_else(|_| default.to_owned())
        .split(',')
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
        .collect()
}

/// `x · Wᵀ` with the `gemm` crate, `W` row-major `[n, k]` read in place as `Wᵀ` `[k, n]`.
fn gemm_product(x: &[f32], w: &[f32], y: &mut [f32], m: usize, n: usize, k: usize) {
    assert!(x.len() == m * k && w.len() == n * k && y.len() == m * n);
    // SAFETY: the lengths are checked above, and the strides stay inside them: dst [m, n]
    // row-major, lhs [m, k] row-major, rhs element (kk, j) at w[j * k + kk].
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            y.as_mut_ptr(),
            1,
            n as isize,
            false,
            x.as_ptr(),
            1,
            k as isize,
            w.as_ptr(),
            k as isize,
            1,
            0.0,
            1.0,
            false,
            false,
            false,
            gemm::Parallelism::Rayon(0),
        );
    }
}

/// Random weights `[n, k]` on 16 levels per block of 32 columns (`d · q − m`, as a 4-bit
/// checkpoint's), so that every format, Q4 included, can store them.
fn four_bit_weights(n: usize, k: usize, rng: &mut ChaCha8Rng) -> Vec<f32> {
    let mut w = Vec::with_capacity(n * k);
    for _ in 0..n {
        for block in (0..k).step_by(32) {
            let d = rng.random_range(1e-3f32..1e-2);
            for _ in block..(block + 32).min(k) {
                w.push(d * (f32::from(rng.random_range(0u8..16)) - 8.0));
            }
        }
    }
    w
}

fn skinny(c: &mut Criterion) {
    let models = env_list("SKINNY_MODELS", "smollm2-135m");
    let rows: Vec<usize> = env_list("SKINNY_ROWS", "1,2,4,8,16")
        .iter()
        .filter_map(|s| s.parse().ok())
        .collect();
    let device = Default::default();
    let mut rng = ChaCha8Rng::seed_from_u64(0);
    for reference in &MODELS {
        let model = reference.name;
        if !models.iter().any(|m| m == model) {
            continue;
        }
        for (proj, n, k) in reference.projection_shapes() {
            let weights = four_bit_weights(n, k, &mut rng);
            let packed: Vec<PackedMatrix> = WeightFormat::ALL
                .into_iter()
                .map(|f| PackedMatrix::pack(&weights, n, k, f).expect("finite weights"))
                .collect();
            let w_burn =
                Tensor::<Flex, 2>::from_data(TensorData::new(weights.clone(), [n, k]), &device);
            let mut group = c.benchmark_group(format!("{model}/{proj}_{n}x{k}"));
            group
                .sample_size(10)
                .warm_up_time(Duration::from_millis(300))
                .measurement_time(Duration::from_secs(1));
            for &m in &rows {
                let x: Vec<f32> = (0..m * k).map(|_| rng.random_range(-1.0f32..1.0)).collect();
                let mut y = vec![0.0f32; m * n];
                for mat in &packed {
                    group.throughput(Throughput::Bytes(mat.stored_bytes() as u64));
                    group.bench_with_input(
                        BenchmarkId::new(format!("kernel-{}", mat.format()), m),
                        &m,
                        |b, &m| b.iter(|| mat.matmul_into(&x, m, &mut y).expect("shapes")),
                    );
                }
                group.throughput(Throughput::Bytes((n * k * 4) as u64));
                let x_burn =
                    Tensor::<Flex, 2>::from_data(TensorData::new(x.clone(), [m, k]), &device);
                group.bench_with_input(BenchmarkId::new("burn-flex", m), &m, |b, _| {
                    b.iter(|| {
                        // Reading the result back forces the (lazy) product to run.
                        x_burn
                            .clone()
                            .matmul(w_burn.clone().transpose())
                            .into_data()
                    })
                });
                group.bench_with_input(BenchmarkId::new("gemm", m), &m, |b, &m| {
                    b.iter(|| gemm_product(&x, &weights, &mut y, m, n, k))
                });
            }
            group.finish();
        }
    }
}

criterion_group!(benches, skinny);
criterion_main!(benches);
