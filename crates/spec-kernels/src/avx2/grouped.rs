//! The grouped layouts (`q8_0-a8`, Q4_K and Q6_K superblocks) against int8 rows of `x`
//! interleaved alike: each integer multiply-add sums 4 products of each of 8 blocks into the
//! block's own lane ([`tile_grouped`]), in AVX2's pairwise sums ([`PairSums`]) or `vpdpbusd`
//! (module `vnni`).

use std::marker::PhantomData;
use std::ops::Range;

use core::arch::x86_64::{__m256i, __m512i};
use pulp::bytemuck::cast_slice;
use pulp::x86::{V3, V4};
use pulp::{Simd, cast, f32x8, i32x8};

use crate::activations::{Interleave, QuantizedRows};
use crate::pack::{BLOCK, GROUP, PANEL, PackedMatrix, Storage};

use super::hints::{GROUPED_PREFETCH_AHEAD_BYTES, Hint, prefetch_quantized};
use super::int8::{Int8Row, int8_row};
use super::panel;
use super::rows::{Q8Row, Row};
use super::superblocks::{Q4KRow, Q6KRow};
use super::sweep::{Tiles, run_tile, sweep};
use super::vnni::{Vnni, paired_grouped_tile};

/// How a tile sums products of bytes, 4 into each 32-bit lane. Every sum is exact, so
/// the implementations give the same bits.
pub(super) trait IntDot: Copy {
    /// Whether [`IntDot::group_dot`] multiplies the stored quants as they are (`q + 128`),
    /// so that a group's sums start from `x`'s `−128 · Σ q` instead of zero.
    const BIASED: bool;
    /// What [`IntDot::group_dot`] needs of a unit of stored quants (`q + 128`).
    type Unit: Copy;
    fn unit(self, simd: V3, stored: __m256i) -> Self::Unit;
    /// `acc` plus, in each lane, the 4 products of the unit's quants by `x`'s in it (plus
    /// 128 times `x`'s with [`IntDot::BIASED`]).
    fn group_dot(self, simd: V3, acc: __m256i, unit: Self::Unit, x: __m256i) -> __m256i;
    /// `acc` plus, in each lane, the 4 products of `unsigned` (at most 127) by `signed`.
    fn dot(self, simd: V3, acc: __m256i, unsigned: __m256i, signed: __m256i) -> __m256i;
    /// `vpdpbusd` on 16 lanes, where this dot has it ([`paired_grouped_tile`]).
    #[inline(always)]
    fn paired(self) -> Option<Vnni> {
        None
    }
}

/// The signed quants of a unit of stored ones (`q + 128`).
#[inline(always)]
fn unbiased(simd: V3, stored: __m256i) -> __m256i {
    simd.avx2
        ._mm256_xor_si256(stored, simd.avx._mm256_set1_epi8(i8::MIN))
}

/// AVX2: `vpmaddubsw` into 16-bit pairs (at most 2 · 127 · 127: no saturation with the
/// unsigned side at most 127, so signed weights give their sign to `x` and their absolute
/// value to the unsigned side), `vpmaddwd` by ones into lanes, then an add.
#[derive(Clone, Copy)]
pub(super) struct PairSums;

impl IntDot for PairSums {
    const BIASED: bool = false;
    type Unit = (__m256i, __m256i);

    #[inline(always)]
    fn unit(self, simd: V3, stored: __m256i) -> Self::Unit {
        let signed = unbiased(simd, stored);
        (simd.avx2._mm256_abs_epi8(signed), signed)
    }

    #[inline(always)]
    fn group_dot(self, simd: V3, acc: __m256i, unit: Self::Unit, x: __m256i) -> __m256i {
        let (magnitude, signs) = unit;
        self.dot(simd, acc, magnitude, simd.avx2._mm256_sign_epi8(x, signs))
    }

