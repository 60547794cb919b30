//! `spec generate` on input it must refuse, run as a program on the CPU backend: each run exits
//! with status 1 and one line on stderr, `error: ` and what is wrong, never a panic or an
//! error chain over several lines. Cases that need the reference models (in
//! `~/.cache/spec-decode/models`) are skipped with a note where they are missing, and fail then
//! under `SPEC_REQUIRE_MODELS=1`.

use std::process::{Command, Output};

/// `spec generate --backend flex` with `args`.
fn generate(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_spec"))
        .args(["generate", "--backend", "flex"])
        .args(args)
        .env("RUST_BACKTRACE", "1")
        .output()
        .expect("running spec")
}

/// The one line of a run that failed cleanly, without its `error: `.
fn error_line(output: &Output) -> String {
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(!stderr.contains("Caused by"), "{stderr}");
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "{stderr}");
    let Some(message) = lines[0].strip_prefix("error: ") else {
        panic!("{stderr}");
    };
    message.to_owned()
}

/// The error of `spec generate` with a prompt and `args`, which must contain `says`.
fn refuses(args: &[&str], says: &str) -> String {
    let mut all = vec!["--prompt", "Hello"];
    all.extend_from_slice(args);
    let message = error_line(&generate(&all));
    assert!(message.contains(says), "{args:?}: {message}");
    message
}

/// A reference model's path, or `None` (with a note) where it is not fetched; under
/// `SPEC_REQUIRE_MODELS=1` a missing model fails the test.
fn reference(name: &str) -> Option<String> {
    match spec_models::resolve(name) {
        Ok(path) => Some(path.display().to_string()),
        Err(e) => {
            assert!(
                std::env::var("SPEC_REQUIRE_MODELS").as_deref() != Ok("1"),
                "SPEC_REQUIRE_MODELS=1 but {e}"
            );
            eprintln!("skipping: {e} (`cargo xtask fetch-models {name}`)");
            None
        }
    }
}

/// A model path that does not exist: what the cases that fail before loading one are given.
const NO_MODEL: &str = "/nonexistent/model.gguf";

#[test]
fn invalid_sampling_settings() {
    refuses(
        &["--model", NO_MODEL, "--top-p", "2"],
        "invalid sampling settings",
    );
    refuses(
        &["--model", NO_MODEL, "--temperature", "-1"],
        "invalid sampling settings",
    );
    refuses(
        &["--model", NO_MODEL, "--min-p", "-0.5"],
        "invalid sampling settings",
    );
    // Too small to divide f32 logits by: refused, naming the smallest usable temperature.
    refuses(
        &["--model", NO_MODEL, "--temperature", "1e-300"],
        "below the smallest usable temperature",
    );
}

#[test]
fn an_empty_prompt() {
    let message = error_line(&generate(&["--model", NO_MODEL, "--prompt", ""]));
    assert!(message.contains("the prompt is empty"), "{message}");
    let message = error_line(&generate(&["--model", NO_MODEL]));
    assert!(message.contains("--prompt"), "{message}");
}

#[test]
fn a_missing_model_file() {
    refuses(
        &["--model", NO_MODEL],
        "is neither an existing file nor a reference model",
    );
}

#[test]
fn a_truncated_model_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("truncated.gguf");
    // The first 4 KiB of a reference model, as a download cut short leaves it; without one, a
    // GGUF header that ends inside its metadata.
    let bytes = match spec_models::resolve("smollm2-135m") {
        Ok(model) => std::fs::read(model).unwrap()[..4096].to_vec(),
        Err(_) => {
            let mut bytes = b"GGUF".to_vec();
            bytes.extend_from_slice(&3u32.to_le_bytes());
            bytes.extend_from_slice(&1u64.to_le_bytes());
            bytes.extend_from_slice(&20u64.to_le_bytes());
            bytes.extend_from_slice(&[7, 0, 0]);
            bytes
        }
    };
    std::fs::write(&path, bytes).unwrap();
    let message = refuses(&["--model", path.to_str().unwrap()], "truncated.gguf");
    assert!(message.starts_with("reading "), "{message}");
}

#[test]
fn a_draft_with_another_vocabulary() {
    let (Some(target), Some(draft)) = (reference("smollm2-135m"), reference("qwen2.5-coder-0.5b"))
    else {
        return;
    };
    let message = refuses(
        &[
            "--model",
            &target,
            "--method",
            "sampling",
            "--draft-model",
            &draft,
            "--max-new-tokens",
            "4",
        ],
        "setting up sampling:draft=",
    );
    assert!(message.contains("tokenizers differ"), "{message}");
}

