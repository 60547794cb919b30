//! ShareGPT conversations: a JSON array of `{"id", "conversations": [{"from", "value"}, ...]}`.
//!
//! The file the package ships is cut short inside its last record, so the array as a whole is
//! not valid JSON. It is read record by record: a scanner finds where each top-level element
//! ends (tracking strings, escapes and nesting) and each one is parsed on its own, so the
//! complete records are kept and the cut-off tail is dropped.

use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::Path;

use serde::Deserialize;

use super::prompts::{Prompt, non_empty_reply};
use super::{DataError, Result};

/// What a ShareGPT file held.
#[derive(Debug, Clone, Default)]
pub struct ShareGptPrompts {
    /// The first human turn of each complete record where it is not empty, trimmed, in file
    /// order; ids are `sharegpt:<record id>`. The reply is the first non-empty gpt turn
    /// before the next human turn, trimmed.
    pub prompts: Vec<Prompt>,
    /// Complete records read (with or without a human turn).
    pub records: usize,
    /// Complete elements that were not a conversation record (skipped).
    pub unreadable: usize,
    /// Whether the file ended inside a record or before the array closed.
    pub cut_short: bool,
}

#[derive(Deserialize)]
struct Record {
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    conversations: Vec<Turn>,
}

#[derive(Deserialize)]
struct Turn {
    from: String,
    #[serde(default)]
    value: Option<String>,
}

/// Reads the ShareGPT file at `path` (see [`parse_sharegpt`]).
pub fn read_sharegpt(path: &Path) -> Result<ShareGptPrompts> {
    let file = File::open(path).map_err(DataError::io("opening", path))?;
    parse_sharegpt(BufReader::with_capacity(1 << 20, file), path)
}

/// Parses a ShareGPT array from `reader`, record by record; `path` names it in errors.
///
/// # Errors
/// A read error, or a file that does not start as a JSON array of objects.
pub fn parse_sharegpt(mut reader: impl BufRead, path: &Path) -> Result<ShareGptPrompts> {
    let mut out = ShareGptPrompts::default();
    let mut scanner = Scanner::default();
    let mut offset = 0u64;
    loop {
        let chunk = reader.fill_buf().map_err(DataError::io("reading", path))?;
        if chunk.is_empty() {
            break;
        }
        let n = chunk.len();
        for (i, &byte) in chunk.iter().enumerate() {
            match scanner.push(byte) {
                Ok(Some(element)) => take_record(element, &mut out),
                Ok(None) => {}
                Err(what) => {
                    return Err(DataError::format(
                        path,
                        format!("byte {}: {what}", offset + i as u64),
                    ));
                }
            }
            if scanner.state == State::Closed {
                return Ok(out);
            }
        }
        reader.consume(n);
        offset += n as u64;
    }
    match scanner.state {
        State::BeforeArray => Err(DataError::format(path, "empty: not a JSON array")),
        State::Closed => Ok(out),
        State::BetweenElements | State::InElement => {
            out.cut_short = true;
            Ok(out)
        }
    }
}

