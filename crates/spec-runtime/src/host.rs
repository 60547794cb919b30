//! The decoder's host path: on the flex backend, a pass of at most [`HOST_PASS_ROWS`] tokens (a
//! decode step, a verification chain or tree, a part of a prompt) runs every layer on plain
//! `f32` slices.
//!
//! Such a step is bound by reading the weights, which `spec-kernels` streams once for all rows.
//! Run through burn, the rest of a layer is some fifty small tensor operations, each with its
//! own allocation and dispatch; at one to sixteen rows that overhead was ~40% of a SmolLM2 step.
//! Here the same math (RMSNorm, rotary embedding, grouped-query attention over the cache,
//! SwiGLU) works in place on host vectors, and keys and values go straight into the cache's
//! host rows; attention and SwiGLU are `spec-kernels`' SIMD loops
//! ([`spec_kernels::attention`], [`spec_kernels::swiglu`]). [`crate::model`]'s burn code stays
//! the definition for every other case (other backends, models without packed projections),
//! and the tests hold the two paths equal.
//!
//! [`HOST_PASS_ROWS`]: crate::model::HOST_PASS_ROWS

use crate::cache::{HostLayer, KvCache};
use crate::error::{Result, RuntimeError};
use crate::model::{Block, PackedBlock, RmsNorm};
use burn::tensor::backend::Backend;

/// What every layer of one host step shares.
pub(crate) struct HostStep<'a> {
    pub n: usize,
    /// `[n, head_dim / 2]` rotary cosines and sines of the new tokens' positions.
    pub cos: &'a [f32],
    pub sin: &'a [f32],
    /// `[n, cached + n]`: 0 where a new token may attend, -inf elsewhere.
    pub bias: &'a [f32],
}

/// Runs `block` on the residual stream `x` `[n, hidden]` in place with its packed projections,
/// appending the new keys and values to `cache`'s layer `layer`.
pub(crate) fn block_forward<B: Backend>(
    block: &Block<B>,
    packed: &PackedBlock,
    x: &mut [f32],
    step: &HostStep<'_>,
    cache: &mut KvCache<B>,
    layer: usize,
) -> Result<()> {
    let n = step.n;
    let attention = &block.attention;
    let (h, kv, d) = (
        attention.num_heads,
        attention.num_kv_heads,
        attention.head_dim,
    );
    if cache.head_shape() != (kv, d) {
        return Err(RuntimeError::InvalidRequest(format!(
            "a cache of {:?} (kv heads, head dim) for a layer of ({kv}, {d})",
            cache.head_shape()
        )));
    }
    let normed = rms_norm(x, n, &block.input_norm)?;
    // Each row: q (h heads), k (kv heads), v (kv heads).
    let mut qkv = packed.qkv.apply(&normed, n)?;
    let width = (h + 2 * kv) * d;
    if qkv.len() != n * width {
        return Err(RuntimeError::InvalidRequest(format!(
            "a stacked q/k/v product of {} values for {n} rows of {width}",
            qkv.len()
        )));
    }
    for (i, row) in qkv.chunks_exact_mut(width).enumerate() {
        // q and k heads are rotated alike; v follows them.
        rotate(&mut row[..(h + kv) * d], step, i, d);
    }

    let capacity = cache.capacity();
    let rows = cache
        .host_layer(layer)
        .ok_or_else(|| RuntimeError::InvalidRequest("the cache is not on the host".into()))?;
    let HostLayer { keys, values, len } = rows;
    let start = *len;
    let total = start + n;
    if total > capacity {
        return Err(RuntimeError::ContextOverflow {
            needed: total,
            capacity,
        });
    }
    if step.bias.len() != n * total {
        return Err(RuntimeError::InvalidRequest(format!(
            "an attention bias of {} entries for {n} x {total}",
            step.bias.len()
        )));
    }
    // New rows -> head-major [kv, capacity, d].
    for (i, row) in qkv.chunks_exact(width).enumerate() {
        let (k_row, v_row) = row[h * d..].split_at(kv * d);
        for head in 0..kv {
            let at = (head * capacity + start + i) * d;
            keys[at..at + d].copy_from_slice(&k_row[head * d..(head + 1) * d]);
            values[at..at + d].copy_from_slice(&v_row[head * d..(head + 1) * d]);
        }
    }
    *len = total;
    let attended = spec_kernels::attention(
        &qkv,
        width,
        keys,
        values,
        spec_kernels::AttentionShape {
            rows: n,
            heads: h,
            kv_heads: kv,
            head_dim: d,
            capacity,
            total,
        },
        step.bias,
    )
    .map_err(|e| RuntimeError::InvalidRequest(format!("attention: {e}")))?;
    let out = packed.o.apply(&attended, n)?;
    add_into(x, &out);

    let normed = rms_norm(x, n, &block.post_attention_norm)?;
    let act = if packed.swiglu_paired {
        packed.gate_up.swiglu(&normed, n)?
    } else {
        let gate_up = packed.gate_up.apply(&normed, n)?;
        spec_kernels::swiglu(&gate_up, packed.gate_up.matrix.rows() / 2)
    };
    let out = packed.down.apply(&act, n)?;
    add_into(x, &out);
    Ok(())
}

/// `x[n, features]` normalized by `norm` into a new vector.
pub(crate) fn rms_norm<B: Backend>(x: &[f32], n: usize, norm: &RmsNorm<B>) -> Result<Vec<f32>> {
    let weight = norm
        .weight
        .val()
        .into_data()
        .convert::<f32>()
        .into_vec::<f32>()
        .map_err(|e| RuntimeError::InvalidRequest(format!("reading a norm back: {e:?}")))?;
    let features = weight.len();
    if x.len() != n * features {
        return Err(RuntimeError::InvalidRequest(format!(
            "{} values for {n} rows of {features}",
            x.len()
        )));
    }
    let mut out = vec![0.0f32; x.len()];
    for (row, out_row) in x.chunks_exact(features).zip(out.chunks_exact_mut(features)) {
        let mean_square = spec_kernels::dot(row, row) / features as f32;
        let inv = 1.0 / (mean_square + norm.eps as f32).sqrt();
        for ((o, &v), &w) in out_row.iter_mut().zip(row).zip(&weight) {
            *o = v * inv * w;
        }
    }
    Ok(out)
}

/// Rotary embedding in the half-split layout on the heads of `heads` (`[heads · d]`, one token,
/// row `i` of the step), in place.
fn rotate(heads: &mut [f32], step: &HostStep<'_>, i: usize, d: usize) {
    let half = d / 2;
    let cos = &step.cos[i * half..(i + 1) * half];
    let sin = &step.sin[i * half..(i + 1) * half];
    for head in heads.chunks_exact_mut(d) {
        let (x1, x2) = head.split_at_mut(half);
        for (((a, b), &c), &s) in x1.iter_mut().zip(x2.iter_mut()).zip(cos).zip(sin) {
            let (u, w) = (*a, *b);
            *a = u * c - w * s;
            *b = w * c + u * s;
        }
    }
}

fn add_into(x: &mut [f32], y: &[f32]) {
    for (a, b) in x.iter_mut().zip(y) {
        *a += b;
    }
}
