//! The portable kernel: the same packed layouts, one weight row decoded at a time.

use std::ops::Range;

use crate::pack::{
    BLOCK, PackedMatrix, Storage, block_index, grouped_byte, grouped_scale_index, high_place,
    nibble_place, spanned_block_index, superblock_load,
};

/// Writes weight row `r` (all `padded_cols` of it) as f32 into `out`.
pub(crate) fn dequantize_row(mat: &PackedMatrix, r: usize, out: &mut [f32]) {
    let blocks = mat.padded_cols() / BLOCK;
    for (b, out) in out.chunks_exact_mut(BLOCK).enumerate().take(blocks) {
        let at = match mat.storage {
            Storage::F32(_) => spanned_block_index(r, b, blocks, mat.panel_rows()),
            _ => block_index(r, b, blocks),
        };
        match &mat.storage {
            Storage::F32(w) => out.copy_from_slice(&w[at * BLOCK..(at + 1) * BLOCK]),
            Storage::Bf16(w) => {
                let words = &w[at * BLOCK / 2..(at + 1) * BLOCK / 2];
                for (chunk, out) in words.chunks_exact(8).zip(out.chunks_exact_mut(16)) {
                    for (l, &word) in chunk.iter().enumerate() {
                        out[l] = f32::from_bits(word & 0xFFFF_0000);
                        out[8 + l] = f32::from_bits(word << 16);
                    }
                }
            }
            Storage::Q8_0 { quants, scales } => {
                let scale = scales[at];
                for (&word, out) in quants[at * 4..(at + 1) * 4]
                    .iter()
                    .zip(out.chunks_exact_mut(8))
                {
                    for (o, q) in out.iter_mut().zip(word.to_le_bytes()) {
                        *o = f32::from(q as i8) * scale;
                    }
                }
            }
            Storage::Q8_0Groups { quants, scales } => {
                let scale = scales[grouped_scale_index(r, b, blocks)];
                for (k, o) in out.iter_mut().enumerate() {
                    let (unit, byte) = grouped_byte(b, k, blocks);
                    let word = quants[block_index(r, unit, blocks) * 4 + byte / 8];
                    *o = f32::from((word.to_le_bytes()[byte % 8] ^ 0x80) as i8) * scale;
                }
            }
            Storage::Q4 { quants, params } => {
                let [scale, min] = params[at];
                write_q4_block(&quants[at * 2..(at + 1) * 2], scale, min, out);
            }
            Storage::Q4A8 {
                quants,
                scales,
                mins,
            } => {
                let (scale, min) = (scales[at], mins[r * blocks + b]);
                write_q4_block(&quants[at * 2..(at + 1) * 2], scale, min, out);
            }
            Storage::Q4K {
                quants,
                scales,
                steps,
                mins,
                neg_min_steps,
            } => {
                let (s, j) = (b / 8, b % 8);
                let per_row = blocks / 8;
                let at_s = block_index(r, s, per_row);
                let step = steps[at_s] * f32::from(scales[at_s].to_le_bytes()[j]);
                let min_quant = mins[r * per_row + s].to_le_bytes()[j];
                let min = neg_min_steps[r * per_row + s] * f32::from(min_quant);
                for (k, o) in out.iter_mut().enumerate() {
                    let q = grouped_nibble(quants, r, s, j, k, blocks);
                    // `step · q` is exact (an f16 step times 6- and 4-bit integers), so this is
                    // `Q4Superblock::dequantize`'s value.
                    *o = f32::from(q).mul_add(step, min);
                }
            }
            Storage::Q6K {
                lows,
                highs,
                scales,
                steps,
            } => {
                let (s, j) = (b / 8, b % 8);
                let at_s = block_index(r, s, blocks / 8);
                let [even, odd] = scales[at_s].map(u64::to_le_bytes);
                for (k, o) in out.iter_mut().enumerate() {
                    let scale = if k < 16 { even[j] } else { odd[j] };
                    let step = steps[at_s] * f32::from(scale as i8);
                    let low = grouped_nibble(lows, r, s, j, k, blocks);
                    let (load, byte, shift) = high_place(j, k);
                    let high = (load_byte(highs, superblock_load(r, s, load, blocks, 1), byte)
                        >> shift)
                        & 3;
                    *o = step * f32::from((low | (high << 4)) as i8 - 32);
                }
            }
        }
    }
}

/// Byte `byte` of the 32-byte load starting at word `at`.
fn load_byte(words: &[u64], at: usize, byte: usize) -> u8 {
    words[at + byte / 8].to_le_bytes()[byte % 8]
}

/// Quant `k` of block `j` of superblock `s` of row `r` in grouped nibbles (`Storage::Q4K`'s
/// quants, `Storage::Q6K`'s lows).
fn grouped_nibble(words: &[u64], r: usize, s: usize, j: usize, k: usize, blocks: usize) -> u8 {
    let (load, byte, high) = nibble_place(j, k);
    let byte = load_byte(words, superblock_load(r, s, load, blocks, 2), byte);
    if high { byte >> 4 } else { byte & 0xF }
}

/// One Q4 block's 32 weights (two words of nibbles, see `Storage::Q4`) into `out`.
fn write_q4_block(words: &[u64], scale: f32, min: f32, out: &mut [f32]) {
    for (h, &word) in words.iter().enumerate() {
        for (l, byte) in word.to_le_bytes().into_iter().enumerate() {
            // One rounding, as the kernel's fused multiply-add.
            out[8 * h + l] = f32::from(byte & 0xF).mul_add(scale, min);
            out[16 + 8 * h + l] = f32::from(byte >> 4).mul_add(scale, min);
        }
    }
}

/// `outs[i][r - rows.start] = x[i] · W[r]` for `r` in `rows`; `x` is `[m, padded_cols]`.
pub(crate) fn run(
    mat: &PackedMatrix,
    rows: Range<usize>,
    x: &[f32],
    m: usize,
    outs: &mut [&mut [f32]],
) {
    let kp = mat.padded_cols();
    let mut w = vec![0.0f32; kp];
    for (j, r) in rows.enumerate() {
        dequantize_row(mat, r, &mut w);
        for (i, out) in outs.iter_mut().enumerate().take(m) {
            let xi = &x[i * kp..(i + 1) * kp];
            out[j] = xi.iter().zip(&w).map(|(a, b)| a * b).sum();
        }
    }
}
