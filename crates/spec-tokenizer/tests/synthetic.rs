//! Tests on a small hand-made byte-level vocabulary (no model files needed): construction
//! errors, special tokens, BOS handling, streaming across split characters, and the
//! tokenizer.json path.

use spec_tokenizer::{
    GgufTokenizerData, Message, TextTokenizer, TokenKind, TokenizerError, token_type,
};

/// The GPT-2 byte alphabet in byte order, computed independently of the crate.
fn byte_chars() -> Vec<char> {
    let mut kept: Vec<u32> = (u32::from(b'!')..=u32::from(b'~')).collect();
    kept.extend(0xA1..=0xAC);
    kept.extend(0xAE..=0xFF);
    let mut next = 256;
    (0u32..256)
        .map(|b| {
            if kept.contains(&b) {
                char::from_u32(b).expect("valid")
            } else {
                next += 1;
                char::from_u32(next - 1).expect("valid")
            }
        })
        .collect()
}

const BOS: u32 = 259;
const EOS: u32 = 260;
const ENDOFTEXT: u32 = 261;
const TOOL: u32 = 262;
const PAD: u32 = 263;

fn data() -> GgufTokenizerData {
    let mut tokens: Vec<String> = byte_chars().iter().map(char::to_string).collect();
    let mut types = vec![token_type::NORMAL; 256];
    for (t, ty) in [
        ("Ġt", token_type::NORMAL),                // 256
        ("he", token_type::NORMAL),                // 257
        ("Ġthe", token_type::NORMAL),              // 258
        ("<|im_start|>", token_type::CONTROL),     // 259
        ("<|im_end|>", token_type::CONTROL),       // 260
        ("<|endoftext|>", token_type::CONTROL),    // 261
        ("<tool_call>", token_type::USER_DEFINED), // 262
        ("[PAD263]", token_type::UNUSED),          // 263
    ] {
        tokens.push(t.to_owned());
        types.push(ty);
    }
    GgufTokenizerData {
        model: "gpt2".to_owned(),
        pre: Some("qwen2".to_owned()),
        tokens,
        token_types: types,
        merges: vec!["Ġ t".to_owned(), "h e".to_owned(), "Ġt he".to_owned()],
        bos_token_id: Some(BOS),
        eos_token_id: Some(EOS),
        eot_token_id: None,
        padding_token_id: Some(ENDOFTEXT),
        add_bos_token: Some(false),
        add_eos_token: None,
        chat_template: Some(
            "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}\
             {% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
                .to_owned(),
        ),
    }
}

fn tok() -> TextTokenizer {
    data().build().expect("the synthetic tokenizer builds")
}

#[test]
fn merges_special_tokens_and_kinds() {
    let tok = tok();
    assert_eq!(tok.vocab_size(), 264);
    // " the" merges fully; "the" (no space) only to t + he; digits stay single.
    assert_eq!(tok.encode(" the", false).expect("ok"), [258]);
    assert_eq!(
        tok.encode("the", false).expect("ok"),
        [u32::from(b't'), 257]
    );
    let ids = tok
        .encode("<|im_start|>x<tool_call><|im_end|>[PAD263]", false)
        .expect("ok");
    assert_eq!(&ids[..4], [BOS, u32::from(b'x'), TOOL, EOS]);
    assert!(
        ids.len() > 5,
        "unused entries are not matched in text: {ids:?}"
    );
    assert_eq!(tok.token_kind(TOOL), Some(TokenKind::UserDefined));
    assert_eq!(tok.token_kind(PAD), Some(TokenKind::Unused));
    assert_eq!(tok.eos_ids(), &[EOS, ENDOFTEXT]);
    assert_eq!(tok.pad_id(), Some(ENDOFTEXT));
    assert_eq!(
        tok.decode_skip_special(&[BOS, 258, TOOL, EOS]).expect("ok"),
        " the<tool_call>"
    );
    assert_eq!(
        tok.apply_chat_template(&[Message::user("hi")], true)
            .expect("renders"),
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    );
}

#[test]
fn bos_and_eos_are_added_only_when_asked() {
    let mut d = data();
    d.add_bos_token = Some(true);
    d.add_eos_token = Some(true);
    let tok = d.build().expect("builds");
    assert!(tok.adds_bos());
    assert_eq!(tok.encode(" the", true).expect("ok"), [BOS, 258, EOS]);
    assert_eq!(tok.encode(" the", false).expect("ok"), [258]);
}

