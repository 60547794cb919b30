//! `spec bench`: every method against plain decoding, per prompt category, in the manner of
//! Spec-Bench (Xia et al. 2024). See `docs/bench-report.md` for the report's schema and
//! `docs/benchmarks.md` ("cargo xtask bench") for how to run it.
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
//! `E[τ] = (1 − α^{K+1}) / (1 − α)` ([`DraftBound`]), over the steps taken: each step's `E[τ]` at
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

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::io::IsTerminal;
use std::path::PathBuf;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, bail};
use burn::tensor::backend::Backend;
use indicatif::{ProgressBar, ProgressStyle};
use serde::{Deserialize, Serialize};
use spec_core::metrics::{Metrics, PositionCounts};
use spec_core::sampling::SamplingConfig;
use spec_engine::{Drafter, generate_speculative};
use spec_runtime::model::WeightFormat;
use spec_runtime::{GenerateOptions, StopReason, load::load_model_with};
use spec_sampling::{DraftLength, mean_expected_tokens, speedup_bound};
use spec_tokenizer::{Message, TextTokenizer};

use crate::methods::BenchMethod;
use crate::{BackendName, DeviceLimits, DraftModels, load_tokenizer, make_drafter};

/// The project's prompt set (Spec-Bench's `question.jsonl` format), built into the binary.
const DEFAULT_PROMPTS: &str = include_str!("../../../benches/prompts/spec-bench-mini.jsonl");
const DEFAULT_PROMPTS_NAME: &str = "benches/prompts/spec-bench-mini.jsonl";

/// The default target of methods without a draft model, and of `--quick`.
const SMALL_TARGET: &str = "smollm2-135m";
/// The default target and draft of methods that use a draft model (`sampling`).
const DRAFT_PAIR: (&str, &str) = ("qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b");

/// Default run: methods, new tokens, prompts per category (see `docs/benchmarks.md` for why).
/// `sampling` twice: at its default fixed `K` and with the length it picks itself.
const DEFAULT_METHODS: &str = "plain,prompt-lookup,bigram,sampling,sampling:k=auto";
const DEFAULT_MAX_NEW_TOKENS: usize = 48;
const DEFAULT_PER_CATEGORY: usize = 2;
/// Targets of draft-model methods (Qwen2.5-Coder 1.5B by default, decoding 9.5-10.1 tok/s plain
/// on the reference 2-core CPU against SmolLM2's 91-92) take one prompt per category, at the same
/// length: shorter generations would leave the prefill and the first steps to dominate.
const DRAFT_GROUP_PER_CATEGORY: usize = 1;
/// `--quick`: one prompt per category, fewer tokens, the n-gram methods on SmolLM2.
const QUICK_METHODS: &str = "plain,prompt-lookup";
const QUICK_MAX_NEW_TOKENS: usize = 32;
/// New tokens of each method's warm-up generation on flex.
const WARMUP_TOKENS: usize = 4;

/// How `spec bench` warms up before timing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum WarmUp {
    /// One generation of [`WARMUP_TOKENS`] per method on the first prompt: flex runs fixed
    /// kernels, so this only loads the weights into the caches and sizes the allocations.
    Short,
    /// Every method on every prompt with the run's token count, untimed. wgpu and cuda compile
    /// (and autotune) kernels for each new shape: a prompt's length, a key count's class, a
    /// catch-up's width. In a timed run the first method to meet a shape pays for it, and plain
    /// decoding runs first on every prompt: on an H200 its prefill of the second code prompt
    /// took 9.1 s where the methods after the first draft-model one took 0.2-0.4 s, which made
    /// their end-to-end speedups 1.7-1.8x where their decode speedups were 0.90-1.05x
    /// (docs/benchmarks.md, "On a lent H200").
    WholePass,
}

impl WarmUp {
    fn for_backend(backend: BackendName) -> Self {
        match backend {
            BackendName::Flex => Self::Short,
            BackendName::Wgpu | BackendName::Cuda => Self::WholePass,
        }
    }
}

/// Arguments of `spec bench`.
#[derive(clap::Args, Debug)]
pub(crate) struct BenchArgs {
    /// `TARGET[,DRAFT]` (reference names or paths) for every method. Default: SmolLM2-135M for
    /// methods without a draft model, Qwen2.5-Coder 1.5B with the 0.5B draft for `sampling`.
    #[arg(long, value_name = "TARGET[,DRAFT]")]
    models: Option<String>,
    /// Comma-separated method specs, `NAME[:KEY=VALUE]...`, keys k, threshold (`sampling`: end a
    /// chain of up to k drafts once the draft's top probability falls below it), draft,
    /// draft-weights, target, ngram-max, ngram-min, bigram, history (prompt lookup's
    /// cross-request cache: on, off or tokens); e.g.
    /// `plain,prompt-lookup,sampling:k=auto,sampling:k=8:threshold=0.5,bigram:k=3`. Plain decoding always runs as the
    /// baseline. Default: plain,prompt-lookup,bigram,sampling,sampling:k=auto (those this build
    /// lacks, or bigram without `--bigram`, are skipped with a note).
    #[arg(long)]
    methods: Option<String>,
    /// New tokens per generation (default 48; 32 with --quick).
    #[arg(long)]
    max_new_tokens: Option<usize>,
    /// 0 means greedy (and checks every method against plain decoding).
    #[arg(long, default_value_t = 0.0)]
    temperature: f64,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    #[arg(long, value_enum, default_value = "flex")]
    pub(crate) backend: BackendName,
    /// Runs of every (method, prompt) pair.
    #[arg(long, default_value_t = 1)]
    repeats: usize,
    /// Run plain decoding once per prompt, before the other methods. By default it runs again
    /// after them and its speed is the mean of both runs, so that the machine's drift over a
    /// prompt's runs (on shared CPUs, memory speed that moves from minute to minute) falls on
    /// the baseline as on the methods between.
    #[arg(long)]
    plain_once: bool,
    /// A short smoke run: one prompt per category, 32 new tokens, plain and prompt-lookup on
    /// SmolLM2 (unless --methods/--models/--max-new-tokens say otherwise).
    #[arg(long)]
    quick: bool,
    /// A Spec-Bench `question.jsonl` (`question_id`, `category`, `turns`). Default: the
    /// project's set, `benches/prompts/spec-bench-mini.jsonl`.
    #[arg(long, value_name = "FILE")]
    prompts: Option<PathBuf>,
    /// Use every turn of each question as its own prompt (default: the first turn only).
    #[arg(long)]
    all_turns: bool,
    /// At most this many questions of each category (default 2, 1 on the targets of draft-model
    /// methods; 1 with --quick; 0 = all).
    #[arg(long)]
    per_category: Option<usize>,
    /// The bigram model file for `bigram` methods that name none.
    #[arg(long, value_name = "FILE")]
    bigram: Option<PathBuf>,
    /// Where to write report.md, report.json and the plots (default: bench-out/<UTC time>).
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
    /// Print the reference models this run needs, one per line, and exit.
    #[arg(long)]
    list_models: bool,
    /// How every target's projections are kept for decode and verification steps: f32 (the
    /// checkpoint's weights exactly), q4 (a 4-bit checkpoint's blocks kept exactly, any other
    /// matrix as q8_0), bf16 or q8_0 (rounded once at load: a faster model that differs from
    /// the checkpoint; plain decoding in the run uses it too, so the comparison and the
    /// lossless check stay on one model), or q8_0-a8 / q4-a8 (those weights multiplied by
    /// activations rounded to int8, as llama.cpp does: different models again; q4-a8 keeps a
    /// GGUF's Q4_K and Q6_K matrices as their superblocks; q4-a8-lossy also rounds every other
    /// matrix to 4 bits, for drafts). Draft models: `draft-weights=` per method.
    #[arg(long, default_value = "f32")]
    weights: WeightFormat,
}

/// One method on one target, as the run uses it.
struct PlannedMethod {
    method: BenchMethod,
    draft: Option<String>,
}

/// The plan: methods grouped by target (plain first in each group), prompts, settings.
struct Plan {
    groups: Vec<(String, Vec<PlannedMethod>)>,
    skipped: Vec<String>,
    methods_defaulted: bool,
    max_new_tokens: usize,
}

fn plan(args: &BenchArgs) -> Result<Plan> {
    let methods_defaulted = args.methods.is_none();
    let methods_text = args.methods.clone().unwrap_or_else(|| {
        if args.quick {
            QUICK_METHODS
        } else {
            DEFAULT_METHODS
        }
        .to_owned()
    });
    let methods = BenchMethod::parse_list(&methods_text)?;
    let models = match &args.models {
        None => None,
        Some(text) => {
            let mut parts = text.split(',').map(str::trim);
            let target = parts.next().filter(|t| !t.is_empty());
            let draft = parts.next().filter(|d| !d.is_empty());
            match (target, parts.next()) {
                (Some(t), None) => Some((t.to_owned(), draft.map(str::to_owned))),
                _ => bail!("--models takes TARGET or TARGET,DRAFT, got `{text}`"),
            }
        }
    };
    let mut skipped = Vec::new();
    let mut groups: Vec<(String, Vec<PlannedMethod>)> = Vec::new();
    let mut plain = None;
    for mut method in methods {
        // Plain decoding without a target of its own is every group's baseline, added below.
        if method.is_plain() && method.target.is_none() {
            plain = Some(method);
            continue;
        }
        if method.spec.method == "bigram" && method.spec.bigram.is_none() {
            method.spec.bigram = args.bigram.clone();
            if method.spec.bigram.is_none() && methods_defaulted {
                skipped.push(format!(
                    "`{}`: no bigram model given (pass --bigram FILE)",
                    method.label
                ));
                continue;
            }
        }
        let uses_draft = uses_draft_model(&method.spec.method);
        let (target, draft) = match (&method.target, &models) {
            (Some(t), _) => (t.clone(), None),
            (None, Some((t, d))) => (t.clone(), d.clone()),
            (None, None) if uses_draft && !args.quick => {
                (DRAFT_PAIR.0.to_owned(), Some(DRAFT_PAIR.1.to_owned()))
            }
            (None, None) => (SMALL_TARGET.to_owned(), None),
        };
        if uses_draft && method.spec.draft_model.is_none() {
            method.spec.draft_model = draft.or_else(|| Some(DRAFT_PAIR.1.to_owned()));
        }
        let draft = method.spec.draft_model.clone().filter(|_| uses_draft);
        let planned = PlannedMethod { method, draft };
        match groups.iter_mut().find(|(t, _)| *t == target) {
            Some((_, list)) => list.push(planned),
            None => groups.push((target, vec![planned])),
        }
    }
    if groups.is_empty() {
        let target = models.map_or_else(|| SMALL_TARGET.to_owned(), |(t, _)| t);
        groups.push((target, Vec::new()));
    }
    let plain = match plain {
        Some(p) => p,
        None => BenchMethod::parse("plain")?,
    };
    // Plain decoding is every target's baseline: first in its group, added where not listed.
    for (_, list) in &mut groups {
        match list.iter().position(|m| m.method.is_plain()) {
            Some(i) => {
                let plain = list.remove(i);
                list.insert(0, plain);
            }
            None => list.insert(
                0,
                PlannedMethod {
                    method: plain.clone(),
                    draft: None,
                },
            ),
        }
    }
    let max_new_tokens = args.max_new_tokens.unwrap_or(if args.quick {
        QUICK_MAX_NEW_TOKENS
    } else {
        DEFAULT_MAX_NEW_TOKENS
    });
    if args.max_new_tokens == Some(0) {
        bail!("--max-new-tokens must be at least 1");
    }
    if args.repeats == 0 {
        bail!("--repeats must be at least 1");
    }
    Ok(Plan {
        groups,
        skipped,
        methods_defaulted,
        max_new_tokens,
    })
}