    #[inline(always)]
    fn dot(self, simd: V3, acc: __m256i, unsigned: __m256i, signed: __m256i) -> __m256i {
        let pairs = simd.avx2._mm256_maddubs_epi16(unsigned, signed);
        let ones = simd.avx._mm256_set1_epi16(1);
        let lanes = simd.avx2._mm256_madd_epi16(pairs, ones);
        simd.avx2._mm256_add_epi32(acc, lanes)
    }
}

/// A weight row stored in groups of [`GROUP`] blocks whose 32-byte units hold 4 quants of
/// each block of the group (`Storage::Q8_0Groups`, `Q4K`, `Q6K`), for [`tile_grouped`].
pub(super) trait GroupRow: Copy {
    /// Whether the units hold signed quants stored plus 128 (Q8_0) rather than unsigned
    /// ones.
    const SIGNED: bool;
    /// Runs of a group's units with scales of their own: 1, or 2 for Q6_K (a block's
    /// halves, units 0..4 and 4..8).
    const SEGMENTS: usize;
    /// Asks for the weights a few KB ahead of group `g` of the row's panel (every row of it)
    /// with `hint`'s instruction.
    fn prefetch(self, simd: V3, hint: Hint, g: usize);
    /// Units `4 q .. 4 q + 4` of group `g`, as bytes.
    fn quad(self, simd: V3, g: usize, q: usize) -> [__m256i; 4];
    /// Units `4 q .. 4 q + 4` of group `g` of a panel's two rows (`rows[0]` in lane 0),
    /// the first row's in the lower half of each vector and the second's in the upper.
    #[inline(always)]
    fn pair_quad(rows: [Self; PANEL], simd: V3, v4: V4, g: usize, q: usize) -> [__m512i; 4] {
        let f = v4.avx512f;
        let (lows, highs) = (rows[0].quad(simd, g, q), rows[1].quad(simd, g, q));
        // No closure: it would not inherit the target features, and the intrinsic would
        // become a call.
        let mut pair = [f._mm512_setzero_si512(); 4];
        for (pair, (&low, &high)) in pair.iter_mut().zip(lows.iter().zip(&highs)) {
            *pair = f._mm512_inserti64x4::<1>(f._mm512_castsi256_si512(low), high);
        }
        pair
    }
    /// The f32 factor of each block's integer sum in segment `seg` of group `g`.
    fn scales(self, simd: V3, g: usize, seg: usize) -> f32x8;
    /// Where the integer sums of segment `seg` of group `g` with `x` start: what the stored
    /// offsets add, taken off (Q8_0's 128 when `biased`, Q6_K's 32).
    fn start(simd: V3, x: &Int8Row<'_>, g: usize, seg: usize, biased: bool) -> __m256i;
    /// Block `b` after the last whole group: its signed quants and scale. Only
    /// `Q8_0Groups` has such blocks (a superblock is a whole group).
    fn tail(self, simd: V3, b: usize) -> (__m256i, f32);
    /// Block `b` after the last whole group of a panel's two rows (`rows[0]` in lane 0)
    /// side by side, their stored quants (`q + 128`, the first row's in the lower half),
    /// and their scales; `None` where the layout has no such blocks or the rows do not
    /// hold block `b`.
    #[inline(always)]
    fn pair_tail(_rows: [Self; PANEL], _b: usize) -> Option<(__m512i, [f32; PANEL])> {
        None
    }
    /// `total` plus the row's minimums times `x`'s block sums (vectors of 8).
    #[inline(always)]
    fn add_mins(self, _simd: V3, _sums: &[f32x8], total: f32x8) -> f32x8 {
        total
    }
    /// The row's place in its panel.
    fn lane(self) -> usize;
}

impl GroupRow for Q8Row<'_> {
    const SIGNED: bool = true;
    const SEGMENTS: usize = 1;

    #[inline(always)]
    fn prefetch(self, simd: V3, hint: Hint, g: usize) {
        let ahead = GROUPED_PREFETCH_AHEAD_BYTES / <Self as Row>::PANEL_BLOCK_BYTES;
        for t in 0..GROUP {
            prefetch_quantized(simd, hint, self.quants, self.scales, g * GROUP + t + ahead);
        }
    }

