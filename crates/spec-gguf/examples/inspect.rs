//! Prints a GGUF file's metadata (long arrays abbreviated), tensor counts per type, and the tensor
//! table of layer 0.
//!
//! `cargo run -p spec-gguf --example inspect -- path/to/model.gguf [--all-tensors]`

use std::collections::BTreeMap;
use std::process::ExitCode;

use spec_gguf::{GgufFile, Value};

fn short(v: &Value) -> String {
    match v {
        Value::Array(items) => {
            let head: Vec<String> = items.iter().take(5).map(short).collect();
            let more = if items.len() > 5 { ", …" } else { "" };
            format!("[{}{more}] (len {})", head.join(", "), items.len())
        }
        Value::String(s) if s.len() > 80 => {
            format!("{:?}… ({} bytes)", &s[..s.floor_char_boundary(80)], s.len())
        }
        Value::String(s) => format!("{s:?}"),
        other => format!("{other:?}"),
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(path) = args.first() else {
        eprintln!("usage: inspect FILE.gguf [--all-tensors]");
        return ExitCode::FAILURE;
    };
    let f = match GgufFile::open(path) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    println!(
        "{path}: GGUF v{}, alignment {}, data at {}, {} bytes",
        f.version(),
        f.alignment(),
        f.data_offset(),
        f.file_len()
    );
    println!("-- metadata ({} keys)", f.metadata().len());
    for (k, v) in f.metadata() {
        println!("{k} = {}", short(v));
    }
    let mut per_type: BTreeMap<String, (usize, u64)> = BTreeMap::new();
    for t in f.tensors() {
        let e = per_type.entry(t.ggml_type.to_string()).or_default();
        e.0 += 1;
        e.1 += t.n_elements();
    }
    println!(
        "-- {} tensors; per type (count, elements):",
        f.tensors().len()
    );
    for (ty, (n, el)) in &per_type {
        println!("{ty}: {n} tensors, {el} elements");
    }
    println!(
        "output.weight present: {}",
        f.tensor("output.weight").is_some()
    );
    let all = args.iter().any(|a| a == "--all-tensors");
    println!(
        "-- tensors{}",
        if all { "" } else { " (non-layer and blk.0)" }
    );
    for t in f.tensors() {
        if all || !t.name.starts_with("blk.") || t.name.starts_with("blk.0.") {
            println!(
                "{:<32} {:<6} dims {:?}",
                t.name,
                t.ggml_type.to_string(),
                t.dims
            );
        }
    }
    ExitCode::SUCCESS
}