/// New tokens and questions per category of one target's group: the flags, else the defaults
/// (fewer questions for the slow targets of draft-model methods).
fn group_limits(args: &BenchArgs, methods: &[PlannedMethod]) -> (usize, usize) {
    let heavy = !args.quick
        && methods
            .iter()
            .any(|m| uses_draft_model(&m.method.spec.method));
    let max_new_tokens = args.max_new_tokens.unwrap_or(if args.quick {
        QUICK_MAX_NEW_TOKENS
    } else {
        DEFAULT_MAX_NEW_TOKENS
    });
    let per_category = args.per_category.unwrap_or(match (args.quick, heavy) {
        (true, _) | (false, true) => DRAFT_GROUP_PER_CATEGORY,
        (false, false) => DEFAULT_PER_CATEGORY,
    });
    (max_new_tokens, per_category)
}

/// The prompts of a group: those of the first `per_category` questions of each category (0 =
/// all).
fn select_prompts(prompts: &[BenchPrompt], per_category: usize) -> Vec<usize> {
    let mut questions: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    let mut out = Vec::new();
    for (i, p) in prompts.iter().enumerate() {
        let seen = questions.entry(&p.category).or_default();
        if !seen.contains(&p.question_id.as_str()) {
            if per_category > 0 && seen.len() >= per_category {
                continue;
            }
            seen.push(&p.question_id);
        }
        out.push(i);
    }
    out
}

/// Methods that run a neural draft model; they get the default draft model and, without
/// `--models`, the default target/draft pair.
fn uses_draft_model(method: &str) -> bool {
    matches!(method, "sampling")
}

/// The fixed draft length K of a draft-model method (default [`DraftLength::default`]); `None`
/// for other lengths (`k=auto`, a `threshold=`) and methods without a draft model.
fn fixed_draft_length(method: &BenchMethod) -> Option<usize> {
    if !uses_draft_model(&method.spec.method) {
        return None;
    }
    let length =
        DraftLength::parse_with_threshold(method.spec.k.as_deref(), method.spec.draft_threshold)
            .ok()?;
    match length {
        DraftLength::Fixed(k) => Some(k),
        DraftLength::Confident { .. } | DraftLength::Auto { .. } => None,
    }
}

/// A prompt of the run.
#[derive(Debug, Clone, Serialize)]
struct BenchPrompt {
    question_id: String,
    category: String,
    /// 0-based turn of the question this prompt is.
    turn: usize,
    text: String,
}

/// A line of a Spec-Bench `question.jsonl`.
#[derive(Deserialize)]
struct Question {
    question_id: serde_json::Value,
    category: String,
    turns: Vec<String>,
}

fn load_prompts(args: &BenchArgs) -> Result<(String, Vec<BenchPrompt>)> {
    let (name, text) = match &args.prompts {
        Some(path) => (
            path.display().to_string(),
            std::fs::read_to_string(path)
                .with_context(|| format!("reading the prompts {}", path.display()))?,
        ),
        None => (DEFAULT_PROMPTS_NAME.to_owned(), DEFAULT_PROMPTS.to_owned()),
    };
    // Groups pick their own subsets (`select_prompts`); the largest cap is read here.
    let per_category =
        args.per_category
            .unwrap_or(if args.quick { 1 } else { DEFAULT_PER_CATEGORY });
    let prompts = parse_prompts(&text, per_category, args.all_turns)
        .with_context(|| format!("in the prompts {name}"))?;
    Ok((name, prompts))
}

/// Parses a `question.jsonl`; keeps at most `per_category` questions of each category (0 =
/// all) in file order, and their first turn unless `all_turns`.
fn parse_prompts(text: &str, per_category: usize, all_turns: bool) -> Result<Vec<BenchPrompt>> {
    let mut taken: BTreeMap<String, usize> = BTreeMap::new();
    let mut prompts = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let q: Question = serde_json::from_str(line).with_context(|| {
            format!(
                "line {}: not a question (`question_id`, `category`, `turns`)",
                i + 1
            )
        })?;
        let id = match &q.question_id {
            serde_json::Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        if q.turns.is_empty() {
            bail!("line {}: question {id} has no turns", i + 1);
        }
        let count = taken.entry(q.category.clone()).or_default();
        if per_category > 0 && *count >= per_category {
            continue;
        }
        *count += 1;
        let turns = if all_turns { q.turns.len() } else { 1 };
        for (turn, text) in q.turns.into_iter().take(turns).enumerate() {
            prompts.push(BenchPrompt {
                question_id: id.clone(),
                category: q.category.clone(),
                turn,
                text,
            });
        }
    }
    if prompts.is_empty() {
        bail!("no prompts");
    }
    Ok(prompts)
}

/// One generation's raw measurements (one element of `report.json`'s `runs`).
#[derive(Debug, Clone, Serialize)]
struct RunRecord {
    target: String,
    method: String,
    method_name: String,
    draft_model: Option<String>,
    question_id: String,
    category: String,
    turn: usize,
    repeat: usize,
    prompt_tokens: usize,
    new_tokens: usize,
    stop_reason: StopReason,
    wall_seconds: f64,
    prompt_seconds: f64,
    tokens_per_second: f64,
    /// Tokens after the first step per second after it (`GenerationStats`).
    decode_tokens_per_second: f64,
    /// The tokens that speed counts, produced in `wall_seconds − prompt_seconds`.
    decode_tokens: usize,
    draft_seconds: f64,
    target_seconds: f64,
    /// Time in the drafter's `draft` calls that ran the draft model (`draft_forwards` forwards).
    draft_forward_seconds: f64,
    /// Time in the `steps` verification steps (target forward and verification), no prefill.
    step_seconds: f64,
    /// The fixed draft length K of a draft-model method; `None` for `k=auto` and for methods
    /// without a draft model.
    fixed_k: Option<usize>,
    steps: u64,
    target_forwards: u64,
    draft_forwards: u64,
    drafted: u64,
    accepted: u64,
    /// Steps whose accepted path was shorter than the drafted depth.
    rejections: u64,
    produced: u64,
    alpha: Option<f64>,
    alpha_per_tested_draft: Option<f64>,
    tau: Option<f64>,
    /// The drafter's running estimates after this run (`Drafter::report_estimates`: for a
    /// draft-model method `auto`'s α, c, verification slope...), carried over from the runs
    /// before it, the warm-up included; absent where the drafter keeps none.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    drafter_estimates: BTreeMap<&'static str, f64>,
    drafted_by_position: Vec<u64>,
    accepted_by_position: Vec<u64>,
    rss_before_bytes: Option<u64>,
    peak_rss_bytes: Option<u64>,
    /// `generation`: the peak was reset just before this generation; `process`: it could not
    /// be reset, so it is the process's peak so far.
    peak_rss_scope: &'static str,
    /// Greedy runs of non-plain methods, and plain decoding's run after the methods: whether
    /// the tokens equal plain decoding's first run on the prompt.
    matches_plain: Option<bool>,
    /// Plain decoding's runs: before the prompt's other methods or after them (the bracket
    /// that `--plain-once` leaves out); `None` for the other methods.
    plain_pass: Option<PlainPass>,
    /// [`core_round_trip_ns`] just before this generation and just after it: where the
    /// machine's threads sat while it ran.
    core_round_trip_ns: [Option<f64>; 2],
    tokens: Vec<u32>,
}

/// Where a plain run sits among one prompt's runs ([`RunRecord::plain_pass`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
enum PlainPass {
    Before,
    After,
}

/// A greedy method's first difference from plain decoding on one prompt.
#[derive(Debug, Clone, Serialize)]
struct Mismatch {
    target: String,
    method: String,
    question_id: String,
    turn: usize,
    repeat: usize,
    /// 0-based index into the new tokens.
    position: usize,
    plain_token: Option<u32>,
    method_token: Option<u32>,
    plain_text: String,
    method_text: String,
}

/// Aggregates of one (target, method, category); `category` "all" covers every prompt.
#[derive(Debug, Clone, Serialize)]
struct Summary {
    target: String,
    method: String,
    category: String,
    runs: usize,
    new_tokens: u64,
    tokens_per_second: f64,
    speedup: Option<f64>,
    /// The same ratio of decode speeds (after the first step: prefill excluded).
    decode_speedup: Option<f64>,
    tau: Option<f64>,
    alpha: Option<f64>,
    /// accepted ÷ (accepted + rejections): the α of the bound.
    alpha_per_tested_draft: Option<f64>,
    acceptance_by_position: Vec<f64>,
    mismatches: usize,
    max_peak_rss_bytes: Option<u64>,
    /// Draft-model methods: the measured cost ratio and the analytic speedup bound.
    draft_bound: Option<DraftBound>,
}

/// A draft-model method's measured cost ratio `c` and the speedup `E[τ] / (K·c + 1)` the i.i.d.
/// acceptance model of Leviathan et al. (2023, Theorem 3.8) predicts from the measured α, K and
/// c, against the speedup achieved.
#[derive(Debug, Clone, PartialEq, Serialize)]
struct DraftBound {
    /// α per tested draft, the model's per-token acceptance rate.
    alpha: f64,
    /// K: the mean drafted tokens per step (a fixed K's last step in a generation may draft
    /// fewer, only the tokens left).
    k: f64,
    /// Mean seconds of one draft-model step: its forward and the sampling of its token.
    draft_forward_seconds: f64,
    /// Mean seconds of one plain decode step (target forward and sampling) of the same target
    /// over the same prompts in the same run.
    plain_step_seconds: f64,
    /// c = `draft_forward_seconds` ÷ `plain_step_seconds`.
    cost_ratio: f64,
    /// E[τ] = (1 − α^{K+1}) / (1 − α) from `alpha`, averaged over the steps at each step's
    /// own K (`spec_core::length::mean_expected_tokens`).
    expected_tau: f64,
    /// E[τ] ÷ (K·c + 1): Theorem 3.8 summed over the steps (`spec_core::length::speedup_bound`).
    speedup_bound: f64,
    /// The summary's speedup ÷ `speedup_bound` (null without a plain baseline).
    achieved_over_bound: Option<f64>,
    /// Decode speed pooled over the row's runs, Σ decode tokens ÷ Σ decode seconds, ÷ the same
    /// of the plain runs. The bound pools α, c and v over every step of every prompt, so this
    /// is the speedup it predicts; the summary's `decode_speedup` (Spec-Bench's mean of
    /// per-prompt speeds) weighs a prompt whose drafts were accepted more by its higher speed.
    pooled_decode_speedup: Option<f64>,
    /// `pooled_decode_speedup ÷ speedup_bound`: like the bound, without the prefill.
    decode_over_bound: Option<f64>,
    /// The steps' measured τ (produced ÷ steps) ÷ `expected_tau`: below 1 where the i.i.d.
    /// model's steps would yield more than these did (rejections that cluster, where some
    /// passages are easy for the draft and some are not, leave more steps with every draft
    /// accepted and more with none than independent ones, and fewer tokens a step at one α).
    tau_over_expected: f64,
    /// v = mean time of one verification step (the target's forward over the K + 1 positions,
    /// verification and cache rollback) ÷ `plain_step_seconds`; the bound takes it as 1.
    verify_ratio: f64,
    /// E[τ] ÷ (K·c + v): the bound with the verification's measured cost.
    bound_with_verify: f64,
}

