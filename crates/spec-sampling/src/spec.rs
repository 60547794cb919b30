//! Speculative sampling as `spec` takes it: `sampling:draft=MODEL[:k=N|auto][:threshold=P]
//! [:draft-weights=FORMAT][:online=off]`.

use std::fmt;
use std::str::FromStr;

use burn::tensor::backend::Backend;
use spec_engine::Drafter;
use spec_engine::method::{
    BuildContext, DraftCount, DraftModel, MethodError, MethodSpec, MethodText, Settings, parse_spec,
};
use spec_runtime::model::WeightFormat;

use crate::{DraftLength, DraftModelDrafter, weight_cost_prior};

/// How a draft model's projections are packed unless `draft-weights=` says otherwise. Q8_0
/// rounds only the draft, which changes how often its tokens are accepted, never what is
/// generated; it cut the 0.5B draft's step to 0.43-0.44 of f32's. With activations rounded to
/// int8 too (q8_0-a8), the 0.5B's prompt and steps cost less again (c 0.109-0.127 against
/// 0.131-0.156 for q8_0, the same tokens accepted; docs/benchmarks.md at 6aef5e8, "The main
/// job's draft format").
pub const DEFAULT_DRAFT_WEIGHTS: WeightFormat = WeightFormat::Q8_0A8;

/// The key that names the draft model, which `spec bench` supplies (its default draft, or
/// `--models`' second) where a method takes it and names none.
pub const DRAFT_MODEL_KEY: &str = "draft";

/// Whether the draft model learns from the target while it runs (`online=`): only `off` is
/// built; `on` is reserved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Online {
    Off,
}

impl fmt::Display for Online {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Off => f.write_str("off"),
        }
    }
}

/// `sampling`: a draft model proposes a chain, the target verifies it (see the crate docs).
#[derive(Debug, Clone, PartialEq)]
pub struct SamplingSpec {
    /// The draft model: a path or reference name.
    pub draft: String,
    /// Fixed K (default [`crate::DEFAULT_K`]), or `auto`.
    pub k: Option<DraftCount>,
    /// End a chain of at most K drafts once the draft's top probability falls below this.
    pub threshold: Option<f64>,
    /// How the draft's projections are kept (default [`DEFAULT_DRAFT_WEIGHTS`]).
    pub draft_weights: Option<WeightFormat>,
    pub online: Option<Online>,
}

impl SamplingSpec {
    /// A spec of `draft` with every other key at its default.
    pub fn new(draft: impl Into<String>) -> Self {
        Self {
            draft: draft.into(),
            k: None,
            threshold: None,
            draft_weights: None,
            online: None,
        }
    }

    /// The draft length policy of `k` and `threshold`.
    ///
    /// # Errors
    /// A threshold outside `(0, 1)`, or one with `k=auto`.
    pub fn length(&self) -> crate::Result<DraftLength> {
        let k = self.k.map(|k| k.to_string());
        DraftLength::parse_with_threshold(k.as_deref(), self.threshold)
    }

    /// The draft's weight format.
    pub fn draft_format(&self) -> WeightFormat {
        self.draft_weights.unwrap_or(DEFAULT_DRAFT_WEIGHTS)
    }
}

