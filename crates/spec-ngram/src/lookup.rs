//! Prompt lookup: an incremental n-gram index and the drafter built on it.

use std::collections::HashMap;

use burn::tensor::backend::Backend;
use spec_core::length::{AcceptanceRate, LengthController, best_length_by};
use spec_core::tree::TokenTree;
use spec_core::verify::Proposal;
use spec_engine::{Draft, DraftRequest, Drafter, StepOutcome};

use crate::error::{NgramError, Result};

/// Default fixed draft length of prompt lookup (the default is the adaptive length, up to
/// [`DEFAULT_LOOKUP_K_MAX`]). With a verification pass of K + 1 tokens costing
/// 1.4–2× a decode step on a CPU, short drafts from matches of two tokens or more measured best
/// (docs/benchmarks.md at 7b3cb13, "N-gram drafting (issue 6)": 1.09× overall vs 0.95× for K 5
/// from one-token matches).
pub const DEFAULT_LOOKUP_K: usize = 3;
/// Default longest n-gram matched.
pub const DEFAULT_NGRAM_MAX: usize = 3;
/// Default shortest n-gram matched: a single matching token predicts too little (α 0.15 vs 0.44
/// from two-token matches in the measurement above).
pub const DEFAULT_NGRAM_MIN: usize = 2;
/// Default longest draft of the adaptive length ([`PromptLookupConfig::adaptive`]).
pub const DEFAULT_LOOKUP_K_MAX: usize = 8;
/// Memory of the acceptance estimates of the adaptive length: counts keep this weight per step
/// (~20 steps), so the prior's floor on `α` (~1/22) lies below the break-even of a one-token
/// draft at the prior cost slope (0.1).
const ACCEPTANCE_DECAY: f64 = 0.95;
/// Largest n-gram size accepted (keeps per-token hashing cheap).
const NGRAM_LIMIT: usize = 16;
/// Default size of the cross-request cache ([`PromptLookupConfig::with_history`]).
pub const DEFAULT_HISTORY_TOKENS: usize = 1 << 20;
/// Ends each request in the cross-request cache: no tokenizer has this id, so no n-gram spans
/// two requests and no continuation runs into the next one.
const REQUEST_END: u32 = u32::MAX;

/// Where the context's suffix matched earlier text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LookupMatch {
    /// The n-gram size that matched.
    pub n: usize,
    /// Position of the first token after the earlier occurrence: its continuation starts here.
    pub start: usize,
}

/// An index of every n-gram (`n_min ≤ n ≤ n_max`) of a growing token sequence, mapping each to
/// the end of its most recent occurrence that is followed by at least one token.
///
/// An n-gram ending at position `e` (tokens `e-n .. e`) is entered when token `e` is appended,
/// so the sequence's own suffix is never its own match: [`NgramIndex::find`] returns earlier
/// occurrences only. Keys are 64-bit hashes of the n-gram; a hit is confirmed against the
/// tokens, so a hash collision can at worst hide a match, never produce a wrong one.
#[derive(Debug, Clone)]
pub struct NgramIndex {
    n_min: usize,
    n_max: usize,
    tokens: Vec<u32>,
    /// `maps[n - n_min]`: hash of an n-gram → the position right after its latest occurrence.
    maps: Vec<HashMap<u64, usize>>,
    /// Map insertions so far (a measure of the work done: linear in the tokens appended).
    insertions: u64,
}

impl NgramIndex {
    /// An empty index of the n-grams with `n_min ≤ n ≤ n_max`.
    pub fn new(n_min: usize, n_max: usize) -> Result<Self> {
        if n_min == 0 || n_min > n_max || n_max > NGRAM_LIMIT {
            return Err(NgramError::InvalidNgram {
                min_n: n_min,
                max_n: n_max,
                max: NGRAM_LIMIT,
            });
        }
        Ok(Self {
            n_min,
            n_max,
            tokens: Vec::new(),
            maps: vec![HashMap::new(); n_max - n_min + 1],
            insertions: 0,
        })
    }

    /// Forgets every token.
    pub fn clear(&mut self) {
        self.tokens.clear();
        self.maps.iter_mut().for_each(HashMap::clear);
    }

    /// The tokens indexed so far.
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// Map insertions done since construction (for tests of incrementality).
    pub fn insertions(&self) -> u64 {
        self.insertions
    }