    #[inline(always)]
    fn quad(self, _simd: V3, g: usize, q: usize) -> [__m256i; 4] {
        let group = &self.quants.as_chunks::<{ GROUP * PANEL }>().0[g];
        std::array::from_fn(|u| cast(group[(4 * q + u) * PANEL + self.lane]))
    }

    /// A unit of the panel's two rows is 64 bytes in a row (unit `t` of lane 0, then of
    /// lane 1): one load a vector, where the default takes two and an insertion.
    #[inline(always)]
    fn pair_quad(rows: [Self; PANEL], _simd: V3, _v4: V4, g: usize, q: usize) -> [__m512i; 4] {
        debug_assert!(rows[0].lane == 0 && rows[1].lane == 1);
        let group = &rows[0].quants.as_chunks::<{ GROUP * PANEL }>().0[g];
        std::array::from_fn(|u| {
            let t = (4 * q + u) * PANEL;
            cast([group[t], group[t + 1]])
        })
    }

    #[inline(always)]
    fn scales(self, _simd: V3, g: usize, _seg: usize) -> f32x8 {
        cast(self.scales.as_chunks::<GROUP>().0[g * PANEL + self.lane])
    }

    #[inline(always)]
    fn start(simd: V3, x: &Int8Row<'_>, g: usize, _seg: usize, biased: bool) -> __m256i {
        if biased {
            cast(x.group_offsets[g])
        } else {
            simd.avx._mm256_setzero_si256()
        }
    }

    #[inline(always)]
    fn tail(self, simd: V3, b: usize) -> (__m256i, f32) {
        let at = b * PANEL + self.lane;
        (unbiased(simd, cast(self.quants[at])), self.scales[at])
    }

    /// The panel's two rows of a block are 64 bytes in a row, as a group's units are.
    #[inline(always)]
    fn pair_tail(rows: [Self; PANEL], b: usize) -> Option<(__m512i, [f32; PANEL])> {
        debug_assert!(rows[0].lane == 0 && rows[1].lane == 1);
        let at = b * PANEL;
        let (quants, scales) = (rows[0].quants, rows[0].scales);
        Some((
            cast([*quants.get(at)?, *quants.get(at + 1)?]),
            [*scales.get(at)?, *scales.get(at + 1)?],
        ))
    }

    #[inline(always)]
    fn lane(self) -> usize {
        self.lane
    }
}

/// Grouped rows against int8 rows of `x` interleaved the same way ([`tile_grouped`]).
#[derive(Clone, Copy)]
struct Grouped<'x, W, D>(D, PhantomData<(&'x (), W)>);

impl<'x, W: GroupRow, D: IntDot> Tiles for Grouped<'x, W, D> {
    type W = W;
    type X = Int8Row<'x>;

