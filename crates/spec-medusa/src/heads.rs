//! The heads themselves: per head a residual block on the target's last hidden state and a
//! projection to the vocabulary, either the head's own or the target's (frozen) output head.

use burn::module::{Module, Param};
use burn::nn::{Initializer, Linear, LinearConfig};
use burn::tensor::activation::silu;
use burn::tensor::{Tensor, backend::Backend};

/// `h + SiLU(W h + b)`: Medusa's residual block, `W` and `b` zero at first so that a new head
/// starts as the identity (and, through the target's head, predicts what the target does).
#[derive(Module, Debug)]
pub struct ResidualBlock<B: Backend> {
    /// burn's layout: weight `[hidden (in), hidden (out)]`.
    pub linear: Linear<B>,
}

impl<B: Backend> ResidualBlock<B> {
    pub fn new(hidden: usize, device: &B::Device) -> Self {
        let linear = LinearConfig::new(hidden, hidden)
            .with_initializer(Initializer::Zeros)
            .init(device);
        Self { linear }
    }

    /// `[n, hidden] -> [n, hidden]`.
    pub fn forward(&self, h: Tensor<B, 2>) -> Tensor<B, 2> {
        h.clone() + silu(self.linear.forward(h))
    }
}

/// `K` Medusa heads: head `k` (0-based) reads the target's hidden state at position `t` and
/// predicts the token at `t + k + 2` (the target's own head predicts `t + 1`).
#[derive(Module, Debug)]
pub struct MedusaHeads<B: Backend> {
    pub blocks: Vec<ResidualBlock<B>>,
    /// One projection `[hidden, vocab]` (burn's layout) a head, or none where the heads share
    /// the target's output head.
    pub projections: Vec<Linear<B>>,
}

impl<B: Backend> MedusaHeads<B> {
    /// `heads` new heads over states of `hidden` features. `own_projection`: each head gets a
    /// projection of its own, initialised from the target's output head `[vocab, hidden]`;
    /// `None` shares the target's head.
    pub fn new(
        heads: usize,
        hidden: usize,
        own_projection: Option<Tensor<B, 2>>,
        device: &B::Device,
    ) -> Self {
        let blocks = (0..heads)
            .map(|_| ResidualBlock::new(hidden, device))
            .collect();
        let projections = match own_projection {
            Some(weight) => {
                let [vocab, _] = weight.dims();
                (0..heads)
                    .map(|_| {
                        let mut linear = LinearConfig::new(hidden, vocab)
                            .with_bias(false)
                            .init(device);
                        linear.weight = Param::from_tensor(weight.clone().transpose());
                        linear
                    })
                    .collect()
            }
            None => Vec::new(),
        };
        Self {
            blocks,
            projections,
        }
    }

    pub fn num_heads(&self) -> usize {
        self.blocks.len()
    }

    pub fn hidden_size(&self) -> usize {
        self.blocks
            .first()
            .map_or(0, |b| b.linear.weight.val().dims()[0])
    }

    /// Whether each head has a projection of its own (else the target's head serves all).
    pub fn own_projections(&self) -> bool {
        !self.projections.is_empty()
    }

    /// The heads' states `[n, hidden]` each, before any projection.
    pub fn states(&self, h: Tensor<B, 2>) -> Vec<Tensor<B, 2>> {
        self.blocks.iter().map(|b| b.forward(h.clone())).collect()
    }

    /// Each head's logits `[n, vocab]`: through its own projection, or through `shared`, the
    /// target's output weight `[vocab, hidden]`, when the heads share it.
    pub fn logits(&self, h: Tensor<B, 2>, shared: Option<&Tensor<B, 2>>) -> Vec<Tensor<B, 2>> {
        let states = self.states(h);
        if self.own_projections() {
            states
                .into_iter()
                .zip(&self.projections)
                .map(|(s, p)| p.forward(s))
                .collect()
        } else {
            let Some(weight) = shared else {
                return Vec::new();
            };
            let t = weight.clone().transpose();
            states.into_iter().map(|s| s.matmul(t.clone())).collect()
        }
    }
}
