//! Methods as text and as types.
//!
//! A method is written `NAME[:key=value]...` everywhere (`spec generate --method`, each item of
//! `spec bench --methods`): `sampling:k=4:draft=qwen2.5-coder-0.5b`. [`MethodText`] is that text
//! parsed once; each method crate owns a [`MethodSpec`], a typed reading of its keys with their
//! defaults, which builds the method's [`Drafter`]. Whatever lists methods (the CLI's registry)
//! dispatches on [`MethodSpec::NAME`] and never reads a method's keys itself.

use std::fmt;
use std::str::FromStr;

use burn::tensor::backend::Backend;
use spec_runtime::model::{Transformer, WeightFormat};
use spec_tokenizer::TextTokenizer;

use crate::{Drafter, NoDraft};

/// Any error, boxed: what a draft model source or a drafter's constructor may fail with.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Why a method's text or settings are not a method that can be built.
#[derive(Debug, thiserror::Error)]
pub enum MethodError {
    /// Not `NAME[:key=value]...`.
    #[error("`{text}`: {reason}")]
    Syntax { text: String, reason: String },
    #[error("unknown method `{name}` (known: {}; reserved, not built yet: {})", known.join(", "), reserved.join(", "))]
    UnknownMethod {
        name: String,
        known: Vec<&'static str>,
        reserved: Vec<&'static str>,
    },
    /// A name or setting kept for a method that is planned but not built.
    #[error("`{name}` is reserved for {purpose}, not built yet")]
    Reserved { name: String, purpose: &'static str },
    /// A key (or a flag standing for one) that the method does not take.
    #[error("`{key}` is not a setting of {method} ({})", keys_phrase(keys))]
    UnknownKey {
        method: &'static str,
        key: String,
        keys: &'static [&'static str],
    },
    /// A key given twice (`how` says where, when not both in the text).
    #[error("{method}: `{key}` is given twice{how}")]
    Duplicate {
        method: String,
        key: String,
        how: String,
    },
    #[error("{method}: {key}={value}: {reason}")]
    BadValue {
        method: &'static str,
        key: &'static str,
        value: String,
        reason: String,
    },
    /// A required key is missing; `needs` says what to give, e.g. `draft=MODEL (--draft-model)`.
    #[error("{method} needs {needs}")]
    Missing {
        method: &'static str,
        needs: &'static str,
    },
    /// Settings that are each valid but not together, or that the drafter refuses.
    #[error("{method}: {reason}")]
    Invalid {
        method: &'static str,
        reason: String,
    },
    /// A spec parsed as the wrong method's.
    #[error("`{got}` is not the method {expected}")]
    OtherMethod { expected: &'static str, got: String },
    /// Building the drafter failed: a file, a draft model, vocabularies that differ.
    #[error(transparent)]
    Build(BoxError),
}

impl MethodError {
    /// A [`MethodError::Build`] from any error.
    pub fn build(error: impl Into<BoxError>) -> Self {
        Self::Build(error.into())
    }
}

/// "its keys: a, b" or "it takes none".
fn keys_phrase(keys: &[&str]) -> String {
    if keys.is_empty() {
        "it takes none".to_owned()
    } else {
        format!("its keys: {}", keys.join(", "))
    }
}

/// A method as written, `NAME[:key=value]...`: its name and its settings in the order given.
/// Keys are normalized (`ngram_max` is `ngram-max`); a key given twice is an error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MethodText {
    pub name: String,
    pub settings: Vec<(String, String)>,
}

impl MethodText {
    /// A method without settings.
    pub fn new(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            settings: Vec::new(),
        }
    }

    /// These settings and `key=value`, where there is a value (for printing a spec: the keys it
    /// was given, in the spec's order).
    pub fn with(mut self, key: &str, value: Option<impl fmt::Display>) -> Self {
        if let Some(value) = value {
            self.settings.push((key.to_owned(), value.to_string()));
        }
        self
    }

    /// The value of `key`, if given.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.settings
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// Removes `key` and returns its value, if given (the bench takes its own `target=` off
    /// before the method reads the rest).
    pub fn take(&mut self, key: &str) -> Option<String> {
        let index = self.settings.iter().position(|(k, _)| k == key)?;
        Some(self.settings.remove(index).1)
    }

    /// Adds `key=value`; an error where `key` is given already.
    pub fn push(&mut self, key: &str, value: &str) -> Result<(), MethodError> {
        let key = normalize_key(key);
        if self.get(&key).is_some() {
            return Err(MethodError::Duplicate {
                method: self.name.clone(),
                key,
                how: String::new(),
            });
        }
        self.settings.push((key, value.to_owned()));
        Ok(())
    }
}

