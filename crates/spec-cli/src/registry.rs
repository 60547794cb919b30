//! Every method `spec` knows, in one table: `spec generate --method` and `spec bench --methods`
//! parse their methods here and build them from here. A method crate owns its spec's keys,
//! defaults and drafter ([`MethodSpec`]); adding one is one line of `methods!` below.

use std::fmt;
use std::str::FromStr;

use burn::tensor::backend::Backend;
use spec_engine::Drafter;
use spec_engine::method::{BuildContext, MethodError, MethodSpec, MethodText, PlainSpec};
use spec_medusa::MedusaSpec;
use spec_ngram::spec::{BigramSpec, PromptLookupSpec};
use spec_runtime::model::WeightFormat;
use spec_sampling::spec::SamplingSpec;
use spec_tree::spec::TreeSpec;

/// Method names kept for the methods that are planned, with what each will be.
const RESERVED: &[(&str, &str)] = &[
    ("early-exit", "early-exit self-drafting"),
    ("layer-skip", "LayerSkip self-speculative decoding"),
];

/// How the registry knows a method: its name, keys and aliases, and its parser.
struct Entry {
    name: &'static str,
    keys: &'static [&'static str],
    aliases: &'static [(&'static str, &'static str)],
    parse: fn(MethodText) -> Result<Method, MethodError>,
}

impl Entry {
    /// The key `key` stands for (itself unless it is an alias), if the method takes it.
    fn key(&self, key: &str) -> Option<&'static str> {
        let key = self
            .aliases
            .iter()
            .find(|(alias, _)| *alias == key)
            .map_or(key, |(_, canonical)| canonical);
        self.keys.iter().copied().find(|k| *k == key)
    }
}

/// Declares [`Method`], one variant a method spec, and the table [`METHODS`] of their entries.
macro_rules! methods {
    ($($variant:ident($spec:ty)),* $(,)?) => {
        /// A method with its settings, as one of the method crates' specs.
        #[derive(Debug, Clone, PartialEq)]
        pub(crate) enum Method {
            $($variant($spec)),*
        }

        /// Every method, in the order `--help` and errors list them.
        const METHODS: &[Entry] = &[$(Entry {
            name: <$spec as MethodSpec>::NAME,
            keys: <$spec as MethodSpec>::KEYS,
            aliases: <$spec as MethodSpec>::ALIASES,
            parse: |text| <$spec as MethodSpec>::from_text(text).map(Method::$variant),
        }),*];

        impl Method {
            /// Builds the method's drafter for the target in `ctx`.
            pub(crate) fn build<B: Backend>(
                &self,
                ctx: &mut BuildContext<'_, B>,
            ) -> Result<Box<dyn Drafter<B>>, MethodError> {
                match self {
                    $(Self::$variant(spec) => spec.build(ctx)),*
                }
            }

            /// The draft model (name and format) the method runs, if any.
            pub(crate) fn draft_model(&self) -> Option<(&str, WeightFormat)> {
                match self {
                    $(Self::$variant(spec) => spec.draft_model()),*
                }
            }

            /// The fixed draft length of a draft-model method (see [`MethodSpec::fixed_length`]).
            pub(crate) fn fixed_length(&self) -> Option<usize> {
                match self {
                    $(Self::$variant(spec) => spec.fixed_length()),*
                }
            }

            /// The method's name.
            pub(crate) fn name(&self) -> &'static str {
                match self {
                    $(Self::$variant(_) => <$spec as MethodSpec>::NAME),*
                }
            }
        }

        impl fmt::Display for Method {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                match self {
                    $(Self::$variant(spec) => spec.fmt(f)),*
                }
            }
        }
    };
}

methods! {
    Plain(PlainSpec),
    PromptLookup(PromptLookupSpec),
    Bigram(BigramSpec),
    Sampling(SamplingSpec),
    Tree(TreeSpec),
    Medusa(MedusaSpec),
}

/// The entry of method `name`.
///
/// # Errors
/// [`MethodError::Reserved`] for a reserved name, [`MethodError::UnknownMethod`] (listing every
/// known and reserved name) for any other.
fn entry(name: &str) -> Result<&'static Entry, MethodError> {
    if let Some(entry) = METHODS.iter().find(|e| e.name == name) {
        return Ok(entry);
    }
    if let Some((_, purpose)) = RESERVED.iter().find(|(reserved, _)| *reserved == name) {
        return Err(MethodError::Reserved {
            name: name.to_owned(),
            purpose,
        });
    }
    Err(MethodError::UnknownMethod {
        name: name.to_owned(),
        known: known_names(),
        reserved: RESERVED.iter().map(|(name, _)| *name).collect(),
    })
}

