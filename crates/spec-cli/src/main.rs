//! `spec`: generate text from a model with plain decoding or a speculative method (`--method`).
//!
//! ```text
//! spec generate --model smollm2-135m --prompt "Write a haiku" --chat --max-new-tokens 64
//! spec bench --quick          # every method vs plain decoding, per prompt category
//! ```

mod bench;
#[cfg(feature = "flex")]
mod bench_forward;
mod device;
mod methods;
mod plots;

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use burn::tensor::backend::Backend;
use clap::{Parser, Subcommand, ValueEnum};
use serde::Serialize;
use spec_core::sampling::SamplingConfig;
use spec_engine::{Drafter, NoDraft, generate_speculative};
use spec_runtime::model::WeightFormat;
use spec_runtime::{GenerateOptions, GenerationStats, load_model_with};
use spec_tokenizer::{Message, TextTokenizer};

use device::DeviceLimits;
#[cfg(feature = "cuda")]
use device::check_cuda;
#[cfg(feature = "wgpu")]
use device::check_wgpu;

#[derive(Parser)]
#[command(name = "spec", about = "Speculative decoding on burn", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Generate a continuation of a prompt, streaming it to stdout.
    Generate(GenerateArgs),
    /// Benchmark methods against plain decoding per prompt category (`cargo xtask bench`).
    Bench(bench::BenchArgs),
    /// Time one forward pass over 1..64 new tokens and plain decoding against the memory
    /// bandwidth bound, per weight format (`cargo xtask bench-forward`; flex only).
    #[cfg(feature = "flex")]
    BenchForward(bench_forward::BenchForwardArgs),
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum BackendName {
    Flex,
    Wgpu,
    Cuda,
}

#[derive(clap::Args)]
struct GenerateArgs {
    /// A GGUF file, a Hugging Face directory, or a reference model name (smollm2-135m,
    /// qwen2.5-coder-0.5b, qwen2.5-coder-1.5b).
    #[arg(long)]
    model: String,
    /// The prompt text.
    #[arg(long, conflicts_with = "prompt_file")]
    prompt: Option<String>,
    /// Read the prompt from this file.
    #[arg(long)]
    prompt_file: Option<PathBuf>,
    /// Wrap the prompt in the model's chat template as one user turn.
    #[arg(long)]
    chat: bool,
    #[arg(long, default_value_t = 128)]
    max_new_tokens: usize,
    /// 0 means greedy.
    #[arg(long, default_value_t = 0.0)]
    temperature: f64,
    #[arg(long)]
    top_k: Option<usize>,
    #[arg(long)]
    top_p: Option<f64>,
    #[arg(long)]
    min_p: Option<f64>,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    #[arg(long, value_enum, default_value = "flex")]
    backend: BackendName,
    /// Print one JSON object instead of streaming text.
    #[arg(long)]
    json: bool,
    /// Decoding method: plain (no drafts), or a speculative method.
    #[arg(long, default_value = "plain")]
    method: String,
    /// The draft model of `--method sampling` (path or reference name).
    #[arg(long)]
    draft_model: Option<String>,
    /// How the target's projections are kept: f32 (the checkpoint's weights exactly), q4 (a
    /// 4-bit checkpoint's blocks kept exactly in 0.75 bytes a weight, any other matrix as
    /// q8_0), bf16 or q8_0 (rounded once at load: a faster model that differs from the
    /// checkpoint; every method then follows that model), or q8_0-a8 / q4-a8 (those weights
    /// multiplied by activations rounded to int8, as llama.cpp does: other models again;
    /// q4-a8 keeps a GGUF's Q4_K and Q6_K matrices as their superblocks).
    #[arg(long, default_value = "f32")]
    weights: WeightFormat,
    /// How the draft model's projections are kept for its decode steps: f32, q4, bf16, q8_0,
    /// q8_0-a8, q4-a8 or q4-a8-lossy (q4-a8 with every matrix that is not 4-bit rounded to 4
    /// bits; default q8_0-a8). Only the draft is rounded; the output still follows the target
    /// alone.
    #[arg(long)]
    draft_weights: Option<WeightFormat>,
    /// Draft length: a number, or `auto` where the method supports it.
    #[arg(long)]
    k: Option<String>,
    /// `--method sampling`: after the first draft of a step, stop drafting once the draft
    /// model's top probability falls below this (in (0, 1)); `--k` is then the longest chain
    /// (default 8).
    #[arg(long)]
    draft_threshold: Option<f64>,
    /// Longest n-gram prompt lookup matches.
    #[arg(long)]
    ngram_max: Option<usize>,
    /// Shortest n-gram prompt lookup matches.
    #[arg(long)]
    ngram_min: Option<usize>,
    /// The bigram model file of `--method bigram`.
    #[arg(long)]
    bigram: Option<PathBuf>,
}