    /// Appends one token: the n-grams it follows now have a continuation and enter the index.
    pub fn push(&mut self, token: u32) {
        let e = self.tokens.len();
        for n in self.n_min..=self.n_max.min(e) {
            let key = hash(&self.tokens[e - n..e]);
            self.maps[n - self.n_min].insert(key, e);
            self.insertions += 1;
        }
        self.tokens.push(token);
    }

    pub fn extend(&mut self, tokens: &[u32]) {
        tokens.iter().for_each(|&t| self.push(t));
    }

    /// The most recent earlier occurrence of the sequence's last `n` tokens, for the largest
    /// `n` (from `n_max` down to `n_min`) that has one.
    pub fn find(&self) -> Option<LookupMatch> {
        self.find_suffix_of(&self.tokens)
    }

    /// The most recent occurrence in this index of the last `n` tokens of `query` (another
    /// sequence, or this one), for the largest `n` from `n_max` down to `n_min` that has one.
    /// An occurrence counts only once a token has followed it.
    pub fn find_suffix_of(&self, query: &[u32]) -> Option<LookupMatch> {
        let len = query.len();
        (self.n_min..=self.n_max.min(len)).rev().find_map(|n| {
            let suffix = &query[len - n..];
            let &start = self.maps[n - self.n_min].get(&hash(suffix))?;
            (self.tokens[start - n..start] == *suffix).then_some(LookupMatch { n, start })
        })
    }

    /// The most recent earlier occurrence of the sequence's last `n` tokens for every `n` from
    /// `n_max` down to `n_min` that has one, each continuation start once: the candidate
    /// continuations a token tree can hold as branches.
    pub fn find_each(&self) -> Vec<LookupMatch> {
        let len = self.tokens.len();
        let mut found: Vec<LookupMatch> = Vec::new();
        for n in (self.n_min..=self.n_max.min(len)).rev() {
            let suffix = &self.tokens[len - n..];
            let Some(&start) = self.maps[n - self.n_min].get(&hash(suffix)) else {
                continue;
            };
            if self.tokens[start - n..start] == *suffix && found.iter().all(|m| m.start != start) {
                found.push(LookupMatch { n, start });
            }
        }
        found
    }

    /// Up to `max` tokens from `start` (a match's continuation).
    pub fn continuation(&self, start: usize, max: usize) -> &[u32] {
        let start = start.min(self.tokens.len());
        let end = start.saturating_add(max).min(self.tokens.len());
        &self.tokens[start..end]
    }

    /// Brings the index up to `context`, which normally extends what is indexed; anything else
    /// (a different sequence) is re-indexed from scratch.
    pub fn sync(&mut self, context: &[u32]) {
        let len = self.tokens.len();
        // Checking the last indexed token (not the whole prefix) keeps a step O(1) here; the
        // engine only ever appends, so this catches a drafter reused on another sequence.
        let extends =
            context.len() >= len && (len == 0 || context[len - 1] == self.tokens[len - 1]);
        if !extends {
            self.clear();
        }
        let from = self.tokens.len();
        self.extend(&context[from..]);
    }
}

/// FNV-1a over the tokens' bytes, finished with a multiply-xorshift so the std map's own
/// hashing of the `u64` sees well-mixed keys.
fn hash(tokens: &[u32]) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for &t in tokens {
        for b in t.to_le_bytes() {
            h = (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^ (h >> 33)
}

/// Settings of [`PromptLookup`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PromptLookupConfig {
    /// Longest draft (tokens per step).
    pub k: usize,
    pub ngram_max: usize,
    pub ngram_min: usize,
    /// Choose each step's length in `0..=k` from the run's acceptance and step-cost estimates
    /// (see the crate docs); otherwise every match drafts up to `k` tokens.
    pub adaptive: bool,
    /// Tokens of earlier requests (prompts and outputs) kept for matching when the current
    /// context has no match: the cross-request cache. 0 turns it off.
    pub history_tokens: usize,
}

/// The adaptive length up to [`DEFAULT_LOOKUP_K_MAX`] drafts.
impl Default for PromptLookupConfig {
    fn default() -> Self {
        Self::adaptive()
    }
}

impl PromptLookupConfig {
    /// The adaptive length, up to [`DEFAULT_LOOKUP_K_MAX`] drafts.
    pub fn adaptive() -> Self {
        Self {
            k: DEFAULT_LOOKUP_K_MAX,
            ngram_max: DEFAULT_NGRAM_MAX,
            ngram_min: DEFAULT_NGRAM_MIN,
            adaptive: true,
            history_tokens: 0,
        }
    }

    /// These settings with a cross-request cache of up to `tokens` tokens.
    pub fn with_history(self, tokens: usize) -> Self {
        Self {
            history_tokens: tokens,
            ..self
        }
    }

    /// Every match drafts up to `k` tokens.
    pub fn fixed(k: usize) -> Self {
        Self {
            k,
            adaptive: false,
            ..Self::adaptive()
        }
    }
}

/// Where a match was found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Origin {
    /// The current request's prompt and output.
    Context,
    /// Earlier requests (the cross-request cache).
    History,
}

