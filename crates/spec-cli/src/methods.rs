//! The settings a decoding method is built from, shared by `spec generate` (flags) and
//! `spec bench` (method specs such as `sampling:k=4:draft=qwen2.5-coder-0.5b`).

use std::path::PathBuf;

use anyhow::{Result, bail};
use spec_runtime::model::WeightFormat;

/// What [`crate::make_drafter`] reads to build a method's drafter. The field names match the
/// `spec generate` flags (`--method`, `--k`, `--draft-threshold`, `--draft-model`,
/// `--draft-weights`, `--ngram-max`, `--ngram-min`, `--bigram`).
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct MethodSpec {
    /// The method's name: `plain`, `prompt-lookup`, `sampling`, `bigram`, ….
    pub(crate) method: String,
    /// Draft length: a number, or `auto` where the method supports it.
    pub(crate) k: Option<String>,
    /// `sampling`: stop a chain once the draft's top probability falls below this
    /// (`threshold=`; `spec_sampling::DraftLength::Confident`).
    pub(crate) draft_threshold: Option<f64>,
    /// The draft model (path or reference name) of methods that use one.
    pub(crate) draft_model: Option<String>,
    /// How the draft model's projections are stored for its decode steps (`draft-weights=`).
    pub(crate) draft_weights: Option<WeightFormat>,
    pub(crate) ngram_max: Option<usize>,
    pub(crate) ngram_min: Option<usize>,
    /// The bigram model file of `bigram`.
    pub(crate) bigram: Option<PathBuf>,
    /// Prompt lookup's cross-request cache, in tokens (`history=on|off|N`; bench only, since
    /// `spec generate` makes one request).
    pub(crate) history: Option<usize>,
}

/// A method as `spec bench` takes it: the drafter settings plus, optionally, the target model
/// it runs on (`target=`), and the label it is reported under (the spec as written).
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct BenchMethod {
    pub(crate) label: String,
    pub(crate) spec: MethodSpec,
    pub(crate) target: Option<String>,
}

impl BenchMethod {
    /// Parses `NAME[:KEY=VALUE]...`; keys: `k`, `threshold`, `draft`, `draft-weights`,
    /// `target`, `ngram-max`, `ngram-min`, `bigram`, `history`.
    pub(crate) fn parse(text: &str) -> Result<Self> {
        let text = text.trim();
        let mut parts = text.split(':');
        let name = parts.next().unwrap_or_default().trim();
        if name.is_empty() || name.contains('=') {
            bail!("`{text}`: a method spec starts with the method's name, e.g. `sampling:k=4`");
        }
        let mut spec = MethodSpec {
            method: name.to_owned(),
            ..MethodSpec::default()
        };
        let mut target = None;
        for part in parts {
            let Some((key, value)) = part.split_once('=') else {
                bail!("`{text}`: `{part}` is not KEY=VALUE");
            };
            let value = value.trim();
            if value.is_empty() {
                bail!("`{text}`: `{key}` has no value");
            }
            let number = |what: &str| -> Result<usize> {
                value.parse().map_err(|_| {
                    anyhow::anyhow!("`{text}`: {what} must be a whole number, got `{value}`")
                })
            };
            match key.trim().replace('_', "-").as_str() {
                "k" => {
                    if value != "auto" {
                        number("k")?;
                    }
                    spec.k = Some(value.to_owned());
                }
                "threshold" | "draft-threshold" => {
                    spec.draft_threshold = Some(value.parse().map_err(|_| {
                        anyhow::anyhow!("`{text}`: threshold must be a number, got `{value}`")
                    })?)
                }
                "draft" | "draft-model" => spec.draft_model = Some(value.to_owned()),
                "draft-weights" => {
                    spec.draft_weights = Some(
                        value
                            .parse()
                            .map_err(|e| anyhow::anyhow!("`{text}`: draft-weights: {e}"))?,
                    )
                }
                "target" => target = Some(value.to_owned()),
                "ngram-max" => spec.ngram_max = Some(number("ngram-max")?),
                "ngram-min" => spec.ngram_min = Some(number("ngram-min")?),
                "bigram" => spec.bigram = Some(PathBuf::from(value)),
                "history" => {
                    spec.history = Some(match value {
                        "on" => spec_ngram::DEFAULT_HISTORY_TOKENS,
                        "off" => 0,
                        _ => number("history (on, off or a token count)")?,
                    })
                }
                other => bail!(
                    "`{text}`: unknown key `{other}` (known: k, threshold, draft, draft-weights, \
                     target, ngram-max, ngram-min, bigram, history)"
                ),
            }
        }
        Ok(Self {
            label: text.to_owned(),
            spec,
            target,
        })
    }

