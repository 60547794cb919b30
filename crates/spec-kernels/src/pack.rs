//! Weight packing and the product's driver (shape checks, padding, splitting over threads).

use std::ops::Range;
use std::str::FromStr;
use std::sync::Mutex;

use half::bf16;

use crate::activations::{Interleave, QuantizedRows};
use crate::error::KernelError;
use crate::team::Team;
use crate::{Exec, Isa, avx2, scalar, tiles};

/// Every packed row is padded with zeros to a multiple of this many columns (the Q8_0 block).
pub const BLOCK: usize = 32;

/// Rows are stored in panels of this many, block by block: block `b` of rows `2p..2p + 2` lie
/// next to each other, so a tile of whole panels reads one sequential stream (the hardware
/// prefetcher follows it) instead of one short stream per row.
pub(crate) const PANEL: usize = 2;

/// Rows stored for `rows` rows: whole panels, the last completed by a zero row.
pub(crate) fn rows_in_panels(rows: usize) -> usize {
    rows.div_ceil(PANEL) * PANEL
}

/// In a matrix for [`PackedMatrix::matmul_swiglu_with`], gate rows and up rows alternate in runs
/// of this many ([`swiglu_row_order`]).
pub const SWIGLU_RUN: usize = 16;

/// The row order of a gate/up matrix for [`PackedMatrix::matmul_swiglu_with`]: its row `p` is
/// row `order[p]` of `[gate; up]` (`2 · ff` rows), runs of [`SWIGLU_RUN`] gate rows each
/// followed by the same features' up rows. So a thread's block of outputs holds both halves of
/// its features, and the thread applies SwiGLU to them itself, handing on `ff` values a row of
/// `x` instead of `2 · ff`. `None` when `ff` is not a positive multiple of the run.
pub fn swiglu_row_order(ff: usize) -> Option<Vec<usize>> {
    if ff == 0 || !ff.is_multiple_of(SWIGLU_RUN) {
        return None;
    }
    Some(
        (0..ff)
            .step_by(SWIGLU_RUN)
            .flat_map(|f| (f..f + SWIGLU_RUN).chain(ff + f..ff + f + SWIGLU_RUN))
            .collect(),
    )
}

