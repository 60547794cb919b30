//! The portable kernel: the same packed layouts, one weight row decoded at a time.

use std::ops::Range;

use crate::pack::{BLOCK, PackedMatrix, Storage, block_index, grouped_byte, grouped_scale_index};

/// Writes weight row `r` (all `padded_cols` of it) as f32 into `out`.
pub(crate) fn dequantize_row(mat: &PackedMatrix, r: usize, out: &mut [f32]) {
    let blocks = mat.padded_cols() / BLOCK;
    for (b, out) in out.chunks_exact_mut(BLOCK).enumerate().take(blocks) {
        let at = block_index(r, b, blocks);
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
                write_q4_block(&quants[at * 2..(at + 1) * 2], step, min, out);
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
                let high = highs[at].to_le_bytes();
                for (half, scale) in [(0, even[j]), (1, odd[j])] {
                    let step = steps[at_s] * f32::from(scale as i8);
                    for l in 0..16 {
                        let k = 16 * half + l;
                        let word = lows[at * 2 + (l / 8)].to_le_bytes()[l % 8];
                        let low = if half == 0 { word & 0xF } else { word >> 4 };
                        let high = (high[k % 8] >> (2 * (k / 8))) & 3;
                        let q = (low | (high << 4)) as i8 - 32;
                        out[k] = step * f32::from(q);
                    }
                }
            }
        }
    }
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
