//! The skinny product against an f64 reference on the stored weights, in every format, on the
//! SIMD and the portable path, threaded and not; and against burn's matmul.

// A failure in a test or measurement helper is a failure of the run.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use burn::backend::Flex;
use burn::tensor::{Tensor, TensorData};
use proptest::prelude::*;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use spec_kernels::{
    Exec, Isa, KernelError, PackedMatrix, Q4Superblock, Q6Superblock, SUPERBLOCK, SWIGLU_RUN,
    SpanTile, WeightFormat, swiglu_row_order, swiglu_with,
};

const FORMATS: [WeightFormat; 7] = WeightFormat::ALL;

fn random(len: usize, rng: &mut ChaCha8Rng) -> Vec<f32> {
    (0..len).map(|_| rng.random_range(-1.0f32..1.0)).collect()
}

/// Weights `[n, k]` as a 4-bit checkpoint holds them: each row's blocks of 32 columns are
/// `d · q − m` with `q` in `0..16` and their own `d`, `m` (as GGUF's Q4_K and Q4_1 dequantize).
fn four_bit(n: usize, k: usize, rng: &mut ChaCha8Rng) -> Vec<f32> {
    let mut w = Vec::with_capacity(n * k);
    for _ in 0..n {
        for block in (0..k).step_by(32) {
            let d = rng.random_range(1e-3f32..0.1);
            let m = rng.random_range(0.0f32..1.0);
            for _ in block..(block + 32).min(k) {
                w.push(d * f32::from(rng.random_range(0u8..16)) - m);
            }
        }
    }
    w
}

/// Weights for `format`: [`four_bit`] for Q4 (other weights are not stored as Q4), random
/// otherwise.
fn weights_for(format: WeightFormat, n: usize, k: usize, rng: &mut ChaCha8Rng) -> Vec<f32> {
    match format {
        WeightFormat::Q4 | WeightFormat::Q4A8 => four_bit(n, k, rng),
        _ => random(n * k, rng),
    }
}

/// Checks `y` against the f64 product of `x` (rounded to int8 blocks for the formats that round
/// activations) with the stored weights: the error of each entry is at most 1e-5 of
/// `Σ |x_i w_i|` (the scale f32 rounding acts on; equal to 1e-5 relative when the terms do not
/// cancel).
fn check(mat: &PackedMatrix, x: &[f32], m: usize, y: &[f32]) -> Result<(), TestCaseError> {
    let (n, k) = (mat.rows(), mat.cols());
    let w = mat.dequantize();
    let x = &mat.rounded_input(x, m);
    for i in 0..m {
        for r in 0..n {
            let (mut dot, mut mag) = (0.0f64, 0.0f64);
            for c in 0..k {
                let t = f64::from(x[i * k + c]) * f64::from(w[r * k + c]);
                dot += t;
                mag += t.abs();
            }
            let got = f64::from(y[i * n + r]);
            prop_assert!(
                (got - dot).abs() <= 1e-5 * mag + 1e-30,
                "{} m={m} n={n} k={k}: y[{i},{r}] = {got}, reference {dot} (Σ|terms| {mag})",
                mat.format()
            );
        }
    }
    Ok(())
}

/// Runs `mat · x` on every ISA, threaded and not, checking each result; the AVX-512 build of
/// the SIMD kernel ([`Isa::Auto`] where the CPU has it), with every tile of spanned f32 rows
/// and the timed choice among them, must give [`Isa::Avx2`]'s bits: it runs the same
/// operations.
fn check_every_isa(mat: &PackedMatrix, x: &[f32], m: usize) -> Result<(), TestCaseError> {
    let n = mat.rows();
    let mut simd_bits: Vec<Vec<u32>> = Vec::new();
    let tiles = std::iter::once(None).chain(SpanTile::ALL.map(Some));
    let execs = tiles
        .map(|span_tile| (Isa::Auto, span_tile))
        .chain([(Isa::Avx2, None), (Isa::Scalar, None)]);
    for (isa, span_tile) in execs {
        for parallel in [false, true] {
            let mut y = vec![f32::NAN; m * n];
            let exec = Exec {
                isa,
                parallel,
                span_tile,
            };
            mat.matmul_with(x, m, &mut y, exec)
                .map_err(|e| TestCaseError::fail(e.to_string()))?;
            check(mat, x, m, &y)?;
            if isa != Isa::Scalar {
                simd_bits.push(y.iter().map(|v| v.to_bits()).collect());
            }
        }
    }
    prop_assert!(
        simd_bits.windows(2).all(|w| w[0] == w[1]),
        "{}: the SIMD builds or their threading disagree in some bits",
        mat.format()
    );
    Ok(())
}

