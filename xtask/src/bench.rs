//! `cargo xtask bench [OPTIONS]`: build `spec` (release), fetch the reference models the run
//! needs, then run `spec bench OPTIONS` from the workspace root. Every option is `spec bench`'s
//! (`cargo xtask bench --help` prints them); see `docs/benchmarks.md`, "`cargo xtask bench`: the
//! main job".

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context, Result, bail};

use crate::run;

/// Arguments of `cargo xtask bench`: passed through to `spec bench` unchanged.
#[derive(clap::Args)]
#[command(disable_help_flag = true)]
pub(crate) struct BenchArgs {
    /// Options of `spec bench` (`--quick`, `--methods`, `--models`, …; `--help` lists them).
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    args: Vec<String>,
}

pub(crate) fn run_bench(args: BenchArgs) -> Result<()> {
    let root = workspace_root();
    let features = backend_feature(&args.args)?;
    let spec = |extra: &[&str]| {
        let mut c = spec_command(&root, features, "bench", &args.args);
        c.args(extra);
        c
    };
    if args.args.iter().any(|a| a == "--help" || a == "-h") {
        return run(&mut spec(&[]));
    }

    build_spec(features)?;

    // `spec bench` decides which models a run needs; ask it rather than repeat its rules here.
    let mut list = spec(&["--list-models"]);
    eprintln!("xtask: running {list:?}");
    let output = list
        .stderr(Stdio::inherit())
        .output()
        .with_context(|| format!("could not start {list:?}"))?;
    if !output.status.success() {
        bail!("{list:?} failed with {}", output.status);
    }
    let names: Vec<String> = String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(str::to_owned)
        .collect();
    if !names.is_empty() {
        let xtask = std::env::current_exe().context("locating the xtask binary")?;
        run(Command::new(xtask).arg("fetch-models").args(&names))?;
    }
    let mut extra = Vec::new();
    if let Some(path) = default_bigram(&args.args)? {
        extra.extend(["--bigram".to_owned(), path.to_string_lossy().into_owned()]);
    }
    if let Some(path) = crate::train_medusa::default_heads(&args.args)? {
        extra.extend([
            "--medusa-heads".to_owned(),
            path.to_string_lossy().into_owned(),
        ]);
    }
    let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
    run(&mut spec(&extra))
}

/// The reference model a default run's bigram drafter serves.
const BIGRAM_TARGET: &str = "smollm2-135m";

/// When the run includes the bigram method on the default target without naming a model file
/// (the default run and `--quick` do): the cached bigram model of [`BIGRAM_TARGET`], counted
/// over the project's corpora first if it is not there yet (fetching them; about two minutes).
fn default_bigram(args: &[String]) -> Result<Option<PathBuf>> {
    if !wants_default_bigram(args) {
        return Ok(None);
    }
    let path = crate::corpora::default_dir()?
        .with_file_name("bigram")
        .join(format!("{BIGRAM_TARGET}.safetensors"));
    if !path.is_file() {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        }
        eprintln!(
            "xtask: counting the bigram draft model for {BIGRAM_TARGET} into {}",
            path.display()
        );
        let trained = crate::train_bigram::run(crate::train_bigram::TrainBigramArgs {
            model: BIGRAM_TARGET.to_owned(),
            corpus: Vec::new(),
            tagged_corpus: Vec::new(),
            out: path.clone(),
        });
        // The corpora come through apt, pip and npm; without one of them the rest of the run
        // still stands, and `spec bench` reports the bigram method as skipped.
        if let Err(e) = trained {
            eprintln!("xtask: no bigram model, so the bench skips that method: {e:#}");
            return Ok(None);
        }
    }
    Ok(Some(path))
}

/// Whether the run has a bigram method that names no model file, on the default target.
fn wants_default_bigram(args: &[String]) -> bool {
    let has = |flag: &str| {
        args.iter()
            .any(|a| a == flag || a.starts_with(&format!("{flag}=")))
    };
    if has("--bigram") || has("--models") {
        return false;
    }
    match flag_value(args, "--methods") {
        Some(methods) => methods
            .split(',')
            .any(|m| m.starts_with("bigram") && !m.contains("bigram=") && !m.contains("target=")),
        // The default method list and --quick's include bigram.
        None => true,
    }
}

/// Arguments of `cargo xtask bench-forward`: passed through to `spec bench-forward`.
#[derive(clap::Args)]
#[command(disable_help_flag = true)]
pub(crate) struct BenchForwardArgs {
    /// Options of `spec bench-forward` (`--model NAME`, `--weights`, `--rows`, `--reps`, `--json`;
    /// `--help` lists them).
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    args: Vec<String>,
}