/// Where the run happened.
#[derive(Debug, Clone, Serialize)]
struct Machine {
    cpu: String,
    /// The instruction set of the CPU products (`spec_kernels::instruction_set`).
    kernels: String,
    cores: usize,
    memory_bytes: Option<u64>,
    os: String,
    backend: String,
    gpu: Option<String>,
}

/// How often each tile ran the CPU's timed products of f32 rows stored in spans at one row
/// count of `x`, over the whole process (warm-up included), all shapes together
/// (`spec_kernels::span_tile_uses`); the report's list is empty where none ran (another
/// backend, a CPU without AVX-512, no verification of 4 to 14 tokens).
#[derive(Debug, Clone, Serialize)]
struct SpanTileRuns {
    rows_of_x: usize,
    /// Products run by each tile (`spec_kernels::SpanTile::name`).
    tiles: BTreeMap<String, u64>,
}

/// The process's [`SpanTileRuns`], by rows of `x`.
fn span_tile_runs() -> Vec<SpanTileRuns> {
    let mut by_rows: BTreeMap<usize, BTreeMap<String, u64>> = BTreeMap::new();
    for shape in spec_kernels::span_tile_uses() {
        let tiles = by_rows.entry(shape.m).or_default();
        for (tile, runs, _) in shape.runs {
            *tiles.entry(tile.name().to_owned()).or_default() += runs;
        }
    }
    by_rows
        .into_iter()
        .map(|(rows_of_x, tiles)| SpanTileRuns { rows_of_x, tiles })
        .collect()
}

/// A loaded target model (for the report).
#[derive(Debug, Clone, Serialize)]
struct ModelInfo {
    target: String,
    path: String,
    /// How the target's projections were kept (`--weights`).
    weights: String,
    load_seconds: f64,
    max_new_tokens: usize,
    /// Indices into the report's `prompts` this target ran.
    prompts: Vec<usize>,
    methods: Vec<String>,
    setup_seconds: BTreeMap<String, f64>,
}

/// The whole `report.json` (schema in `docs/bench-report.md`).
#[derive(Debug, Serialize)]
struct Report {
    schema_version: u32,
    started_unix: u64,
    started_utc: String,
    total_seconds: f64,
    command: Vec<String>,
    machine: Machine,
    span_tiles: Vec<SpanTileRuns>,
    prompts_file: String,
    prompts: Vec<BenchPrompt>,
    temperature: f64,
    seed: u64,
    repeats: usize,
    greedy: bool,
    memory_metric: &'static str,
    skipped_methods: Vec<String>,
    models: Vec<ModelInfo>,
    summaries: Vec<Summary>,
    mismatches: Vec<Mismatch>,
    runs: Vec<RunRecord>,
}

/// A target with its tokenizer, encoded prompts and drafters, ready to run.
struct Group<B: Backend> {
    target: String,
    model: spec_runtime::LoadedModel<B>,
    tokenizer: TextTokenizer,
    /// (index into the run's prompts, tokens).
    prompts: Vec<(usize, Vec<u32>)>,
    max_new_tokens: usize,
    methods: Vec<(PlannedMethod, Box<dyn Drafter<B>>)>,
    info: ModelInfo,
}

/// Runs `spec bench`.
pub(crate) fn run<B: Backend>(
    args: &BenchArgs,
    device: &B::Device,
    limits: DeviceLimits,
) -> Result<()> {
    let mut plan = plan(args)?;
    if args.list_models {
        let mut names = BTreeSet::new();
        for (target, list) in &plan.groups {
            names.insert(target.clone());
            names.extend(list.iter().filter_map(|m| m.draft.clone()));
        }
        for name in names {
            if spec_models::reference_model(&name).is_some() {
                println!("{name}");
            }
        }
        return Ok(());
    }
    let started = Instant::now();
    let started_unix = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let (prompts_file, prompts) = load_prompts(args)?;
    let sampling = SamplingConfig {
        temperature: args.temperature,
        seed: args.seed,
        ..SamplingConfig::default()
    };
    sampling.validate().context("invalid sampling settings")?;
    let greedy = args.temperature == 0.0;
    let out = args
        .out
        .clone()
        .unwrap_or_else(|| PathBuf::from("bench-out").join(utc_stamp(started_unix, true)));
    std::fs::create_dir_all(&out)
        .with_context(|| format!("creating the output folder {}", out.display()))?;
    for note in &plan.skipped {
        eprintln!("spec bench: skipping {note}");
    }

    // Load every target and build every drafter before timing anything, so that a bad method
    // name or a missing model fails up front.
    let mut groups: Vec<Group<B>> = Vec::new();
    for (target, methods) in std::mem::take(&mut plan.groups) {
        eprintln!("spec bench: loading {target}");
        let path = spec_models::resolve(&target)?;
        let tokenizer = load_tokenizer(&path)?;
        let t = Instant::now();
        let model = load_model_with::<B>(&path, device, limits.load_options(args.weights))
            .with_context(|| format!("loading {}", path.display()))?;
        let load_seconds = t.elapsed().as_secs_f64();
        if model.config.vocab_size < tokenizer.vocab_size() {
            bail!(
                "{target}: the tokenizer has {} tokens but the model only {}",
                tokenizer.vocab_size(),
                model.config.vocab_size
            );
        }
        let (max_new_tokens, per_category) = group_limits(args, &methods);
        let mut encoded = Vec::with_capacity(prompts.len());
        for i in select_prompts(&prompts, per_category) {
            let p = &prompts[i];
            let text = tokenizer.apply_chat_template(&[Message::user(p.text.clone())], true)?;
            let ids = tokenizer.encode(&text, true)?;
            if ids.len() + max_new_tokens >= model.model.max_positions() {
                bail!(
                    "prompt {} has {} tokens: with {} new tokens it does not fit {target}'s \
                     context of {}",
                    p.question_id,
                    ids.len(),
                    max_new_tokens,
                    model.model.max_positions()
                );
            }
            encoded.push((i, ids));
        }
        let mut built = Vec::new();
        let mut setup_seconds = BTreeMap::new();
        let mut drafts = DraftModels::new(limits, (&path, args.weights));
        for planned in methods {
            let t = Instant::now();
            match make_drafter(
                &planned.method.spec,
                &model,
                &tokenizer,
                device,
                &mut drafts,
            ) {
                Ok(drafter) => {
                    setup_seconds.insert(planned.method.label.clone(), t.elapsed().as_secs_f64());
                    built.push((planned, drafter));
                }
                // Methods the user did not name are optional; a build may lack some.
                Err(e) if plan.methods_defaulted && is_unknown_method(&e) => {
                    let note = format!("`{}`: {e}", planned.method.label);
                    eprintln!("spec bench: skipping {note}");
                    plan.skipped.push(note);
                }
                Err(e) => {
                    return Err(e.context(format!(
                        "setting up method `{}` on {target}",
                        planned.method.label
                    )));
                }
            }
        }
        let info = ModelInfo {
            target: target.clone(),
            path: path.display().to_string(),
            weights: args.weights.name().to_owned(),
            load_seconds,
            max_new_tokens,
            prompts: encoded.iter().map(|(i, _)| *i).collect(),
            methods: built.iter().map(|(m, _)| m.method.label.clone()).collect(),
            setup_seconds,
        };
        groups.push(Group {
            target,
            model,
            tokenizer,
            prompts: encoded,
            max_new_tokens,
            methods: built,
            info,
        });
    }
    let mut options = GenerateOptions::new(plan.max_new_tokens, sampling);

    // Warm-up before timing: on flex one short generation per method (and so per model); on a
    // backend that compiles kernels per shape, a whole untimed pass (see `WarmUp`).
    let warm_up = WarmUp::for_backend(args.backend);
    for group in &mut groups {
        options.stop_tokens = group.tokenizer.eos_ids().to_vec();
        options.max_new_tokens = match warm_up {
            WarmUp::Short => WARMUP_TOKENS.min(group.max_new_tokens),
            WarmUp::WholePass => group.max_new_tokens,
        };
        options.cache_capacity = Some(cache_capacity(group));
        let prompts = match warm_up {
            WarmUp::Short => &group.prompts[..1],
            WarmUp::WholePass => &group.prompts[..],
        };
        for (planned, drafter) in &mut group.methods {
            eprintln!(
                "spec bench: warming up {} on {} ({} prompt(s), {} tokens)",
                planned.method.label,
                group.target,
                prompts.len(),
                options.max_new_tokens
            );
            for (_, prompt) in prompts {
                generate_speculative(
                    &group.model.model,
                    drafter.as_mut(),
                    prompt,
                    &options,
                    &mut |_| {},
                )
                .with_context(|| format!("warming up {}", planned.method.label))?;
                // No prompt may be measured against its own warm-up answer.
                drafter.forget_requests();
            }
        }
    }

    // Plain decoding closes each prompt's runs as it opens them, where there is something
    // between (`--plain-once` leaves that out).
    let brackets = |group: &Group<B>| !args.plain_once && group.methods.len() > 1;
    let total: usize = groups
        .iter()
        .map(|g| (g.methods.len() + usize::from(brackets(g))) * g.prompts.len())
        .sum::<usize>()
        * args.repeats;
    let progress = progress_bar(total as u64);
    let log_lines = !std::io::stderr().is_terminal();
    let mut runs: Vec<RunRecord> = Vec::with_capacity(total);
    let mut mismatches: Vec<Mismatch> = Vec::new();
    let mut done = 0usize;
    for group in &mut groups {
        options.stop_tokens = group.tokenizer.eos_ids().to_vec();
        options.max_new_tokens = group.max_new_tokens;
        options.cache_capacity = Some(cache_capacity(group));
        for repeat in 0..args.repeats {
            // Each repeat starts as the first did: no drafter has seen these prompts' answers.
            for (_, drafter) in &mut group.methods {
                drafter.forget_requests();
            }
            for (i, prompt) in &group.prompts {
                let p = &prompts[*i];
                // Methods run back to back on each prompt, between two runs of plain
                // decoding (the group's first method), so load drift on a shared machine hits
                // them and the baseline alike.
                let mut plain_tokens: Option<Vec<u32>> = None;
                let order = (0..group.methods.len()).chain(brackets(group).then_some(0));
                for index in order {
                    let (planned, drafter) = &mut group.methods[index];
                    let plain_pass = planned.method.is_plain().then(|| {
                        if plain_tokens.is_none() {
                            PlainPass::Before
                        } else {
                            PlainPass::After
                        }
                    });
                    let label = &planned.method.label;
                    progress.set_message(format!(
                        "{} · {label} · {} ({})",
                        group.target, p.question_id, p.category
                    ));
                    let round_trip_before = core_round_trip_ns();
                    let reset = reset_peak_rss();
                    let rss_before = read_status_kib("VmRSS:");
                    let generation = generate_speculative(
                        &group.model.model,
                        drafter.as_mut(),
                        prompt,
                        &options,
                        &mut |_| {},
                    )
                    .with_context(|| {
                        format!("{label} on prompt {} ({})", p.question_id, group.target)
                    })?;
                    let peak = read_status_kib("VmHWM:");
                    let round_trip_after = core_round_trip_ns();
                    let m = &generation.metrics;
                    let matches_plain = if plain_pass == Some(PlainPass::Before) {
                        plain_tokens = Some(generation.tokens.clone());
                        None
                    } else if greedy {
                        plain_tokens.as_ref().map(|plain| {
                            let first = first_difference(plain, &generation.tokens);
                            if let Some(position) = first {
                                mismatches.push(Mismatch {
                                    target: group.target.clone(),
                                    method: match plain_pass {
                                        Some(PlainPass::After) => format!("{label} (after)"),
                                        _ => label.clone(),
                                    },
                                    question_id: p.question_id.clone(),
                                    turn: p.turn,
                                    repeat,
                                    position,
                                    plain_token: plain.get(position).copied(),
                                    method_token: generation.tokens.get(position).copied(),
                                    plain_text: around(&group.tokenizer, plain, position),
                                    method_text: around(
                                        &group.tokenizer,
                                        &generation.tokens,
                                        position,
                                    ),
                                });
                            }
                            first.is_none()
                        })
                    } else {
                        None
                    };
                    let record = RunRecord {
                        target: group.target.clone(),
                        method: label.clone(),
                        method_name: planned.method.spec.method.clone(),
                        draft_model: planned.draft.clone(),
                        question_id: p.question_id.clone(),
                        category: p.category.clone(),
                        turn: p.turn,
                        repeat,
                        prompt_tokens: prompt.len(),
                        new_tokens: generation.tokens.len(),
                        stop_reason: generation.stats.stop_reason,
                        wall_seconds: generation.stats.wall_seconds,
                        prompt_seconds: generation.stats.prompt_seconds,
                        tokens_per_second: generation.stats.tokens_per_second,
                        decode_tokens_per_second: generation.stats.decode_tokens_per_second,
                        decode_tokens: generation.stats.decode_tokens,
                        draft_seconds: generation.draft_seconds,
                        target_seconds: generation.target_seconds,
                        draft_forward_seconds: generation.draft_forward_seconds,
                        step_seconds: generation.step_seconds,
                        fixed_k: fixed_draft_length(&planned.method),
                        steps: m.steps,
                        target_forwards: m.target_forwards,
                        draft_forwards: m.draft_forwards,
                        drafted: m.drafted,
                        accepted: m.accepted,
                        rejections: m.rejections,
                        produced: m.produced,
                        alpha: m.alpha(),
                        alpha_per_tested_draft: m.alpha_per_tested_draft(),
                        tau: m.tau(),
                        drafter_estimates: drafter.report_estimates().into_iter().collect(),
                        drafted_by_position: m.by_position.iter().map(|c| c.drafted).collect(),
                        accepted_by_position: m.by_position.iter().map(|c| c.accepted).collect(),
                        rss_before_bytes: rss_before.map(|k| k * 1024),
                        peak_rss_bytes: peak.map(|k| k * 1024),
                        peak_rss_scope: if reset { "generation" } else { "process" },
                        matches_plain,
                        plain_pass,
                        core_round_trip_ns: [round_trip_before, round_trip_after],
                        tokens: generation.tokens,
                    };
                    done += 1;
                    progress.inc(1);
                    if log_lines {
                        eprintln!(
                            "[{done}/{total}] {} · {label} · {} ({}): {} tokens, {:.1} tok/s, \
                             decode {:.1} tok/s{}{}",
                            group.target,
                            p.question_id,
                            p.category,
                            record.new_tokens,
                            record.tokens_per_second,
                            record.decode_tokens_per_second,
                            record
                                .tau
                                .map(|t| format!(", τ {t:.2}"))
                                .unwrap_or_default(),
                            match record.matches_plain {
                                Some(false) => ", DIFFERS FROM PLAIN",
                                _ => "",
                            }
                        );
                    }
                    runs.push(record);
                }
            }
        }
    }
    progress.finish_and_clear();

    let categories = categories_in_order(&prompts);
    let summaries = summarize(&runs, &categories);
    let report = Report {
        schema_version: 2,
        started_unix,
        started_utc: utc_stamp(started_unix, false),
        total_seconds: started.elapsed().as_secs_f64(),
        command: std::env::args().collect(),
        machine: machine_info(args.backend),
        span_tiles: span_tile_runs(),
        prompts_file,
        prompts,
        temperature: args.temperature,
        seed: args.seed,
        repeats: args.repeats,
        greedy,
        memory_metric: "VmHWM of /proc/self/status after resetting it (clear_refs 5) just \
                        before each generation: the process's peak resident memory during that \
                        generation, model weights included",
        skipped_methods: plan.skipped,
        models: groups.iter().map(|g| g.info.clone()).collect(),
        summaries,
        mismatches,
        runs,
    };
    let markdown = render_markdown(&report, &categories);
    print!("{markdown}");
    std::fs::write(out.join("report.md"), &markdown)
        .with_context(|| format!("writing {}", out.join("report.md").display()))?;
    std::fs::write(
        out.join("report.json"),
        serde_json::to_string_pretty(&report)?,
    )
    .with_context(|| format!("writing {}", out.join("report.json").display()))?;
    crate::plots::speedup_svg(&out.join("speedup.svg"), &report_bars(&report, &categories))?;
    crate::plots::acceptance_svg(&out.join("acceptance.svg"), &report_acceptance(&report))?;
    eprintln!(
        "spec bench: wrote {}/{{report.md, report.json, speedup.svg, acceptance.svg}} in {:.0} s",
        out.display(),
        report.total_seconds
    );
    if !report.mismatches.is_empty() {
        bail!(
            "{} greedy generation(s) differ from plain decoding (see the report's lossless \
             check); speculative decoding must not change greedy output",
            report.mismatches.len()
        );
    }
    Ok(())
}

