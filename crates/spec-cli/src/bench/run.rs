//! The run: load every target and build every method, warm up, then time each method on each
//! prompt between two runs of plain decoding, and write the report.

use std::collections::{BTreeMap, BTreeSet};
use std::io::IsTerminal;
use std::path::PathBuf;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, bail};
use burn::tensor::backend::Backend;
use indicatif::{ProgressBar, ProgressStyle};
use spec_core::sampling::SamplingConfig;
use spec_engine::method::BuildContext;
use spec_engine::{Drafter, generate_speculative};
use spec_runtime::{GenerateOptions, load::load_model_with};
use spec_tokenizer::{Message, TextTokenizer};

use super::args::BenchArgs;
use super::machine::{
    core_round_trip_ns, machine_info, read_status_kib, reset_peak_rss, span_tile_runs,
};
use super::markdown::{render_markdown, report_acceptance, report_bars, report_tau_by_size};
use super::plan::{PlannedMethod, group_limits, plan};
use super::prompts::{categories_in_order, load_prompts, select_prompts};
use super::records::{Mismatch, PlainPass, RunRecord, around, check_lossless, first_difference};
use super::report::{ModelInfo, Report, utc_stamp};
use super::summary::summarize;
use crate::BackendName;
use crate::checkpoint::load_tokenizer;
use crate::device::DeviceLimits;
use crate::drafts::DraftModels;

/// New tokens of each method's warm-up generation on flex.
pub(super) const WARMUP_TOKENS: usize = 4;

/// How `spec bench` warms up before timing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum WarmUp {
    /// One generation of [`WARMUP_TOKENS`] per method on the first prompt: flex runs fixed
    /// kernels, so this only loads the weights into the caches and sizes the allocations.
    Short,
    /// Every method on every prompt with the run's token count, untimed. wgpu and cuda compile
    /// (and autotune) kernels for each new shape: a prompt's length, a key count's class, a
    /// catch-up's width. In a timed run the first method to meet a shape pays for it, and plain
    /// decoding runs first on every prompt: on an H200 its prefill of the second code prompt
    /// took 9.1 s where the methods after the first draft-model one took 0.2-0.4 s, which made
    /// their end-to-end speedups 1.7-1.8x where their decode speedups were 0.90-1.05x
    /// (docs/benchmarks.md at 9910478, "On a lent H200"; docs/notes/cuda-host-dispatch.md, "What
    /// `spec bench` does about it").
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

/// A target with its tokenizer, encoded prompts and drafters, ready to run.
pub(super) struct Group<B: Backend> {
    pub(super) target: String,
    pub(super) model: spec_runtime::LoadedModel<B>,
    pub(super) tokenizer: TextTokenizer,
    /// (index into the run's prompts, tokens).
    pub(super) prompts: Vec<(usize, Vec<u32>)>,
    pub(super) max_new_tokens: usize,
    pub(super) methods: Vec<(PlannedMethod, Box<dyn Drafter<B>>)>,
    pub(super) info: ModelInfo,
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
            if ids.len().saturating_add(max_new_tokens) >= model.model.max_positions() {
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
        let mut drafts = DraftModels::new(device, limits, (&path, args.weights));
        for planned in methods {
            let t = Instant::now();
            let drafter = planned
                .method
                .build(&mut BuildContext {
                    target: &model.model,
                    target_path: &model.path,
                    tokenizer: &tokenizer,
                    device,
                    drafts: &mut drafts,
                })
                .with_context(|| format!("setting up method `{}` on {target}", planned.label))?;
            setup_seconds.insert(planned.label.clone(), t.elapsed().as_secs_f64());
            built.push((planned, drafter));
        }
        let info = ModelInfo {
            target: target.clone(),
            path: path.display().to_string(),
            weights: args.weights.name().to_owned(),
            load_seconds,
            max_new_tokens,
            prompts: encoded.iter().map(|(i, _)| *i).collect(),
            methods: built.iter().map(|(m, _)| m.label.clone()).collect(),
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
                planned.label,
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
                .with_context(|| format!("warming up {}", planned.label))?;
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
                    let label = &planned.label;
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
                        method_name: planned.method.name().to_owned(),
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
                        fixed_k: planned.method.fixed_length(),
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
                        steps_by_width: generation.steps_by_width.clone(),
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
    crate::plots::tau_by_size_svg(&out.join("tau-by-size.svg"), &report_tau_by_size(&report))?;
    eprintln!(
        "spec bench: wrote {}/{{report.md, report.json, speedup.svg, acceptance.svg}} in {:.0} s",
        out.display(),
        report.total_seconds
    );
    check_lossless(&report.mismatches)
}

/// The target's cache only needs the longest prompt plus the new tokens (and a tree's worth of
/// drafts); the model's full context would cost gigabytes for Qwen's 32k positions.
pub(super) fn cache_capacity<B: Backend>(group: &Group<B>) -> usize {
    let longest = group
        .prompts
        .iter()
        .map(|(_, p)| p.len())
        .max()
        .unwrap_or(0);
    longest
        .saturating_add(group.max_new_tokens)
        .saturating_add(256)
        .min(group.model.model.max_positions())
}

pub(super) fn progress_bar(total: u64) -> ProgressBar {
    let bar = ProgressBar::new(total);
    if let Ok(style) =
        ProgressStyle::with_template("{elapsed_precise} [{bar:30}] {pos}/{len} eta {eta} {msg}")
    {
        bar.set_style(style.progress_chars("=> "));
    }
    bar
}
