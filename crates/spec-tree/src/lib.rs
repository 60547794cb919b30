//! Token trees: several candidate continuations drafted at once and verified exactly in one
//! target pass (SpecInfer, Miao et al., ASPLOS 2024, arXiv 2305.09781), grown where the draft
//! is confident (EAGLE-2, Li et al. 2024, arXiv 2406.16858).
//!
//! # The method
//! A chain wastes the target's pass on one guess: after the first rejection every later draft
//! is thrown away. A tree offers the target several guesses at each position. The target scores
//! every node in one forward pass, each node attending to its ancestors only (the tree's
//! ancestor mask), and the verifier walks the tree from the root: at a node whose target
//! distribution is `p`, the children are tried in order with `r = p` at first,
//!
//! ```text
//! child x drawn from q_i:  accept with min(1, r(x) / q_i(x));  on rejection r ← norm(max(0, r − q_i))
//! ```
//!
//! (SpecInfer's multi-step speculative sampling, Theorem 4.2), moving to an accepted child; when
//! every child is rejected the step ends with a draw from `r`, and after an accepted leaf with a
//! draw from the target's distribution there. `q_i` is how child `i` was drawn: the draft's row
//! with the earlier siblings removed (drawn without replacement, `ChildDraw::WithoutReplacement`,
//! as in Jeon et al. 2024, arXiv 2402.14160), or a point mass `δ_x` for a candidate fixed in
//! advance (`ChildDraw::Fixed`: top-k tokens, prompt lookup, a bigram), for which the rule reads
//! "accept with r(x); on rejection remove x from r". The rule is exact for any mix of the two
//! (`spec_core::verify` proves it), so the output follows the target's distribution; greedy
//! verification follows the argmax path, and the output equals plain greedy decoding.
//!
//! # Where the candidates come from
//! - A draft model, expanded one level per forward pass on its own KV cache: each level's
//!   nodes attend to the context and to their ancestors among the levels before
//!   (`spec_runtime::NewTokens::MaskWithCached`); after the step the cache keeps the accepted
//!   path, as the target's does. Under greedy settings a node's children are the draft's `branch`
//!   likeliest tokens; otherwise `branch` tokens drawn without replacement from the draft's
//!   distribution under the run's settings. Which nodes of a level are expanded: every one for a
//!   fixed `shape` (SpecInfer's expansion, `4x2x2x1`: children per node at each depth);
//!   otherwise, as EAGLE-2 does, the nodes of highest value, up to `beam` a level, while a row
//!   is expected to pay: the node's value times the measured acceptance of the draft's likeliest
//!   child must exceed what one more row adds to the level and one more node to the
//!   verification.
//! - Prompt lookup: the continuation of the latest earlier match of each n-gram size of the
//!   context's suffix, one branch each.
//! - A bigram model: from the root, the nodes of highest value grow their likeliest followers.
//!
//! Candidates merge as in a trie: a fixed candidate equal to a sibling's token adds nothing but
//! value.
//!
//! # How big a tree
//! Each node carries a value, the estimated chance that its path is accepted: the product, down
//! its path, of each token's calibrated chance (the measured acceptance of the draft's tokens by
//! the probability the draft gave them, of a lookup match's tokens by the match's n-gram size,
//! of the bigram's by its probability; each learned from the tokens the verification tested).
//! A step over the `n` best nodes yields `E[τ](n) = 1 + Σ values` and costs `D + r(n + 1)` target
//! steps, `D` the drafting spent and `r` the verification's measured cost by width
//! (`spec_core::length::LengthController`); the drafter keeps the `n` maximizing their ratio
//! ([`sizing::best_size`]). On a CPU, where a wider verification costs more, trees stay small;
//! where width is nearly free they grow. A fixed `shape` is verified whole.
//!
//! Knobs ([`TreeSettings`]): `depth` (8), `beam` (4 nodes expanded a level), `branch` (4
//! children an expanded node), `max_nodes` (32 drafted nodes a step), `shape` (none).

mod candidates;
mod draft_source;
mod drafter;
mod error;
mod ngram_sources;
mod provenance;
mod shape;
pub mod sizing;
pub mod spec;

pub use candidates::Candidates;
pub use draft_source::Expansion;
pub use drafter::{TreeDrafter, TreeSettings, TreeSources};
pub use error::{Result, TreeError};
pub use provenance::{Trial, trials};
pub use shape::TreeShape;
