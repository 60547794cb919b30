//! Q8_0 weights: blocks of 32 int8 quants with one f32 scale, in order (`q8_0`) or grouped
//! 8 blocks at a time for the integer tiles (`q8_0-a8`, [`Storage::Q8_0Groups`]).

use super::{BLOCK, PANEL, Storage, block_index, place_row};

/// Blocks a group of [`Storage::Q8_0Groups`]: one 256-bit vector holds 4 quants of each.
pub(crate) const GROUP: usize = 8;

/// Where quant `k` of block `b` of a row of [`Storage::Q8_0Groups`] lies among the row's units
/// of 32 bytes (placed in the panels as blocks are): `(unit, byte)`. In each whole group of
/// [`GROUP`] blocks, unit `t` holds quants `4 t .. 4 t + 4` of every block of the group, block
/// after block; the blocks after the last whole group keep their own units.
pub(crate) fn grouped_byte(b: usize, k: usize, blocks: usize) -> (usize, usize) {
    if b < blocks / GROUP * GROUP {
        (b / GROUP * GROUP + k / 4, 4 * (b % GROUP) + k % 4)
    } else {
        (b, k)
    }
}

/// Where the scale of block `b` of row `r` lies in [`Storage::Q8_0Groups`]' scales: a whole
/// group's [`GROUP`] scales of a row follow each other (the panel's first row's, then the
/// second's, in the places of the group's blocks), so a tile reads them as one vector.
pub(crate) fn grouped_scale_index(r: usize, b: usize, blocks: usize) -> usize {
    if b < blocks / GROUP * GROUP {
        let lane = r % PANEL;
        let first = block_index(r, b / GROUP * GROUP, blocks) - lane;
        first + GROUP * lane + b % GROUP
    } else {
        block_index(r, b, blocks)
    }
}

/// The Q8_0 storage of `rows` padded rows.
pub(super) fn pack_q8_0(
    padded_row: &mut impl FnMut(usize) -> Vec<f32>,
    rows: usize,
    blocks: usize,
    panel_rows: usize,
) -> Storage {
    let padded_cols = blocks * BLOCK;
    let mut quants = vec![0u64; panel_rows * padded_cols / 8];
    let mut scales = vec![0.0f32; panel_rows * blocks];
    let mut row_quants = Vec::with_capacity(padded_cols / 8);
    let mut row_scales = Vec::with_capacity(blocks);
    for r in 0..rows {
        row_quants.clear();
        row_scales.clear();
        for block in padded_row(r).chunks_exact(BLOCK) {
            let (scale, q) = quantize_block(block);
            row_scales.push(scale);
            for eight in q.chunks_exact(8) {
                let bytes: [u8; 8] = std::array::from_fn(|l| eight[l] as u8);
                row_quants.push(u64::from_le_bytes(bytes));
            }
        }
        place_row(&mut quants, r, &row_quants, blocks, BLOCK / 8);
        place_row(&mut scales, r, &row_scales, blocks, 1);
    }
    Storage::Q8_0 { quants, scales }
}

/// The [`Storage::Q8_0Groups`] storage of `rows` padded rows: Q8_0's quants, stored plus 128,
/// in [`grouped_byte`]'s order, and the scales in [`grouped_scale_index`]'s.
pub(super) fn pack_q8_0_groups(
    padded_row: &mut impl FnMut(usize) -> Vec<f32>,
    rows: usize,
    blocks: usize,
    panel_rows: usize,
) -> Storage {
    let padded_cols = blocks * BLOCK;
    let mut quants = vec![0u64; panel_rows * padded_cols / 8];
    let mut scales = vec![0.0f32; panel_rows * blocks];
    let mut bytes = vec![0u8; padded_cols];
    let mut words = Vec::with_capacity(padded_cols / 8);
    for r in 0..rows {
        for (b, block) in padded_row(r).chunks_exact(BLOCK).enumerate() {
            let (scale, q) = quantize_block(block);
            scales[grouped_scale_index(r, b, blocks)] = scale;
            for (k, &q) in q.iter().enumerate() {
                let (unit, byte) = grouped_byte(b, k, blocks);
                bytes[unit * BLOCK + byte] = q as u8 ^ 0x80;
            }
        }
        words.clear();
        words.extend(
            bytes
                .chunks_exact(8)
                .map(|eight| u64::from_le_bytes(std::array::from_fn(|l| eight[l]))),
        );
        place_row(&mut quants, r, &words, blocks, BLOCK / 8);
    }
    Storage::Q8_0Groups { quants, scales }
}

/// Q8_0 quantization of one block: `scale = max |w| / 127`, `q = round(w / scale)`.
fn quantize_block(block: &[f32]) -> (f32, [i8; BLOCK]) {
    let amax = block.iter().fold(0.0f32, |a, w| a.max(w.abs()));
    let mut q = [0i8; BLOCK];
    if amax == 0.0 {
        return (0.0, q);
    }
    let scale = amax / 127.0;
    let inv = 1.0 / scale;
    for (q, w) in q.iter_mut().zip(block) {
        *q = (w * inv).round().clamp(-127.0, 127.0) as i8;
    }
    (scale, q)
}
