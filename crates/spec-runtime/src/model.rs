//! The decoder: Llama and Qwen2 share one implementation (RMSNorm, rotary embeddings,
//! grouped-query attention, SwiGLU); they differ in the q/k/v biases, which the config states.
//!
//! Activations are `[tokens, features]` for a single sequence; heads are split only inside
//! attention. One entry point, [`Transformer::forward`], serves a prompt, a decode step, a chain
//! of drafts and a token tree, and can run a range of layers only (early exit).

use std::ops::Range;
use std::sync::Arc;

use burn::module::{Module, Param};
use burn::tensor::{Int, Tensor, TensorData, activation, backend::Backend};
use spec_kernels::PackedMatrix;
pub use spec_kernels::WeightFormat;

use crate::cache::KvCache;
use crate::config::ModelConfig;
use crate::error::{Result, RuntimeError};
use crate::host::{self, HostStep};
use crate::weights::{HostTensor, Superblocks, WeightSource};

/// A dense projection `y = x Wᵀ + b` with `W` stored `[out, in]`.
///
/// On the flex (CPU) backend a projection may also hold a host copy of its weights packed for
/// `spec-kernels`' skinny product, which serves inputs of at most [`SKINNY_MAX_ROWS`] rows (a
/// decode or verification step) at close to memory bandwidth; longer inputs (prefill) and other
/// backends use burn's matmul. The copy is made at load ([`LoadOptions::skinny_format`]) and
/// is not updated if `weight` is replaced afterwards: call [`Linear::pack`] again, or set
/// `skinny` to `None`. Unless [`LoadOptions::keep_unpacked`] is set, a packed projection keeps
/// no burn tensors (`weight` and `bias` are `None`) and the packed copy serves every input.
#[derive(Module, Debug)]
pub struct Linear<B: Backend> {
    /// `[out_features, in_features]`; `None` when only a packed copy holds the weights: this
    /// projection's own `skinny`, or, in a block, the block's [`Block::packed`] (such a
    /// projection cannot run by itself: [`Linear::forward`] panics).
    pub weight: Option<Param<Tensor<B, 2>>>,
    /// `[out_features]`.
    pub bias: Option<Param<Tensor<B, 1>>>,
    /// The packed host copy the skinny path reads; `None` runs burn's matmul for every input.
    #[module(skip)]
    pub skinny: Option<Arc<SkinnyLinear>>,
}

/// Inputs of at most this many rows take a [`Linear`]'s skinny path when it also holds burn's
/// weights (without them every input does).
pub const SKINNY_MAX_ROWS: usize = 16;

/// The host path runs longer requests in passes of at most this many new tokens where the
/// attention pattern allows (a prompt, a chain, a tree in topological order).
///
/// Each pass streams every weight once for all its rows, and a row's result has the same bits
/// whatever the other rows, so the pass length changes the time only. A prompt is bound by the
/// products' arithmetic, not by reading the weights, but in passes of 16 the weights' reads
/// still added to it: `bench-forward`'s 128-token prefill of the Qwen 1.5B in f32 ran at
/// 34–35 tok/s in passes of 16, 41 in passes of 32, 44–45 in passes of 64 and 45–46 in passes
/// of 128; SmolLM2 in f32 392–405 → 498–507; Q8_0 and `q4-a8` (a quarter of the bytes or
/// fewer) unchanged (docs/benchmarks.md, nineteenth session).
pub const HOST_PASS_ROWS: usize = 64;

/// A projection's weights (and bias) on the host, packed for the skinny product.
#[derive(Debug)]
pub struct SkinnyLinear {
    pub matrix: PackedMatrix,
    pub bias: Option<Vec<f32>>,
}

impl SkinnyLinear {
    /// Packs `weight` `[out, in]` (row-major) and `bias` `[out]`.
    pub fn new(
        weight: &[f32],
        out_features: usize,
        in_features: usize,
        bias: Option<Vec<f32>>,
        format: WeightFormat,
    ) -> Result<Self> {
        let matrix = PackedMatrix::pack(weight, out_features, in_features, format)
            .map_err(|e| RuntimeError::InvalidConfig(format!("packing a projection: {e}")))?;
        Ok(Self { matrix, bias })
    }

    /// `x` `[n, in]` (row-major) times the packed weights, plus the bias: `[n, out]`.
    pub(crate) fn apply(&self, x: &[f32], n: usize) -> Result<Vec<f32>> {
        let out = self.matrix.rows();
        let mut y = vec![0.0f32; n * out];
        self.matrix
            .matmul_into(x, n, &mut y)
            .map_err(|e| RuntimeError::InvalidRequest(format!("skinny product: {e}")))?;
        if let Some(bias) = &self.bias {
            for row in y.chunks_exact_mut(out) {
                for (v, b) in row.iter_mut().zip(bias) {
                    *v += b;
                }
            }
        }
        Ok(y)
    }

    /// SwiGLU of `x` `[n, in]` through a gate/up projection packed in
    /// [`spec_kernels::swiglu_row_order`] without a bias: `[n, out / 2]`.
    pub(crate) fn swiglu(&self, x: &[f32], n: usize) -> Result<Vec<f32>> {
        if self.bias.is_some() {
            return Err(RuntimeError::InvalidRequest(
                "a gate/up projection with a bias cannot run SwiGLU in the product".into(),
            ));
        }
        let mut act = vec![0.0f32; n * (self.matrix.rows() / 2)];
        self.matrix
            .matmul_swiglu_into(x, n, &mut act)
            .map_err(|e| RuntimeError::InvalidRequest(format!("skinny SwiGLU product: {e}")))?;
        Ok(act)
    }

    /// The weights `[out, in]` and bias when stored exactly (f32), for repacking.
    fn exact_weights(&self) -> Result<HostProjection> {
        if self.matrix.format() != WeightFormat::F32 {
            return Err(unpacked_dropped("a projection"));
        }
        let bias = self.bias.as_ref().map(|b| HostTensor {
            shape: vec![b.len()],
            data: b.clone(),
        });
        let weight = HostTensor {
            data: self.matrix.dequantize(),
            shape: vec![self.matrix.rows(), self.matrix.cols()],
        };
        Ok((weight, bias))
    }

    /// `[n, in] -> [n, out]` on the host, or `None` when `x` is not float data of the right
    /// width (the caller then runs burn's matmul).
    fn forward<B: Backend>(&self, x: &Tensor<B, 2>) -> Option<Tensor<B, 2>> {
        let [n, k] = x.dims();
        if k != self.matrix.cols() || !x.dtype().is_float() {
            return None;
        }
        let data = x.clone().into_data().convert::<f32>();
        let y = self.apply(data.as_slice::<f32>().ok()?, n).ok()?;
        Some(Tensor::from_data(
            TensorData::new(y, [n, self.matrix.rows()]),
            &x.device(),
        ))
    }
}

