//! Dequantization of the reference models' tensors agrees with the Python `gguf` package.
//!
//! For every ggml type present in each model, up to three tensors (smallest, median, largest)
//! are dequantized here and by `tests/gguf_reference.py`; large tensors are compared on their
//! first and last rows. The small model's tensors are located by `gguf.GGUFReader`, which checks
//! our tensor table as well (`SPEC_GGUF_PY_READER=1` does that for all models). Skips with a message when a model or Python's `gguf` is missing, unless
//! `SPEC_REQUIRE_MODELS=1`.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use spec_gguf::{GgmlType, GgufError, GgufFile, TensorInfo};

const MODELS: [&str; 3] = [
    "smollm2-135m.gguf",
    "qwen2.5-coder-0.5b.gguf",
    "qwen2.5-coder-1.5b.gguf",
];

/// Elements compared per row range (keeps the test to seconds on the 150k-row embeddings).
const MAX_ELEMENTS: u64 = 1 << 21;

fn require() -> bool {
    std::env::var("SPEC_REQUIRE_MODELS").is_ok_and(|v| v == "1")
}

fn skip(msg: &str) {
    assert!(!require(), "SPEC_REQUIRE_MODELS=1 but {msg}");
    eprintln!("SKIP: {msg}");
}

fn models_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("SPEC_MODELS_DIR") {
        return PathBuf::from(d);
    }
    let cache = if cfg!(target_os = "macos") {
        std::env::var_os("HOME").map(|h| PathBuf::from(h).join("Library/Caches"))
    } else {
        std::env::var_os("XDG_CACHE_HOME")
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
    };
    cache
        .unwrap_or_else(|| PathBuf::from(".cache"))
        .join("spec-decode/models")
}

fn python() -> String {
    std::env::var("SPEC_PYTHON").unwrap_or_else(|_| "python3".into())
}

fn python_has_gguf() -> bool {
    Command::new(python())
        .args(["-c", "import gguf, numpy"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Makes `import gguf` work, installing the package if needed; false if that fails.
fn ensure_python_gguf() -> bool {
    if python_has_gguf() {
        return true;
    }
    eprintln!("installing the Python gguf and numpy packages for the reference comparison");
    let _ = Command::new(python())
        .args(["-m", "pip", "install", "--quiet", "gguf", "numpy"])
        .status();
    python_has_gguf()
}

/// One comparison: rows `start..start + n` of a tensor.
struct Case<'a> {
    t: &'a TensorInfo,
    start: u64,
    n: u64,
}

/// Smallest, median and largest tensor of each type; first and last rows of large ones.
fn pick_cases(f: &GgufFile) -> BTreeMap<GgmlType, Vec<Case<'_>>> {
    let mut by_type: BTreeMap<GgmlType, Vec<&TensorInfo>> = BTreeMap::new();
    for t in f.tensors() {
        by_type.entry(t.ggml_type).or_default().push(t);
    }
    let mut out = BTreeMap::new();
    for (ty, mut ts) in by_type {
        ts.sort_by_key(|t| (t.n_elements(), t.name.clone()));
        let mut picks = vec![ts[0], ts[ts.len() / 2], ts[ts.len() - 1]];
        picks.dedup_by_key(|t| t.name.clone());
        let mut cases = Vec::new();
        for t in picks {
            let rows = (MAX_ELEMENTS / t.row_len().max(1)).max(1);
            if rows >= t.n_rows() {
                cases.push(Case {
                    t,
                    start: 0,
                    n: t.n_rows(),
                });
            } else {
                cases.push(Case {
                    t,
                    start: 0,
                    n: rows,
                });
                cases.push(Case {
                    t,
                    start: t.n_rows() - rows,
                    n: rows,
                });
            }
        }
        out.insert(ty, cases);
    }
    out
}

/// Units in the last place between two floats (0 for identical bits or two NaNs).
fn ulps(a: f32, b: f32) -> u32 {
    if a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan()) {
        return 0;
    }
    if a == b {
        return 0; // +0 and -0
    }
    let key = |x: f32| {
        let i = x.to_bits() as i32;
        if i < 0 { i32::MIN - i } else { i }
    };
    key(a).abs_diff(key(b))
}

/// Whether the helper should locate tensors with `gguf.GGUFReader` (checking our tensor table
/// too) rather than at the offsets we computed. The reader takes tens of seconds on a 150k-token
/// vocabulary, so by default only the small model goes through it.
fn use_py_reader(model: &Path) -> bool {
    std::env::var("SPEC_GGUF_PY_READER").is_ok_and(|v| v == "1")
        || model.file_name().is_some_and(|n| n == MODELS[0])
}