/// The names of the methods that are built.
pub(crate) fn known_names() -> Vec<&'static str> {
    METHODS.iter().map(|e| e.name).collect()
}

/// Adds `key=value` to `text` where its method takes `key` and `text` does not give it (under
/// the key's name or an alias): the bench's defaults, such as its draft model.
///
/// # Errors
/// As for an unknown or reserved method name.
pub(crate) fn supply(text: &mut MethodText, key: &str, value: &str) -> Result<(), MethodError> {
    let entry = entry(&text.name)?;
    let Some(key) = entry.key(key) else {
        return Ok(());
    };
    if !text.settings.iter().any(|(k, _)| entry.key(k) == Some(key)) {
        text.settings.push((key.to_owned(), value.to_owned()));
    }
    Ok(())
}

/// Adds a `spec generate` flag's value to `text` as the key the flag stands for: `--k 4` is
/// `k=4`, `--draft-model D` is the key `draft-model` stands for in the method.
///
/// # Errors
/// A flag whose key the method does not take (naming the flag), a key also given in `text`.
pub(crate) fn add_flag(text: &mut MethodText, flag: &str, value: &str) -> Result<(), MethodError> {
    let entry = entry(&text.name)?;
    let Some(key) = entry.key(flag.trim_start_matches('-')) else {
        return Err(MethodError::UnknownKey {
            method: entry.name,
            key: flag.to_owned(),
            keys: entry.keys,
        });
    };
    let given = text.settings.iter().any(|(k, _)| entry.key(k) == Some(key));
    if given {
        return Err(MethodError::Duplicate {
            method: entry.name.to_owned(),
            key: key.to_owned(),
            how: format!(" (in --method and as {flag})"),
        });
    }
    text.settings.push((key.to_owned(), value.to_owned()));
    Ok(())
}

/// A line for `--help`: each method with its keys.
pub(crate) fn methods_help() -> String {
    let methods: Vec<String> = METHODS
        .iter()
        .map(|e| match e.keys {
            [] => e.name.to_owned(),
            keys => format!("{} ({})", e.name, keys.join(", ")),
        })
        .collect();
    methods.join("; ")
}

impl Method {
    /// The method `text` names, with its settings.
    ///
    /// # Errors
    /// An unknown or reserved name, or settings the method refuses.
    pub(crate) fn from_text(text: MethodText) -> Result<Self, MethodError> {
        (entry(&text.name)?.parse)(text)
    }

    pub(crate) fn is_plain(&self) -> bool {
        matches!(self, Self::Plain(_))
    }
}

impl FromStr for Method {
    type Err = MethodError;

