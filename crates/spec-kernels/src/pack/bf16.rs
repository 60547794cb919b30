//! bf16 weights: chunks of 16 in 8 `u32` words, word `l` holding weight `l` in its high half
//! and weight `8 + l` in its low half (see the crate docs).

use half::bf16;

use super::{BLOCK, Storage, place_row};

/// The bf16 storage of `rows` padded rows (each weight rounded to bf16).
pub(super) fn pack_bf16(
    padded_row: &mut impl FnMut(usize) -> Vec<f32>,
    rows: usize,
    blocks: usize,
    panel_rows: usize,
) -> Storage {
    let padded_cols = blocks * BLOCK;
    let mut out = vec![0u32; panel_rows * padded_cols / 2];
    let mut words = Vec::with_capacity(padded_cols / 2);
    for r in 0..rows {
        words.clear();
        for chunk in padded_row(r).chunks_exact(16) {
            for l in 0..8 {
                let hi = u32::from(bf16::from_f32(chunk[l]).to_bits());
                let lo = u32::from(bf16::from_f32(chunk[8 + l]).to_bits());
                words.push((hi << 16) | lo);
            }
        }
        place_row(&mut out, r, &words, blocks, BLOCK / 2);
    }
    Storage::Bf16(out)
}