/// The target's cache only needs the longest prompt plus the new tokens (and a tree's worth of
/// drafts); the model's full context would cost gigabytes for Qwen's 32k positions.
fn cache_capacity<B: Backend>(group: &Group<B>) -> usize {
    let longest = group
        .prompts
        .iter()
        .map(|(_, p)| p.len())
        .max()
        .unwrap_or(0);
    (longest + group.max_new_tokens + 256).min(group.model.model.max_positions())
}

/// `make_drafter`'s error for a method name it has no arm for.
fn is_unknown_method(e: &anyhow::Error) -> bool {
    e.to_string().starts_with("unknown method")
}

fn progress_bar(total: u64) -> ProgressBar {
    let bar = ProgressBar::new(total);
    if let Ok(style) =
        ProgressStyle::with_template("{elapsed_precise} [{bar:30}] {pos}/{len} eta {eta} {msg}")
    {
        bar.set_style(style.progress_chars("=> "));
    }
    bar
}

/// The first index where `b` differs from `a` (a length difference counts).
fn first_difference(a: &[u32], b: &[u32]) -> Option<usize> {
    match a.iter().zip(b).position(|(x, y)| x != y) {
        Some(i) => Some(i),
        None if a.len() != b.len() => Some(a.len().min(b.len())),
        None => None,
    }
}

/// A few tokens around `position`, decoded, for the mismatch report.
fn around(tokenizer: &TextTokenizer, tokens: &[u32], position: usize) -> String {
    let start = position.saturating_sub(4);
    let end = (position + 4).min(tokens.len());
    if start >= end {
        return String::new();
    }
    tokenizer
        .decode(&tokens[start..end])
        .unwrap_or_else(|_| format!("{:?}", &tokens[start..end]))
}

fn categories_in_order(prompts: &[BenchPrompt]) -> Vec<String> {
    let mut seen = Vec::new();
    for p in prompts {
        if !seen.contains(&p.category) {
            seen.push(p.category.clone());
        }
    }
    seen
}

/// Per (target, method) and category, then "all".
fn summarize(runs: &[RunRecord], categories: &[String]) -> Vec<Summary> {
    let mut keys: Vec<(String, String)> = Vec::new();
    for r in runs {
        let key = (r.target.clone(), r.method.clone());
        if !keys.contains(&key) {
            keys.push(key);
        }
    }
    let mut out = Vec::new();
    for (target, method) in &keys {
        let plain_label = runs
            .iter()
            .find(|r| r.target == *target && r.method_name == "plain")
            .map(|r| r.method.clone());
        for category in categories
            .iter()
            .map(String::as_str)
            .chain(std::iter::once("all"))
        {
            let in_cat = |r: &&RunRecord| category == "all" || r.category == category;
            let mine: Vec<&RunRecord> = runs
                .iter()
                .filter(|r| r.target == *target && r.method == *method)
                .filter(in_cat)
                .collect();
            if mine.is_empty() {
                continue;
            }
            let tps = mean(mine.iter().map(|r| r.tokens_per_second));
            let plain: Option<Vec<&RunRecord>> = plain_label.as_ref().map(|label| {
                runs.iter()
                    .filter(|r| r.target == *target && r.method == *label)
                    .filter(in_cat)
                    .collect()
            });
            // A per-prompt speed's mean ÷ plain decoding's (None without a plain baseline).
            let ratio_to_plain = |speed: fn(&RunRecord) -> f64| {
                let plain_mean = mean(plain.as_ref()?.iter().map(|r| speed(r)));
                (plain_mean > 0.0).then(|| mean(mine.iter().map(|r| speed(r))) / plain_mean)
            };
            let speedup = ratio_to_plain(|r| r.tokens_per_second);
            let decode_speedup = ratio_to_plain(|r| r.decode_tokens_per_second);
            let sum = |f: fn(&RunRecord) -> u64| mine.iter().map(|r| f(r)).sum::<u64>();
            // The runs' summed counters; α, α per tested draft and τ come from `spec_core`.
            let depth = mine
                .iter()
                .map(|r| r.drafted_by_position.len())
                .max()
                .unwrap_or(0);
            let at = |counts: &[u64], i: usize| counts.get(i).copied().unwrap_or(0);
            let counts = Metrics {
                steps: sum(|r| r.steps),
                target_forwards: sum(|r| r.target_forwards),
                draft_forwards: sum(|r| r.draft_forwards),
                drafted: sum(|r| r.drafted),
                accepted: sum(|r| r.accepted),
                rejections: sum(|r| r.rejections),
                produced: sum(|r| r.produced),
                by_position: (0..depth)
                    .map(|i| PositionCounts {
                        drafted: mine.iter().map(|r| at(&r.drafted_by_position, i)).sum(),
                        accepted: mine.iter().map(|r| at(&r.accepted_by_position, i)).sum(),
                    })
                    .collect(),
            };
            let acceptance_by_position = counts.acceptance_by_position();
            let alpha_per_tested_draft = counts.alpha_per_tested_draft();
            let draft_bound = plain
                .as_deref()
                .and_then(|plain| draft_bound(&mine, plain, &counts, speedup));
            out.push(Summary {
                target: target.clone(),
                method: method.clone(),
                category: category.to_owned(),
                runs: mine.len(),
                new_tokens: mine.iter().map(|r| r.new_tokens as u64).sum(),
                tokens_per_second: tps,
                speedup,
                decode_speedup,
                tau: counts.tau(),
                alpha: counts.alpha(),
                alpha_per_tested_draft,
                acceptance_by_position,
                mismatches: mine
                    .iter()
                    .filter(|r| r.matches_plain == Some(false))
                    .count(),
                max_peak_rss_bytes: mine.iter().filter_map(|r| r.peak_rss_bytes).max(),
                draft_bound,
            });
        }
    }
    out
}

