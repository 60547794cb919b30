//! The attention bias of new tokens: which positions each may attend to, as 0 or -inf.

use std::ops::Range;

use crate::error::{Result, RuntimeError};
use crate::model::NewTokens;

/// Checks a mask's size and diagonal for `n` new tokens (a causal pass has nothing to check).
pub(crate) fn check_mask(n: usize, attention: NewTokens<'_>) -> Result<()> {
    if let NewTokens::Mask(mask) = attention {
        if mask.len() != n * n {
            return Err(RuntimeError::InvalidRequest(format!(
                "a mask of {} entries for {n} new tokens",
                mask.len()
            )));
        }
        if (0..n).any(|i| !mask[i * n + i]) {
            return Err(RuntimeError::InvalidRequest(
                "every new token must attend to itself".into(),
            ));
        }
    }
    Ok(())
}

/// Whether no new token attends to a later one, so the tokens can run in consecutive passes.
pub(crate) fn attends_only_backwards(n: usize, attention: NewTokens<'_>) -> bool {
    match attention {
        NewTokens::Causal => true,
        NewTokens::Mask(mask) => (0..n).all(|i| (i + 1..n).all(|j| !mask[i * n + j])),
    }
}

/// The attention bias `[n, width]` of `n` new tokens after `cached` positions (`width` at
/// least `cached + n`): 0 where a new token may attend, -inf elsewhere.
pub(crate) fn attention_bias(
    n: usize,
    cached: usize,
    attention: NewTokens<'_>,
    width: usize,
) -> Result<Vec<f32>> {
    check_mask(n, attention)?;
    Ok(bias_rows(n, cached, 0..n, attention, width))
}

/// Rows `rows` of the attention bias of `n` new tokens after `cached` positions,
/// `[rows.len(), width]`: columns from `cached + rows.end` on (positions later than the last
/// of these rows, or padding past the cache's end) are -inf. The mask (if any) is checked
/// already.
pub(crate) fn bias_rows(
    n: usize,
    cached: usize,
    rows: Range<usize>,
    attention: NewTokens<'_>,
    width: usize,
) -> Vec<f32> {
    let visible_end = cached + rows.end;
    debug_assert!(width >= visible_end);
    let mut bias = vec![0.0f32; rows.len() * width];
    if width == 0 {
        return bias;
    }
    for (out, i) in bias.chunks_exact_mut(width).zip(rows.clone()) {
        for j in 0..rows.end {
            let visible = match attention {
                NewTokens::Causal => j <= i,
                NewTokens::Mask(mask) => mask[i * n + j],
            };
            if !visible {
                out[cached + j] = f32::NEG_INFINITY;
            }
        }
        out[visible_end..].fill(f32::NEG_INFINITY);
    }
    bias
}
