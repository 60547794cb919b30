//! The cases of `benches/verify.rs`, timed by hand: minimum, first quartile and median of `n`
//! runs each. On a machine shared with other work the minimum is the figure least disturbed by
//! it, so A/B comparisons of the verification step are best made with this.
//!
//! Run: `cargo run --release -p spec-benches --example step_timings -- [filter] [runs]`, e.g.
//! `-- top_p 60` for the top-p cases only.

// A failure in a test or measurement helper is a failure of the run.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Instant;

#[path = "../common/verify_cases.rs"]
mod verify_cases;

fn time(name: &str, runs: usize, mut f: impl FnMut()) {
    for _ in 0..3 {
        f();
    }
    let mut ms: Vec<f64> = (0..runs)
        .map(|_| {
            let start = Instant::now();
            f();
            start.elapsed().as_secs_f64() * 1e3
        })
        .collect();
    ms.sort_by(f64::total_cmp);
    println!(
        "{name:45} min {:8.3}  q1 {:8.3}  median {:8.3} ms",
        ms[0],
        ms[runs / 4],
        ms[runs / 2]
    );
}

fn main() {
    let filter = std::env::args().nth(1).unwrap_or_default();
    let runs: usize = std::env::args()
        .nth(2)
        .and_then(|s| s.parse().ok())
        .unwrap_or(40)
        .max(1);
    for mut case in verify_cases::cases() {
        let label = format!("verify/{}/{}", case.name, case.vocab);
        if label.contains(&filter) {
            time(&label, runs, || case.verify());
        }
        let label = format!("draft_probabilities/{}/{}", case.name, case.vocab);
        if case.samples() && label.contains(&filter) {
            time(&label, runs, || case.draft_probabilities());
        }
    }
}
