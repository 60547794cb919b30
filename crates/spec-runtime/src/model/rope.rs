//! Rotary position embedding in the half-split layout: dimension `i` pairs with `i + d/2`.

use burn::tensor::{Tensor, TensorData, backend::Backend};

use crate::config::ModelConfig;

/// `cos` and `sin` of `position · θ^(−2i/d)` for every position of the context, computed in f64.
pub(crate) fn rope_tables<B: Backend>(
    config: &ModelConfig,
    device: &B::Device,
) -> (Tensor<B, 2>, Tensor<B, 2>) {
    let half = config.head_dim / 2;
    let positions = config.max_position_embeddings;
    let mut cos = Vec::with_capacity(positions * half);
    let mut sin = Vec::with_capacity(positions * half);
    for p in 0..positions {
        for i in 0..half {
            let inv_freq = config
                .rope_theta
                .powf(-(2.0 * i as f64) / config.head_dim as f64);
            let angle = p as f64 * inv_freq;
            cos.push(angle.cos() as f32);
            sin.push(angle.sin() as f32);
        }
    }
    (
        Tensor::from_data(TensorData::new(cos, [positions, half]), device),
        Tensor::from_data(TensorData::new(sin, [positions, half]), device),
    )
}

/// Rotates `x` `[heads, n, d]` by the angles of its `n` positions, `cos` and `sin`
/// `[n, d / 2]`.
pub(crate) fn rotate<B: Backend>(
    x: Tensor<B, 3>,
    cos: &Tensor<B, 2>,
    sin: &Tensor<B, 2>,
) -> Tensor<B, 3> {
    let [_, _, d] = x.dims();
    let half = d / 2;
    let x1 = x.clone().narrow(2, 0, half);
    let x2 = x.narrow(2, half, half);
    let cos = cos.clone().unsqueeze::<3>();
    let sin = sin.clone().unsqueeze::<3>();
    let r1 = x1.clone() * cos.clone() - x2.clone() * sin.clone();
    let r2 = x2 * cos + x1 * sin;
    Tensor::cat(vec![r1, r2], 2)
}