/// Where a product's outputs go.
enum Sink<'a> {
    /// `y[m, rows]`.
    Rows(&'a mut [f32]),
    /// `act[m, rows / 2]`: `silu(gate) · up` of the rows in [`swiglu_row_order`].
    Swiglu(&'a mut [f32]),
}

/// SwiGLU of one row of `x`'s outputs `pairs` (runs in [`swiglu_row_order`]) into `out`.
fn swiglu_runs(pairs: &[f32], out: &mut [f32], simd: bool) {
    for (pair, out) in pairs
        .chunks_exact(2 * SWIGLU_RUN)
        .zip(out.chunks_exact_mut(SWIGLU_RUN))
    {
        let (gate, up) = pair.split_at(SWIGLU_RUN);
        crate::ops::silu_mul(gate, up, out, simd);
    }
}

/// Where block `b` of row `r` is stored, in blocks from the start (`blocks` a row).
#[inline(always)]
pub(crate) fn block_index(r: usize, b: usize, blocks: usize) -> usize {
    ((r / PANEL) * blocks + b) * PANEL + r % PANEL
}

/// Rows of an f32 matrix stored together span by span ([`span_width`]).
pub(crate) const SPAN_GROUP: usize = 16;

/// Blocks of a row (of `blocks`) in one span of an f32 matrix: the whole row up to 32 blocks
/// (1024 inputs), else spans of at most 16 (2 KB of a row of `x`). Over several rows of `x` a
/// tile reads every row of `x` once per panel; where 8 of them (48 KB for the 1.5B's 1536
/// inputs, 280 KB for its `down`'s 8960) no longer fit L1 beside the panel, they came from L2
/// for every panel, and that traffic shared L1's fills with the weights streamed from memory.
/// In spans, [`SPAN_GROUP`] rows take one span of `x` (16 KB at 8 rows) in turn, so it stays
/// in L1 for the group's 8 panels. Rows of up to 32 blocks stay whole: the 0.5B's 896 inputs
/// in 2 spans of 14 blocks took 0.99-1.27 of the time of whole rows at one row of `x` (pairs
/// of runs, Zen 3, twenty-fifth session), where the pieces' own cost is not hidden.
pub(crate) fn span_width(blocks: usize) -> usize {
    if blocks <= 32 {
        blocks.max(1)
    } else {
        blocks.div_ceil(blocks.div_ceil(16))
    }
}

/// Where block `b` of row `r` of an f32 matrix is stored, in blocks from the start (`blocks` a
/// row, `panel_rows` rows with the padding row): rows in groups of [`SPAN_GROUP`], each group
/// span by span, each span panel by panel as [`block_index`] within it. With one span a row
/// this is [`block_index`].
#[inline(always)]
pub(crate) fn spanned_block_index(r: usize, b: usize, blocks: usize, panel_rows: usize) -> usize {
    let width = span_width(blocks);
    let first = r / SPAN_GROUP * SPAN_GROUP;
    let group_rows = SPAN_GROUP.min(panel_rows - first);
    let start = b / width * width;
    let span = width.min(blocks - start);
    first * blocks
        + group_rows * start
        + ((r - first) / PANEL * span + (b - start)) * PANEL
        + r % PANEL
}

/// Writes row `r`'s `blocks` units of `unit` values (`row`, in order) to their places in the
/// panel-ordered `out`.
fn place_row<T: Copy>(out: &mut [T], r: usize, row: &[T], blocks: usize, unit: usize) {
    place_blocks(out, row, blocks, unit, |b| block_index(r, b, blocks));
}

/// Writes a row's `blocks` units of `unit` values (`row`, in order) to `out`, unit `b` at
/// `index(b)` units from the start.
fn place_blocks<T: Copy>(
    out: &mut [T],
    row: &[T],
    blocks: usize,
    unit: usize,
    index: impl Fn(usize) -> usize,
) {
    for (b, values) in row.chunks_exact(unit).enumerate().take(blocks) {
        let at = index(b) * unit;
        out[at..at + unit].copy_from_slice(values);
    }
}

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

/// Where quant `k` of block `j` of a superblock (either format) lies in the superblock's
/// grouped nibbles ([`Storage::Q4K`], [`Storage::Q6K`]'s `lows`): `(load, byte, high)`, the
/// 32-byte load of the row's superblock, the byte in it and whether the high nibble. As for
/// [`grouped_byte`], unit `t` holds quants `4 t .. 4 t + 4` of each of the 8 blocks (byte
/// `4 j + k % 4`): load `u` holds unit `2 u` in its low nibbles and `2 u + 1` in its high ones.
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

/// Zeros after a Q4 matrix's minimums, so that any row's minimums can be read in whole vectors
/// of 8 (see [`Storage::Q4A8`]).
pub(crate) const MINS_TAIL: usize = 8;

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

/// Below this many stored weights a product runs on the calling thread: splitting costs more
/// than it saves.
const PARALLEL_MIN_WEIGHTS: usize = 1 << 16;
/// From this many weights a product is split into several blocks per thread.
const LARGE_PRODUCT_WEIGHTS: usize = 1 << 22;

/// How weights are stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum WeightFormat {
    /// 4 bytes a weight, exact.
    #[default]
    F32,
    /// 2 bytes a weight; bf16 rounding (8 significant bits).
    Bf16,
    /// 1.125 bytes a weight: blocks of 32 int8 quants with one f32 scale (`max |w| / 127`).
    Q8_0,
    /// 0.75 bytes a weight: blocks of 32 unsigned 4-bit quants with an f32 scale and minimum,
    /// `w = scale · q + min`, for weights that are 4-bit already (a GGUF's Q4_0, Q4_1 or Q4_K
    /// blocks): each block's values must lie on 16 or fewer evenly spaced levels, which are
    /// kept exactly (to f32 rounding). Nothing is rounded to 4 bits: a matrix with any block
    /// off such a grid is stored as [`WeightFormat::Q8_0`] instead ([`PackedMatrix::format`]
    /// says which).
    Q4,
    /// [`WeightFormat::Q8_0`] weights multiplied by activations rounded to int8 too (each
    /// block of 32 inputs of a row of `x` to `max |x| / 127` steps), with integer
    /// multiply-adds, as llama.cpp computes: less work a weight than widening to f32, but the
    /// result is no longer the f32 product with the stored weights (`x` is rounded, to about
    /// 0.4% of its block's largest value). A different, faster model; never chosen by default.
    Q8_0A8,
    /// [`WeightFormat::Q4`] weights with activations rounded to int8 (as for
    /// [`WeightFormat::Q8_0A8`]; a matrix Q4 cannot hold exactly is stored as `Q8_0A8`). A
    /// GGUF's Q4_K and Q6_K matrices can also be kept as their superblocks in this format
    /// ([`PackedMatrix::pack_q4_superblocks`], [`PackedMatrix::pack_q6_superblocks`]), with
    /// activations rounded one step a superblock of 256 (llama.cpp's Q8_K).
    Q4A8,
    /// [`WeightFormat::Q4A8`] with every block that is not 4-bit already *rounded* to 16
    /// evenly spaced levels from its smallest to its largest weight (`scale = (max − min) /
    /// 15`, each weight to the nearest level), so no matrix falls back to Q8_0: 0.75 bytes a
    /// weight where a 5- or 8-bit checkpoint's blocks took 1.125. Lossy — a weight moves by up
    /// to half a step — and never chosen by default: meant for a draft model, whose weights
    /// decide how many of its tokens the target accepts, never which tokens are produced.
    /// Blocks already on such a grid and superblocks kept as they are stay exact.
    Q4A8Lossy,
}

