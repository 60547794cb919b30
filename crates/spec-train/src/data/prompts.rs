//! Where prompts come from, and the list a training run takes from a source: without
//! duplicates and without `spec bench`'s prompts, in an order that needs no seed.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use sha2::{Digest, Sha256};

use super::humaneval::read_humaneval;
use super::sharegpt::read_sharegpt;
use super::{DataError, Result};

/// A prompt: a user's request, before any chat template, and the dataset's reply to it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Prompt {
    /// Where it came from (`sharegpt:<id>`, `humaneval:<task>`, `<file name>:<line>`).
    pub id: String,
    pub text: String,
    /// The source's own answer (trimmed, never empty), what [`super::AnswerSource::Dataset`]
    /// teacher-forces: ShareGPT's assistant turn, HumanEval's canonical solution, a `.jsonl`
    /// file's `"reply"`; `None` where the source has none.
    pub reply: Option<String>,
}

/// A source of prompts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PromptSource {
    /// A ShareGPT JSON array (cut short or not): the first human turn of each conversation.
    ShareGpt(PathBuf),
    /// HumanEval's `HumanEval.jsonl.gz`: each problem as a request to complete the function.
    HumanEval(PathBuf),
    /// A file of one's own: JSON lines with a `"text"` field (and optionally a `"reply"`)
    /// where the name ends in `.jsonl`, otherwise one prompt a non-empty line.
    File(PathBuf),
}

impl PromptSource {
    /// A short stable name of the source, for cache keys and reports: `sharegpt`,
    /// `humaneval`, or `file:<file name>` (not the folder, so that moving the data keeps it).
    pub fn label(&self) -> String {
        match self {
            Self::ShareGpt(_) => "sharegpt".into(),
            Self::HumanEval(_) => "humaneval".into(),
            Self::File(path) => format!(
                "file:{}",
                path.file_name().map_or_else(
                    || path.display().to_string(),
                    |n| n.to_string_lossy().into()
                )
            ),
        }
    }

    pub fn path(&self) -> &Path {
        match self {
            Self::ShareGpt(p) | Self::HumanEval(p) | Self::File(p) => p,
        }
    }

    /// Every prompt of the source, in file order.
    pub fn read(&self) -> Result<Vec<Prompt>> {
        match self {
            Self::ShareGpt(path) => Ok(read_sharegpt(path)?.prompts),
            Self::HumanEval(path) => read_humaneval(path),
            Self::File(path) => read_prompt_file(path),
        }
    }
}

#[derive(Deserialize)]
struct TextLine {
    text: String,
    #[serde(default)]
    reply: Option<String>,
}

/// `text` trimmed, or `None` where nothing is left: an empty reply is no reply.
pub(crate) fn non_empty_reply(text: &str) -> Option<String> {
    let text = text.trim();
    (!text.is_empty()).then(|| text.to_owned())
}

fn read_prompt_file(path: &Path) -> Result<Vec<Prompt>> {
    let text = std::fs::read_to_string(path).map_err(DataError::io("reading", path))?;
    let name = path.file_name().map_or_else(
        || path.display().to_string(),
        |n| n.to_string_lossy().into(),
    );
    let jsonl = path.extension().is_some_and(|e| e == "jsonl");
    let mut prompts = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let (text, reply) = if jsonl {
            let line = serde_json::from_str::<TextLine>(line).map_err(|e| {
                DataError::format(path, format!("line {}: no `text` field: {e}", i + 1))
            })?;
            (line.text, line.reply)
        } else {
            (line.to_owned(), None)
        };
        let text = text.trim();
        if !text.is_empty() {
            prompts.push(Prompt {
                id: format!("{name}:{}", i + 1),
                text: text.to_owned(),
                reply: reply.as_deref().and_then(non_empty_reply),
            });
        }
    }
    Ok(prompts)
}

/// The prompts a run takes from a source, and what was left out.
#[derive(Debug, Clone, Default)]
pub struct LoadedPrompts {
    /// In the order of [`order_key`] of their text, at most the limit.
    pub prompts: Vec<Prompt>,
    /// Prompts dropped because `spec bench` measures them.
    pub excluded_bench: usize,
    /// Prompts dropped because an earlier one had the same text.
    pub duplicates: usize,
}

