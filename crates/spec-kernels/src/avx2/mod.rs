//! The AVX2 + FMA kernel (x86-64, through `pulp`'s safe intrinsics; detected at run time).
//!
//! Every format presents a weight row as blocks of 32 weights read as four f32 vectors, so one
//! register tile serves them all: a few weight rows × a few rows of `x`, each pair accumulating
//! an 8-lane partial dot product, reduced once at the end of the row. The integer formats also
//! present a block as 32 bytes, for the tiles that multiply them by `x` rounded to int8 (the
//! `*A8` formats): one a block (Q4's per-block layout), or, for the grouped layouts (`Q8_0A8`,
//! Q4_K and Q6_K superblocks), one that sums 8 blocks at once, each in its own lane, with
//! `vpdpbusd` where the CPU has AVX512-VNNI; the same driver runs every tile.
//!
//! This module is the driver: [`run`] picks a job for a product (a SIMD context, `V3`, `V4`
//! or `V4Vnni`, and the tiles for its format and row count) and runs it. The tiles lie in
//! the submodules, one concern each: `rows` (each format's weight rows), `hints`
//! (prefetching), `sweep` (tiles over a product's rows), `widened` (weights widened to f32),
//! `int8` (per-block integer tiles), `grouped` and `superblocks` (8 blocks a multiply-add),
//! `vnni` (the same with `vpdpbusd`), `spans` and `wide_spans` (f32 rows stored in spans,
//! in 16 and in 32 registers) and `round` (rounding `x` to int8).

mod grouped;
mod hints;
mod int8;
mod round;
mod rows;
mod spans;
mod superblocks;
mod sweep;
mod vnni;
mod wide_spans;
mod widened;

pub(crate) use round::round_rows;
pub(crate) use wide_spans::{pair_halves, split_halves};

use std::ops::Range;

use pulp::bytemuck::cast_slice;
use pulp::x86::{V3, V4};
use pulp::{NullaryFnOnce, f32x8, u32x8};

use crate::activations::{Interleave, QuantizedRows};
use crate::pack::{BLOCK, PANEL, PackedMatrix, Storage};
use crate::tiles::SpanTile;

use grouped::{PairSums, grouped_sweep};
use int8::integer_sweep;
use rows::{Apart, Bf16Row, F32Row, Pairs, Q4Row, Q8Row};
use spans::{SPAN_TILE_MAX_ROWS, SpannedPass, spanned_sweep};
use vnni::{VnniJob, vnni};
use wide_spans::{WIDE_SPAN_ROWS, WideSpanJob};
use widened::widened_sweep;

pub(crate) fn available() -> bool {
    V3::is_available()
}

/// Which tiles [`run`] takes with `avx512` on this CPU (see [`crate::instruction_set`]).
pub(crate) fn instruction_set() -> &'static str {
    if V3::try_new().is_none() {
        "portable"
    } else if V4::try_new().is_none() {
        "AVX2 + FMA"
    } else if vnni().is_some() {
        "AVX-512 with VNNI"
    } else {
        "AVX-512"
    }
}

/// The blocks of the panel holding row `r` (`blocks` blocks a row, one unit each).
#[inline(always)]
fn panel<T>(all: &[T], r: usize, blocks: usize) -> &[T] {
    let p = r / PANEL;
    &all[p * blocks * PANEL..(p + 1) * blocks * PANEL]
}

/// One product's operands (see [`run`]), as the jobs carry them into a SIMD context.
struct Product<'a, 'b> {
    mat: &'a PackedMatrix,
    rows: Range<usize>,
    x: &'a [f32],
    int8: Option<&'a QuantizedRows>,
    /// The first row of `int8` that row 0 of `x` and `outs` is (a [`VnniJob`] takes at
    /// most [`GROUPED_JOB_MAX_ROWS`] rows of a product at a time).
    first: usize,
    m: usize,
    outs: &'a mut [&'b mut [f32]],
}

