//! The n-gram methods as `spec` takes them: `prompt-lookup[:k=N|auto][:ngram-max=N]
//! [:ngram-min=N][:history=on|off|N]` and `bigram:bigram=FILE[:k=N|auto]`.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

use burn::tensor::backend::Backend;
use spec_engine::Drafter;
use spec_engine::method::{
    BuildContext, DraftCount, MethodError, MethodSpec, MethodText, Settings, parse_spec,
};

use crate::{
    BigramConfig, BigramDrafter, BigramModel, DEFAULT_HISTORY_TOKENS, DEFAULT_LOOKUP_K_MAX,
    DEFAULT_NGRAM_MAX, DEFAULT_NGRAM_MIN, PromptLookup, PromptLookupConfig,
};

/// The key of [`BigramSpec`]'s model file, which `spec bench --bigram` supplies where a method
/// takes it and names none.
pub const BIGRAM_FILE_KEY: &str = "bigram";

/// Prompt lookup's cross-request cache (`history=`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum History {
    /// [`DEFAULT_HISTORY_TOKENS`] tokens.
    On,
    Off,
    /// Up to this many tokens.
    Tokens(usize),
}

impl History {
    /// The cache's size in tokens (0: none).
    pub fn tokens(self) -> usize {
        match self {
            Self::On => DEFAULT_HISTORY_TOKENS,
            Self::Off => 0,
            Self::Tokens(n) => n,
        }
    }
}

impl FromStr for History {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        match text {
            "on" => Ok(Self::On),
            "off" => Ok(Self::Off),
            _ => text
                .parse()
                .map(Self::Tokens)
                .map_err(|_| "give on, off or a number of tokens".to_owned()),
        }
    }
}

impl fmt::Display for History {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::On => f.write_str("on"),
            Self::Off => f.write_str("off"),
            Self::Tokens(n) => write!(f, "{n}"),
        }
    }
}

/// `prompt-lookup`: drafts from earlier occurrences of the context's last n-gram. The keys
/// hold what was given; the defaults apply in [`PromptLookupSpec::config`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PromptLookupSpec {
    /// Longest draft, or `auto` (the default: the adaptive length up to
    /// [`DEFAULT_LOOKUP_K_MAX`]).
    pub k: Option<DraftCount>,
    pub ngram_max: Option<usize>,
    pub ngram_min: Option<usize>,
    /// The cross-request cache (default off; `spec generate` makes one request).
    pub history: Option<History>,
}

impl PromptLookupSpec {
    /// The drafter's settings. The adaptive length is the default: it measured 1.63× vs 1.56×
    /// for K 3 on the context-reuse prompts and the same on open ones (docs/benchmarks.md at
    /// b7d39a0, "adaptive length, context-reuse prompts").
    pub fn config(&self) -> PromptLookupConfig {
        let (k, adaptive) = match self.k {
            Some(DraftCount::Fixed(k)) => (k, false),
            None | Some(DraftCount::Auto) => (DEFAULT_LOOKUP_K_MAX, true),
        };
        PromptLookupConfig {
            k,
            ngram_max: self.ngram_max.unwrap_or(DEFAULT_NGRAM_MAX),
            ngram_min: self.ngram_min.unwrap_or(DEFAULT_NGRAM_MIN),
            adaptive,
            history_tokens: self.history.map_or(0, History::tokens),
        }
    }
}

impl MethodSpec for PromptLookupSpec {
    const NAME: &'static str = "prompt-lookup";
    const KEYS: &'static [&'static str] = &["k", "ngram-max", "ngram-min", "history"];

    fn from_settings(mut settings: Settings) -> Result<Self, MethodError> {
        let spec = Self {
            k: settings.take_parsed("k")?,
            ngram_max: settings.take_parsed("ngram-max")?,
            ngram_min: settings.take_parsed("ngram-min")?,
            history: settings.take_parsed("history")?,
        };
        settings.finish()?;
        // The n-gram sizes are checked here, so that a bad pair fails before any model loads.
        PromptLookup::new(spec.config()).map_err(|e| MethodError::Invalid {
            method: Self::NAME,
            reason: e.to_string(),
        })?;
        Ok(spec)
    }

    fn build<B: Backend>(
        &self,
        _ctx: &mut BuildContext<'_, B>,
    ) -> Result<Box<dyn Drafter<B>>, MethodError> {
        let drafter = PromptLookup::new(self.config()).map_err(MethodError::build)?;
        Ok(Box::new(drafter))
    }
}

impl FromStr for PromptLookupSpec {
    type Err = MethodError;

    fn from_str(text: &str) -> Result<Self, MethodError> {
        parse_spec(text)
    }
}

impl fmt::Display for PromptLookupSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        MethodText::new(Self::NAME)
            .with("k", self.k)
            .with("ngram-max", self.ngram_max)
            .with("ngram-min", self.ngram_min)
            .with("history", self.history)
            .fmt(f)
    }
}

/// `bigram`: drafts from a token bigram model counted over a corpus.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BigramSpec {
    /// The model file (`cargo xtask train-bigram` makes one).
    pub file: PathBuf,
    /// Fixed K, or `auto` (the default: the adaptive length).
    pub k: Option<DraftCount>,
}

impl BigramSpec {
    /// The drafter's length settings.
    pub fn config(&self) -> BigramConfig {
        match self.k {
            None | Some(DraftCount::Auto) => BigramConfig::adaptive(),
            Some(DraftCount::Fixed(k)) => BigramConfig::fixed(k),
        }
    }
}

