//! N-gram drafting: two drafters that need no neural draft model.
//!
//! # Prompt lookup ([`PromptLookup`])
//! Saxena, *Prompt Lookup Decoding* (2023); the same idea as LLMA (Yang et al. 2023, "Inference
//! with Reference"). Let `x_1 … x_t` be the prompt and the text produced so far. For
//! `n = ngram_max, …, ngram_min`, find the most recent earlier position `e < t` such that
//! `x_{e-n+1} … x_e = x_{t-n+1} … x_t`; the draft is the chain `x_{e+1} … x_{e+K}` (cut at the end
//! of the context and at the engine's allowed depth). When no n-gram matches, nothing is drafted
//! and the step is a plain decoding step.
//!
//! The matches come from an incremental index ([`NgramIndex`]): one hash map per `n` from an
//! n-gram to the end of its most recent occurrence, updated as tokens are appended (prompt in
//! `begin`, accepted tokens in `accepted`), so a step costs `O(ngram_max²)` hashing, not a
//! rescan of the context.
//!
//! Exactness: the draft is deterministic given the context, so it is a point mass
//! (`Proposal::Deterministic`). Speculative sampling with `q = δ_x` accepts `x` with probability
//! `p(x)` and otherwise samples the residual `∝ max(p − δ_x, 0)`, i.e. `p` without `x`; the
//! output law is exactly `p` (greedy: `x` is accepted iff it is the argmax).
//!
//! Knobs: `k` (draft length, default [`DEFAULT_LOOKUP_K`]), `ngram_max` / `ngram_min` (defaults
//! [`DEFAULT_NGRAM_MAX`] / [`DEFAULT_NGRAM_MIN`]; chosen from the measurements in
//! `docs/benchmarks.md`, section "N-gram drafting (issue 6)").
//!
//! ## Adaptive length (`--k auto`, [`PromptLookupConfig::adaptive`])
//! A proposal costs nothing to make, but verifying it does: on a CPU a step that scores `w`
//! tokens costs `r(w) ≈ 1 + s·(w − 1)` decode steps. With `α_n` the acceptance rate of drafts
//! from matches of size `n`, a match with `m` continuation tokens drafts
//!
//! ```text
//! K = argmax_{K ∈ 0..=min(m, k)}  E[τ](α_n, K) / r(K + 1),   E[τ] = (1 − α^{K+1}) / (1 − α)
//! ```
//!
//! (Leviathan et al. 2023, eq. 1 and section 3.4, with the verification's width as the cost
//! instead of a draft model's; `spec_core::length`). `K = 0` is a plain step. `α_n` counts
//! accepted and tested drafts with decay; a match that was not proposed still yields a trial,
//! since a point mass on `x` is accepted with probability `p(x)`, which is the probability that
//! the step outputs `x`: comparing `x` with the step's token is an exact, free test. The slope
//! `s` is fitted to the request's own step times by width (`spec_core::length::WidthCosts`).
//! The choice depends only on earlier steps, so the output law is unchanged.
//!
//! # Bigram draft model ([`BigramModel`], [`BigramDrafter`])
//! A token bigram model over a corpus tokenized with the target's tokenizer, smoothed by
//! interpolated Witten–Bell with an add-one unigram:
//!
//! ```text
//! u(b)     = (c(b) + 1) / (N + V)
//! q(b | a) = (c(a, b) + T(a) · u(b)) / (c(a) + T(a))        (q(b | a) = u(b) when c(a) = 0)
//! ```
//!
//! with `c(a, b)` the bigram counts, `c(a) = Σ_b c(a, b)`, `T(a)` the number of distinct
//! followers of `a`, `N` the number of tokens and `V` the vocabulary size. Every `q(b | a) > 0`.
//!
//! Drafting samples `K` tokens autoregressively; row `i` of the proposal is
//! `spec_core::sampling::probabilities(log q(· | d_{i-1}), sampling)`, i.e. the same temperature
//! and truncation settings applied to `log q` as logits that the verifier applies to the target's
//! logits, and the draft token is sampled from exactly that row. The rows go to the verifier as
//! `Proposal::Sampled(q [K, vocab])`: standard speculative sampling (Leviathan et al. 2023; Chen
//! et al. 2023), which is exact for any `q`. Greedy: the chain of argmaxes of `q`, proposed as
//! point masses (`Proposal::Deterministic`), which greedy verification accepts iff each is the
//! target's argmax.
//!
//! Knobs: `k` (default [`DEFAULT_BIGRAM_K`]); the model file (see [`bigram`] for the format,
//! `cargo xtask train-bigram` to make one).

mod bigram_drafter;
mod error;
mod lookup;

pub mod bigram;

pub use bigram::{BigramCounts, BigramModel};
pub use bigram_drafter::{BigramDrafter, DEFAULT_BIGRAM_K};
pub use error::{NgramError, Result};
pub use lookup::{
    DEFAULT_LOOKUP_K, DEFAULT_LOOKUP_K_MAX, DEFAULT_NGRAM_MAX, DEFAULT_NGRAM_MIN, LookupMatch,
    NgramIndex, PromptLookup, PromptLookupConfig,
};
