//! Every default method of the kernels' traits is `#[inline(always)]`.
//!
//! A default method is compiled once, as a function of its own without the target features of
//! the `vectorize` call that runs it; the SIMD intrinsics inlined into it then become calls, one
//! per instruction. Without the attribute, attention's two paired defaults (`Lanes::scores_pair`,
//! `Lanes::weighted_sum_pair`) do so on every CPU without AVX-512, where no override replaces
//! them: plain decoding of SmolLM2 ran at 45.6 tok/s instead of 109.2 on an AVX2-only EPYC
//! (b112953; docs/notes/self-draft-overhead.md, "Trait defaults inlined"). Nothing else catches
//! it: the bits are the same.
//!
//! The scan reads every `.rs` file under the crate's `src`, module directories included (the
//! AVX2 kernel's traits lie in `src/avx2/`, attention's `Lanes` in `src/ops/`).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// The name of the trait whose body `line` (trimmed) opens, if it opens one.
fn opens_trait(line: &str) -> Option<&str> {
    let rest = ["pub(crate) ", "pub(super) ", "pub ", ""]
        .iter()
        .find_map(|visibility| line.strip_prefix(visibility))
        .unwrap_or(line);
    let rest = rest.strip_prefix("unsafe ").unwrap_or(rest);
    let name = rest
        .strip_prefix("trait ")
        .filter(|_| line.ends_with('{'))?;
    name.split(|c: char| !c.is_alphanumeric() && c != '_')
        .next()
}

/// The `.rs` files under `dir`, in every subdirectory, sorted.
fn sources(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).expect("a source directory") {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            files.extend(sources(&path));
        } else if path.extension().is_some_and(|ext| ext == "rs") {
            files.push(path);
        }
    }
    files.sort();
    files
}

/// Whether the `fn` whose signature starts at `lines[0]` has a body (a default) rather than
/// ending in `;`.
fn has_body(lines: &[&str]) -> bool {
    lines
        .iter()
        .map(|line| line.trim_end())
        .find(|line| line.ends_with('{') || line.ends_with(';'))
        .is_some_and(|line| line.ends_with('{'))
}

/// The attribute and comment lines (`//` and `///`) right above `lines`' end.
fn attributes_above<'a>(lines: &[&'a str]) -> impl Iterator<Item = &'a str> {
    lines
        .iter()
        .rev()
        .map(|line| line.trim())
        .take_while(|line| line.starts_with("#[") || line.starts_with("//"))
}

#[test]
fn every_default_method_of_a_kernel_trait_is_inline_always() {
    let files = sources(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"));
    let (mut defaults, mut missing) = (0, Vec::new());
    // The traits in which a default method was found.
    let mut with_defaults = BTreeSet::new();
    for path in &files {
        let text = std::fs::read_to_string(path).expect("a source file");
        let lines: Vec<&str> = text.lines().collect();
        let mut depth = 0i64;
        // The trait being read and the depth outside it, if any.
        let mut trait_at: Option<(&str, i64)> = None;
        for (i, line) in lines.iter().enumerate() {
            let trimmed = line.trim();
            if let (None, Some(name)) = (trait_at, opens_trait(trimmed)) {
                trait_at = Some((name, depth));
            } else if let Some((name, _)) = trait_at
                && trimmed.starts_with("fn ")
                && has_body(&lines[i..])
            {
                defaults += 1;
                with_defaults.insert(name.to_owned());
                if !attributes_above(&lines[..i]).any(|a| a == "#[inline(always)]") {
                    missing.push(format!("{}:{}: {trimmed}", path.display(), i + 1));
                }
            }
            depth += line.matches('{').count() as i64 - line.matches('}').count() as i64;
            if trait_at.is_some_and(|(_, outside)| depth <= outside) {
                trait_at = None;
            }
        }
    }
    // `Lanes`' two pairs (ops/lanes.rs), `RoundOps::half_sums` (activations.rs), `Row::hint`
    // (avx2/rows.rs), `IntDot::paired` and `GroupRow`'s three (avx2/grouped.rs): fewer, or one
    // of these traits missing, means the scan misses them.
    let expected = ["GroupRow", "IntDot", "Lanes", "RoundOps", "Row"];
    assert!(
        defaults >= 8 && expected.iter().all(|name| with_defaults.contains(*name)),
        "found {defaults} default methods, in {with_defaults:?}, in {files:?}"
    );
    assert!(
        missing.is_empty(),
        "default methods without #[inline(always)]:\n{}",
        missing.join("\n")
    );
}
