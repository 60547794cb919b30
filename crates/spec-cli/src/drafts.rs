//! Where `spec`'s methods get their draft models: loaded by path and weight format, each once.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use anyhow::Context;
use burn::tensor::backend::Backend;
use spec_engine::method::{BoxError, DraftModel, DraftModelSource};
use spec_runtime::load_model_with;
use spec_runtime::model::{Transformer, WeightFormat};
use spec_tokenizer::TextTokenizer;

use crate::checkpoint::load_tokenizer;
use crate::device::DeviceLimits;

/// A loaded draft model and its tokenizer.
type LoadedDraft<B> = (Transformer<B>, TextTokenizer);

/// Draft models loaded so far, by path and weight format: methods that share a draft model (a
/// bench sweeping K) share its weights, since cloning a loaded model only counts references.
pub(crate) struct DraftModels<B: Backend> {
    loaded: HashMap<(PathBuf, WeightFormat), LoadedDraft<B>>,
    device: B::Device,
    /// The device the draft models are loaded onto, as far as loading them cares.
    limits: DeviceLimits,
    /// The target's checkpoint and format: a draft of both is the target's own weights, so
    /// that a self-draft streams one copy of them rather than two taking turns.
    target: (PathBuf, WeightFormat),
}

impl<B: Backend> DraftModels<B> {
    /// Draft models on `device` for a target loaded from `path` with its projections in
    /// `format`.
    pub(crate) fn new(
        device: &B::Device,
        limits: DeviceLimits,
        (path, format): (&Path, WeightFormat),
    ) -> Self {
        Self {
            loaded: HashMap::new(),
            device: device.clone(),
            limits,
            target: (path.to_path_buf(), format),
        }
    }

    /// The draft at `path` in `format`, loaded unless it is already.
    fn load(&mut self, path: PathBuf, format: WeightFormat) -> anyhow::Result<&LoadedDraft<B>> {
        let key = (path, format);
        if !self.loaded.contains_key(&key) {
            let path = &key.0;
            // Another format of a checkpoint already loaded is a repack of the same weights when
            // that copy holds them exactly (f32); otherwise the checkpoint is read again.
            let repacked = self.loaded.iter().find(|((p, _), _)| p == path).and_then(
                |(_, (model, draft_tokenizer))| {
                    let mut model = model.clone();
                    model
                        .pack(format)
                        .ok()
                        .map(|()| (model, draft_tokenizer.clone()))
                },
            );
            let entry = match repacked {
                Some(entry) => entry,
                None => {
                    let draft_tokenizer = load_tokenizer(path)?;
                    let options = self.limits.load_options(format);
                    let draft = load_model_with::<B>(path, &self.device, options)
                        .with_context(|| format!("loading the draft model {}", path.display()))?;
                    (draft.model, draft_tokenizer)
                }
            };
            self.loaded.insert(key.clone(), entry);
        }
        self.loaded
            .get(&key)
            .with_context(|| format!("draft model {} vanished from the cache", key.0.display()))
    }
}

impl<B: Backend> DraftModelSource<B> for DraftModels<B> {
    fn draft_model(
        &mut self,
        name: &str,
        format: WeightFormat,
    ) -> Result<DraftModel<'_, B>, BoxError> {
        let path = spec_models::resolve(name)?;
        if (&path, format) == (&self.target.0, self.target.1) {
            return Ok(DraftModel::Target);
        }
        let (model, tokenizer) = self.load(path, format)?;
        Ok(DraftModel::Loaded { model, tokenizer })
    }
}