impl GenerateArgs {
    fn method_spec(&self) -> methods::MethodSpec {
        methods::MethodSpec {
            method: self.method.clone(),
            k: self.k.clone(),
            draft_threshold: self.draft_threshold,
            draft_model: self.draft_model.clone(),
            draft_weights: self.draft_weights,
            ngram_max: self.ngram_max,
            ngram_min: self.ngram_min,
            bigram: self.bigram.clone(),
            history: None,
        }
    }
}

/// The drafting policy `--method` names (each method crate adds its arm here). `spec bench`
/// builds its methods here too; an unknown name must fail with "unknown method ...".
fn make_drafter<B: Backend>(
    args: &methods::MethodSpec,
    _target: &spec_runtime::LoadedModel<B>,
    _tokenizer: &TextTokenizer,
    _device: &B::Device,
    drafts: &mut DraftModels<B>,
) -> Result<Box<dyn Drafter<B>>> {
    if args.draft_threshold.is_some() && args.method != "sampling" {
        bail!(
            "--draft-threshold is a draft length policy of --method sampling, not of `{}`",
            args.method
        );
    }
    match args.method.as_str() {
        "plain" => Ok(Box::new(NoDraft)),
        "prompt-lookup" => {
            // The adaptive length is the default: it measured 1.63× vs 1.56× for K 3 on the
            // context-reuse prompts and the same on open ones (docs/benchmarks.md).
            let adaptive = adaptive_length(args);
            let k = if adaptive {
                spec_ngram::DEFAULT_LOOKUP_K_MAX
            } else {
                fixed_k(args, spec_ngram::DEFAULT_LOOKUP_K)?
            };
            Ok(Box::new(spec_ngram::PromptLookup::new(
                spec_ngram::PromptLookupConfig {
                    k,
                    ngram_max: args.ngram_max.unwrap_or(spec_ngram::DEFAULT_NGRAM_MAX),
                    ngram_min: args.ngram_min.unwrap_or(spec_ngram::DEFAULT_NGRAM_MIN),
                    adaptive,
                    history_tokens: args.history.unwrap_or(0),
                },
            )?))
        }
        "bigram" => {
            let Some(file) = &args.bigram else {
                bail!(
                    "--method bigram needs --bigram FILE (make one with `cargo xtask train-bigram`)"
                );
            };
            let model = spec_ngram::BigramModel::load(file)?;
            let config = if adaptive_length(args) {
                spec_ngram::BigramConfig::adaptive()
            } else {
                spec_ngram::BigramConfig::fixed(fixed_k(args, spec_ngram::DEFAULT_BIGRAM_K)?)
            };
            let vocab = _target.config.vocab_size;
            Ok(Box::new(spec_ngram::BigramDrafter::new(
                model, vocab, config, _device,
            )?))
        }
        "sampling" => sampling_drafter(args, _target, _tokenizer, _device, drafts),
        other => bail!("unknown method `{other}` (known: plain)"),
    }
}

/// A loaded draft model and its tokenizer.
type LoadedDraft<B> = (spec_runtime::Transformer<B>, TextTokenizer);

