//! A GGUF's Q4_K and Q6_K superblocks kept as they are ([`Storage::Q4K`], [`Storage::Q6K`]):
//! the quants grouped as `q8_0-a8`'s units, a superblock's scales and steps beside them.

use crate::error::KernelError;

use super::{BLOCK, PANEL, PackedMatrix, Storage, WeightFormat, block_index, rows_in_panels};

/// Where quant `k` of block `j` of a superblock (either format) lies in the superblock's
/// grouped nibbles ([`Storage::Q4K`], [`Storage::Q6K`]'s `lows`): `(load, byte, high)`, the
/// 32-byte load of the row's superblock, the byte in it and whether the high nibble. As for
/// [`grouped_byte`], unit `t` holds quants `4 t .. 4 t + 4` of each of the 8 blocks (byte
/// `4 j + k % 4`): load `u` holds unit `2 u` in its low nibbles and `2 u + 1` in its high ones.
///
/// [`grouped_byte`]: super::grouped_byte
pub(crate) fn nibble_place(j: usize, k: usize) -> (usize, usize, bool) {
    let unit = k / 4;
    (unit / 2, 4 * j + k % 4, unit % 2 == 1)
}

/// Where the high 2 bits of quant `k` of block `j` of a Q6_K superblock lie in its `highs`:
/// `(load, byte, shift)`; load `v` holds units `4 v .. 4 v + 4`, unit `t` at bits
/// `2 (t % 4)` of byte `4 j + k % 4`.
pub(crate) fn high_place(j: usize, k: usize) -> (usize, usize, u32) {
    let unit = k / 4;
    (unit / 4, 4 * j + k % 4, 2 * (unit % 4) as u32)
}

/// The word at which 32-byte load `load` of superblock `s` of row `r` starts, for data of
/// `words_per_block` words a block kept in the panels: a panel's superblock holds its rows'
/// loads in turn (load 0 of both rows, then load 1, …), so a tile streams them in order.
pub(crate) fn superblock_load(
    r: usize,
    s: usize,
    load: usize,
    blocks: usize,
    words_per_block: usize,
) -> usize {
    let lane = r % PANEL;
    (block_index(r, 8 * s, blocks) - lane) * words_per_block + (load * PANEL + lane) * 4
}

/// Weights in a [`Q4Superblock`] (a GGUF Q4_K block): 8 blocks of 32.
pub const SUPERBLOCK: usize = 256;

/// 256 weights as a GGUF Q4_K block holds them, its bytes decoded: 8 blocks of 32, block `j`
/// with a 6-bit scale and minimum on the superblock's two f32 steps,
/// `w[32 j + l] = (scale · scales[j]) · quants[32 j + l] − min_scale · mins[j]`
/// (the products in brackets exact in f32 for a checkpoint's f16 steps and 6-bit bytes).
/// [`PackedMatrix::pack_q4_superblocks`] keeps them as they are.
#[derive(Debug, Clone, PartialEq)]
pub struct Q4Superblock {
    pub scale: f32,
    pub min_scale: f32,
    pub scales: [u8; 8],
    pub mins: [u8; 8],
    /// One quant a weight, in order, each below 16.
    pub quants: [u8; SUPERBLOCK],
}

impl Q4Superblock {
    /// The 256 weights, evaluated as GGUF's dequantization evaluates them.
    pub fn dequantize(&self) -> [f32; SUPERBLOCK] {
        std::array::from_fn(|e| {
            let j = e / BLOCK;
            let step = self.scale * f32::from(self.scales[j]);
            let min = self.min_scale * f32::from(self.mins[j]);
            step * f32::from(self.quants[e]) - min
        })
    }
}

