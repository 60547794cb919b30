//! Token trees as `spec` takes them: `tree[:draft=MODEL][:draft-weights=FORMAT][:lookup=on]
//! [:ngram-max=N][:ngram-min=N][:bigram=FILE][:shape=4x2x2x1][:nodes=N][:depth=N][:beam=N]
//! [:branch=N]`, with at least one source of candidates.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

use burn::tensor::backend::Backend;
use spec_engine::Drafter;
use spec_engine::method::{
    BuildContext, DraftModel, MethodError, MethodSpec, MethodText, Settings, parse_spec,
};
use spec_ngram::BigramModel;
use spec_runtime::model::WeightFormat;
use spec_sampling::spec::{DEFAULT_DRAFT_WEIGHTS, DRAFT_MODEL_KEY};
use spec_sampling::{DraftRunner, check_vocabularies, weight_cost_prior};

use crate::{Expansion, TreeDrafter, TreeSettings, TreeShape, TreeSources};

/// Prompt lookup's n-gram sizes in a tree unless set: short matches add branches.
const DEFAULT_TREE_NGRAM: (usize, usize) = (1, 3);

/// `tree`: several candidate continuations a step, verified in one pass (see the crate docs).
#[derive(Debug, Clone, PartialEq)]
pub struct TreeSpec {
    /// The draft model: a path or reference name.
    pub draft: Option<String>,
    /// How the draft's projections are kept (default q8_0-a8, as for `sampling`).
    pub draft_weights: Option<WeightFormat>,
    /// Prompt lookup's branches (`lookup=on`).
    pub lookup: Option<bool>,
    pub ngram_max: Option<usize>,
    pub ngram_min: Option<usize>,
    /// A bigram model file (`cargo xtask train-bigram`).
    pub bigram: Option<PathBuf>,
    /// A fixed shape for the draft model's expansion, verified whole.
    pub shape: Option<TreeShape>,
    /// Drafted nodes a step verifies at most.
    pub nodes: Option<usize>,
    pub depth: Option<usize>,
    /// Nodes expanded a level at most.
    pub beam: Option<usize>,
    /// Children of an expanded node.
    pub branch: Option<usize>,
}

impl TreeSpec {
    /// A tree from the draft model `draft` with every other key at its default.
    pub fn with_draft(draft: impl Into<String>) -> Self {
        Self {
            draft: Some(draft.into()),
            draft_weights: None,
            lookup: None,
            ngram_max: None,
            ngram_min: None,
            bigram: None,
            shape: None,
            nodes: None,
            depth: None,
            beam: None,
            branch: None,
        }
    }

    /// The draft's weight format.
    pub fn draft_format(&self) -> WeightFormat {
        self.draft_weights.unwrap_or(DEFAULT_DRAFT_WEIGHTS)
    }

    /// The tree's limits, defaults filled in.
    pub fn settings(&self) -> TreeSettings {
        let d = TreeSettings::default();
        TreeSettings {
            expansion: Expansion {
                shape: self.shape.clone(),
                depth: self
                    .depth
                    .or(self.shape.as_ref().map(TreeShape::depth))
                    .unwrap_or(d.expansion.depth),
                beam: self.beam.unwrap_or(d.expansion.beam),
                branch: self.branch.unwrap_or(d.expansion.branch),
            },
            max_nodes: self
                .nodes
                .or(self.shape.as_ref().map(TreeShape::nodes))
                .unwrap_or(d.max_nodes),
            bigram_branch: d.bigram_branch,
        }
    }

    fn ngram_sizes(&self) -> (usize, usize) {
        (
            self.ngram_min.unwrap_or(DEFAULT_TREE_NGRAM.0),
            self.ngram_max.unwrap_or(DEFAULT_TREE_NGRAM.1),
        )
    }
}

/// A count of at least 1.
fn at_least_one(value: &str) -> Result<usize, String> {
    match value.parse::<usize>() {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err("give a whole number of at least 1".to_owned()),
    }
}