impl WeightFormat {
    /// Every format, in declaration order.
    pub const ALL: [Self; 7] = [
        Self::F32,
        Self::Bf16,
        Self::Q8_0,
        Self::Q4,
        Self::Q8_0A8,
        Self::Q4A8,
        Self::Q4A8Lossy,
    ];

    /// Bytes stored per weight, scales included.
    pub fn bytes_per_weight(self) -> f64 {
        match self {
            Self::F32 => 4.0,
            Self::Bf16 => 2.0,
            Self::Q8_0 | Self::Q8_0A8 => 1.0 + 4.0 / BLOCK as f64,
            Self::Q4 | Self::Q4A8 | Self::Q4A8Lossy => 0.5 + 8.0 / BLOCK as f64,
        }
    }

    /// Whether products round the activations to int8 ([`WeightFormat::Q8_0A8`],
    /// [`WeightFormat::Q4A8`], [`WeightFormat::Q4A8Lossy`]).
    pub fn rounds_activations(self) -> bool {
        matches!(self, Self::Q8_0A8 | Self::Q4A8 | Self::Q4A8Lossy)
    }

    /// Whether [`PackedMatrix::pack_q4_superblocks`] and [`PackedMatrix::pack_q6_superblocks`]
    /// keep a GGUF's Q4_K and Q6_K superblocks as they are in this format.
    pub fn keeps_superblocks(self) -> bool {
        matches!(self, Self::Q4A8 | Self::Q4A8Lossy)
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::F32 => "f32",
            Self::Bf16 => "bf16",
            Self::Q8_0 => "q8_0",
            Self::Q4 => "q4",
            Self::Q8_0A8 => "q8_0-a8",
            Self::Q4A8 => "q4-a8",
            Self::Q4A8Lossy => "q4-a8-lossy",
        }
    }
}

impl std::fmt::Display for WeightFormat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for WeightFormat {
    type Err = KernelError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "f32" => Ok(Self::F32),
            "bf16" => Ok(Self::Bf16),
            "q8_0" | "q8" => Ok(Self::Q8_0),
            "q4" => Ok(Self::Q4),
            "q8_0-a8" | "q8-a8" => Ok(Self::Q8_0A8),
            "q4-a8" => Ok(Self::Q4A8),
            "q4-a8-lossy" => Ok(Self::Q4A8Lossy),
            _ => Err(KernelError::UnknownFormat(s.to_owned())),
        }
    }
}

