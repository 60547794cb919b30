//! One verification step: the target scores the draft tree in one pass, the verifier decides,
//! the cache keeps the accepted path.

use std::time::Instant;

use burn::tensor::backend::Backend;
use burn::tensor::{Int, Tensor, TensorData, activation::softmax};
use spec_core::rng::SpecRng;
use spec_core::step::{StepNeeds, StepOutcome};
use spec_core::tree::ROOT;
use spec_core::verify::Verifier;
use spec_runtime::model::{ForwardOutput, ForwardRequest, LogitRows, Transformer};
use spec_runtime::{KvCache, RuntimeError};

use crate::Result;
use crate::drafter::Draft;

/// Runs one step over `draft` and reports it: the target's forward pass over the tree (with
/// its ancestor mask unless it is a chain), the verification, and the cache rollback to the
/// root and the accepted path, timed together ([`StepOutcome::seconds`]). The rows `needs`
/// asks for are gathered from the same pass, outside the timed part.
///
/// On error the cache is left as it was before the step.
pub fn step<B: Backend>(
    target: &Transformer<B>,
    cache: &mut KvCache<B>,
    verifier: &Verifier,
    draft: Draft<B>,
    needs: StepNeeds,
    rng: &mut SpecRng,
) -> Result<StepOutcome<B>> {
    let start = Instant::now();
    let Draft { tree, proposal, .. } = draft;
    let base = cache.len();
    let positions = tree.positions(base);
    let is_chain = (0..tree.len()).all(|n| tree.children(n).len() <= 1);
    let mask;
    let mut request = ForwardRequest::tokens(tree.tokens())
        .positions(&positions)
        .logits(LogitRows::All);
    if !is_chain {
        mask = tree.ancestor_mask();
        request = request.mask(&mask);
    }
    let out = match target.forward(request, cache) {
        Ok(out) => out,
        Err(e) => {
            cache.truncate(base);
            return Err(e.into());
        }
    };
    let ForwardOutput {
        logits,
        last_hidden,
        ..
    } = out;
    let Some(logits) = logits else {
        cache.truncate(base);
        return Err(RuntimeError::InvalidRequest("no logits returned".into()).into());
    };
    // Kept only where asked for: a second reference to the logits would make the backend copy
    // them where it could work in place.
    let kept_logits = needs.target_probs.then(|| logits.clone());
    let kept_hidden = needs.hidden.then_some(last_hidden);
    let verdict = match verifier.verify_tree(&tree, logits, proposal, rng) {
        Ok(v) => v,
        Err(e) => {
            cache.truncate(base);
            return Err(e.into());
        }
    };
    if is_chain {
        // A chain's accepted path is a prefix: rolling back is a truncation.
        cache.truncate(base + 1 + verdict.accepted.len());
    } else {
        let mut path = Vec::with_capacity(verdict.accepted.len() + 1);
        path.push(ROOT);
        path.extend(&verdict.accepted);
        cache.keep_path(base, &path)?;
    }
    let seconds = start.elapsed().as_secs_f64();
    let mut outcome = StepOutcome::new(tree, verdict, seconds);
    if kept_hidden.is_some() || kept_logits.is_some() {
        let rows = path_rows(&outcome, &target.device());
        outcome.hidden = kept_hidden.map(|h| target.norm.forward(h.select(0, rows.clone())));
        outcome.target_probs = kept_logits.map(|l| softmax(l.select(0, rows), 1));
    }
    Ok(outcome)
}

/// The rows of the step's pass at the root and the accepted nodes (nodes are laid out in
/// order), as an index tensor.
fn path_rows<B: Backend>(outcome: &StepOutcome<B>, device: &B::Device) -> Tensor<B, 1, Int> {
    let rows: Vec<i64> = outcome.path_rows().into_iter().map(|n| n as i64).collect();
    let n = rows.len();
    Tensor::from_data(TensorData::new(rows, [n]), device)
}