/// `ngram_max` → `ngram-max`.
fn normalize_key(key: &str) -> String {
    key.trim().replace('_', "-")
}

impl FromStr for MethodText {
    type Err = MethodError;

    fn from_str(text: &str) -> Result<Self, MethodError> {
        let text = text.trim();
        let syntax = |reason: String| MethodError::Syntax {
            text: text.to_owned(),
            reason,
        };
        let mut parts = text.split(':');
        let name = parts.next().unwrap_or_default().trim();
        if name.is_empty() || name.contains('=') {
            return Err(syntax(
                "a method starts with its name, e.g. `sampling:k=4`".to_owned(),
            ));
        }
        let mut method = Self::new(name);
        for part in parts {
            let Some((key, value)) = part.split_once('=') else {
                return Err(syntax(format!("`{part}` is not key=value")));
            };
            let (key, value) = (key.trim(), value.trim());
            if key.is_empty() {
                return Err(syntax(format!("`{part}` has no key")));
            }
            if value.is_empty() {
                return Err(syntax(format!("`{key}` has no value")));
            }
            method.push(key, value)?;
        }
        Ok(method)
    }
}

impl fmt::Display for MethodText {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name)?;
        for (key, value) in &self.settings {
            write!(f, ":{key}={value}")?;
        }
        Ok(())
    }
}

/// A method's settings as its spec reads them: each key taken once, its aliases already read as
/// the key, and [`Settings::finish`] an error for any key left, so that nothing given is
/// silently ignored.
#[derive(Debug)]
pub struct Settings {
    method: &'static str,
    keys: &'static [&'static str],
    entries: Vec<(String, String)>,
}

impl Settings {
    /// The settings of `text` for the method `S`: its aliases replaced by their keys.
    ///
    /// # Errors
    /// [`MethodError::OtherMethod`] where `text` names another method;
    /// [`MethodError::Duplicate`] where a key is given both as itself and as an alias.
    pub fn of<S: MethodSpec>(text: MethodText) -> Result<Self, MethodError> {
        if text.name != S::NAME {
            return Err(MethodError::OtherMethod {
                expected: S::NAME,
                got: text.name,
            });
        }
        let mut entries: Vec<(String, String)> = Vec::with_capacity(text.settings.len());
        for (key, value) in text.settings {
            let key = canonical_key::<S>(&key).to_owned();
            if entries.iter().any(|(k, _)| *k == key) {
                return Err(MethodError::Duplicate {
                    method: S::NAME.to_owned(),
                    key,
                    how: " (as itself and as an alias)".to_owned(),
                });
            }
            entries.push((key, value));
        }
        Ok(Self {
            method: S::NAME,
            keys: S::KEYS,
            entries,
        })
    }