#[test]
fn medusa_heads_that_are_missing_broken_or_of_another_model() {
    let Some(target) = reference("smollm2-135m") else {
        return;
    };
    let dir = tempfile::tempdir().expect("a temporary folder");
    let medusa = |heads: &std::path::Path, says: &str| {
        let method = format!("medusa:heads={}", heads.display());
        refuses(
            &[
                "--model",
                &target,
                "--method",
                &method,
                "--max-new-tokens",
                "4",
            ],
            says,
        )
    };
    let missing = dir.path().join("missing.safetensors");
    medusa(&missing, "missing.safetensors");
    let junk = dir.path().join("junk.safetensors");
    std::fs::write(&junk, b"not a heads file").expect("writing");
    medusa(&junk, "not a heads file");
    // Heads of SmolLM2's shape, but trained for another file.
    let other = dir.path().join("other.safetensors");
    let device = Default::default();
    let heads = spec_medusa::MedusaHeads::<burn::backend::Flex>::new(1, 576, None, &device);
    let info = spec_medusa::HeadsInfo {
        format: spec_medusa::file::FORMAT,
        heads: 1,
        own_projections: false,
        target: spec_train::identity::TargetIdentity {
            hidden_size: 576,
            vocab_size: 49152,
            fingerprint: "0".repeat(64),
        },
        rank_accuracy: vec![vec![0.5]],
        training: serde_json::Value::Null,
        draft_vocab: None,
    };
    spec_medusa::file::save(&heads, &info, &other).expect("saving heads");
    medusa(
        &other,
        "heads of another model: fingerprint 000000000000 against the target's",
    );
}

#[test]
fn a_draft_length_of_zero() {
    refuses(
        &["--model", NO_MODEL, "--method", "prompt-lookup", "--k", "0"],
        "prompt-lookup: k=0: the draft length must be at least 1",
    );
    refuses(
        &["--model", NO_MODEL, "--method", "sampling:draft=x:k=0"],
        "sampling: k=0:",
    );
}

#[test]
fn an_unknown_or_reserved_method() {
    refuses(
        &["--model", NO_MODEL, "--method", "nope"],
        "unknown method `nope` (known: plain, prompt-lookup, bigram, sampling, tree, medusa; \
         reserved, not built yet: early-exit, layer-skip)",
    );
    refuses(
        &["--model", NO_MODEL, "--method", "layer-skip"],
        "`layer-skip` is reserved for LayerSkip self-speculative decoding, not built yet",
    );
    refuses(
        &["--model", NO_MODEL, "--method", "medusa"],
        "medusa needs heads=FILE",
    );
    refuses(
        &[
            "--model",
            NO_MODEL,
            "--method",
            "sampling:draft=x:online=on",
        ],
        "not built yet",
    );
}

#[test]
fn an_unknown_key() {
    refuses(
        &[
            "--model",
            NO_MODEL,
            "--method",
            "bigram:bigram=b.bin:depth=3",
        ],
        "`depth` is not a setting of bigram (its keys: bigram, k)",
    );
    refuses(
        &["--model", NO_MODEL, "--method", "sampling:k"],
        "`k` is not key=value",
    );
    refuses(
        &["--model", NO_MODEL, "--method", "sampling"],
        "sampling needs draft=MODEL (--draft-model",
    );
}

#[test]
fn a_flag_the_method_does_not_use() {
    refuses(
        &[
            "--model",
            NO_MODEL,
            "--method",
            "prompt-lookup",
            "--draft-model",
            "qwen2.5-coder-0.5b",
        ],
        "`--draft-model` is not a setting of prompt-lookup (its keys: k, ngram-max, ngram-min, \
         history)",
    );
    refuses(
        &["--model", NO_MODEL, "--k", "3"],
        "`--k` is not a setting of plain (it takes none)",
    );
    refuses(
        &[
            "--model",
            NO_MODEL,
            "--method",
            "sampling:draft=a",
            "--draft-model",
            "b",
        ],
        "`draft` is given twice (in --method and as --draft-model)",
    );
}

#[test]
fn more_new_tokens_than_the_context_holds() {
    let Some(model) = reference("smollm2-135m") else {
        return;
    };
    // SmolLM2-135M's context is 8,192 positions.
    for new_tokens in ["18446744073709551615", "8192"] {
        let message = refuses(
            &["--model", &model, "--max-new-tokens", new_tokens],
            "the request exceeds the model's context",
        );
        assert!(
            message.contains(&format!("+ {new_tokens} new tokens > 8192")),
            "{message}"
        );
    }
}
