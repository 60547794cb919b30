//! What a run does: its methods grouped by target (plain decoding first in each group), the
//! defaults of a run and of `--quick`, and each group's token count and prompts per category.

use anyhow::{Context, Result, bail};
use spec_engine::method::{MethodError, MethodText, PlainSpec};
use spec_medusa::spec::HEADS_KEY as MEDUSA_HEADS_KEY;
use spec_ngram::spec::BIGRAM_FILE_KEY;
use spec_sampling::spec::DRAFT_MODEL_KEY;

use super::args::BenchArgs;
use super::methods::BenchMethod;
use crate::registry::{self, Method};

/// The default target of methods without a draft model, and of `--quick`.
pub(super) const SMALL_TARGET: &str = "smollm2-135m";

/// The default target and draft of methods that use a draft model (`sampling`).
pub(super) const DRAFT_PAIR: (&str, &str) = ("qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b");

/// Default run: methods, new tokens, prompts per category (see `docs/benchmarks.md`, "`cargo xtask
/// bench`: the main job", for a full run's time and figures).
/// `sampling` twice: at its default fixed `K` and with the length it picks itself; `tree` from
/// the draft model beside it, and from prompt lookup's matches on SmolLM2; `medusa` on SmolLM2
/// (`--medusa-heads`) and on the draft pair's target where its heads are in the cache.
pub(super) const DEFAULT_METHODS: &str = "plain,prompt-lookup,bigram,sampling,sampling:k=auto,\
    tree,tree:lookup=on,medusa,medusa:target=qwen2.5-coder-1.5b";

pub(super) const DEFAULT_MAX_NEW_TOKENS: usize = 48;

pub(super) const DEFAULT_PER_CATEGORY: usize = 2;

/// Targets of draft-model methods (Qwen2.5-Coder 1.5B by default, decoding 9.5-10.1 tok/s plain
/// on the reference 2-core CPU against SmolLM2's 91-92) take one prompt per category, at the same
/// length: shorter generations would leave the prefill and the first steps to dominate.
pub(super) const DRAFT_GROUP_PER_CATEGORY: usize = 1;

/// `--quick`: one prompt per category, fewer tokens, every method on SmolLM2 (CI's smoke run
/// and lossless check): the draft-model methods with SmolLM2 drafting for itself, its
/// projections rounded to q8_0-a8 (the drafts' default), so that some drafts are rejected; a
/// tree of a fixed shape, so that its levels are fed on the draft's cache whatever it costs.
pub(super) const QUICK_METHODS: &str = "plain,prompt-lookup,bigram,sampling:draft=smollm2-135m:k=3,\
    tree:draft=smollm2-135m:shape=2x2x1,tree:lookup=on,medusa:tree=static";

pub(super) const QUICK_MAX_NEW_TOKENS: usize = 32;

/// One method on one target, as the run uses it.
#[derive(Clone, Debug)]
pub(super) struct PlannedMethod {
    /// The method as written in `--methods`.
    pub(super) label: String,
    pub(super) method: Method,
    /// The draft model it runs, if any.
    pub(super) draft: Option<String>,
}

impl PlannedMethod {
    fn new(label: String, method: Method) -> Self {
        let draft = method.draft_model().map(|(name, _)| name.to_owned());
        Self {
            label,
            method,
            draft,
        }
    }
}

/// The plan: methods grouped by target (plain first in each group), prompts, settings.
pub(super) struct Plan {
    pub(super) groups: Vec<(String, Vec<PlannedMethod>)>,
    pub(super) skipped: Vec<String>,
    pub(super) max_new_tokens: usize,
}

pub(super) fn plan(args: &BenchArgs) -> Result<Plan> {
    plan_with(args, &cached_heads)
}

/// The heads `cargo xtask train-medusa --model TARGET` writes by default, if they are there.
fn cached_heads(target: &str) -> Option<String> {
    let path =
        crate::train_medusa::default_heads_path(target, crate::train_medusa::DEFAULT_HEADS).ok()?;
    path.is_file().then(|| path.to_string_lossy().into_owned())
}