fn run_case(m: usize, n: usize, k: usize, seed: u64) -> Result<(), TestCaseError> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let x = random(m * k, &mut rng);
    for format in FORMATS {
        let weights = weights_for(format, n, k, &mut rng);
        let mat = PackedMatrix::pack(&weights, n, k, format)
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(mat.format(), format);
        check_every_isa(&mat, &x, m)?;
    }
    Ok(())
}

/// Superblocks for `[n, k]` as a Q4_K checkpoint holds them: f16 steps, 6-bit scales and
/// minimums, 4-bit quants.
fn superblocks(n: usize, k: usize, rng: &mut ChaCha8Rng) -> Vec<Q4Superblock> {
    let f16 = |v: f32| half::f16::from_f32(v).to_f32();
    (0..n * k / SUPERBLOCK)
        .map(|_| Q4Superblock {
            scale: f16(rng.random_range(1e-4f32..2e-3)),
            // Minimums up to ~1000 steps of a block's grid: from ~10⁴ steps (a minimum step
            // of 2e-2 with a step of 1e-4), f32 rounding of the weights puts them off the grid
            // by more than `q4`'s tolerance, and `q4` then stores the matrix as Q8_0, as it
            // says it does (a case proptest found, m 1, n 30, 2 superblocks).
            min_scale: f16(rng.random_range(1e-4f32..2e-3)),
            scales: std::array::from_fn(|_| rng.random_range(0u8..64)),
            mins: std::array::from_fn(|_| rng.random_range(0u8..64)),
            quants: std::array::from_fn(|_| rng.random_range(0u8..16)),
        })
        .collect()
}

/// Q6_K superblocks for `[n, k]`: f16 steps, signed 8-bit scales, 6-bit quants.
fn superblocks_6(n: usize, k: usize, rng: &mut ChaCha8Rng) -> Vec<Q6Superblock> {
    let f16 = |v: f32| half::f16::from_f32(v).to_f32();
    (0..n * k / SUPERBLOCK)
        .map(|_| Q6Superblock {
            scale: f16(rng.random_range(1e-5f32..1e-3)),
            scales: std::array::from_fn(|_| rng.random_range(-128i16..128) as i8),
            quants: std::array::from_fn(|_| rng.random_range(0u8..64)),
        })
        .collect()
}

/// Superblocks kept as they are multiply as their f32 values would, on every path, for every
/// row count; other formats pack their f32 values. Q4_K and Q6_K superblocks alike.
fn superblock_case(m: usize, n: usize, supers: usize, seed: u64) -> Result<(), TestCaseError> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let k = supers * SUPERBLOCK;
    let blocks = superblocks(n, k, &mut rng);
    let blocks_6 = superblocks_6(n, k, &mut rng);
    let x = random(m * k, &mut rng);
    let formats = [WeightFormat::Q4A8, WeightFormat::Q4, WeightFormat::F32];
    let cases = formats
        .into_iter()
        .map(|f| (f, false))
        .chain([(WeightFormat::Q4A8, true), (WeightFormat::F32, true)]);
    for (format, six) in cases {
        let (mat, weights) = if six {
            let weights: Vec<f32> = blocks_6.iter().flat_map(Q6Superblock::dequantize).collect();
            (
                PackedMatrix::pack_q6_superblocks(&blocks_6, n, k, format),
                weights,
            )
        } else {
            let weights: Vec<f32> = blocks.iter().flat_map(Q4Superblock::dequantize).collect();
            (
                PackedMatrix::pack_q4_superblocks(&blocks, n, k, format),
                weights,
            )
        };
        let mat = mat.map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(mat.format(), format);
        // Kept as they are (and in f32) the weights are the checkpoint's values; `q4` finds
        // each block's grid again from them, to f32 rounding of its scale.
        let exact = format != WeightFormat::Q4;
        for (a, b) in mat.dequantize().iter().zip(&weights) {
            let tolerance = if exact { 0.0 } else { 1e-6 * b.abs().max(1e-3) };
            prop_assert!(
                (a - b).abs() <= tolerance,
                "{}: stored {} for {}",
                format,
                a,
                b
            );
        }
        check_every_isa(&mat, &x, m)?;
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    #[test]
    fn q4_superblocks_match_reference(
        m in 1usize..=16,
        n in 1usize..40,
        supers in 1usize..4,
        seed in any::<u64>(),
    ) {
        superblock_case(m, n, supers, seed)?;
    }
}