/// `cargo xtask bench-forward`: build `spec` (release), fetch the model when `--model` names a
/// reference model, run `spec bench-forward OPTIONS`.
pub(crate) fn run_bench_forward(args: BenchForwardArgs) -> Result<()> {
    let root = workspace_root();
    let mut spec = spec_command(&root, None, "bench-forward", &args.args);
    if !args.args.iter().any(|a| a == "--help" || a == "-h") {
        build_spec(None)?;
        if let Some(model) = flag_value(&args.args, "--model") {
            fetch_reference(&model)?;
        }
    }
    run(&mut spec)
}

/// Builds `spec` in release, with the backend `feature` where one is named.
pub(crate) fn build_spec(feature: Option<&str>) -> Result<()> {
    eprintln!("xtask: building spec (release; the first build takes minutes)");
    run(cargo()
        .current_dir(workspace_root())
        .args(["build", "--release", "-p", "spec-cli"])
        .args(feature.iter().flat_map(|f| ["--features", *f])))
}

/// Fetches `model` with `cargo xtask fetch-models` where it names a reference model (a path is
/// left alone).
pub(crate) fn fetch_reference(model: &str) -> Result<()> {
    if spec_models::reference_model(model).is_some() {
        let xtask = std::env::current_exe().context("locating the xtask binary")?;
        run(Command::new(xtask).arg("fetch-models").arg(model))?;
    }
    Ok(())
}

/// `cargo run --release -p spec-cli --bin spec [--features F] -- SUBCOMMAND ARGS` from `root`.
pub(crate) fn spec_command(
    root: &Path,
    feature: Option<&str>,
    subcommand: &str,
    args: &[String],
) -> Command {
    let mut c = cargo();
    c.current_dir(root)
        .args([
            "run",
            "--quiet",
            "--release",
            "-p",
            "spec-cli",
            "--bin",
            "spec",
        ])
        .args(feature.iter().flat_map(|f| ["--features", *f]))
        .args(["--", subcommand])
        .args(args);
    c
}

/// The value of `--name VALUE` or `--name=VALUE` in `args`, the last one if repeated.
pub(crate) fn flag_value(args: &[String], name: &str) -> Option<String> {
    let prefix = format!("{name}=");
    let mut value = None;
    for (i, a) in args.iter().enumerate() {
        if let Some(v) = a.strip_prefix(&prefix) {
            value = Some(v.to_owned());
        } else if a == name {
            value = args.get(i + 1).cloned();
        }
    }
    value
}

/// The cargo feature `spec` needs for `--backend NAME` (flex is the default feature).
fn backend_feature(args: &[String]) -> Result<Option<&'static str>> {
    Ok(match flag_value(args, "--backend").as_deref() {
        None | Some("flex") => None,
        Some("wgpu") => Some("wgpu"),
        Some("cuda") => Some("cuda"),
        Some(other) => bail!("--backend takes flex, wgpu or cuda, not `{other}`"),
    })
}

pub(crate) fn workspace_root() -> PathBuf {
    Path::new(&crate::manifest_dir())
        .parent()
        .map_or_else(|| PathBuf::from("."), Path::to_path_buf)
}

pub(crate) fn cargo() -> Command {
    Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn backend_picks_the_feature() {
        assert_eq!(backend_feature(&strings(&["--quick"])).unwrap(), None);
        assert_eq!(
            backend_feature(&strings(&["--backend", "wgpu", "--quick"])).unwrap(),
            Some("wgpu")
        );
        assert_eq!(
            backend_feature(&strings(&["--backend=cuda"])).unwrap(),
            Some("cuda")
        );
        assert_eq!(
            backend_feature(&strings(&["--backend", "flex"])).unwrap(),
            None
        );
        assert!(backend_feature(&strings(&["--backend", "tpu"])).is_err());
    }

    #[test]
    fn a_bigram_file_is_supplied_only_where_the_run_uses_one() {
        let wants = |v: &[&str]| wants_default_bigram(&strings(v));
        assert!(wants(&[]));
        assert!(wants(&["--quick"]));
        assert!(wants(&["--quick", "--methods", "plain,bigram:k=2"]));
        assert!(!wants(&["--quick", "--bigram", "b.safetensors"]));
        assert!(!wants(&["--bigram=b.safetensors"]));
        assert!(!wants(&["--models", "x.gguf"]));
        assert!(!wants(&["--methods", "plain,prompt-lookup"]));
        assert!(!wants(&["--methods", "bigram:bigram=b.safetensors"]));
        assert!(
            default_bigram(&strings(&["--quick", "--bigram", "b"]))
                .unwrap()
                .is_none()
        );
    }

    #[test]
    fn the_workspace_root_holds_the_prompt_set() {
        assert!(
            workspace_root()
                .join("benches/prompts/spec-bench-mini.jsonl")
                .is_file()
        );
    }
}
