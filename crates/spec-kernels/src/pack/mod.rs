//! Weight packing: [`PackedMatrix`], its [`Storage`] and the layout every format shares (rows
//! padded to whole blocks of [`BLOCK`], stored in panels of [`PANEL`] rows, block by block).
//! Each format's encoding lies in a file of its own; the product's driver (shape checks,
//! padding, splitting over threads) in `product`.

mod bf16;
mod f32_spans;
mod format;
mod product;
mod q4;
mod q8;
mod superblocks;

pub use format::WeightFormat;
pub use product::{SWIGLU_RUN, swiglu_row_order};
pub use superblocks::{Q4Superblock, Q6Superblock, SUPERBLOCK};

pub(crate) use f32_spans::{SPAN_GROUP, span_width, spanned_block_index};
pub(crate) use q4::MINS_TAIL;
pub(crate) use q8::{GROUP, grouped_byte, grouped_scale_index};
pub(crate) use superblocks::{high_place, nibble_place, superblock_load};

use crate::activations::{Interleave, QuantizedRows};
use crate::error::KernelError;
use crate::scalar;

use q4::pack_q4;

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

/// Where block `b` of row `r` is stored, in blocks from the start (`blocks` a row).
#[inline(always)]
pub(crate) fn block_index(r: usize, b: usize, blocks: usize) -> usize {
    ((r / PANEL) * blocks + b) * PANEL + r % PANEL
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
            WeightFormat::F32 => f32_spans::pack_f32(&mut padded_row, rows, blocks, panel_rows),
            WeightFormat::Bf16 => bf16::pack_bf16(&mut padded_row, rows, blocks, panel_rows),
            WeightFormat::Q8_0A8 => q8::pack_q8_0_groups(&mut padded_row, rows, blocks, panel_rows),
            WeightFormat::Q8_0 => q8::pack_q8_0(&mut padded_row, rows, blocks, panel_rows),
        };
        Ok(Self {
            rows,
            cols,
            padded_cols,
            format,
            storage,
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
}
