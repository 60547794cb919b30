//! Speculative sampling with a draft model (Leviathan, Kalman & Matias 2023, "Fast Inference from
//! Transformers via Speculative Decoding"; Chen et al. 2023, "Accelerating Large Language Model
//! Decoding with Speculative Sampling").
//!
//! # The method
//! A small draft model `M_q` proposes `K` tokens autoregressively, sampling each one from its own
//! distribution under the run's sampling settings:
//!
//! ```text
//! x_i ~ q_i(·) = probabilities(M_q(context, x_1..x_{i-1}), sampling),   i = 1..K
//! ```
//!
//! The target `M_p` scores the chain in one forward pass, giving `p_1..p_{K+1}`. Draft `x_i` is
//! accepted with probability `min(1, p_i(x_i) / q_i(x_i))`; at the first rejection the next token
//! is drawn from the residual `norm(max(0, p_i − q_i))`, and after `K` acceptances a bonus token
//! is drawn from `p_{K+1}`. One step yields between 1 and `K + 1` tokens.
//!
//! # What is exact, and why
//! The accept/residual rule makes every produced token follow `p` exactly (Leviathan et al.,
//! Theorem 1), whatever `q` is, provided the verifier is handed the very `q` each draft was sampled
//! from. This crate only drafts: it samples with [`spec_core::sampling::sample_probabilities`]
//! from the `q` it stacks into [`Proposal::Sampled`](spec_core::verify::Proposal::Sampled), and
//! the acceptance test, residual and bonus draw come from `spec-core`'s verifier through the loop
//! of `spec-engine`. Greedy settings (temperature 0) make `q` and `p` point masses on the argmax,
//! so the output equals plain greedy decoding of the target token for token; the drafter then
//! takes each draft row's argmax ([`spec_core::sampling::sample_logits`]) and proposes the
//! drafts as fixed candidates ([`Proposal::Deterministic`](spec_core::verify::Proposal)), which
//! greedy verification accepts exactly where the target's argmax agrees, with no `q` rows built.
//! Sampled output follows the same *distribution* as plain sampling but not the same tokens for
//! a seed: drafts and verification draw their own uniforms from the run's random stream.
//!
//! # Vocabularies
//! The draft's token ids must mean the same as the target's. [`check_vocabularies`] compares the
//! tokenizers (`first_vocab_difference`); a draft vocabulary that is a prefix of the target's,
//! padded with unused ids, is accepted. Model vocabularies may be wider than their tokenizers
//! (Qwen2.5's output layer has 151,936 rows for 151,665 tokens): `q` is given the target's width,
//! with zeros in the ids the draft model lacks; a draft model wider than the target has its extra
//! logits dropped before `q` is computed (they are padding by the tokenizer check), so `q` is still
//! exactly what was sampled from.
//!
//! # Knobs and defaults
//! * [`DraftLength`]: a fixed `K` (default 4); [`DraftLength::Confident`] (the CLI's
//!   `--draft-threshold P`, `threshold=P` in a `spec bench` method), which stops a chain
//!   early once the draft model's own top probability (softmax of its raw logits) falls below a
//!   threshold; [`DraftLength::Auto`], which picks `K ∈ 0..=K_max` (default `K_max` 8) each step to
//!   maximize the expected tokens per unit of time `E[τ] / (K·c + r(K + 1))`, with
//!   `E[τ] = (1 − α^{K+1}) / (1 − α)` (Leviathan et al., section 3.4) and `α`, `c` and the
//!   verification's cost `r(w)` relative to a one-token step estimated from the run: the
//!   engine's step times and verdicts, kept in `spec_core::length::LengthController` (see
//!   [`AutoLength`]). Once `c` is measured or guessed, a step that drafts ends its chain by the
//!   same measure taken per draft, with `E[τ] = 1 + α_1 + α_1·α_2 + …` (Leviathan et al., eq. 1,
//!   a rate per position; `spec_core::length::ChainOutlook`): after the first draft a row is
//!   computed only if a draft at the run's mean rate would raise the chain's
//!   `E[τ] / (K·c + r(K + 1))`, and a computed row's draft is proposed only if it raises it at
//!   `α_i`, the rate measured for drafts whose row had its top probability (tenths of it), the
//!   row's `c` counted as spent either way (so only the verification's extra width weighs
//!   against it). The rule reads a row before its token is
//!   drawn, so which drafts are proposed never depends on their own values; the row it stopped
//!   at is scored against the step's output when every proposed draft was accepted, a free
//!   trial. Leviathan's Theorem 3.8 takes `r ≡ 1`; on a CPU scoring `K + 1` tokens
//!   costs more than one, so `auto` measures it, and asks for a plain step every 32 to do so.
//!   `K` 0 is a plain step (`E[τ] = 1` for one step): where no draft length is expected to beat
//!   it, `auto` decodes plainly, trying its best `K ≥ 1` after runs of 8 to 64 plain steps (the
//!   longer, the more a probe is expected to lose, its draft's catch-up on the skipped tokens
//!   included) so that `α` can recover. A draft that no `K` would make pay even with every draft
//!   accepted (`c` ≥ 0.9 or so) is not probed: one of its forwards is timed after 8 plain steps
//!   instead, in case it turns cheap or that verdict came from a stall, then after 16, 32 and
//!   every 64 while it stays hopeless. Every time `auto` keeps is a
//!   [`spec_core::length::average_time`], which one stalled measurement (a kernel compiled for
//!   a new shape on cuda) moves by at most 2× a measurement, and which the next ordinary one
//!   replaces if the stall came first. Until the draft is timed, `c` may be guessed
//!   ([`DraftModelDrafter::with_cost_prior`]; the CLI passes [`weight_cost_prior`], the ratio of
//!   the models' packed weight bytes), and when the first step is to be plain the draft skips
//!   the prompt's prefill (a step that drafts catches up).
//! * The draft's cache capacity: [`INITIAL_CACHE_POSITIONS`], enlarged by `begin` to the prompt plus
//!   2,048 positions (at most the draft's context), or fixed with
//!   [`DraftModelDrafter::with_cache_capacity`]. When the context outgrows it, steps fall back to
//!   plain decoding (no drafts) instead of failing.

mod drafter;
mod error;
mod length;
mod runner;
mod vocab;

pub mod spec;

pub use drafter::{DraftModelDrafter, Estimates, weight_cost_prior};
pub use error::{Result, SamplingError};
pub use length::{
    AutoLength, DEFAULT_K, DEFAULT_K_MAX, DraftLength, best_length, expected_tokens,
    mean_expected_tokens, speedup_bound,
};
pub use runner::{DraftRunner, INITIAL_CACHE_POSITIONS};
pub use vocab::check_vocabularies;