/// The stored weights: `padded_cols` columns a row, rows in panels (see [`PANEL`]).
#[derive(Debug, Clone)]
pub(crate) enum Storage {
    F32(Vec<f32>),
    /// `padded_cols / 2` words a row (see the crate docs for the order).
    Bf16(Vec<u32>),
    /// `padded_cols / 8` words and `padded_cols / 32` scales a row.
    Q8_0 {
        quants: Vec<u64>,
        scales: Vec<f32>,
    },
    /// [`WeightFormat::Q8_0A8`]: Q8_0's quants and scales, but in each run of [`GROUP`] blocks
    /// of a row a 32-byte unit holds 4 quants of each of the 8 blocks ([`grouped_byte`]) and
    /// the row's 8 scales lie together ([`grouped_scale_index`]), so that one integer
    /// multiply-add of 4 bytes a lane sums 8 blocks at once, each in its own lane, and a
    /// group's sums are scaled into f32 with one multiply-add instead of one a block. Quants
    /// are stored plus 128, as unsigned bytes (`q ^ 0x80`), which `vpdpbusd` multiplies by the
    /// signed `x` directly (see `QuantizedRows::group_offsets`).
    Q8_0Groups {
        quants: Vec<u64>,
        scales: Vec<f32>,
    },
    /// `padded_cols / 16` words and `padded_cols / 32` `[scale, min]` pairs a row; byte `l` of
    /// word `h` of a block holds weight `8 h + l` in its low nibble and `16 + 8 h + l` in its
    /// high one, so a zero-extending load of a word gives two vectors of 8 consecutive weights
    /// with a mask and a shift.
    Q4 {
        quants: Vec<u64>,
        params: Vec<[f32; 2]>,
    },
    /// [`WeightFormat::Q4A8`]: the quants as for `Q4`, the scales in the panels, and the blocks'
    /// minimums apart, row after row (`mins[r · blocks + b]`), followed by [`MINS_TAIL`] zeros:
    /// with activations rounded to int8 a row's minimums enter its product once, against the
    /// blocks' sums of `x`, 8 blocks a vector (a row's last vector may run into the next row or
    /// the tail, where the sums are zero).
    Q4A8 {
        quants: Vec<u64>,
        scales: Vec<f32>,
        mins: Vec<f32>,
    },
    /// [`WeightFormat::Q4A8`] from [`Q4Superblock`]s, kept as they are (0.59 bytes a weight
    /// instead of 0.75): the quants in grouped nibbles, a superblock's 8 blocks as 4 loads of
    /// 32 bytes a row ([`nibble_place`], [`superblock_load`]), so that one integer
    /// multiply-add sums 4 weights of each of the 8 blocks into the block's own lane, as for
    /// [`Storage::Q8_0Groups`]; in the panels (superblocks for blocks) each
    /// superblock's 8 six-bit scales as one little-endian word (`scales`) and its step
    /// (`steps`); apart, row after row, each superblock's 8 minimums as one word
    /// (`mins[r · superblocks + s]`) and its negated minimum step (`neg_min_steps`).
    Q4K {
        quants: Vec<u64>,
        scales: Vec<u64>,
        steps: Vec<f32>,
        mins: Vec<u64>,
        neg_min_steps: Vec<f32>,
    },
    /// [`WeightFormat::Q4A8`] from [`Q6Superblock`]s, kept as they are (0.83 bytes a weight
    /// instead of Q8_0's 1.125), all in the panels: the low 4 bits of the quants in grouped
    /// nibbles as for `Q4K` (`lows`), their high 2 bits in 2 loads of 32 bytes a superblock
    /// and row (`highs`, [`high_place`]: load `v` holds units `4 v .. 4 v + 4`), and
    /// each superblock's 16 scales (the even sub-blocks' first, then the odd ones', as two
    /// words) and its step.
    Q6K {
        lows: Vec<u64>,
        highs: Vec<u64>,
        scales: Vec<[u64; 2]>,
        steps: Vec<f32>,
    },
}