/// Every layout's product, inside `V3` or `V4`.
struct Job<'a, 'b> {
    simd: V3,
    product: Product<'a, 'b>,
    /// Tiles of two or three panels (see [`tall_tiles`]); only inside `V4`, whose 32
    /// registers hold their 12 to 30 sums.
    tall: bool,
}

impl NullaryFnOnce for Job<'_, '_> {
    type Output = ();

    #[inline(always)]
    fn call(self) {
        let Job {
            simd,
            product:
                Product {
                    mat,
                    rows,
                    x,
                    int8,
                    first: _,
                    m,
                    outs,
                },
            tall,
        } = self;
        let kp = mat.padded_cols();
        let blocks = kp / BLOCK;
        let x: &[[f32x8; 4]] = cast_slice(x);

        match &mat.storage {
            Storage::F32(w) if mat.spanned() => {
                spanned_sweep(
                    simd,
                    cast_slice(w),
                    mat.panel_rows(),
                    rows,
                    x,
                    blocks,
                    m,
                    outs,
                );
            }
            Storage::F32(w) => {
                let w: &[[f32x8; 4]] = cast_slice(w);
                let row = |r: usize| F32Row(panel(w, r, blocks), r % PANEL);
                widened_sweep(simd, tall, row, rows, x, blocks, m, outs);
            }
            Storage::Bf16(w) => {
                let w: &[[u32x8; 2]] = cast_slice(w);
                let row = |r: usize| Bf16Row(panel(w, r, blocks), r % PANEL);
                widened_sweep(simd, tall, row, rows, x, blocks, m, outs);
            }
            Storage::Q8_0 { quants, scales } => {
                let quants: &[[u64; 4]] = cast_slice(quants);
                let row = |r: usize| Q8Row {
                    quants: panel(quants, r, blocks),
                    scales: panel(scales, r, blocks),
                    lane: r % PANEL,
                };
                widened_sweep(simd, tall, row, rows, x, blocks, m, outs);
            }
            Storage::Q8_0Groups { .. } => {
                grouped_sweep::<_, 0>(simd, PairSums, mat, rows, x, int8, 0, m, outs);
            }
            Storage::Q4 { quants, params } => {
                let quants: &[[u64; 2]] = cast_slice(quants);
                let row = |r: usize| Q4Row {
                    quants: panel(quants, r, blocks),
                    side: Pairs(panel(params, r, blocks)),
                    lane: r % PANEL,
                };
                widened_sweep(simd, tall, row, rows, x, blocks, m, outs);
            }
            Storage::Q4A8 {
                quants,
                scales,
                mins,
            } => {
                let quants: &[[u64; 2]] = cast_slice(quants);
                let row = |r: usize| Q4Row {
                    quants: panel(quants, r, blocks),
                    side: Apart {
                        scales: panel(scales, r, blocks),
                        mins,
                        first_min: r * blocks,
                    },
                    lane: r % PANEL,
                };
                integer_sweep(simd, tall, row, rows, x, int8, blocks, m, outs);
            }
            Storage::Q4K { .. } | Storage::Q6K { .. } => {
                grouped_sweep::<_, 0>(simd, PairSums, mat, rows, x, int8, 0, m, outs);
            }
        }
    }
}

/// The most rows of `x` that a grouped product with `vpdpbusd` takes in one tile (a job of
/// its own for each count, see `grouped::grouped_tiles`); [`run`] gives more in near-equal chunks.
/// Against two-panel 4 × 4 tiles for more than 8 rows, the chunks of paired tiles took the
/// 1.5B's `q4-a8` pass of 9 rows from 95-105 ms to 67-68 ms, of 16 from 146-154 to 108-115,
/// and its prefill from 140-149 to 181-185 tokens a second (measured at 083e363; the finding
/// in docs/notes/cpu-kernels.md, "Layouts and tiles").
const GROUPED_JOB_MAX_ROWS: usize = 8;