    fn from_str(text: &str) -> Result<Self, MethodError> {
        Self::from_text(text.parse()?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_method_parses_and_prints_through_the_registry() {
        for text in [
            "plain",
            "prompt-lookup:k=auto:history=on",
            "bigram:bigram=b.bin:k=3",
            "sampling:draft=qwen2.5-coder-0.5b:k=auto",
            "sampling:draft=d:k=8:threshold=0.5:draft-weights=q8_0",
            "tree:draft=qwen2.5-coder-0.5b:shape=4x2x1",
            "tree:lookup=on:bigram=b.bin:nodes=16",
        ] {
            let method: Method = text.parse().unwrap();
            assert_eq!(method.to_string(), text);
            assert_eq!(method.to_string().parse::<Method>().unwrap(), method);
            assert_eq!(Some(method.name()), text.split(':').next());
        }
        assert!("plain".parse::<Method>().unwrap().is_plain());
        let sampling: Method = "sampling:draft=d:k=3".parse().unwrap();
        assert_eq!(sampling.fixed_length(), Some(3));
        assert_eq!(sampling.draft_model(), Some(("d", WeightFormat::Q8_0A8)));
        let lookup: Method = "prompt-lookup:k=5".parse().unwrap();
        assert_eq!(lookup.fixed_length(), None);
        assert_eq!(lookup.draft_model(), None);
    }

    #[test]
    fn an_unknown_method_lists_every_known_and_reserved_one() {
        let e = "nope".parse::<Method>().unwrap_err().to_string();
        assert_eq!(
            e,
            "unknown method `nope` (known: plain, prompt-lookup, bigram, sampling, tree, medusa; \
             reserved, not built yet: early-exit, layer-skip)"
        );
        for name in ["early-exit", "layer-skip"] {
            let e = name.parse::<Method>().unwrap_err();
            assert!(matches!(e, MethodError::Reserved { .. }), "{e}");
            assert!(e.to_string().ends_with("not built yet"), "{e}");
        }
        assert!(
            "medusa"
                .parse::<Method>()
                .unwrap_err()
                .to_string()
                .contains("heads=FILE")
        );
    }

    #[test]
    fn flags_add_the_keys_they_stand_for() {
        let mut text: MethodText = "sampling:k=auto".parse().unwrap();
        add_flag(&mut text, "--draft-model", "d").unwrap();
        add_flag(&mut text, "--draft-threshold", "0.5").unwrap();
        // A threshold stops chains of at most k drafts: `auto` sets its own lengths.
        assert!(matches!(
            Method::from_text(text),
            Err(MethodError::Invalid { .. })
        ));
        let mut text: MethodText = "sampling".parse().unwrap();
        add_flag(&mut text, "--draft-model", "d").unwrap();
        add_flag(&mut text, "--k", "6").unwrap();
        add_flag(&mut text, "--draft-threshold", "0.5").unwrap();
        add_flag(&mut text, "--draft-weights", "q8_0").unwrap();
        assert_eq!(
            Method::from_text(text).unwrap().to_string(),
            "sampling:draft=d:k=6:threshold=0.5:draft-weights=q8_0"
        );

        let mut text: MethodText = "prompt-lookup".parse().unwrap();
        assert_eq!(
            add_flag(&mut text, "--draft-model", "d")
                .unwrap_err()
                .to_string(),
            "`--draft-model` is not a setting of prompt-lookup (its keys: k, ngram-max, \
             ngram-min, history)"
        );
        let mut text: MethodText = "plain".parse().unwrap();
        assert_eq!(
            add_flag(&mut text, "--k", "3").unwrap_err().to_string(),
            "`--k` is not a setting of plain (it takes none)"
        );
        let mut text: MethodText = "sampling:draft=a".parse().unwrap();
        assert_eq!(
            add_flag(&mut text, "--draft-model", "b")
                .unwrap_err()
                .to_string(),
            "sampling: `draft` is given twice (in --method and as --draft-model)"
        );
        let mut text: MethodText = "bigram:k=2".parse().unwrap();
        add_flag(&mut text, "--bigram", "b.bin").unwrap();
        assert_eq!(
            Method::from_text(text).unwrap().to_string(),
            "bigram:bigram=b.bin:k=2"
        );
        let mut text: MethodText = "nope".parse().unwrap();
        assert!(matches!(
            add_flag(&mut text, "--k", "3"),
            Err(MethodError::UnknownMethod { .. })
        ));
    }

    #[test]
    fn defaults_are_supplied_only_where_a_method_takes_the_key_and_lacks_it() {
        let supplied = |text: &str| {
            let mut text: MethodText = text.parse().unwrap();
            supply(&mut text, "draft", "d").unwrap();
            text.to_string()
        };
        assert_eq!(supplied("sampling:k=3"), "sampling:k=3:draft=d");
        assert_eq!(supplied("sampling:draft=x"), "sampling:draft=x");
        assert_eq!(supplied("sampling:draft-model=x"), "sampling:draft-model=x");
        assert_eq!(supplied("prompt-lookup"), "prompt-lookup");
        let mut text: MethodText = "nope".parse().unwrap();
        assert!(supply(&mut text, "draft", "d").is_err());
    }

    #[test]
    fn keys_are_known_by_method() {
        let help = methods_help();
        assert!(
            help.starts_with("plain; prompt-lookup (k, ngram-max"),
            "{help}"
        );
        assert_eq!(
            known_names(),
            [
                "plain",
                "prompt-lookup",
                "bigram",
                "sampling",
                "tree",
                "medusa"
            ]
        );
    }
}