/// [`plan`], with `heads_of(target)` the heads found for a `medusa` item that names its target
/// and no heads.
fn plan_with(args: &BenchArgs, heads_of: &dyn Fn(&str) -> Option<String>) -> Result<Plan> {
    let methods_defaulted = args.methods.is_none();
    let methods_text = args.methods.clone().unwrap_or_else(|| {
        if args.quick {
            QUICK_METHODS
        } else {
            DEFAULT_METHODS
        }
        .to_owned()
    });
    let methods = BenchMethod::parse_list(&methods_text)?;
    let models = match &args.models {
        None => None,
        Some(text) => {
            let mut parts = text.split(',').map(str::trim);
            let target = parts.next().filter(|t| !t.is_empty());
            let draft = parts.next().filter(|d| !d.is_empty());
            match (target, parts.next()) {
                (Some(t), None) => Some((t.to_owned(), draft.map(str::to_owned))),
                _ => bail!("--models takes TARGET or TARGET,DRAFT, got `{text}`"),
            }
        }
    };
    let mut skipped = Vec::new();
    let mut groups: Vec<(String, Vec<PlannedMethod>)> = Vec::new();
    let mut plain = None;
    for item in methods {
        let (named_target, draft) = match (&item.target, &models) {
            (Some(t), _) => (Some(t.clone()), None),
            (None, Some((t, d))) => (Some(t.clone()), d.clone()),
            (None, None) => (None, None),
        };
        let draft = draft.unwrap_or_else(|| DRAFT_PAIR.1.to_owned());
        let bigram = args
            .bigram
            .as_ref()
            .map(|f| f.to_string_lossy().into_owned());
        let given_heads = args
            .medusa_heads
            .as_ref()
            .map(|f| f.to_string_lossy().into_owned());
        // Heads are one target's: a row that names its target takes that target's cached
        // heads, else (where the user listed it) `--medusa-heads`; the default list's row on
        // another target never takes the default target's heads.
        let heads = match &item.target {
            None => given_heads,
            Some(target) => heads_of(target).or(given_heads.filter(|_| !methods_defaulted)),
        };
        let files = DefaultFiles {
            bigram: bigram.as_deref(),
            medusa_heads: heads.as_deref(),
        };
        let method = match with_defaults(item.text, &draft, files) {
            Ok(method) => method,
            // A default method that lacks what only the user can give (a bigram file, Medusa
            // heads) is skipped, with a note.
            Err(e @ MethodError::Missing { .. }) if methods_defaulted => {
                skipped.push(format!("`{}`: {e}", item.label));
                continue;
            }
            Err(e) => return Err(e).with_context(|| format!("method `{}`", item.label)),
        };
        let target = named_target.unwrap_or_else(|| {
            if method.draft_model().is_some() && !args.quick {
                DRAFT_PAIR.0.to_owned()
            } else {
                SMALL_TARGET.to_owned()
            }
        });
        let planned = PlannedMethod::new(item.label, method);
        // Plain decoding without a target of its own is every group's baseline, added below.
        if planned.method.is_plain() && item.target.is_none() {
            plain = Some(planned);
            continue;
        }
        match groups.iter_mut().find(|(t, _)| *t == target) {
            Some((_, list)) => list.push(planned),
            None => groups.push((target, vec![planned])),
        }
    }
    if groups.is_empty() {
        let target = models.map_or_else(|| SMALL_TARGET.to_owned(), |(t, _)| t);
        groups.push((target, Vec::new()));
    }
    let plain = plain
        .unwrap_or_else(|| PlannedMethod::new(PlainSpec.to_string(), Method::Plain(PlainSpec)));
    // Plain decoding is every target's baseline: first in its group, added where not listed.
    for (_, list) in &mut groups {
        match list.iter().position(|m| m.method.is_plain()) {
            Some(i) => {
                let plain = list.remove(i);
                list.insert(0, plain);
            }
            None => list.insert(0, plain.clone()),
        }
    }
    let max_new_tokens = args.max_new_tokens.unwrap_or(if args.quick {
        QUICK_MAX_NEW_TOKENS
    } else {
        DEFAULT_MAX_NEW_TOKENS
    });
    if args.max_new_tokens == Some(0) {
        bail!("--max-new-tokens must be at least 1");
    }
    if args.repeats == 0 {
        bail!("--repeats must be at least 1");
    }
    Ok(Plan {
        groups,
        skipped,
        max_new_tokens,
    })
}