/// Rows of `x` at least this many bytes in all (f32) no longer sit in L1 beside a panel, so
/// that tiles of two panels, which read each vector of `x` for 4 weight rows instead of 2,
/// pay for f32 and bf16 weights (see [`tall_tiles`]).
const TALL_X_BYTES: usize = 24 * 1024;

/// Whether `m` rows of `x` against `mat` run in tiles of two panels (4 weight rows × 4
/// rows of `x`; three for f32, [`Tiles::THREE_PANELS`]), given 32 registers for their
/// sums. Each output keeps its operations and their order, so its bits, whatever the tile.
/// Measured in one process against one-panel tiles, both orders of each pair
/// (docs/benchmarks.md at cdeee8c, "tiles of two and three panels for f32"):
/// - f32 and bf16 pay once the rows of `x` leave L1 (0.78–0.94 of the time where they
///   fill 24 KB or more; 1.07–1.46 where they fit, as for SmolLM2 at up to 8 rows);
/// - Q4 widened pays from 3 rows (0.71–0.93), Q8_0 widened from 16 (0.86–1.00: a prompt's
///   passes);
/// - the integer tiles of the `*A8` formats do not take them ([`Tiles::TALL`]; per block
///   they took 1.01–1.20 of the time).
///
/// [`Tiles::THREE_PANELS`]: sweep::Tiles::THREE_PANELS
/// [`Tiles::TALL`]: sweep::Tiles::TALL
fn tall_tiles(mat: &PackedMatrix, m: usize) -> bool {
    let x_bytes = m * mat.padded_cols() * size_of::<f32>();
    match &mat.storage {
        // Spanned f32 rows read `x` a span at a time, which fits L1.
        Storage::F32(_) if mat.spanned() => false,
        Storage::F32(_) | Storage::Bf16(_) => m >= 3 && x_bytes >= TALL_X_BYTES,
        Storage::Q4 { .. } => m >= 3,
        Storage::Q8_0 { .. } => m >= 16,
        Storage::Q8_0Groups { .. }
        | Storage::Q4A8 { .. }
        | Storage::Q4K { .. }
        | Storage::Q6K { .. } => false,
    }
}

/// Whether a product of `mat` with `avx512` set takes the tile it is given ([`run`]'s
/// `span_tile`): f32 rows stored in spans, on a CPU with AVX-512.
pub(crate) fn span_tiles_apply(mat: &PackedMatrix, avx512: bool) -> bool {
    avx512 && mat.spanned() && V4::try_new().is_some()
}