/// `on` or `off`.
fn on_off(value: &str) -> Result<bool, String> {
    match value {
        "on" => Ok(true),
        "off" => Ok(false),
        _ => Err("give on or off".to_owned()),
    }
}

impl MethodSpec for TreeSpec {
    const NAME: &'static str = "tree";
    const KEYS: &'static [&'static str] = &[
        DRAFT_MODEL_KEY,
        "draft-weights",
        "lookup",
        "ngram-max",
        "ngram-min",
        "bigram",
        "shape",
        "nodes",
        "depth",
        "beam",
        "branch",
    ];
    const ALIASES: &'static [(&'static str, &'static str)] = &[("draft-model", DRAFT_MODEL_KEY)];

    fn from_settings(mut settings: Settings) -> Result<Self, MethodError> {
        let spec = Self {
            draft: settings.take(DRAFT_MODEL_KEY),
            draft_weights: settings.take_parsed("draft-weights")?,
            lookup: settings.take_with("lookup", on_off)?,
            ngram_max: settings.take_with("ngram-max", at_least_one)?,
            ngram_min: settings.take_with("ngram-min", at_least_one)?,
            bigram: settings.take("bigram").map(PathBuf::from),
            shape: settings.take_parsed("shape")?,
            nodes: settings.take_with("nodes", at_least_one)?,
            depth: settings.take_with("depth", at_least_one)?,
            beam: settings.take_with("beam", at_least_one)?,
            branch: settings.take_with("branch", at_least_one)?,
        };
        settings.finish()?;
        if spec.draft.is_none() && spec.lookup != Some(true) && spec.bigram.is_none() {
            return Err(MethodError::Missing {
                method: Self::NAME,
                needs: "a source of candidates: draft=MODEL (--draft-model), lookup=on or \
                        bigram=FILE",
            });
        }
        if spec.draft.is_none() && (spec.shape.is_some() || spec.draft_weights.is_some()) {
            return Err(MethodError::Invalid {
                method: Self::NAME,
                reason: "shape= and draft-weights= set the draft model's expansion; give \
                         draft=MODEL"
                    .to_owned(),
            });
        }
        if spec.lookup != Some(true) && (spec.ngram_max.is_some() || spec.ngram_min.is_some()) {
            return Err(MethodError::Invalid {
                method: Self::NAME,
                reason: "ngram-max= and ngram-min= set prompt lookup's branches; add lookup=on"
                    .to_owned(),
            });
        }
        let (n_min, n_max) = spec.ngram_sizes();
        if n_min > n_max || n_max > 16 {
            return Err(MethodError::Invalid {
                method: Self::NAME,
                reason: format!("n-gram sizes {n_min}..={n_max} (need min ≤ max ≤ 16)"),
            });
        }
        Ok(spec)
    }

    /// The drafter: the draft model's vocabulary checked against the target's through both
    /// tokenizers, the models' weight bytes' ratio as the guess of a draft row's cost.
    fn build<B: Backend>(
        &self,
        ctx: &mut BuildContext<'_, B>,
    ) -> Result<Box<dyn Drafter<B>>, MethodError> {
        let (target, tokenizer) = (ctx.target, ctx.tokenizer);
        let draft = match &self.draft {
            None => None,
            Some(name) => {
                let (model, draft_tokenizer) = match ctx
                    .drafts
                    .draft_model(name, self.draft_format())
                    .map_err(MethodError::Build)?
                {
                    DraftModel::Target => (target, tokenizer),
                    DraftModel::Loaded { model, tokenizer } => (model, tokenizer),
                };
                check_vocabularies(
                    draft_tokenizer,
                    model.vocab_size,
                    tokenizer,
                    target.vocab_size,
                )
                .map_err(MethodError::build)?;
                Some((
                    DraftRunner::new(model.clone(), target.vocab_size),
                    weight_cost_prior(model, target),
                ))
            }
        };
        let bigram = self
            .bigram
            .as_ref()
            .map(|file| BigramModel::load(file))
            .transpose()
            .map_err(MethodError::build)?;
        let sources = TreeSources {
            draft,
            lookup: (self.lookup == Some(true)).then(|| self.ngram_sizes()),
            bigram,
        };
        let drafter = TreeDrafter::new(sources, target.vocab_size, self.settings())
            .map_err(MethodError::build)?;
        Ok(Box::new(drafter))
    }

    fn draft_model(&self) -> Option<(&str, WeightFormat)> {
        self.draft.as_deref().map(|d| (d, self.draft_format()))
    }
}

