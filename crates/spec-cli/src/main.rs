//! `spec`: generate text from a model with plain decoding or a speculative method (`--method`).
//!
//! ```text
//! spec generate --model smollm2-135m --prompt "Write a haiku" --chat --max-new-tokens 64
//! spec bench --quick          # every method vs plain decoding, per prompt category
//! ```

mod bench;
#[cfg(feature = "flex")]
mod bench_forward;
mod checkpoint;
mod device;
mod drafts;
mod generate;
mod plots;
mod registry;
#[cfg(feature = "flex")]
mod train_medusa;

use std::process::ExitCode;

use anyhow::{Result, bail};
use clap::{Parser, Subcommand, ValueEnum};

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
    Generate(generate::GenerateArgs),
    /// Benchmark methods against plain decoding per prompt category (`cargo xtask bench`).
    Bench(bench::BenchArgs),
    /// Time one forward pass over 1..64 new tokens and plain decoding against the memory
    /// bandwidth bound, per weight format (`cargo xtask bench-forward`; flex only).
    #[cfg(feature = "flex")]
    BenchForward(bench_forward::BenchForwardArgs),
    /// Train Medusa heads for a target on its own answers or the dataset's
    /// (`cargo xtask train-medusa`; flex only).
    #[cfg(feature = "flex")]
    TrainMedusa(train_medusa::TrainMedusaArgs),
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum BackendName {
    Flex,
    Wgpu,
    Cuda,
}

/// Runs the command; an error is one line on stderr, `error: ` and its causes joined by `: `,
/// and exit status 1.
fn main() -> ExitCode {
    match run(Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // One line, whatever line breaks a cause's message holds.
            let message = format!("{e:#}");
            let lines: Vec<&str> = message
                .lines()
                .map(str::trim)
                .filter(|l| !l.is_empty())
                .collect();
            eprintln!("error: {}", lines.join(" "));
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> Result<()> {
    match cli.command {
        #[cfg(feature = "flex")]
        Command::BenchForward(args) => bench_forward::run(&args),
        #[cfg(feature = "flex")]
        Command::TrainMedusa(args) => train_medusa::run(&args),
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
            BackendName::Flex => generate::generate::<burn::backend::Flex>(
                &args,
                &Default::default(),
                DeviceLimits::NONE,
            ),
            #[cfg(feature = "wgpu")]
            BackendName::Wgpu => {
                let limits = check_wgpu()?;
                generate::generate::<burn::backend::Wgpu>(&args, &Default::default(), limits)
            }
            #[cfg(feature = "cuda")]
            BackendName::Cuda => {
                check_cuda()?;
                generate::generate::<burn::backend::Cuda>(
                    &args,
                    &Default::default(),
                    DeviceLimits::NONE,
                )
            }
            #[allow(unreachable_patterns)]
            other => bail!(
                "this `spec` was built without the {other:?} backend; rebuild with `--features {}`",
                format!("{other:?}").to_lowercase()
            ),
        },
    }
}
