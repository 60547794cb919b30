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
//! `docs/benchmarks.md` at 7b3cb13, section "N-gram drafting (issue 6)").
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
//! `s` is fitted to the steps' times by width as the engine measures them
//! (`spec_core::length::LengthController`, which every adaptive length shares).
//! The choice depends only on earlier steps, so the output law is unchanged.
//!
//! ## Cross-request cache (`history=on` in `spec bench`, [`PromptLookupConfig::with_history`])
//! Off by default. When on, each finished request (prompt and output) is appended to a second
//! index of the same n-grams, ended by a token id no tokenizer has, so no n-gram or continuation
//! spans two requests; when the current context has no match, the suffix is looked up there
//! (llama.cpp's "dynamic" lookup cache plays this part). Its matches have their own acceptance
//! rates. The cache keeps up to `history_tokens` tokens (default [`DEFAULT_HISTORY_TOKENS`]),
//! dropping the older half when full. Exactness is unchanged: the draft is still a point mass
//! fixed before the step. `Drafter::forget_requests` empties it (the bench does so after its
//! warm-up and before each repeat, so no prompt meets its own earlier answer).
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
//! ## Adaptive length (`--k auto`, [`BigramConfig::adaptive`], the default)
//! A bigram is right about the target's next token rarely on average (α ≈ 0.11 greedy with
//! SmolLM2-135M), but not uniformly: after the first half of a split word its top guess is
//! often certain. Acceptance is therefore counted per bucket of the draft row's top probability
//! `c_i = max_b q_i(b)` (tenths of `[0, 1]`, each starting at its midpoint), `α(c)`, and after
//! `j` drafts the chain takes draft `j + 1` only if it raises the expected speed-up:
//!
//! ```text
//! E_{j+1} / cost(j + 1) > E_j / cost(j),   E_j = 1 + Σ_{i ≤ j} Π_{l ≤ i} α(c_l),
//! cost(K) = r(K + 1) + K · t_draft / t_step
//! ```
//!
//! (Leviathan et al. 2023, eq. 1 with a rate per position; `spec_core::length::ChainOutlook`;
//! `r` as for prompt lookup, `t_draft` the measured time to draft one token). The decision on
//! draft `j + 1` uses its row's confidence, known before its token is drawn, so the proposed
//! tokens are still distributed as their rows and verification stays exact; `K = 0` is a plain
//! step. The draft the chain stopped before is scored against the step's output when every
//! proposed draft was accepted (exact for greedy; for sampling `P(x = y) = Σ q·p`, a lower bound
//! of the acceptance `Σ min(p, q)`, used for the length only).
//!
//! Knobs: `k` (fixed, default [`DEFAULT_BIGRAM_K`]; adaptive up to [`DEFAULT_BIGRAM_K_MAX`]); the
//! model file (see [`bigram`] for the format, `cargo xtask train-bigram` to make one).

mod bigram_drafter;
mod error;
mod lookup;
#[cfg(test)]
mod scripted;

pub mod bigram;
pub mod spec;

pub use bigram::{BigramCounts, BigramModel};
pub use bigram_drafter::{BigramConfig, BigramDrafter, DEFAULT_BIGRAM_K, DEFAULT_BIGRAM_K_MAX};
pub use error::{NgramError, Result};
pub use lookup::{
    DEFAULT_HISTORY_TOKENS, DEFAULT_LOOKUP_K, DEFAULT_LOOKUP_K_MAX, DEFAULT_NGRAM_MAX,
    DEFAULT_NGRAM_MIN, LookupMatch, NgramIndex, PromptLookup, PromptLookupConfig,
};
