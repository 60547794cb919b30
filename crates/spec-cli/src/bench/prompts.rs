//! The prompts of a run: Spec-Bench's `question.jsonl` format, the project's set built in.

use std::collections::BTreeMap;

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};

use super::args::BenchArgs;
use super::plan::DEFAULT_PER_CATEGORY;

/// The project's prompt set (Spec-Bench's `question.jsonl` format), built into the binary.
pub(super) const DEFAULT_PROMPTS: &str =
    include_str!("../../../../benches/prompts/spec-bench-mini.jsonl");

pub(super) const DEFAULT_PROMPTS_NAME: &str = "benches/prompts/spec-bench-mini.jsonl";

/// A prompt of the run.
#[derive(Debug, Clone, Serialize)]
pub(super) struct BenchPrompt {
    pub(super) question_id: String,
    pub(super) category: String,
    /// 0-based turn of the question this prompt is.
    pub(super) turn: usize,
    pub(super) text: String,
}

/// A line of a Spec-Bench `question.jsonl`.
#[derive(Deserialize)]
pub(super) struct Question {
    pub(super) question_id: serde_json::Value,
    pub(super) category: String,
    pub(super) turns: Vec<String>,
}

pub(super) fn load_prompts(args: &BenchArgs) -> Result<(String, Vec<BenchPrompt>)> {
    let (name, text) = match &args.prompts {
        Some(path) => (
            path.display().to_string(),
            std::fs::read_to_string(path)
                .with_context(|| format!("reading the prompts {}", path.display()))?,
        ),
        None => (DEFAULT_PROMPTS_NAME.to_owned(), DEFAULT_PROMPTS.to_owned()),
    };
    // Groups pick their own subsets (`select_prompts`); the largest cap is read here.
    let per_category =
        args.per_category
            .unwrap_or(if args.quick { 1 } else { DEFAULT_PER_CATEGORY });
    let prompts = parse_prompts(&text, per_category, args.all_turns)
        .with_context(|| format!("in the prompts {name}"))?;
    Ok((name, prompts))
}

/// Parses a `question.jsonl`; keeps at most `per_category` questions of each category (0 =
/// all) in file order, and their first turn unless `all_turns`.
pub(super) fn parse_prompts(
    text: &str,
    per_category: usize,
    all_turns: bool,
) -> Result<Vec<BenchPrompt>> {
    let mut taken: BTreeMap<String, usize> = BTreeMap::new();
    let mut prompts = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let q: Question = serde_json::from_str(line).with_context(|| {
            format!(
                "line {}: not a question (`question_id`, `category`, `turns`)",
                i + 1
            )
        })?;
        let id = match &q.question_id {
            serde_json::Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        if q.turns.is_empty() {
            bail!("line {}: question {id} has no turns", i + 1);
        }
        let count = taken.entry(q.category.clone()).or_default();
        if per_category > 0 && *count >= per_category {
            continue;
        }
        *count += 1;
        let turns = if all_turns { q.turns.len() } else { 1 };
        for (turn, text) in q.turns.into_iter().take(turns).enumerate() {
            prompts.push(BenchPrompt {
                question_id: id.clone(),
                category: q.category.clone(),
                turn,
                text,
            });
        }
    }
    if prompts.is_empty() {
        bail!("no prompts");
    }
    Ok(prompts)
}

/// The prompts of a group: those of the first `per_category` questions of each category (0 =
/// all).
pub(super) fn select_prompts(prompts: &[BenchPrompt], per_category: usize) -> Vec<usize> {
    let mut questions: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    let mut out = Vec::new();
    for (i, p) in prompts.iter().enumerate() {
        let seen = questions.entry(&p.category).or_default();
        if !seen.contains(&p.question_id.as_str()) {
            if per_category > 0 && seen.len() >= per_category {
                continue;
            }
            seen.push(&p.question_id);
        }
        out.push(i);
    }
    out
}

pub(super) fn categories_in_order(prompts: &[BenchPrompt]) -> Vec<String> {
    let mut seen = Vec::new();
    for p in prompts {
        if !seen.contains(&p.category) {
            seen.push(p.category.clone());
        }
    }
    seen
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    #[test]
    fn the_prompt_set_parses_and_covers_every_category() {
        let all = parse_prompts(DEFAULT_PROMPTS, 0, false).unwrap();
        let cats = categories_in_order(&all);
        for c in [
            "conversation",
            "translation",
            "summarization",
            "qa",
            "math",
            "rag",
            "code",
        ] {
            assert!(cats.iter().any(|x| x == c), "missing category {c}");
            assert!(all.iter().filter(|p| p.category == c).count() >= 2);
        }
        let ids: BTreeSet<_> = all.iter().map(|p| &p.question_id).collect();
        assert_eq!(ids.len(), all.len(), "question ids must be unique");
        let quick = parse_prompts(DEFAULT_PROMPTS, 1, false).unwrap();
        assert_eq!(quick.len(), cats.len());
    }

    #[test]
    fn prompts_limit_per_category_and_expand_turns() {
        let text = r#"{"question_id": 1, "category": "a", "turns": ["x", "y"]}
{"question_id": "q2", "category": "a", "turns": ["z"]}

{"question_id": 3, "category": "b", "turns": ["w"]}
"#;
        let p = parse_prompts(text, 1, true).unwrap();
        let got: Vec<_> = p
            .iter()
            .map(|p| {
                (
                    p.question_id.as_str(),
                    p.category.as_str(),
                    p.turn,
                    p.text.as_str(),
                )
            })
            .collect();
        assert_eq!(
            got,
            [("1", "a", 0, "x"), ("1", "a", 1, "y"), ("3", "b", 0, "w")]
        );
        assert_eq!(parse_prompts(text, 0, false).unwrap().len(), 3);
        assert!(parse_prompts("{\"question_id\": 1}", 0, false).is_err());
        assert!(
            parse_prompts(
                r#"{"question_id": 1, "category": "a", "turns": []}"#,
                0,
                false
            )
            .is_err()
        );
    }

    #[test]
    fn prompt_selection_counts_questions_not_turns() {
        let text = r#"{"question_id": 1, "category": "a", "turns": ["x", "y"]}
{"question_id": 2, "category": "a", "turns": ["z"]}
{"question_id": 3, "category": "b", "turns": ["w"]}
"#;
        let prompts = parse_prompts(text, 0, true).unwrap();
        assert_eq!(select_prompts(&prompts, 1), [0, 1, 3]);
        assert_eq!(select_prompts(&prompts, 0), [0, 1, 2, 3]);
    }
}