/// The [`DraftBound`] of a draft-model method's runs `mine` (one method, one target), with
/// `plain` the plain runs of the same target and prompts, `counts` the counters summed over
/// `mine` (α per tested draft, steps, draft forwards, the steps by draft length) and `speedup`
/// the summary's. `None` for methods without a draft model, or when something it needs was not
/// measured (nothing drafted, no plain steps).
fn draft_bound(
    mine: &[&RunRecord],
    plain: &[&RunRecord],
    counts: &Metrics,
    speedup: Option<f64>,
) -> Option<DraftBound> {
    let first = mine.first()?;
    if !uses_draft_model(&first.method_name) {
        return None;
    }
    let alpha = counts.alpha_per_tested_draft()?;
    let total =
        |runs: &[&RunRecord], f: fn(&RunRecord) -> f64| runs.iter().map(|r| f(r)).sum::<f64>();
    let count =
        |runs: &[&RunRecord], f: fn(&RunRecord) -> u64| runs.iter().map(|r| f(r)).sum::<u64>();
    let (draft_forwards, steps) = (counts.draft_forwards, counts.steps);
    let plain_steps = count(plain, |r| r.steps);
    if draft_forwards == 0 || steps == 0 || plain_steps == 0 {
        return None;
    }
    let draft_forward_seconds = total(mine, |r| r.draft_forward_seconds) / draft_forwards as f64;
    let plain_step_seconds = total(plain, |r| r.step_seconds) / plain_steps as f64;
    if plain_step_seconds <= 0.0 {
        return None;
    }
    // The mean drafted per step: a fixed K's last step of a generation drafts only the tokens
    // left, and `auto` varies.
    let k = counts.drafted as f64 / steps as f64;
    let cost_ratio = draft_forward_seconds / plain_step_seconds;
    let steps_by_length = counts.steps_by_depth();
    let speedup_bound = speedup_bound(alpha, cost_ratio, &steps_by_length)?;
    let expected_tau = mean_expected_tokens(alpha, &steps_by_length)?;
    let verify_ratio = total(mine, |r| r.step_seconds) / steps as f64 / plain_step_seconds;
    let pooled_decode_speed = |runs: &[&RunRecord]| {
        let seconds = total(runs, |r| r.wall_seconds - r.prompt_seconds);
        (seconds > 0.0).then(|| count(runs, |r| r.decode_tokens as u64) as f64 / seconds)
    };
    let pooled_decode_speedup = pooled_decode_speed(mine)
        .zip(pooled_decode_speed(plain).filter(|&s| s > 0.0))
        .map(|(mine, plain)| mine / plain);
    Some(DraftBound {
        alpha,
        k,
        draft_forward_seconds,
        plain_step_seconds,
        cost_ratio,
        expected_tau,
        speedup_bound,
        achieved_over_bound: speedup.map(|s| s / speedup_bound),
        pooled_decode_speedup,
        decode_over_bound: pooled_decode_speedup.map(|s| s / speedup_bound),
        tau_over_expected: counts.tau()? / expected_tau,
        verify_ratio,
        bound_with_verify: expected_tau / (k * cost_ratio + verify_ratio),
    })
}

/// Plain decoding's speed on one target before a prompt's other methods and after them: how
/// far the machine drifted over those runs.
#[derive(Debug, PartialEq)]
struct PlainDrift {
    target: String,
    /// Mean (tok/s, decode tok/s) of the runs before the methods.
    before: (f64, f64),
    /// The same of the runs after them.
    after: (f64, f64),
}

/// [`PlainDrift`] of each target whose plain runs were bracketed (none with `--plain-once`).
fn plain_drift(runs: &[RunRecord]) -> Vec<PlainDrift> {
    let mut targets: Vec<&str> = Vec::new();
    for r in runs
        .iter()
        .filter(|r| r.plain_pass == Some(PlainPass::After))
    {
        if !targets.contains(&r.target.as_str()) {
            targets.push(&r.target);
        }
    }
    let speeds = |target: &str, pass: PlainPass| {
        let of = |speed: fn(&RunRecord) -> f64| {
            mean(
                runs.iter()
                    .filter(|r| r.target == target && r.plain_pass == Some(pass))
                    .map(speed),
            )
        };
        (
            of(|r| r.tokens_per_second),
            of(|r| r.decode_tokens_per_second),
        )
    };
    targets
        .into_iter()
        .map(|target| PlainDrift {
            target: target.to_owned(),
            before: speeds(target, PlainPass::Before),
            after: speeds(target, PlainPass::After),
        })
        .collect()
}

/// The least, median and greatest of the runs' [`RunRecord::core_round_trip_ns`]; `None`
/// where none was measured.
fn round_trip_spread(runs: &[RunRecord]) -> Option<(f64, f64, f64)> {
    let mut all: Vec<f64> = runs
        .iter()
        .flat_map(|r| r.core_round_trip_ns.iter().flatten().copied())
        .collect();
    all.sort_by(f64::total_cmp);
    Some((*all.first()?, all[all.len() / 2], *all.last()?))
}

fn mean(values: impl Iterator<Item = f64>) -> f64 {
    let (sum, n) = values.fold((0.0, 0usize), |(s, n), v| (s + v, n + 1));
    if n == 0 { 0.0 } else { sum / n as f64 }
}

fn opt(value: Option<f64>, digits: usize) -> String {
    value.map_or_else(|| "–".to_owned(), |v| format!("{v:.digits$}"))
}

fn render_markdown(report: &Report, categories: &[String]) -> String {
    let mut s = String::new();
    let m = &report.machine;
    let _ = writeln!(s, "# spec bench — {}\n", report.started_utc);
    let _ = writeln!(
        s,
        "- machine: {} ({} cores{}), {}; kernels {}; backend {}; GPU: {}",
        m.cpu,
        m.cores,
        m.memory_bytes
            .map(|b| format!(", {:.1} GiB", b as f64 / (1u64 << 30) as f64))
            .unwrap_or_default(),
        m.os,
        m.kernels,
        m.backend,
        m.gpu.as_deref().unwrap_or("none")
    );
    let _ = writeln!(
        s,
        "- prompts: {} from `{}` ({} categories); temperature {}{}; seed {}; repeats {}",
        report.prompts.len(),
        report.prompts_file,
        categories.len(),
        report.temperature,
        if report.greedy { " (greedy)" } else { "" },
        report.seed,
        report.repeats
    );
    for model in &report.models {
        let _ = writeln!(
            s,
            "- target `{}` ({}, weights {}), loaded in {:.1} s: {} prompts, {} new tokens each; {}",
            model.target,
            model.path,
            model.weights,
            model.load_seconds,
            model.prompts.len(),
            model.max_new_tokens,
            model.methods.join(", ")
        );
    }
    for drift in plain_drift(&report.runs) {
        let _ = writeln!(
            s,
            "- plain decoding on `{}`, before the methods / after them: {:.2} / {:.2} tok/s, \
             decode {:.2} / {:.2} tok/s (means over prompts; the baseline is both runs)",
            drift.target, drift.before.0, drift.after.0, drift.before.1, drift.after.1
        );
    }
    if let Some((low, median, high)) = round_trip_spread(&report.runs) {
        let _ = writeln!(
            s,
            "- two threads' core round trip before and after each run: {low:.0}-{high:.0} ns, \
             median {median:.0} (`core_round_trip_ns` in report.json: where the threads sat)"
        );
    }
    if !report.span_tiles.is_empty() {
        let rows: Vec<String> = report
            .span_tiles
            .iter()
            .map(|r| {
                let tiles: Vec<String> = r.tiles.iter().map(|(t, n)| format!("{t} {n}")).collect();
                format!("{} rows: {}", r.rows_of_x, tiles.join(", "))
            })
            .collect();
        let _ = writeln!(
            s,
            "- CPU products of f32 rows in spans, tiles picked by timing (products run): {}",
            rows.join("; ")
        );
    }
    for note in &report.skipped_methods {
        let _ = writeln!(s, "- skipped {note}");
    }
    let _ = writeln!(
        s,
        "- total time {:.0} s\n\nspeedup = mean per-prompt tok/s ÷ plain decoding's on the same \
         target; τ = tokens per target forward; α = accepted ÷ drafted; tok/s includes prefill; \
         decode speedup = the same ratio of tokens per second after the first step (prefill and \
         the first step, which may give several tokens, excluded).\n",
        report.total_seconds
    );
    if report.summaries.iter().any(|x| x.draft_bound.is_some()) {
        let _ = writeln!(
            s,
            "Draft-model methods: α tested = accepted ÷ (accepted + rejections), the drafts \
             after a rejection not counted; K = mean drafted tokens per step (a fixed K's last \
             step drafts only the tokens left); c = mean time of one draft-model step (forward \
             and sampling) ÷ mean time of one plain decode step of the same target in this run; \
             bound = E[τ] ÷ (K·c + 1) with E[τ] = (1 − α^(K+1)) ÷ (1 − α) at each step's own K, \
             averaged over the steps, α tested (Leviathan et al. 2023, Theorem 3.8); τ ÷ E[τ] \
             below 1: the steps yielded fewer tokens than independent acceptances at that α \
             would; speedup ÷ bound includes the prefill; decode ÷ bound does not (nor does the \
             bound), and pools like the bound: Σ tokens ÷ Σ seconds after the first step, over \
             the row's runs, against the same of plain decoding; v = mean time of one \
             verification step ÷ that of a plain step (the bound takes 1); with v = E[τ] ÷ \
             (K·c + v).\n"
        );
    }

    let _ = writeln!(s, "## Speedup by category\n");
    let _ = write!(s, "| target | method |");
    for c in categories {
        let _ = write!(s, " {c} |");
    }
    let _ = writeln!(s, " all |");
    let _ = writeln!(s, "|---|---|{}---|", "---|".repeat(categories.len()));
    let mut keys: Vec<(&str, &str)> = Vec::new();
    for x in &report.summaries {
        if !keys.contains(&(x.target.as_str(), x.method.as_str())) {
            keys.push((&x.target, &x.method));
        }
    }
    let find = |t: &str, me: &str, c: &str| {
        report
            .summaries
            .iter()
            .find(|x| x.target == t && x.method == me && x.category == c)
    };
    for (t, me) in &keys {
        let _ = write!(s, "| {t} | {me} |");
        for c in categories.iter().map(String::as_str).chain(["all"]) {
            let cell = find(t, me, c).map_or("–".to_owned(), |x| {
                x.speedup.map_or("–".into(), |v| format!("{v:.2}×"))
            });
            let _ = write!(s, " {cell} |");
        }
        let _ = writeln!(s);
    }

    let _ = writeln!(s, "\n## Details\n");
    let _ = writeln!(
        s,
        "| target | method | category | speedup | τ | α | tok/s | decode speedup | mismatches \
         | runs | peak RSS MiB |"
    );
    let _ = writeln!(s, "|---|---|---|---|---|---|---|---|---|---|---|");
    for x in &report.summaries {
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {} | {:.2} | {} | {} | {} | {} |",
            x.target,
            x.method,
            x.category,
            x.speedup.map_or("–".into(), |v| format!("{v:.2}×")),
            opt(x.tau, 2),
            opt(x.alpha, 2),
            x.tokens_per_second,
            x.decode_speedup.map_or("–".into(), |v| format!("{v:.2}×")),
            if report.greedy && !x.method.starts_with("plain") {
                x.mismatches.to_string()
            } else {
                "–".into()
            },
            x.runs,
            x.max_peak_rss_bytes
                .map_or("–".into(), |b| format!("{:.0}", b as f64 / 1048576.0)),
        );
    }

    let bounded: Vec<(&Summary, &DraftBound)> = report
        .summaries
        .iter()
        .filter_map(|x| Some((x, x.draft_bound.as_ref()?)))
        .collect();
    if !bounded.is_empty() {
        let _ = writeln!(s, "\n## Draft-model methods against the bound\n");
        let _ = writeln!(
            s,
            "| target | method | category | τ | α tested | K | c | E[τ] | τ ÷ E[τ] | bound \
             | speedup ÷ bound | decode ÷ bound | v | with v |"
        );
        let _ = writeln!(
            s,
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
        );
        for (x, b) in bounded {
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} | {:.2} | {:.2} | {:.3} | {:.2} | {:.2} | {:.2}× | {} | {} \
                 | {:.2} | {:.2}× |",
                x.target,
                x.method,
                x.category,
                opt(x.tau, 2),
                b.alpha,
                b.k,
                b.cost_ratio,
                b.expected_tau,
                b.tau_over_expected,
                b.speedup_bound,
                opt(b.achieved_over_bound, 2),
                opt(b.decode_over_bound, 2),
                b.verify_ratio,
                b.bound_with_verify,
            );
        }
    }

    let drafting: Vec<&Summary> = report
        .summaries
        .iter()
        .filter(|x| x.category == "all" && !x.acceptance_by_position.is_empty())
        .collect();
    if !drafting.is_empty() {
        let _ = writeln!(s, "\n## Acceptance by draft position (all prompts)\n");
        let depth = drafting
            .iter()
            .map(|x| x.acceptance_by_position.len())
            .max()
            .unwrap_or(0)
            .min(12);
        let _ = write!(s, "| target | method |");
        for i in 1..=depth {
            let _ = write!(s, " {i} |");
        }
        let _ = writeln!(s, "\n|---|---|{}", "---|".repeat(depth));
        for x in drafting {
            let _ = write!(s, "| {} | {} |", x.target, x.method);
            for i in 0..depth {
                let cell = x
                    .acceptance_by_position
                    .get(i)
                    .map_or("–".into(), |v| format!("{v:.2}"));
                let _ = write!(s, " {cell} |");
            }
            let _ = writeln!(s);
        }
    }

    let _ = writeln!(s, "\n## Lossless check\n");
    if !report.greedy {
        let _ = writeln!(
            s,
            "Not checked: temperature {} samples, so outputs differ by design.",
            report.temperature
        );
    } else if report.mismatches.is_empty() {
        let compared = report
            .runs
            .iter()
            .filter(|r| r.matches_plain.is_some())
            .count();
        let _ = writeln!(
            s,
            "Every greedy method produced exactly plain decoding's tokens ({compared} \
             comparisons)."
        );
    } else {
        let _ = writeln!(
            s,
            "**{} generation(s) differ from plain decoding.** First per method:\n",
            report.mismatches.len()
        );
        let mut shown = BTreeSet::new();
        for x in &report.mismatches {
            if shown.insert((&x.target, &x.method)) {
                let _ = writeln!(
                    s,
                    "- {} `{}`: prompt {} (turn {}, repeat {}), position {}: plain {:?} {:?}, \
                     method {:?} {:?}",
                    x.target,
                    x.method,
                    x.question_id,
                    x.turn,
                    x.repeat,
                    x.position,
                    x.plain_token,
                    x.plain_text,
                    x.method_token,
                    x.method_text
                );
            }
        }
    }
    let _ = writeln!(s, "\nPeak RSS: {}.", report.memory_metric);
    s
}