    /// The method these settings are of.
    pub fn method(&self) -> &'static str {
        self.method
    }

    /// Takes `key`'s value, if given.
    pub fn take(&mut self, key: &str) -> Option<String> {
        let index = self.entries.iter().position(|(k, _)| k == key)?;
        Some(self.entries.remove(index).1)
    }

    /// Takes `key`'s value parsed as `T`.
    ///
    /// # Errors
    /// [`MethodError::BadValue`], naming the key and the value, where it does not parse.
    pub fn take_parsed<T>(&mut self, key: &'static str) -> Result<Option<T>, MethodError>
    where
        T: FromStr,
        T::Err: fmt::Display,
    {
        self.take_with(key, |value| value.parse::<T>().map_err(|e| e.to_string()))
    }

    /// Takes `key`'s value read by `parse`, whose error is the reason the value is bad.
    ///
    /// # Errors
    /// [`MethodError::BadValue`] where `parse` fails.
    pub fn take_with<T>(
        &mut self,
        key: &'static str,
        parse: impl FnOnce(&str) -> Result<T, String>,
    ) -> Result<Option<T>, MethodError> {
        let Some(value) = self.take(key) else {
            return Ok(None);
        };
        match parse(&value) {
            Ok(parsed) => Ok(Some(parsed)),
            Err(reason) => Err(MethodError::BadValue {
                method: self.method,
                key,
                value,
                reason,
            }),
        }
    }

    /// Ends the reading.
    ///
    /// # Errors
    /// [`MethodError::UnknownKey`] for the first key not taken, with the method's keys.
    pub fn finish(self) -> Result<(), MethodError> {
        match self.entries.into_iter().next() {
            None => Ok(()),
            Some((key, _)) => Err(MethodError::UnknownKey {
                method: self.method,
                key,
                keys: self.keys,
            }),
        }
    }
}

/// The key that `key` stands for in method `S` (itself unless it is one of `S`'s aliases).
pub fn canonical_key<S: MethodSpec>(key: &str) -> &str {
    S::ALIASES
        .iter()
        .find(|(alias, _)| *alias == key)
        .map_or(key, |(_, canonical)| canonical)
}

/// A method's `k`: a number of drafts (at least 1), or `auto` where the method picks it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DraftCount {
    Auto,
    Fixed(usize),
}

impl FromStr for DraftCount {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        if text.eq_ignore_ascii_case("auto") {
            return Ok(Self::Auto);
        }
        match text.parse::<usize>() {
            Ok(0) => Err("the draft length must be at least 1 (plain decoding drafts none)".into()),
            Ok(k) => Ok(Self::Fixed(k)),
            Err(_) => Err("give a whole number of drafts or `auto`".into()),
        }
    }
}

impl fmt::Display for DraftCount {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Auto => f.write_str("auto"),
            Self::Fixed(k) => write!(f, "{k}"),
        }
    }
}

/// A draft model as a [`DraftModelSource`] hands it out.
pub enum DraftModel<'a, B: Backend> {
    /// The target's own weights: asked for the target's checkpoint in the target's format, so
    /// that a self-draft streams one copy of the weights rather than two taking turns.
    Target,
    Loaded {
        model: &'a Transformer<B>,
        tokenizer: &'a TextTokenizer,
    },
}

impl<B: Backend> fmt::Debug for DraftModel<'_, B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Target => f.write_str("Target"),
            Self::Loaded { .. } => f.write_str("Loaded"),
        }
    }
}

/// Where methods get their draft models: loads them by name (a path or reference name) and
/// format, and may keep them to share between methods (a bench sweeping K loads its draft once).
pub trait DraftModelSource<B: Backend> {
    /// The draft model `name` with its projections kept in `format`.
    ///
    /// # Errors
    /// A model that cannot be found or loaded.
    fn draft_model(
        &mut self,
        name: &str,
        format: WeightFormat,
    ) -> Result<DraftModel<'_, B>, BoxError>;
}

/// What a method's drafter is built against.
pub struct BuildContext<'a, B: Backend> {
    pub target: &'a Transformer<B>,
    /// The target's checkpoint (file or directory): what trained drafters (Medusa heads) are
    /// checked against.
    pub target_path: &'a std::path::Path,
    /// The target's tokenizer.
    pub tokenizer: &'a TextTokenizer,
    pub device: &'a B::Device,
    pub drafts: &'a mut dyn DraftModelSource<B>,
}

impl<B: Backend> fmt::Debug for BuildContext<'_, B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BuildContext")
            .field("target_vocab", &self.target.vocab_size)
            .finish_non_exhaustive()
    }
}