impl MethodSpec for BigramSpec {
    const NAME: &'static str = "bigram";
    const KEYS: &'static [&'static str] = &[BIGRAM_FILE_KEY, "k"];

    fn from_settings(mut settings: Settings) -> Result<Self, MethodError> {
        let file = settings.take(BIGRAM_FILE_KEY).map(PathBuf::from);
        let k = settings.take_parsed("k")?;
        settings.finish()?;
        let Some(file) = file else {
            return Err(MethodError::Missing {
                method: Self::NAME,
                needs: "bigram=FILE (--bigram; make one with `cargo xtask train-bigram`)",
            });
        };
        Ok(Self { file, k })
    }

    fn build<B: Backend>(
        &self,
        ctx: &mut BuildContext<'_, B>,
    ) -> Result<Box<dyn Drafter<B>>, MethodError> {
        let model = BigramModel::load(&self.file).map_err(MethodError::build)?;
        let drafter = BigramDrafter::new(model, ctx.target.vocab_size, self.config(), ctx.device)
            .map_err(MethodError::build)?;
        Ok(Box::new(drafter))
    }
}

impl FromStr for BigramSpec {
    type Err = MethodError;

    fn from_str(text: &str) -> Result<Self, MethodError> {
        parse_spec(text)
    }
}

impl fmt::Display for BigramSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        MethodText::new(Self::NAME)
            .with(BIGRAM_FILE_KEY, Some(self.file.display()))
            .with("k", self.k)
            .fmt(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lookup(text: &str) -> PromptLookupSpec {
        text.parse().unwrap()
    }

    #[test]
    fn prompt_lookup_reads_its_keys_with_the_drafters_defaults() {
        let spec = lookup("prompt-lookup");
        assert_eq!(spec, PromptLookupSpec::default());
        assert_eq!(spec.config(), PromptLookupConfig::adaptive());
        assert_eq!(lookup("prompt-lookup:k=auto").config(), spec.config());

        let spec = lookup("prompt-lookup:ngram_max=4:ngram-min=2:k=8");
        assert_eq!(spec.k, Some(DraftCount::Fixed(8)));
        assert_eq!(
            spec.config(),
            PromptLookupConfig {
                k: 8,
                ngram_max: 4,
                ngram_min: 2,
                adaptive: false,
                history_tokens: 0,
            }
        );
        for (text, tokens) in [
            ("prompt-lookup:history=on", DEFAULT_HISTORY_TOKENS),
            ("prompt-lookup:history=off", 0),
            ("prompt-lookup:history=5000", 5000),
        ] {
            assert_eq!(lookup(text).config().history_tokens, tokens, "{text}");
        }
    }

    #[test]
    fn specs_print_what_was_given_and_read_it_back() {
        for text in [
            "prompt-lookup",
            "prompt-lookup:k=3",
            "prompt-lookup:k=auto:ngram-max=4:ngram-min=1:history=on",
            "prompt-lookup:history=off",
            "prompt-lookup:history=7",
        ] {
            let spec = lookup(text);
            assert_eq!(spec.to_string(), text);
            assert_eq!(lookup(&spec.to_string()), spec);
        }
        // Keys print in the spec's order, normalized.
        assert_eq!(
            lookup("prompt-lookup:history=on:ngram_min=2:k=4").to_string(),
            "prompt-lookup:k=4:ngram-min=2:history=on"
        );
        for text in ["bigram:bigram=b.bin", "bigram:bigram=/x/b.bin:k=auto"] {
            let spec: BigramSpec = text.parse().unwrap();
            assert_eq!(spec.to_string(), text);
            assert_eq!(spec.to_string().parse::<BigramSpec>().unwrap(), spec);
        }
        let spec: BigramSpec = "bigram:k=3:bigram=b.bin".parse().unwrap();
        assert_eq!(spec.to_string(), "bigram:bigram=b.bin:k=3");
        assert_eq!(spec.config(), BigramConfig::fixed(3));
        let spec: BigramSpec = "bigram:bigram=b.bin".parse().unwrap();
        assert_eq!(spec.config(), BigramConfig::adaptive());
    }

    #[test]
    fn bad_settings_are_errors_that_name_them() {
        let error = |text: &str| -> String {
            match text.parse::<PromptLookupSpec>() {
                Ok(spec) => panic!("{text} parsed as {spec:?}"),
                Err(e) => e.to_string(),
            }
        };
        assert_eq!(
            error("prompt-lookup:draft=x"),
            "`draft` is not a setting of prompt-lookup (its keys: k, ngram-max, ngram-min, \
             history)"
        );
        assert!(error("prompt-lookup:k=0").starts_with("prompt-lookup: k=0: "));
        assert!(error("prompt-lookup:k=x").starts_with("prompt-lookup: k=x: "));
        assert!(error("prompt-lookup:ngram-max=x").starts_with("prompt-lookup: ngram-max=x: "));
        assert!(error("prompt-lookup:history=maybe").contains("on, off or a number"));
        assert!(error("prompt-lookup:ngram-min=4:ngram-max=2").contains("ngram_min"));
        assert!(error("prompt-lookup:ngram-max=40").contains("ngram_max"));
        assert!(error("bigram:k=3").contains("not the method prompt-lookup"));

        let error = |text: &str| text.parse::<BigramSpec>().unwrap_err().to_string();
        assert_eq!(
            error("bigram:k=3"),
            "bigram needs bigram=FILE (--bigram; make one with `cargo xtask train-bigram`)"
        );
        assert!(error("bigram:bigram=b:depth=3").contains("`depth` is not a setting of bigram"));
        assert!(error("bigram:bigram=b:k=0").starts_with("bigram: k=0: "));
    }
}
