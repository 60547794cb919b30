//! `spec bench`: every method against plain decoding, per prompt category, in the manner of
//! Spec-Bench (Xia et al. 2024). See `docs/bench-report.md` for the report's schema and
//! `docs/benchmarks.md` ("`cargo xtask bench`: the main job") for how to run it.
//!
//! Metrics, per method and category, over the run's records:
//! - τ = tokens produced ÷ target verification forwards (each forward yields the accepted drafts
//!   plus the target's own token, so plain decoding has τ = 1);
//! - α = accepted drafts ÷ drafted tokens; α per tested draft = accepted ÷ (accepted +
//!   rejections), the drafts after a chain's first rejection not counted (`spec_core::metrics`);
//! - tok/s = the mean over prompts of `new tokens ÷ wall seconds` (prefill included);
//! - speedup = that mean ÷ the same mean of plain decoding on the same target, prompts and run.
//!
//! Methods with a draft model (`sampling`, fixed K, `threshold=` or `k=auto`) are also set against the analytic
//! speedup of Leviathan et al. (2023, Theorem 3.8), `E[τ] / (K·c + 1)` with
//! `E[τ] = (1 − α^{K+1}) / (1 − α)` ([`summary::DraftBound`]), over the steps taken: each step's `E[τ]` at
//! the K it drafted (`auto` varies K; a fixed K's last step drafts only the tokens left), their
//! mean over the cost at the mean K. α is per tested draft (the model's α; Spec-Bench's α reads
//! low for long chains and would understate the bound), c the measured cost ratio, the mean time
//! of one draft-model step (a forward and the sampling of its token) ÷ the mean time of one plain
//! decode step of the same target over the same prompts in the same run. The bound charges a
//! verification as one plain step; v, the measured time of a verification step ÷ a plain step,
//! and `E[τ] / (K·c + v)` show how much of the gap that charge explains.
//!
//! Greedy runs (temperature 0) also check losslessness: each method's tokens must equal plain
//! decoding's on the same prompt and repeat; any difference is a mismatch and makes the command
//! fail after writing the report.

mod args;
#[cfg(test)]
mod fixtures;
mod machine;
mod markdown;
mod methods;
mod plan;
mod prompts;
mod records;
mod report;
mod run;
mod summary;

pub(crate) use args::BenchArgs;
pub(crate) use run::run;