/// The prompts of `source`, without any whose text (trimmed) equals one of `bench` (pass
/// [`super::bench_prompts`]: training on what the bench measures would flatter the bench)
/// and without repeats, sorted by a hash of their text, then cut to `limit`.
///
/// The hash order needs no seed and spreads a limited sample over the whole file rather than
/// its first records; a larger limit keeps every prompt a smaller one took.
pub fn load_prompts(
    source: &PromptSource,
    bench: &[String],
    limit: Option<usize>,
) -> Result<LoadedPrompts> {
    let bench: HashSet<&str> = bench.iter().map(|t| t.trim()).collect();
    let mut seen = HashSet::new();
    let mut out = LoadedPrompts::default();
    let mut keyed = Vec::new();
    for prompt in source.read()? {
        let text = prompt.text.trim();
        if bench.contains(text) {
            out.excluded_bench += 1;
        } else if !seen.insert(text.to_owned()) {
            out.duplicates += 1;
        } else {
            keyed.push((order_key(&prompt.text), prompt));
        }
    }
    keyed.sort_by_key(|a| a.0);
    out.prompts = keyed
        .into_iter()
        .take(limit.unwrap_or(usize::MAX))
        .map(|(_, p)| p)
        .collect();
    Ok(out)
}

/// The sha256 of `domain`, a zero byte and `text`: one text hashed for unrelated purposes
/// (order, split, cache entries) gives unrelated values.
pub(crate) fn text_hash(domain: &str, text: &str) -> [u8; 32] {
    let mut hasher = Sha256::new();
    hasher.update(domain.as_bytes());
    hasher.update([0]);
    hasher.update(text.as_bytes());
    hasher.finalize().into()
}

/// The key [`load_prompts`] sorts by.
fn order_key(text: &str) -> [u8; 32] {
    text_hash("spec-train prompt order", text)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        path
    }

    #[test]
    fn files_of_lines_and_of_json_lines() {
        let dir = tempfile::tempdir().unwrap();
        let plain = write(dir.path(), "p.txt", "one\n\n  two  \n");
        let read = PromptSource::File(plain).read().unwrap();
        assert_eq!(read.len(), 2);
        assert_eq!(read[1].text, "two");
        assert_eq!(read[1].id, "p.txt:3");
        assert_eq!(read[1].reply, None);
        let jsonl = write(
            dir.path(),
            "p.jsonl",
            concat!(
                "{\"text\": \"a\\nb\", \"x\": 1}\n{\"text\": \"c\", \"reply\": \" d \"}\n",
                "{\"text\": \"e\", \"reply\": \"  \"}\n"
            ),
        );
        let read = PromptSource::File(jsonl.clone()).read().unwrap();
        assert_eq!(read[0].text, "a\nb");
        let replies: Vec<_> = read.iter().map(|p| p.reply.as_deref()).collect();
        assert_eq!(replies, [None, Some("d"), None]);
        assert_eq!(PromptSource::File(jsonl).label(), "file:p.jsonl");
        let bad = write(dir.path(), "bad.jsonl", "{\"turns\": []}\n");
        let err = PromptSource::File(bad).read().unwrap_err().to_string();
        assert!(err.contains("line 1"), "{err}");
    }

    #[test]
    fn bench_prompts_and_repeats_are_dropped_and_the_order_is_stable() {
        let dir = tempfile::tempdir().unwrap();
        let lines: Vec<String> = (0..50).map(|i| format!("prompt {i}")).collect();
        let mut text = lines.join("\n");
        text.push_str("\nprompt 3\nBench question?\n");
        let source = PromptSource::File(write(dir.path(), "p.txt", &text));
        let bench = vec!["  Bench question?\n".to_owned(), "prompt 7".to_owned()];
        let all = load_prompts(&source, &bench, None).unwrap();
        assert_eq!(all.excluded_bench, 2);
        assert_eq!(all.duplicates, 1);
        assert_eq!(all.prompts.len(), 49);
        assert!(all.prompts.iter().all(|p| p.text != "prompt 7"));
        // Not file order, and a smaller limit is a prefix of a larger one.
        let texts: Vec<&str> = all.prompts.iter().map(|p| p.text.as_str()).collect();
        assert_ne!(texts[..3], ["prompt 0", "prompt 1", "prompt 2"]);
        let ten = load_prompts(&source, &bench, Some(10)).unwrap();
        assert_eq!(ten.prompts, all.prompts[..10]);
        assert_eq!(
            load_prompts(&source, &bench, None).unwrap().prompts,
            all.prompts
        );
    }
}