impl MethodSpec for SamplingSpec {
    const NAME: &'static str = "sampling";
    const KEYS: &'static [&'static str] =
        &[DRAFT_MODEL_KEY, "k", "threshold", "draft-weights", "online"];
    const ALIASES: &'static [(&'static str, &'static str)] = &[
        ("draft-model", DRAFT_MODEL_KEY),
        ("draft-threshold", "threshold"),
    ];

    fn from_settings(mut settings: Settings) -> Result<Self, MethodError> {
        let draft = settings.take(DRAFT_MODEL_KEY);
        let k = settings.take_parsed("k")?;
        let threshold = settings.take_parsed("threshold")?;
        let draft_weights = settings.take_parsed("draft-weights")?;
        let online = match settings.take("online").as_deref() {
            None => None,
            Some("off") => Some(Online::Off),
            Some("on") => {
                return Err(MethodError::Reserved {
                    name: "sampling:online=on".to_owned(),
                    purpose: "online speculative decoding (a draft model distilled from the \
                              target as it runs)",
                });
            }
            Some(other) => {
                return Err(MethodError::BadValue {
                    method: Self::NAME,
                    key: "online",
                    value: other.to_owned(),
                    reason: "only `off` is built (`on` is reserved)".to_owned(),
                });
            }
        };
        settings.finish()?;
        let Some(draft) = draft else {
            return Err(MethodError::Missing {
                method: Self::NAME,
                needs: "draft=MODEL (--draft-model: a path or reference name, e.g. \
                        qwen2.5-coder-0.5b)",
            });
        };
        let spec = Self {
            draft,
            k,
            threshold,
            draft_weights,
            online,
        };
        spec.length().map_err(|e| MethodError::Invalid {
            method: Self::NAME,
            reason: e.to_string(),
        })?;
        Ok(spec)
    }

    /// The drafter, its vocabulary checked against the target's through both tokenizers, with
    /// the ratio of the models' weight bytes as the guess of `c` until the draft is timed.
    fn build<B: Backend>(
        &self,
        ctx: &mut BuildContext<'_, B>,
    ) -> Result<Box<dyn Drafter<B>>, MethodError> {
        let length = self.length().map_err(MethodError::build)?;
        let (target, tokenizer) = (ctx.target, ctx.tokenizer);
        let (draft, draft_tokenizer) = match ctx
            .drafts
            .draft_model(&self.draft, self.draft_format())
            .map_err(MethodError::Build)?
        {
            DraftModel::Target => (target, tokenizer),
            DraftModel::Loaded { model, tokenizer } => (model, tokenizer),
        };
        let drafter = DraftModelDrafter::with_tokenizers(
            draft.clone(),
            draft_tokenizer,
            target.vocab_size,
            tokenizer,
            length,
        )
        .map_err(MethodError::build)?;
        Ok(Box::new(match weight_cost_prior(draft, target) {
            Some(c) => drafter.with_cost_prior(c),
            None => drafter,
        }))
    }

    fn draft_model(&self) -> Option<(&str, WeightFormat)> {
        Some((&self.draft, self.draft_format()))
    }

    fn fixed_length(&self) -> Option<usize> {
        match self.length().ok()? {
            DraftLength::Fixed(k) => Some(k),
            DraftLength::Confident { .. } | DraftLength::Auto { .. } => None,
        }
    }
}

impl FromStr for SamplingSpec {
    type Err = MethodError;

    fn from_str(text: &str) -> Result<Self, MethodError> {
        parse_spec(text)
    }
}

