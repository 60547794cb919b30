//! Packing a model's weights for the host path (`crate::host`): each projection, or a block's
//! projections stacked, copied into `spec-kernels`' [`PackedMatrix`] in a [`WeightFormat`].
//!
//! Loading packs as it reads ([`LoadOptions::skinny_format`]); [`Transformer::pack`] packs
//! again from the weights held, e.g. after training replaced them.
//!
//! [`LoadOptions::skinny_format`]: crate::load::LoadOptions::skinny_format

use std::sync::Arc;

use burn::tensor::{Tensor, TensorData, backend::Backend};
use spec_kernels::{PackedMatrix, WeightFormat};

use crate::error::{Result, RuntimeError};
use crate::host::{is_flex, read_f32};
use crate::model::linear::{DenseAndPacked, HostProjection, PackedCopy, Weight, check_width};
use crate::model::{Block, Head, Linear, Transformer};
use crate::weights::{HostTensor, Superblocks};

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

    /// Whether the host product takes `x`: float data of the packed width.
    pub(crate) fn takes<B: Backend>(&self, x: &Tensor<B, 2>) -> bool {
        x.dims()[1] == self.matrix.cols() && x.dtype().is_float()
    }

    /// `[n, in] -> [n, out]` on the host.
    pub(crate) fn forward<B: Backend>(&self, x: &Tensor<B, 2>) -> Result<Tensor<B, 2>> {
        let [n, k] = x.dims();
        check_width(k, self.matrix.cols(), self.matrix.rows())?;
        if !x.dtype().is_float() {
            return Err(RuntimeError::InvalidRequest(format!(
                "an input of {:?} for a packed projection",
                x.dtype()
            )));
        }
        let data = x.clone().into_data().convert::<f32>();
        let data = data
            .as_slice::<f32>()
            .map_err(|e| RuntimeError::InvalidRequest(format!("reading an input: {e:?}")))?;
        let y = self.apply(data, n)?;
        Ok(Tensor::from_data(
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
    /// Whether `gate_up` runs with SwiGLU in the product (`SkinnyLinear::swiglu`): each
    /// thread computes a feature's gate and up and hands on only `silu(gate) · up`. Taken where
    /// the intermediate size is a multiple of [`spec_kernels::SWIGLU_RUN`] and neither
    /// projection has a bias.
    pub swiglu_paired: bool,
    pub down: SkinnyLinear,
}

/// A projection's host weights `[rows, cols]` and bias `[rows]`, borrowed for packing, and
/// the checkpoint's superblocks of the weights when it has them.
pub(crate) struct Projection<'a> {
    weight: &'a [f32],
    rows: usize,
    cols: usize,
    bias: Option<&'a [f32]>,
    superblocks: Option<&'a Superblocks>,
}

impl<'a> Projection<'a> {
    pub(crate) fn of(weight: &'a HostTensor, bias: Option<&'a HostTensor>) -> Self {
        Self {
            weight: &weight.data,
            rows: weight.shape.first().copied().unwrap_or(0),
            cols: weight.shape.get(1).copied().unwrap_or(0),
            bias: bias.map(|b| b.data.as_slice()),
            superblocks: None,
        }
    }

    pub(crate) fn with_superblocks(self, superblocks: Option<&'a Superblocks>) -> Self {
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
pub(crate) fn stack(
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
    pub(crate) fn new(p: [Projection<'_>; 7], format: WeightFormat) -> Result<Self> {
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

/// The error for repacking weights whose exact values are no longer held.
fn unpacked_dropped(what: &str) -> RuntimeError {
    RuntimeError::InvalidRequest(format!(
        "{what} keeps only a packed copy that is not f32, so its exact weights are gone: reload \
         the checkpoint in the new format (or load with LoadOptions::keep_unpacked)"
    ))
}

/// The error for packing a projection that only its block's packed copy holds.
fn held_by_block() -> RuntimeError {
    RuntimeError::InvalidRequest(
        "a projection whose weights only its block's packed copy holds cannot be packed by \
         itself: pack the block"
            .into(),
    )
}

impl<B: Backend> Linear<B> {
    /// Whether [`Linear::pack`] can read back the exact weights (burn's tensors, or an f32
    /// packed copy).
    fn holds_exact_weights(&self) -> bool {
        match &self.weight {
            Weight::Dense(_) | Weight::Both(_) => true,
            Weight::Packed(packed) => packed.linear.matrix.format() == WeightFormat::F32,
            Weight::InBlock(_) => false,
        }
    }

    /// The weights `[out, in]` and bias as f32 on the host: burn's tensors when held, else the
    /// packed copy's when it holds them exactly (f32).
    fn host_weights(&self) -> Result<HostProjection> {
        match &self.weight {
            Weight::Dense(dense) | Weight::Both(DenseAndPacked { dense, .. }) => dense.host(),
            Weight::Packed(packed) => packed.linear.exact_weights(),
            Weight::InBlock(_) => Err(held_by_block()),
        }
    }

    /// (Re)builds the packed copy from the current weights (flex only: other backends hold no
    /// packed copies, and there this does nothing). Without burn's tensors the packed copy is
    /// the source, which only f32 holds exactly; from another format this is an error (reload
    /// the checkpoint instead).
    pub fn pack(&mut self, format: WeightFormat) -> Result<()> {
        if !is_flex::<B>() {
            return Ok(());
        }
        self.weight = match &self.weight {
            Weight::Dense(dense) | Weight::Both(DenseAndPacked { dense, .. }) => {
                Weight::Both(DenseAndPacked {
                    dense: dense.clone(),
                    packed: PackedCopy::new(pack_host(dense.host()?, format)?),
                })
            }
            Weight::Packed(packed) => Weight::Packed(PackedCopy::new(pack_host(
                packed.linear.exact_weights()?,
                format,
            )?)),
            Weight::InBlock(_) => return Err(held_by_block()),
        };
        Ok(())
    }
}

/// A projection's host weight `[out, in]` and bias packed in `format`.
fn pack_host((weight, bias): HostProjection, format: WeightFormat) -> Result<SkinnyLinear> {
    let &[out, inp] = weight.shape.as_slice() else {
        return Err(RuntimeError::InvalidConfig(format!(
            "a projection of shape {:?}",
            weight.shape
        )));
    };
    SkinnyLinear::new(&weight.data, out, inp, bias.map(|b| b.data), format)
}

impl<B: Backend> Block<B> {
    /// Whether [`Block::pack`] can read back the exact weights (burn's tensors, or an f32
    /// packed copy).
    fn holds_exact_weights(&self) -> bool {
        let dense = self.projections().iter().all(|l| l.tensors().is_some());
        dense
            || self
                .packed
                .as_ref()
                .is_some_and(|p| p.qkv.matrix.format() == WeightFormat::F32)
    }

    /// (Re)builds [`Block::packed()`] from the current weights (flex only: other backends hold
    /// no packed copies, and there this does nothing): burn's tensors when held, else the packed
    /// copy, which only f32 holds exactly (from another format this is an error: reload the
    /// checkpoint in the new format instead).
    pub fn pack(&mut self, format: WeightFormat) -> Result<()> {
        if !is_flex::<B>() {
            return Ok(());
        }
        let linears = self.projections();
        let dense = linears.iter().all(|l| l.tensors().is_some());
        let a = &self.attention;
        let host: [HostProjection; 7] = match &self.packed {
            Some(packed) if !dense => {
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
}

impl<B: Backend> Transformer<B> {
    /// (Re)builds every packed copy (blocks and output head) from the current weights in
    /// `format`, e.g. after training replaced them (flex only; elsewhere this does nothing).
    /// Without burn's tensors ([`LoadOptions::keep_unpacked`]) only an f32 copy can be
    /// repacked; otherwise this is an error that leaves the model as it was.
    ///
    /// [`LoadOptions::keep_unpacked`]: crate::load::LoadOptions::keep_unpacked
    pub fn pack(&mut self, format: WeightFormat) -> Result<()> {
        let head_exact = match &self.head {
            Head::Tied(_) => true,
            Head::Own(linear) => linear.holds_exact_weights(),
        };
        if is_flex::<B>() && !(head_exact && self.blocks.iter().all(Block::holds_exact_weights)) {
            return Err(unpacked_dropped("the model"));
        }
        for block in &mut self.blocks {
            block.pack(format)?;
        }
        match &mut self.head {
            Head::Own(linear) => linear.pack(format)?,
            Head::Tied(packed) if is_flex::<B>() => {
                let [vocab, hidden] = self.embedding.dims();
                let weight = read_f32(self.embedding.val())?;
                *packed = Some(PackedCopy::new(SkinnyLinear::new(
                    &weight, vocab, hidden, None, format,
                )?));
            }
            Head::Tied(_) => {}
        }
        Ok(())
    }

    /// Bytes of packed weights a decode step streams (every block's projections and the output
    /// head, in the formats they are stored in), or `None` when some are not packed.
    pub fn packed_bytes(&self) -> Option<usize> {
        let mut bytes = self.head.packed()?.matrix.stored_bytes();
        for block in &self.blocks {
            let p = block.packed.as_deref()?;
            bytes += [&p.qkv, &p.o, &p.gate_up, &p.down]
                .iter()
                .map(|l| l.matrix.stored_bytes())
                .sum::<usize>();
        }
        Some(bytes)
    }
}