/// What the drafter remembers of the step in flight, to learn from its outcome.
#[derive(Debug, Clone, Copy)]
struct PendingStep {
    /// Where the match was and the size of the n-gram that matched, if one did.
    found: Option<(Origin, usize)>,
    /// Drafts proposed.
    drafted: usize,
    /// The match's first continuation token when it was not proposed (length 0 chosen): scored
    /// against the step's output, it is a trial of `α` that cost nothing.
    shadow: Option<u32>,
    /// The context length when drafting (the step's first output lands at this index).
    context_len: usize,
}

/// The prompt lookup drafter (see the crate docs for the rule).
#[derive(Debug, Clone)]
pub struct PromptLookup {
    k: usize,
    adaptive: bool,
    index: NgramIndex,
    /// `acceptance[n - ngram_min]`: α of drafts from matches of size `n`.
    acceptance: Vec<AcceptanceRate>,
    /// Earlier requests, each followed by [`REQUEST_END`] (`None`: no cross-request cache).
    history: Option<NgramIndex>,
    history_tokens: usize,
    /// α of drafts from matches in `history`, by `n` as `acceptance`.
    history_acceptance: Vec<AcceptanceRate>,
    /// The target's step costs by width, from the engine's outcomes.
    lengths: LengthController,
    pending: Option<PendingStep>,
}

impl PromptLookup {
    /// Validates `config` (K ≥ 1, 1 ≤ ngram_min ≤ ngram_max ≤ 16).
    pub fn new(config: PromptLookupConfig) -> Result<Self> {
        if config.k == 0 {
            return Err(NgramError::InvalidK(config.k));
        }
        let index = NgramIndex::new(config.ngram_min, config.ngram_max)?;
        let sizes = config.ngram_max - config.ngram_min + 1;
        let history = (config.history_tokens > 0).then(|| index.clone());
        Ok(Self {
            k: config.k,
            adaptive: config.adaptive,
            index,
            acceptance: vec![AcceptanceRate::with_decay(ACCEPTANCE_DECAY); sizes],
            history,
            history_tokens: config.history_tokens,
            history_acceptance: vec![AcceptanceRate::with_decay(ACCEPTANCE_DECAY); sizes],
            lengths: LengthController::default(),
            pending: None,
        })
    }

    /// Tokens in the cross-request cache (0 when it is off).
    pub fn history_len(&self) -> usize {
        self.history.as_ref().map_or(0, NgramIndex::len)
    }

    /// Adds the request that just ended (the index's tokens) to the cross-request cache,
    /// keeping the newest half of the cache when it would overflow.
    fn remember_request(&mut self) {
        let Some(history) = &mut self.history else {
            return;
        };
        if self.index.is_empty() {
            return;
        }
        let incoming = self.index.len() + 1;
        if history.len() + incoming > self.history_tokens {
            let keep = (self.history_tokens / 2).min(history.len());
            let tail = history.tokens()[history.len() - keep..].to_vec();
            history.clear();
            // Start at a request boundary so no n-gram is cut in half.
            let from = tail
                .iter()
                .position(|&t| t == REQUEST_END)
                .map_or(tail.len(), |i| i + 1);
            history.extend(&tail[from..]);
        }
        if incoming <= self.history_tokens {
            history.extend(self.index.tokens());
            history.push(REQUEST_END);
        }
    }

