//! Shared helpers of the integration tests: locating the cached reference models and the
//! committed test data.
#![allow(dead_code, unreachable_pub)]

use std::path::PathBuf;
use std::process::Command;

/// `$SPEC_MODELS_DIR`, else `<user cache dir>/spec-decode/models` (the same rule as the
/// spec-models crate).
pub fn models_dir() -> Option<PathBuf> {
    match std::env::var_os("SPEC_MODELS_DIR") {
        Some(d) if !d.is_empty() => Some(PathBuf::from(d)),
        _ => dirs::cache_dir().map(|d| d.join("spec-decode").join("models")),
    }
}

/// Whether missing models (or upstream tools) fail the tests instead of skipping them.
pub fn require_models() -> bool {
    std::env::var("SPEC_REQUIRE_MODELS").is_ok_and(|v| v == "1")
}

/// The path of a cached reference model, or `None` (with a printed reason) when it is absent
/// and `SPEC_REQUIRE_MODELS=1` is not set.
pub fn model(name: &str) -> Option<PathBuf> {
    let path = models_dir().map(|d| d.join(format!("{name}.gguf")));
    match path {
        Some(p) if p.is_file() => Some(p),
        other => {
            assert!(
                !require_models(),
                "SPEC_REQUIRE_MODELS=1 but the model {name} is not at {other:?}; fetch it first"
            );
            eprintln!(
                "SKIP: model {name} not found at {other:?} (set SPEC_REQUIRE_MODELS=1 to fail)"
            );
            None
        }
    }
}

/// The crate's directory.
pub fn crate_dir() -> PathBuf {
    manifest_dir()
}

/// The strings every tokenizer comparison runs over.
pub fn strings() -> Vec<String> {
    let text = std::fs::read_to_string(crate_dir().join("tests/data/strings.json"))
        .expect("tests/data/strings.json is committed");
    serde_json::from_str(&text).expect("strings.json is a JSON list of strings")
}

/// Whether `python3` can import all of `modules`.
pub fn python_has(modules: &[&str]) -> bool {
    let code = modules
        .iter()
        .map(|m| format!("import {m}"))
        .collect::<Vec<_>>()
        .join("; ");
    Command::new("python3")
        .args(["-c", &code])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Runs a python script of `tests/upstream` and parses its JSON output.
pub fn run_python(script: &str, args: &[String]) -> serde_json::Value {
    let out = Command::new("python3")
        .arg(crate_dir().join("tests/upstream").join(script))
        .args(args)
        .output()
        .expect("python3 runs");
    assert!(
        out.status.success(),
        "{script} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("the script prints JSON")
}

/// This package's directory: cargo's run-time `CARGO_MANIFEST_DIR` when set, else the
/// compile-time one. (A target directory shared with a checkout at another path may hold a
/// binary built there, whose compile-time path points into that checkout.)
fn manifest_dir() -> std::path::PathBuf {
    std::env::var_os("CARGO_MANIFEST_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")))
}