/// Draft models loaded so far, by path and weight format: methods that share a draft model (a
/// bench sweeping K) share its weights, since cloning a loaded model only counts references.
struct DraftModels<B: Backend> {
    loaded: std::collections::HashMap<(PathBuf, WeightFormat), LoadedDraft<B>>,
    /// The device the draft models are loaded onto, as far as loading them cares.
    limits: DeviceLimits,
    /// The target's checkpoint and format: a draft of both is the target's own weights, so
    /// that a self-draft streams one copy of them rather than two taking turns.
    target: (PathBuf, WeightFormat),
}

impl<B: Backend> DraftModels<B> {
    /// Draft models for a target loaded from `path` with its projections in `format`.
    fn new(limits: DeviceLimits, (path, format): (&Path, WeightFormat)) -> Self {
        Self {
            loaded: std::collections::HashMap::new(),
            limits,
            target: (path.to_path_buf(), format),
        }
    }
}

/// How a draft model's projections are packed unless `--draft-weights` says otherwise. Q8_0
/// rounds only the draft, which changes how often its tokens are accepted, never what is
/// generated; it cut the 0.5B draft's step to 0.43-0.44 of f32's. With activations rounded to
/// int8 too (q8_0-a8), the 0.5B's prompt and steps cost less again (c 0.109-0.127 against
/// 0.131-0.156 for q8_0, the same tokens accepted; docs/benchmarks.md, twentieth session).
const DEFAULT_DRAFT_WEIGHTS: WeightFormat = WeightFormat::Q8_0A8;

/// `--method sampling --draft-model D [--k N | --k auto]`: speculative sampling with a draft model
/// (default K 4), its vocabulary checked against the target's through both tokenizers.
fn sampling_drafter<B: Backend>(
    args: &methods::MethodSpec,
    target: &spec_runtime::LoadedModel<B>,
    tokenizer: &TextTokenizer,
    device: &B::Device,
    drafts: &mut DraftModels<B>,
) -> Result<Box<dyn Drafter<B>>> {
    let Some(name) = &args.draft_model else {
        bail!(
            "--method sampling needs --draft-model (a path or reference name, e.g. qwen2.5-coder-0.5b)"
        );
    };
    let length =
        spec_sampling::DraftLength::parse_with_threshold(args.k.as_deref(), args.draft_threshold)?;
    let path = spec_models::resolve(name)?;
    let format = args.draft_weights.unwrap_or(DEFAULT_DRAFT_WEIGHTS);
    let key = (path.clone(), format);
    let (draft, draft_tokenizer) = if key == drafts.target {
        (&target.model, tokenizer)
    } else {
        if !drafts.loaded.contains_key(&key) {
            // Another format of a checkpoint already loaded is a repack of the same weights when
            // that copy holds them exactly (f32); otherwise the checkpoint is read again.
            let repacked = drafts
                .loaded
                .iter()
                .find(|((p, _), _)| *p == path)
                .and_then(|(_, (model, draft_tokenizer))| {
                    let mut model = model.clone();
                    model
                        .pack(format)
                        .ok()
                        .map(|()| (model, draft_tokenizer.clone()))
                });
            let entry = match repacked {
                Some(entry) => entry,
                None => {
                    let draft_tokenizer = load_tokenizer(&path)?;
                    let options = drafts.limits.load_options(format);
                    let draft = load_model_with::<B>(&path, device, options)
                        .with_context(|| format!("loading the draft model {}", path.display()))?;
                    (draft.model, draft_tokenizer)
                }
            };
            drafts.loaded.insert(key.clone(), entry);
        }
        let Some((draft, draft_tokenizer)) = drafts.loaded.get(&key) else {
            bail!("draft model {} vanished from the cache", path.display());
        };
        (draft, draft_tokenizer)
    };
    let drafter = spec_sampling::DraftModelDrafter::with_tokenizers(
        draft.clone(),
        draft_tokenizer,
        target.config.vocab_size,
        tokenizer,
        length,
    )?;
    Ok(Box::new(
        match spec_sampling::weight_cost_prior(draft, &target.model) {
            Some(c) => drafter.with_cost_prior(c),
            None => drafter,
        },
    ))
}