    /// The running acceptance rate of drafts from matches of size `n` (`None` outside
    /// `ngram_min..=ngram_max`).
    pub fn alpha(&self, n: usize) -> Option<f64> {
        let i = n.checked_sub(self.index.n_min)?;
        self.acceptance.get(i).map(AcceptanceRate::alpha)
    }

    /// The measured step costs.
    pub fn lengths(&self) -> &LengthController {
        &self.lengths
    }

    /// How many of `available` continuation tokens of a size-`n` match to propose: all of them
    /// (up to `k`) when fixed; when adaptive the `K ∈ 0..=available` maximizing
    /// `E[τ](α_n, K) / r(K + 1)`.
    fn length(&self, origin: Origin, n: usize, available: usize) -> usize {
        if !self.adaptive {
            return available;
        }
        if self.lengths.wants_one_token_step() {
            // Keeps the one-token time, every cost's unit, fresh; the match still makes a
            // free trial.
            return 0;
        }
        let alpha = self
            .rates(origin)
            .get(n.saturating_sub(self.index.n_min))
            .map_or(0.5, AcceptanceRate::alpha);
        best_length_by(alpha, 0, available, |k| {
            self.lengths.verification_cost(k + 1)
        })
    }

    /// The index over the current request's tokens.
    pub fn index(&self) -> &NgramIndex {
        &self.index
    }

    /// The acceptance rates of matches from `origin`, by n-gram size.
    fn rates(&self, origin: Origin) -> &[AcceptanceRate] {
        match origin {
            Origin::Context => &self.acceptance,
            Origin::History => &self.history_acceptance,
        }
    }

    /// The index a match from `origin` points into.
    fn source(&self, origin: Origin) -> &NgramIndex {
        match (origin, &self.history) {
            (Origin::History, Some(history)) => history,
            _ => &self.index,
        }
    }

    /// Up to `max` tokens of a match's continuation, cut at the end of its request.
    fn continuation(&self, origin: Origin, start: usize, max: usize) -> &[u32] {
        let tokens = self.source(origin).continuation(start, max);
        let end = tokens
            .iter()
            .position(|&t| t == REQUEST_END)
            .unwrap_or(tokens.len());
        &tokens[..end]
    }

    /// The tokens this drafter proposes after `context`, at most `max_depth` of them.
    pub fn propose(&mut self, context: &[u32], max_depth: usize) -> &[u32] {
        let (m, k) = self.plan(context, max_depth);
        match m {
            Some((origin, m)) => self.continuation(origin, m.start, k),
            None => &[],
        }
    }

    /// The match after `context` (in the context itself, else in earlier requests) and the
    /// draft length for it.
    fn plan(
        &mut self,
        context: &[u32],
        max_depth: usize,
    ) -> (Option<(Origin, LookupMatch)>, usize) {
        self.index.sync(context);
        let found = match self.index.find() {
            Some(m) => Some((Origin::Context, m)),
            None => self
                .history
                .as_ref()
                .and_then(|h| h.find_suffix_of(self.index.tokens()))
                .map(|m| (Origin::History, m)),
        };
        let Some((origin, m)) = found else {
            return (None, 0);
        };
        let available = self
            .continuation(origin, m.start, self.k.min(max_depth))
            .len();
        if available == 0 {
            return (None, 0);
        }
        (Some((origin, m)), self.length(origin, m.n, available))
    }
}

impl<B: Backend> Drafter<B> for PromptLookup {
    fn name(&self) -> &str {
        "prompt-lookup"
    }

    fn begin(&mut self, prompt: &[u32]) -> spec_engine::Result<()> {
        self.remember_request();
        self.index.clear();
        self.index.extend(prompt);
        self.pending = None;
        // Acceptance is a property of the text; the step costs of the machine and model carry
        // over from earlier requests.
        for rate in self
            .acceptance
            .iter_mut()
            .chain(&mut self.history_acceptance)
        {
            *rate = AcceptanceRate::with_decay(ACCEPTANCE_DECAY);
        }
        Ok(())
    }

    fn forget_requests(&mut self) {
        if let Some(history) = &mut self.history {
            history.clear();
        }
        // The request in flight, if any, is not remembered either.
        self.index.clear();
    }