impl FromStr for TreeSpec {
    type Err = MethodError;

    fn from_str(text: &str) -> Result<Self, MethodError> {
        parse_spec(text)
    }
}

impl fmt::Display for TreeSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let on_off = |b: bool| if b { "on" } else { "off" };
        MethodText::new(Self::NAME)
            .with(DRAFT_MODEL_KEY, self.draft.as_ref())
            .with("draft-weights", self.draft_weights)
            .with("lookup", self.lookup.map(on_off))
            .with("ngram-max", self.ngram_max)
            .with("ngram-min", self.ngram_min)
            .with("bigram", self.bigram.as_ref().map(|p| p.display()))
            .with("shape", self.shape.as_ref())
            .with("nodes", self.nodes)
            .with("depth", self.depth)
            .with("beam", self.beam)
            .with("branch", self.branch)
            .fmt(f)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn tree_specs_round_trip_and_fill_their_defaults() {
        for text in [
            "tree:draft=qwen2.5-coder-0.5b",
            "tree:draft=d:draft-weights=q8_0:shape=4x2x2x1",
            "tree:lookup=on:ngram-max=4:ngram-min=2:bigram=b.bin",
            "tree:draft=d:lookup=on:nodes=16:depth=6:beam=2:branch=3",
        ] {
            let spec: TreeSpec = text.parse().unwrap();
            assert_eq!(spec.to_string(), text);
            assert_eq!(spec.to_string().parse::<TreeSpec>().unwrap(), spec);
        }
        let spec: TreeSpec = "tree:draft-model=d".parse().unwrap();
        assert_eq!(spec, TreeSpec::with_draft("d"));
        assert_eq!(spec.draft_model(), Some(("d", DEFAULT_DRAFT_WEIGHTS)));
        assert_eq!(spec.settings(), TreeSettings::default());
        // A shape sets the depth and the node limit unless they are given.
        let spec: TreeSpec = "tree:draft=d:shape=3x2".parse().unwrap();
        assert_eq!(spec.settings().expansion.depth, 2);
        assert_eq!(spec.settings().max_nodes, 9);
        let spec: TreeSpec = "tree:lookup=on".parse().unwrap();
        assert_eq!(spec.draft_model(), None);
        assert_eq!(spec.ngram_sizes(), DEFAULT_TREE_NGRAM);
    }

    #[test]
    fn a_tree_needs_a_source_and_settings_that_fit_it() {
        let error = |text: &str| text.parse::<TreeSpec>().unwrap_err().to_string();
        assert!(error("tree").contains("tree needs a source of candidates"));
        assert!(error("tree:lookup=off").contains("needs a source"));
        assert!(error("tree:lookup=on:shape=2x2").contains("give draft=MODEL"));
        assert!(error("tree:draft=d:ngram-max=3").contains("add lookup=on"));
        assert!(error("tree:lookup=on:ngram-min=4:ngram-max=2").contains("n-gram sizes"));
        assert!(error("tree:draft=d:nodes=0").contains("at least 1"));
        assert!(error("tree:draft=d:shape=2x0").contains("bad tree shape"));
        assert!(error("tree:draft=d:lookup=maybe").contains("on or off"));
        assert!(error("tree:draft=d:k=3").contains("`k` is not a setting of tree"));
    }
}
