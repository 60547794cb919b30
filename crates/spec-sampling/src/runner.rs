//! A draft model following the target's context on a KV cache of its own: what every
//! draft-model drafter (a chain here, a tree in `spec-tree`) feeds, rolls back and reads.

use burn::tensor::{Tensor, backend::Backend};
use spec_engine::EngineError;
use spec_runtime::{ForwardOutput, ForwardRequest, KvCache, LogitRows, Transformer};

/// Positions of a new runner's cache (or the draft's context, if smaller).
pub const INITIAL_CACHE_POSITIONS: usize = 4096;
/// Positions [`DraftRunner::begin`] leaves for generation beyond the prompt when it enlarges the
/// cache.
const GROWTH_MARGIN: usize = 2048;

/// A draft model, its KV cache and the tokens in it.
///
/// The cache holds `fed`, a prefix of the context as the draft has seen it: after a step the
/// drafter rolls it back to the longest prefix the context still agrees with
/// ([`DraftRunner::roll_back_to`]) and feeds what is missing. Logits come in the draft's
/// vocabulary width; [`DraftRunner::fit_logits`] and [`DraftRunner::pad_q`] bring them to the
/// target's, whose ids beyond a narrower draft are padding (checked when the drafter is built).
#[derive(Debug)]
pub struct DraftRunner<B: Backend> {
    model: Transformer<B>,
    cache: KvCache<B>,
    target_vocab: usize,
    /// The tokens whose keys and values are in `cache`, in order.
    fed: Vec<u32>,
    forwards: u64,
    /// Set by [`DraftRunner::with_cache_capacity`]: `begin` keeps the cache as it is.
    fixed_capacity: bool,
}

impl<B: Backend> DraftRunner<B> {
    /// A runner for a target whose output layer has `target_vocab` entries. A cache is
    /// allocated whole, so it starts modest; [`DraftRunner::begin`] enlarges it for longer
    /// prompts (up to the draft's context).
    pub fn new(model: Transformer<B>, target_vocab: usize) -> Self {
        let cache = model.new_cache(model.max_positions().min(INITIAL_CACHE_POSITIONS));
        Self {
            model,
            cache,
            target_vocab,
            fed: Vec::new(),
            forwards: 0,
            fixed_capacity: false,
        }
    }

    /// Gives the draft a cache of exactly `capacity` positions.
    pub fn with_cache_capacity(mut self, capacity: usize) -> Self {
        self.cache = self.model.new_cache(capacity);
        self.fed.clear();
        self.fixed_capacity = true;
        self
    }

    pub fn model(&self) -> &Transformer<B> {
        &self.model
    }

    /// The target's vocabulary width, to which `q` rows are brought.
    pub fn target_vocab(&self) -> usize {
        self.target_vocab
    }

    /// The tokens in the cache.
    pub fn fed(&self) -> &[u32] {
        &self.fed
    }

    /// Positions the cache holds at most.
    pub fn capacity(&self) -> usize {
        self.cache.capacity()
    }

    /// Positions still free in the cache.
    pub fn room(&self) -> usize {
        self.cache.capacity().saturating_sub(self.fed.len())
    }

    /// Forward passes of the draft model so far (prompt prefills included).
    pub fn forwards(&self) -> u64 {
        self.forwards
    }

    /// Empties the cache for a new request of `prompt_len` tokens, enlarging it (within the
    /// draft's context) unless its capacity was fixed.
    pub fn begin(&mut self, prompt_len: usize) {
        self.fed.clear();
        self.cache.truncate(0);
        let wanted = (prompt_len + GROWTH_MARGIN).min(self.model.max_positions());
        if !self.fixed_capacity && wanted > self.cache.capacity() {
            self.cache = self.model.new_cache(wanted);
        }
    }