/// (label, per-category speedups) of every non-plain method, for the speedup plot.
fn report_bars(report: &Report, categories: &[String]) -> crate::plots::Bars {
    let mut labels: Vec<String> = categories.to_vec();
    labels.push("all".into());
    let mut series = Vec::new();
    let mut keys: Vec<(&str, &str)> = Vec::new();
    for x in &report.summaries {
        if !keys.contains(&(x.target.as_str(), x.method.as_str())) && !x.method.starts_with("plain")
        {
            keys.push((&x.target, &x.method));
        }
    }
    for (t, me) in keys {
        let values = labels
            .iter()
            .map(|c| {
                report
                    .summaries
                    .iter()
                    .find(|x| x.target == t && x.method == me && x.category == *c)
                    .and_then(|x| x.speedup)
            })
            .collect();
        series.push((format!("{me} ({t})"), values));
    }
    crate::plots::Bars {
        categories: labels,
        series,
    }
}

fn report_acceptance(report: &Report) -> Vec<(String, Vec<f64>)> {
    report
        .summaries
        .iter()
        .filter(|x| x.category == "all" && !x.acceptance_by_position.is_empty())
        .map(|x| {
            (
                format!("{} ({})", x.method, x.target),
                x.acceptance_by_position.clone(),
            )
        })
        .collect()
}

/// Resets the process's peak resident size (`VmHWM`) to the current one; false where the
/// kernel refuses.
fn reset_peak_rss() -> bool {
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
}

/// The mean time, in ns, for a cache line to go from this thread to a second one and back:
/// where the operating system (and a hypervisor under it) has put two threads of this
/// process. In the thirty-ninth session's runs on a 2-vCPU Zen 5 VM it was 48-71 ns in one
/// placement of the vCPUs and 350-391 ns in the other, the one in which two threads stream
/// memory about half again as fast (docs/benchmarks.md), so each run records it. Spins for
/// at most [`ROUND_TRIP_PROBE`]; `None` when fewer than 100 round trips were made in that time
/// (the two threads did not run at once) or no thread could be started.
fn core_round_trip_ns() -> Option<f64> {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    const TRIPS: u64 = 20_000;
    // Let the kernels' helper threads, which spin 2 ms after a job, go idle first.
    std::thread::sleep(std::time::Duration::from_millis(3));
    let flag = AtomicU64::new(0);
    let stop = AtomicBool::new(false);
    std::thread::scope(|scope| {
        let echo = std::thread::Builder::new().spawn_scoped(scope, || {
            for i in 0..TRIPS {
                while flag.load(Ordering::Acquire) != 2 * i + 1 {
                    if stop.load(Ordering::Relaxed) {
                        return;
                    }
                }
                flag.store(2 * i + 2, Ordering::Release);
            }
        });
        if echo.is_err() {
            return None;
        }
        let start = Instant::now();
        let mut trips = 0;
        'trips: while trips < TRIPS {
            flag.store(2 * trips + 1, Ordering::Release);
            while flag.load(Ordering::Acquire) != 2 * trips + 2 {
                if start.elapsed() > ROUND_TRIP_PROBE {
                    break 'trips;
                }
            }
            trips += 1;
        }
        let seconds = start.elapsed().as_secs_f64();
        stop.store(true, Ordering::Relaxed);
        (trips >= 100).then(|| seconds * 1e9 / trips as f64)
    })
}

/// The longest [`core_round_trip_ns`] spins: 20,000 round trips took 1-8 ms on that VM.
const ROUND_TRIP_PROBE: std::time::Duration = std::time::Duration::from_millis(50);

/// A `kB` field of `/proc/self/status`, in KiB.
fn read_status_kib(field: &str) -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
}

fn machine_info(backend: BackendName) -> Machine {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let field = |name: &str| {
        cpuinfo.lines().find_map(|l| {
            l.split_once(':')
                .filter(|(key, _)| key.trim() == name)
                .map(|(_, v)| v.trim().to_owned())
        })
    };
    let cpu = field("model name").unwrap_or_else(|| std::env::consts::ARCH.to_owned());
    // A virtual machine may name only the vendor's line ("AMD EPYC"); family and model tell
    // its generations apart.
    let cpu = match (field("cpu family"), field("model")) {
        (Some(family), Some(model)) => format!("{cpu} (family {family}, model {model})"),
        _ => cpu,
    };
    let memory_bytes = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find_map(|l| l.strip_prefix("MemTotal:"))
                .and_then(|r| r.split_whitespace().next())
                .and_then(|n| n.parse::<u64>().ok())
        })
        .map(|k| k * 1024);
    let os = format!(
        "{} {}",
        std::env::consts::OS,
        std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .unwrap_or_default()
            .trim()
    );
    let gpu = std::process::Command::new("nvidia-smi")
        .args(["--query-gpu=name,memory.total", "--format=csv,noheader"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .trim()
                .replace('\n', "; ")
        })
        .filter(|s| !s.is_empty());
    Machine {
        cpu,
        kernels: spec_kernels::instruction_set().to_owned(),
        cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
        memory_bytes,
        os,
        backend: format!("{backend:?}").to_lowercase(),
        gpu,
    }
}

