//! Tokenizers of the cached reference models: construction, special ids, round trips, streaming,
//! chat templates, and the vocabulary shared by the two Qwen sizes. Skips (with a message) when a
//! model is absent, unless SPEC_REQUIRE_MODELS=1.

mod common;

use std::time::Instant;

use spec_tokenizer::{Message, TextTokenizer, TokenKind};

fn load(name: &str) -> Option<TextTokenizer> {
    let path = common::model(name)?;
    let start = Instant::now();
    let tok = TextTokenizer::from_gguf_path(&path).expect("the reference model's tokenizer builds");
    eprintln!(
        "{name}: tokenizer with {} tokens built from GGUF in {:.0} ms (metadata read included)",
        tok.vocab_size(),
        start.elapsed().as_secs_f64() * 1e3
    );
    Some(tok)
}

#[test]
fn smollm2_special_ids() {
    let Some(tok) = load("smollm2-135m") else {
        return;
    };
    assert_eq!(tok.vocab_size(), 49_152);
    let id = |t: &str| tok.token_to_id(t).expect("token exists");
    assert_eq!(id("<|im_start|>"), 1);
    assert_eq!(tok.bos_id(), Some(1));
    // Declared EOS (<|im_end|>) first, then the other end-of-turn control token.
    assert_eq!(tok.eos_ids(), &[2, 0]);
    assert!(tok.is_eos(id("<|im_end|>")) && tok.is_eos(id("<|endoftext|>")));
    assert!(!tok.is_eos(id("<|im_start|>")));
    assert!(!tok.adds_bos(), "SmolLM2's GGUF says add_bos_token = false");
    assert_eq!(tok.token_kind(3), Some(TokenKind::Control)); // <repo_name>
    assert_eq!(tok.token_kind(id("Ġthe")), Some(TokenKind::Normal));
    assert_eq!(tok.token_to_piece(id("Ġthe")).as_deref(), Some(" the"));
    assert_eq!(tok.id_to_token(id("Ġthe")).as_deref(), Some("Ġthe"));
}

#[test]
fn qwen_special_ids() {
    let Some(tok) = load("qwen2.5-coder-0.5b") else {
        return;
    };
    assert_eq!(tok.vocab_size(), 151_936);
    assert_eq!(tok.eos_ids(), &[151_645, 151_643]);
    assert_eq!(tok.token_to_piece(151_645).as_deref(), Some("<|im_end|>"));
    assert_eq!(
        tok.token_to_piece(151_643).as_deref(),
        Some("<|endoftext|>")
    );
    assert_eq!(tok.bos_id(), Some(151_643));
    assert!(!tok.adds_bos());
    assert_eq!(tok.token_kind(151_657), Some(TokenKind::UserDefined)); // <tool_call>
    assert_eq!(tok.token_kind(151_700), Some(TokenKind::Unused)); // [PAD151700]
    // Special tokens written in text are single ids; unused padding entries are not.
    assert_eq!(
        tok.encode("<|im_start|>", false).expect("encodes"),
        [151_644]
    );
    assert_eq!(
        tok.encode("<tool_call>", false).expect("encodes"),
        [151_657]
    );
    assert!(tok.encode("[PAD151700]", false).expect("encodes").len() > 1);
    // Qwen splits digits one by one.
    assert_eq!(tok.encode("2024", false).expect("encodes").len(), 4);
}

#[test]
fn decode_inverts_encode_on_every_test_string() {
    for name in ["smollm2-135m", "qwen2.5-coder-0.5b"] {
        let Some(tok) = load(name) else { continue };
        for s in common::strings() {
            let ids = tok.encode(&s, false).expect("encodes");
            assert_eq!(
                tok.decode(&ids).expect("decodes"),
                s,
                "{name}: round trip of {s:?}"
            );
            // encode(s, true) is the same here: neither model adds BOS/EOS.
            assert_eq!(tok.encode(&s, true).expect("encodes"), ids, "{name}: {s:?}");
        }
        let ids = tok
            .encode("<|im_start|>user\nhi<|im_end|>", false)
            .expect("encodes");
        assert_eq!(tok.decode_skip_special(&ids).expect("decodes"), "user\nhi");
        let too_big = u32::try_from(tok.vocab_size()).expect("fits");
        assert!(
            tok.decode(&[too_big]).is_err(),
            "{name}: ids past the vocabulary are errors"
        );
    }
}

#[test]
fn streaming_holds_back_split_characters() {
    for name in ["smollm2-135m", "qwen2.5-coder-0.5b"] {
        let Some(tok) = load(name) else { continue };
        let text = "漢字とemoji 🦀👍🏽 — naïve 𝔘𝔫𝔦𝔠𝔬𝔡𝔢\n<|im_end|>";
        let ids = tok.encode(text, false).expect("encodes");
        let partial = ids
            .iter()
            .filter(|&&id| std::str::from_utf8(tok.token_bytes(id).expect("in vocab")).is_err())
            .count();
        assert!(
            partial > 0,
            "{name}: the text must contain tokens that split a character"
        );

        let mut stream = tok.stream();
        let mut out = String::new();
        let mut held_back = 0;
        for &id in &ids {
            let chunk = stream.push(id).expect("known id");
            if stream.pending_len() > 0 {
                held_back += 1;
            }
            assert!(
                !chunk.contains('\u{FFFD}'),
                "{name}: no replacement characters: {chunk:?}"
            );
            out.push_str(&chunk);
        }
        assert_eq!(stream.finish(), "", "{name}: nothing left at the end");
        assert!(
            held_back > 0,
            "{name}: some tokens must have been held back"
        );
        assert_eq!(out, text, "{name}: the stream gives the whole text");

        let mut quiet = tok.stream_skip_special();
        let quiet_out = quiet.push_all(&ids).expect("known ids");
        assert_eq!(quiet_out, text.trim_end_matches("<|im_end|>"));
    }
}

