//! `report.json`: everything a run measured (schema in `docs/bench-report.md`).

use std::collections::BTreeMap;

use serde::Serialize;

use super::machine::{Machine, SpanTileRuns};
use super::prompts::BenchPrompt;
use super::records::{Mismatch, RunRecord};
use super::summary::Summary;

/// A loaded target model (for the report).
#[derive(Debug, Clone, Serialize)]
pub(super) struct ModelInfo {
    pub(super) target: String,
    pub(super) path: String,
    /// How the target's projections were kept (`--weights`).
    pub(super) weights: String,
    pub(super) load_seconds: f64,
    pub(super) max_new_tokens: usize,
    /// Indices into the report's `prompts` this target ran.
    pub(super) prompts: Vec<usize>,
    pub(super) methods: Vec<String>,
    pub(super) setup_seconds: BTreeMap<String, f64>,
}

/// The whole `report.json` (schema in `docs/bench-report.md`).
#[derive(Debug, Serialize)]
pub(super) struct Report {
    pub(super) schema_version: u32,
    pub(super) started_unix: u64,
    pub(super) started_utc: String,
    pub(super) total_seconds: f64,
    pub(super) command: Vec<String>,
    pub(super) machine: Machine,
    pub(super) span_tiles: Vec<SpanTileRuns>,
    pub(super) prompts_file: String,
    pub(super) prompts: Vec<BenchPrompt>,
    pub(super) temperature: f64,
    pub(super) seed: u64,
    pub(super) repeats: usize,
    pub(super) greedy: bool,
    pub(super) memory_metric: &'static str,
    pub(super) skipped_methods: Vec<String>,
    pub(super) models: Vec<ModelInfo>,
    pub(super) summaries: Vec<Summary>,
    pub(super) mismatches: Vec<Mismatch>,
    pub(super) runs: Vec<RunRecord>,
}

/// `2026-11-22T22:10:03Z`, or `20261122-221003` for folder names.
pub(super) fn utc_stamp(unix: u64, compact: bool) -> String {
    let (days, rem) = ((unix / 86_400) as i64, unix % 86_400);
    let (h, mi, se) = (rem / 3600, rem % 3600 / 60, rem % 60);
    // Civil date from days since 1970-01-01 (the proleptic Gregorian calendar).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    if compact {
        format!("{y:04}{m:02}{d:02}-{h:02}{mi:02}{se:02}")
    } else {
        format!("{y:04}-{m:02}-{d:02}T{h:02}:{mi:02}:{se:02}Z")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utc_stamps_are_civil_dates() {
        assert_eq!(utc_stamp(0, false), "1970-01-01T00:00:00Z");
        assert_eq!(utc_stamp(951_782_400, false), "2000-02-29T00:00:00Z");
        assert_eq!(utc_stamp(1_795_385_403, true), "20261122-221003");
    }
}