    fn draft(&mut self, request: DraftRequest<'_, B>) -> spec_engine::Result<Draft<B>> {
        let root = request.root()?;
        let (context, max_depth) = (request.context, request.max_depth);
        let (m, k) = self.plan(context, max_depth);
        let (tree, shadow) = match m {
            Some((origin, m)) => {
                let continuation = self.continuation(origin, m.start, k + 1);
                let shadow = if k == 0 {
                    continuation.first().copied()
                } else {
                    None
                };
                (
                    TokenTree::chain(root, &continuation[..k.min(continuation.len())]),
                    shadow,
                )
            }
            None => (TokenTree::new(root), None),
        };
        self.pending = Some(PendingStep {
            found: m.map(|(origin, m)| (origin, m.n)),
            drafted: tree.drafted(),
            shadow,
            context_len: context.len(),
        });
        Ok(Draft {
            tree,
            proposal: Proposal::Deterministic,
            draft_forwards: 0,
        })
    }

    fn accepted(&mut self, context: &[u32], outcome: &StepOutcome<B>) -> spec_engine::Result<()> {
        self.lengths.observe(outcome);
        let verdict = &outcome.verdict;
        if let Some(step) = self.pending.take() {
            let n_min = self.index.n_min;
            let rate = step.found.and_then(|(origin, n)| match origin {
                Origin::Context => self.acceptance.get_mut(n - n_min),
                Origin::History => self.history_acceptance.get_mut(n - n_min),
            });
            if let Some(rate) = rate {
                if step.drafted > 0 {
                    rate.record_chain(step.drafted, verdict.accepted.len());
                } else if let (Some(shadow), Some(&produced)) =
                    (step.shadow, context.get(step.context_len))
                {
                    // A point-mass draft x is accepted with probability p(x), the probability
                    // that the step outputs x: the comparison is an exact trial.
                    rate.record_trial(produced == shadow);
                }
            }
        }
        self.index.sync(context);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::scripted::scripted_step;

    /// The rule by brute force: for n from n_max down, the latest e < len with a matching
    /// n-gram ending at e.
    fn brute(tokens: &[u32], n_min: usize, n_max: usize) -> Option<LookupMatch> {
        let len = tokens.len();
        for n in (n_min..=n_max.min(len)).rev() {
            let suffix = &tokens[len - n..];
            for e in (n..len).rev() {
                if &tokens[e - n..e] == suffix {
                    return Some(LookupMatch { n, start: e });
                }
            }
        }
        None
    }

    #[test]
    fn finds_the_most_recent_longest_match() {
        let mut index = NgramIndex::new(1, 3).unwrap();
        // a b c X a b c Y a b c  → the suffix "a b c" last occurred before Y.
        index.extend(&[1, 2, 3, 10, 1, 2, 3, 11, 1, 2, 3]);
        let m = index.find().unwrap();
        assert_eq!(m, LookupMatch { n: 3, start: 7 });
        assert_eq!(index.continuation(m.start, 5), &[11, 1, 2, 3]);
        // Only a 1-gram matches: "c 9" is new, "9" occurred once before.
        index.extend(&[9, 4, 9]);
        assert_eq!(index.find(), Some(LookupMatch { n: 1, start: 12 }));
        assert_eq!(index.continuation(12, 1), &[4]);
        // No match at all.
        index.push(77);
        assert_eq!(index.find(), None);
    }

    #[test]
    fn each_ngram_size_gives_its_latest_match_once() {
        let mut index = NgramIndex::new(1, 3).unwrap();
        // "2 3" last before 9, "3" last before 8, "1 2 3" last before 7.
        index.extend(&[1, 2, 3, 7, 5, 2, 3, 9, 4, 3, 8, 1, 2, 3]);
        let each = index.find_each();
        assert_eq!(
            each,
            vec![
                LookupMatch { n: 3, start: 3 },
                LookupMatch { n: 2, start: 7 },
                LookupMatch { n: 1, start: 10 },
            ]
        );
        assert_eq!(each[0], index.find().unwrap());
        // Sizes whose latest match is the same occurrence give it once.
        let mut index = NgramIndex::new(1, 3).unwrap();
        index.extend(&[1, 2, 3, 7, 1, 2, 3]);
        assert_eq!(index.find_each(), vec![LookupMatch { n: 3, start: 3 }]);
    }

    #[test]
    fn the_suffix_is_not_its_own_match() {
        let mut index = NgramIndex::new(1, 2).unwrap();
        index.extend(&[5, 6]);
        assert_eq!(index.find(), None);
        index.push(5);
        // "5" occurred at 0, followed by 6.
        assert_eq!(index.find(), Some(LookupMatch { n: 1, start: 1 }));
    }

    #[test]
    fn incremental_index_agrees_with_brute_force_and_is_linear() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
        for (n_min, n_max, alphabet) in [(1, 3, 4u32), (2, 4, 3), (1, 1, 6), (3, 5, 2)] {
            let mut index = NgramIndex::new(n_min, n_max).unwrap();
            let mut tokens = Vec::new();
            for _ in 0..400 {
                let t = rng.random_range(0..alphabet);
                tokens.push(t);
                index.push(t);
                assert_eq!(index.find(), brute(&tokens, n_min, n_max), "{tokens:?}");
            }
            // Each token enters at most (n_max - n_min + 1) n-grams: no rescans.
            let per_token = (n_max - n_min + 1) as u64;
            assert!(index.insertions() <= per_token * tokens.len() as u64);
        }
    }

