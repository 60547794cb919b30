//! f32 weights, stored as they are; rows longer than 32 blocks in spans ([`span_width`]).

use super::{BLOCK, PANEL, Storage, place_blocks};

/// Rows of an f32 matrix stored together span by span ([`span_width`]).
pub(crate) const SPAN_GROUP: usize = 16;

/// Blocks of a row (of `blocks`) in one span of an f32 matrix: the whole row up to 32 blocks
/// (1024 inputs), else spans of at most 16 (2 KB of a row of `x`). Over several rows of `x` a
/// tile reads every row of `x` once per panel; where 8 of them (48 KB for the 1.5B's 1536
/// inputs, 280 KB for its `down`'s 8960) do not fit L1 beside the panel, they come from L2
/// for every panel, and that traffic shares L1's fills with the weights streamed from memory.
/// In spans, [`SPAN_GROUP`] rows take one span of `x` (16 KB at 8 rows) in turn, so it stays
/// in L1 for the group's 8 panels. Rows of up to 32 blocks stay whole: the 0.5B's 896 inputs
/// in 2 spans of 14 blocks took 0.99-1.27 of the time of whole rows at one row of `x` (pairs
/// of runs, Zen 3, docs/benchmarks.md at d7069f5, "f32 rows in spans"), where the pieces' own
/// cost is not hidden.
pub(crate) fn span_width(blocks: usize) -> usize {
    if blocks <= 32 {
        blocks.max(1)
    } else {
        blocks.div_ceil(blocks.div_ceil(16))
    }
}

/// Where block `b` of row `r` of an f32 matrix is stored, in blocks from the start (`blocks` a
/// row, `panel_rows` rows with the padding row): rows in groups of [`SPAN_GROUP`], each group
/// span by span, each span panel by panel as [`block_index`](super::block_index) within it.
/// With one span a row this is [`block_index`](super::block_index).
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

/// The f32 storage of `rows` padded rows: blocks placed span by span ([`spanned_block_index`]).
pub(super) fn pack_f32(
    padded_row: &mut impl FnMut(usize) -> Vec<f32>,
    rows: usize,
    blocks: usize,
    panel_rows: usize,
) -> Storage {
    let padded_cols = blocks * BLOCK;
    let mut out = vec![0.0f32; panel_rows * padded_cols];
    for r in 0..rows {
        place_blocks(&mut out, &padded_row(r), blocks, BLOCK, |b| {
            spanned_block_index(r, b, blocks, panel_rows)
        });
    }
    Storage::F32(out)
}
