//! `spec generate`: one prompt's continuation, streamed to stdout or printed as JSON.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use burn::tensor::backend::Backend;
use serde::Serialize;
use spec_core::sampling::SamplingConfig;
use spec_engine::generate_speculative;
use spec_engine::method::{BuildContext, MethodText};
use spec_runtime::model::WeightFormat;
use spec_runtime::{GenerateOptions, GenerationStats, load_model_with};
use spec_tokenizer::Message;

use crate::BackendName;
use crate::checkpoint::{CheckpointHeader, read_header};
use crate::device::DeviceLimits;
use crate::drafts::DraftModels;
use crate::registry::{self, Method};

#[derive(clap::Args)]
pub(crate) struct GenerateArgs {
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
    /// New tokens at most; the prompt and these must fit the model's context.
    #[arg(long, default_value_t = 128)]
    max_new_tokens: usize,
    /// 0 means greedy.
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    temperature: f64,
    #[arg(long)]
    top_k: Option<usize>,
    #[arg(long, allow_negative_numbers = true)]
    top_p: Option<f64>,
    #[arg(long, allow_negative_numbers = true)]
    min_p: Option<f64>,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    #[arg(long, value_enum, default_value = "flex")]
    pub(crate) backend: BackendName,
    /// Print one JSON object instead of streaming text.
    #[arg(long)]
    json: bool,
    #[arg(long, default_value = "plain", value_name = "NAME[:KEY=VALUE]...", help = method_help())]
    method: String,
    /// How the target's projections are kept: f32 (the checkpoint's weights exactly), q4 (a
    /// 4-bit checkpoint's blocks kept exactly in 0.75 bytes a weight, any other matrix as
    /// q8_0), bf16 or q8_0 (rounded once at load: a faster model that differs from the
    /// checkpoint; every method then follows that model), or q8_0-a8 / q4-a8 (those weights
    /// multiplied by activations rounded to int8, as llama.cpp does: other models again;
    /// q4-a8 keeps a GGUF's Q4_K and Q6_K matrices as their superblocks).
    #[arg(long, default_value = "f32")]
    weights: WeightFormat,
    /// The method's key `k`: the draft length, a number or `auto` where the method supports it.
    #[arg(long)]
    k: Option<String>,
    /// The method's key `draft`: the draft model of `sampling` (path or reference name).
    #[arg(long)]
    draft_model: Option<String>,
    /// The method's key `draft-weights`: how the draft model's projections are kept for its
    /// decode steps: f32, q4, bf16, q8_0, q8_0-a8, q4-a8 or q4-a8-lossy (q4-a8 with every
    /// matrix that is not 4-bit rounded to 4 bits; default q8_0-a8). Only the draft is rounded;
    /// the output still follows the target alone.
    #[arg(long)]
    draft_weights: Option<String>,
    /// The method's key `threshold` (`sampling`): after the first draft of a step, stop
    /// drafting once the draft model's top probability falls below this (in (0, 1)); `--k` is
    /// then the longest chain (default 8).
    #[arg(long, allow_negative_numbers = true)]
    draft_threshold: Option<String>,
    /// The method's key `ngram-max`: longest n-gram prompt lookup matches.
    #[arg(long)]
    ngram_max: Option<String>,
    /// The method's key `ngram-min`: shortest n-gram prompt lookup matches.
    #[arg(long)]
    ngram_min: Option<String>,
    /// The method's key `bigram`: the bigram model file.
    #[arg(long)]
    bigram: Option<String>,
}

/// `--method`'s help: the syntax and every method with its keys, from the registry.
fn method_help() -> String {
    format!(
        "Decoding method, `NAME[:KEY=VALUE]...`: {}. E.g. \
         `sampling:k=auto:draft=qwen2.5-coder-0.5b`. The flags --k, --draft-model, \
         --draft-weights, --draft-threshold, --ngram-max, --ngram-min and --bigram give the \
         method's keys of those names; a flag the method does not take is an error",
        registry::methods_help()
    )
}

impl GenerateArgs {
    /// `--method` with the flags that stand for its keys.
    fn method(&self) -> Result<Method> {
        let mut text: MethodText = self.method.parse()?;
        let flags = [
            ("--k", &self.k),
            ("--draft-model", &self.draft_model),
            ("--draft-weights", &self.draft_weights),
            ("--draft-threshold", &self.draft_threshold),
            ("--ngram-max", &self.ngram_max),
            ("--ngram-min", &self.ngram_min),
            ("--bigram", &self.bigram),
        ];
        for (flag, value) in flags {
            if let Some(value) = value {
                registry::add_flag(&mut text, flag, value)?;
            }
        }
        Ok(Method::from_text(text)?)
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

pub(crate) fn generate<B: Backend>(
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
    // The method is read before anything loads, so that a bad one fails at once.
    let method = args.method()?;
    let prompt_text = match (&args.prompt, &args.prompt_file) {
        (Some(p), None) => p.clone(),
        (None, Some(f)) => std::fs::read_to_string(f)
            .with_context(|| format!("reading the prompt file {}", f.display()))?,
        _ => bail!("give the prompt with --prompt TEXT or --prompt-file FILE"),
    };
    if prompt_text.is_empty() {
        bail!("the prompt is empty: give some text with --prompt or --prompt-file");
    }
    let path = spec_models::resolve(&args.model)?;
    let CheckpointHeader { tokenizer, config } = read_header(&path)?;
    let text = if args.chat {
        tokenizer.apply_chat_template(&[Message::user(prompt_text)], true)?
    } else {
        prompt_text
    };
    let prompt = tokenizer.encode(&text, true)?;
    if prompt.is_empty() {
        bail!("the prompt is empty once tokenized");
    }
    let context = config.max_position_embeddings;
    if prompt.len().saturating_add(args.max_new_tokens) > context {
        bail!(
            "the request exceeds the model's context: {} prompt tokens + {} new tokens > {} \
             positions",
            prompt.len(),
            args.max_new_tokens,
            context
        );
    }
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
    let mut drafts = DraftModels::new(device, limits, (&path, args.weights));
    let mut drafter = method
        .build(&mut BuildContext {
            target: &loaded.model,
            target_path: &loaded.path,
            tokenizer: &tokenizer,
            device,
            drafts: &mut drafts,
        })
        .with_context(|| format!("setting up {method}"))?;
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