/// A method's typed settings: parsed from and printed as `NAME[:key=value]...` (the two
/// round-trip), with the construction of its drafter.
pub trait MethodSpec:
    FromStr<Err = MethodError> + fmt::Display + Clone + fmt::Debug + PartialEq
{
    /// The method's name, as written.
    const NAME: &'static str;
    /// Its keys, in the order it prints them.
    const KEYS: &'static [&'static str];
    /// Other names of keys, `(alias, key)`: read as the key, printed as the key.
    const ALIASES: &'static [(&'static str, &'static str)] = &[];

    /// Reads the method's keys (and finishes `settings`, so that a key it does not take is an
    /// error).
    ///
    /// # Errors
    /// A key it does not take, a bad or missing value.
    fn from_settings(settings: Settings) -> Result<Self, MethodError>;

    /// The method as given by `text`, which must name it.
    ///
    /// # Errors
    /// As [`Settings::of`] and [`MethodSpec::from_settings`].
    fn from_text(text: MethodText) -> Result<Self, MethodError> {
        Self::from_settings(Settings::of::<Self>(text)?)
    }

    /// Builds the method's drafter for the target in `ctx`.
    ///
    /// # Errors
    /// [`MethodError::Build`]: a file or draft model that cannot be loaded, a drafter that
    /// refuses its target.
    fn build<B: Backend>(
        &self,
        ctx: &mut BuildContext<'_, B>,
    ) -> Result<Box<dyn Drafter<B>>, MethodError>;

    /// The draft model (name and format) the method runs, if any.
    fn draft_model(&self) -> Option<(&str, WeightFormat)> {
        None
    }

    /// The fixed number of drafts a step of a draft-model method proposes; `None` where the
    /// length varies or the method has no draft model.
    fn fixed_length(&self) -> Option<usize> {
        None
    }
}

/// `text` parsed as method `S` (for `S`'s [`FromStr`]).
///
/// # Errors
/// As [`MethodText`]'s parser and [`MethodSpec::from_text`].
pub fn parse_spec<S: MethodSpec>(text: &str) -> Result<S, MethodError> {
    S::from_text(text.parse()?)
}

/// Plain decoding: no drafts, no keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PlainSpec;

impl MethodSpec for PlainSpec {
    const NAME: &'static str = "plain";
    const KEYS: &'static [&'static str] = &[];

    fn from_settings(settings: Settings) -> Result<Self, MethodError> {
        settings.finish()?;
        Ok(Self)
    }

    fn build<B: Backend>(
        &self,
        _ctx: &mut BuildContext<'_, B>,
    ) -> Result<Box<dyn Drafter<B>>, MethodError> {
        Ok(Box::new(NoDraft))
    }
}

impl FromStr for PlainSpec {
    type Err = MethodError;

    fn from_str(text: &str) -> Result<Self, MethodError> {
        parse_spec(text)
    }
}

