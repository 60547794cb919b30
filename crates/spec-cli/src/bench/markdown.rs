//! `report.md` and the plots' data, rendered from a [`Report`].

use std::collections::BTreeSet;
use std::fmt::Write as _;

use super::report::Report;
use super::summary::{DraftBound, Summary, plain_drift, round_trip_spread};

pub(super) fn opt(value: Option<f64>, digits: usize) -> String {
    value.map_or_else(|| "–".to_owned(), |v| format!("{v:.digits$}"))
}

pub(super) fn render_markdown(report: &Report, categories: &[String]) -> String {
    let mut s = String::new();
    let m = &report.machine;
    let _ = writeln!(s, "# spec bench — {}\n", report.started_utc);
    let _ = writeln!(
        s,
        "- machine: {} ({} cores{}), {}; kernels {}; backend {}; GPU: {}",
        m.cpu,
        m.cores,
        m.memory_bytes
            .map(|b| format!(", {:.1} GiB", b as f64 / (1u64 << 30) as f64))
            .unwrap_or_default(),
        m.os,
        m.kernels,
        m.backend,
        m.gpu.as_deref().unwrap_or("none")
    );
    let _ = writeln!(
        s,
        "- prompts: {} from `{}` ({} categories); temperature {}{}; seed {}; repeats {}",
        report.prompts.len(),
        report.prompts_file,
        categories.len(),
        report.temperature,
        if report.greedy { " (greedy)" } else { "" },
        report.seed,
        report.repeats
    );
    for model in &report.models {
        let _ = writeln!(
            s,
            "- target `{}` ({}, weights {}), loaded in {:.1} s: {} prompts, {} new tokens each; {}",
            model.target,
            model.path,
            model.weights,
            model.load_seconds,
            model.prompts.len(),
            model.max_new_tokens,
            model.methods.join(", ")
        );
    }
    for drift in plain_drift(&report.runs) {
        let _ = writeln!(
            s,
            "- plain decoding on `{}`, before the methods / after them: {:.2} / {:.2} tok/s, \
             decode {:.2} / {:.2} tok/s (means over prompts; the baseline is both runs)",
            drift.target, drift.before.0, drift.after.0, drift.before.1, drift.after.1
        );
    }
    if let Some((low, median, high)) = round_trip_spread(&report.runs) {
        let _ = writeln!(
            s,
            "- two threads' core round trip before and after each run: {low:.0}-{high:.0} ns, \
             median {median:.0} (`core_round_trip_ns` in report.json: where the threads sat)"
        );
    }
    if !report.span_tiles.is_empty() {
        let rows: Vec<String> = report
            .span_tiles
            .iter()
            .map(|r| {
                let tiles: Vec<String> = r.tiles.iter().map(|(t, n)| format!("{t} {n}")).collect();
                format!("{} rows: {}", r.rows_of_x, tiles.join(", "))
            })
            .collect();
        let _ = writeln!(
            s,
            "- CPU products of f32 rows in spans, tiles picked by timing (products run): {}",
            rows.join("; ")
        );
    }
    for note in &report.skipped_methods {
        let _ = writeln!(s, "- skipped {note}");
    }
    let _ = writeln!(
        s,
        "- total time {:.0} s\n\nspeedup = mean per-prompt tok/s ÷ plain decoding's on the same \
         target; τ = tokens per target forward; α = accepted ÷ drafted; tok/s includes prefill; \
         decode speedup = the same ratio of tokens per second after the first step (prefill and \
         the first step, which may give several tokens, excluded).\n",
        report.total_seconds
    );
    if report.summaries.iter().any(|x| x.draft_bound.is_some()) {
        let _ = writeln!(
            s,
            "Draft-model methods: α tested = accepted ÷ (accepted + rejections), the drafts \
             after a rejection not counted; K = mean drafted tokens per step (a fixed K's last \
             step drafts only the tokens left); c = mean time of one draft-model step (forward \
             and sampling) ÷ mean time of one plain decode step of the same target in this run; \
             bound = E[τ] ÷ (K·c + 1) with E[τ] = (1 − α^(K+1)) ÷ (1 − α) at each step's own K, \
             averaged over the steps, α tested (Leviathan et al. 2023, Theorem 3.8); τ ÷ E[τ] \
             below 1: the steps yielded fewer tokens than independent acceptances at that α \
             would; speedup ÷ bound includes the prefill; decode ÷ bound does not (nor does the \
             bound), and pools like the bound: Σ tokens ÷ Σ seconds after the first step, over \
             the row's runs, against the same of plain decoding; v = mean time of one \
             verification step ÷ that of a plain step (the bound takes 1); with v = E[τ] ÷ \
             (K·c + v).\n"
        );
    }

    let _ = writeln!(s, "## Speedup by category\n");
    let _ = write!(s, "| target | method |");
    for c in categories {
        let _ = write!(s, " {c} |");
    }
    let _ = writeln!(s, " all |");
    let _ = writeln!(s, "|---|---|{}---|", "---|".repeat(categories.len()));
    let mut keys: Vec<(&str, &str)> = Vec::new();
    for x in &report.summaries {
        if !keys.contains(&(x.target.as_str(), x.method.as_str())) {
            keys.push((&x.target, &x.method));
        }
    }
    let find = |t: &str, me: &str, c: &str| {
        report
            .summaries
            .iter()
            .find(|x| x.target == t && x.method == me && x.category == c)
    };
    for (t, me) in &keys {
        let _ = write!(s, "| {t} | {me} |");
        for c in categories.iter().map(String::as_str).chain(["all"]) {
            let cell = find(t, me, c).map_or("–".to_owned(), |x| {
                x.speedup.map_or("–".into(), |v| format!("{v:.2}×"))
            });
            let _ = write!(s, " {cell} |");
        }
        let _ = writeln!(s);
    }

    let _ = writeln!(s, "\n## Details\n");
    let _ = writeln!(
        s,
        "| target | method | category | speedup | τ | α | tok/s | decode speedup | mismatches \
         | runs | peak RSS MiB |"
    );
    let _ = writeln!(s, "|---|---|---|---|---|---|---|---|---|---|---|");
    for x in &report.summaries {
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {} | {:.2} | {} | {} | {} | {} |",
            x.target,
            x.method,
            x.category,
            x.speedup.map_or("–".into(), |v| format!("{v:.2}×")),
            opt(x.tau, 2),
            opt(x.alpha, 2),
            x.tokens_per_second,
            x.decode_speedup.map_or("–".into(), |v| format!("{v:.2}×")),
            if report.greedy && !x.plain {
                x.mismatches.to_string()
            } else {
                "–".into()
            },
            x.runs,
            x.max_peak_rss_bytes
                .map_or("–".into(), |b| format!("{:.0}", b as f64 / 1048576.0)),
        );
    }

    let bounded: Vec<(&Summary, &DraftBound)> = report
        .summaries
        .iter()
        .filter_map(|x| Some((x, x.draft_bound.as_ref()?)))
        .collect();
    if !bounded.is_empty() {
        let _ = writeln!(s, "\n## Draft-model methods against the bound\n");
        let _ = writeln!(
            s,
            "| target | method | category | τ | α tested | K | c | E[τ] | τ ÷ E[τ] | bound \
             | speedup ÷ bound | decode ÷ bound | v | with v |"
        );
        let _ = writeln!(
            s,
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
        );
        for (x, b) in bounded {
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} | {:.2} | {:.2} | {:.3} | {:.2} | {:.2} | {:.2}× | {} | {} \
                 | {:.2} | {:.2}× |",
                x.target,
                x.method,
                x.category,
                opt(x.tau, 2),
                b.alpha,
                b.k,
                b.cost_ratio,
                b.expected_tau,
                b.tau_over_expected,
                b.speedup_bound,
                opt(b.achieved_over_bound, 2),
                opt(b.decode_over_bound, 2),
                b.verify_ratio,
                b.bound_with_verify,
            );
        }
    }

    let drafting: Vec<&Summary> = report
        .summaries
        .iter()
        .filter(|x| x.category == "all" && !x.acceptance_by_position.is_empty())
        .collect();
    if !drafting.is_empty() {
        let _ = writeln!(s, "\n## Acceptance by draft position (all prompts)\n");
        let depth = drafting
            .iter()
            .map(|x| x.acceptance_by_position.len())
            .max()
            .unwrap_or(0)
            .min(12);
        let _ = write!(s, "| target | method |");
        for i in 1..=depth {
            let _ = write!(s, " {i} |");
        }
        let _ = writeln!(s, "\n|---|---|{}", "---|".repeat(depth));
        for x in drafting {
            let _ = write!(s, "| {} | {} |", x.target, x.method);
            for i in 0..depth {
                let cell = x
                    .acceptance_by_position
                    .get(i)
                    .map_or("–".into(), |v| format!("{v:.2}"));
                let _ = write!(s, " {cell} |");
            }
            let _ = writeln!(s);
        }
    }

    let sized: Vec<&Summary> = report
        .summaries
        .iter()
        .filter(|x| x.category == "all" && x.mean_drafted.is_some())
        .collect();
    if !sized.is_empty() {
        let _ = writeln!(
            s,
            "\n## Drafts a step and the verification's cost by width\n"
        );
        let _ = writeln!(
            s,
            "Drafted = tokens drafted a step (a chain's K, a tree's nodes); cost by width = mean \
             time of a verification step scoring w tokens (root included) ÷ plain decoding's \
             step on the same target, for the widths with the most steps (w: cost, steps).\n"
        );
        let _ = writeln!(s, "| target | method | drafted | τ | cost by width |");
        let _ = writeln!(s, "|---|---|---|---|---|");
        for x in sized {
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} | {} |",
                x.target,
                x.method,
                opt(x.mean_drafted, 1),
                opt(x.tau, 2),
                widths_cell(&x.cost_by_width)
            );
        }
    }

    let _ = writeln!(s, "\n## Lossless check\n");
    if !report.greedy {
        let _ = writeln!(
            s,
            "Not checked: temperature {} samples, so outputs differ by design.",
            report.temperature
        );
    } else if report.mismatches.is_empty() {
        let compared = report
            .runs
            .iter()
            .filter(|r| r.matches_plain.is_some())
            .count();
        let _ = writeln!(
            s,
            "Every greedy method produced exactly plain decoding's tokens ({compared} \
             comparisons)."
        );
    } else {
        let _ = writeln!(
            s,
            "**{} generation(s) differ from plain decoding.** First per method:\n",
            report.mismatches.len()
        );
        let mut shown = BTreeSet::new();
        for x in &report.mismatches {
            if shown.insert((&x.target, &x.method)) {
                let _ = writeln!(
                    s,
                    "- {} `{}`: prompt {} (turn {}, repeat {}), position {}: plain {:?} {:?}, \
                     method {:?} {:?}",
                    x.target,
                    x.method,
                    x.question_id,
                    x.turn,
                    x.repeat,
                    x.position,
                    x.plain_token,
                    x.plain_text,
                    x.method_token,
                    x.method_text
                );
            }
        }
    }
    let _ = writeln!(s, "\nPeak RSS: {}.", report.memory_metric);
    s
}