/// One block's projections packed for the decoder's host path (`crate::host`): q, k and v
/// stacked into one product and gate and up into another, so a layer makes four kernel calls.
#[derive(Debug)]
pub struct PackedBlock {
    /// `[q_out + 2 · kv_out, hidden]`, with the stacked biases.
    pub qkv: SkinnyLinear,
    pub o: SkinnyLinear,
    /// `[2 · intermediate, hidden]`: gate rows, then up rows; or, where `swiglu_paired`, the
    /// same rows in [`spec_kernels::swiglu_row_order`].
    pub gate_up: SkinnyLinear,
    /// Whether `gate_up` runs with SwiGLU in the product ([`SkinnyLinear::swiglu`]): each
    /// thread computes a feature's gate and up and hands on only `silu(gate) · up`. Taken where
    /// the intermediate size is a multiple of [`spec_kernels::SWIGLU_RUN`] and neither
    /// projection has a bias.
    pub swiglu_paired: bool,
    pub down: SkinnyLinear,
}

/// A block's projections under their Hugging Face names (`model.layers.{i}.{name}.weight`), in
/// the order q, k, v, o, gate, up, down.
pub const BLOCK_PROJECTIONS: [&str; 7] = [
    "self_attn.q_proj",
    "self_attn.k_proj",
    "self_attn.v_proj",
    "self_attn.o_proj",
    "mlp.gate_proj",
    "mlp.up_proj",
    "mlp.down_proj",
];

/// A projection's host weight and bias as read from a checkpoint.
type HostProjection = (HostTensor, Option<HostTensor>);

/// A projection's host weights `[rows, cols]` and bias `[rows]`, borrowed for packing, and
/// the checkpoint's superblocks of the weights when it has them.
struct Projection<'a> {
    weight: &'a [f32],
    rows: usize,
    cols: usize,
    bias: Option<&'a [f32]>,
    superblocks: Option<&'a Superblocks>,
}

impl<'a> Projection<'a> {
    fn of(weight: &'a HostTensor, bias: Option<&'a HostTensor>) -> Self {
        Self {
            weight: &weight.data,
            rows: weight.shape.first().copied().unwrap_or(0),
            cols: weight.shape.get(1).copied().unwrap_or(0),
            bias: bias.map(|b| b.data.as_slice()),
            superblocks: None,
        }
    }

    fn with_superblocks(self, superblocks: Option<&'a Superblocks>) -> Self {
        Self {
            superblocks,
            ..self
        }
    }
}

/// The rows of `stacked` (whole rows of `stacked.len() / order.len()` entries) in `order`: row
/// `p` of the result is row `order[p]` of `stacked`; `stacked` as it is without an order.
fn reorder_rows<T: Clone>(stacked: Vec<T>, order: Option<&[usize]>) -> Vec<T> {
    let Some(order) = order.filter(|o| !o.is_empty()) else {
        return stacked;
    };
    let per_row = stacked.len() / order.len();
    order
        .iter()
        .flat_map(|&r| stacked[r * per_row..(r + 1) * per_row].iter().cloned())
        .collect()
}