/// Whether an n-gram method runs its adaptive length: `--k auto` or no `--k`.
fn adaptive_length(args: &methods::MethodSpec) -> bool {
    matches!(args.k.as_deref(), None | Some("auto"))
}

/// `--k` as a number (for methods without `auto`).
fn fixed_k(args: &methods::MethodSpec, default: usize) -> Result<usize> {
    match args.k.as_deref() {
        None => Ok(default),
        Some(k) => k.parse().map_err(|_| {
            anyhow::anyhow!(
                "--method {}: --k must be a whole number, got `{k}`",
                args.method
            )
        }),
    }
}

#[derive(Serialize)]
struct JsonOutput {
    model: String,
    method: String,
    prompt_tokens: Vec<u32>,
    tokens: Vec<u32>,
    text: String,
    stats: JsonStats,
}

#[derive(Serialize)]
struct JsonStats {
    #[serde(flatten)]
    generation: GenerationStats,
    draft_forwards: u64,
    drafted: u64,
    accepted: u64,
    alpha: Option<f64>,
    /// accepted ÷ (accepted + rejections): see `spec_core::metrics`.
    alpha_per_tested_draft: Option<f64>,
    tau: Option<f64>,
    acceptance_by_position: Vec<f64>,
    draft_seconds: f64,
    target_seconds: f64,
    /// The drafter's running estimates at the end (`Drafter::report_estimates`), if any.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    drafter_estimates: BTreeMap<&'static str, f64>,
}

fn main() -> Result<()> {
    match Cli::parse().command {
        #[cfg(feature = "flex")]
        Command::BenchForward(args) => bench_forward::run(&args),
        Command::Bench(args) => match args.backend {
            #[cfg(feature = "flex")]
            BackendName::Flex => {
                bench::run::<burn::backend::Flex>(&args, &Default::default(), DeviceLimits::NONE)
            }
            #[cfg(feature = "wgpu")]
            BackendName::Wgpu => {
                let limits = check_wgpu()?;
                bench::run::<burn::backend::Wgpu>(&args, &Default::default(), limits)
            }
            #[cfg(feature = "cuda")]
            BackendName::Cuda => {
                check_cuda()?;
                bench::run::<burn::backend::Cuda>(&args, &Default::default(), DeviceLimits::NONE)
            }
            #[allow(unreachable_patterns)]
            other => bail!(
                "this `spec` was built without the {other:?} backend; rebuild with `--features {}`",
                format!("{other:?}").to_lowercase()
            ),
        },
        Command::Generate(args) => match args.backend {
            #[cfg(feature = "flex")]
            BackendName::Flex => {
                generate::<burn::backend::Flex>(&args, &Default::default(), DeviceLimits::NONE)
            }
            #[cfg(feature = "wgpu")]
            BackendName::Wgpu => {
                let limits = check_wgpu()?;
                generate::<burn::backend::Wgpu>(&args, &Default::default(), limits)
            }
            #[cfg(feature = "cuda")]
            BackendName::Cuda => {
                check_cuda()?;
                generate::<burn::backend::Cuda>(&args, &Default::default(), DeviceLimits::NONE)
            }
            #[allow(unreachable_patterns)]
            other => bail!(
                "this `spec` was built without the {other:?} backend; rebuild with `--features {}`",
                format!("{other:?}").to_lowercase()
            ),
        },
    }
}

