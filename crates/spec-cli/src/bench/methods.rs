//! `--methods`: a comma-separated list of methods as `spec` writes them everywhere,
//! `NAME[:KEY=VALUE]...`, each with the bench's own key `target=` besides the method's.

use anyhow::{Result, bail};
use spec_engine::method::MethodText;

/// The bench's key: the target model a method runs on, instead of the run's default.
const TARGET_KEY: &str = "target";

/// One item of `--methods`: the method's text without `target=`, and the target it names.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct BenchMethod {
    /// The item as written: the report's label.
    pub(super) label: String,
    pub(super) text: MethodText,
    pub(super) target: Option<String>,
}

impl BenchMethod {
    /// Parses `NAME[:KEY=VALUE]...`; the method's keys are read when the plan builds its
    /// method, after the bench's defaults are supplied.
    pub(super) fn parse(item: &str) -> Result<Self> {
        let label = item.trim().to_owned();
        let mut text: MethodText = label.parse()?;
        let target = text.take(TARGET_KEY);
        Ok(Self {
            label,
            text,
            target,
        })
    }

    /// Parses a comma-separated list; labels must be unique.
    pub(super) fn parse_list(list: &str) -> Result<Vec<Self>> {
        let mut methods: Vec<Self> = Vec::new();
        for item in list.split(',').filter(|s| !s.trim().is_empty()) {
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
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_target_key_is_the_benchs_and_the_label_the_text_as_written() {
        let m =
            BenchMethod::parse(" sampling:k=auto:draft=qwen2.5-coder-0.5b:target=x.gguf ").unwrap();
        assert_eq!(
            m.text.to_string(),
            "sampling:k=auto:draft=qwen2.5-coder-0.5b"
        );
        assert_eq!(m.target.as_deref(), Some("x.gguf"));
        assert_eq!(
            m.label,
            "sampling:k=auto:draft=qwen2.5-coder-0.5b:target=x.gguf"
        );
        let m = BenchMethod::parse("prompt-lookup:ngram_max=4").unwrap();
        assert_eq!(m.text.to_string(), "prompt-lookup:ngram-max=4");
        assert_eq!(m.label, "prompt-lookup:ngram_max=4");
        assert_eq!(m.target, None);
    }

    #[test]
    fn lists_are_unique_and_not_empty() {
        for bad in ["", ":k=3", "bigram:k", "x:k=", "plain:target=a:target=b"] {
            assert!(BenchMethod::parse(bad).is_err(), "{bad:?} should fail");
        }
        assert!(BenchMethod::parse_list("plain,plain").is_err());
        assert!(BenchMethod::parse_list(" , ").is_err());
        let list = BenchMethod::parse_list("plain,bigram:k=3,sampling:k=4").unwrap();
        let labels: Vec<_> = list.iter().map(|m| m.label.as_str()).collect();
        assert_eq!(labels, ["plain", "bigram:k=3", "sampling:k=4"]);
    }
}
