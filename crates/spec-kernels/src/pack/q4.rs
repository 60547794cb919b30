//! Q4 weights (`q4`, `q4-a8`, `q4-a8-lossy`): blocks of 32 nibbles with an f32 scale and
//! minimum, for weights on at most 16 evenly spaced levels a block (or rounded to them).

use super::{BLOCK, Storage, block_index, place_row};

/// Zeros after a Q4 matrix's minimums, so that any row's minimums can be read in whole vectors
/// of 8 (see [`Storage::Q4A8`]).
pub(crate) const MINS_TAIL: usize = 8;

/// The low 4 bits of a block's 32 quants as Q4's two words (see [`Storage::Q4`]): byte `l` of
/// word `h` holds quant `8 h + l` in its low nibble and `16 + 8 h + l` in its high one.
fn nibble_words(q: &[u8]) -> [u64; 2] {
    std::array::from_fn(|h| {
        let bytes: [u8; 8] =
            std::array::from_fn(|l| (q[8 * h + l] & 0xF) | ((q[16 + 8 * h + l] & 0xF) << 4));
        u64::from_le_bytes(bytes)
    })
}

/// The Q4 storage of `rows` padded rows (minimums `apart` for `Q4A8`), or `None` when a
/// block's weights are not on a grid of at most 16 evenly spaced levels and may not be
/// `round`ed to one.
pub(super) fn pack_q4(
    padded_row: &mut impl FnMut(usize) -> Vec<f32>,
    rows: usize,
    cols: usize,
    blocks: usize,
    panel_rows: usize,
    apart: bool,
    round: bool,
) -> Option<Storage> {
    let mut quants = vec![0u64; panel_rows * blocks * BLOCK / 16];
    let mut scales = vec![0.0f32; panel_rows * blocks];
    let mut mins = Vec::with_capacity(panel_rows * blocks + MINS_TAIL);
    let mut row_quants = Vec::with_capacity(blocks * BLOCK / 16);
    let mut row_scales = Vec::with_capacity(blocks);
    for r in 0..rows {
        row_quants.clear();
        row_scales.clear();
        for (b, block) in padded_row(r).chunks_exact(BLOCK).enumerate() {
            // Padding columns multiply zeros of x: they take quant 0, whatever their value.
            let valid = cols.saturating_sub(b * BLOCK).min(BLOCK);
            let values = &block[..valid];
            let (scale, min, q) = match grid_block(values) {
                Some(exact) => exact,
                None if round => round_block(values),
                None => return None,
            };
            row_scales.push(scale);
            mins.push(min);
            row_quants.extend(nibble_words(&q));
        }
        place_row(&mut quants, r, &row_quants, blocks, BLOCK / 16);
        place_row(&mut scales, r, &row_scales, blocks, 1);
    }
    // A last panel's missing row, as its scales; then the tail.
    mins.resize(panel_rows * blocks + MINS_TAIL, 0.0);
    if apart {
        return Some(Storage::Q4A8 {
            quants,
            scales,
            mins,
        });
    }
    // `q4` reads a block's scale and minimum together: pairs in the panels' order.
    let mut params = vec![[0.0f32; 2]; panel_rows * blocks];
    for r in 0..rows {
        for b in 0..blocks {
            let at = block_index(r, b, blocks);
            params[at] = [scales[at], mins[r * blocks + b]];
        }
    }
    Some(Storage::Q4 { quants, params })
}

/// `(scale, min, quants)` with `w = scale · q + min` for values on at most 16 evenly spaced
/// levels, the smallest being `min`; `None` for values that are not. The coarsest grid of 1 to
/// 15 steps between the smallest and the largest value that holds every value (to a thousandth
/// of a step) is taken (a 4-bit checkpoint's block spans at most 15 of its steps; fewer steps,
/// less rounding in `scale`).
fn grid_block(values: &[f32]) -> Option<(f32, f32, [u8; BLOCK])> {
    let mut q = [0u8; BLOCK];
    let (lo, hi) = extremes(values);
    if values.is_empty() || hi == lo {
        return Some((0.0, if values.is_empty() { 0.0 } else { lo }, q));
    }
    'steps: for steps in 1..=15u8 {
        let scale = (hi - lo) / f32::from(steps);
        for (q, &w) in q.iter_mut().zip(values) {
            let t = (w - lo) / scale;
            let level = t.round();
            if (t - level).abs() > 1e-3 || level > f32::from(steps) {
                continue 'steps;
            }
            *q = level as u8;
        }
        return Some((scale, lo, q));
    }
    None
}

/// The smallest and the largest of `values` (∞ and −∞ when there are none).
fn extremes(values: &[f32]) -> (f32, f32) {
    values
        .iter()
        .fold((f32::INFINITY, f32::NEG_INFINITY), |(lo, hi), &v| {
            (lo.min(v), hi.max(v))
        })
}

/// `(scale, min, quants)` with `w ≈ scale · q + min`: the values rounded to the nearest of 16
/// evenly spaced levels from the smallest to the largest (each moves by at most half a step,
/// `scale / 2`).
fn round_block(values: &[f32]) -> (f32, f32, [u8; BLOCK]) {
    let mut q = [0u8; BLOCK];
    let (lo, hi) = extremes(values);
    if values.is_empty() || hi <= lo {
        return (0.0, if values.is_empty() { 0.0 } else { lo }, q);
    }
    let scale = (hi - lo) / 15.0;
    for (q, &w) in q.iter_mut().zip(values) {
        *q = ((w - lo) / scale).round().clamp(0.0, 15.0) as u8;
    }
    (scale, lo, q)
}