/// The run's files for methods that name none.
#[derive(Debug, Clone, Copy, Default)]
struct DefaultFiles<'a> {
    /// `--bigram`.
    bigram: Option<&'a str>,
    /// `--medusa-heads`.
    medusa_heads: Option<&'a str>,
}

/// The method `text` names, with the run's defaults where it needs them: `draft` (the run's
/// draft model) where it names no source of drafts and takes one, then the run's bigram file
/// (`--bigram`) and Medusa heads (`--medusa-heads`) where it still lacks what it needs. A
/// default never overrides what `text` names, nor adds a source to a method that has one
/// (`tree:lookup=on` stays an n-gram tree of prompt lookup's matches).
///
/// # Errors
/// The method's own, once the defaults it can take are in.
fn with_defaults(
    mut text: MethodText,
    draft: &str,
    files: DefaultFiles<'_>,
) -> Result<Method, MethodError> {
    match Method::from_text(text.clone()) {
        Err(MethodError::Missing { .. }) => {}
        other => return other,
    }
    registry::supply(&mut text, DRAFT_MODEL_KEY, draft)?;
    for (key, file) in [
        (BIGRAM_FILE_KEY, files.bigram),
        (MEDUSA_HEADS_KEY, files.medusa_heads),
    ] {
        // A file the run lacks leaves the next one to try (`--medusa-heads` without `--bigram`).
        let Some(file) = file else { continue };
        match Method::from_text(text.clone()) {
            Err(MethodError::Missing { .. }) => registry::supply(&mut text, key, file)?,
            other => return other,
        }
    }
    Method::from_text(text)
}