/// `parts` stacked row-wise into one packed projection (they must share `cols`), its rows in
/// `order` when given ([`reorder_rows`]). In `q4-a8` (and `q4-a8-lossy`), parts that all come
/// as Q4_K superblocks, or all as Q6_K ones, are packed from them, as they are.
fn stack(
    parts: &[Projection<'_>],
    format: WeightFormat,
    order: Option<&[usize]>,
) -> Result<SkinnyLinear> {
    let cols = parts.first().map_or(0, |p| p.cols);
    if parts.iter().any(|p| p.cols != cols) {
        return Err(RuntimeError::InvalidConfig(
            "stacked projections of different widths".into(),
        ));
    }
    let rows: usize = parts.iter().map(|p| p.rows).sum();
    if order.is_some_and(|o| o.len() != rows) {
        return Err(RuntimeError::InvalidConfig(format!(
            "a row order of {} rows for {rows} stacked rows",
            order.map_or(0, <[usize]>::len)
        )));
    }
    let bias = stacked_bias(parts).map(|b| reorder_rows(b, order));
    if format.keeps_superblocks() {
        let mut q4 = Vec::new();
        let mut q6 = Vec::new();
        for p in parts {
            match p.superblocks {
                Some(Superblocks::Q4K(blocks)) => q4.push(blocks.as_slice()),
                Some(Superblocks::Q6K(blocks)) => q6.push(blocks.as_slice()),
                None => {}
            }
        }
        let packed = if q4.len() == parts.len() {
            Some(PackedMatrix::pack_q4_superblocks(
                &reorder_rows(q4.concat(), order),
                rows,
                cols,
                format,
            ))
        } else if q6.len() == parts.len() {
            Some(PackedMatrix::pack_q6_superblocks(
                &reorder_rows(q6.concat(), order),
                rows,
                cols,
                format,
            ))
        } else {
            None
        };
        if let Some(matrix) = packed {
            let matrix = matrix
                .map_err(|e| RuntimeError::InvalidConfig(format!("packing a projection: {e}")))?;
            return Ok(SkinnyLinear { matrix, bias });
        }
    }
    let mut weight = Vec::with_capacity(rows * cols);
    for p in parts {
        weight.extend_from_slice(p.weight);
    }
    SkinnyLinear::new(&reorder_rows(weight, order), rows, cols, bias, format)
}

/// The biases of `parts` stacked, zeros for a part without one; `None` when none has one.
fn stacked_bias(parts: &[Projection<'_>]) -> Option<Vec<f32>> {
    parts.iter().any(|p| p.bias.is_some()).then(|| {
        parts
            .iter()
            .flat_map(|p| match p.bias {
                Some(b) => b.to_vec(),
                None => vec![0.0; p.rows],
            })
            .collect()
    })
}

impl PackedBlock {
    /// Packs the seven projections of a block, given in the order q, k, v, o, gate, up, down.
    fn new(p: [Projection<'_>; 7], format: WeightFormat) -> Result<Self> {
        let [q, k, v, o, gate, up, down] = p;
        let order = (gate.rows == up.rows && gate.bias.is_none() && up.bias.is_none())
            .then(|| spec_kernels::swiglu_row_order(gate.rows))
            .flatten();
        Ok(Self {
            qkv: stack(&[q, k, v], format, None)?,
            o: stack(&[o], format, None)?,
            gate_up: stack(&[gate, up], format, order.as_deref())?,
            swiglu_paired: order.is_some(),
            down: stack(&[down], format, None)?,
        })
    }

    /// The seven projections back (q, k, v, o, gate, up, down), when stored exactly (f32):
    /// `q_rows` and `kv_rows` split the stacked q/k/v, gate and up are halves (back in that
    /// order where they were paired). Projections stacked with a biased one come back with
    /// zeros for a bias.
    fn unstack(&self, q_rows: usize, kv_rows: usize) -> Result<[HostProjection; 7]> {
        // `order[p]` is the stacked row that packed row `p` holds.
        let split = |linear: &SkinnyLinear,
                     sizes: &[usize],
                     order: Option<&[usize]>|
         -> Result<Vec<HostProjection>> {
            let (weight, bias) = linear.exact_weights()?;
            let (rows, cols) = (linear.matrix.rows(), linear.matrix.cols());
            if sizes.iter().sum::<usize>() != rows || order.is_some_and(|o| o.len() != rows) {
                return Err(RuntimeError::InvalidConfig(format!(
                    "a packed projection of {rows} rows split as {sizes:?}"
                )));
            }
            // Stacked row `r` is packed row `packed_row[r]`.
            let mut packed_row: Vec<usize> = (0..rows).collect();
            for (p, &r) in order.into_iter().flatten().enumerate() {
                packed_row[r] = p;
            }
            let mut row = 0;
            let mut parts = Vec::with_capacity(sizes.len());
            for &n in sizes {
                let stacked = || packed_row[row..row + n].iter().copied();
                let weight = HostTensor {
                    data: stacked()
                        .flat_map(|p| weight.data[p * cols..(p + 1) * cols].iter().copied())
                        .collect(),
                    shape: vec![n, cols],
                };
                let bias = bias.as_ref().map(|b| HostTensor {
                    data: stacked().map(|p| b.data[p]).collect(),
                    shape: vec![n],
                });
                parts.push((weight, bias));
                row += n;
            }
            Ok(parts)
        };
        let ff = self.gate_up.matrix.rows() / 2;
        let order = if self.swiglu_paired {
            Some(spec_kernels::swiglu_row_order(ff).ok_or_else(|| {
                RuntimeError::InvalidConfig(format!("gate/up rows paired with {ff} features"))
            })?)
        } else {
            None
        };
        let mut parts = split(&self.qkv, &[q_rows, kv_rows, kv_rows], None)?;
        parts.extend(split(&self.o, &[self.o.matrix.rows()], None)?);
        parts.extend(split(&self.gate_up, &[ff, ff], order.as_deref())?);
        parts.extend(split(&self.down, &[self.down.matrix.rows()], None)?);
        parts
            .try_into()
            .map_err(|_| RuntimeError::InvalidConfig("a block of seven projections".into()))
    }
}

/// Whether `B` is the flex backend, whose tensors live in host memory: the only backend the
/// skinny path serves (elsewhere reading the activations back would cost more than it saves).
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

impl<B: Backend> Linear<B> {
    /// A projection from host weights `[out, in]` and bias `[out]`, with a skinny copy in
    /// `skinny_format` when `B` is flex; with a skinny copy, burn's tensors only if
    /// `keep_unpacked`.
    pub fn from_host(
        weight: HostTensor,
        bias: Option<HostTensor>,
        skinny_format: Option<WeightFormat>,
        keep_unpacked: bool,
        device: &B::Device,
    ) -> Result<Self> {
        let skinny = match (skinny_format, weight.shape.as_slice()) {
            (Some(format), &[out, inp]) if is_flex::<B>() => Some(SkinnyLinear::new(
                &weight.data,
                out,
                inp,
                bias.as_ref().map(|b| b.data.clone()),
                format,
            )?),
            _ => None,
        };
        Self::with_skinny(weight, bias, skinny, keep_unpacked, device)
    }

    /// A projection from host weights and its packed copy (if any), keeping burn's tensors
    /// only without one or if `keep_unpacked`.
    fn with_skinny(
        weight: HostTensor,
        bias: Option<HostTensor>,
        skinny: Option<SkinnyLinear>,
        keep_unpacked: bool,
        device: &B::Device,
    ) -> Result<Self> {
        let skinny = skinny.map(Arc::new);
        if skinny.is_some() && !keep_unpacked {
            return Ok(Self {
                weight: None,
                bias: None,
                skinny,
            });
        }
        Ok(Self {
            weight: Some(Param::from_tensor(weight.into_tensor::<B, 2>(device))),
            bias: bias.map(|b| Param::from_tensor(b.into_tensor::<B, 1>(device))),
            skinny,
        })
    }

    /// Whether [`Linear::pack`] can read back the exact weights (burn's tensors, or an f32
    /// packed copy).
    fn holds_exact_weights(&self) -> bool {
        self.weight.is_some()
            || self
                .skinny
                .as_ref()
                .is_some_and(|s| s.matrix.format() == WeightFormat::F32)
    }

    /// A projection whose weights only its block's packed copy holds.
    fn packed_in_block() -> Self {
        Self {
            weight: None,
            bias: None,
            skinny: None,
        }
    }

    /// The weights `[out, in]` and bias as f32 on the host: burn's tensors when kept, else the
    /// packed copy's when it holds them exactly (f32).
    fn host_weights(&self) -> Result<HostProjection> {
        match (&self.weight, &self.skinny) {
            (Some(weight), _) => {
                let shape = weight.val().dims().to_vec();
                let bias = match &self.bias {
                    Some(b) => Some(HostTensor {
                        shape: b.val().dims().to_vec(),
                        data: host_f32(b.val())?,
                    }),
                    None => None,
                };
                Ok((
                    HostTensor {
                        data: host_f32(weight.val())?,
                        shape,
                    },
                    bias,
                ))
            }
            (None, Some(skinny)) => skinny.exact_weights(),
            (None, None) => Err(RuntimeError::InvalidRequest(
                "a projection whose weights only its block's packed copy holds cannot be packed \
                 by itself: pack the block"
                    .into(),
            )),
        }
    }

    /// (Re)builds the skinny copy from the current weights (flex only; elsewhere clears it).
    /// Without burn's tensors the packed copy is the source, which only f32 holds exactly;
    /// from another format this is an error (reload the checkpoint instead).
    pub fn pack(&mut self, format: WeightFormat) -> Result<()> {
        if !is_flex::<B>() {
            self.skinny = None;
            return Ok(());
        }
        let (weight, bias) = self.host_weights()?;
        let &[out, inp] = weight.shape.as_slice() else {
            return Err(RuntimeError::InvalidConfig(format!(
                "a projection of shape {:?}",
                weight.shape
            )));
        };
        self.skinny = Some(Arc::new(SkinnyLinear::new(
            &weight.data,
            out,
            inp,
            bias.map(|b| b.data),
            format,
        )?));
        Ok(())
    }

    /// `[n, in] -> [n, out]`.
    ///
    /// # Panics
    /// On an input of the wrong width (as burn's matmul does), and when neither burn's weights
    /// nor a packed copy of its own are held (a projection of a packed block loaded without
    /// [`LoadOptions::keep_unpacked`]; the block runs it).
    pub fn forward(&self, x: Tensor<B, 2>) -> Tensor<B, 2> {
        if let Some(skinny) = &self.skinny
            && (x.dims()[0] <= SKINNY_MAX_ROWS || self.weight.is_none())
            && let Some(y) = skinny.forward(&x)
        {
            return y;
        }
        let Some(weight) = &self.weight else {
            // The packed copy takes every float input of its width.
            match &self.skinny {
                Some(skinny) => panic!(
                    "an input of {} features for a projection of {}",
                    x.dims()[1],
                    skinny.matrix.cols()
                ),
                None => panic!(
                    "this projection's weights are held by its block's packed copy only \
                     (loaded without LoadOptions::keep_unpacked); run the block through \
                     Transformer::forward"
                ),
            }
        };
        let y = matmul(x, weight.val().transpose());
        match &self.bias {
            Some(b) => y + b.val().unsqueeze::<2>(),
            None => y,
        }
    }
}

/// The error for repacking weights whose exact values are no longer held.
fn unpacked_dropped(what: &str) -> RuntimeError {
    RuntimeError::InvalidRequest(format!(
        "{what} keeps only a packed copy that is not f32, so its exact weights are gone: reload \
         the checkpoint in the new format (or load with LoadOptions::keep_unpacked)"
    ))
}

/// `lhs.matmul(rhs)`, with a one-row `lhs` computed as `(rhsᵀ · lhsᵀ)ᵀ` outside flex: burn
/// 0.21's fused matmul runs cubek 0.2's `gemv_unit_perpendicular` kernel on one-row products,
/// and that kernel misreads a transposed (column-major) `rhs` such as `weight.transpose()`
/// (tracel-ai/cubek#262). `rhsᵀ` is then the weight as stored, row-major, and the product a
/// one-column one. (Before: two rows, `cat` and `narrow`, two more kernels a product.)
fn matmul<B: Backend, const D: usize>(lhs: Tensor<B, D>, rhs: Tensor<B, D>) -> Tensor<B, D> {
    let rows = D - 2;
    if lhs.dims()[rows] == 1 && !is_flex::<B>() {
        return rhs.transpose().matmul(lhs.transpose()).transpose();
    }
    lhs.matmul(rhs)
}

fn host_f32<B: Backend, const D: usize>(t: Tensor<B, D>) -> Result<Vec<f32>> {
    t.into_data()
        .convert::<f32>()
        .into_vec::<f32>()
        .map_err(|e| RuntimeError::InvalidConfig(format!("reading weights back: {e:?}")))
}

/// How [`Transformer::load_with`] prepares the weights.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoadOptions {
    /// On the flex backend, keep every projection and the output head packed in this format
    /// for the host path (f32 by default: exact; `Bf16` and `Q8_0` round the weights; `Q4`
    /// keeps a 4-bit checkpoint's weights exactly and stores any matrix that is not 4-bit as
    /// Q8_0; `Q8_0A8` and `Q4A8` also round the activations to int8, a different model again).
    /// `None` runs burn's matmul everywhere. Ignored on other backends.
    pub skinny_format: Option<WeightFormat>,
    /// With a packed copy, also keep burn's tensors of the packed projections (the default
    /// drops them: every forward pass of a packed model then runs on the host, in passes of
    /// at most [`HOST_PASS_ROWS`] rows where the attention pattern allows, so they would go
    /// unused, and an f32 model would be held twice). Keeping them allows repacking a
    /// non-f32 copy in another format without reloading.
    pub keep_unpacked: bool,
    /// In `Q4A8` (and `Q4A8Lossy`), pack a checkpoint's Q4_K and Q6_K matrices from their
    /// superblocks as they are (the default: fewer bytes, integer sums over a superblock,
    /// activations rounded one step a superblock of 256 inputs); `false` packs their f32 values
    /// as other matrices are (Q4_K as Q4 blocks, Q6_K as Q8_0, or rounded to Q4 blocks in
    /// `Q4A8Lossy`; activations rounded one step a block of 32).
    pub keep_superblocks: bool,
    /// The most bytes the device holds in one buffer (on wgpu, the adapter's largest storage
    /// buffer binding: 128 MiB on Mesa's lavapipe). A model with a weight larger in f32 (the
    /// Qwen2.5 0.5B's embedding: 544.5 MB) is refused at load with
    /// [`RuntimeError::WeightTooLarge`]; loaded anyway, it failed later in the backend's device
    /// thread, and the first read of a result panicked.
    pub max_buffer_bytes: Option<u64>,
}

impl Default for LoadOptions {
    fn default() -> Self {
        Self {
            skinny_format: Some(WeightFormat::F32),
            keep_unpacked: false,
            keep_superblocks: true,
            max_buffer_bytes: None,
        }
    }
}

/// Root-mean-square normalization with a learned scale.
#[derive(Module, Debug)]
pub struct RmsNorm<B: Backend> {
    /// `[features]`.
    pub weight: Param<Tensor<B, 1>>,
    pub eps: f64,
}

impl<B: Backend> RmsNorm<B> {
    /// `[n, features] -> [n, features]`.
    pub fn forward(&self, x: Tensor<B, 2>) -> Tensor<B, 2> {
        let mean_square = (x.clone() * x.clone()).mean_dim(1);
        let inv = mean_square.add_scalar(self.eps).sqrt().recip();
        x * inv * self.weight.val().unsqueeze::<2>()
    }
}

/// Multi-head attention with grouped key/value heads.
#[derive(Module, Debug)]
pub struct Attention<B: Backend> {
    pub q_proj: Linear<B>,
    pub k_proj: Linear<B>,
    pub v_proj: Linear<B>,
    pub o_proj: Linear<B>,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
}

/// What the new tokens of one forward pass are computed against.
#[derive(Debug)]
pub(crate) struct AttentionContext<B: Backend> {
    /// `[n, head_dim / 2]` rotary angles of the new tokens' positions.
    cos: Tensor<B, 2>,
    sin: Tensor<B, 2>,
    /// `[n, attended]` (see `KvCache::attended_len`): 0 where a new token may attend, -inf
    /// elsewhere, the columns past `cached + n` included.
    bias: Tensor<B, 2>,
}

impl<B: Backend> Attention<B> {
    /// `[n, hidden] -> [n, hidden]`; appends the new keys and values to `cache` at `layer`.
    fn forward(
        &self,
        x: Tensor<B, 2>,
        context: &AttentionContext<B>,
        cache: &mut KvCache<B>,
        layer: usize,
    ) -> Result<Tensor<B, 2>> {
        let [n, _] = x.dims();
        let (h, kv, d) = (self.num_heads, self.num_kv_heads, self.head_dim);
        let group = h / kv;
        let split = |t: Tensor<B, 2>, heads: usize| t.reshape([n, heads, d]).swap_dims(0, 1);
        let q = rotate(split(self.q_proj.forward(x.clone()), h), context);
        let k = rotate(split(self.k_proj.forward(x.clone()), kv), context);
        let v = split(self.v_proj.forward(x), kv);
        let (keys, values) = cache.append(layer, k, v)?;
        let total = keys.dims()[1];

        // Query heads sharing a key/value head are stacked: [kv, group · n, d].
        let q = q.reshape([kv, group * n, d]);
        let scores = matmul(q, keys.swap_dims(1, 2)).mul_scalar(1.0 / (d as f64).sqrt());
        let bias = context
            .bias
            .clone()
            .unsqueeze::<3>()
            .expand([group, n, total])
            .reshape([1, group * n, total]);
        let weights = activation::softmax(scores + bias, 2);
        let out = weights.matmul(values);
        let out = out.reshape([h, n, d]).swap_dims(0, 1).reshape([n, h * d]);
        Ok(self.o_proj.forward(out))
    }
}

/// Rotary embedding in the half-split layout: dimension `i` pairs with `i + d/2`.
/// `x` is `[heads, n, d]`.
fn rotate<B: Backend>(x: Tensor<B, 3>, context: &AttentionContext<B>) -> Tensor<B, 3> {
    let [_, _, d] = x.dims();
    let half = d / 2;
    let x1 = x.clone().narrow(2, 0, half);
    let x2 = x.narrow(2, half, half);
    let cos = context.cos.clone().unsqueeze::<3>();
    let sin = context.sin.clone().unsqueeze::<3>();
    let r1 = x1.clone() * cos.clone() - x2.clone() * sin.clone();
    let r2 = x2 * cos + x1 * sin;
    Tensor::cat(vec![r1, r2], 2)
}

/// The SwiGLU feed-forward block.
#[derive(Module, Debug)]
pub struct Mlp<B: Backend> {
    pub gate_proj: Linear<B>,
    pub up_proj: Linear<B>,
    pub down_proj: Linear<B>,
}

impl<B: Backend> Mlp<B> {
    /// `[n, hidden] -> [n, hidden]`.
    pub fn forward(&self, x: Tensor<B, 2>) -> Tensor<B, 2> {
        let gate = activation::silu(self.gate_proj.forward(x.clone()));
        self.down_proj.forward(gate * self.up_proj.forward(x))
    }
}

/// One pre-norm transformer block.
#[derive(Module, Debug)]
pub struct Block<B: Backend> {
    pub input_norm: RmsNorm<B>,
    pub attention: Attention<B>,
    pub post_attention_norm: RmsNorm<B>,
    pub mlp: Mlp<B>,
    /// The host path's packed copy of the projections (flex only; `None` runs burn's matmul).
    /// Made at load ([`LoadOptions::skinny_format`]) and not updated if the weights are replaced
    /// afterwards: call [`Block::pack`] again, or set it to `None`.
    #[module(skip)]
    pub packed: Option<Arc<PackedBlock>>,
}

impl<B: Backend> Block<B> {
    /// The seven projections in [`PackedBlock`]'s order: q, k, v, o, gate, up, down.
    pub fn projections(&self) -> [&Linear<B>; 7] {
        let a = &self.attention;
        let m = &self.mlp;
        [
            &a.q_proj,
            &a.k_proj,
            &a.v_proj,
            &a.o_proj,
            &m.gate_proj,
            &m.up_proj,
            &m.down_proj,
        ]
    }

    /// Whether [`Block::pack`] can read back the exact weights (burn's tensors, or an f32
    /// packed copy).
    fn holds_exact_weights(&self) -> bool {
        let kept = self.projections().iter().all(|l| l.weight.is_some());
        kept || self
            .packed
            .as_ref()
            .is_some_and(|p| p.qkv.matrix.format() == WeightFormat::F32)
    }

    /// (Re)builds [`Block::packed`] from the current weights (flex only; elsewhere clears it):
    /// burn's tensors when kept, else the packed copy, which only f32 holds exactly (from
    /// another format this is an error: reload the checkpoint in the new format instead).
    pub fn pack(&mut self, format: WeightFormat) -> Result<()> {
        if !is_flex::<B>() {
            self.packed = None;
            return Ok(());
        }
        let a = &self.attention;
        let linears = self.projections();
        let host: [HostProjection; 7] = match &self.packed {
            Some(packed) if linears.iter().any(|l| l.weight.is_none()) => {
                packed.unstack(a.num_heads * a.head_dim, a.num_kv_heads * a.head_dim)?
            }
            _ => {
                let mut host = Vec::with_capacity(7);
                for linear in linears {
                    host.push(linear.host_weights()?);
                }
                host.try_into().map_err(|_| {
                    RuntimeError::InvalidConfig("a block of seven projections".into())
                })?
            }
        };
        let parts = host.each_ref().map(|(w, b)| Projection::of(w, b.as_ref()));
        self.packed = Some(Arc::new(PackedBlock::new(parts, format)?));
        Ok(())
    }

    fn forward(
        &self,
        x: Tensor<B, 2>,
        context: &AttentionContext<B>,
        cache: &mut KvCache<B>,
        layer: usize,
    ) -> Result<Tensor<B, 2>> {
        let attended =
            self.attention
                .forward(self.input_norm.forward(x.clone()), context, cache, layer)?;
        let x = x + attended;
        Ok(x.clone() + self.mlp.forward(self.post_attention_norm.forward(x)))
    }
}

/// Where a forward pass starts.
#[derive(Debug)]
pub enum Input<'a, B: Backend> {
    /// Token ids, embedded first.
    Tokens(&'a [u32]),
    /// The residual stream `[n, hidden]` at the start of the first layer run, e.g. where an
    /// early-exit draft stopped.
    Hidden(Tensor<B, 2>),
}

/// How the new tokens attend to each other (every new token attends to the whole cache).
#[derive(Debug, Clone, Copy)]
pub enum NewTokens<'a> {
    /// Token `i` attends to new tokens `0..=i`: a prompt, a decode step, a chain.
    Causal,
    /// Token `i` attends to new token `j` where `mask[i · n + j]` (an ancestor mask of a token
    /// tree, from `spec_core::tree::TokenTree::ancestor_mask`; the diagonal must be set).
    Mask(&'a [bool]),
}

/// Which rows of the output get logits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LogitRows {
    None,
    Last,
    All,
    /// These rows, in this order.
    Rows(Vec<usize>),
}

/// One forward pass over new tokens.
#[derive(Debug)]
pub struct ForwardRequest<'a, B: Backend> {
    pub input: Input<'a, B>,
    /// The new tokens' positions; by default they continue the cache (`len, len + 1, …`).
    pub positions: Option<&'a [usize]>,
    pub attention: NewTokens<'a>,
    /// The layers to run; by default all of them.
    pub layers: Option<Range<usize>>,
    pub logits: LogitRows,
    /// The residual stream after this many layers (0 = embeddings) is returned for each entry;
    /// every entry must lie in the range run (or equal its end).
    pub hidden_after: Vec<usize>,
}