/// `outs[i][r - rows.start] = x[i] · W[r]`; `x` is `[m, padded_cols]`, and `int8` the same rows
/// rounded to int8, which integer weights multiply instead when given (f32 and bf16 weights, which
/// have no integer path, then multiply `x`). With `avx512`, on a CPU with AVX-512, the integer
/// tiles and the tiles of two panels ([`tall_tiles`]) are compiled for it (inside `V4`'s target
/// features): the operations stay AVX2's (lane for lane; a `wide_spans::paired_tile` does two rows'
/// in one 16-lane instruction), but 32 registers hold the sums that 16 would spill (the 1.5B's
/// superblock products took 0.87–0.93 of the time at 3 to 8 rows, docs/benchmarks.md at 1d9d8c2,
/// "The integer tiles with AVX-512's 32 registers"; the one-panel tiles of the widened formats gain
/// nothing, 0.98–1.06, but spanned f32 rows at 6 to 16 rows of `x` take one tile of all of them,
/// [`WideSpanJob`]); the grouped layouts with VNNI too run inside [`V4Vnni`] with `vpdpbusd` (2.3×
/// the multiply-adds a second of the per-block tile at 4 to 64 rows, one thread, docs/benchmarks.md
/// at 6aef5e8, "Integer sums 8 blocks at a time").
/// `span_tile` is the tile of a product of spanned f32 rows where the CPU has AVX-512 and
/// `avx512` is set ([`span_tiles_apply`]); elsewhere it is not used.
///
/// [`V4Vnni`]: vnni::V4Vnni
#[allow(clippy::too_many_arguments)]
pub(crate) fn run(
    mat: &PackedMatrix,
    rows: Range<usize>,
    x: &[f32],
    int8: Option<&QuantizedRows>,
    m: usize,
    outs: &mut [&mut [f32]],
    avx512: bool,
    span_tile: SpanTile,
) {
    let tall = tall_tiles(mat, m);
    let grouped = mat.storage.interleave() != Interleave::No;
    if let (true, true, Some((context, vnni)), Some(simd)) =
        (avx512, grouped, vnni(), V3::try_new())
    {
        // More rows than a job takes go in near-equal chunks, each streaming this part's
        // weights again (from the caches after the first).
        let cols = mat.padded_cols();
        let chunks = m.div_ceil(GROUPED_JOB_MAX_ROWS).max(1);
        let mut first = 0;
        for chunk in 0..chunks {
            let size = (m - first).div_ceil(chunks - chunk);
            let product = Product {
                mat,
                rows: rows.clone(),
                x: &x[first * cols..(first + size) * cols],
                int8,
                first,
                m: size,
                outs: &mut outs[first..first + size],
            };
            macro_rules! job {
                ($m:literal) => {
                    context.vectorize(VnniJob::<$m> {
                        simd,
                        vnni,
                        product,
                    })
                };
            }
            match size {
                1 => job!(1),
                2 => job!(2),
                3 => job!(3),
                4 => job!(4),
                5 => job!(5),
                6 => job!(6),
                7 => job!(7),
                _ => {
                    debug_assert_eq!(size, GROUPED_JOB_MAX_ROWS);
                    job!(8)
                }
            }
            first += size;
        }
        return;
    }
    let product = Product {
        mat,
        rows,
        x,
        int8,
        first: 0,
        m,
        outs,
    };
    if let Some(v4) = V4::try_new().filter(|_| avx512 && (int8.is_some() || tall)) {
        return v4.vectorize(Job {
            simd: *v4,
            product,
            tall,
        });
    }
    if let Some(v4) = V4::try_new().filter(|_| {
        avx512 && mat.spanned() && WIDE_SPAN_ROWS.contains(&m) && span_tile != SpanTile::EightLanes
    }) {
        macro_rules! wide {
            ($m:literal) => {
                if span_tile == SpanTile::TwoPanelStreams {
                    v4.vectorize(WideSpanJob::<$m, true> { simd: v4, product })
                } else {
                    v4.vectorize(WideSpanJob::<$m, false> { simd: v4, product })
                }
            };
        }
        return match m {
            2 => wide!(2),
            3 => wide!(3),
            4 => wide!(4),
            5 => wide!(5),
            6 => wide!(6),
            7 => wide!(7),
            8 => wide!(8),
            9 => wide!(9),
            10 => wide!(10),
            11 => wide!(11),
            12 => wide!(12),
            13 => wide!(13),
            14 => wide!(14),
            15 => wide!(15),
            _ => wide!(16),
        };
    }
    if let Some(simd) = V3::try_new().filter(|_| mat.spanned() && m > SPAN_TILE_MAX_ROWS) {
        return simd.vectorize(SpannedPass { simd, product });
    }
    let Some(simd) = V3::try_new() else {
        let Product {
            mat,
            rows,
            x,
            int8,
            first: _,
            m,
            outs,
        } = product;
        return match int8 {
            Some(q) => crate::scalar::run(mat, rows, &q.dequantize(), m, outs),
            None => crate::scalar::run(mat, rows, x, m, outs),
        };
    };
    simd.vectorize(Job {
        simd,
        product,
        tall: false,
    })
}