impl fmt::Display for PlainSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(Self::NAME)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(s: &str) -> MethodText {
        s.parse().unwrap()
    }

    #[test]
    fn method_text_parses_names_and_normalized_keys() {
        let t = text(" sampling:k=auto: draft = qwen2.5-coder-0.5b :ngram_max=3 ");
        assert_eq!(t.name, "sampling");
        assert_eq!(
            t.settings,
            [
                ("k".to_owned(), "auto".to_owned()),
                ("draft".into(), "qwen2.5-coder-0.5b".into()),
                ("ngram-max".into(), "3".into()),
            ]
        );
        assert_eq!(
            t.to_string(),
            "sampling:k=auto:draft=qwen2.5-coder-0.5b:ngram-max=3"
        );
        assert_eq!(text(&t.to_string()), t);
        assert_eq!(text("plain"), MethodText::new("plain"));
    }

    #[test]
    fn method_text_rejects_what_is_not_name_and_settings() {
        for (bad, says) in [
            ("", "starts with its name"),
            (":k=3", "starts with its name"),
            ("k=3", "starts with its name"),
            ("bigram:k", "`k` is not key=value"),
            ("bigram::k=3", "`` is not key=value"),
            ("bigram:=3", "has no key"),
            ("x:k=", "`k` has no value"),
            ("x:k=1:k=2", "`k` is given twice"),
            ("x:ngram_max=1:ngram-max=2", "`ngram-max` is given twice"),
        ] {
            let e = bad.parse::<MethodText>().unwrap_err().to_string();
            assert!(e.contains(says), "{bad:?}: {e}");
        }
    }

    #[test]
    fn method_text_takes_and_pushes_settings() {
        let mut t = text("sampling:target=x.gguf:k=4");
        assert_eq!(t.take("target").as_deref(), Some("x.gguf"));
        assert_eq!(t.take("target"), None);
        t.push("draft", "d").unwrap();
        assert_eq!(t.get("draft"), Some("d"));
        assert!(t.push("k", "5").is_err());
        assert_eq!(t.to_string(), "sampling:k=4:draft=d");
    }

    /// A spec with an alias, for the reader's tests.
    #[derive(Debug, Clone, PartialEq)]
    struct Probe {
        n: Option<usize>,
        name: Option<String>,
    }

    impl MethodSpec for Probe {
        const NAME: &'static str = "probe";
        const KEYS: &'static [&'static str] = &["n", "name"];
        const ALIASES: &'static [(&'static str, &'static str)] = &[("label", "name")];

        fn from_settings(mut settings: Settings) -> Result<Self, MethodError> {
            let n = settings.take_parsed("n")?;
            let name = settings.take("name");
            settings.finish()?;
            Ok(Self { n, name })
        }

        fn build<B: Backend>(
            &self,
            _ctx: &mut BuildContext<'_, B>,
        ) -> Result<Box<dyn Drafter<B>>, MethodError> {
            Ok(Box::new(NoDraft))
        }
    }

    impl FromStr for Probe {
        type Err = MethodError;

        fn from_str(text: &str) -> Result<Self, MethodError> {
            parse_spec(text)
        }
    }

    impl fmt::Display for Probe {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            MethodText::new(Self::NAME)
                .with("n", self.n)
                .with("name", self.name.as_ref())
                .fmt(f)
        }
    }

    #[test]
    fn settings_read_each_key_once_and_refuse_the_rest() {
        let p: Probe = "probe:label=x:n=3".parse().unwrap();
        assert_eq!(
            p,
            Probe {
                n: Some(3),
                name: Some("x".into())
            }
        );
        assert_eq!(p.to_string(), "probe:n=3:name=x");
        assert_eq!(p.to_string().parse::<Probe>().unwrap(), p);

        let e = "probe:depth=3".parse::<Probe>().unwrap_err();
        assert!(matches!(e, MethodError::UnknownKey { .. }));
        assert_eq!(
            e.to_string(),
            "`depth` is not a setting of probe (its keys: n, name)"
        );
        let e = "probe:n=x".parse::<Probe>().unwrap_err().to_string();
        assert!(e.starts_with("probe: n=x: "), "{e}");
        let e = "probe:name=a:label=b".parse::<Probe>().unwrap_err();
        assert!(matches!(e, MethodError::Duplicate { .. }), "{e}");
        let e = "plain:n=3".parse::<Probe>().unwrap_err();
        assert!(matches!(e, MethodError::OtherMethod { .. }), "{e}");
    }

    #[test]
    fn plain_takes_no_keys() {
        assert_eq!("plain".parse::<PlainSpec>().unwrap(), PlainSpec);
        assert_eq!(PlainSpec.to_string(), "plain");
        let e = "plain:k=3".parse::<PlainSpec>().unwrap_err().to_string();
        assert_eq!(e, "`k` is not a setting of plain (it takes none)");
    }

    #[test]
    fn draft_counts_are_auto_or_at_least_one() {
        assert_eq!("auto".parse(), Ok(DraftCount::Auto));
        assert_eq!("AUTO".parse(), Ok(DraftCount::Auto));
        assert_eq!("5".parse(), Ok(DraftCount::Fixed(5)));
        assert!(
            "0".parse::<DraftCount>()
                .unwrap_err()
                .contains("at least 1")
        );
        assert!("x".parse::<DraftCount>().is_err());
        assert!("-1".parse::<DraftCount>().is_err());
        for k in [DraftCount::Auto, DraftCount::Fixed(7)] {
            assert_eq!(k.to_string().parse(), Ok(k));
        }
    }
}
