//! Project automation, run as `cargo xtask <command>` (see `.cargo/config.toml`).
//!
//! - `test`: everything the test suite needs on a fresh Debian machine, then every test: the
//!   workspace on flex, and the backend agreement tests on wgpu through Mesa's software Vulkan
//!   (compiled together with the cuda feature, so CI proves cuda compiles too).

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
    },
}

fn main() -> Result<()> {
    match Cli::parse().command {
        Cmd::Test { no_wgpu } => test(no_wgpu),
    }
}

fn test(no_wgpu: bool) -> Result<()> {
    cargo(&["test", "--workspace"])?;
    if !no_wgpu {
        ensure_software_vulkan()?;
        // `wgpu,cuda` together: the cuda tests are compiled (proving the feature builds without
        // a toolkit) but filtered out, since they need a GPU.
        cargo(&[
            "test",
            "-p",
            "spec-core",
            "--features",
            "wgpu,cuda",
            "--test",
            "backend",
            "wgpu::",
        ])?;
    }
    Ok(())
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

fn cargo(args: &[&str]) -> Result<()> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    run(Command::new(cargo).args(args))
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
