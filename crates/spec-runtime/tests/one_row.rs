//! One-token forward passes on a GPU backend agree with flex. burn 0.21's fused one-row matmul
//! (cubek 0.2's `gemv_unit_perpendicular`) misreads a transposed weight (tracel-ai/cubek#262),
//! which broke the SwiGLU block of a decode step on wgpu; the runtime computes `(W · xᵀ)ᵀ` instead.
#![cfg(all(feature = "flex", any(feature = "wgpu", feature = "cuda")))]
// Test helpers outside #[test] functions unwrap too; a failure there is a test failure.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use burn::backend::Flex;
use burn::tensor::{Tensor, TensorData, activation, backend::Backend};
use spec_runtime::{Architecture, ForwardRequest, ModelConfig, RandomSource, Transformer};

use common::*;

/// Deterministic values in [-0.5, 0.5).
fn tensor<B: Backend>(shape: [usize; 2], seed: u64, device: &B::Device) -> Tensor<B, 2> {
    let mut s = seed;
    let data: Vec<f32> = (0..shape[0] * shape[1])
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (s >> 40) as f32 / (1u64 << 24) as f32 - 0.5
        })
        .collect();
    Tensor::from_data(TensorData::new(data, shape), device)
}

fn host<B: Backend>(t: Tensor<B, 2>) -> Vec<f32> {
    t.into_data().convert::<f32>().to_vec().unwrap()
}

/// A SwiGLU block on `rows` rows with `[out, in]` weights used transposed, as `Linear` does.
fn swiglu<B: Backend>(rows: usize, device: &B::Device) -> Vec<f32> {
    let x = tensor::<B>([rows, 32], 1, device);
    let gate = tensor::<B>([48, 32], 2, device);
    let up = tensor::<B>([48, 32], 3, device);
    let down = tensor::<B>([32, 48], 4, device);
    let h = activation::silu(x.clone().matmul(gate.transpose())) * x.matmul(up.transpose());
    host(h.matmul(down.transpose()))
}

/// Single-token steps from an empty cache; logits of each.
fn steps<B: Backend>(architecture: Architecture, device: &B::Device) -> Vec<Vec<f32>> {
    let config = ModelConfig {
        architecture,
        vocab_size: 61,
        hidden_size: 32,
        intermediate_size: 48,
        num_layers: 1,
        num_heads: 4,
        num_kv_heads: 2,
        head_dim: 8,
        rms_norm_eps: 1e-6,
        rope_theta: 10_000.0,
        max_position_embeddings: 64,
        tie_word_embeddings: architecture == Architecture::Qwen2,
        qkv_bias: architecture == Architecture::Qwen2,
    };
    let mut source = RandomSource::new(config.clone(), 7);
    let m = Transformer::<B>::load(&config, &mut source, device).unwrap();
    let mut cache = m.new_cache(64);
    [3u32, 17, 42, 8]
        .iter()
        .map(|&t| {
            let out = m.forward(ForwardRequest::tokens(&[t]), &mut cache).unwrap();
            host(out.logits.unwrap())
        })
        .collect()
}

fn one_token_steps_match_flex<B: Backend>(device: &B::Device, tolerance: f32) {
    for arch in [Architecture::Llama, Architecture::Qwen2] {
        let want = steps::<Flex>(arch, &Default::default());
        for (i, got) in steps::<B>(arch, device).iter().enumerate() {
            assert_close(got, &want[i], tolerance, &format!("{arch:?} step {i}"));
        }
    }
}

fn fused_product<B: Backend>(rows: usize, device: &B::Device, tolerance: f32) {
    let want = swiglu::<Flex>(rows, &Default::default());
    assert_close(
        &swiglu::<B>(rows, device),
        &want,
        tolerance,
        &format!("{rows} rows"),
    );
}

macro_rules! backend_tests {
    ($name:ident, $backend:ty, $device:expr, $tolerance:ident) => {
        mod $name {
            type B = $backend;
            #[test]
            fn one_token_steps_match_flex() {
                super::one_token_steps_match_flex::<B>(&$device, super::$tolerance);
            }
            /// The shape the runtime turns a one-row product into.
            #[test]
            fn fused_two_row_product() {
                super::fused_product::<B>(2, &$device, super::$tolerance);
            }
        }
    };
}

#[cfg(feature = "wgpu")]
backend_tests!(
    wgpu,
    burn::backend::Wgpu,
    burn::backend::wgpu::WgpuDevice::default(),
    F32_TOLERANCE
);
#[cfg(feature = "cuda")]
backend_tests!(
    cuda,
    burn::backend::Cuda,
    burn::backend::cuda::CudaDevice::default(),
    TF32_TOLERANCE
);