/// 256 weights as a GGUF Q6_K block holds them, its bytes decoded: 16 sub-blocks of 16, each
/// with a signed 8-bit scale on the superblock's f32 step,
/// `w[e] = (scale · scales[e / 16]) · (quants[e] − 32)`.
/// [`PackedMatrix::pack_q6_superblocks`] keeps them as they are.
#[derive(Debug, Clone, PartialEq)]
pub struct Q6Superblock {
    pub scale: f32,
    pub scales: [i8; 16],
    /// One quant a weight, in order, each below 64.
    pub quants: [u8; SUPERBLOCK],
}

impl Q6Superblock {
    /// The 256 weights, evaluated as GGUF's dequantization evaluates them.
    pub fn dequantize(&self) -> [f32; SUPERBLOCK] {
        std::array::from_fn(|e| {
            let step = self.scale * f32::from(self.scales[e / 16]);
            step * f32::from(self.quants[e] as i8 - 32)
        })
    }
}

impl PackedMatrix {
    /// Packs `[rows, cols]` weights given as Q4_K superblocks (`cols / 256` a row, row after
    /// row). In a format that [keeps superblocks](WeightFormat::keeps_superblocks) they are kept
    /// as they are (see [`Q4Superblock`]; the matrix reports `Q4A8`); another `format` packs
    /// their f32 values as [`PackedMatrix::pack`] does.
    pub fn pack_q4_superblocks(
        superblocks: &[Q4Superblock],
        rows: usize,
        cols: usize,
        format: WeightFormat,
    ) -> Result<Self, KernelError> {
        let per_row = superblocks_a_row(superblocks.len(), rows, cols)?;
        if let Some(i) = superblocks.iter().position(|s| {
            !s.scale.is_finite() || !s.min_scale.is_finite() || s.quants.iter().any(|&q| q > 15)
        }) {
            return Err(KernelError::Superblocks(format!(
                "superblock {i} (row {}) has a step that is not finite or a quant above 15",
                i / per_row.max(1)
            )));
        }
        if !format.keeps_superblocks() {
            let weights: Vec<f32> = superblocks.iter().flat_map(|s| s.dequantize()).collect();
            return Self::pack(&weights, rows, cols, format);
        }
        let blocks = cols / BLOCK;
        let panel_rows = rows_in_panels(rows);
        let mut quants = vec![0u64; panel_rows * blocks * BLOCK / 16];
        let mut scales = vec![0u64; panel_rows * per_row];
        let mut steps = vec![0.0f32; panel_rows * per_row];
        let mut mins = vec![0u64; panel_rows * per_row];
        let mut neg_min_steps = vec![0.0f32; panel_rows * per_row];
        for (i, sb) in superblocks.iter().enumerate() {
            let (r, s) = (i / per_row, i % per_row);
            steps[block_index(r, s, per_row)] = sb.scale;
            scales[block_index(r, s, per_row)] = u64::from_le_bytes(sb.scales);
            mins[i] = u64::from_le_bytes(sb.mins);
            neg_min_steps[i] = -sb.min_scale;
            place_loads(&mut quants, r, s, blocks, 2, &grouped_nibbles(&sb.quants));
        }
        Ok(Self {
            rows,
            cols,
            padded_cols: cols,
            // Kept as they are, the blocks are exact whatever rounding the format allows.
            format: WeightFormat::Q4A8,
            storage: Storage::Q4K {
                quants,
                scales,
                steps,
                mins,
                neg_min_steps,
            },
        })
    }

