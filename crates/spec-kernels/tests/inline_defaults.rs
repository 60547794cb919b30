//! Every default method of the kernels' traits is `#[inline(always)]`.
//!
//! A default method is compiled once, as a function of its own without the target features of
//! the `vectorize` call that runs it; the SIMD intrinsics inlined into it then become calls, one
//! per instruction. Attention's two paired defaults (`Lanes::scores_pair`,
//! `Lanes::weighted_sum_pair`) did so on every CPU without AVX-512, where no override replaces
//! them: plain decoding of SmolLM2 ran at 45.6 tok/s instead of 109.2 on an AVX2-only EPYC
//! (docs/benchmarks.md, fifty-third session). Nothing else catches it: the bits are the same.

use std::path::Path;

/// Whether `line` (trimmed) opens a trait's body.
fn opens_trait(line: &str) -> bool {
    let rest = ["pub(crate) ", "pub(super) ", "pub ", ""]
        .iter()
        .find_map(|visibility| line.strip_prefix(visibility))
        .unwrap_or(line);
    let rest = rest.strip_prefix("unsafe ").unwrap_or(rest);
    rest.starts_with("trait ") && line.ends_with('{')
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
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files: Vec<_> = std::fs::read_dir(&src)
        .expect("the crate's src directory")
        .map(|entry| entry.expect("a directory entry").path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "rs"))
        .collect();
    files.sort();
    let (mut defaults, mut missing) = (0, Vec::new());
    for path in &files {
        let text = std::fs::read_to_string(path).expect("a source file");
        let lines: Vec<&str> = text.lines().collect();
        let mut depth = 0i64;
        // The depth outside the trait being read, if any.
        let mut trait_at: Option<i64> = None;
        for (i, line) in lines.iter().enumerate() {
            let trimmed = line.trim();
            if trait_at.is_none() && opens_trait(trimmed) {
                trait_at = Some(depth);
            } else if trait_at.is_some() && trimmed.starts_with("fn ") && has_body(&lines[i..]) {
                defaults += 1;
                if !attributes_above(&lines[..i]).any(|a| a == "#[inline(always)]") {
                    missing.push(format!("{}:{}: {trimmed}", path.display(), i + 1));
                }
            }
            depth += line.matches('{').count() as i64 - line.matches('}').count() as i64;
            if trait_at.is_some_and(|outside| depth <= outside) {
                trait_at = None;
            }
        }
    }
    // `Lanes`' two pairs, `RoundOps::half_sums`, `IntDot::paired` and `GroupRow`'s three when
    // this was written: fewer means the scan no longer finds them.
    assert!(
        defaults >= 7,
        "found {defaults} default methods in {files:?}"
    );
    assert!(
        missing.is_empty(),
        "default methods without #[inline(always)]:\n{}",
        missing.join("\n")
    );
}
