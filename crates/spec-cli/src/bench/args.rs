//! The command line of `spec bench`.

use std::path::PathBuf;

use spec_runtime::model::WeightFormat;

use crate::BackendName;
use crate::registry;

/// `--methods`' help: the syntax and every method with its keys, from the registry.
fn methods_help() -> String {
    format!(
        "Comma-separated methods, each `NAME[:KEY=VALUE]...` as `spec generate --method` takes \
         it: {}; and the bench's own key target= (the target model to run it on). E.g. \
         `plain,prompt-lookup,sampling:k=auto,sampling:k=8:threshold=0.5,bigram:k=3`. A method \
         that takes a draft model and names none gets the run's (--models' DRAFT, else \
         qwen2.5-coder-0.5b); a bigram that names no file gets --bigram's. Plain decoding \
         always runs as the baseline. Default: plain,prompt-lookup,bigram,sampling,\
         sampling:k=auto (bigram without --bigram is skipped with a note)",
        registry::methods_help()
    )
}

/// Arguments of `spec bench`.
#[derive(clap::Args, Debug)]
pub(crate) struct BenchArgs {
    /// `TARGET[,DRAFT]` (reference names or paths) for every method. Default: SmolLM2-135M for
    /// methods without a draft model, Qwen2.5-Coder 1.5B with the 0.5B draft for `sampling`.
    #[arg(long, value_name = "TARGET[,DRAFT]")]
    pub(super) models: Option<String>,
    #[arg(long, value_name = "METHOD,...", help = methods_help())]
    pub(super) methods: Option<String>,
    /// New tokens per generation (default 48; 32 with --quick).
    #[arg(long)]
    pub(super) max_new_tokens: Option<usize>,
    /// 0 means greedy (and checks every method against plain decoding).
    #[arg(long, default_value_t = 0.0)]
    pub(super) temperature: f64,
    #[arg(long, default_value_t = 0)]
    pub(super) seed: u64,
    #[arg(long, value_enum, default_value = "flex")]
    pub(crate) backend: BackendName,
    /// Runs of every (method, prompt) pair.
    #[arg(long, default_value_t = 1)]
    pub(super) repeats: usize,
    /// Run plain decoding once per prompt, before the other methods. By default it runs again
    /// after them and its speed is the mean of both runs, so that the machine's drift over a
    /// prompt's runs (on shared CPUs, memory speed that moves from minute to minute) falls on
    /// the baseline as on the methods between.
    #[arg(long)]
    pub(super) plain_once: bool,
    /// A short smoke run and lossless check of every method: one prompt per category, 32 new
    /// tokens, on SmolLM2: plain, prompt-lookup, bigram (given --bigram; `cargo xtask bench`
    /// supplies one) and sampling with SmolLM2 drafting for itself (unless
    /// --methods/--models/--max-new-tokens say otherwise).
    #[arg(long)]
    pub(super) quick: bool,
    /// A Spec-Bench `question.jsonl` (`question_id`, `category`, `turns`). Default: the
    /// project's set, `benches/prompts/spec-bench-mini.jsonl`.
    #[arg(long, value_name = "FILE")]
    pub(super) prompts: Option<PathBuf>,
    /// Use every turn of each question as its own prompt (default: the first turn only).
    #[arg(long)]
    pub(super) all_turns: bool,
    /// At most this many questions of each category (default 2, 1 on the targets of draft-model
    /// methods; 1 with --quick; 0 = all).
    #[arg(long)]
    pub(super) per_category: Option<usize>,
    /// The bigram model file for `bigram` methods that name none.
    #[arg(long, value_name = "FILE")]
    pub(super) bigram: Option<PathBuf>,
    /// The Medusa heads file for `medusa` methods that name none (`cargo xtask bench` trains
    /// SmolLM2's heads if none are cached).
    #[arg(long, value_name = "FILE")]
    pub(super) medusa_heads: Option<PathBuf>,
    /// Where to write report.md, report.json and the plots (default: `bench-out/<UTC time>`).
    #[arg(long, value_name = "DIR")]
    pub(super) out: Option<PathBuf>,
    /// Print the reference models this run needs, one per line, and exit.
    #[arg(long)]
    pub(super) list_models: bool,
    /// How every target's projections are kept for decode and verification steps: f32 (the
    /// checkpoint's weights exactly), q4 (a 4-bit checkpoint's blocks kept exactly, any other
    /// matrix as q8_0), bf16 or q8_0 (rounded once at load: a faster model that differs from
    /// the checkpoint; plain decoding in the run uses it too, so the comparison and the
    /// lossless check stay on one model), or q8_0-a8 / q4-a8 (those weights multiplied by
    /// activations rounded to int8, as llama.cpp does: different models again; q4-a8 keeps a
    /// GGUF's Q4_K and Q6_K matrices as their superblocks; q4-a8-lossy also rounds every other
    /// matrix to 4 bits, for drafts). Draft models: `draft-weights=` per method.
    #[arg(long, default_value = "f32")]
    pub(super) weights: WeightFormat,
}