fn take_record(element: &[u8], out: &mut ShareGptPrompts) {
    let Ok(record) = serde_json::from_slice::<Record>(element) else {
        out.unreadable += 1;
        return;
    };
    let index = out.records;
    out.records += 1;
    let turns = &record.conversations;
    let Some(human) = turns.iter().position(|turn| turn.from == "human") else {
        return;
    };
    let first_human = turns[human]
        .value
        .as_deref()
        .map(str::trim)
        .filter(|value| !value.is_empty());
    if let Some(text) = first_human {
        // The answer to this turn: a gpt turn after the next human turn answers that one.
        let reply = turns[human + 1..]
            .iter()
            .take_while(|turn| turn.from != "human")
            .filter(|turn| turn.from == "gpt")
            .find_map(|turn| turn.value.as_deref().and_then(non_empty_reply));
        let id = record
            .id
            .as_deref()
            .map_or_else(|| format!("#{index}"), str::to_owned);
        out.prompts.push(Prompt {
            id: format!("sharegpt:{id}"),
            text: text.to_owned(),
            reply,
        });
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
enum State {
    #[default]
    BeforeArray,
    BetweenElements,
    InElement,
    Closed,
}

/// Splits a JSON array's bytes into its top-level elements (objects or arrays).
#[derive(Debug, Default)]
struct Scanner {
    state: State,
    element: Vec<u8>,
    depth: usize,
    in_string: bool,
    escaped: bool,
}

impl Scanner {
    /// Takes one byte; returns a whole element when this byte ends one.
    fn push(&mut self, byte: u8) -> Result<Option<&[u8]>, String> {
        match self.state {
            State::BeforeArray => match byte {
                b'[' => self.state = State::BetweenElements,
                b if b.is_ascii_whitespace() => {}
                // A UTF-8 byte-order mark.
                0xEF | 0xBB | 0xBF => {}
                b => return Err(format!("expected `[`, found {:?}", char::from(b))),
            },
            State::BetweenElements => match byte {
                b'{' | b'[' => {
                    self.element.clear();
                    self.element.push(byte);
                    self.depth = 1;
                    self.state = State::InElement;
                }
                b']' => self.state = State::Closed,
                b',' => {}
                b if b.is_ascii_whitespace() => {}
                b => {
                    return Err(format!(
                        "expected an object, `,` or `]`, found {:?}",
                        char::from(b)
                    ));
                }
            },
            State::InElement => {
                self.element.push(byte);
                if self.in_string {
                    if self.escaped {
                        self.escaped = false;
                    } else if byte == b'\\' {
                        self.escaped = true;
                    } else if byte == b'"' {
                        self.in_string = false;
                    }
                } else {
                    match byte {
                        b'"' => self.in_string = true,
                        b'{' | b'[' => self.depth += 1,
                        b'}' | b']' => {
                            self.depth -= 1;
                            if self.depth == 0 {
                                self.state = State::BetweenElements;
                                return Ok(Some(&self.element));
                            }
                        }
                        _ => {}
                    }
                }
            }
            State::Closed => {}
        }
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn parse(text: &str) -> Result<ShareGptPrompts> {
        parse_sharegpt(text.as_bytes(), Path::new("test.json"))
    }

    const RECORDS: &str = r#"[
      {"id": "a_0", "conversations": [
        {"from": "human", "value": "  First question? {not json} \"quoted\" ]"},
        {"from": "gpt", "value": "An answer."}]},
      {"id": "b_0", "conversations": [
        {"from": "gpt", "value": "A continuation."},
        {"from": "human", "value": "Second question"}]},
      {"id": "c_0", "conversations": [{"from": "human", "value": "   "}]},
      {"id": "f_0", "conversations": [
        {"from": "human", "value": "Third"}, {"from": "gpt", "value": " "},
        {"from": "gpt", "value": " Late answer. "}]},
      {"id": "g_0", "conversations": [
        {"from": "human", "value": "Fourth"}, {"from": "human", "value": "Again"},
        {"from": "gpt", "value": "To the second."}]},
      {"id": "d_0", "conversations": []},
      {"id": "e_0", "conversations": [
        {"from": "human", "value": "Cut short \\\" here"#;

    #[test]
    fn a_cut_short_array_keeps_its_complete_records() {
        let read = parse(RECORDS).unwrap();
        assert!(read.cut_short);
        assert_eq!(read.records, 6);
        assert_eq!(read.unreadable, 0);
        let texts: Vec<_> = read.prompts.iter().map(|p| p.text.as_str()).collect();
        assert_eq!(
            texts,
            [
                "First question? {not json} \"quoted\" ]",
                "Second question",
                "Third",
                "Fourth"
            ]
        );
        let replies: Vec<_> = read.prompts.iter().map(|p| p.reply.as_deref()).collect();
        assert_eq!(
            replies,
            [Some("An answer."), None, Some("Late answer."), None]
        );
        assert_eq!(read.prompts[0].id, "sharegpt:a_0");
        assert_eq!(read.prompts[1].id, "sharegpt:b_0");
    }

    #[test]
    fn a_cut_between_records_and_a_closed_array() {
        let cut =
            parse(r#"[{"id": "x", "conversations": [{"from": "human", "value": "hi"}]},"#).unwrap();
        assert!(cut.cut_short);
        assert_eq!(cut.prompts.len(), 1);
        let closed =
            parse(r#" [{"conversations": [{"from": "human", "value": "hi"}]}] trailing"#).unwrap();
        assert!(!closed.cut_short);
        assert_eq!(closed.prompts[0].id, "sharegpt:#0");
    }

    #[test]
    fn a_record_of_another_shape_is_skipped_not_fatal() {
        let read = parse(
            r#"[{"conversations": 3}, [1, 2], {"conversations": [{"from": "human", "value": "ok"}]}]"#,
        )
        .unwrap();
        assert_eq!(read.unreadable, 2);
        assert_eq!(read.records, 1);
        assert_eq!(read.prompts[0].text, "ok");
    }

    #[test]
    fn not_an_array_is_an_error() {
        let err = parse(r#"{"id": 1}"#).unwrap_err().to_string();
        assert!(err.contains("expected `[`"), "{err}");
        assert!(parse("").unwrap_err().to_string().contains("empty"));
        assert!(parse("[1]").is_err());
    }

    /// The packaged file itself, where a copy is at hand (`SPEC_SHAREGPT_JSON`).
    #[test]
    fn the_packaged_file_when_present() {
        let Ok(path) = std::env::var("SPEC_SHAREGPT_JSON") else {
            return;
        };
        let start = std::time::Instant::now();
        let read = read_sharegpt(Path::new(&path)).unwrap();
        println!(
            "{} records, {} prompts, {} unreadable, cut short {} ({:.1} s)",
            read.records,
            read.prompts.len(),
            read.unreadable,
            read.cut_short,
            start.elapsed().as_secs_f64()
        );
        assert!(read.prompts.len() > 1000);
    }
}
