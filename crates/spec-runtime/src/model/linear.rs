//! A dense projection and the forms its weights are held in.

use std::marker::PhantomData;
use std::sync::Arc;

use burn::module::{Module, Param};
use burn::tensor::{Tensor, backend::Backend};

use crate::error::{Result, RuntimeError};
use crate::host::is_flex;
use crate::pack::SkinnyLinear;
use crate::weights::HostTensor;

/// Inputs of at most this many rows take a projection's packed copy when it also holds burn's
/// tensors ([`Weight::Both`]); with the packed copy alone every input does.
pub const SKINNY_MAX_ROWS: usize = 16;

/// A dense projection `y = x Wᵀ + b` with `W` stored `[out, in]`, held in one of the forms of
/// [`Weight`].
///
/// On the flex (CPU) backend a projection may hold a host copy of its weights packed for
/// `spec-kernels`' skinny product, which serves a decode or verification step at close to memory
/// bandwidth; longer inputs and other backends use burn's matmul. The copy is made at load
/// ([`LoadOptions::skinny_format`](crate::load::LoadOptions::skinny_format)) and is not updated
/// if burn's tensors are replaced afterwards: call [`Linear::pack`] again.
#[derive(Module, Debug)]
pub struct Linear<B: Backend> {
    /// Set by the crate only, so that a [`Weight::InBlock`] projection always sits in a block
    /// with a packed copy.
    pub(crate) weight: Weight<B>,
}

/// The forms a projection's weights are held in, one variant each, so that no code asks which
/// of several options is set and no combination of them is impossible.
///
/// burn's `#[derive(Module)]` takes an enum whose variants each hold one module. burn's tensors
/// are parameters ([`Dense`]); a packed copy is host data, held in [`PackedCopy`], which has no
/// backend and so derives as a module without parameters; a projection that only its block's
/// packed copy holds keeps a `PhantomData`, burn's module of nothing. Mapping, recording and
/// moving the model between devices thus see exactly burn's tensors.
#[derive(Module, Debug)]
pub enum Weight<B: Backend> {
    /// burn's tensors only: every input runs burn's matmul.
    Dense(Dense<B>),
    /// A packed copy only (flex): it serves every input.
    Packed(PackedCopy),
    /// burn's tensors and a packed copy
    /// ([`LoadOptions::keep_unpacked`](crate::load::LoadOptions::keep_unpacked), or
    /// [`Linear::pack`] of dense weights): the copy serves inputs of at most [`SKINNY_MAX_ROWS`]
    /// rows, burn's matmul longer ones.
    Both(DenseAndPacked<B>),
    /// Held only by its block's packed copy ([`Block::packed`](crate::model::Block::packed())),
    /// which runs the projection together with the block's others.
    InBlock(PhantomData<B>),
}

/// A projection's burn tensors.
#[derive(Module, Debug)]
pub struct Dense<B: Backend> {
    /// `[out_features, in_features]`.
    pub weight: Param<Tensor<B, 2>>,
    /// `[out_features]`.
    pub bias: Option<Param<Tensor<B, 1>>>,
}

/// A projection's packed host copy, shared between clones of the model.
#[derive(Module, Clone, Debug)]
pub struct PackedCopy {
    pub linear: Arc<SkinnyLinear>,
}

/// burn's tensors and a packed copy of the same weights.
#[derive(Module, Debug)]
pub struct DenseAndPacked<B: Backend> {
    pub dense: Dense<B>,
    pub packed: PackedCopy,
}

/// A projection's host weight `[out, in]` and bias `[out]`.
pub(crate) type HostProjection = (HostTensor, Option<HostTensor>);

impl<B: Backend> Dense<B> {
    pub(crate) fn from_host(
        weight: HostTensor,
        bias: Option<HostTensor>,
        device: &B::Device,
    ) -> Self {
        Self {
            weight: Param::from_tensor(weight.into_tensor::<B, 2>(device)),
            bias: bias.map(|b| Param::from_tensor(b.into_tensor::<B, 1>(device))),
        }
    }

    /// `[n, in] -> [n, out]` with burn's matmul.
    fn forward(&self, x: Tensor<B, 2>) -> Result<Tensor<B, 2>> {
        let [out, inp] = self.weight.dims();
        check_width(x.dims()[1], inp, out)?;
        let y = matmul(x, self.weight.val().transpose());
        Ok(match &self.bias {
            Some(b) => y + b.val().unsqueeze::<2>(),
            None => y,
        })
    }

    /// The weight and bias as f32 on the host.
    pub(crate) fn host(&self) -> Result<HostProjection> {
        let bias = match &self.bias {
            Some(b) => Some(HostTensor {
                shape: b.dims().to_vec(),
                data: crate::host::read_f32(b.val())?,
            }),
            None => None,
        };
        let weight = HostTensor {
            shape: self.weight.dims().to_vec(),
            data: crate::host::read_f32(self.weight.val())?,
        };
        Ok((weight, bias))
    }
}

impl PackedCopy {
    pub(crate) fn new(linear: SkinnyLinear) -> Self {
        Self {
            linear: Arc::new(linear),
        }
    }
}