impl<'a, B: Backend> ForwardRequest<'a, B> {
    /// A causal pass over `tokens` through every layer, with logits of the last one.
    pub fn tokens(tokens: &'a [u32]) -> Self {
        Self {
            input: Input::Tokens(tokens),
            positions: None,
            attention: NewTokens::Causal,
            layers: None,
            logits: LogitRows::Last,
            hidden_after: Vec::new(),
        }
    }

    pub fn logits(mut self, rows: LogitRows) -> Self {
        self.logits = rows;
        self
    }

    pub fn positions(mut self, positions: &'a [usize]) -> Self {
        self.positions = Some(positions);
        self
    }

    pub fn mask(mut self, mask: &'a [bool]) -> Self {
        self.attention = NewTokens::Mask(mask);
        self
    }

    pub fn layers(mut self, layers: Range<usize>) -> Self {
        self.layers = Some(layers);
        self
    }

    pub fn hidden_after(mut self, layers: Vec<usize>) -> Self {
        self.hidden_after = layers;
        self
    }
}

/// What a forward pass returns.
#[derive(Debug)]
pub struct ForwardOutput<B: Backend> {
    /// `[rows, vocab]` for the rows asked for, `None` when none were.
    pub logits: Option<Tensor<B, 2>>,
    /// `[n, hidden]` per entry of `hidden_after`, in that order.
    pub hidden: Vec<Tensor<B, 2>>,
    /// `[n, hidden]`: the residual stream after the last layer run (before the final norm).
    pub last_hidden: Tensor<B, 2>,
}