impl fmt::Display for SamplingSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        MethodText::new(Self::NAME)
            .with(DRAFT_MODEL_KEY, Some(&self.draft))
            .with("k", self.k)
            .with("threshold", self.threshold)
            .with("draft-weights", self.draft_weights)
            .with("online", self.online)
            .fmt(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{DEFAULT_K, DEFAULT_K_MAX};

    fn spec(text: &str) -> SamplingSpec {
        text.parse().unwrap()
    }

    fn error(text: &str) -> MethodError {
        match text.parse::<SamplingSpec>() {
            Ok(spec) => panic!("{text} parsed as {spec:?}"),
            Err(e) => e,
        }
    }

    #[test]
    fn sampling_reads_its_keys_with_their_defaults() {
        let s = spec("sampling:draft=qwen2.5-coder-0.5b");
        assert_eq!(s, SamplingSpec::new("qwen2.5-coder-0.5b"));
        assert_eq!(s.length().unwrap(), DraftLength::Fixed(DEFAULT_K));
        assert_eq!(s.fixed_length(), Some(DEFAULT_K));
        assert_eq!(
            s.draft_model(),
            Some(("qwen2.5-coder-0.5b", DEFAULT_DRAFT_WEIGHTS))
        );

        let s = spec("sampling:k=auto:draft-model=d.gguf:draft_weights=q8_0");
        assert_eq!(s.draft, "d.gguf");
        assert_eq!(
            s.length().unwrap(),
            DraftLength::Auto { max: DEFAULT_K_MAX }
        );
        assert_eq!(s.fixed_length(), None);
        assert_eq!(s.draft_model(), Some(("d.gguf", WeightFormat::Q8_0)));

        let s = spec("sampling:draft=d:k=6:draft-threshold=0.4");
        assert_eq!(
            s.length().unwrap(),
            DraftLength::Confident {
                max: 6,
                threshold: 0.4
            }
        );
        assert_eq!(s.fixed_length(), None);
        assert_eq!(s.threshold, Some(0.4));
        let s = spec("sampling:draft=d:threshold=0.5");
        assert_eq!(s.length().unwrap().max(), DEFAULT_K_MAX);
        assert_eq!(spec("sampling:draft=d:k=3").fixed_length(), Some(3));
        assert_eq!(
            spec("sampling:draft=d:online=off").online,
            Some(Online::Off)
        );
    }

    #[test]
    fn sampling_specs_print_what_was_given_and_read_it_back() {
        for text in [
            "sampling:draft=d",
            "sampling:draft=qwen2.5-coder-0.5b:k=auto",
            "sampling:draft=d:k=8:threshold=0.5:draft-weights=q4-a8-lossy:online=off",
            "sampling:draft=/models/x.gguf:draft-weights=q8_0-a8",
        ] {
            let s = spec(text);
            assert_eq!(s.to_string(), text);
            assert_eq!(spec(&s.to_string()), s);
        }
        // Aliases and other spellings print as the keys, in the spec's order.
        let s = spec("sampling:draft-weights=q8:draft-threshold=0.25:k=5:draft-model=d");
        assert_eq!(
            s.to_string(),
            "sampling:draft=d:k=5:threshold=0.25:draft-weights=q8_0"
        );
        assert_eq!(spec(&s.to_string()), s);
    }

    #[test]
    fn bad_sampling_settings_are_errors_that_name_them() {
        assert_eq!(
            error("sampling:k=4").to_string(),
            "sampling needs draft=MODEL (--draft-model: a path or reference name, e.g. \
             qwen2.5-coder-0.5b)"
        );
        let e = error("sampling:draft=d:online=on");
        assert!(matches!(e, MethodError::Reserved { .. }), "{e}");
        assert!(e.to_string().contains("not built yet"), "{e}");
        assert!(matches!(
            error("sampling:draft=d:online=maybe"),
            MethodError::BadValue { key: "online", .. }
        ));
        for (text, key) in [
            ("sampling:draft=d:k=0", "k"),
            ("sampling:draft=d:k=many", "k"),
            ("sampling:draft=d:threshold=high", "threshold"),
            ("sampling:draft=d:draft-weights=q3", "draft-weights"),
        ] {
            let e = error(text);
            assert!(
                matches!(&e, MethodError::BadValue { key: k, .. } if *k == key),
                "{text}: {e}"
            );
            assert!(
                e.to_string().starts_with(&format!("sampling: {key}=")),
                "{e}"
            );
        }
        for text in [
            "sampling:draft=d:threshold=1.5",
            "sampling:draft=d:threshold=0",
            "sampling:draft=d:k=auto:threshold=0.5",
        ] {
            assert!(matches!(error(text), MethodError::Invalid { .. }), "{text}");
        }
        assert_eq!(
            error("sampling:draft=d:bigram=b").to_string(),
            "`bigram` is not a setting of sampling (its keys: draft, k, threshold, \
             draft-weights, online)"
        );
        assert!(matches!(
            error("sampling:draft=a:draft-model=b"),
            MethodError::Duplicate { .. }
        ));
    }
}