/// `2026-11-22T22:10:03Z`, or `20261122-221003` for folder names.
fn utc_stamp(unix: u64, compact: bool) -> String {
    let (days, rem) = ((unix / 86_400) as i64, unix % 86_400);
    let (h, mi, se) = (rem / 3600, rem % 3600 / 60, rem % 60);
    // Civil date from days since 1970-01-01 (the proleptic Gregorian calendar).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    if compact {
        format!("{y:04}{m:02}{d:02}-{h:02}{mi:02}{se:02}")
    } else {
        format!("{y:04}-{m:02}-{d:02}T{h:02}:{mi:02}:{se:02}Z")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;
    use std::path::Path;

    #[derive(Parser)]
    struct Wrap {
        #[command(flatten)]
        args: BenchArgs,
    }

    fn args(line: &[&str]) -> BenchArgs {
        Wrap::parse_from(std::iter::once("bench").chain(line.iter().copied())).args
    }

    fn labels(plan: &Plan) -> Vec<(String, Vec<String>)> {
        plan.groups
            .iter()
            .map(|(t, l)| {
                (
                    t.clone(),
                    l.iter().map(|m| m.method.label.clone()).collect(),
                )
            })
            .collect()
    }

    #[test]
    fn default_plan_groups_methods_by_target_with_plain_first() {
        let p = plan(&args(&["--bigram", "b.bin"])).unwrap();
        assert_eq!(
            labels(&p),
            [
                (
                    SMALL_TARGET.to_owned(),
                    vec!["plain".to_owned(), "prompt-lookup".into(), "bigram".into()]
                ),
                (
                    DRAFT_PAIR.0.to_owned(),
                    vec!["plain".into(), "sampling".into(), "sampling:k=auto".into()]
                ),
            ]
        );
        let sampling = &p.groups[1].1[1];
        assert_eq!(
            sampling.method.spec.draft_model.as_deref(),
            Some(DRAFT_PAIR.1)
        );
        assert_eq!(sampling.draft.as_deref(), Some(DRAFT_PAIR.1));
        assert_eq!(
            p.groups[0].1[2].method.spec.bigram.as_deref(),
            Some(Path::new("b.bin"))
        );
        assert_eq!(p.max_new_tokens, DEFAULT_MAX_NEW_TOKENS);
        assert!(p.methods_defaulted);

        // Without a bigram file the default bigram is skipped, with a note.
        let p = plan(&args(&[])).unwrap();
        assert_eq!(p.skipped.len(), 1);
        assert!(p.skipped[0].contains("bigram"));
    }

    #[test]
    fn models_flag_and_target_keys_override_defaults() {
        let p = plan(&args(&[
            "--models",
            "a.gguf,d.gguf",
            "--methods",
            "sampling:k=4,prompt-lookup,plain:target=z.gguf",
            "--max-new-tokens",
            "7",
        ]))
        .unwrap();
        assert_eq!(
            labels(&p),
            [
                (
                    "a.gguf".to_owned(),
                    vec![
                        "plain".to_owned(),
                        "sampling:k=4".into(),
                        "prompt-lookup".into()
                    ]
                ),
                ("z.gguf".to_owned(), vec!["plain:target=z.gguf".to_owned()]),
            ]
        );
        assert_eq!(p.groups[0].1[1].draft.as_deref(), Some("d.gguf"));
        assert_eq!(p.groups[0].1[2].draft, None);
        assert_eq!(p.max_new_tokens, 7);
        // A listed plain is the baseline of the sampling group, not a group of its own.
        let p = plan(&args(&["--methods", "plain,sampling"])).unwrap();
        assert_eq!(
            labels(&p),
            [(
                DRAFT_PAIR.0.to_owned(),
                vec!["plain".to_owned(), "sampling".into()]
            )]
        );
        let p = plan(&args(&["--methods", "plain", "--models", "m.gguf"])).unwrap();
        assert_eq!(
            labels(&p),
            [("m.gguf".to_owned(), vec!["plain".to_owned()])]
        );
        assert!(plan(&args(&["--models", "a,b,c"])).is_err());
        assert!(plan(&args(&["--repeats", "0"])).is_err());
    }

    #[test]
    fn quick_runs_ngram_methods_on_the_small_target() {
        let p = plan(&args(&["--quick"])).unwrap();
        assert_eq!(
            labels(&p),
            [(
                SMALL_TARGET.to_owned(),
                vec!["plain".to_owned(), "prompt-lookup".into()]
            )]
        );
        assert_eq!(p.max_new_tokens, QUICK_MAX_NEW_TOKENS);
    }

    #[test]
    fn the_prompt_set_parses_and_covers_every_category() {
        let all = parse_prompts(DEFAULT_PROMPTS, 0, false).unwrap();
        let cats = categories_in_order(&all);
        for c in [
            "conversation",
            "translation",
            "summarization",
            "qa",
            "math",
            "rag",
            "code",
        ] {
            assert!(cats.iter().any(|x| x == c), "missing category {c}");
            assert!(all.iter().filter(|p| p.category == c).count() >= 2);
        }
        let ids: BTreeSet<_> = all.iter().map(|p| &p.question_id).collect();
        assert_eq!(ids.len(), all.len(), "question ids must be unique");
        let quick = parse_prompts(DEFAULT_PROMPTS, 1, false).unwrap();
        assert_eq!(quick.len(), cats.len());
    }

    #[test]
    fn prompts_limit_per_category_and_expand_turns() {
        let text = r#"{"question_id": 1, "category": "a", "turns": ["x", "y"]}
{"question_id": "q2", "category": "a", "turns": ["z"]}

{"question_id": 3, "category": "b", "turns": ["w"]}
"#;
        let p = parse_prompts(text, 1, true).unwrap();
        let got: Vec<_> = p
            .iter()
            .map(|p| {
                (
                    p.question_id.as_str(),
                    p.category.as_str(),
                    p.turn,
                    p.text.as_str(),
                )
            })
            .collect();
        assert_eq!(
            got,
            [("1", "a", 0, "x"), ("1", "a", 1, "y"), ("3", "b", 0, "w")]
        );
        assert_eq!(parse_prompts(text, 0, false).unwrap().len(), 3);
        assert!(parse_prompts("{\"question_id\": 1}", 0, false).is_err());
        assert!(
            parse_prompts(
                r#"{"question_id": 1, "category": "a", "turns": []}"#,
                0,
                false
            )
            .is_err()
        );
    }

    fn record(
        method: &str,
        category: &str,
        tps: f64,
        drafted: &[u64],
        accepted: &[u64],
    ) -> RunRecord {
        // Chains: the tests at position p are the steps that accepted p − 1 and drafted p.
        let mut rejections = 0;
        let mut reached = drafted.first().copied().unwrap_or(0);
        for (&d, &a) in drafted.iter().zip(accepted) {
            rejections += reached.min(d) - a;
            reached = a;
        }
        RunRecord {
            target: "t".into(),
            method: method.into(),
            method_name: method.split(':').next().unwrap().into(),
            draft_model: None,
            question_id: "1".into(),
            category: category.into(),
            turn: 0,
            repeat: 0,
            prompt_tokens: 5,
            new_tokens: 10,
            stop_reason: StopReason::MaxNewTokens,
            // 10 tokens at `tps`, the 9 after the first step at twice that.
            wall_seconds: 10.0 / tps,
            prompt_seconds: 5.5 / tps,
            tokens_per_second: tps,
            decode_tokens_per_second: 2.0 * tps,
            decode_tokens: 9,
            draft_seconds: 0.0,
            target_seconds: 0.0,
            draft_forward_seconds: 0.0,
            step_seconds: 0.0,
            fixed_k: None,
            steps: 0,
            target_forwards: 10 - accepted.iter().sum::<u64>(),
            draft_forwards: 0,
            drafted: drafted.iter().sum(),
            accepted: accepted.iter().sum(),
            rejections,
            produced: 10,
            alpha: None,
            alpha_per_tested_draft: None,
            tau: None,
            drafter_estimates: BTreeMap::new(),
            drafted_by_position: drafted.to_vec(),
            accepted_by_position: accepted.to_vec(),
            rss_before_bytes: None,
            peak_rss_bytes: Some(1 << 20),
            peak_rss_scope: "generation",
            matches_plain: (method != "plain").then_some(category != "b"),
            plain_pass: (method == "plain").then_some(PlainPass::Before),
            core_round_trip_ns: [None, None],
            tokens: vec![],
        }
    }

    #[test]
    fn summaries_follow_the_spec_bench_definitions() {
        let runs = vec![
            record("plain", "a", 10.0, &[], &[]),
            record("plain", "a", 20.0, &[], &[]),
            record("plain", "b", 8.0, &[], &[]),
            record("pl", "a", 30.0, &[4, 2], &[3, 1]),
            record("pl", "a", 15.0, &[2], &[0]),
            record("pl", "b", 4.0, &[1], &[1]),
        ];
        let cats = vec!["a".to_owned(), "b".to_owned()];
        let s = summarize(&runs, &cats);
        let get = |m: &str, c: &str| s.iter().find(|x| x.method == m && x.category == c).unwrap();
        let a = get("pl", "a");
        assert!((a.tokens_per_second - 22.5).abs() < 1e-9);
        assert!((a.speedup.unwrap() - 22.5 / 15.0).abs() < 1e-9);
        // τ = 20 produced / (6 + 10) forwards; α = 4 / 8.
        assert!((a.tau.unwrap() - 20.0 / 16.0).abs() < 1e-9);
        assert!((a.alpha.unwrap() - 0.5).abs() < 1e-9);
        assert_eq!(a.acceptance_by_position, vec![3.0 / 6.0, 1.0 / 2.0]);
        assert_eq!(a.mismatches, 0);
        let b = get("pl", "b");
        assert!((b.speedup.unwrap() - 0.5).abs() < 1e-9);
        assert_eq!(b.mismatches, 1);
        let all = get("pl", "all");
        assert_eq!(all.runs, 3);
        assert!((all.speedup.unwrap() - (49.0 / 3.0) / (38.0 / 3.0)).abs() < 1e-9);
        assert_eq!(all.mismatches, 1);
        let plain = get("plain", "all");
        assert!((plain.speedup.unwrap() - 1.0).abs() < 1e-9);
        assert_eq!(plain.tau, Some(1.0));
        assert_eq!(plain.alpha, None);
    }

    #[test]
    fn round_trips_spread_over_every_measured_one() {
        let mut runs = vec![record("plain", "a", 10.0, &[], &[]); 3];
        assert_eq!(round_trip_spread(&runs), None);
        runs[0].core_round_trip_ns = [Some(400.0), Some(80.0)];
        runs[2].core_round_trip_ns = [None, Some(90.0)];
        assert_eq!(round_trip_spread(&runs), Some((80.0, 90.0, 400.0)));
    }

    #[test]
    fn the_round_trip_probe_measures_where_two_threads_can_run() {
        if std::thread::available_parallelism().map_or(1, |n| n.get()) < 2 {
            return;
        }
        // Other tests' threads may hold the cores for one probe: one in five must get through.
        let probes: Vec<Option<f64>> = (0..5).map(|_| core_round_trip_ns()).collect();
        assert!(
            probes.iter().flatten().any(|&ns| ns > 1.0 && ns < 1e6),
            "{probes:?}"
        );
    }

    #[test]
    fn plain_drift_sets_the_runs_after_the_methods_against_those_before() {
        let mut after = record("plain", "a", 12.0, &[], &[]);
        after.plain_pass = Some(PlainPass::After);
        let mut other_target = record("plain", "a", 50.0, &[], &[]);
        other_target.target = "u".into();
        let runs = vec![
            record("plain", "a", 10.0, &[], &[]),
            record("plain", "b", 20.0, &[], &[]),
            record("pl", "a", 30.0, &[4, 2], &[3, 1]),
            after,
            other_target,
        ];
        // Only target `t` was bracketed; its two runs before average 15 tok/s.
        assert_eq!(
            plain_drift(&runs),
            vec![PlainDrift {
                target: "t".into(),
                before: (15.0, 30.0),
                after: (12.0, 24.0),
            }]
        );
        // Both plain passes make the baseline: (10 + 20 + 12) / 3 tok/s.
        let s = summarize(&runs, &["a".to_owned(), "b".to_owned()]);
        let pl = s
            .iter()
            .find(|x| x.method == "pl" && x.category == "all")
            .unwrap();
        assert!((pl.speedup.unwrap() - 30.0 / 14.0).abs() < 1e-9);
        // `--plain-once` runs have nothing to set against each other.
        let once: Vec<RunRecord> = runs
            .into_iter()
            .filter(|r| r.plain_pass != Some(PlainPass::After))
            .collect();
        assert_eq!(plain_drift(&once), vec![]);
    }

    /// A draft-model run: `steps` steps of 0.3 s, `forwards` draft forwards taking `seconds` in
    /// all.
    fn draft_run(
        mut r: RunRecord,
        fixed_k: Option<usize>,
        steps: u64,
        forwards: u64,
        seconds: f64,
    ) -> RunRecord {
        r.fixed_k = fixed_k;
        r.steps = steps;
        r.step_seconds = 0.3 * steps as f64;
        r.draft_forwards = forwards;
        r.draft_forward_seconds = seconds;
        r
    }

    /// A plain run of `steps` decode steps taking `seconds` in all.
    fn plain_run(category: &str, tps: f64, steps: u64, seconds: f64) -> RunRecord {
        let mut r = record("plain", category, tps, &[], &[]);
        r.steps = steps;
        r.step_seconds = seconds;
        r
    }

    fn bound_runs() -> Vec<RunRecord> {
        vec![
            // Plain decode steps: (1 + 3 + 2) s over 30 steps, 0.2 s each (0.2 s in "a" too).
            plain_run("a", 10.0, 10, 1.0),
            plain_run("a", 20.0, 10, 3.0),
            plain_run("b", 8.0, 10, 2.0),
            // K = 2 over 4 steps: α = 4 / 8, 3 rejections, α tested = 4 / 7; 8 draft forwards
            // of 0.05 s: c = 0.05 / 0.2; verification 0.3 s: v = 1.5.
            draft_run(
                record("sampling:k=2", "a", 21.0, &[4, 4], &[3, 1]),
                Some(2),
                4,
                8,
                0.4,
            ),
            // auto: one step each of K 0, 1, 2 and 3 (6 drafted in 4 steps, K = 1.5); α = 3 / 6,
            // 3 rejections, α tested = 3 / 6; forwards of 0.1 s: c = 0.5.
            draft_run(
                record("sampling:k=auto", "a", 12.0, &[3, 2, 1], &[2, 1, 0]),
                None,
                4,
                6,
                0.6,
            ),
            // Not a draft-model method: no bound, even with forwards.
            draft_run(record("pl", "a", 30.0, &[4], &[2]), None, 4, 4, 0.4),
        ]
    }

    #[test]
    fn draft_model_methods_get_the_measured_bound() {
        let runs = bound_runs();
        let cats = vec!["a".to_owned(), "b".to_owned()];
        let s = summarize(&runs, &cats);
        let get = |m: &str, c: &str| s.iter().find(|x| x.method == m && x.category == c).unwrap();
        for c in ["a", "all"] {
            let x = get("sampling:k=2", c);
            let b = x.draft_bound.as_ref().unwrap();
            assert_eq!(b.k, 2.0);
            assert!((b.draft_forward_seconds - 0.05).abs() < 1e-12);
            assert!((b.plain_step_seconds - 0.2).abs() < 1e-12, "{c}");
            assert!((b.cost_ratio - 0.25).abs() < 1e-12);
            // E[τ] from α tested = 4/7, not from α = 1/2 (which gives 1.75).
            assert!((x.alpha.unwrap() - 0.5).abs() < 1e-12);
            assert!((b.alpha - 4.0 / 7.0).abs() < 1e-12);
            let tau = (1.0 - (4.0f64 / 7.0).powi(3)) / (3.0 / 7.0);
            assert!((b.expected_tau - tau).abs() < 1e-12);
            assert!((b.speedup_bound - tau / 1.5).abs() < 1e-12);
            // Achieved: 21 tok/s ÷ plain's mean 15 tok/s in "a" (all: 38/3) = 1.4 in "a".
            let achieved = x.speedup.unwrap();
            assert!((b.achieved_over_bound.unwrap() - achieved / (tau / 1.5)).abs() < 1e-12);
            // Decode pooled: every run makes 9 tokens after its first step in 4.5 ÷ tok/s
            // seconds; the plain runs at 10 and 20 tok/s ("a"), and 8 ("all").
            let plain_tps: &[f64] = if c == "a" {
                &[10.0, 20.0]
            } else {
                &[10.0, 20.0, 8.0]
            };
            let plain_pooled =
                9.0 * plain_tps.len() as f64 / plain_tps.iter().map(|t| 4.5 / t).sum::<f64>();
            let pooled = (9.0 / (4.5 / 21.0)) / plain_pooled;
            assert!(
                (b.pooled_decode_speedup.unwrap() - pooled).abs() < 1e-12,
                "{c}"
            );
            assert!((b.decode_over_bound.unwrap() - pooled / (tau / 1.5)).abs() < 1e-12);
            // Spec-Bench's mean of per-prompt speeds is another figure: 42 ÷ 30 in "a".
            assert!((x.decode_speedup.unwrap() - pooled).abs() > 0.1);
            // τ = 10 produced ÷ 6 target forwards.
            assert!((b.tau_over_expected - (10.0 / 6.0) / tau).abs() < 1e-12);
            assert!((b.verify_ratio - 1.5).abs() < 1e-12);
            assert!((b.bound_with_verify - tau / 2.0).abs() < 1e-12);
        }
        assert!((get("sampling:k=2", "a").speedup.unwrap() - 1.4).abs() < 1e-12);

        let b = get("sampling:k=auto", "a").draft_bound.clone().unwrap();
        assert_eq!(b.k, 1.5);
        assert!((b.cost_ratio - 0.5).abs() < 1e-12);
        // Each step's E[τ] at its own K, α tested 1/2: 1, 1.5, 1.75 and 1.875; not E[τ] at
        // K 1.5 (1.65), which no step could yield on average.
        let tau = (1.0 + 1.5 + 1.75 + 1.875) / 4.0;
        assert!((b.expected_tau - tau).abs() < 1e-12);
        assert!((b.speedup_bound - tau / (1.5 * 0.5 + 1.0)).abs() < 1e-12);

        assert!(get("pl", "a").draft_bound.is_none());
        assert!(get("plain", "all").draft_bound.is_none());
        // A draft-model method with nothing drafted has no α, so no bound.
        let mut idle = bound_runs();
        idle.retain(|r| r.method_name == "plain" || r.method == "sampling:k=2");
        idle[3].drafted = 0;
        idle[3].accepted = 0;
        idle[3].rejections = 0;
        assert!(summarize(&idle, &cats)[3].draft_bound.is_none());
    }

    #[test]
    fn the_details_table_shows_the_bound_for_draft_model_methods_only() {
        let mut runs = bound_runs();
        runs[3].drafter_estimates = [("cost_ratio", 0.5), ("hopeless", 0.0)].into();
        let categories = vec!["a".to_owned(), "b".to_owned()];
        let report = Report {
            schema_version: 2,
            started_unix: 0,
            started_utc: utc_stamp(0, false),
            total_seconds: 1.0,
            command: vec![],
            machine: Machine {
                cpu: "cpu".into(),
                kernels: "AVX2 + FMA".into(),
                cores: 2,
                memory_bytes: None,
                os: "os".into(),
                backend: "flex".into(),
                gpu: None,
            },
            span_tiles: vec![SpanTileRuns {
                rows_of_x: 5,
                tiles: [("8-lane".to_owned(), 3), ("two panels".to_owned(), 40)].into(),
            }],
            prompts_file: "p.jsonl".into(),
            prompts: vec![],
            temperature: 0.0,
            seed: 0,
            repeats: 1,
            greedy: true,
            memory_metric: "VmHWM",
            skipped_methods: vec![],
            models: vec![],
            summaries: summarize(&runs, &categories),
            mismatches: vec![],
            runs,
        };
        let md = render_markdown(&report, &categories);
        assert!(
            md.contains("tiles picked by timing (products run): 5 rows: 8-lane 3, two panels 40\n"),
            "{md}"
        );
        // The details row, then the bound table's row if the method has one.
        let rows = |method: &str, category: &str| -> Vec<String> {
            md.lines()
                .filter(|l| l.starts_with(&format!("| t | {method} | {category} |")))
                .map(str::to_owned)
                .collect()
        };
        // Details: speedup | τ | α | tok/s | decode speedup
        let k2 = rows("sampling:k=2", "a");
        // Decode speeds are twice the whole-generation ones here, so the ratios are equal.
        assert!(
            k2[0].contains("| 1.40× | 1.67 | 0.50 | 21.00 | 1.40× |"),
            "{}",
            k2[0]
        );
        // Bound: τ | α tested | K | c | E[τ] | τ ÷ E[τ] | bound | speedup ÷ bound | decode ÷
        // bound (pooled: 42 tok/s ÷ plain's 26.7, ÷ the bound) | v | with v
        assert!(
            k2[1].contains(
                "| 1.67 | 0.57 | 2.00 | 0.250 | 1.90 | 0.88 | 1.27× | 1.11 | 1.24 | 1.50 | 0.95× |"
            ),
            "{}",
            k2[1]
        );
        let auto = rows("sampling:k=auto", "a");
        assert!(
            auto[1].contains("| 0.50 | 1.50 | 0.500 | 1.53 | 0.93 | 0.88× | 0.91 | 1.03 |"),
            "{}",
            auto[1]
        );
        assert!(auto[1].ends_with("| 1.50 | 0.68× |"), "{}", auto[1]);
        let plain = rows("plain", "a");
        assert_eq!(plain.len(), 1);
        assert!(
            plain[0].contains("| 1.00× | 1.00 | – | 15.00 | 1.00× |"),
            "{}",
            plain[0]
        );
        let pl = rows("pl", "a");
        assert_eq!(pl.len(), 1);
        assert!(pl[0].contains("| 0.50 | 30.00 |"), "{}", pl[0]);
        assert!(md.contains("bound = E[τ] ÷ (K·c + 1)"));
        assert!(md.contains("## Draft-model methods against the bound"));
        let json = serde_json::to_value(&report).unwrap();
        let bound = &json["summaries"]
            .as_array()
            .unwrap()
            .iter()
            .find(|x| x["method"] == "sampling:k=2" && x["category"] == "a")
            .unwrap()["draft_bound"];
        assert_eq!(bound["k"], 2.0);
        assert!((bound["cost_ratio"].as_f64().unwrap() - 0.25).abs() < 1e-12);
        assert!(json["summaries"][0]["draft_bound"].is_null());
        assert_eq!(json["runs"][3]["fixed_k"], 2);
        assert!(json["runs"][0]["step_seconds"].is_number());
        assert_eq!(json["runs"][3]["drafter_estimates"]["cost_ratio"], 0.5);
        assert_eq!(json["runs"][3]["drafter_estimates"]["hopeless"], 0.0);
        assert!(json["runs"][0].get("drafter_estimates").is_none());
    }

    #[test]
    fn fixed_draft_lengths_come_from_the_method_spec() {
        let k = |spec: &str| fixed_draft_length(&BenchMethod::parse(spec).unwrap());
        assert_eq!(k("sampling:k=3"), Some(3));
        assert_eq!(k("sampling"), Some(spec_sampling::DEFAULT_K));
        assert_eq!(k("sampling:k=auto"), None);
        assert_eq!(k("sampling:k=8:threshold=0.5"), None);
        assert_eq!(k("prompt-lookup:k=5"), None);
    }

    #[test]
    fn draft_model_groups_take_fewer_prompts() {
        let a = args(&[]);
        let p = plan(&a).unwrap();
        assert_eq!(
            group_limits(&a, &p.groups[0].1),
            (DEFAULT_MAX_NEW_TOKENS, DEFAULT_PER_CATEGORY)
        );
        assert_eq!(
            group_limits(&a, &p.groups[1].1),
            (DEFAULT_MAX_NEW_TOKENS, DRAFT_GROUP_PER_CATEGORY)
        );
        let a = args(&["--max-new-tokens", "9", "--per-category", "3"]);
        let p = plan(&a).unwrap();
        assert_eq!(group_limits(&a, &p.groups[1].1), (9, 3));
    }

    #[test]
    fn prompt_selection_counts_questions_not_turns() {
        let text = r#"{"question_id": 1, "category": "a", "turns": ["x", "y"]}
{"question_id": 2, "category": "a", "turns": ["z"]}
{"question_id": 3, "category": "b", "turns": ["w"]}
"#;
        let prompts = parse_prompts(text, 0, true).unwrap();
        assert_eq!(select_prompts(&prompts, 1), [0, 1, 3]);
        assert_eq!(select_prompts(&prompts, 0), [0, 1, 2, 3]);
    }

    #[test]
    fn first_difference_counts_length_changes() {
        assert_eq!(first_difference(&[1, 2, 3], &[1, 2, 3]), None);
        assert_eq!(first_difference(&[1, 2, 3], &[1, 5, 3]), Some(1));
        assert_eq!(first_difference(&[1, 2, 3], &[1, 2]), Some(2));
        assert_eq!(first_difference(&[], &[7]), Some(0));
    }

    #[test]
    fn utc_stamps_are_civil_dates() {
        assert_eq!(utc_stamp(0, false), "1970-01-01T00:00:00Z");
        assert_eq!(utc_stamp(951_782_400, false), "2000-02-29T00:00:00Z");
        assert_eq!(utc_stamp(1_795_385_403, true), "20261122-221003");
    }

    #[test]
    fn proc_status_fields_are_read() {
        if cfg!(target_os = "linux") {
            let rss = read_status_kib("VmRSS:").unwrap();
            assert!(rss > 0);
            let hwm = read_status_kib("VmHWM:").unwrap();
            assert!(hwm >= rss);
        }
    }
}
