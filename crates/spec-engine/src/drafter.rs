//! The seam between the loop and a method: the [`Drafter`] trait, what it is asked
//! ([`DraftRequest`], with a borrowed view of the target, [`TargetView`]) and what it returns
//! ([`Draft`]).

use std::ops::Range;

use burn::tensor::backend::Backend;
use spec_core::rng::SpecRng;
use spec_core::sampling::SamplingConfig;
use spec_core::step::{StepNeeds, StepOutcome};
use spec_core::tree::TokenTree;
use spec_core::verify::Proposal;
use spec_runtime::{ForwardOutput, ForwardRequest, KvCache, Transformer};

use crate::{EngineError, Result};

/// What a drafter proposes for one step.
#[derive(Debug)]
pub struct Draft<B: Backend> {
    /// Rooted at the last token of the sequence (not yet in the target's cache).
    pub tree: TokenTree,
    pub proposal: Proposal<B>,
    /// Forward passes of a draft model this step took (for the metrics).
    pub draft_forwards: usize,
}

impl<B: Backend> Draft<B> {
    /// A step without drafts: plain decoding.
    pub fn none(root: u32) -> Self {
        Self {
            tree: TokenTree::new(root),
            proposal: Proposal::Deterministic,
            draft_forwards: 0,
        }
    }
}

/// The target model and its KV cache, lent to a drafter during [`Drafter::draft`], so that a
/// method can draft with the target's own layers (early exit, layer skipping) without a
/// second copy of the model or of the cache.
///
/// The cache holds the context without its last token (the root): [`TargetView::base`]
/// positions in every layer. A drafter may run any forward pass on it; everything it writes
/// past `base` is dropped by the engine before the verification pass, in every layer, so a
/// drafter cannot change what the target verifies. Positions below `base` are never written:
/// a forward pass only appends.
#[derive(Debug)]
pub struct TargetView<'a, B: Backend> {
    model: &'a Transformer<B>,
    cache: &'a mut KvCache<B>,
    base: usize,
}

impl<'a, B: Backend> TargetView<'a, B> {
    pub(crate) fn new(model: &'a Transformer<B>, cache: &'a mut KvCache<B>) -> Self {
        let base = cache.len();
        Self { model, cache, base }
    }

    /// The target model (its config, its output head [`Transformer::logits`], its layers).
    pub fn model(&self) -> &Transformer<B> {
        self.model
    }

    /// Positions the target's cache holds for the context: all of it but the root.
    pub fn base(&self) -> usize {
        self.base
    }

    /// Valid positions in `layer` of the target's cache (`base` plus what the drafter appended
    /// there).
    pub fn layer_len(&self, layer: usize) -> usize {
        self.cache.layer_len(layer)
    }

    /// Runs `request` on the target's cache (see [`Transformer::forward`]): a layer range with
    /// `hidden_after`, or a whole pass. Its keys and values are appended to the layers it runs.
    pub fn forward(&mut self, request: ForwardRequest<'_, B>) -> Result<ForwardOutput<B>> {
        Ok(self.model.forward(request, self.cache)?)
    }

    /// Forgets, in `layers`, what the drafter appended from position `len` on (never below
    /// [`TargetView::base`]).
    pub fn truncate_layers(&mut self, layers: Range<usize>, len: usize) {
        self.cache.truncate_layers(layers, len.max(self.base));
    }
}

/// What the loop asks a drafter for one step.
#[derive(Debug)]
pub struct DraftRequest<'a, B: Backend> {
    /// The prompt and every token produced so far; the last one is the tree's root.
    pub context: &'a [u32],
    /// The deepest tree allowed (the tokens still wanted, less the step's own token, and the
    /// room in the target's cache).
    pub max_depth: usize,
    /// The most drafted nodes allowed: the room in the target's cache after the root.
    pub max_nodes: usize,
    /// The settings the target is verified with; a sampling drafter draws with them.
    pub sampling: &'a SamplingConfig,
    /// The run's one random stream.
    pub rng: &'a mut SpecRng,
    target: Option<TargetView<'a, B>>,
}