#[test]
fn streaming_waits_for_whole_characters() {
    let tok = tok();
    // Every byte is its own token here, so each multi-byte character spans several tokens.
    let text = "a€😀é";
    let ids = tok.encode(text, false).expect("ok");
    assert_eq!(ids.len(), text.len());
    let mut stream = tok.stream();
    let chunks: Vec<String> = ids.iter().map(|&id| stream.push(id).expect("ok")).collect();
    assert_eq!(chunks, ["a", "", "", "€", "", "", "", "😀", "", "é"]);
    assert_eq!(stream.finish(), "");

    // An unfinished character at the end comes out as one U+FFFD from finish.
    let mut stream = tok.stream();
    assert_eq!(stream.push_all(&ids[..3]).expect("ok"), "a");
    assert_eq!(stream.pending_len(), 2);
    assert_eq!(stream.finish(), "\u{FFFD}");
    assert_eq!(stream.pending_len(), 0);

    // A broken sequence followed by ASCII: replaced, and the ASCII is not held back; the
    // streamed text equals decode of the same ids.
    let broken = [ids[1], ids[2], u32::from(b'z')];
    let mut stream = tok.stream();
    let streamed = stream.push_all(&broken).expect("ok") + &stream.finish();
    assert_eq!(streamed, "\u{FFFD}z");
    assert_eq!(tok.decode(&broken).expect("ok"), streamed);

    assert!(matches!(
        stream.push(10_000),
        Err(TokenizerError::UnknownId { id: 10_000, .. })
    ));
}

#[test]
fn bad_metadata_is_reported_clearly() {
    let mut d = data();
    d.pre = Some("llama-bpe".to_owned());
    let msg = d.build().expect_err("unknown pre").to_string();
    assert!(
        msg.contains("`llama-bpe`") && msg.contains("tokenizer.ggml.pre"),
        "{msg}"
    );

    let mut d = data();
    d.pre = None;
    assert!(matches!(
        d.build(),
        Err(TokenizerError::UnsupportedPreTokenizer { .. })
    ));

    let mut d = data();
    d.model = "llama".to_owned();
    assert!(matches!(
        d.build(),
        Err(TokenizerError::UnsupportedModel { .. })
    ));

    let mut d = data();
    d.token_types.pop();
    assert!(matches!(
        d.build(),
        Err(TokenizerError::LengthMismatch { .. })
    ));

    let mut d = data();
    d.eos_token_id = Some(264);
    assert!(matches!(
        d.build(),
        Err(TokenizerError::IdOutOfRange { id: 264, .. })
    ));

    let mut d = data();
    d.merges.push("nospace".to_owned());
    assert!(matches!(
        d.build(),
        Err(TokenizerError::BadMerge { index: 3, .. })
    ));

    let mut d = data();
    d.tokens[257] = "Ġt".to_owned();
    assert!(matches!(
        d.build(),
        Err(TokenizerError::DuplicateToken {
            first: 256,
            second: 257,
            ..
        })
    ));

    let mut d = data();
    d.chat_template = Some("{% if %}".to_owned());
    assert!(matches!(d.build(), Err(TokenizerError::Template(_))));
}

#[test]
fn tokenizer_json_round_trip_with_config() {
    let tok = tok();
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("tokenizer.json");
    tok.inner()
        .save(&path, false)
        .expect("the built tokenizer serializes");
    std::fs::write(
        dir.path().join("tokenizer_config.json"),
        r#"{"bos_token": "<|im_start|>", "eos_token": {"content": "<|im_end|>"},
            "chat_template": [{"name": "tool_use", "template": "x"}, {"name": "default", "template": "{{ messages[0].content }}!"}]}"#,
    )
    .expect("writes");
    let loaded = TextTokenizer::from_tokenizer_json(&path).expect("loads");
    assert_eq!(loaded.vocab_size(), tok.vocab_size());
    // The only difference: GGUF's unused slot decodes to nothing (as in llama.cpp), while
    // tokenizer.json has no notion of unused entries and keeps its text.
    assert_eq!(loaded.first_vocab_difference(&tok), Some(PAD));
    assert_eq!(tok.token_bytes(PAD), Some(&b""[..]));
    assert_eq!(loaded.token_bytes(PAD), Some(&b"[PAD263]"[..]));
    for s in [
        "<|im_start|>user\n the €😀 12\n\n  x<tool_call>",
        "the   the",
    ] {
        let ids = tok.encode(s, false).expect("ok");
        assert_eq!(loaded.encode(s, false).expect("ok"), ids, "{s:?}");
        assert_eq!(loaded.decode(&ids).expect("ok"), s);
    }
    assert_eq!(loaded.bos_id(), Some(BOS));
    assert_eq!(loaded.eos_ids(), &[EOS, ENDOFTEXT]);
    assert_eq!(
        loaded
            .apply_chat_template(&[Message::user("hey")], false)
            .expect("renders"),
        "hey!"
    );

    // Without a config: no template, end-of-turn control tokens still found.
    std::fs::remove_file(dir.path().join("tokenizer_config.json")).expect("removes");
    let bare = TextTokenizer::from_tokenizer_json(&path).expect("loads");
    assert_eq!(bare.eos_ids(), &[EOS, ENDOFTEXT]);
    assert!(matches!(
        bare.apply_chat_template(&[], false),
        Err(TokenizerError::NoChatTemplate)
    ));
    assert!(matches!(
        TextTokenizer::from_tokenizer_json(dir.path().join("missing.json")),
        Err(TokenizerError::Io { .. })
    ));
}
