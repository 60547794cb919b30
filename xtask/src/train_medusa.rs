//! `cargo xtask train-medusa`: fetch the target and the prompt packages, build `spec`
//! (release), run `spec train-medusa`. Also the Medusa heads `cargo xtask bench` uses, trained
//! first when none are cached.

use std::path::PathBuf;

use anyhow::{Result, bail};

use crate::bench::{build_spec, fetch_reference, flag_value, spec_command, workspace_root};
use crate::run;
use crate::training_data::{default_dir, ensure_training_data};

#[derive(clap::Args)]
#[command(disable_help_flag = true)]
pub(crate) struct TrainMedusaArgs {
    /// The target: a reference model name or a checkpoint path.
    #[arg(long, default_value = "smollm2-135m")]
    model: String,
    /// The prompts: `sharegpt` (ShareGPT's first human turns), `humaneval` (its 164 problems)
    /// or a file of one's own (JSON lines with "text", or one prompt a line).
    #[arg(long, default_value = "sharegpt")]
    data: String,
    /// Options of `spec train-medusa` (`--heads`, `--steps`, `--out`, …; `--help` lists them).
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    args: Vec<String>,
}

/// The `spec train-medusa` arguments naming the prompt source `data`.
fn data_args(data: &str) -> Result<Vec<String>> {
    let (flag, path) = match data {
        "sharegpt" => (
            "--sharegpt",
            ensure_training_data(&default_dir()?)?.sharegpt,
        ),
        "humaneval" => (
            "--humaneval",
            ensure_training_data(&default_dir()?)?.humaneval,
        ),
        file => {
            let path = PathBuf::from(file);
            if !path.is_file() {
                bail!(
                    "--data takes sharegpt, humaneval or a prompt file; `{file}` is none of them"
                );
            }
            ("--prompt-file", path)
        }
    };
    Ok(vec![flag.to_owned(), path.to_string_lossy().into_owned()])
}

pub(crate) fn run_train(args: TrainMedusaArgs) -> Result<()> {
    let root = workspace_root();
    if args.args.iter().any(|a| a == "--help" || a == "-h") {
        return run(&mut spec_command(&root, None, "train-medusa", &args.args));
    }
    build_spec(None)?;
    fetch_reference(&args.model)?;
    let mut all = vec!["--model".to_owned(), args.model.clone()];
    all.extend(data_args(&args.data)?);
    all.extend(args.args);
    run(&mut spec_command(&root, None, "train-medusa", &all))
}

/// The target whose heads a default bench run uses.
const HEADS_TARGET: &str = "smollm2-135m";

/// `spec train-medusa`'s settings for `--quick` runs' heads (CI's smoke run): enough to
/// exercise training and decoding, not to draft well.
const QUICK_TRAINING: &[&str] = &[
    "--prompts",
    "24",
    "--answer-tokens",
    "32",
    "--steps",
    "40",
    "--batch",
    "32",
];

/// When the run includes a Medusa method on the default target without naming heads (the
/// default run and `--quick` do): SmolLM2's cached heads (`--quick`: a quickly trained set),
/// trained first if they are not there (ShareGPT's replies teacher-forced, then the heads:
/// about 15 minutes on the reference 2-core CPU; 1 minute for `--quick`'s). `spec` is built
/// already.
pub(crate) fn default_heads(args: &[String]) -> Result<Option<PathBuf>> {
    if !wants_default_heads(args) {
        return Ok(None);
    }
    let quick = args.iter().any(|a| a == "--quick");
    let dir = default_dir()?.with_file_name("medusa");
    let name = if quick {
        format!("{HEADS_TARGET}-4h-quick.safetensors")
    } else {
        format!("{HEADS_TARGET}-4h.safetensors")
    };
    let path = dir.join(name);
    if path.is_file() {
        return Ok(Some(path));
    }
    eprintln!(
        "xtask: training Medusa heads for {HEADS_TARGET} into {}",
        path.display()
    );
    let mut train = vec![
        "--model".to_owned(),
        HEADS_TARGET.to_owned(),
        "--out".to_owned(),
        path.to_string_lossy().into_owned(),
    ];
    // Without the prompt packages the rest of the run still stands, and `spec bench` reports
    // the method as skipped.
    match data_args("sharegpt") {
        Ok(data) => train.extend(data),
        Err(e) => {
            eprintln!("xtask: no training prompts, so the bench skips medusa: {e:#}");
            return Ok(None);
        }
    }
    if quick {
        train.extend(QUICK_TRAINING.iter().map(|s| (*s).to_owned()));
    }
    run(&mut spec_command(
        &workspace_root(),
        None,
        "train-medusa",
        &train,
    ))?;
    Ok(Some(path))
}

/// Whether the run has a Medusa method that names no heads, on the default target.
fn wants_default_heads(args: &[String]) -> bool {
    let has = |flag: &str| {
        args.iter()
            .any(|a| a == flag || a.starts_with(&format!("{flag}=")))
    };
    if has("--medusa-heads") || has("--models") {
        return false;
    }
    match flag_value(args, "--methods") {
        Some(methods) => methods
            .split(',')
            .any(|m| m.starts_with("medusa") && !m.contains("heads=") && !m.contains("target=")),
        // The default method list and --quick's include medusa.
        None => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(line: &[&str]) -> Vec<String> {
        line.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn default_heads_serve_runs_that_name_none() {
        assert!(wants_default_heads(&args(&[])));
        assert!(wants_default_heads(&args(&["--quick"])));
        assert!(wants_default_heads(&args(&[
            "--methods",
            "plain,medusa:tree=static"
        ])));
        assert!(!wants_default_heads(&args(&[
            "--methods",
            "plain,medusa:heads=h"
        ])));
        assert!(!wants_default_heads(&args(&[
            "--methods",
            "plain,tree:lookup=on"
        ])));
        assert!(!wants_default_heads(&args(&["--medusa-heads", "h"])));
        assert!(!wants_default_heads(&args(&[
            "--models",
            "qwen2.5-coder-1.5b"
        ])));
    }
}
