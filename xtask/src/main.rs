//! Project automation, run as `cargo xtask <command>` (see `.cargo/config.toml`).
//!
//! - `test`: everything the test suite needs on a fresh Debian machine (the reference models, the
//!   Python packages of the reference checks, Mesa's software Vulkan), then every test: the
//!   workspace on flex, and the backend agreement tests on wgpu (compiled together with the cuda
//!   feature, so CI proves cuda compiles too).
//! - `fetch-models`: download the reference models into the cache, verify or list them.
//! - `bench`: every method against plain decoding per prompt category (`spec bench`, release).
//! - `train-bigram`: count token bigrams over text corpora into a bigram draft model.
//! - `fetch-training-data`: the prompts the trained drafting methods learn from (ShareGPT,
//!   HumanEval).

mod bench;
mod corpora;
mod fetch;
mod train_bigram;
mod train_medusa;
mod training_data;

use std::path::Path;
use std::process::Command;

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(about = "Automation for the speculative-decoding workspace")]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Install what the tests need, then run all of them.
    Test {
        /// Skip the wgpu tests (they are slow on a CPU through software Vulkan).
        #[arg(long)]
        no_wgpu: bool,
        /// Skip fetching the reference models and installing the Python references; the
        /// tests that need them then skip themselves.
        #[arg(long)]
        no_models: bool,
    },
    /// Download the reference models into the cache, or check or list them.
    FetchModels(fetch::FetchArgs),
    /// Build `spec` (release), fetch the models, run `spec bench` (options pass through).
    Bench(bench::BenchArgs),
    /// Build `spec` (release) and time forward passes over 1..16 tokens per weight format
    /// (`spec bench-forward`; options pass through).
    BenchForward(bench::BenchForwardArgs),
    /// Download the text corpora (Austen, Shakespeare, Brown) the bigram model is counted over.
    FetchCorpora(corpora::FetchCorporaArgs),
    /// Count token bigrams over text corpora: the draft model of `--method bigram`.
    TrainBigram(train_bigram::TrainBigramArgs),
    /// Download the training prompts (ShareGPT conversations, HumanEval problems) and print
    /// where they are.
    FetchTrainingData(training_data::FetchTrainingDataArgs),
    /// Train Medusa heads for a target on ShareGPT's or HumanEval's replies teacher-forced
    /// through it (`spec train-medusa`, release; options pass through).
    TrainMedusa(train_medusa::TrainMedusaArgs),
}

fn main() -> Result<()> {
    match Cli::parse().command {
        Cmd::Test { no_wgpu, no_models } => test(no_wgpu, no_models),
        Cmd::FetchModels(args) => fetch::run(args),
        Cmd::Bench(args) => bench::run_bench(args),
        Cmd::BenchForward(args) => bench::run_bench_forward(args),
        Cmd::TrainBigram(args) => train_bigram::run(args),
        Cmd::FetchCorpora(args) => corpora::run_fetch(args),
        Cmd::FetchTrainingData(args) => training_data::run_fetch(args),
        Cmd::TrainMedusa(args) => train_medusa::run_train(args),
    }
}

fn test(no_wgpu: bool, no_models: bool) -> Result<()> {
    let mut env: Vec<(&str, &str)> = Vec::new();
    if !no_models {
        // The reference models and the Python references some tests compare against.
        let xtask = std::env::current_exe().context("locating the xtask binary")?;
        run(Command::new(xtask).arg("fetch-models"))?;
        ensure_python_packages()?;
        env.push(("SPEC_REQUIRE_MODELS", "1"));
    }
    cargo_env(&["test", "--workspace"], &env)?;
    if !no_wgpu {
        ensure_software_vulkan()?;
        // `wgpu,cuda` together: the cuda tests are compiled (proving the feature builds without
        // a toolkit) but filtered out, since they need a GPU.
        // spec-runtime's agreement tests run too: on wgpu they found a fused one-row matmul
        // that misreads transposed weights (worked around in model.rs). spec-cli's check that
        // wgpu has an adapter before burn's backend starts runs as a program.
        cargo_env(
            &[
                "test",
                "-p",
                "spec-core",
                "-p",
                "spec-runtime",
                "-p",
                "spec-cli",
                "--features",
                "wgpu,cuda",
                "--test",
                "backend",
                "--test",
                "equivalence",
                "--test",
                "one_row",
                "--test",
                "wgpu_check",
                "wgpu::",
            ],
            &env,
        )?;
    }
    Ok(())
}

/// The Python packages of the reference checks (GGUF dequantization, tokenizer, forward pass).
fn ensure_python_packages() -> Result<()> {
    let requirements = Path::new(&manifest_dir()).join("python-requirements.txt");
    run(Command::new("python3")
        .args([
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            "-r",
        ])
        .arg(&requirements))
    .context("could not install the Python reference packages; install them, or pass --no-models")
}

/// Mesa's lavapipe gives wgpu a Vulkan device on a CPU-only machine.
fn ensure_software_vulkan() -> Result<()> {
    let icd_dir = Path::new("/usr/share/vulkan/icd.d");
    let has_lavapipe = std::fs::read_dir(icd_dir)
        .map(|entries| {
            entries
                .flatten()
                .any(|e| e.file_name().to_string_lossy().starts_with("lvp_icd"))
        })
        .unwrap_or(false);
    if has_lavapipe {
        return Ok(());
    }
    eprintln!(
        "xtask: installing Mesa's software Vulkan driver (mesa-vulkan-drivers) for the wgpu tests"
    );
    run(Command::new("apt-get").args(["update", "-qq"]))?;
    run(Command::new("apt-get")
        .args([
            "install",
            "-y",
            "-qq",
            "--no-install-recommends",
            "mesa-vulkan-drivers",
            "libvulkan1",
        ])
        .env("DEBIAN_FRONTEND", "noninteractive"))
    .context("could not install mesa-vulkan-drivers; install it, or pass --no-wgpu")
}

fn cargo_env(args: &[&str], env: &[(&str, &str)]) -> Result<()> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    run(Command::new(cargo).args(args).envs(env.iter().copied()))
}

fn run(command: &mut Command) -> Result<()> {
    eprintln!("xtask: running {command:?}");
    let status = command
        .status()
        .with_context(|| format!("could not start {command:?}"))?;
    if !status.success() {
        bail!("{command:?} failed with {status}");
    }
    Ok(())
}

/// This package's directory: cargo's run-time `CARGO_MANIFEST_DIR` when set, else the
/// compile-time one. (A target directory shared with a checkout at another path may hold a
/// binary built there, whose compile-time path points into that checkout.)
pub(crate) fn manifest_dir() -> std::path::PathBuf {
    std::env::var_os("CARGO_MANIFEST_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")))
}