/// A decoder-only transformer (Llama or Qwen2).
#[derive(Module, Debug)]
pub struct Transformer<B: Backend> {
    /// `[vocab, hidden]`.
    pub embedding: Param<Tensor<B, 2>>,
    pub blocks: Vec<Block<B>>,
    pub norm: RmsNorm<B>,
    /// `None` when the head is tied to the embedding.
    pub lm_head: Option<Linear<B>>,
    /// The tied head's skinny copy of `embedding` (see [`Linear`]); `None` when untied or off.
    #[module(skip)]
    pub tied_head: Option<Arc<SkinnyLinear>>,
    /// Rotary tables `[max_positions, head_dim / 2]`; constants, not trained.
    pub rope_cos: Tensor<B, 2>,
    pub rope_sin: Tensor<B, 2>,
    pub vocab_size: usize,
}

impl<B: Backend> Transformer<B> {
    /// Builds the model from `source`, checking every tensor's shape against `config`, with the
    /// default [`LoadOptions`].
    pub fn load(
        config: &ModelConfig,
        source: &mut dyn WeightSource,
        device: &B::Device,
    ) -> Result<Self> {
        Self::load_with(config, source, device, LoadOptions::default())
    }

    /// [`Transformer::load`] with explicit options.
    pub fn load_with(
        config: &ModelConfig,
        source: &mut dyn WeightSource,
        device: &B::Device,
        options: LoadOptions,
    ) -> Result<Self> {
        config.validate()?;
        if let Some(limit) = options.max_buffer_bytes {
            config.check_buffer_limit(limit)?;
        }
        let (hd, h, kv, ff) = (
            config.hidden_size,
            config.num_heads * config.head_dim,
            config.num_kv_heads * config.head_dim,
            config.intermediate_size,
        );
        let get =
            |source: &mut dyn WeightSource, name: &str, shape: &[usize]| -> Result<HostTensor> {
                let t = source.take(name)?;
                if t.shape != shape {
                    return Err(RuntimeError::ShapeMismatch {
                        name: name.into(),
                        expected: shape.to_vec(),
                        found: t.shape,
                    });
                }
                Ok(t)
            };
        let param2 = |t: HostTensor| Param::from_tensor(t.into_tensor::<B, 2>(device));
        let param1 = |t: HostTensor| Param::from_tensor(t.into_tensor::<B, 1>(device));

        let skinny_format = options.skinny_format.filter(|_| is_flex::<B>());
        // `q4-a8` (and `q4-a8-lossy`) keep a checkpoint's superblocks as they are, unless told
        // not to.
        let keep_superblocks =
            options.keep_superblocks && skinny_format.is_some_and(WeightFormat::keeps_superblocks);
        let embedding = get(
            source,
            "model.embed_tokens.weight",
            &[config.vocab_size, hd],
        )?;
        let tied_head = match skinny_format {
            Some(format) if config.tie_word_embeddings => Some(Arc::new(SkinnyLinear::new(
                &embedding.data,
                config.vocab_size,
                hd,
                None,
                format,
            )?)),
            _ => None,
        };
        let embedding = param2(embedding);
        let mut blocks = Vec::with_capacity(config.num_layers);
        for i in 0..config.num_layers {
            let p = format!("model.layers.{i}");
            let mut take =
                |name: &str, out: usize, inp: usize, bias: bool| -> Result<HostProjection> {
                    let weight = get(source, &format!("{p}.{name}.weight"), &[out, inp])?;
                    let bias = if bias {
                        Some(get(source, &format!("{p}.{name}.bias"), &[out])?)
                    } else {
                        None
                    };
                    Ok((weight, bias))
                };
            let names = BLOCK_PROJECTIONS;
            let host = [
                take(names[0], h, hd, config.qkv_bias)?,
                take(names[1], kv, hd, config.qkv_bias)?,
                take(names[2], kv, hd, config.qkv_bias)?,
                take(names[3], hd, h, false)?,
                take(names[4], ff, hd, false)?,
                take(names[5], ff, hd, false)?,
                take(names[6], hd, ff, false)?,
            ];
            let mut superblocks: [Option<Superblocks>; 7] = Default::default();
            if keep_superblocks {
                for (slot, name) in superblocks.iter_mut().zip(names) {
                    *slot = source.take_superblocks(&format!("{p}.{name}.weight"))?;
                }
            }
            let packed = match skinny_format {
                Some(format) => {
                    let mut parts = superblocks.iter();
                    let projections = host.each_ref().map(|(w, b)| {
                        Projection::of(w, b.as_ref())
                            .with_superblocks(parts.next().and_then(Option::as_ref))
                    });
                    Some(Arc::new(PackedBlock::new(projections, format)?))
                }
                None => None,
            };
            drop(superblocks);
            // The block's own projections run burn's matmul where the packed copy does not
            // serve; without `keep_unpacked` it serves every request and they hold nothing.
            let [q, k, v, o, gate, up, down] = if packed.is_some() && !options.keep_unpacked {
                drop(host);
                std::array::from_fn(|_| Ok(Linear::packed_in_block()))
            } else {
                host.map(|(w, b)| Linear::from_host(w, b, None, true, device))
            };
            let attention = Attention {
                q_proj: q?,
                k_proj: k?,
                v_proj: v?,
                o_proj: o?,
                num_heads: config.num_heads,
                num_kv_heads: config.num_kv_heads,
                head_dim: config.head_dim,
            };
            let mlp = Mlp {
                gate_proj: gate?,
                up_proj: up?,
                down_proj: down?,
            };
            let norm = |t| RmsNorm {
                weight: param1(t),
                eps: config.rms_norm_eps,
            };
            blocks.push(Block {
                input_norm: norm(get(source, &format!("{p}.input_layernorm.weight"), &[hd])?),
                attention,
                post_attention_norm: norm(get(
                    source,
                    &format!("{p}.post_attention_layernorm.weight"),
                    &[hd],
                )?),
                mlp,
                packed,
            });
        }
        let norm = RmsNorm {
            weight: param1(get(source, "model.norm.weight", &[hd])?),
            eps: config.rms_norm_eps,
        };
        let lm_head = if config.tie_word_embeddings {
            None
        } else {
            let weight = get(source, "lm_head.weight", &[config.vocab_size, hd])?;
            let superblocks = if keep_superblocks {
                source.take_superblocks("lm_head.weight")?
            } else {
                None
            };
            Some(match (skinny_format, &superblocks) {
                (Some(format), Some(_)) => {
                    let part = Projection::of(&weight, None).with_superblocks(superblocks.as_ref());
                    let skinny = stack(&[part], format, None)?;
                    Linear::with_skinny(weight, None, Some(skinny), options.keep_unpacked, device)?
                }
                _ => Linear::from_host(weight, None, skinny_format, options.keep_unpacked, device)?,
            })
        };
        let (rope_cos, rope_sin) = rope_tables(config, device);
        Ok(Self {
            embedding,
            blocks,
            norm,
            lm_head,
            tied_head,
            rope_cos,
            rope_sin,
            vocab_size: config.vocab_size,
        })
    }