impl<B: Backend> Linear<B> {
    /// A projection from host weights `[out, in]` and bias `[out]`, with a packed copy in
    /// `skinny_format` when `B` is flex; with a packed copy, burn's tensors only if
    /// `keep_unpacked`.
    pub fn from_host(
        weight: HostTensor,
        bias: Option<HostTensor>,
        skinny_format: Option<spec_kernels::WeightFormat>,
        keep_unpacked: bool,
        device: &B::Device,
    ) -> Result<Self> {
        let packed = match (skinny_format, weight.shape.as_slice()) {
            (Some(format), &[out, inp]) if is_flex::<B>() => Some(SkinnyLinear::new(
                &weight.data,
                out,
                inp,
                bias.as_ref().map(|b| b.data.clone()),
                format,
            )?),
            _ => None,
        };
        Ok(Self::with_packed(
            weight,
            bias,
            packed,
            keep_unpacked,
            device,
        ))
    }

    /// A projection from host weights and its packed copy (if any), keeping burn's tensors
    /// only without one or if `keep_unpacked`.
    pub(crate) fn with_packed(
        weight: HostTensor,
        bias: Option<HostTensor>,
        packed: Option<SkinnyLinear>,
        keep_unpacked: bool,
        device: &B::Device,
    ) -> Self {
        let weight = match packed.map(PackedCopy::new) {
            None => Weight::Dense(Dense::from_host(weight, bias, device)),
            Some(packed) if keep_unpacked => Weight::Both(DenseAndPacked {
                dense: Dense::from_host(weight, bias, device),
                packed,
            }),
            Some(packed) => Weight::Packed(packed),
        };
        Self { weight }
    }

    /// A projection of burn's tensors only, from host weights `[out, in]` and bias `[out]`.
    pub(crate) fn dense(weight: HostTensor, bias: Option<HostTensor>, device: &B::Device) -> Self {
        Self {
            weight: Weight::Dense(Dense::from_host(weight, bias, device)),
        }
    }

    /// A projection whose weights only its block's packed copy holds.
    pub(crate) fn in_block() -> Self {
        Self {
            weight: Weight::InBlock(PhantomData),
        }
    }

    /// The form its weights are held in.
    pub fn weight(&self) -> &Weight<B> {
        &self.weight
    }

    /// burn's tensors, where held.
    pub fn tensors(&self) -> Option<&Dense<B>> {
        match &self.weight {
            Weight::Dense(dense) | Weight::Both(DenseAndPacked { dense, .. }) => Some(dense),
            Weight::Packed(_) | Weight::InBlock(_) => None,
        }
    }

    /// The projection's own packed copy, where held.
    pub fn packed(&self) -> Option<&SkinnyLinear> {
        match &self.weight {
            Weight::Packed(packed) | Weight::Both(DenseAndPacked { packed, .. }) => {
                Some(&packed.linear)
            }
            Weight::Dense(_) | Weight::InBlock(_) => None,
        }
    }

    /// `[n, in] -> [n, out]`. An input of the wrong width, and a projection that only its
    /// block's packed copy holds (the block runs it), are errors.
    pub fn forward(&self, x: Tensor<B, 2>) -> Result<Tensor<B, 2>> {
        match &self.weight {
            Weight::Dense(dense) => dense.forward(x),
            Weight::Packed(packed) => packed.linear.forward(&x),
            Weight::Both(both) => {
                let packed = &both.packed.linear;
                if x.dims()[0] <= SKINNY_MAX_ROWS && packed.takes(&x) {
                    packed.forward(&x)
                } else {
                    both.dense.forward(x)
                }
            }
            Weight::InBlock(_) => Err(RuntimeError::InvalidRequest(
                "this projection's weights are held by its block's packed copy only (loaded \
                 without LoadOptions::keep_unpacked); run the block through Transformer::forward"
                    .into(),
            )),
        }
    }
}

/// The error for an input of `found` features to a projection `[out, expected]`.
pub(crate) fn check_width(found: usize, expected: usize, out: usize) -> Result<()> {
    if found == expected {
        return Ok(());
    }
    Err(RuntimeError::InvalidRequest(format!(
        "an input of {found} features for a projection of {expected} to {out}"
    )))
}

/// `lhs.matmul(rhs)`, with a one-row `lhs` computed as `(rhsᵀ · lhsᵀ)ᵀ` outside flex: burn
/// 0.21's fused matmul runs cubek 0.2's `gemv_unit_perpendicular` kernel on one-row products,
/// and that kernel misreads a transposed (column-major) `rhs` such as `weight.transpose()`
/// (tracel-ai/cubek#262). `rhsᵀ` is then the weight as stored, row-major, and the product a
/// one-column one: one kernel, where padding `lhs` to two rows would add a `cat` and a
/// `narrow` to every product.
pub(crate) fn matmul<B: Backend, const D: usize>(
    lhs: Tensor<B, D>,
    rhs: Tensor<B, D>,
) -> Tensor<B, D> {
    let rows = D - 2;
    if lhs.dims()[rows] == 1 && !is_flex::<B>() {
        return rhs.transpose().matmul(lhs.transpose()).transpose();
    }
    lhs.matmul(rhs)
}
