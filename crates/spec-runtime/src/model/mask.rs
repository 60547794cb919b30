//! The attention bias of new tokens: which positions each may attend to, as 0 or -inf.

use std::ops::Range;

use crate::error::{Result, RuntimeError};
use crate::model::NewTokens;

/// Checks a mask's size and diagonal for `n` new tokens after `cached` positions (a causal pass
/// has nothing to check).
pub(crate) fn check_mask(n: usize, cached: usize, attention: NewTokens<'_>) -> Result<()> {
    let (span, mask) = match attention {
        NewTokens::Causal => return Ok(()),
        NewTokens::Mask(mask) => (0, mask),
        NewTokens::MaskWithCached { span, mask } => (span, mask),
    };
    if span > cached {
        return Err(RuntimeError::InvalidRequest(format!(
            "a mask over the last {span} cached positions of {cached}"
        )));
    }
    let width = span + n;
    if mask.len() != n * width {
        return Err(RuntimeError::InvalidRequest(format!(
            "a mask of {} entries for {n} new tokens over {width} positions",
            mask.len()
        )));
    }
    if (0..n).any(|i| !mask[i * width + span + i]) {
        return Err(RuntimeError::InvalidRequest(
            "every new token must attend to itself".into(),
        ));
    }
    Ok(())
}

/// Whether new token `i` may attend to new token `j` (the mask, if any, is checked already).
fn sees_new(n: usize, attention: NewTokens<'_>, i: usize, j: usize) -> bool {
    match attention {
        NewTokens::Causal => j <= i,
        NewTokens::Mask(mask) => mask[i * n + j],
        NewTokens::MaskWithCached { span, mask } => mask[i * (span + n) + span + j],
    }
}

/// Whether no new token attends to a later one, so the tokens can run in consecutive passes.
pub(crate) fn attends_only_backwards(n: usize, attention: NewTokens<'_>) -> bool {
    (0..n).all(|i| (i + 1..n).all(|j| !sees_new(n, attention, i, j)))
}

/// The attention bias `[n, width]` of `n` new tokens after `cached` positions (`width` at
/// least `cached + n`): 0 where a new token may attend, -inf elsewhere.
pub(crate) fn attention_bias(
    n: usize,
    cached: usize,
    attention: NewTokens<'_>,
    width: usize,
) -> Result<Vec<f32>> {
    check_mask(n, cached, attention)?;
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
        if let NewTokens::MaskWithCached { span, mask } = attention {
            let row = &mask[i * (span + n)..i * (span + n) + span];
            for (j, &visible) in row.iter().enumerate() {
                if !visible {
                    out[cached - span + j] = f32::NEG_INFINITY;
                }
            }
        }
        for j in 0..rows.end {
            if !sees_new(n, attention, i, j) {
                out[cached + j] = f32::NEG_INFINITY;
            }
        }
        out[visible_end..].fill(f32::NEG_INFINITY);
    }
    bias
}
