//! Unit-test support: one engine step against a scripted greedy target.

use burn::backend::Flex;
use spec_core::rng::SpecRng;
use spec_core::sampling::SamplingConfig;
use spec_core::verify::Verdict;
use spec_engine::{DraftRequest, Drafter, StepOutcome};

/// One greedy engine step against a target whose next token after a prefix is `truth`: drafts
/// are accepted while they equal it (greedy verification of point masses), then the target's
/// token follows. Returns (drafted, accepted).
pub(crate) fn scripted_step(
    drafter: &mut dyn Drafter<Flex>,
    context: &mut Vec<u32>,
    truth: &dyn Fn(&[u32]) -> u32,
) -> (usize, usize) {
    let mut rng = SpecRng::new(0);
    let sampling = SamplingConfig::greedy();
    #[allow(clippy::unwrap_used)]
    let tree = drafter
        .draft(DraftRequest::new(context, 16, &sampling, &mut rng))
        .unwrap()
        .tree;
    let mut accepted = Vec::new();
    for (i, &d) in tree.tokens()[1..].iter().enumerate() {
        if d != truth(context) {
            break;
        }
        context.push(d);
        accepted.push(i + 1);
    }
    let verdict = Verdict {
        next_token: truth(context),
        accepted,
    };
    context.push(verdict.next_token);
    let counts = (tree.drafted(), verdict.accepted.len());
    // No step time: the drafters' costs stay unmeasured (their priors, or fixed costs).
    #[allow(clippy::unwrap_used)]
    drafter
        .accepted(context, &StepOutcome::new(tree, verdict, 0.0))
        .unwrap();
    counts
}