impl<'a, B: Backend> DraftRequest<'a, B> {
    /// A request without the target: a drafter driven by hand (tests). [`DraftRequest::target`]
    /// then fails, and the tree may hold up to `max_depth` nodes a level (see
    /// [`DraftRequest::with_max_nodes`]).
    pub fn new(
        context: &'a [u32],
        max_depth: usize,
        sampling: &'a SamplingConfig,
        rng: &'a mut SpecRng,
    ) -> Self {
        Self {
            context,
            max_depth,
            max_nodes: max_depth.saturating_mul(max_depth.max(1)),
            sampling,
            rng,
            target: None,
        }
    }

    /// The request with at most `max_nodes` drafted nodes.
    pub fn with_max_nodes(mut self, max_nodes: usize) -> Self {
        self.max_nodes = max_nodes;
        self
    }

    /// The request with the target lent to the drafter.
    pub(crate) fn with_target(mut self, target: TargetView<'a, B>) -> Self {
        self.target = Some(target);
        self
    }

    /// The target and its cache, for a drafter that drafts with the target's own layers.
    ///
    /// # Errors
    /// When the drafter is driven without the engine, which alone lends the target.
    pub fn target(&mut self) -> Result<&mut TargetView<'a, B>> {
        self.target
            .as_mut()
            .ok_or_else(|| EngineError::Setup("this drafter needs the target model".into()))
    }

    /// The context's last token: the root of the step's tree.
    ///
    /// # Errors
    /// An empty context.
    pub fn root(&self) -> Result<u32> {
        self.context
            .last()
            .copied()
            .ok_or_else(|| EngineError::Drafter("asked to draft after an empty context".into()))
    }
}

/// A drafting policy: the only part of a method that is its own.
pub trait Drafter<B: Backend> {
    /// A short name for reports (`prompt-lookup`, `sampling`, …).
    fn name(&self) -> &str;

    /// What the drafter wants handed over after each step beyond the verdict (the target's
    /// hidden states, its distributions); asked once before each generation. Nothing by
    /// default.
    fn needs(&self) -> StepNeeds {
        StepNeeds::NONE
    }

    /// Called once before generating after `prompt`.
    fn begin(&mut self, prompt: &[u32]) -> Result<()>;

    /// Proposes drafts after `request.context`: a tree rooted at its last token, at most
    /// `request.max_depth` deep.
    fn draft(&mut self, request: DraftRequest<'_, B>) -> Result<Draft<B>>;

    /// Tells the drafter what the target made of its last draft. `context` now ends with the
    /// step's tokens (accepted drafts, then the verdict's next token); `outcome` holds the
    /// tree, the verdict, the step's measured cost and whatever [`Drafter::needs`] asked for.
    fn accepted(&mut self, context: &[u32], outcome: &StepOutcome<B>) -> Result<()>;

    /// Forgets the text of earlier requests, for drafters that keep it (prompt lookup's
    /// cross-request cache); what the drafter measured of the machine may stay. A benchmark
    /// calls this after its warm-up so no prompt is measured against its own earlier answer.
    fn forget_requests(&mut self) {}

    /// The drafter's running estimates by name, for reports (a draft-model drafter's `α`, `c`
    /// and verification slope, from which `auto` picks K); empty where it keeps none.
    fn report_estimates(&self) -> Vec<(&'static str, f64)> {
        Vec::new()
    }
}

/// The drafter of plain decoding: proposes nothing.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoDraft;

impl<B: Backend> Drafter<B> for NoDraft {
    fn name(&self) -> &str {
        "plain"
    }

    fn begin(&mut self, _prompt: &[u32]) -> Result<()> {
        Ok(())
    }

    fn draft(&mut self, request: DraftRequest<'_, B>) -> Result<Draft<B>> {
        Ok(Draft::none(request.root()?))
    }

    fn accepted(&mut self, _context: &[u32], _outcome: &StepOutcome<B>) -> Result<()> {
        Ok(())
    }
}