fn generate<B: Backend>(
    args: &GenerateArgs,
    device: &B::Device,
    limits: DeviceLimits,
) -> Result<()> {
    let sampling = SamplingConfig {
        temperature: args.temperature,
        top_k: args.top_k,
        top_p: args.top_p,
        min_p: args.min_p,
        seed: args.seed,
    };
    sampling.validate().context("invalid sampling settings")?;
    let prompt_text = match (&args.prompt, &args.prompt_file) {
        (Some(p), None) => p.clone(),
        (None, Some(f)) => std::fs::read_to_string(f)
            .with_context(|| format!("reading the prompt file {}", f.display()))?,
        _ => bail!("give the prompt with --prompt TEXT or --prompt-file FILE"),
    };
    let path = spec_models::resolve(&args.model)?;
    let tokenizer = load_tokenizer(&path)?;
    let text = if args.chat {
        tokenizer.apply_chat_template(&[Message::user(prompt_text)], true)?
    } else {
        prompt_text
    };
    let prompt = tokenizer.encode(&text, true)?;
    let loaded = load_model_with::<B>(&path, device, limits.load_options(args.weights))
        .with_context(|| format!("loading {}", path.display()))?;
    if loaded.config.vocab_size < tokenizer.vocab_size() {
        bail!(
            "the tokenizer has {} tokens but the model only {}",
            tokenizer.vocab_size(),
            loaded.config.vocab_size
        );
    }

    let mut options = GenerateOptions::new(args.max_new_tokens, sampling);
    options.stop_tokens = tokenizer.eos_ids().to_vec();
    let mut drafter = make_drafter(
        &args.method_spec(),
        &loaded,
        &tokenizer,
        device,
        &mut DraftModels::new(limits, (&path, args.weights)),
    )?;
    let mut stream = tokenizer.stream_skip_special();
    let mut stdout = std::io::stdout().lock();
    let mut write_error = None;
    let mut on_tokens = |tokens: &[u32]| {
        if args.json || write_error.is_some() {
            return;
        }
        let piece = match stream.push_all(tokens) {
            Ok(p) => p,
            Err(e) => {
                write_error = Some(anyhow::Error::from(e));
                return;
            }
        };
        if let Err(e) = stdout
            .write_all(piece.as_bytes())
            .and_then(|()| stdout.flush())
        {
            write_error = Some(e.into());
        }
    };
    let generation = generate_speculative(
        &loaded.model,
        drafter.as_mut(),
        &prompt,
        &options,
        &mut on_tokens,
    )?;
    if let Some(e) = write_error {
        return Err(e);
    }
    if args.json {
        let output = JsonOutput {
            model: path.display().to_string(),
            method: drafter.name().to_owned(),
            text: tokenizer.decode_skip_special(&generation.tokens)?,
            prompt_tokens: prompt,
            stats: JsonStats {
                generation: generation.stats,
                draft_forwards: generation.metrics.draft_forwards,
                drafted: generation.metrics.drafted,
                accepted: generation.metrics.accepted,
                alpha: generation.metrics.alpha(),
                alpha_per_tested_draft: generation.metrics.alpha_per_tested_draft(),
                tau: generation.metrics.tau(),
                acceptance_by_position: generation.metrics.acceptance_by_position(),
                draft_seconds: generation.draft_seconds,
                target_seconds: generation.target_seconds,
                drafter_estimates: drafter.report_estimates().into_iter().collect(),
            },
            tokens: generation.tokens,
        };
        println!("{}", serde_json::to_string(&output)?);
    } else {
        let rest = stream.finish();
        writeln!(stdout, "{rest}")?;
    }
    Ok(())
}

/// The tokenizer stored with a checkpoint: in the GGUF file, or `tokenizer.json` beside a
/// Hugging Face checkpoint.
fn load_tokenizer(path: &Path) -> Result<TextTokenizer> {
    if path.is_dir() {
        let json = path.join("tokenizer.json");
        Ok(TextTokenizer::from_tokenizer_json(&json)
            .with_context(|| format!("loading {}", json.display()))?)
    } else {
        // Opened here first so that a damaged file (a truncated download) is reported as the
        // file's fault, not the tokenizer's.
        let file = spec_gguf::GgufFile::open(path)
            .with_context(|| format!("reading {}", path.display()))?;
        Ok(TextTokenizer::from_gguf(&file)
            .with_context(|| format!("loading the tokenizer of {}", path.display()))?)
    }
}