/// Runs the Python helper on all cases of one model; returns each case's values.
fn python_reference(f: &GgufFile, model: &Path, cases: &[&Case<'_>], dir: &Path) -> Vec<Vec<f32>> {
    let script = Path::new(&manifest_dir()).join("tests/gguf_reference.py");
    let by_name = use_py_reader(model);
    let mut child = Command::new(python())
        .arg(&script)
        .arg(model)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("start python");
    let mut requests = String::new();
    let mut paths = Vec::new();
    for (i, c) in cases.iter().enumerate() {
        let p = dir.join(format!("case{i}.f32"));
        if by_name {
            // The helper takes the first N rows; ask for start + n and drop the head below.
            requests.push_str(&format!(
                "name {} {} {}\n",
                c.t.name,
                c.start + c.n,
                p.display()
            ));
        } else {
            let offset = f.data_offset() + c.t.offset + c.start * c.t.row_bytes();
            requests.push_str(&format!(
                "raw {} {offset} {} {} {}\n",
                c.t.ggml_type,
                c.n,
                c.t.row_bytes(),
                p.display()
            ));
        }
        paths.push(p);
    }
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(requests.as_bytes())
        .expect("write requests");
    let out = child.wait_with_output().expect("python output");
    assert!(out.status.success(), "python reference helper failed");
    cases
        .iter()
        .zip(paths)
        .map(|(c, p)| {
            let bytes = std::fs::read(&p).expect("read reference output");
            let skip = if by_name {
                (c.start * c.t.row_len()) as usize * 4
            } else {
                0
            };
            bytes[skip..]
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect()
        })
        .collect()
}

#[test]
fn dequantization_matches_python_gguf() {
    let dir = models_dir();
    let present: Vec<PathBuf> = MODELS
        .iter()
        .map(|m| dir.join(m))
        .filter(|p| {
            let ok = p.is_file();
            if !ok {
                skip(&format!("reference model {} is absent", p.display()));
            }
            ok
        })
        .collect();
    if present.is_empty() {
        return;
    }
    if !ensure_python_gguf() {
        skip("the Python gguf package is not importable and could not be installed");
        return;
    }
    let tmp = tempfile::tempdir().expect("tempdir");
    let mut compared = 0usize;
    for path in present {
        let f = match GgufFile::open(&path) {
            Ok(f) => f,
            Err(e @ GgufError::TensorOutOfBounds { .. }) => {
                skip(&format!("{} is incomplete: {e}", path.display()));
                continue;
            }
            Err(e) => panic!("{}: {e}", path.display()),
        };
        let by_type = pick_cases(&f);
        let cases: Vec<&Case<'_>> = by_type.values().flatten().collect();
        let reference = python_reference(&f, &path, &cases, tmp.path());
        println!(
            "{} (tensors located by {}):",
            path.display(),
            if use_py_reader(&path) {
                "gguf.GGUFReader"
            } else {
                "our offsets"
            }
        );
        for (c, want) in cases.iter().zip(reference) {
            let got = if c.start == 0 && c.n == c.t.n_rows() {
                f.dequantize(c.t)
            } else {
                f.dequantize_rows(c.t, c.start, c.n)
            }
            .unwrap_or_else(|e| panic!("{}: {e}", c.t.name));
            assert_eq!(got.len(), want.len(), "{} value count", c.t.name);
            let mut max_abs = 0f32;
            let mut max_ulps = 0u32;
            let mut inexact = 0usize;
            for (&a, &b) in got.iter().zip(&want) {
                let u = ulps(a, b);
                if u > 0 {
                    inexact += 1;
                    max_abs = max_abs.max((a - b).abs());
                }
                max_ulps = max_ulps.max(u);
            }
            println!(
                "  {:<6} {:<28} rows {:>6}..{:<6} {:>8} values  max |diff| {max_abs:e}  max ulps {max_ulps}  inexact {inexact}",
                c.t.ggml_type.to_string(),
                c.t.name,
                c.start,
                c.start + c.n,
                got.len()
            );
            assert!(
                max_ulps <= 1,
                "{} ({}) differs from gguf-py by {max_ulps} ulps (max |diff| {max_abs:e})",
                c.t.name,
                c.t.ggml_type
            );
            compared += 1;
        }
        for (ty, cs) in &by_type {
            let n_tensors = f.tensors().iter().filter(|t| t.ggml_type == *ty).count();
            let distinct = cs
                .iter()
                .map(|c| c.t.name.as_str())
                .collect::<std::collections::BTreeSet<_>>()
                .len();
            assert!(
                distinct >= n_tensors.min(2),
                "{ty}: too few tensors compared"
            );
        }
    }
    println!("{compared} comparisons");
}

/// This package's directory: cargo's run-time `CARGO_MANIFEST_DIR` when set, else the
/// compile-time one. (A target directory shared with a checkout at another path may hold a
/// binary built there, whose compile-time path points into that checkout.)
fn manifest_dir() -> std::path::PathBuf {
    std::env::var_os("CARGO_MANIFEST_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")))
}
