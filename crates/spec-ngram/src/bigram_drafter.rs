//! The drafter that samples from a [`BigramModel`].

use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData};
use spec_core::error::Source;
use spec_core::rng::SpecRng;
use spec_core::sampling::{SamplingConfig, probabilities, sample_probabilities};
use spec_core::tree::TokenTree;
use spec_core::verify::{Proposal, Verdict};
use spec_engine::{Draft, Drafter};

use crate::bigram::BigramModel;
use crate::error::{NgramError, Result};

/// Default draft length of the bigram drafter.
pub const DEFAULT_BIGRAM_K: usize = 2;

/// Drafts `K` tokens from a bigram model (see the crate docs for the rule).
#[derive(Debug)]
pub struct BigramDrafter<B: Backend> {
    model: BigramModel,
    k: usize,
    device: B::Device,
    row: Vec<f32>,
}

impl<B: Backend> BigramDrafter<B> {
    /// Checks that `model` covers exactly the target's vocabulary (`target_vocab`, the number of
    /// logits per row) and that `k ≥ 1`.
    pub fn new(
        model: BigramModel,
        target_vocab: usize,
        k: usize,
        device: &B::Device,
    ) -> Result<Self> {
        if k == 0 {
            return Err(NgramError::InvalidK(k));
        }
        if model.vocab_size() != target_vocab {
            return Err(NgramError::VocabMismatch {
                model: model.vocab_size(),
                target: target_vocab,
            });
        }
        Ok(Self {
            model,
            k,
            device: device.clone(),
            row: Vec::new(),
        })
    }

    pub fn model(&self) -> &BigramModel {
        &self.model
    }

    /// Drafts after `root`: `(tokens, q rows)`, the rows absent when greedy.
    fn propose(
        &mut self,
        root: u32,
        depth: usize,
        sampling: &SamplingConfig,
        rng: &mut SpecRng,
    ) -> Result<(Vec<u32>, Option<Tensor<B, 2>>)> {
        let mut tokens = Vec::with_capacity(depth);
        let mut prev = root;
        if sampling.is_greedy() {
            for _ in 0..depth {
                prev = self.model.argmax(prev);
                tokens.push(prev);
            }
            return Ok((tokens, None));
        }
        let vocab = self.model.vocab_size();
        let mut rows = Vec::with_capacity(depth);
        for _ in 0..depth {
            self.model.log_row_into(prev, &mut self.row);
            let logits = Tensor::<B, 2>::from_data(
                TensorData::new(self.row.clone(), [1, vocab]),
                &self.device,
            );
            // The same settings the verifier applies to the target's logits.
            let q = probabilities(logits, sampling)?;
            let drawn = sample_probabilities(q.clone(), rng, Source::Draft)?;
            prev = drawn.first().copied().ok_or_else(|| {
                NgramError::Spec(spec_core::error::SpecError::Shape(
                    "sampling one draft row returned no token".into(),
                ))
            })?;
            tokens.push(prev);
            rows.push(q);
        }
        Ok((tokens, Some(Tensor::cat(rows, 0))))
    }
}

impl<B: Backend> Drafter<B> for BigramDrafter<B> {
    fn name(&self) -> &str {
        "bigram"
    }

    fn begin(&mut self, _prompt: &[u32]) -> spec_engine::Result<()> {
        Ok(())
    }

    fn draft(
        &mut self,
        context: &[u32],
        max_depth: usize,
        sampling: &SamplingConfig,
        rng: &mut SpecRng,
    ) -> spec_engine::Result<Draft<B>> {
        let Some(&root) = context.last() else {
            return Err(spec_engine::EngineError::Drafter(
                "the bigram drafter was asked to draft after an empty context".into(),
            ));
        };
        let depth = self.k.min(max_depth);
        if depth == 0 {
            return Ok(Draft::none(root));
        }
        let (tokens, q) = self.propose(root, depth, sampling, rng)?;
        Ok(Draft {
            tree: TokenTree::chain(root, &tokens),
            proposal: q.map_or(Proposal::Deterministic, Proposal::Sampled),
            draft_forwards: 0,
        })
    }

    fn accepted(
        &mut self,
        _context: &[u32],
        _tree: &TokenTree,
        _verdict: &Verdict,
    ) -> spec_engine::Result<()> {
        Ok(())
    }
}