    #[inline(always)]
    fn tile<const RR: usize, const M: usize>(
        self,
        simd: V3,
        rows: &[W; RR],
        xs: &[Int8Row<'x>; M],
        blocks: usize,
    ) -> [[f32; M]; RR] {
        tile_grouped(simd, self.0, rows, xs, blocks)
    }
}

/// The dot products of grouped integer weight rows with int8 rows of `x` interleaved the
/// same way ([`QuantizedRows::grouped`]): each integer multiply-add of a unit adds 4
/// products of each block of the group into that block's own lane, so after a segment's
/// units lane `j` holds block `j`'s exact sum (Q4_K: `Σ q · q_x`; Q6_K and, with
/// `vpdpbusd`, Q8_0 from a start that takes the stored offset off), and one multiply-add a
/// segment, 8 blocks a vector, scales them into f32 (`sums · scales · steps`) where a
/// per-block layout takes one a block. Q8_0's blocks after the last whole group go one at
/// a time. A row's operations do not depend on the tile, and its bits not on `D` (exact
/// integer sums). With `vpdpbusd`, a tile of one panel's two rows takes them side by side
/// in 16 lanes ([`paired_grouped_tile`], Q8_0's last blocks too), the same operations lane
/// for lane.
#[allow(clippy::needless_range_loop)]
#[inline(always)]
fn tile_grouped<W: GroupRow, D: IntDot, const RR: usize, const M: usize>(
    simd: V3,
    dot: D,
    rows: &[W; RR],
    xs: &[Int8Row<'_>; M],
    blocks: usize,
) -> [[f32; M]; RR] {
    let hint = Hint::of_cpu();
    if RR == PANEL
        && rows[0].lane() == 0
        && let Some(vnni) = dot.paired()
    {
        let (acc, tail_from) =
            paired_grouped_tile(simd, vnni, hint, &[rows[0], rows[1]], xs, blocks);
        let mut all = [[simd.splat_f32x8(0.0); M]; RR];
        all[..PANEL].copy_from_slice(&acc);
        return finish_grouped(simd, dot, hint, rows, xs, tail_from..blocks, all);
    }
    let zero = simd.splat_f32x8(0.0);
    let zero_i = simd.avx._mm256_setzero_si256();
    let mut acc = [[zero; M]; RR];
    let groups = blocks / GROUP;
    let quads = 2 / W::SEGMENTS;
    for g in 0..groups {
        for r in (0..RR).step_by(PANEL) {
            rows[r].prefetch(simd, hint, g);
        }
        let mut x_units = [&[[0i8; BLOCK]; GROUP]; M];
        for i in 0..M {
            x_units[i] = &xs[i].quants.as_chunks::<GROUP>().0[g];
        }
        for seg in 0..W::SEGMENTS {
            let mut sums = [[zero_i; M]; RR];
            for i in 0..M {
                let start = W::start(simd, &xs[i], g, seg, D::BIASED);
                for r in 0..RR {
                    sums[r][i] = start;
                }
            }
            // A trip count the compiler cannot see: unrolled whole, a group's loads of
            // `x` were all hoisted to its top and spilled.
            for quad in 0..std::hint::black_box(quads) {
                let q = seg * quads + quad;
                for r in 0..RR {
                    let units = rows[r].quad(simd, g, q);
                    for (u, &unit) in units.iter().enumerate() {
                        let t = 4 * q + u;
                        if W::SIGNED {
                            let unit = dot.unit(simd, unit);
                            for i in 0..M {
                                let x: __m256i = cast(x_units[i][t]);
                                sums[r][i] = dot.group_dot(simd, sums[r][i], unit, x);
                            }
                        } else {
                            for i in 0..M {
                                let x: __m256i = cast(x_units[i][t]);
                                sums[r][i] = dot.dot(simd, sums[r][i], unit, x);
                            }
                        }
                    }
                }
            }
            for r in 0..RR {
                let scales = rows[r].scales(simd, g, seg);
                for i in 0..M {
                    let steps: f32x8 = cast(xs[i].steps.as_chunks::<GROUP>().0[g]);
                    acc[r][i] = simd.mul_add_f32x8(
                        simd.convert_i32x8_to_f32x8(cast(sums[r][i])),
                        simd.mul_f32x8(scales, steps),
                        acc[r][i],
                    );
                }
            }
        }
    }
    finish_grouped(simd, dot, hint, rows, xs, groups * GROUP..blocks, acc)
}

/// [`tile_grouped`]'s end: the blocks `tail` after the last whole group (Q8_0's, one at a
/// time; none left where [`paired_grouped_tile`] took them) added to `acc`, then the rows'
/// minimums, and each sum's 8 lanes reduced.
#[allow(clippy::needless_range_loop)]
#[inline(always)]
fn finish_grouped<W: GroupRow, D: IntDot, const RR: usize, const M: usize>(
    simd: V3,
    dot: D,
    hint: Hint,
    rows: &[W; RR],
    xs: &[Int8Row<'_>; M],
    tail: Range<usize>,
    mut acc: [[f32x8; M]; RR],
) -> [[f32; M]; RR] {
    let zero_i = simd.avx._mm256_setzero_si256();
    if !tail.is_empty() {
        for r in (0..RR).step_by(PANEL) {
            rows[r].prefetch(simd, hint, tail.start / GROUP);
        }
    }
    for b in tail {
        for r in 0..RR {
            let (quants, scale) = rows[r].tail(simd, b);
            let scale = simd.splat_f32x8(scale);
            let unsigned = simd.avx2._mm256_abs_epi8(quants);
            for i in 0..M {
                let x: __m256i = cast(xs[i].quants[b]);
                let signed = simd.avx2._mm256_sign_epi8(x, quants);
                let sums: i32x8 = cast(dot.dot(simd, zero_i, unsigned, signed));
                let step = simd.splat_f32x8(xs[i].steps[b]);
                acc[r][i] = simd.mul_add_f32x8(
                    simd.convert_i32x8_to_f32x8(sums),
                    simd.mul_f32x8(scale, step),
                    acc[r][i],
                );
            }
        }
    }
    let mut out = [[0.0f32; M]; RR];
    for r in 0..RR {
        for i in 0..M {
            let total = rows[r].add_mins(simd, xs[i].sums, acc[r][i]);
            out[r][i] = simd.reduce_sum_f32s(total);
        }
    }
    out
}

/// The grouped layouts (`Storage::Q8_0Groups`, `Q4K`, `Q6K`) against the int8 rows of
/// `x`, interleaved as the weights ([`QuantizedRows::grouped`]); `matmul_with` always
/// rounds and interleaves `x` for them on the SIMD path, and without that the portable
/// loop multiplies `x` as given.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(super) fn grouped_sweep<D: IntDot, const M: usize>(
    simd: V3,
    dot: D,
    mat: &PackedMatrix,
    rows: Range<usize>,
    x: &[[f32x8; 4]],
    int8: Option<&QuantizedRows>,
    first: usize,
    m: usize,
    outs: &mut [&mut [f32]],
) {
    let blocks = mat.padded_cols() / BLOCK;
    let Some(q) = int8 else {
        return crate::scalar::run(mat, rows, cast_slice(x), m, outs);
    };
    let groups = blocks / GROUP;
    let offsets = q.group_offsets.len() == q.quants.len() / blocks * groups;
    let biased = mat.storage.interleave() == Interleave::BiasedGroups;
    if q.grouped.len() != q.quants.len() || (biased && !offsets) {
        let cols = mat.padded_cols();
        let x = &q.dequantize()[first * cols..(first + m) * cols];
        return crate::scalar::run(mat, rows, x, m, outs);
    }
    // Built once: a tile then copies its rows of `x` instead of calling a closure per row
    // (which the compiler kept out of line).
    let x_rows: Vec<Int8Row<'_>> = (first..first + m)
        .map(|i| Int8Row {
            quants: &q.grouped[i * blocks..(i + 1) * blocks],
            // Empty unless the storage's quants are biased (only `Q8Row` reads them).
            group_offsets: q
                .group_offsets
                .get(i * groups..(i + 1) * groups)
                .unwrap_or(&[]),
            ..int8_row(q, blocks)(i)
        })
        .collect();
    let x_row = |i: usize| x_rows[i];
    macro_rules! go {
        ($row:expr) => {
            grouped_tiles::<_, M>(
                simd,
                Grouped(dot, PhantomData),
                $row,
                rows,
                x_row,
                blocks,
                m,
                outs,
            )
        };
    }
    match &mat.storage {
        Storage::Q8_0Groups { quants, scales } => {
            let quants: &[[u64; 4]] = cast_slice(quants);
            go!(|r: usize| Q8Row {
                quants: panel(quants, r, blocks),
                scales: panel(scales, r, blocks),
                lane: r % PANEL,
            })
        }
        Storage::Q4K {
            quants,
            scales,
            steps,
            mins,
            neg_min_steps,
        } => {
            let quants: &[[u64; 4]] = cast_slice(quants);
            let per_row = groups;
            go!(|r: usize| Q4KRow {
                quants: panel(quants, r, 4 * per_row),
                scales: panel(scales, r, per_row),
                steps: panel(steps, r, per_row),
                mins: &mins[r * per_row..(r + 1) * per_row],
                neg_min_steps: &neg_min_steps[r * per_row..(r + 1) * per_row],
                lane: r % PANEL,
            })
        }
        Storage::Q6K {
            lows,
            highs,
            scales,
            steps,
        } => {
            let (lows, highs): (&[[u64; 4]], &[[u64; 4]]) = (cast_slice(lows), cast_slice(highs));
            let per_row = groups;
            go!(|r: usize| Q6KRow {
                lows: panel(lows, r, 4 * per_row),
                highs: panel(highs, r, 2 * per_row),
                scales: panel(scales, r, per_row),
                steps: panel(steps, r, per_row),
                lane: r % PANEL,
            })
        }
        _ => crate::scalar::run(mat, rows, &q.dequantize(), m, outs),
    }
}

/// The grouped tiles for exactly `M` rows of `x`, 1 to [`GROUPED_JOB_MAX_ROWS`]: one
/// tile of one panel × all `M` rows, so each weight vector streamed from memory serves every
/// row (with `vpdpbusd`, [`paired_grouped_tile`]). `M` 0 is any `m` (without `vpdpbusd`),
/// in [`sweep`]'s tiles for 16 registers. With `vpdpbusd` each `M` is a job of its own
/// ([`VnniJob`]), so it compiles only its own tile shapes: compiled into one function, each
/// shape ran slower for the others' presence (docs/benchmarks.md at 4a6a8de, "One tile of all
/// the rows, a job per row count").
/// The tiles go through [`panels`] as they are: written as one loop of one-panel tiles,
/// the 1.5B's `q4-a8` pass of 16 rows took 130-137 ms against 111-115 ms (codegen; the
/// same operations).
///
/// [`GROUPED_JOB_MAX_ROWS`]: super::GROUPED_JOB_MAX_ROWS
/// [`VnniJob`]: super::vnni::VnniJob
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn grouped_tiles<T: Tiles, const M: usize>(
    simd: V3,
    tiles: T,
    row: impl Fn(usize) -> T::W,
    rows: Range<usize>,
    x_row: impl Fn(usize) -> T::X,
    blocks: usize,
    m: usize,
    outs: &mut [&mut [f32]],
) {
    debug_assert!(M == 0 || M == m);
    if M > 0 {
        panels::<T, PANEL, M, M>(simd, tiles, row, rows, x_row, blocks, m, outs)
    } else {
        sweep(simd, false, tiles, row, rows, x_row, blocks, m, outs)
    }
}

/// Tiles of `RR` weight rows (then 2, then 1 for the rows left) × `MT` rows of `x` while
/// `MT` are left, then `REST` at a time (`REST` divides what is left), every row of `x`
/// against a panel before the next panel.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(super) fn panels<T: Tiles, const RR: usize, const MT: usize, const REST: usize>(
    simd: V3,
    tiles: T,
    row: impl Fn(usize) -> T::W,
    rows: Range<usize>,
    x_row: impl Fn(usize) -> T::X,
    blocks: usize,
    m: usize,
    outs: &mut [&mut [f32]],
) {
    let start = rows.start;
    let mut r = start;
    macro_rules! x_tiles {
        ($rr:literal) => {{
            let mut i = 0;
            while m - i >= MT {
                run_tile::<T, $rr, MT>(simd, tiles, &row, r, r - start, i, &x_row, blocks, outs);
                i += MT;
            }
            while i < m {
                run_tile::<T, $rr, REST>(simd, tiles, &row, r, r - start, i, &x_row, blocks, outs);
                i += REST;
            }
            r += $rr;
        }};
    }
    while RR == 2 * PANEL && rows.end - r >= 2 * PANEL {
        x_tiles!(4);
    }
    while rows.end - r >= 2 {
        x_tiles!(2);
    }
    while r < rows.end {
        x_tiles!(1);
    }
}
