//! Teacher forcing on SmolLM2-135M: its own greedy answer, re-encoded from the answer's text as
//! a dataset reply would be, gives back the same tokens, and teacher-forced through the target
//! the same hidden states, bit for bit; the reply's tokens are those of the chat template's
//! assistant turn.
//! Skips where the model is not cached (fails then under `SPEC_REQUIRE_MODELS=1`).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use burn::backend::Flex;
use spec_runtime::load_model;
use spec_tokenizer::{Message, TextTokenizer};
use spec_train::data::{DistillSettings, PromptEncoder, distill_sequence, teacher_forced_sequence};

const PROMPT: &str = "Explain in two sentences why the sky is blue.";

#[test]
fn smollm2_teacher_forced_answer_matches_its_own() {
    let Ok(path) = spec_models::resolve("smollm2-135m") else {
        assert!(
            std::env::var("SPEC_REQUIRE_MODELS").as_deref() != Ok("1"),
            "SPEC_REQUIRE_MODELS=1 but smollm2-135m is not cached"
        );
        eprintln!("skipping: smollm2-135m is not cached");
        return;
    };
    let target = load_model::<Flex>(&path, &Default::default()).unwrap();
    let tokenizer = TextTokenizer::from_gguf_path(&path).unwrap();
    let settings = DistillSettings {
        max_prompt_tokens: 128,
        max_new_tokens: 48,
        ..DistillSettings::default()
    };
    let prompt = tokenizer.encode_prompt(PROMPT, 128).unwrap();
    let own = distill_sequence(&target.model, &prompt, &settings, tokenizer.stop_tokens()).unwrap();
    let text = tokenizer.decode(own.answer()).unwrap();
    println!("{} answer tokens: {text:?}", own.answer().len());

    let reply = tokenizer.encode_reply(&text).unwrap();
    assert_eq!(reply, own.answer(), "the answer's text re-encoded");
    let forced = teacher_forced_sequence(&target.model, &prompt, &reply, &settings).unwrap();
    assert_eq!(forced.tokens, own.tokens);
    // The host path's rows do not depend on the pass's other rows: the decoding steps' bits.
    let worst = forced
        .hidden
        .iter()
        .zip(&own.hidden)
        .map(|(a, b)| (a - b).abs() / (1.0 + b.abs()))
        .fold(0f32, f32::max);
    assert!(
        forced.hidden == own.hidden,
        "largest relative difference {worst}"
    );

    // The whole conversation rendered with the template starts with prompt and reply.
    let chat = tokenizer
        .apply_chat_template(&[Message::user(PROMPT), Message::assistant(&text)], false)
        .unwrap();
    let whole = tokenizer.encode(&chat, true).unwrap();
    assert_eq!(whole[..forced.tokens.len()], forced.tokens[..]);
}