#[test]
fn q4_superblocks_are_kept_in_0_59_bytes_a_weight() {
    let mut rng = ChaCha8Rng::seed_from_u64(21);
    let (n, k) = (6, 512);
    let blocks = superblocks(n, k, &mut rng);
    let native = PackedMatrix::pack_q4_superblocks(&blocks, n, k, WeightFormat::Q4A8).unwrap();
    // Per 256 weights: 128 bytes of quants, 8 scales, a step, 8 minimums, a minimum step.
    assert_eq!(
        native.stored_bytes(),
        n * (k / SUPERBLOCK) * (128 + 8 + 4 + 8 + 4)
    );
    let weights: Vec<f32> = blocks.iter().flat_map(Q4Superblock::dequantize).collect();
    let widened = PackedMatrix::pack(&weights, n, k, WeightFormat::Q4A8).unwrap();
    assert_eq!(native.dequantize(), widened.dequantize());
    // A row that does not end on a superblock, a missing superblock, a quant of 5 bits.
    assert!(matches!(
        PackedMatrix::pack_q4_superblocks(&blocks, n, k + 32, WeightFormat::Q4A8),
        Err(KernelError::Superblocks(_))
    ));
    assert!(PackedMatrix::pack_q4_superblocks(&blocks[1..], n, k, WeightFormat::Q4A8).is_err());
    // `x` is rounded with one step a superblock: each input moves by at most half of it,
    // max |x| / 254 over its 256 inputs.
    let x = random(2 * k, &mut rng);
    let rounded = native.rounded_input(&x, 2);
    for (run_x, run_r) in x.chunks(SUPERBLOCK).zip(rounded.chunks(SUPERBLOCK)) {
        let amax = run_x.iter().fold(0.0f32, |a, v| a.max(v.abs()));
        for (a, b) in run_x.iter().zip(run_r) {
            assert!(
                (a - b).abs() <= amax / 254.0 * (1.0 + 1e-5),
                "{a} rounded to {b}"
            );
        }
        let step = amax / 127.0;
        for b in run_r {
            let levels = b / step;
            assert!(
                (levels - levels.round()).abs() < 1e-3,
                "{b} is not on the superblock's grid of {step}"
            );
        }
    }
    let mut bad = blocks.clone();
    bad[3].quants[17] = 16;
    assert!(PackedMatrix::pack_q4_superblocks(&bad, n, k, WeightFormat::Q4A8).is_err());
    // Q6_K: per 256 weights 128 bytes of low nibbles, 64 of high bits, 16 scales and a step.
    let blocks_6 = superblocks_6(n, k, &mut rng);
    let six = PackedMatrix::pack_q6_superblocks(&blocks_6, n, k, WeightFormat::Q4A8).unwrap();
    assert_eq!(
        six.stored_bytes(),
        n * (k / SUPERBLOCK) * (128 + 64 + 16 + 4)
    );
    let mut bad = blocks_6.clone();
    bad[1].quants[200] = 64;
    assert!(PackedMatrix::pack_q6_superblocks(&bad, n, k, WeightFormat::Q4A8).is_err());
    assert!(PackedMatrix::pack_q6_superblocks(&blocks_6, n, k + 32, WeightFormat::Q4A8).is_err());
    // `q4-a8-lossy` keeps superblocks exactly as `q4-a8` does: nothing of them is rounded.
    for (lossy, kept) in [
        (
            PackedMatrix::pack_q4_superblocks(&blocks, n, k, WeightFormat::Q4A8Lossy).unwrap(),
            PackedMatrix::pack_q4_superblocks(&blocks, n, k, WeightFormat::Q4A8).unwrap(),
        ),
        (
            PackedMatrix::pack_q6_superblocks(&blocks_6, n, k, WeightFormat::Q4A8Lossy).unwrap(),
            six,
        ),
    ] {
        assert_eq!(lossy.format(), WeightFormat::Q4A8);
        assert_eq!(lossy.stored_bytes(), kept.stored_bytes());
        assert_eq!(lossy.dequantize(), kept.dequantize());
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn matches_reference_on_random_shapes(
        m in 1usize..=16,
        n in 1usize..80,
        k in 1usize..600,
        seed in any::<u64>(),
    ) {
        run_case(m, n, k, seed)?;
    }
}

/// A row of `x` gets the same bits whatever the other rows of the product: greedy speculative
/// decoding relies on a verification over K + 1 rows scoring each position exactly as a decode
/// step of one row does, and on a prompt's passes agreeing with it. Every tile shape (1 to 5
/// rows of `x`; one panel, and where AVX-512 is there two or three panels from a few rows on,
/// f32 and bf16 once the rows fill 24 KB: here from 3), the grouped layouts (whole groups of 8
/// blocks, and for `q8_0-a8` the 2 blocks after them: k 2112; superblocks at k 2048; with VNNI
/// one tile of all rows up to 8, then two panels × 4 rows and single rows for the rest) and
/// the threaded split are covered by `m` in 1..=16, a few longer passes and the odd `n`,
/// whose last group of 16 rows has 13 (7 panels: f32 spans' odd last panel, which takes
/// one-panel tiles beside the others' two-panel ones).
#[test]
fn a_row_does_not_depend_on_the_others() {
    let (n, k, k_super, most) = (205, 2112, 2048, 64);
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    let x = random(most * k, &mut rng);
    let mut matrices: Vec<PackedMatrix> = FORMATS
        .into_iter()
        .map(|format| {
            let weights = weights_for(format, n, k, &mut rng);
            let mat = PackedMatrix::pack(&weights, n, k, format).unwrap();
            assert_eq!(mat.format(), format);
            mat
        })
        .collect();
    let blocks = superblocks(n, k_super, &mut rng);
    matrices
        .push(PackedMatrix::pack_q4_superblocks(&blocks, n, k_super, WeightFormat::Q4A8).unwrap());
    let blocks = superblocks_6(n, k_super, &mut rng);
    matrices
        .push(PackedMatrix::pack_q6_superblocks(&blocks, n, k_super, WeightFormat::Q4A8).unwrap());
    for mat in &matrices {
        let (format, k) = (mat.format(), mat.cols());
        let alone: Vec<Vec<u32>> = (0..most)
            .map(|i| {
                let y = mat.matmul(&x[i * k..(i + 1) * k], 1).unwrap();
                y.iter().map(|v| v.to_bits()).collect()
            })
            .collect();
        for m in (2..=16).chain([23, 37, most]) {
            let y = mat.matmul(&x[..m * k], m).unwrap();
            for (i, row) in y.chunks_exact(n).enumerate() {
                let bits: Vec<u32> = row.iter().map(|v| v.to_bits()).collect();
                assert!(
                    bits == alone[i],
                    "{format} k={k} m={m}: row {i} differs from its one-row product"
                );
            }
        }
    }
}

/// `rows` (`[2 ff, k]`, as `T` holds them) in [`swiglu_row_order`].
fn in_swiglu_order<T: Clone>(rows: &[T], ff: usize) -> Vec<T> {
    let per_row = rows.len() / (2 * ff);
    swiglu_row_order(ff)
        .unwrap()
        .into_iter()
        .flat_map(|r| rows[r * per_row..(r + 1) * per_row].iter().cloned())
        .collect()
}

/// The fused gate/up product hands on `silu(gate) · up` with the bits of the stacked product
/// followed by `swiglu`, in every format (superblocks included), on every instruction set,
/// threaded or not, split into one block a thread (192 rows) and into several (3072 rows of
/// 1536: 4 blocks a thread), at 1 to 16 rows of `x` and more.
#[test]
fn the_fused_swiglu_product_gives_the_stacked_products_bits() {
    let mut rng = ChaCha8Rng::seed_from_u64(11);
    for (ff, k, k_super) in [(96, 1100, 512), (1536, 1536, 1536)] {
        let n = 2 * ff;
        let mut pairs: Vec<(PackedMatrix, PackedMatrix)> = FORMATS
            .into_iter()
            .map(|format| {
                let weights = weights_for(format, n, k, &mut rng);
                let fused = in_swiglu_order(&weights, ff);
                (
                    PackedMatrix::pack(&weights, n, k, format).unwrap(),
                    PackedMatrix::pack(&fused, n, k, format).unwrap(),
                )
            })
            .collect();
        let blocks = superblocks(n, k_super, &mut rng);
        let fused = in_swiglu_order(&blocks, ff);
        pairs.push((
            PackedMatrix::pack_q4_superblocks(&blocks, n, k_super, WeightFormat::Q4A8).unwrap(),
            PackedMatrix::pack_q4_superblocks(&fused, n, k_super, WeightFormat::Q4A8).unwrap(),
        ));
        let blocks = superblocks_6(n, k_super, &mut rng);
        let fused = in_swiglu_order(&blocks, ff);
        pairs.push((
            PackedMatrix::pack_q6_superblocks(&blocks, n, k_super, WeightFormat::Q4A8).unwrap(),
            PackedMatrix::pack_q6_superblocks(&fused, n, k_super, WeightFormat::Q4A8).unwrap(),
        ));
        let rows: Vec<usize> = if ff < 1000 {
            (1..=16).chain([23]).collect()
        } else {
            vec![1, 2, 5, 9]
        };
        for (stacked, fused) in &pairs {
            let k = stacked.cols();
            let x = random(23 * k, &mut rng);
            for &m in &rows {
                for isa in [Isa::Auto, Isa::Avx2, Isa::Scalar] {
                    for parallel in [false, true] {
                        let exec = Exec {
                            isa,
                            parallel,
                            span_tile: None,
                        };
                        let mut y = vec![f32::NAN; m * n];
                        stacked.matmul_with(&x[..m * k], m, &mut y, exec).unwrap();
                        let expected = swiglu_with(&y, ff, isa);
                        let mut act = vec![f32::NAN; m * ff];
                        fused
                            .matmul_swiglu_with(&x[..m * k], m, &mut act, exec)
                            .unwrap();
                        let bits = |v: &[f32]| v.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
                        assert!(
                            bits(&act) == bits(&expected),
                            "{} ff={ff} m={m} {isa:?} parallel={parallel}: the fused product \
                             differs from the stacked one",
                            stacked.format()
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn the_fused_swiglu_product_refuses_what_it_cannot_pair() {
    assert_eq!(swiglu_row_order(0), None);
    assert_eq!(swiglu_row_order(SWIGLU_RUN + 8), None);
    let order = swiglu_row_order(2 * SWIGLU_RUN).unwrap();
    assert_eq!(order[..3], [0, 1, 2]);
    assert_eq!(order[SWIGLU_RUN], 2 * SWIGLU_RUN);
    assert_eq!(order[2 * SWIGLU_RUN], SWIGLU_RUN);
    let mut sorted = order.clone();
    sorted.sort_unstable();
    assert_eq!(sorted, (0..4 * SWIGLU_RUN).collect::<Vec<_>>());
    // 48 rows: not whole runs of pairs.
    let mat = PackedMatrix::pack(&[0.5; 48 * 32], 48, 32, WeightFormat::F32).unwrap();
    let mut act = vec![0.0; 24];
    assert_eq!(
        mat.matmul_swiglu_into(&[1.0; 32], 1, &mut act),
        Err(KernelError::SwigluRows(48))
    );
    let mat = PackedMatrix::pack(&[0.5; 64 * 32], 64, 32, WeightFormat::F32).unwrap();
    assert!(matches!(
        mat.matmul_swiglu_into(&[1.0; 32], 1, &mut act),
        Err(KernelError::OutputLength { expected: 32, .. })
    ));
}

/// Every tile of f32 rows stored in spans, asked for or picked by timing, gives each row of
/// `x` the bits of its one-row product at every row count, threaded or not: the timed choice
/// ([`Exec::span_tile`] `None`) may change from one product to the next. k 1100 stores rows
/// in 3 uneven spans, k 2112 in 5; 1027 rows end in a group of 3 rows and the padding row.
#[test]
fn every_span_tile_gives_the_same_bits() {
    let mut rng = ChaCha8Rng::seed_from_u64(11);
    for (n, k) in [(1027, 1100), (203, 2112)] {
        let mat = PackedMatrix::pack(&random(n * k, &mut rng), n, k, WeightFormat::F32).unwrap();
        let x = random(16 * k, &mut rng);
        let alone: Vec<Vec<u32>> = (0..16)
            .map(|i| {
                let y = mat.matmul(&x[i * k..(i + 1) * k], 1).unwrap();
                y.iter().map(|v| v.to_bits()).collect()
            })
            .collect();
        let tiles = std::iter::once(None).chain(SpanTile::ALL.map(Some));
        for (span_tile, parallel) in tiles.flat_map(|t| [(t, false), (t, true)]) {
            let exec = Exec {
                isa: Isa::Auto,
                parallel,
                span_tile,
            };
            // The timed choice runs each shape's candidates in turn: repeat to meet them all.
            let repeats = if span_tile.is_none() { 4 } else { 1 };
            for m in (1..=16).flat_map(|m| std::iter::repeat_n(m, repeats)) {
                let mut y = vec![f32::NAN; m * n];
                mat.matmul_with(&x[..m * k], m, &mut y, exec).unwrap();
                for (i, row) in y.chunks_exact(n).enumerate() {
                    let bits: Vec<u32> = row.iter().map(|v| v.to_bits()).collect();
                    assert!(
                        bits == alone[i],
                        "k={k} m={m} {span_tile:?} parallel={parallel}: row {i} differs"
                    );
                }
            }
        }
    }
}

#[test]
fn matches_reference_on_threaded_shapes() {
    // Large enough to be split over threads, with odd sizes to exercise every tail.
    // k 1100 (35 blocks) stores f32 rows in 3 uneven spans, split over threads at groups of
    // 16 rows; 1027 rows leave a last group of 3 rows and the padding row.
    for (m, n, k) in [
        (1, 515, 301),
        (3, 1027, 96),
        (16, 333, 577),
        (7, 2049, 64),
        (8, 1027, 1100),
        (4, 1027, 1100),
        (37, 1027, 1100),
    ] {
        run_case(m, n, k, (m * n * k) as u64).unwrap();
    }
}

#[test]
fn model_widths_match_reference() {
    for (m, n, k) in [(1, 192, 576), (4, 576, 1536), (16, 64, 896)] {
        run_case(m, n, k, 7).unwrap();
    }
}

#[test]
fn f32_matches_burn_matmul() {
    let mut rng = ChaCha8Rng::seed_from_u64(11);
    let device = Default::default();
    for (m, n, k) in [(1, 257, 129), (5, 100, 576), (16, 999, 33)] {
        let weights = random(n * k, &mut rng);
        let x = random(m * k, &mut rng);
        let mat = PackedMatrix::pack(&weights, n, k, WeightFormat::F32).unwrap();
        let y = mat.matmul(&x, m).unwrap();
        let wt = Tensor::<Flex, 2>::from_data(TensorData::new(weights, [n, k]), &device);
        let xt = Tensor::<Flex, 2>::from_data(TensorData::new(x.clone(), [m, k]), &device);
        let expected = xt
            .matmul(wt.transpose())
            .into_data()
            .to_vec::<f32>()
            .unwrap();
        for (i, (a, b)) in y.iter().zip(&expected).enumerate() {
            let scale = 1e-5 * (k as f32).sqrt().max(1.0);
            assert!(
                (a - b).abs() <= scale * b.abs().max(1.0),
                "m={m} n={n} k={k} entry {i}: kernel {a}, burn {b}"
            );
        }
    }
}

#[test]
fn stored_weights_are_close_to_the_input() {
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    let (n, k) = (37, 101);
    let weights = random(n * k, &mut rng);
    let exact = PackedMatrix::pack(&weights, n, k, WeightFormat::F32).unwrap();
    assert_eq!(exact.dequantize(), weights);
    let bf = PackedMatrix::pack(&weights, n, k, WeightFormat::Bf16)
        .unwrap()
        .dequantize();
    for (a, b) in bf.iter().zip(&weights) {
        assert!((a - b).abs() <= b.abs() / 256.0, "bf16 {a} for {b}");
    }
    let q8 = PackedMatrix::pack(&weights, n, k, WeightFormat::Q8_0)
        .unwrap()
        .dequantize();
    for r in 0..n {
        for block in (0..k).step_by(32) {
            let range = r * k + block..r * k + (block + 32).min(k);
            let amax = weights[range.clone()]
                .iter()
                .fold(0.0f32, |a, w| a.max(w.abs()));
            for i in range {
                // Half a quantization step, plus f32 rounding of the scale product.
                let bound = amax / 127.0 * 0.5 * (1.0 + 1e-5);
                assert!(
                    (q8[i] - weights[i]).abs() <= bound,
                    "q8_0 {} for {} (bound {bound})",
                    q8[i],
                    weights[i]
                );
            }
        }
    }
}

#[test]
fn q4_keeps_four_bit_weights_exactly() {
    let mut rng = ChaCha8Rng::seed_from_u64(5);
    // 101 columns: the last block of each row is padding past column 96.
    let (n, k) = (37, 101);
    let mut weights = four_bit(n, k, &mut rng);
    // Blocks that use fewer levels: only 2..=13 (a span of 11 steps), only even quants (a
    // coarser grid), one value, and all zeros.
    for (i, w) in weights[..32].iter_mut().enumerate() {
        *w = 0.03 * (2 + i % 12) as f32 - 0.5;
    }
    for (i, w) in weights[32..64].iter_mut().enumerate() {
        *w = 0.02 * (2 * (i % 8)) as f32 - 0.1;
    }
    weights[k..k + 32].fill(0.25);
    weights[2 * k..2 * k + 32].fill(0.0);
    let mat = PackedMatrix::pack(&weights, n, k, WeightFormat::Q4).unwrap();
    assert_eq!(mat.format(), WeightFormat::Q4);
    let q8 = PackedMatrix::pack(&weights, n, k, WeightFormat::Q8_0).unwrap();
    // 0.75 bytes a weight against 1.125 (the same padding for both).
    assert_eq!(mat.stored_bytes() * 3, q8.stored_bytes() * 2);
    for (i, (a, b)) in mat.dequantize().iter().zip(&weights).enumerate() {
        assert!(
            (a - b).abs() <= 1e-6 * b.abs().max(1.0),
            "weight {i}: stored {a}, given {b}"
        );
    }
}

#[test]
fn q4_rounds_nothing_and_stores_other_weights_as_q8_0() {
    let mut rng = ChaCha8Rng::seed_from_u64(9);
    let (n, k) = (8, 96);
    let random_weights = random(n * k, &mut rng);
    let mat = PackedMatrix::pack(&random_weights, n, k, WeightFormat::Q4).unwrap();
    assert_eq!(mat.format(), WeightFormat::Q8_0);
    // One block of 4-bit weights with one value between two levels is enough.
    let mut weights = four_bit(n, k, &mut rng);
    weights[5 * k + 40] = (weights[5 * k + 41] + weights[5 * k + 42]) / 2.0 + 1e-3;
    let mat = PackedMatrix::pack(&weights, n, k, WeightFormat::Q4).unwrap();
    assert_eq!(mat.format(), WeightFormat::Q8_0);
    // 32 levels (a 5-bit block) are not 16.
    let mut weights = four_bit(n, k, &mut rng);
    for (i, w) in weights[..32].iter_mut().enumerate() {
        *w = 0.01 * i as f32;
    }
    let mat = PackedMatrix::pack(&weights, n, k, WeightFormat::Q4).unwrap();
    assert_eq!(mat.format(), WeightFormat::Q8_0);
}

/// `q4-a8-lossy` rounds each block that is not 4-bit to 16 levels from its smallest to its
/// largest weight, moving each by at most half a step; blocks already 4-bit stay exact, and
/// the bytes are `q4-a8`'s.
#[test]
fn lossy_four_bits_round_each_block_within_half_a_step() {
    let mut rng = ChaCha8Rng::seed_from_u64(29);
    let (n, k) = (40, 300);
    let weights = random(n * k, &mut rng);
    let lossy = PackedMatrix::pack(&weights, n, k, WeightFormat::Q4A8Lossy).unwrap();
    assert_eq!(lossy.format(), WeightFormat::Q4A8Lossy);
    // `q4-a8` cannot hold these weights and falls back to Q8_0 blocks; the lossy one does not.
    let exact = PackedMatrix::pack(&weights, n, k, WeightFormat::Q4A8).unwrap();
    assert_eq!(exact.format(), WeightFormat::Q8_0A8);
    assert!(lossy.stored_bytes() * 3 <= exact.stored_bytes() * 2);
    let stored = lossy.dequantize();
    let mut moved = 0;
    for (row_w, row_s) in weights.chunks(k).zip(stored.chunks(k)) {
        for (block_w, block_s) in row_w.chunks(32).zip(row_s.chunks(32)) {
            let lo = block_w.iter().copied().fold(f32::INFINITY, f32::min);
            let hi = block_w.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let half_step = (hi - lo) / 30.0;
            for (w, s) in block_w.iter().zip(block_s) {
                assert!(
                    (w - s).abs() <= half_step * (1.0 + 1e-4),
                    "{w} stored as {s}, half a step {half_step}"
                );
                moved += usize::from(w != s);
            }
        }
    }
    assert!(
        moved > n * k / 2,
        "random weights must be rounded: {moved} moved"
    );
    let four = four_bit(n, k, &mut rng);
    let kept = PackedMatrix::pack(&four, n, k, WeightFormat::Q4A8Lossy).unwrap();
    let as_q4 = PackedMatrix::pack(&four, n, k, WeightFormat::Q4A8).unwrap();
    assert_eq!(kept.dequantize(), as_q4.dequantize());
    assert_eq!(kept.stored_bytes(), as_q4.stored_bytes());
}

#[test]
fn rounded_activations_stay_close_and_keep_nan() {
    let mut rng = ChaCha8Rng::seed_from_u64(13);
    let (m, n, k) = (3, 64, 300);
    let x = random(m * k, &mut rng);
    for (exact, rounded) in [
        (WeightFormat::Q8_0, WeightFormat::Q8_0A8),
        (WeightFormat::Q4, WeightFormat::Q4A8),
    ] {
        let weights = weights_for(exact, n, k, &mut rng);
        let f32_x = PackedMatrix::pack(&weights, n, k, exact).unwrap();
        let int8_x = PackedMatrix::pack(&weights, n, k, rounded).unwrap();
        assert_eq!(int8_x.format(), rounded);
        assert_eq!(int8_x.dequantize(), f32_x.dequantize());
        // Each input moves by at most half a step of its block, max |x| / 254.
        let xr = int8_x.rounded_input(&x, m);
        let blocks = |v: &[f32]| -> Vec<Vec<f32>> {
            v.chunks(k)
                .flat_map(|row| row.chunks(32))
                .map(<[f32]>::to_vec)
                .collect()
        };
        for (block_x, block_r) in blocks(&x).into_iter().zip(blocks(&xr)) {
            let amax = block_x.iter().fold(0.0f32, |a, v| a.max(v.abs()));
            for (a, b) in block_x.iter().zip(&block_r) {
                assert!(
                    (a - b).abs() <= amax / 254.0 * (1.0 + 1e-5),
                    "{a} rounded to {b}"
                );
            }
            assert!(block_x != block_r, "{rounded}: x was not rounded");
        }
        let w = f32_x.dequantize();
        let (y_exact, y_rounded) = (f32_x.matmul(&x, m).unwrap(), int8_x.matmul(&x, m).unwrap());
        for i in 0..m {
            for r in 0..n {
                let bound: f32 = (0..k)
                    .map(|c| (x[i * k + c] - xr[i * k + c]).abs() * w[r * k + c].abs())
                    .sum::<f32>()
                    * 1.01
                    + 1e-5;
                let (a, b) = (y_exact[i * n + r], y_rounded[i * n + r]);
                assert!(
                    (a - b).abs() <= bound,
                    "{rounded} y[{i},{r}]: {b} vs {a} (bound {bound})"
                );
            }
        }
        // A NaN input makes its row NaN, not a zero quant.
        let mut bad = x.clone();
        bad[k + 40] = f32::NAN;
        let y = int8_x.matmul(&bad, m).unwrap();
        assert!(
            y[n..2 * n].iter().all(|v| v.is_nan()),
            "{rounded}: NaN lost"
        );
        assert!(y[..n].iter().chain(&y[2 * n..]).all(|v| v.is_finite()));
    }
    assert_eq!("q4-a8".parse::<WeightFormat>().unwrap(), WeightFormat::Q4A8);
    assert_eq!(
        "q4-a8-lossy".parse::<WeightFormat>().unwrap(),
        WeightFormat::Q4A8Lossy
    );
    for format in WeightFormat::ALL {
        assert_eq!(format.name().parse::<WeightFormat>().unwrap(), format);
    }
    assert_eq!(
        "q8_0-a8".parse::<WeightFormat>().unwrap(),
        WeightFormat::Q8_0A8
    );
}

#[test]
fn zero_rows_and_zero_blocks() {
    let (n, k) = (9, 70);
    let mut weights = vec![0.0f32; n * k];
    weights[5 * k + 69] = 2.0;
    let x: Vec<f32> = (0..3 * k).map(|i| i as f32).collect();
    for format in FORMATS {
        let mat = PackedMatrix::pack(&weights, n, k, format).unwrap();
        let y = mat.matmul(&x, 3).unwrap();
        for i in 0..3 {
            for r in 0..n {
                let got = y[i * n + r];
                if r != 5 {
                    assert_eq!(got, 0.0, "{format} y[{i},{r}]");
                } else if format.rounds_activations() {
                    // x rounded to int8: the largest value of a block comes back to f32
                    // rounding.
                    let expected = 2.0 * (i * k + 69) as f32;
                    assert!((got - expected).abs() <= 1e-5 * expected, "{format}: {got}");
                } else {
                    assert_eq!(got, 2.0 * (i * k + 69) as f32, "{format} y[{i},{r}]");
                }
            }
        }
    }
}

#[test]
fn bad_input_is_an_error() {
    assert!(matches!(
        PackedMatrix::pack(&[1.0; 5], 2, 3, WeightFormat::F32),
        Err(KernelError::WeightLength { .. })
    ));
    assert!(matches!(
        PackedMatrix::pack(&[1.0, f32::NAN, 0.0, 0.0], 2, 2, WeightFormat::Q8_0),
        Err(KernelError::NonFinite { row: 0, col: 1, .. })
    ));
    let mat = PackedMatrix::pack(&[1.0; 6], 2, 3, WeightFormat::F32).unwrap();
    assert!(matches!(
        mat.matmul(&[1.0; 5], 2),
        Err(KernelError::InputLength { .. })
    ));
    let mut y = vec![0.0; 3];
    assert!(matches!(
        mat.matmul_into(&[1.0; 6], 2, &mut y),
        Err(KernelError::OutputLength { .. })
    ));
    assert_eq!("Q8".parse::<WeightFormat>().unwrap(), WeightFormat::Q8_0);
    assert_eq!("q4".parse::<WeightFormat>().unwrap(), WeightFormat::Q4);
    assert!("int4".parse::<WeightFormat>().is_err());
}

#[test]
fn simd_path_is_used_where_the_cpu_has_it() {
    #[cfg(target_arch = "x86_64")]
    assert_eq!(
        spec_kernels::simd_available(),
        std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
    );
}

#[test]
fn instruction_set_names_what_the_cpu_has() {
    let named = spec_kernels::instruction_set();
    assert_eq!(
        named == "portable",
        !spec_kernels::simd_available(),
        "{named}"
    );
    #[cfg(target_arch = "x86_64")]
    {
        let avx512 = std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512bw")
            && std::arch::is_x86_feature_detected!("avx512cd")
            && std::arch::is_x86_feature_detected!("avx512dq")
            && std::arch::is_x86_feature_detected!("avx512vl");
        let vnni = std::arch::is_x86_feature_detected!("avx512vnni");
        let expected = if !spec_kernels::simd_available() {
            "portable"
        } else if !avx512 {
            "AVX2 + FMA"
        } else if vnni {
            "AVX-512 with VNNI"
        } else {
            "AVX-512"
        };
        assert_eq!(named, expected);
    }
}