/// New tokens and questions per category of one target's group: the flags, else the defaults
/// (fewer questions for the slow targets of draft-model methods).
pub(super) fn group_limits(args: &BenchArgs, methods: &[PlannedMethod]) -> (usize, usize) {
    let heavy = !args.quick && methods.iter().any(|m| m.draft.is_some());
    let max_new_tokens = args.max_new_tokens.unwrap_or(if args.quick {
        QUICK_MAX_NEW_TOKENS
    } else {
        DEFAULT_MAX_NEW_TOKENS
    });
    let per_category = args.per_category.unwrap_or(match (args.quick, heavy) {
        (true, _) | (false, true) => DRAFT_GROUP_PER_CATEGORY,
        (false, false) => DEFAULT_PER_CATEGORY,
    });
    (max_new_tokens, per_category)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Wrap {
        #[command(flatten)]
        args: BenchArgs,
    }

    fn args(line: &[&str]) -> BenchArgs {
        Wrap::parse_from(std::iter::once("bench").chain(line.iter().copied())).args
    }

    /// The plan with no heads in the cache, whatever this machine's cache holds.
    fn plan(args: &BenchArgs) -> Result<Plan> {
        plan_with(args, &|_| None)
    }

    fn labels(plan: &Plan) -> Vec<(String, Vec<String>)> {
        plan.groups
            .iter()
            .map(|(t, l)| (t.clone(), l.iter().map(|m| m.label.clone()).collect()))
            .collect()
    }

    #[test]
    fn default_plan_groups_methods_by_target_with_plain_first() {
        let p = plan(&args(&["--bigram", "b.bin", "--medusa-heads", "h.st"])).unwrap();
        assert_eq!(
            labels(&p),
            [
                (
                    SMALL_TARGET.to_owned(),
                    vec![
                        "plain".to_owned(),
                        "prompt-lookup".into(),
                        "bigram".into(),
                        "tree:lookup=on".into(),
                        "medusa".into()
                    ]
                ),
                (
                    DRAFT_PAIR.0.to_owned(),
                    vec![
                        "plain".into(),
                        "sampling".into(),
                        "sampling:k=auto".into(),
                        "tree".into()
                    ]
                ),
            ]
        );
        let sampling = &p.groups[1].1[1];
        assert_eq!(
            sampling.method.to_string(),
            format!("sampling:draft={}", DRAFT_PAIR.1)
        );
        assert_eq!(sampling.draft.as_deref(), Some(DRAFT_PAIR.1));
        assert_eq!(p.groups[0].1[2].method.to_string(), "bigram:bigram=b.bin");
        // A tree gets the draft model where it names no source, and no other source where it
        // names one.
        assert_eq!(
            p.groups[1].1[3].method.to_string(),
            format!("tree:draft={}", DRAFT_PAIR.1)
        );
        assert_eq!(p.groups[0].1[3].method.to_string(), "tree:lookup=on");
        assert_eq!(p.groups[0].1[4].method.to_string(), "medusa:heads=h.st");
        assert_eq!(p.groups[0].1[2].draft, None);
        assert_eq!(p.max_new_tokens, DEFAULT_MAX_NEW_TOKENS);

        // The 1.5B's medusa row is skipped without its cached heads: SmolLM2's do not serve it.
        assert_eq!(p.skipped.len(), 1);
        assert!(p.skipped[0].contains("medusa:target="), "{:?}", p.skipped);

        // Without a bigram file or heads, the default bigram and medusa are skipped, with notes.
        let p = plan(&args(&[])).unwrap();
        assert_eq!(p.skipped.len(), 3);
        assert!(p.skipped[0].contains("bigram"));
        assert!(p.skipped[1].contains("heads=FILE"), "{:?}", p.skipped);
    }

    #[test]
    fn a_medusa_row_naming_its_target_takes_that_targets_cached_heads() {
        let cache = |target: &str| (target == DRAFT_PAIR.0).then(|| "q.st".to_owned());
        let p = plan_with(&args(&["--medusa-heads", "h.st"]), &cache).unwrap();
        let (target, rows) = &p.groups[1];
        assert_eq!(target, DRAFT_PAIR.0);
        let row = rows.last().unwrap();
        assert_eq!(row.label, format!("medusa:target={}", DRAFT_PAIR.0));
        assert_eq!(row.method.to_string(), "medusa:heads=q.st");
        // SmolLM2's row takes `--medusa-heads`, with no `--bigram` given (bigram is skipped).
        let smollm2_medusa = p.groups[0].1.last().unwrap();
        assert_eq!(smollm2_medusa.method.to_string(), "medusa:heads=h.st");
        assert_eq!(p.skipped.len(), 1);
        assert!(p.skipped[0].starts_with("`bigram`"), "{:?}", p.skipped);
        // A listed row on a target without cached heads takes `--medusa-heads`.
        let p = plan_with(
            &args(&[
                "--methods",
                "medusa:target=x.gguf",
                "--medusa-heads",
                "h.st",
            ]),
            &cache,
        )
        .unwrap();
        assert_eq!(p.groups[0].0, "x.gguf");
        assert_eq!(p.groups[0].1[1].method.to_string(), "medusa:heads=h.st");
    }

    #[test]
    fn models_flag_and_target_keys_override_defaults() {
        let p = plan(&args(&[
            "--models",
            "a.gguf,d.gguf",
            "--methods",
            "sampling:k=4,prompt-lookup,plain:target=z.gguf",
            "--max-new-tokens",
            "7",
        ]))
        .unwrap();
        assert_eq!(
            labels(&p),
            [
                (
                    "a.gguf".to_owned(),
                    vec![
                        "plain".to_owned(),
                        "sampling:k=4".into(),
                        "prompt-lookup".into()
                    ]
                ),
                ("z.gguf".to_owned(), vec!["plain:target=z.gguf".to_owned()]),
            ]
        );
        assert_eq!(p.groups[0].1[1].draft.as_deref(), Some("d.gguf"));
        assert_eq!(p.groups[0].1[2].draft, None);
        assert_eq!(p.max_new_tokens, 7);
        // A listed plain is the baseline of the sampling group, not a group of its own.
        let p = plan(&args(&["--methods", "plain,sampling"])).unwrap();
        assert_eq!(
            labels(&p),
            [(
                DRAFT_PAIR.0.to_owned(),
                vec!["plain".to_owned(), "sampling".into()]
            )]
        );
        let p = plan(&args(&["--methods", "plain", "--models", "m.gguf"])).unwrap();
        assert_eq!(
            labels(&p),
            [("m.gguf".to_owned(), vec!["plain".to_owned()])]
        );
        assert!(plan(&args(&["--models", "a,b,c"])).is_err());
        assert!(plan(&args(&["--repeats", "0"])).is_err());
    }

    #[test]
    fn quick_runs_every_method_on_the_small_target() {
        let p = plan(&args(&[
            "--quick",
            "--bigram",
            "b.bin",
            "--medusa-heads",
            "h.st",
        ]))
        .unwrap();
        let sampling = "sampling:draft=smollm2-135m:k=3";
        assert_eq!(
            labels(&p),
            [(
                SMALL_TARGET.to_owned(),
                vec![
                    "plain".to_owned(),
                    "prompt-lookup".into(),
                    "bigram".into(),
                    sampling.into(),
                    "tree:draft=smollm2-135m:shape=2x2x1".into(),
                    "tree:lookup=on".into(),
                    "medusa:tree=static".into()
                ]
            )]
        );
        assert_eq!(p.groups[0].1[3].draft.as_deref(), Some(SMALL_TARGET));
        assert_eq!(p.max_new_tokens, QUICK_MAX_NEW_TOKENS);
        // Every method the registry knows runs in --quick.
        let mut names: Vec<&str> = p.groups[0].1.iter().map(|m| m.method.name()).collect();
        names.sort_unstable();
        names.dedup();
        let mut known = crate::registry::known_names();
        known.sort_unstable();
        assert_eq!(names, known);
        // Without a bigram file or heads, bigram and medusa are skipped with notes.
        let p = plan(&args(&["--quick"])).unwrap();
        assert_eq!(labels(&p)[0].1.len(), 5);
        assert!(p.skipped[0].contains("bigram"), "{:?}", p.skipped);
        assert!(p.skipped[1].contains("medusa"), "{:?}", p.skipped);
    }

    #[test]
    fn bad_methods_fail_the_plan_naming_the_item() {
        let error = |methods: &str| {
            let e = plan(&args(&["--methods", methods])).err().unwrap();
            format!("{e:#}")
        };
        assert!(error("nope").contains("unknown method `nope` (known: plain,"));
        assert!(error("layer-skip").contains("not built yet"));
        assert!(error("medusa").contains("medusa needs heads=FILE"));
        assert_eq!(
            error("plain,bigram:bigram=b:depth=3"),
            "method `bigram:bigram=b:depth=3`: `depth` is not a setting of bigram (its keys: \
             bigram, k)"
        );
        // A listed method must be given what it needs; only a default one is skipped.
        assert!(error("bigram").contains("bigram needs bigram=FILE"));
        assert!(error("prompt-lookup:k=0").contains("k=0"));
        // The bench's defaults never override what a method names.
        let p = plan(&args(&[
            "--methods",
            "sampling:draft-model=x.gguf,bigram:bigram=mine.bin",
            "--bigram",
            "b.bin",
        ]))
        .unwrap();
        let methods: Vec<String> = p
            .groups
            .iter()
            .flat_map(|(_, l)| l)
            .map(|m| m.method.to_string())
            .collect();
        assert_eq!(
            methods,
            [
                "plain",
                "sampling:draft=x.gguf",
                "plain",
                "bigram:bigram=mine.bin"
            ]
        );
    }

    #[test]
    fn fixed_draft_lengths_come_from_the_method() {
        // The listed method is the second of its group, after plain decoding.
        let k = |spec: &str| {
            plan(&args(&["--methods", spec])).unwrap().groups[0].1[1]
                .method
                .fixed_length()
        };
        assert_eq!(k("sampling:k=3"), Some(3));
        assert_eq!(k("sampling"), Some(spec_sampling::DEFAULT_K));
        assert_eq!(k("sampling:k=auto"), None);
        assert_eq!(k("sampling:k=8:threshold=0.5"), None);
        assert_eq!(k("prompt-lookup:k=5"), None);
    }

    #[test]
    fn draft_model_groups_take_fewer_prompts() {
        let a = args(&[]);
        let p = plan(&a).unwrap();
        assert_eq!(
            group_limits(&a, &p.groups[0].1),
            (DEFAULT_MAX_NEW_TOKENS, DEFAULT_PER_CATEGORY)
        );
        assert_eq!(
            group_limits(&a, &p.groups[1].1),
            (DEFAULT_MAX_NEW_TOKENS, DRAFT_GROUP_PER_CATEGORY)
        );
        let a = args(&["--max-new-tokens", "9", "--per-category", "3"]);
        let p = plan(&a).unwrap();
        assert_eq!(group_limits(&a, &p.groups[1].1), (9, 3));
    }
}