/// The rendered prompts, stated from each template's logic and confirmed by rendering the same
/// templates with Python's jinja2 (`tests/upstream/render_chat_template.py`).
#[test]
fn chat_templates_render_the_expected_prompts() {
    let conversation = [
        Message::system("You are terse."),
        Message::user("2+2?"),
        Message::assistant("4"),
        Message::user("And 3+3?"),
    ];
    let turns = "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n\
                 <|im_start|>assistant\n4<|im_end|>\n<|im_start|>user\nAnd 3+3?<|im_end|>\n";
    let cases = [
        (
            "smollm2-135m",
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n",
        ),
        (
            "qwen2.5-coder-0.5b",
            "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n",
        ),
    ];
    for (name, default_system) in cases {
        let Some(tok) = load(name) else { continue };
        let hello = tok
            .apply_chat_template(&[Message::user("Hello!")], true)
            .expect("renders");
        assert_eq!(
            hello,
            format!("{default_system}<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\n"),
            "{name}"
        );
        let with_prompt = tok
            .apply_chat_template(&conversation, true)
            .expect("renders");
        assert_eq!(
            with_prompt,
            format!("{turns}<|im_start|>assistant\n"),
            "{name}"
        );
        let without = tok
            .apply_chat_template(&conversation, false)
            .expect("renders");
        assert_eq!(without, turns, "{name}");
        // The rendered prompt tokenizes with the chat markers as single tokens.
        let ids = tok.encode(&hello, false).expect("encodes");
        let start = tok.token_to_id("<|im_start|>").expect("exists");
        assert_eq!(ids.iter().filter(|&&i| i == start).count(), 3, "{name}");
    }
}

/// The cases of tests/data/chat_cases.json rendered live by jinja2 (skipped when python3 lacks
/// jinja2).
#[test]
fn chat_templates_match_jinja2() {
    if !common::python_has(&["jinja2"]) {
        assert!(
            !common::require_models(),
            "SPEC_REQUIRE_MODELS=1 but python3 cannot import jinja2 (pip install jinja2)"
        );
        eprintln!("SKIP: python3 with jinja2 not available");
        return;
    }
    let cases_path = common::crate_dir().join("tests/data/chat_cases.json");
    let cases: Vec<serde_json::Value> =
        serde_json::from_str(&std::fs::read_to_string(&cases_path).expect("committed"))
            .expect("JSON");
    let dir = tempfile::tempdir().expect("temp dir");
    for name in ["smollm2-135m", "qwen2.5-coder-0.5b"] {
        let Some(tok) = load(name) else { continue };
        let template = tok.chat_template().expect("the model has a chat template");
        let template_path = dir.path().join(format!("{name}.jinja"));
        std::fs::write(&template_path, template.source()).expect("writes");
        let text = |id: Option<u32>| id.and_then(|i| tok.token_to_piece(i)).unwrap_or_default();
        let expected = common::run_python(
            "render_chat_template.py",
            &[
                template_path.display().to_string(),
                cases_path.display().to_string(),
                text(tok.bos_id()),
                text(tok.eos_ids().first().copied()),
            ],
        );
        let expected = expected.as_array().expect("a list");
        assert_eq!(expected.len(), cases.len());
        for (case, want) in cases.iter().zip(expected) {
            let messages: Vec<Message> =
                serde_json::from_value(case["messages"].clone()).expect("messages");
            let agp = case["add_generation_prompt"].as_bool().expect("bool");
            let got = tok.apply_chat_template(&messages, agp).expect("renders");
            assert_eq!(got, want.as_str().expect("a string"), "{name}: {case}");
        }
    }
}

#[test]
fn qwen_sizes_share_one_vocabulary() {
    let Some(small) = load("qwen2.5-coder-0.5b") else {
        return;
    };
    let Some(large) = load("qwen2.5-coder-1.5b") else {
        return;
    };
    assert_eq!(small.vocab_size(), large.vocab_size());
    assert_eq!(small.first_vocab_difference(&large), None);
    for id in [0, 1000, 151_643, 151_645, 151_935] {
        assert_eq!(small.id_to_token(id), large.id_to_token(id));
    }
    assert_eq!(small.eos_ids(), large.eos_ids());
    // The two templates differ slightly in their tools section (`{{` vs `{` inside a string),
    // but render ordinary conversations identically.
    let conversation = [Message::system("Be brief."), Message::user("Hi")];
    assert_eq!(
        small
            .apply_chat_template(&conversation, true)
            .expect("renders"),
        large
            .apply_chat_template(&conversation, true)
            .expect("renders")
    );
    // And a genuinely different vocabulary is told apart.
    if let Some(smol) = load("smollm2-135m") {
        assert_eq!(small.first_vocab_difference(&smol), Some(0));
    }
}
