//! Medusa as `spec` takes it: `medusa:heads=FILE[:tree=auto|static][:nodes=N][:top=N]`.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

use burn::tensor::backend::Backend;
use spec_engine::Drafter;
use spec_engine::method::{
    BuildContext, MethodError, MethodSpec, MethodText, Settings, parse_spec,
};
use spec_train::identity::TargetIdentity;

use crate::drafter::{MedusaDrafter, MedusaSettings, TreeMode};
use crate::file;

/// The key naming the heads file.
pub const HEADS_KEY: &str = "heads";

/// `medusa`: a tree from Medusa heads trained for the target (`cargo xtask train-medusa`).
#[derive(Debug, Clone, PartialEq)]
pub struct MedusaSpec {
    /// The heads file.
    pub heads: PathBuf,
    pub tree: Option<TreeMode>,
    /// Drafted nodes a step verifies at most.
    pub nodes: Option<usize>,
    /// Candidates taken from each head.
    pub top: Option<usize>,
}

impl MedusaSpec {
    /// The drafter's limits, defaults filled in.
    pub fn settings(&self) -> MedusaSettings {
        let d = MedusaSettings::default();
        MedusaSettings {
            tree: self.tree.unwrap_or(d.tree),
            max_nodes: self.nodes.unwrap_or(d.max_nodes),
            top: self.top.unwrap_or(d.top),
        }
    }
}

fn at_least_one(value: &str) -> Result<usize, String> {
    match value.parse::<usize>() {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err("give a whole number of at least 1".to_owned()),
    }
}

fn tree_mode(value: &str) -> Result<TreeMode, String> {
    match value {
        "auto" => Ok(TreeMode::Auto),
        "static" => Ok(TreeMode::Static),
        _ => Err("give auto or static".to_owned()),
    }
}

impl MethodSpec for MedusaSpec {
    const NAME: &'static str = "medusa";
    const KEYS: &'static [&'static str] = &[HEADS_KEY, "tree", "nodes", "top"];
    const ALIASES: &'static [(&'static str, &'static str)] = &[];

    fn from_settings(mut settings: Settings) -> Result<Self, MethodError> {
        let heads = settings.take(HEADS_KEY).map(PathBuf::from);
        let spec = Self {
            heads: heads.unwrap_or_default(),
            tree: settings.take_with("tree", tree_mode)?,
            nodes: settings.take_with("nodes", at_least_one)?,
            top: settings.take_with("top", at_least_one)?,
        };
        settings.finish()?;
        if spec.heads.as_os_str().is_empty() {
            return Err(MethodError::Missing {
                method: Self::NAME,
                needs: "heads=FILE (trained by `cargo xtask train-medusa`)",
            });
        }
        Ok(spec)
    }

    /// The drafter: the heads file read and checked against the target (hidden size,
    /// vocabulary, fingerprint).
    fn build<B: Backend>(
        &self,
        ctx: &mut BuildContext<'_, B>,
    ) -> Result<Box<dyn Drafter<B>>, MethodError> {
        let target = ctx.target;
        let hidden = target.embedding.val().dims()[1];
        let identity = TargetIdentity::of(ctx.target_path, hidden, target.vocab_size)
            .map_err(|e| MethodError::build(format!("{}: {e}", ctx.target_path.display())))?;
        let loaded =
            file::load::<B>(&self.heads, &identity, ctx.device).map_err(MethodError::build)?;
        let mut drafter =
            MedusaDrafter::new(loaded.heads, loaded.info.rank_accuracy, self.settings())
                .map_err(MethodError::build)?;
        if let Some(vocab) = loaded.vocab {
            drafter = drafter
                .with_draft_vocab(vocab, target.output_weight())
                .map_err(MethodError::build)?;
        }
        Ok(Box::new(drafter))
    }
}

impl FromStr for MedusaSpec {
    type Err = MethodError;

    fn from_str(text: &str) -> Result<Self, MethodError> {
        parse_spec(text)
    }
}

impl fmt::Display for MedusaSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mode = |m: TreeMode| match m {
            TreeMode::Auto => "auto",
            TreeMode::Static => "static",
        };
        MethodText::new(Self::NAME)
            .with(HEADS_KEY, Some(self.heads.display()))
            .with("tree", self.tree.map(mode))
            .with("nodes", self.nodes)
            .with("top", self.top)
            .fmt(f)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn medusa_specs_round_trip_and_need_heads() {
        for text in [
            "medusa:heads=h.safetensors",
            "medusa:heads=h.safetensors:tree=static:nodes=16:top=3",
        ] {
            let spec: MedusaSpec = text.parse().unwrap();
            assert_eq!(spec.to_string(), text);
        }
        let spec: MedusaSpec = "medusa:heads=h:tree=auto".parse().unwrap();
        assert_eq!(spec.settings().tree, TreeMode::Auto);
        let error = |text: &str| text.parse::<MedusaSpec>().unwrap_err().to_string();
        assert!(error("medusa").contains("heads=FILE"));
        assert!(error("medusa:heads=h:tree=wide").contains("auto or static"));
        assert!(error("medusa:heads=h:nodes=0").contains("at least 1"));
        assert!(error("medusa:heads=h:k=3").contains("`k` is not a setting of medusa"));
    }
}