    #[test]
    fn sync_extends_or_reindexes() {
        let mut index = NgramIndex::new(1, 2).unwrap();
        index.sync(&[1, 2, 3]);
        let before = index.insertions();
        index.sync(&[1, 2, 3, 1]);
        // One token appended: at most two insertions.
        assert!(index.insertions() - before <= 2);
        assert_eq!(index.find(), Some(LookupMatch { n: 1, start: 1 }));
        // A different sequence is re-indexed.
        index.sync(&[7, 8]);
        assert_eq!(index.tokens(), &[7, 8]);
        assert_eq!(index.find(), None);
    }

    #[test]
    fn bad_settings_are_errors() {
        for (min_n, max_n) in [(0, 3), (3, 2), (1, 17)] {
            let err = NgramIndex::new(min_n, max_n).unwrap_err();
            assert!(err.to_string().contains("ngram_min"), "{err}");
        }
        let err = PromptLookup::new(PromptLookupConfig {
            k: 0,
            ..Default::default()
        })
        .unwrap_err();
        assert!(err.to_string().contains("at least 1"), "{err}");
    }

    #[test]
    fn proposals_respect_k_and_depth() {
        let mut lookup = PromptLookup::new(PromptLookupConfig {
            k: 3,
            ngram_max: 2,
            ngram_min: 1,
            adaptive: false,
            history_tokens: 0,
        })
        .unwrap();
        let context = [1, 2, 3, 4, 5, 6, 1, 2];
        assert_eq!(lookup.propose(&context, 10), &[3, 4, 5]);
        assert_eq!(lookup.propose(&context, 1), &[3]);
        assert!(lookup.propose(&context, 0).is_empty());
    }

    #[test]
    fn the_cross_request_cache_matches_earlier_requests_without_crossing_them() {
        type B = burn::backend::Flex;
        let config = PromptLookupConfig {
            ngram_max: 2,
            ngram_min: 2,
            ..PromptLookupConfig::fixed(4)
        };
        let mut lookup = PromptLookup::new(config.with_history(64)).unwrap();
        let mut plain = PromptLookup::new(config).unwrap();
        for drafter in [&mut lookup, &mut plain] {
            Drafter::<B>::begin(drafter, &[10, 11, 12, 13]).unwrap();
            Drafter::<B>::begin(drafter, &[5, 6]).unwrap();
            Drafter::<B>::begin(drafter, &[20, 10, 11]).unwrap();
        }
        assert_eq!(lookup.history_len(), 8);
        // "10 11" occurs only in the first request: its continuation, cut at that request's end.
        assert_eq!(lookup.propose(&[20, 10, 11], 10), &[12, 13]);
        assert!(plain.propose(&[20, 10, 11], 10).is_empty());
        // A match in the current context wins over the cache.
        assert_eq!(lookup.propose(&[20, 10, 11, 99, 10, 11], 10), &[99, 10, 11]);
        // "13 5" spans two requests: no match.
        assert!(lookup.propose(&[7, 13, 5], 10).is_empty());
        // Forgotten: nothing of the earlier requests (nor of the one in flight) is kept.
        Drafter::<B>::forget_requests(&mut lookup);
        Drafter::<B>::begin(&mut lookup, &[20, 10, 11]).unwrap();
        assert_eq!(lookup.history_len(), 0);
        assert!(lookup.propose(&[20, 10, 11], 10).is_empty());
    }