    /// Packs `[rows, cols]` weights given as Q6_K superblocks (`cols / 256` a row, row after
    /// row). In a format that [keeps superblocks](WeightFormat::keeps_superblocks) they are kept
    /// as they are (see [`Q6Superblock`]; the matrix reports `Q4A8`, the checkpoint's blocks
    /// kept with activations rounded to int8);
    /// another `format` packs their f32 values as [`PackedMatrix::pack`] does.
    pub fn pack_q6_superblocks(
        superblocks: &[Q6Superblock],
        rows: usize,
        cols: usize,
        format: WeightFormat,
    ) -> Result<Self, KernelError> {
        let per_row = superblocks_a_row(superblocks.len(), rows, cols)?;
        if let Some(i) = superblocks
            .iter()
            .position(|s| !s.scale.is_finite() || s.quants.iter().any(|&q| q > 63))
        {
            return Err(KernelError::Superblocks(format!(
                "superblock {i} (row {}) has a step that is not finite or a quant above 63",
                i / per_row.max(1)
            )));
        }
        if !format.keeps_superblocks() {
            let weights: Vec<f32> = superblocks.iter().flat_map(|s| s.dequantize()).collect();
            return Self::pack(&weights, rows, cols, format);
        }
        let blocks = cols / BLOCK;
        let panel_rows = rows_in_panels(rows);
        let mut lows = vec![0u64; panel_rows * blocks * 2];
        let mut highs = vec![0u64; panel_rows * blocks];
        let mut scales = vec![[0u64; 2]; panel_rows * per_row];
        let mut steps = vec![0.0f32; panel_rows * per_row];
        for (i, sb) in superblocks.iter().enumerate() {
            let (r, s) = (i / per_row, i % per_row);
            let at_s = block_index(r, s, per_row);
            steps[at_s] = sb.scale;
            let even: [u8; 8] = std::array::from_fn(|j| sb.scales[2 * j] as u8);
            let odd: [u8; 8] = std::array::from_fn(|j| sb.scales[2 * j + 1] as u8);
            scales[at_s] = [u64::from_le_bytes(even), u64::from_le_bytes(odd)];
            place_loads(&mut lows, r, s, blocks, 2, &grouped_nibbles(&sb.quants));
            let mut bytes = [0u8; 64];
            for (j, q) in sb.quants.chunks_exact(BLOCK).enumerate() {
                for (k, &q) in q.iter().enumerate() {
                    let (load, byte, shift) = high_place(j, k);
                    bytes[32 * load + byte] |= (q >> 4) << shift;
                }
            }
            place_loads(&mut highs, r, s, blocks, 1, &bytes);
        }
        Ok(Self {
            rows,
            cols,
            padded_cols: cols,
            format: WeightFormat::Q4A8,
            storage: Storage::Q6K {
                lows,
                highs,
                scales,
                steps,
            },
        })
    }
}

/// A superblock's 256 quants (their low 4 bits) as its 4 grouped loads of nibbles
/// ([`nibble_place`]).
fn grouped_nibbles(quants: &[u8; SUPERBLOCK]) -> [u8; 128] {
    let mut bytes = [0u8; 128];
    for (j, q) in quants.chunks_exact(BLOCK).enumerate() {
        for (k, &q) in q.iter().enumerate() {
            let (load, byte, high) = nibble_place(j, k);
            bytes[32 * load + byte] |= (q & 0xF) << if high { 4 } else { 0 };
        }
    }
    bytes
}

/// Writes `bytes`, a row's superblock `s` as 32-byte loads in order, to their places
/// ([`superblock_load`]).
fn place_loads(
    out: &mut [u64],
    r: usize,
    s: usize,
    blocks: usize,
    words_per_block: usize,
    bytes: &[u8],
) {
    for (load, chunk) in bytes.chunks_exact(32).enumerate() {
        let at = superblock_load(r, s, load, blocks, words_per_block);
        for (word, eight) in out[at..at + 4].iter_mut().zip(chunk.chunks_exact(8)) {
            *word = u64::from_le_bytes(std::array::from_fn(|l| eight[l]));
        }
    }
}

/// Superblocks a row of a `[rows, cols]` matrix given as `count` superblocks, or why they do
/// not make one.
fn superblocks_a_row(count: usize, rows: usize, cols: usize) -> Result<usize, KernelError> {
    let per_row = cols / SUPERBLOCK;
    if !cols.is_multiple_of(SUPERBLOCK) || count != rows * per_row {
        return Err(KernelError::Superblocks(format!(
            "{count} superblocks for a {rows}×{cols} matrix (rows must be whole superblocks of \
             {SUPERBLOCK})"
        )));
    }
    Ok(per_row)
}
