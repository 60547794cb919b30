//! The decoder: Llama and Qwen2 share one implementation (RMSNorm, rotary embeddings,
//! grouped-query attention, SwiGLU); they differ in the q/k/v biases, which the config states.
//!
//! Activations are `[tokens, features]` for a single sequence; heads are split only inside
//! attention. One entry point, [`Transformer::forward`], serves a prompt, a decode step, a chain
//! of drafts and a token tree, and can run a range of layers only (early exit).
//!
//! This file is the model's definition, written with burn's tensor ops, from the leaves up;
//! `linear` holds a projection's weight forms, `rope` and `mask` the rotary embedding and the
//! attention bias. Loading is [`crate::load`], packing the weights for the host path
//! `crate::pack`, and the host path itself `crate::host`.

pub(crate) mod linear;
pub(crate) mod mask;
pub(crate) mod rope;

use std::ops::Range;
use std::sync::Arc;

use burn::module::{Module, Param};
use burn::tensor::{Int, Tensor, TensorData, activation, backend::Backend};

use crate::cache::KvCache;
use crate::error::{Result, RuntimeError};
use crate::host::{self, HostPass};
use linear::{check_width, matmul};
use mask::{attention_bias, check_mask};
use rope::rotate;

pub use crate::host::HOST_PASS_ROWS;
pub use crate::load::{BLOCK_PROJECTIONS, LoadOptions};
pub use crate::pack::{PackedBlock, SkinnyLinear};
pub use linear::{Dense, DenseAndPacked, Linear, PackedCopy, SKINNY_MAX_ROWS, Weight};
pub use spec_kernels::WeightFormat;

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
        let q = rotate(
            split(self.q_proj.forward(x.clone())?, h),
            &context.cos,
            &context.sin,
        );
        let k = rotate(
            split(self.k_proj.forward(x.clone())?, kv),
            &context.cos,
            &context.sin,
        );
        let v = split(self.v_proj.forward(x)?, kv);
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
        self.o_proj.forward(out)
    }
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
    pub fn forward(&self, x: Tensor<B, 2>) -> Result<Tensor<B, 2>> {
        let gate = activation::silu(self.gate_proj.forward(x.clone())?);
        self.down_proj.forward(gate * self.up_proj.forward(x)?)
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
    /// Made at load ([`LoadOptions::skinny_format`]) and not updated if burn's tensors are
    /// replaced afterwards: call [`Block::pack`] again. Only the crate sets it: it is `Some`
    /// whenever a projection is [`Weight::InBlock`].
    #[module(skip)]
    pub(crate) packed: Option<Arc<PackedBlock>>,
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

    /// The host path's packed copy of the projections, where made.
    pub fn packed(&self) -> Option<&PackedBlock> {
        self.packed.as_deref()
    }

    /// `[n, hidden] -> [n, hidden]` through burn's ops; appends the new keys and values to
    /// `cache` at `layer`.
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
        Ok(x.clone() + self.mlp.forward(self.post_attention_norm.forward(x))?)
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
    /// Token `i` attends to the last `span` cached positions and to the new tokens where row
    /// `i` of `mask` (`[n, span + n]`) says: column `j < span` is cached position
    /// `cached − span + j`, column `span + j` is new token `j` (the diagonal must be set).
    /// Positions before the span are always visible. A token tree fed one level at a time: the
    /// levels already in the cache are the span, and each new node sees only its ancestors.
    MaskWithCached { span: usize, mask: &'a [bool] },
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

    /// Attention over the last `span` cached positions and the new tokens by `mask` (see
    /// [`NewTokens::MaskWithCached`]).
    pub fn mask_with_cached(mut self, span: usize, mask: &'a [bool]) -> Self {
        self.attention = NewTokens::MaskWithCached { span, mask };
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

/// The output head: the embedding matrix itself (tied) or a projection of its own.
// A model has one head, so the room a tied head leaves unused does not matter (and burn's
// derive takes no `Box`).
#[allow(clippy::large_enum_variant)]
#[derive(Module, Debug)]
pub enum Head<B: Backend> {
    /// [`Transformer::embedding`], with its packed copy where one is made (flex, see
    /// [`Linear`]): the copy serves inputs of at most [`SKINNY_MAX_ROWS`] rows on burn's path
    /// and every row on the host path.
    Tied(Option<PackedCopy>),
    /// `lm_head.weight` `[vocab, hidden]`.
    Own(Linear<B>),
}

impl<B: Backend> Head<B> {
    /// The head's packed copy, where made.
    pub fn packed(&self) -> Option<&SkinnyLinear> {
        match self {
            Head::Tied(packed) => packed.as_ref().map(|p| p.linear.as_ref()),
            Head::Own(linear) => linear.packed(),
        }
    }
}

/// A decoder-only transformer (Llama or Qwen2).
#[derive(Module, Debug)]
pub struct Transformer<B: Backend> {
    /// `[vocab, hidden]`.
    pub embedding: Param<Tensor<B, 2>>,
    pub blocks: Vec<Block<B>>,
    pub norm: RmsNorm<B>,
    pub head: Head<B>,
    /// Rotary tables `[max_positions, head_dim / 2]`; constants, not trained.
    pub rope_cos: Tensor<B, 2>,
    pub rope_sin: Tensor<B, 2>,
    pub vocab_size: usize,
}

impl<B: Backend> Transformer<B> {
    pub fn num_layers(&self) -> usize {
        self.blocks.len()
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
            layers.clone().map(|l| self.blocks[l].packed()).collect()
        } else {
            None
        };
        if let Some(packed) = packed {
            check_mask(n, cached, request.attention)?;
            let pass = HostPass {
                positions: &positions,
                cached,
                attention: request.attention,
                layers,
                logit_rows,
                hidden_after: &request.hidden_after,
            };
            return host::forward(self, x, &packed, pass, cache);
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

        let logits = logit_rows
            .map(|rows| {
                if rows.len() == n && rows.iter().enumerate().all(|(i, &r)| i == r) {
                    self.logits(x.clone())
                } else {
                    let ids: Vec<i64> = rows.iter().map(|&r| r as i64).collect();
                    let ids =
                        Tensor::<B, 1, Int>::from_data(TensorData::new(ids, [rows.len()]), &device);
                    self.logits(x.clone().select(0, ids))
                }
            })
            .transpose()?;
        Ok(ForwardOutput {
            logits,
            hidden,
            last_hidden: x,
        })
    }

    /// Final norm and output head: `[rows, hidden] -> [rows, vocab]`. Also the exit head of
    /// early-exit drafting, which applies it to an intermediate layer's output.
    pub fn logits(&self, x: Tensor<B, 2>) -> Result<Tensor<B, 2>> {
        self.project(self.norm.forward(x))
    }

    /// The output head alone, without the final norm: `[rows, hidden] -> [rows, vocab]`. What
    /// Medusa heads apply to their own states, which live in the space after the final norm.
    pub fn project(&self, x: Tensor<B, 2>) -> Result<Tensor<B, 2>> {
        match &self.head {
            Head::Own(linear) => linear.forward(x),
            Head::Tied(Some(packed))
                if x.dims()[0] <= SKINNY_MAX_ROWS && packed.linear.takes(&x) =>
            {
                packed.linear.forward(&x)
            }
            Head::Tied(_) => {
                let [vocab, hidden] = self.embedding.dims();
                check_width(x.dims()[1], hidden, vocab)?;
                Ok(matmul(x, self.embedding.val().transpose()))
            }
        }
    }

    /// The output head's weight `[vocab, hidden]` as burn's tensor (the embedding where the head
    /// is tied), or `None` where only a packed host copy holds it (a model loaded without
    /// [`LoadOptions::keep_unpacked`](crate::load::LoadOptions::keep_unpacked)). What a trainer
    /// projects through without copying the head.
    pub fn output_weight(&self) -> Option<Tensor<B, 2>> {
        match &self.head {
            Head::Tied(_) => Some(self.embedding.val()),
            Head::Own(linear) => linear.tensors().map(|dense| dense.weight.val()),
        }
    }

    /// Rotary tables `[n, head_dim / 2]` (cos, sin) at `positions`.
    pub(crate) fn rope_rows(&self, positions: &[usize]) -> (Tensor<B, 2>, Tensor<B, 2>) {
        let n = positions.len();
        let ids: Vec<i64> = positions.iter().map(|&p| p as i64).collect();
        let ids = Tensor::<B, 1, Int>::from_data(TensorData::new(ids, [n]), &self.device());
        (
            self.rope_cos.clone().select(0, ids.clone()),
            self.rope_sin.clone().select(0, ids),
        )
    }
}