    #[test]
    fn the_cross_request_cache_keeps_the_newest_requests_within_its_size() {
        type B = burn::backend::Flex;
        let config = PromptLookupConfig {
            ngram_max: 2,
            ngram_min: 2,
            ..PromptLookupConfig::fixed(4)
        };
        let mut lookup = PromptLookup::new(config.with_history(12)).unwrap();
        for r in 0..20u32 {
            Drafter::<B>::begin(&mut lookup, &[100 + r, 1, 2, 3]).unwrap();
            assert!(lookup.history_len() <= 12, "{}", lookup.history_len());
        }
        // The first requests are gone; the newest finished one (118 1 2 3; 119 is in flight) is
        // there. (Each query differs from the indexed context before its last token, so it is
        // indexed afresh.)
        assert!(lookup.propose(&[7, 100, 1], 10).is_empty());
        assert_eq!(lookup.propose(&[7, 7, 7, 118, 1], 10), &[2, 3]);
        // A request longer than the whole cache is not kept.
        let long: Vec<u32> = (200..230).collect();
        Drafter::<B>::begin(&mut lookup, &long).unwrap();
        Drafter::<B>::begin(&mut lookup, &[1]).unwrap();
        assert!(lookup.propose(&[7, 200, 201], 10).is_empty());
        assert!(lookup.history_len() <= 12);
    }

    /// Prompt lookup from two-token matches only, up to 4 drafts.
    fn two_gram_lookup(adaptive: bool) -> PromptLookup {
        PromptLookup::new(PromptLookupConfig {
            adaptive,
            ngram_max: 2,
            ngram_min: 2,
            ..PromptLookupConfig::fixed(4)
        })
        .unwrap()
    }

    #[test]
    fn adaptive_length_stops_on_bad_matches_and_resumes_on_good_ones() {
        let mut lookup = two_gram_lookup(true);
        let mut context = vec![1, 2, 99, 1, 2, 98, 1];
        Drafter::<burn::backend::Flex>::begin(&mut lookup, &context).unwrap();
        // Phase 1: "1 2" is always followed by a new token, so every match is wrong.
        let fresh = |c: &[u32]| -> u32 {
            match c.last() {
                Some(1) => 2,
                Some(2) => 100 + c.len() as u32,
                _ => 1,
            }
        };
        let mut phase1 = Vec::new();
        for _ in 0..90 {
            phase1.push(scripted_step(&mut lookup, &mut context, &fresh));
        }
        assert!(phase1[..6].iter().any(|&(d, _)| d > 0), "{phase1:?}");
        assert!(phase1.iter().all(|&(_, a)| a == 0));
        // Once α has decayed below break-even, no more drafts.
        assert!(phase1[60..].iter().all(|&(d, _)| d == 0), "{phase1:?}");
        assert!(lookup.alpha(2).unwrap() < 0.09);
        // Phase 2: the text repeats "1 2 7"; the matches are right, which only the free shadow
        // trials can show, since nothing is drafted.
        let repeat = |c: &[u32]| -> u32 {
            match c.last() {
                Some(1) => 2,
                Some(2) => 7,
                _ => 1,
            }
        };
        let mut phase2 = Vec::new();
        for _ in 0..60 {
            phase2.push(scripted_step(&mut lookup, &mut context, &repeat));
        }
        let late = &phase2[30..];
        assert!(late.iter().all(|&(d, a)| d > 0 && a == d), "{phase2:?}");
        assert!(lookup.alpha(2).unwrap() > 0.5);
        // The fixed rule drafts on every match, right or wrong.
        let mut fixed = two_gram_lookup(false);
        let mut context = vec![1, 2, 99, 1, 2, 98, 1];
        Drafter::<burn::backend::Flex>::begin(&mut fixed, &context).unwrap();
        let steps: Vec<_> = (0..90)
            .map(|_| scripted_step(&mut fixed, &mut context, &fresh))
            .collect();
        assert!(steps[60..].iter().filter(|&&(d, _)| d > 0).count() >= 10);
    }
}