/// The six widths with the most steps, in width order: `w: cost (steps)`.
fn widths_cell(by_width: &[(usize, u64, f64)]) -> String {
    let mut most: Vec<&(usize, u64, f64)> = by_width.iter().collect();
    most.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    most.truncate(6);
    most.sort_by_key(|w| w.0);
    if most.is_empty() {
        return "–".to_owned();
    }
    most.iter()
        .map(|(w, n, v)| format!("{w}: {v:.2} ({n})"))
        .collect::<Vec<_>>()
        .join("; ")
}

/// (label, drafted a step, τ) of every method, all prompts, for the τ-against-size plot.
pub(super) fn report_tau_by_size(report: &Report) -> Vec<(String, f64, f64)> {
    report
        .summaries
        .iter()
        .filter(|x| x.category == "all")
        .filter_map(|x| {
            Some((
                format!("{} · {}", x.target, x.method),
                x.mean_drafted.unwrap_or(0.0),
                x.tau?,
            ))
        })
        .collect()
}

/// (label, per-category speedups) of every non-plain method, for the speedup plot.
pub(super) fn report_bars(report: &Report, categories: &[String]) -> crate::plots::Bars {
    let mut labels: Vec<String> = categories.to_vec();
    labels.push("all".into());
    let mut series = Vec::new();
    let mut keys: Vec<(&str, &str)> = Vec::new();
    for x in &report.summaries {
        if !keys.contains(&(x.target.as_str(), x.method.as_str())) && !x.plain {
            keys.push((&x.target, &x.method));
        }
    }
    for (t, me) in keys {
        let values = labels
            .iter()
            .map(|c| {
                report
                    .summaries
                    .iter()
                    .find(|x| x.target == t && x.method == me && x.category == *c)
                    .and_then(|x| x.speedup)
            })
            .collect();
        series.push((format!("{me} ({t})"), values));
    }
    crate::plots::Bars {
        categories: labels,
        series,
    }
}

