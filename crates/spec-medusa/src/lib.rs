//! Medusa heads (Cai et al., "Medusa: Simple LLM Inference Acceleration Framework with Multiple
//! Decoding Heads", ICML 2024, arXiv 2401.10774): `K` small heads on the target's last hidden
//! state propose the next `K + 1` positions' candidates, which the target verifies as a tree in
//! its next pass; that pass's hidden states feed the heads again. No draft model, no extra
//! forward of the target.
//!
//! # The heads
//! Head `k` (1-based) reads the target's last-layer hidden state `h_t` (after its final norm)
//! and predicts the token at `t + k + 1` (the target's own head predicts `t + 1`):
//!
//! ```text
//! p_k(· | h_t) = softmax(W_out,k · (h_t + SiLU(W_k h_t + b_k)))
//! ```
//!
//! with `W_k`, `b_k` zero at first and `W_out,k` either the head's own projection initialised
//! from the target's output head or the target's head itself, frozen and shared (far cheaper for
//! a 49,152- or 151,936-token vocabulary, and one skinny product for all heads when decoding).
//! Medusa-1 trains the heads on a frozen target with `Σ_k λ_k · CE(p_k(· | h_t), x_{t+k+1})`
//! ([`training`]): here over a dataset's replies teacher-forced through the target (many tokens
//! a pass) with each `x` the target's own prediction at that position, or over answers the
//! target wrote itself.
//! Heads may draft from a [`DraftVocab`], the answers' most frequent tokens (FR-Spec, Zhao et
//! al. 2025): `W_out,k` keeps only those rows, which cuts the projection that is most of a
//! head's cost, in training and in drafting alike.
//!
//! # The tree and its verification
//! Head `k`'s `top` likeliest tokens are the candidates at depth `k` under every node of depth
//! `k − 1`; the nodes kept are the rank paths of highest estimated value `Π_i c_i(r_i)` (see
//! [`tree`](crate::tree) module docs): with `tree=static`, `c` is each head's held-out accuracy
//! by rank (Medusa's sparse tree) and the tree keeps `nodes` nodes; with `tree=auto` (default),
//! `c` is the acceptance measured so far of candidates given the same probability by the same
//! head, and the tree is cut to the size that maximizes expected tokens per measured cost
//! (`spec_tree::sizing`), the heads' own measured cost included; where even the best tree would
//! not beat a plain step, plain steps follow (1, 2, 4, … up to 32 before the heads are tried
//! again), so weak heads cost little. Every candidate is fixed in advance, so the verification is
//! `spec_core`'s rule for deterministic candidates: accept `x` with the residual's `p(x)`, on
//! rejection zero it and renormalize. The output follows the target's distribution; greedy
//! output equals plain greedy decoding. Medusa's lossy "typical acceptance" is not offered.

mod drafter;
mod error;
pub mod file;
mod heads;
pub mod spec;
pub mod training;
mod tree;
pub mod vocab;

pub use drafter::{MedusaDrafter, MedusaSettings, TreeMode};
pub use error::{MedusaError, Result};
pub use file::{HeadsFile, HeadsInfo};
pub use heads::{MedusaHeads, ResidualBlock};
pub use spec::MedusaSpec;
pub use vocab::DraftVocab;
