//! Token-for-token equality with llama.cpp's own tokenizer (through llama-cpp-python).
//!
//! `tests/data/upstream_llama_cpp.json` holds llama.cpp's ids for every string of
//! `tests/data/strings.json` on both reference models, made by
//! `tests/upstream/llama_cpp_tokenize.py` (its docstring has the command); building
//! llama-cpp-python from source takes too long for every CI run, so the fixture is committed and
//! [`fixture_ids_equal_llama_cpp`] checks against it whenever the models are cached. When python3
//! can import `llama_cpp` (or SPEC_UPSTREAM_LIVE=1, which makes a missing llama-cpp-python an
//! error), [`live_ids_equal_llama_cpp`] runs the script itself and also compares every token's
//! bytes.

mod common;

use sha2::{Digest, Sha256};
use spec_tokenizer::TextTokenizer;

const MODELS: [&str; 2] = ["smollm2-135m", "qwen2.5-coder-0.5b"];

fn fixture() -> serde_json::Value {
    let path = common::crate_dir().join("tests/data/upstream_llama_cpp.json");
    serde_json::from_str(&std::fs::read_to_string(path).expect("the fixture is committed"))
        .expect("the fixture is JSON")
}

fn ids_of(v: &serde_json::Value) -> Vec<Vec<u32>> {
    serde_json::from_value(v.clone()).expect("lists of token ids")
}

/// The hash the upstream script computes: each token's bytes, prefixed by their length (u32 LE).
fn pieces_sha256(tok: &TextTokenizer) -> String {
    let mut h = Sha256::new();
    for id in 0..u32::try_from(tok.vocab_size()).expect("fits") {
        let piece = tok.token_bytes(id).expect("in vocab");
        h.update(u32::try_from(piece.len()).expect("short").to_le_bytes());
        h.update(piece);
    }
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

/// Asserts that our ids equal upstream's for every string, with and without special tokens.
fn compare(name: &str, tok: &TextTokenizer, strings: &[String], upstream: &serde_json::Value) {
    let ids = ids_of(&upstream["ids"]);
    let ids_special = ids_of(&upstream["ids_special"]);
    assert_eq!(ids.len(), strings.len(), "{name}: one entry per string");
    let mut mismatches = Vec::new();
    for (i, s) in strings.iter().enumerate() {
        let ours = tok.encode(s, false).expect("encodes");
        if ours != ids[i] {
            mismatches.push(format!(
                "{s:?}:\n  ours     {ours:?}\n  llama.cpp {:?}",
                ids[i]
            ));
        }
        let ours = tok.encode(s, true).expect("encodes");
        if ours != ids_special[i] {
            mismatches.push(format!(
                "{s:?} (add_special):\n  ours     {ours:?}\n  llama.cpp {:?}",
                ids_special[i]
            ));
        }
    }
    assert!(
        mismatches.is_empty(),
        "{name}: {} of {} strings differ from llama.cpp:\n{}",
        mismatches.len(),
        strings.len(),
        mismatches.join("\n")
    );
    assert_eq!(
        tok.vocab_size() as u64,
        upstream["n_vocab"].as_u64().expect("n_vocab"),
        "{name}: vocabulary size"
    );
    eprintln!(
        "{name}: all {} strings tokenize as llama.cpp does",
        strings.len()
    );
}

#[test]
fn fixture_ids_equal_llama_cpp() {
    let strings = common::strings();
    let fixture = fixture();
    let fixture_strings: Vec<String> =
        serde_json::from_value(fixture["strings"].clone()).expect("strings");
    assert_eq!(
        fixture_strings, strings,
        "tests/data/strings.json changed: regenerate the fixture (see tests/upstream/llama_cpp_tokenize.py)"
    );
    for name in MODELS {
        let Some(path) = common::model(name) else {
            continue;
        };
        let tok = TextTokenizer::from_gguf_path(&path).expect("builds");
        let upstream = &fixture["models"][name];
        compare(name, &tok, &strings, upstream);
        assert_eq!(
            pieces_sha256(&tok),
            upstream["pieces_sha256"].as_str().expect("hash"),
            "{name}: the bytes of some token differ from llama.cpp's token_to_piece"
        );
    }
}

/// `n` strings of 1..=12 random pieces each, from a fixed seed (a small LCG: no extra dependency).
fn random_strings(n: usize, seed: u64) -> Vec<String> {
    const PIECES: &[&str] = &[
        " ",
        "  ",
        "   ",
        "\t",
        "\n",
        "\n\n",
        "\r\n",
        " \n ",
        "\u{a0}",
        "\u{3000}",
        "a",
        "the",
        " word",
        "Word",
        "ÉTÉ",
        "e\u{301}",
        "'s",
        "'S",
        "'ll",
        "'re",
        "'",
        "\"",
        "0",
        "7",
        "42",
        "12345",
        "3.14",
        "٣",
        "²",
        "Ⅻ",
        "中文",
        "日本",
        "한",
        "😀",
        "👍🏽",
        "🦀",
        "—",
        "...",
        "!!",
        "?",
        ";",
        "(",
        "){",
        "->",
        "::",
        "//",
        "#",
        "$x",
        "_id",
        "<|im_end|>",
        "<|im_start|>",
        "<tool_call>",
        "<|fim_prefix|>",
        "<",
        "|",
        ">",
        "é",
        "ß",
        "Ω",
        "\u{200b}",
    ];
    let mut state = seed;
    let mut next = move |m: usize| {
        state = state
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        usize::try_from(state >> 33).expect("31 bits fit") % m
    };
    (0..n)
        .map(|_| {
            let len = 1 + next(12);
            (0..len).map(|_| PIECES[next(PIECES.len())]).collect()
        })
        .collect()
}

#[test]
fn live_ids_equal_llama_cpp() {
    let forced = std::env::var("SPEC_UPSTREAM_LIVE").is_ok_and(|v| v == "1");
    if !common::python_has(&["llama_cpp"]) {
        assert!(
            !forced,
            "SPEC_UPSTREAM_LIVE=1 but python3 cannot import llama_cpp (pip install llama-cpp-python)"
        );
        eprintln!(
            "SKIP: llama-cpp-python not installed; the committed fixture was checked instead"
        );
        return;
    }
    // The committed strings plus seeded random mixtures of the pieces where splitting rules
    // disagree most easily (contractions, whitespace runs before words, digits, CJK, emoji…).
    let mut strings = common::strings();
    strings.extend(random_strings(400, 0x5eed));
    let dir = tempfile::tempdir().expect("temp dir");
    let strings_path = dir.path().join("strings.json");
    std::fs::write(
        &strings_path,
        serde_json::to_string(&strings).expect("JSON"),
    )
    .expect("writes");
    let mut args = vec![strings_path.display().to_string()];
    let mut names = Vec::new();
    for name in MODELS {
        if let Some(path) = common::model(name) {
            args.push(format!("{name}={}", path.display()));
            names.push(name);
        }
    }
    if names.is_empty() {
        return;
    }
    let live = common::run_python("llama_cpp_tokenize.py", &args);
    for name in names {
        let path = common::model(name).expect("checked above");
        let tok = TextTokenizer::from_gguf_path(&path).expect("builds");
        let upstream = &live["models"][name];
        compare(name, &tok, &strings, upstream);
        assert_eq!(
            pieces_sha256(&tok),
            upstream["pieces_sha256"].as_str().expect("hash"),
            "{name}: token bytes differ from llama.cpp"
        );
        for s in &strings {
            let ids = tok.encode(s, false).expect("encodes");
            assert_eq!(&tok.decode(&ids).expect("decodes"), s, "{name}: round trip");
        }
    }
}
