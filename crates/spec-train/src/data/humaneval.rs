//! HumanEval's problems (`HumanEval.jsonl.gz`: one JSON object a line with `task_id` and
//! `prompt`, a Python signature and docstring), framed as requests to complete the function;
//! the reply is the function completed by its `canonical_solution`, in a code block.

use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::path::Path;

use flate2::read::GzDecoder;
use serde::Deserialize;

use super::prompts::Prompt;
use super::{DataError, Result};

#[derive(Deserialize)]
struct Problem {
    task_id: String,
    prompt: String,
    #[serde(default)]
    canonical_solution: Option<String>,
}

/// The request a problem becomes: the chat models answer a request, not a bare signature.
fn frame(code: &str) -> String {
    format!(
        "Complete this Python function:\n\n```python\n{}\n```",
        code.trim_end()
    )
}

/// The reply a solution becomes: the whole function in a code block, as a chat model answers
/// the request [`frame`] makes (the body alone would not follow the prompt's chat turn).
fn frame_solution(code: &str, body: &str) -> String {
    format!("```python\n{}{}\n```", code, body.trim_end())
}

/// Reads the gzip-compressed JSON lines at `path` (see [`parse_humaneval`]).
pub fn read_humaneval(path: &Path) -> Result<Vec<Prompt>> {
    let file = File::open(path).map_err(DataError::io("opening", path))?;
    parse_humaneval(BufReader::new(file), path)
}

/// The problems of a gzip-compressed JSON-lines stream, in file order; ids are
/// `humaneval:<task_id>`. `path` names the stream in errors.
///
/// # Errors
/// A stream that is not gzip, a line that is not a problem, or no problems at all.
pub fn parse_humaneval(reader: impl Read, path: &Path) -> Result<Vec<Prompt>> {
    let lines = BufReader::new(GzDecoder::new(reader));
    let mut prompts = Vec::new();
    for (i, line) in lines.lines().enumerate() {
        let line = line.map_err(DataError::io("decompressing", path))?;
        if line.trim().is_empty() {
            continue;
        }
        let problem: Problem = serde_json::from_str(&line).map_err(|e| {
            DataError::format(
                path,
                format!("line {}: not a problem (`task_id`, `prompt`): {e}", i + 1),
            )
        })?;
        let reply = problem
            .canonical_solution
            .filter(|body| !body.trim().is_empty())
            .map(|body| frame_solution(&problem.prompt, &body));
        prompts.push(Prompt {
            id: format!("humaneval:{}", problem.task_id),
            text: frame(&problem.prompt),
            reply,
        });
    }
    if prompts.is_empty() {
        return Err(DataError::format(path, "no problems"));
    }
    Ok(prompts)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::io::Write;

    use flate2::Compression;
    use flate2::write::GzEncoder;

    use super::*;

    fn gz(text: &str) -> Vec<u8> {
        let mut encoder = GzEncoder::new(Vec::new(), Compression::default());
        encoder.write_all(text.as_bytes()).unwrap();
        encoder.finish().unwrap()
    }

    #[test]
    fn problems_become_requests() {
        let data = gz(concat!(
            r#"{"task_id": "HumanEval/0", "prompt": "def add(a, b):\n    \"\"\"Add.\"\"\"\n", "entry_point": "add", "canonical_solution": "    return a + b\n"}"#,
            "\n\n",
            r#"{"task_id": "HumanEval/1", "prompt": "def neg(x):\n"}"#,
            "\n"
        ));
        let prompts = parse_humaneval(data.as_slice(), Path::new("h.jsonl.gz")).unwrap();
        assert_eq!(prompts.len(), 2);
        assert_eq!(prompts[0].id, "humaneval:HumanEval/0");
        assert_eq!(
            prompts[0].text,
            "Complete this Python function:\n\n```python\ndef add(a, b):\n    \"\"\"Add.\"\"\"\n```"
        );
        assert_eq!(
            prompts[0].reply.as_deref(),
            Some("```python\ndef add(a, b):\n    \"\"\"Add.\"\"\"\n    return a + b\n```")
        );
        assert_eq!(prompts[1].id, "humaneval:HumanEval/1");
        assert_eq!(prompts[1].reply, None);
    }

    #[test]
    fn bad_input_is_an_error() {
        let not_gz = parse_humaneval(b"{}".as_slice(), Path::new("h")).unwrap_err();
        assert!(not_gz.to_string().contains("decompressing"), "{not_gz}");
        let bad_line = parse_humaneval(gz("{\"task_id\": 3}\n").as_slice(), Path::new("h"))
            .unwrap_err()
            .to_string();
        assert!(bad_line.contains("line 1"), "{bad_line}");
        let empty = parse_humaneval(gz("").as_slice(), Path::new("h")).unwrap_err();
        assert!(empty.to_string().contains("no problems"));
    }

    /// The packaged file itself, where a copy is at hand (`SPEC_HUMANEVAL_GZ`).
    #[test]
    fn the_packaged_file_when_present() {
        let Ok(path) = std::env::var("SPEC_HUMANEVAL_GZ") else {
            return;
        };
        let prompts = read_humaneval(Path::new(&path)).unwrap();
        assert_eq!(prompts.len(), 164);
        assert!(prompts.iter().all(|p| p.reply.is_some()));
    }
}