    /// Feeds `tokens` causally after the cache; logits of the last one when `logits`.
    ///
    /// # Errors
    /// The runtime's; the cache is then rolled back to what `fed` says.
    pub fn feed(
        &mut self,
        tokens: &[u32],
        logits: bool,
    ) -> Result<Option<Tensor<B, 2>>, EngineError> {
        let rows = if logits {
            LogitRows::Last
        } else {
            LogitRows::None
        };
        let input = self.embeddable(tokens);
        let out = self.run(ForwardRequest::tokens(&input).logits(rows))?;
        self.fed.extend_from_slice(tokens);
        Ok(out.logits)
    }

    /// Runs `request` (whose tokens the caller made embeddable with
    /// [`DraftRunner::embeddable`]) on the cache without recording what it fed: for a tree's
    /// levels, whose tokens are not a prefix of the context. The caller keeps the cache
    /// consistent ([`DraftRunner::keep_fed`] after the step).
    ///
    /// # Errors
    /// The runtime's; the cache is then rolled back to what `fed` says.
    pub fn run(&mut self, request: ForwardRequest<'_, B>) -> Result<ForwardOutput<B>, EngineError> {
        self.forwards += 1;
        match self.model.forward(request, &mut self.cache) {
            Ok(out) => Ok(out),
            Err(e) => {
                self.cache.truncate(self.fed.len());
                Err(e.into())
            }
        }
    }

    /// `tokens` as the draft model can embed them. A token past a narrower draft's vocabulary
    /// (which only a padded target can produce) goes in as id 0: the draft's context is then
    /// slightly off, which costs acceptance but not exactness, since the verifier gets the `q`
    /// sampled from. `fed` keeps the real ids so the rollback still compares the true context.
    pub fn embeddable(&self, tokens: &[u32]) -> Vec<u32> {
        let vocab = self.model.vocab_size;
        tokens
            .iter()
            .map(|&t| if (t as usize) < vocab { t } else { 0 })
            .collect()
    }

    /// Forgets every fed token from the first one `context` disagrees with.
    pub fn roll_back_to(&mut self, context: &[u32]) {
        let keep = self
            .fed
            .iter()
            .zip(context)
            .take_while(|(a, b)| a == b)
            .count();
        self.truncate(keep);
    }

    /// Keeps the first `len` fed tokens.
    pub fn truncate(&mut self, len: usize) {
        self.fed.truncate(len);
        self.cache.truncate(len);
    }

    /// After [`DraftRunner::run`] appended a tree after `fed`: keeps, of the positions written,
    /// those at `offsets` (increasing, relative to `fed`'s end), moved next to `fed`, and
    /// records their `tokens` as fed.
    ///
    /// # Errors
    /// The cache's, for offsets outside what was written.
    pub fn keep_fed(&mut self, offsets: &[usize], tokens: &[u32]) -> Result<(), EngineError> {
        let base = self.fed.len();
        self.cache.keep_path(base, offsets)?;
        self.fed.extend_from_slice(tokens);
        Ok(())
    }

    /// Logits `[rows, draft vocab]` to the target's width: extra draft ids (padding, by the
    /// construction check) are dropped here; missing ones are added to `q` as zeros by
    /// [`DraftRunner::pad_q`].
    pub fn fit_logits(&self, logits: Tensor<B, 2>) -> Tensor<B, 2> {
        let vocab = logits.dims()[1];
        if vocab > self.target_vocab {
            logits.narrow(1, 0, self.target_vocab)
        } else {
            logits
        }
    }

    /// Distributions `[rows, vocab]` to the target's width, with zeros for the ids the draft
    /// lacks.
    pub fn pad_q(&self, q: Tensor<B, 2>) -> Tensor<B, 2> {
        let [rows, vocab] = q.dims();
        if vocab >= self.target_vocab {
            return q;
        }
        let zeros = Tensor::zeros([rows, self.target_vocab - vocab], &q.device());
        Tensor::cat(vec![q, zeros], 1)
    }
}