pub(super) fn report_acceptance(report: &Report) -> Vec<(String, Vec<f64>)> {
    report
        .summaries
        .iter()
        .filter(|x| x.category == "all" && !x.acceptance_by_position.is_empty())
        .map(|x| {
            (
                format!("{} ({})", x.method, x.target),
                x.acceptance_by_position.clone(),
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::fixtures::bound_runs;
    use crate::bench::machine::{Machine, SpanTileRuns};
    use crate::bench::report::utc_stamp;
    use crate::bench::summary::summarize;

    #[test]
    fn the_details_table_shows_the_bound_for_draft_model_methods_only() {
        let mut runs = bound_runs();
        runs[3].drafter_estimates = [("cost_ratio", 0.5), ("hopeless", 0.0)].into();
        let categories = vec!["a".to_owned(), "b".to_owned()];
        let report = Report {
            schema_version: 2,
            started_unix: 0,
            started_utc: utc_stamp(0, false),
            total_seconds: 1.0,
            command: vec![],
            machine: Machine {
                cpu: "cpu".into(),
                kernels: "AVX2 + FMA".into(),
                cores: 2,
                memory_bytes: None,
                os: "os".into(),
                backend: "flex".into(),
                gpu: None,
            },
            span_tiles: vec![SpanTileRuns {
                rows_of_x: 5,
                tiles: [("8-lane".to_owned(), 3), ("two panels".to_owned(), 40)].into(),
            }],
            prompts_file: "p.jsonl".into(),
            prompts: vec![],
            temperature: 0.0,
            seed: 0,
            repeats: 1,
            greedy: true,
            memory_metric: "VmHWM",
            skipped_methods: vec![],
            models: vec![],
            summaries: summarize(&runs, &categories),
            mismatches: vec![],
            runs,
        };
        let md = render_markdown(&report, &categories);
        assert!(
            md.contains("tiles picked by timing (products run): 5 rows: 8-lane 3, two panels 40\n"),
            "{md}"
        );
        // The details row, then the bound table's row if the method has one.
        let rows = |method: &str, category: &str| -> Vec<String> {
            md.lines()
                .filter(|l| l.starts_with(&format!("| t | {method} | {category} |")))
                .map(str::to_owned)
                .collect()
        };
        // Details: speedup | τ | α | tok/s | decode speedup
        let k2 = rows("sampling:k=2", "a");
        // Decode speeds are twice the whole-generation ones here, so the ratios are equal.
        assert!(
            k2[0].contains("| 1.40× | 1.67 | 0.50 | 21.00 | 1.40× |"),
            "{}",
            k2[0]
        );
        // Bound: τ | α tested | K | c | E[τ] | τ ÷ E[τ] | bound | speedup ÷ bound | decode ÷
        // bound (pooled: 42 tok/s ÷ plain's 26.7, ÷ the bound) | v | with v
        assert!(
            k2[1].contains(
                "| 1.67 | 0.57 | 2.00 | 0.250 | 1.90 | 0.88 | 1.27× | 1.11 | 1.24 | 1.50 | 0.95× |"
            ),
            "{}",
            k2[1]
        );
        let auto = rows("sampling:k=auto", "a");
        assert!(
            auto[1].contains("| 0.50 | 1.50 | 0.500 | 1.53 | 0.93 | 0.88× | 0.91 | 1.03 |"),
            "{}",
            auto[1]
        );
        assert!(auto[1].ends_with("| 1.50 | 0.68× |"), "{}", auto[1]);
        let plain = rows("plain", "a");
        assert_eq!(plain.len(), 1);
        assert!(
            plain[0].contains("| 1.00× | 1.00 | – | 15.00 | 1.00× |"),
            "{}",
            plain[0]
        );
        let pl = rows("pl", "a");
        assert_eq!(pl.len(), 1);
        assert!(pl[0].contains("| 0.50 | 30.00 |"), "{}", pl[0]);
        assert!(md.contains("bound = E[τ] ÷ (K·c + 1)"));
        assert!(md.contains("## Draft-model methods against the bound"));
        let json = serde_json::to_value(&report).unwrap();
        let bound = &json["summaries"]
            .as_array()
            .unwrap()
            .iter()
            .find(|x| x["method"] == "sampling:k=2" && x["category"] == "a")
            .unwrap()["draft_bound"];
        assert_eq!(bound["k"], 2.0);
        assert!((bound["cost_ratio"].as_f64().unwrap() - 0.25).abs() < 1e-12);
        assert!(json["summaries"][0]["draft_bound"].is_null());
        assert_eq!(json["runs"][3]["fixed_k"], 2);
        assert!(json["runs"][0]["step_seconds"].is_number());
        assert_eq!(json["runs"][3]["drafter_estimates"]["cost_ratio"], 0.5);
        assert_eq!(json["runs"][3]["drafter_estimates"]["hopeless"], 0.0);
        assert!(json["runs"][0].get("drafter_estimates").is_none());
    }
}