    pub fn num_layers(&self) -> usize {
        self.blocks.len()
    }

    /// (Re)builds every packed copy (blocks and output head) from the current weights in
    /// `format`, e.g. after training replaced them (flex only; elsewhere clears them).
    /// Without burn's tensors ([`LoadOptions::keep_unpacked`]) only an f32 copy can be
    /// repacked; otherwise this is an error that leaves the model as it was.
    pub fn pack(&mut self, format: WeightFormat) -> Result<()> {
        let head_exact = self
            .lm_head
            .as_ref()
            .is_none_or(Linear::holds_exact_weights);
        if is_flex::<B>() && !(head_exact && self.blocks.iter().all(Block::holds_exact_weights)) {
            return Err(unpacked_dropped("the model"));
        }
        for block in &mut self.blocks {
            block.pack(format)?;
        }
        if let Some(head) = &mut self.lm_head {
            head.pack(format)?;
        }
        self.tied_head = match (&self.lm_head, is_flex::<B>()) {
            (None, true) => {
                let [vocab, hidden] = self.embedding.val().dims();
                let weight = host_f32(self.embedding.val())?;
                Some(Arc::new(SkinnyLinear::new(
                    &weight, vocab, hidden, None, format,
                )?))
            }
            _ => None,
        };
        Ok(())
    }

