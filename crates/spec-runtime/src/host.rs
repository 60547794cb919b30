//! The decoder's host path: on the flex backend, a pass of at most [`HOST_PASS_ROWS`] tokens (a
//! decode step, a verification chain or tree, a part of a prompt) runs every layer on plain
//! `f32` slices.
//!
//! Such a step is bound by reading the weights, which `spec-kernels` streams once for all rows. Run
//! through burn, the rest of a layer is some fifty small tensor operations, each with its own
//! allocation and dispatch, which at a few rows weigh as much as the weights' reads
//! (docs/benchmarks.md at 6f79fec, "End to end with the host path": SmolLM2's greedy decode in f32
//! at 26.7 tok/s through burn's ops, 43.3 here; docs/notes/cpu-kernels.md, "Why a kernel of its
//! own"). Here the same math (RMSNorm, rotary embedding, grouped-query attention over the cache,
//! SwiGLU) works in place on host vectors, and keys and values go straight into the cache's host
//! rows; attention and SwiGLU are `spec-kernels`' SIMD loops ([`spec_kernels::attention`],
//! [`spec_kernels::swiglu`]). [`crate::model`]'s burn code stays the definition for every other
//! case (other backends, models without packed projections), and the tests hold the two paths
//! equal.

use std::ops::Range;

use burn::tensor::{Tensor, TensorData, backend::Backend};

use crate::cache::{HostLayer, KvCache};
use crate::error::{Result, RuntimeError};
use crate::model::mask::{attends_only_backwards, bias_rows};
use crate::model::{Block, ForwardOutput, NewTokens, PackedBlock, RmsNorm, Transformer};

/// The host path runs longer requests in passes of at most this many new tokens where the
/// attention pattern allows (a prompt, a chain, a tree in topological order).
///
/// Each pass streams every weight once for all its rows, and a row's result has the same bits
/// whatever the other rows, so the pass length changes the time only. A prompt is bound by the
/// products' arithmetic, not by reading the weights, but in passes of 16 the weights' reads
/// still add to it: `bench-forward`'s 128-token prefill of the Qwen 1.5B in f32 runs at 34–35
/// tok/s in passes of 16, 41 in passes of 32, 44–45 in passes of 64 and 45–46 in passes of 128;
/// SmolLM2 in f32 392–405 → 498–507; Q8_0 and `q4-a8` (a quarter of the bytes or fewer)
/// unchanged (docs/benchmarks.md at cdeee8c, "Prompts in passes of 64"; docs/notes/cpu-kernels.md,
/// "Layouts and tiles").
pub const HOST_PASS_ROWS: usize = 64;

/// Whether `B` is the flex backend, whose tensors live in host memory: the only backend the
/// host path and the packed copies serve (elsewhere reading the activations back would cost
/// more than it saves).
#[cfg_attr(not(feature = "flex"), allow(clippy::extra_unused_type_parameters))]
pub(crate) fn is_flex<B: Backend>() -> bool {
    #[cfg(feature = "flex")]
    {
        std::any::TypeId::of::<B>() == std::any::TypeId::of::<burn::backend::Flex>()
    }
    #[cfg(not(feature = "flex"))]
    {
        false
    }
}

/// `t`'s values as f32 on the host.
pub(crate) fn read_f32<B: Backend, const D: usize>(t: Tensor<B, D>) -> Result<Vec<f32>> {
    t.into_data()
        .convert::<f32>()
        .into_vec::<f32>()
        .map_err(|e| RuntimeError::InvalidConfig(format!("reading weights back: {e:?}")))
}

/// What [`forward`] runs, besides the input and the packed blocks.
pub(crate) struct HostPass<'a> {
    pub positions: &'a [usize],
    /// Positions in the cache before the pass.
    pub cached: usize,
    pub attention: NewTokens<'a>,
    pub layers: Range<usize>,
    pub logit_rows: Option<Vec<usize>>,
    pub hidden_after: &'a [usize],
}

/// [`Transformer::forward`] on the host path for every layer of `pass.layers` (`packed` holds
/// their packed projections). `x` `[n, hidden]` is the input of the first layer run.
///
/// The new tokens run in passes of at most [`HOST_PASS_ROWS`] when none attends to a later
/// one (a causal chain or prompt, a tree in topological order): each pass finds the earlier
/// passes' keys in the cache, so the result is one pass's. Other masks take one pass of
/// every row.
pub(crate) fn forward<B: Backend>(
    model: &Transformer<B>,
    x: Tensor<B, 2>,
    packed: &[&PackedBlock],
    pass: HostPass<'_>,
    cache: &mut KvCache<B>,
) -> Result<ForwardOutput<B>> {
    let device = model.device();
    let [n, hidden_size] = x.dims();
    let mut x = read_f32(x)?;
    let chunk = if attends_only_backwards(n, pass.attention) {
        HOST_PASS_ROWS
    } else {
        n
    };
    // Per entry of `hidden_after`, its rows in order as the passes produce them.
    let mut hidden: Vec<Vec<f32>> = vec![Vec::new(); pass.hidden_after.len()];
    let mut record = |after: usize, rows: &[f32]| {
        for (i, &l) in pass.hidden_after.iter().enumerate() {
            if l == after {
                hidden[i].extend_from_slice(rows);
            }
        }
    };
    let mut start = 0;
    while start < n {
        let end = (start + chunk).min(n);
        let bias = bias_rows(
            n,
            pass.cached,
            start..end,
            pass.attention,
            pass.cached + end,
        );
        let (cos, sin) = model.rope_rows(&pass.positions[start..end]);
        let (cos, sin) = (read_f32(cos)?, read_f32(sin)?);
        let step = HostStep {
            n: end - start,
            cos: &cos,
            sin: &sin,
            bias: &bias,
        };
        let rows = &mut x[start * hidden_size..end * hidden_size];
        for (l, block) in pass.layers.clone().zip(packed) {
            record(l, rows);
            block_forward(&model.blocks[l], block, rows, &step, cache, l)?;
        }
        record(pass.layers.end, rows);
        start = end;
    }
    let to_tensor =
        |v: Vec<f32>| Tensor::<B, 2>::from_data(TensorData::new(v, [n, hidden_size]), &device);
    let logits = pass
        .logit_rows
        .map(|rows| logits(model, &x, hidden_size, &rows))
        .transpose()?;
    Ok(ForwardOutput {
        logits,
        hidden: hidden.into_iter().map(to_tensor).collect(),
        last_hidden: to_tensor(x),
    })
}

/// [`Transformer::logits`] of rows `rows` of the host residual stream `x` `[n, hidden]`, on
/// the host when the head has a packed copy.
fn logits<B: Backend>(
    model: &Transformer<B>,
    x: &[f32],
    hidden: usize,
    rows: &[usize],
) -> Result<Tensor<B, 2>> {
    let mut picked = Vec::with_capacity(rows.len() * hidden);
    for &r in rows {
        picked.extend_from_slice(&x[r * hidden..(r + 1) * hidden]);
    }
    let device = model.device();
    match model.head.packed() {
        Some(head) => {
            let normed = rms_norm(&picked, rows.len(), &model.norm)?;
            let y = head.apply(&normed, rows.len())?;
            Ok(Tensor::from_data(
                TensorData::new(y, [rows.len(), head.matrix.rows()]),
                &device,
            ))
        }
        None => model.logits(Tensor::from_data(
            TensorData::new(picked, [rows.len(), hidden]),
            &device,
        )),
    }
}

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