    /// Parses a comma-separated list of specs; labels must be unique.
    pub(crate) fn parse_list(text: &str) -> Result<Vec<Self>> {
        let mut methods: Vec<Self> = Vec::new();
        for item in text.split(',').filter(|s| !s.trim().is_empty()) {
            let method = Self::parse(item)?;
            if methods.iter().any(|m| m.label == method.label) {
                bail!("method `{}` is listed twice", method.label);
            }
            methods.push(method);
        }
        if methods.is_empty() {
            bail!("no methods given");
        }
        Ok(methods)
    }

    pub(crate) fn is_plain(&self) -> bool {
        self.spec.method == "plain"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_names_and_keys() {
        let m =
            BenchMethod::parse("sampling:k=auto:draft=qwen2.5-coder-0.5b:target=x.gguf").unwrap();
        assert_eq!(m.spec.method, "sampling");
        assert_eq!(m.spec.k.as_deref(), Some("auto"));
        assert_eq!(m.spec.draft_model.as_deref(), Some("qwen2.5-coder-0.5b"));
        assert_eq!(m.target.as_deref(), Some("x.gguf"));
        assert_eq!(
            m.label,
            "sampling:k=auto:draft=qwen2.5-coder-0.5b:target=x.gguf"
        );

        let m = BenchMethod::parse("prompt-lookup:ngram_max=4:ngram-min=2:k=8").unwrap();
        assert_eq!(m.spec.ngram_max, Some(4));
        assert_eq!(m.spec.ngram_min, Some(2));
        assert_eq!(m.spec.k.as_deref(), Some("8"));

        let m = BenchMethod::parse("sampling:k=6:threshold=0.4").unwrap();
        assert_eq!(m.spec.k.as_deref(), Some("6"));
        assert_eq!(m.spec.draft_threshold, Some(0.4));

        let m = BenchMethod::parse("sampling:k=4:draft-weights=q8_0").unwrap();
        assert_eq!(m.spec.draft_weights, Some(WeightFormat::Q8_0));
        assert_eq!(
            BenchMethod::parse("sampling").unwrap().spec.draft_weights,
            None
        );

        for (text, tokens) in [
            (
                "prompt-lookup:history=on",
                spec_ngram::DEFAULT_HISTORY_TOKENS,
            ),
            ("prompt-lookup:history=off", 0),
            ("prompt-lookup:history=5000", 5000),
        ] {
            assert_eq!(BenchMethod::parse(text).unwrap().spec.history, Some(tokens));
        }

        let m = BenchMethod::parse(" plain ").unwrap();
        assert!(m.is_plain());
        assert_eq!(
            m.spec,
            MethodSpec {
                method: "plain".into(),
                ..Default::default()
            }
        );
    }

    #[test]
    fn rejects_bad_specs() {
        for bad in [
            "",
            ":k=3",
            "k=3",
            "bigram:k",
            "bigram:k=x",
            "bigram:depth=3",
            "x:k=",
            "prompt-lookup:history=maybe",
            "sampling:draft-weights=q3",
            "sampling:threshold=high",
        ] {
            assert!(BenchMethod::parse(bad).is_err(), "{bad:?} should fail");
        }
        assert!(BenchMethod::parse_list("plain,plain").is_err());
        assert!(BenchMethod::parse_list(" , ").is_err());
        let list = BenchMethod::parse_list("plain,bigram:k=3,sampling:k=4").unwrap();
        let labels: Vec<_> = list.iter().map(|m| m.label.as_str()).collect();
        assert_eq!(labels, ["plain", "bigram:k=3", "sampling:k=4"]);
    }
}