    /// Bytes of packed weights a decode step streams (every block's projections and the output
    /// head, in the formats they were stored in), or `None` when some are not packed.
    pub fn packed_bytes(&self) -> Option<usize> {
        let head = match (&self.lm_head, &self.tied_head) {
            (Some(head), _) => head.skinny.as_deref(),
            (None, tied) => tied.as_deref(),
        }?;
        let mut bytes = head.matrix.stored_bytes();
        for block in &self.blocks {
            let p = block.packed.as_deref()?;
            bytes += [&p.qkv, &p.o, &p.gate_up, &p.down]
                .iter()
                .map(|l| l.matrix.stored_bytes())
                .sum::<usize>();
        }
        Some(bytes)
    }

    /// Positions the rotary tables cover.
    pub fn max_positions(&self) -> usize {
        self.rope_cos.dims()[0]
    }

    /// An empty cache for this model holding `capacity` positions (capped at the model's
    /// context).
    pub fn new_cache(&self, capacity: usize) -> KvCache<B> {
        let attention = self.blocks.first().map(|b| &b.attention);
        let (kv, d) = attention.map_or((1, 2), |a| (a.num_kv_heads, a.head_dim));
        KvCache::new(
            self.blocks.len(),
            kv,
            d,
            capacity.min(self.max_positions()),
            &self.rope_cos.device(),
        )
    }

    pub fn device(&self) -> B::Device {
        self.rope_cos.device()
    }

    /// Runs `request` and appends its keys and values to `cache` in the layers it runs.
    ///
    /// Shapes: `n` new tokens (or `[n, hidden]` input) in; logits `[rows, vocab]` and hidden
    /// states `[n, hidden]` out. Errors leave the cache as it was for the layers not yet run;
    /// callers truncate to their own length after an error.
    pub fn forward(
        &self,
        request: ForwardRequest<'_, B>,
        cache: &mut KvCache<B>,
    ) -> Result<ForwardOutput<B>> {
        let device = self.device();
        let layers = request.layers.clone().unwrap_or(0..self.blocks.len());
        if layers.start >= layers.end || layers.end > self.blocks.len() {
            return Err(RuntimeError::InvalidRequest(format!(
                "layer range {layers:?} of a {}-layer model",
                self.blocks.len()
            )));
        }
        if cache.num_layers() != self.blocks.len() {
            return Err(RuntimeError::InvalidRequest(format!(
                "a cache of {} layers for a {}-layer model",
                cache.num_layers(),
                self.blocks.len()
            )));
        }
        if let Some(&bad) = request
            .hidden_after
            .iter()
            .find(|&&l| l < layers.start || l > layers.end)
        {
            return Err(RuntimeError::InvalidRequest(format!(
                "hidden state after {bad} layers is outside the range run, {layers:?}"
            )));
        }
        let cached = cache.layer_len(layers.start);
        if layers.clone().any(|l| cache.layer_len(l) != cached) {
            return Err(RuntimeError::InvalidRequest(
                "the layers run hold different numbers of cached positions".into(),
            ));
        }

        let x = match request.input {
            Input::Tokens(tokens) => {
                if layers.start != 0 {
                    return Err(RuntimeError::InvalidRequest(
                        "token input must start at layer 0".into(),
                    ));
                }
                if let Some(&token) = tokens.iter().find(|&&t| t as usize >= self.vocab_size) {
                    return Err(RuntimeError::TokenOutOfVocabulary {
                        token,
                        vocab: self.vocab_size,
                    });
                }
                let ids: Vec<i64> = tokens.iter().map(|&t| i64::from(t)).collect();
                let n = ids.len();
                let ids = Tensor::<B, 1, Int>::from_data(TensorData::new(ids, [n]), &device);
                self.embedding.val().select(0, ids)
            }
            Input::Hidden(h) => h,
        };
        let n = x.dims()[0];
        if n == 0 {
            return Err(RuntimeError::InvalidRequest("no new tokens".into()));
        }
        if cached + n > cache.capacity() {
            return Err(RuntimeError::ContextOverflow {
                needed: cached + n,
                capacity: cache.capacity(),
            });
        }
        let positions: Vec<usize> = match request.positions {
            Some(p) if p.len() != n => {
                return Err(RuntimeError::InvalidRequest(format!(
                    "{} positions for {n} tokens",
                    p.len()
                )));
            }
            Some(p) => p.to_vec(),
            None => (cached..cached + n).collect(),
        };
        if let Some(&p) = positions.iter().find(|&&p| p >= self.max_positions()) {
            return Err(RuntimeError::ContextOverflow {
                needed: p + 1,
                capacity: self.max_positions(),
            });
        }
        // Rows asked for are checked before any layer writes to the cache.
        let logit_rows: Option<Vec<usize>> = match &request.logits {
            LogitRows::None => None,
            LogitRows::All => Some((0..n).collect()),
            LogitRows::Last => Some(vec![n - 1]),
            LogitRows::Rows(rows) => {
                if let Some(&r) = rows.iter().find(|&&r| r >= n) {
                    return Err(RuntimeError::InvalidRequest(format!(
                        "logits of row {r} of {n}"
                    )));
                }
                Some(rows.clone())
            }
        };
        // On flex with every projection run packed, the whole pass runs on the host.
        let packed: Option<Vec<&PackedBlock>> = if cache.is_host() {
            layers
                .clone()
                .map(|l| self.blocks[l].packed.as_deref())
                .collect()
        } else {
            None
        };
        if let Some(packed) = packed {
            check_mask(n, request.attention)?;
            let pass = HostPass {
                positions: &positions,
                cached,
                attention: request.attention,
                layers,
                logit_rows,
                hidden_after: &request.hidden_after,
            };
            return self.forward_host(x, &packed, pass, cache);
        }

        let total = cached + n;
        let attended = cache.attended_len(total);
        let bias = attention_bias(n, cached, request.attention, attended)?;
        let (cos, sin) = self.rope_rows(&positions);
        let context = AttentionContext {
            cos,
            sin,
            bias: Tensor::from_data(TensorData::new(bias, [n, attended]), &device),
        };
        let mut hidden = Vec::new();
        let mut x = x;
        for l in layers.clone() {
            if request.hidden_after.contains(&l) {
                hidden.push((l, x.clone()));
            }
            x = self.blocks[l].forward(x, &context, cache, l)?;
        }
        if request.hidden_after.contains(&layers.end) {
            hidden.push((layers.end, x.clone()));
        }
        let hidden = request
            .hidden_after
            .iter()
            .filter_map(|l| hidden.iter().find(|(k, _)| k == l).map(|(_, t)| t.clone()))
            .collect();

        let logits = logit_rows.map(|rows| {
            if rows.len() == n && rows.iter().enumerate().all(|(i, &r)| i == r) {
                self.logits(x.clone())
            } else {
                let ids: Vec<i64> = rows.iter().map(|&r| r as i64).collect();
                let ids =
                    Tensor::<B, 1, Int>::from_data(TensorData::new(ids, [rows.len()]), &device);
                self.logits(x.clone().select(0, ids))
            }
        });
        Ok(ForwardOutput {
            logits,
            hidden,
            last_hidden: x,
        })
    }

