//! The texts `spec bench` measures, so that training never sees them: every turn of every
//! question in `benches/prompts/*.jsonl` (Spec-Bench's `question.jsonl` format: `question_id`,
//! `category`, `turns`).

use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::{DataError, Result};

/// The workspace's `benches/prompts` folder, as this crate was built.
pub const BENCH_PROMPTS_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../benches/prompts");

#[derive(Deserialize)]
struct Question {
    turns: Vec<String>,
}

/// Every turn of every question in the `.jsonl` files of [`BENCH_PROMPTS_DIR`].
pub fn bench_prompts() -> Result<Vec<String>> {
    bench_prompts_in(Path::new(BENCH_PROMPTS_DIR))
}

/// Every turn of every question in the `.jsonl` files of `dir`, file by file in name order.
///
/// # Errors
/// An unreadable folder or file, a line that is not a question, or no `.jsonl` files at all
/// (a wrong folder would otherwise exclude nothing, silently).
pub fn bench_prompts_in(dir: &Path) -> Result<Vec<String>> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(DataError::io("listing", dir))?
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|p| p.is_file() && p.extension().is_some_and(|e| e == "jsonl"))
        .collect();
    if files.is_empty() {
        return Err(DataError::format(dir, "no bench prompt files (*.jsonl)"));
    }
    files.sort();
    let mut texts = Vec::new();
    for path in files {
        let text = std::fs::read_to_string(&path).map_err(DataError::io("reading", &path))?;
        for (i, line) in text.lines().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            let question: Question = serde_json::from_str(line).map_err(|e| {
                DataError::format(&path, format!("line {}: not a question: {e}", i + 1))
            })?;
            texts.extend(question.turns);
        }
    }
    Ok(texts)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn the_workspace_bench_prompts_are_read() {
        let texts = bench_prompts().unwrap();
        // spec-bench-mini's second turns are there too.
        assert!(
            texts
                .iter()
                .any(|t| t == "Which of those works best for someone who is shy? Explain briefly.")
        );
        assert!(texts.len() > 20);
    }

    #[test]
    fn a_folder_without_prompt_files_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        assert!(bench_prompts_in(dir.path()).is_err());
        std::fs::write(dir.path().join("q.jsonl"), "{\"id\": 1}\n").unwrap();
        let err = bench_prompts_in(dir.path()).unwrap_err().to_string();
        assert!(err.contains("line 1"), "{err}");
    }
}