impl Storage {
    /// What the SIMD products read of `x` rounded besides its blocks: for blocks stored in
    /// groups of [`GROUP`] whose units hold 4 quants of each (`Q4K`, `Q6K`, `Q8_0Groups`), `x`
    /// interleaved alike, and for `Q8_0Groups`, whose quants are stored plus 128, the groups'
    /// offsets too.
    pub(crate) fn interleave(&self) -> Interleave {
        match self {
            Self::Q8_0Groups { .. } => Interleave::BiasedGroups,
            Self::Q4K { .. } | Self::Q6K { .. } => Interleave::Groups,
            _ => Interleave::No,
        }
    }
}

/// A weight matrix `W [rows, cols]` (`rows` outputs of `cols` inputs) packed for
/// [`PackedMatrix::matmul_into`].
#[derive(Debug, Clone)]
pub struct PackedMatrix {
    rows: usize,
    cols: usize,
    padded_cols: usize,
    format: WeightFormat,
    pub(crate) storage: Storage,
}

impl PackedMatrix {
    /// Packs the row-major `weights` `[rows, cols]` in `format`.
    pub fn pack(
        weights: &[f32],
        rows: usize,
        cols: usize,
        format: WeightFormat,
    ) -> Result<Self, KernelError> {
        let expected = rows * cols;
        if weights.len() != expected {
            return Err(KernelError::WeightLength {
                rows,
                cols,
                expected,
                found: weights.len(),
            });
        }
        if let Some(i) = weights.iter().position(|w| !w.is_finite()) {
            return Err(KernelError::NonFinite {
                row: i / cols.max(1),
                col: i % cols.max(1),
                value: weights[i],
            });
        }
        let padded_cols = cols.div_ceil(BLOCK) * BLOCK;
        let blocks = padded_cols / BLOCK;
        let panel_rows = rows_in_panels(rows);
        // One padded row at a time, so every format sees whole blocks; each encoded row goes
        // straight to its places in the panels.
        let mut row = vec![0.0f32; padded_cols];
        let mut padded_row = move |r: usize| -> Vec<f32> {
            row[..cols].copy_from_slice(&weights[r * cols..(r + 1) * cols]);
            row.clone()
        };
        let storage = match format {
            WeightFormat::Q4 | WeightFormat::Q4A8 | WeightFormat::Q4A8Lossy => {
                let apart = format != WeightFormat::Q4;
                let round = format == WeightFormat::Q4A8Lossy;
                match pack_q4(
                    &mut padded_row,
                    rows,
                    cols,
                    blocks,
                    panel_rows,
                    apart,
                    round,
                ) {
                    Some(storage) => storage,
                    None => {
                        let instead = if format == WeightFormat::Q4 {
                            WeightFormat::Q8_0
                        } else {
                            WeightFormat::Q8_0A8
                        };
                        return Self::pack(weights, rows, cols, instead);
                    }
                }
            }
            WeightFormat::F32 => {
                let mut out = vec![0.0f32; panel_rows * padded_cols];
                for r in 0..rows {
                    place_blocks(&mut out, &padded_row(r), blocks, BLOCK, |b| {
                        spanned_block_index(r, b, blocks, panel_rows)
                    });
                }
                Storage::F32(out)
            }
            WeightFormat::Bf16 => {
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
            WeightFormat::Q8_0A8 => {
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
            WeightFormat::Q8_0 => {
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
        };
        Ok(Self {
            rows,
            cols,
            padded_cols,
            format,
            storage,
        })
    }

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

    /// Output features (`n`).
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Input features (`k`).
    pub fn cols(&self) -> usize {
        self.cols
    }

    pub fn format(&self) -> WeightFormat {
        self.format
    }

    pub(crate) fn padded_cols(&self) -> usize {
        self.padded_cols
    }

    /// Rows stored, with the zero row that completes the last panel.
    pub(crate) fn panel_rows(&self) -> usize {
        rows_in_panels(self.rows)
    }

    /// Whether the rows are stored in spans of their columns ([`span_width`]): f32 rows
    /// longer than one span.
    pub(crate) fn spanned(&self) -> bool {
        let blocks = self.padded_cols / BLOCK;
        matches!(self.storage, Storage::F32(_)) && span_width(blocks) < blocks
    }

    /// Bytes of packed weights a product streams (padding and scales included; not the few
    /// zeros after a Q4 matrix's minimums).
    pub fn stored_bytes(&self) -> usize {
        match &self.storage {
            Storage::F32(w) => w.len() * 4,
            Storage::Bf16(w) => w.len() * 4,
            Storage::Q8_0 { quants, scales } | Storage::Q8_0Groups { quants, scales } => {
                quants.len() * 8 + scales.len() * 4
            }
            Storage::Q4 { quants, params } => quants.len() * 8 + params.len() * 8,
            Storage::Q4A8 {
                quants,
                scales,
                mins,
            } => quants.len() * 8 + (scales.len() + mins.len() - MINS_TAIL) * 4,
            Storage::Q4K {
                quants,
                scales,
                steps,
                mins,
                neg_min_steps,
            } => {
                quants.len() * 8
                    + scales.len() * 8
                    + steps.len() * 4
                    + mins.len() * 8
                    + neg_min_steps.len() * 4
            }
            Storage::Q6K {
                lows,
                highs,
                scales,
                steps,
            } => lows.len() * 8 + highs.len() * 8 + scales.len() * 16 + steps.len() * 4,
        }
    }

    /// The weights the kernel multiplies by, `[rows, cols]` row-major: the input rounded to the
    /// stored format.
    pub fn dequantize(&self) -> Vec<f32> {
        let mut out = Vec::with_capacity(self.rows * self.cols);
        let mut row = vec![0.0f32; self.padded_cols];
        for r in 0..self.rows {
            scalar::dequantize_row(self, r, &mut row);
            out.extend_from_slice(&row[..self.cols]);
        }
        out
    }

    /// How many blocks of 32 inputs share one int8 step when the format rounds activations:
    /// a superblock's 8 for Q4_K and Q6_K superblocks kept as they are, otherwise 1.
    fn activation_group(&self) -> usize {
        match self.storage {
            Storage::Q4K { .. } | Storage::Q6K { .. } => SUPERBLOCK / BLOCK,
            _ => 1,
        }
    }

    /// The inputs a product multiplies for `x` `[m, cols]`: `x` itself, or for the formats that
    /// round activations ([`WeightFormat::rounds_activations`]) `x` rounded to int8 blocks.
    pub fn rounded_input(&self, x: &[f32], m: usize) -> Vec<f32> {
        let (k, kp) = (self.cols, self.padded_cols);
        if !self.format.rounds_activations() || x.len() != m * k {
            return x.to_vec();
        }
        let mut padded = vec![0.0f32; m * kp];
        for (dst, src) in padded.chunks_exact_mut(kp).zip(x.chunks_exact(k.max(1))) {
            dst[..k].copy_from_slice(src);
        }
        let rounded =
            QuantizedRows::new(&padded, kp, self.activation_group(), Interleave::No).dequantize();
        rounded
            .chunks_exact(kp)
            .flat_map(|row| row[..k].iter().copied())
            .collect()
    }

    /// `y[m, rows] = x[m, cols] · Wᵀ` with the default [`Exec`] (SIMD where available, threads).
    pub fn matmul_into(&self, x: &[f32], m: usize, y: &mut [f32]) -> Result<(), KernelError> {
        self.matmul_with(x, m, y, Exec::default())
    }

    /// `x[m, cols] · Wᵀ` into a new `[m, rows]` vector.
    pub fn matmul(&self, x: &[f32], m: usize) -> Result<Vec<f32>, KernelError> {
        let mut y = vec![0.0; m * self.rows];
        self.matmul_into(x, m, &mut y)?;
        Ok(y)
    }

    /// `y[m, rows] = x[m, cols] · Wᵀ`, both row-major, executed as `exec` says. Meant for
    /// `m ≤ 16`; any `m` is correct.
    pub fn matmul_with(
        &self,
        x: &[f32],
        m: usize,
        y: &mut [f32],
        exec: Exec,
    ) -> Result<(), KernelError> {
        self.product(x, m, Sink::Rows(y), exec)
    }

    /// `act[m, rows / 2] = silu(gate) · up` where `gate` and `up` are the rows of
    /// `x[m, cols] · Wᵀ` in [`swiglu_row_order`] (the matrix packed in that order), with the
    /// default [`Exec`]. Each thread applies SwiGLU to its own block of outputs; the values are
    /// the same bits as [`crate::swiglu`] of the product of `[gate; up]` stacked.
    pub fn matmul_swiglu_into(
        &self,
        x: &[f32],
        m: usize,
        act: &mut [f32],
    ) -> Result<(), KernelError> {
        self.matmul_swiglu_with(x, m, act, Exec::default())
    }

    /// [`PackedMatrix::matmul_swiglu_into`] executed as `exec` says.
    pub fn matmul_swiglu_with(
        &self,
        x: &[f32],
        m: usize,
        act: &mut [f32],
        exec: Exec,
    ) -> Result<(), KernelError> {
        let n = self.rows;
        if n == 0 || !n.is_multiple_of(2 * SWIGLU_RUN) {
            return Err(KernelError::SwigluRows(n));
        }
        self.product(x, m, Sink::Swiglu(act), exec)
    }

    /// Checks `x` and `sink`'s length, then runs the product into `sink`.
    fn product(&self, x: &[f32], m: usize, sink: Sink<'_>, exec: Exec) -> Result<(), KernelError> {
        let (n, k, kp) = (self.rows, self.cols, self.padded_cols);
        let (cols, found) = match &sink {
            Sink::Rows(y) => (n, y.len()),
            Sink::Swiglu(act) => (n / 2, act.len()),
        };
        if found != m * cols {
            return Err(KernelError::OutputLength {
                rows: m,
                cols,
                expected: m * cols,
                found,
            });
        }
        if x.len() != m * k {
            return Err(KernelError::InputLength {
                rows: m,
                cols: k,
                expected: m * k,
                found: x.len(),
            });
        }
        if m == 0 || n == 0 {
            return Ok(());
        }
        // The kernels read whole blocks of x; pad only when the model's width needs it.
        let padded;
        let xs: &[f32] = if kp == k {
            x
        } else {
            let mut p = vec![0.0f32; m * kp];
            for (dst, src) in p.chunks_exact_mut(kp).zip(x.chunks_exact(k.max(1))) {
                dst[..k].copy_from_slice(src);
            }
            padded = p;
            &padded
        };
        // The *A8 formats multiply x rounded to int8; the portable loop multiplies the same
        // rounded values as f32.
        let simd = exec.isa != Isa::Scalar && avx2::available();
        let interleave = if simd {
            self.storage.interleave()
        } else {
            Interleave::No
        };
        let int8 = self
            .format
            .rounds_activations()
            .then(|| QuantizedRows::new(xs, kp, self.activation_group(), interleave));
        // `Isa::Avx2` keeps the 16-register build; the kernel decides where AVX-512 pays.
        let avx512 = exec.isa == Isa::Auto;
        // The SIMD path reads `int8` itself; only the portable loop needs the rounded f32 copy.
        let rounded = int8
            .as_ref()
            .filter(|_| !simd)
            .map(QuantizedRows::dequantize);
        let xs = rounded.as_deref().unwrap_or(xs);
        let shape = tiles::Shape {
            rows: n,
            cols: kp,
            m,
            parallel: exec.parallel,
        };
        let (span_tile, timing) = tiles::choose(shape, exec.span_tile, || {
            simd && avx2::span_tiles_apply(self, avx512)
        });
        let run = |rows: Range<usize>, outs: &mut [&mut [f32]]| {
            if simd {
                avx2::run(self, rows, xs, int8.as_ref(), m, outs, avx512, span_tile);
            } else {
                scalar::run(self, rows, xs, m, outs);
            }
        };
        self.run_split(exec, m, sink, run);
        if let Some(timing) = timing {
            timing.finish();
        }
        Ok(())
    }

    /// Runs `run` over the output rows, split over the kernels' threads where `exec` allows
    /// and the product is large enough to pay, into `sink`. For [`Sink::Swiglu`] each block
    /// holds whole runs of pairs, runs into a buffer of its own thread and hands on only its
    /// SwiGLU values.
    fn run_split(
        &self,
        exec: Exec,
        m: usize,
        sink: Sink<'_>,
        run: impl Fn(Range<usize>, &mut [&mut [f32]]) + Sync,
    ) {
        let (n, kp) = (self.rows, self.padded_cols);
        let simd = exec.isa != Isa::Scalar && avx2::available();
        let (dest, swiglu) = match sink {
            Sink::Rows(y) => (y, false),
            Sink::Swiglu(act) => (act, true),
        };
        // Outputs of `rows` rows of the matrix, and the values they hand on.
        let handed = |rows: usize| if swiglu { rows / 2 } else { rows };
        // Runs `rows` into `outs` (`handed(rows.len())` values of each row of `x`).
        let block = |rows: Range<usize>, outs: &mut [&mut [f32]]| {
            if !swiglu {
                run(rows, outs);
                return;
            }
            let len = rows.len();
            let mut local = vec![0.0f32; m * len];
            let mut parts: Vec<&mut [f32]> = local.chunks_exact_mut(len).collect();
            run(rows, &mut parts);
            for (pairs, out) in local.chunks_exact(len).zip(outs.iter_mut()) {
                swiglu_runs(pairs, out, simd);
            }
        };

        let team = (exec.parallel && n * kp >= PARALLEL_MIN_WEIGHTS).then(Team::get);
        let threads = team.map_or(1, Team::threads);
        let blocks = if threads <= 1 {
            1
        } else {
            // Large products: a few blocks per thread balance a machine shared with other work.
            // Small ones: one block per thread, as each block costs a hand-off.
            let per_thread = if n * kp < LARGE_PRODUCT_WEIGHTS { 1 } else { 4 };
            (threads * per_thread).min(n.div_ceil(16)).max(1)
        };
        let Some(team) = team.filter(|_| blocks > 1) else {
            let mut outs: Vec<&mut [f32]> = dest.chunks_exact_mut(handed(n)).collect();
            block(0..n, &mut outs);
            return;
        };
        // A thread's rows start at a group of spans (see `span_width`), and SwiGLU's at a run
        // of pairs (a multiple of the span group).
        let align = if swiglu {
            2 * SWIGLU_RUN
        } else if self.spanned() {
            SPAN_GROUP
        } else {
            4
        };
        let block_rows = n.div_ceil(blocks).div_ceil(align) * align;
        let blocks = n.div_ceil(block_rows);
        // outs[b][i] is row i of the destination restricted to the values of block b.
        let mut outs: Vec<Vec<&mut [f32]>> = (0..blocks).map(|_| Vec::with_capacity(m)).collect();
        for dest_row in dest.chunks_exact_mut(handed(n)) {
            for (b, part) in dest_row.chunks_mut(handed(block_rows)).enumerate() {
                outs[b].push(part);
            }
        }
        let outs: Vec<Mutex<Vec<&mut [f32]>>> = outs.into_iter().map(Mutex::new).collect();
        team.run(blocks, &|b| {
            let start = b * block_rows;
            if let Ok(mut parts) = outs[b].lock() {
                block(start..(start + block_rows).min(n), &mut parts);
            }
        });
    }
}

/// The low 4 bits of a block's 32 quants as Q4's two words (see [`Storage::Q4`]): byte `l` of
/// word `h` holds quant `8 h + l` in its low nibble and `16 + 8 h + l` in its high one.
fn nibble_words(q: &[u8]) -> [u64; 2] {
    std::array::from_fn(|h| {
        let bytes: [u8; 8] =
            std::array::from_fn(|l| (q[8 * h + l] & 0xF) | ((q[16 + 8 * h + l] & 0xF) << 4));
        u64::from_le_bytes(bytes)
    })
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

/// The Q4 storage of `rows` padded rows (minimums `apart` for `Q4A8`), or `None` when a
/// block's weights are not on a grid of at most 16 evenly spaced levels and may not be
/// `round`ed to one.
fn pack_q4(
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