    /// [`Transformer::forward`] on the host path (`crate::host`) for every layer of
    /// `pass.layers` (`packed` holds their packed projections). `x` `[n, hidden]` is the input
    /// of the first layer run.
    ///
    /// The new tokens run in passes of at most [`HOST_PASS_ROWS`] when none attends to a later
    /// one (a causal chain or prompt, a tree in topological order): each pass finds the earlier
    /// passes' keys in the cache, so the result is one pass's. Other masks take one pass of
    /// every row.
    fn forward_host(
        &self,
        x: Tensor<B, 2>,
        packed: &[&PackedBlock],
        pass: HostPass<'_>,
        cache: &mut KvCache<B>,
    ) -> Result<ForwardOutput<B>> {
        let device = self.device();
        let [n, hidden_size] = x.dims();
        let mut x = host_f32(x)?;
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
            let (cos, sin) = self.rope_rows(&pass.positions[start..end]);
            let (cos, sin) = (host_f32(cos)?, host_f32(sin)?);
            let step = HostStep {
                n: end - start,
                cos: &cos,
                sin: &sin,
                bias: &bias,
            };
            let rows = &mut x[start * hidden_size..end * hidden_size];
            for (l, block) in pass.layers.clone().zip(packed) {
                record(l, rows);
                host::block_forward(&self.blocks[l], block, rows, &step, cache, l)?;
            }
            record(pass.layers.end, rows);
            start = end;
        }
        let to_tensor =
            |v: Vec<f32>| Tensor::<B, 2>::from_data(TensorData::new(v, [n, hidden_size]), &device);
        let logits = pass
            .logit_rows
            .map(|rows| self.logits_host(&x, hidden_size, &rows))
            .transpose()?;
        Ok(ForwardOutput {
            logits,
            hidden: hidden.into_iter().map(to_tensor).collect(),
            last_hidden: to_tensor(x),
        })
    }

    /// [`Transformer::logits`] of rows `rows` of the host residual stream `x` `[n, hidden]`,
    /// on the host when the head has a packed copy.
    fn logits_host(&self, x: &[f32], hidden: usize, rows: &[usize]) -> Result<Tensor<B, 2>> {
        let mut picked = Vec::with_capacity(rows.len() * hidden);
        for &r in rows {
            picked.extend_from_slice(&x[r * hidden..(r + 1) * hidden]);
        }
        let head = match (&self.lm_head, &self.tied_head) {
            (Some(head), _) => head.skinny.as_deref(),
            (None, tied) => tied.as_deref(),
        };
        let device = self.device();
        match head {
            Some(head) => {
                let normed = host::rms_norm(&picked, rows.len(), &self.norm)?;
                let y = head.apply(&normed, rows.len())?;
                Ok(Tensor::from_data(
                    TensorData::new(y, [rows.len(), head.matrix.rows()]),
                    &device,
                ))
            }
            None => Ok(self.logits(Tensor::from_data(
                TensorData::new(picked, [rows.len(), hidden]),
                &device,
            ))),
        }
    }

    /// Final norm and output head: `[rows, hidden] -> [rows, vocab]`. Also the exit head of
    /// early-exit drafting, which applies it to an intermediate layer's output.
    pub fn logits(&self, x: Tensor<B, 2>) -> Tensor<B, 2> {
        let x = self.norm.forward(x);
        match (&self.lm_head, &self.tied_head) {
            (Some(head), _) => head.forward(x),
            (None, Some(tied)) if x.dims()[0] <= SKINNY_MAX_ROWS => match tied.forward(&x) {
                Some(y) => y,
                None => matmul(x, self.embedding.val().transpose()),
            },
            (None, _) => matmul(x, self.embedding.val().transpose()),
        }
    }

    /// Rotary tables `[n, head_dim / 2]` (cos, sin) at `positions`.
    fn rope_rows(&self, positions: &[usize]) -> (Tensor<B, 2>, Tensor<B, 2>) {
        let n = positions.len();
        let ids: Vec<i64> = positions.iter().map(|&p| p as i64).collect();
        let ids = Tensor::<B, 1, Int>::from_data(TensorData::new(ids, [n]), &self.device());
        (
            self.rope_cos.clone().select(0, ids.clone()),
            self.rope_sin.clone().select(0, ids),
        )
    }
}

/// What [`Transformer::forward_host`] runs, besides the input and the packed blocks.
struct HostPass<'a> {
    positions: &'a [usize],
    /// Positions in the cache before the pass.
    cached: usize,
    attention: NewTokens<'a>,
    layers: Range<usize>,
    logit_rows: Option<Vec<usize>>,
    hidden_after: &'a [usize],
}

/// Checks a mask's size and diagonal for `n` new tokens (a causal pass has nothing to check).
fn check_mask(n: usize, attention: NewTokens<'_>) -> Result<()> {
    if let NewTokens::Mask(mask) = attention {
        if mask.len() != n * n {
            return Err(RuntimeError::InvalidRequest(format!(
                "a mask of {} entries for {n} new tokens",
                mask.len()
            )));
        }
        if (0..n).any(|i| !mask[i * n + i]) {
            return Err(RuntimeError::InvalidRequest(
                "every new token must attend to itself".into(),
            ));
        }
    }
    Ok(())
}

/// Whether no new token attends to a later one, so the tokens can run in consecutive passes.
fn attends_only_backwards(n: usize, attention: NewTokens<'_>) -> bool {
    match attention {
        NewTokens::Causal => true,
        NewTokens::Mask(mask) => (0..n).all(|i| (i + 1..n).all(|j| !mask[i * n + j])),
    }
}

/// The attention bias `[n, width]` of `n` new tokens after `cached` positions (`width` at
/// least `cached + n`): 0 where a new token may attend, -inf elsewhere.
fn attention_bias(
    n: usize,
    cached: usize,
    attention: NewTokens<'_>,
    width: usize,
) -> Result<Vec<f32>> {
    check_mask(n, attention)?;
    Ok(bias_rows(n, cached, 0..n, attention, width))
}

/// Rows `rows` of the attention bias of `n` new tokens after `cached` positions,
/// `[rows.len(), width]`: columns from `cached + rows.end` on (positions later than the last
/// of these rows, or padding past the cache's end) are -inf. The mask (if any) is checked
/// already.
fn bias_rows(
    n: usize,
    cached: usize,
    rows: Range<usize>,
    attention: NewTokens<'_>,
    width: usize,
) -> Vec<f32> {
    let visible_end = cached + rows.end;
    debug_assert!(width >= visible_end);
    let mut bias = vec![0.0f32; rows.len() * width];
    if width == 0 {
        return bias;
    }
    for (out, i) in bias.chunks_exact_mut(width).zip(rows.clone()) {
        for j in 0..rows.end {
            let visible = match attention {
                NewTokens::Causal => j <= i,
                NewTokens::Mask(mask) => mask[i * n + j],
            };
            if !visible {
                out[cached + j] = f32::NEG_INFINITY;
            }
        }
        out[visible_end..].fill(f32::NEG_INFINITY);
    }
    bias
}

/// `cos` and `sin` of `position · θ^(−2i/d)` for every position of the context, computed in f64.
fn rope_tables<B: Backend>(
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
