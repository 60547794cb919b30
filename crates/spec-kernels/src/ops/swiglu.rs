//! SwiGLU, `silu(gate) · up`, of rows laid out `[gate | up]`: on the calling thread for a few
//! values, split over the kernels' threads for many.

use std::sync::Mutex;

use super::lanes::{Lanes, Portable};
use super::simd;
use crate::Isa;

/// SwiGLU of rows laid out `[gate (ff) | up (ff)]`: `silu(gate) · up`, `[rows, ff]`.
pub fn swiglu(gate_up: &[f32], ff: usize) -> Vec<f32> {
    swiglu_with(gate_up, ff, Isa::Auto)
}

/// [`swiglu`] on the instruction set `isa`. From 4096 outputs (a verification's or a prompt's
/// rows) the values are split over the kernels' threads.
pub fn swiglu_with(gate_up: &[f32], ff: usize, isa: Isa) -> Vec<f32> {
    let rows = if ff == 0 { 0 } else { gate_up.len() / (2 * ff) };
    let mut out = vec![0.0f32; rows * ff];
    if rows == 0 {
        return out;
    }
    let simd = isa != Isa::Scalar && crate::avx2::available();
    let parts = if out.len() >= PARALLEL_SWIGLU_VALUES {
        crate::team::Team::get().threads()
    } else {
        1
    };
    if parts <= 1 {
        silu_mul_values(gate_up, ff, 0, &mut out, simd);
        return out;
    }
    let bounds = swiglu_bounds(rows, ff, parts);
    let mut slots = Vec::with_capacity(parts);
    let mut rest = out.as_mut_slice();
    for pair in bounds.windows(2) {
        let (part, tail) = rest.split_at_mut(pair[1] - pair[0]);
        slots.push(Mutex::new(part));
        rest = tail;
    }
    crate::run_parts(parts, &|p| {
        if let Ok(mut part) = slots[p].lock() {
            silu_mul_values(gate_up, ff, bounds[p], &mut part, simd);
        }
    });
    drop(slots);
    out
}

/// Below this many output values SwiGLU runs on the calling thread. Split over the two threads
/// of a Zen 5 (`cargo bench -p spec-kernels --bench ops -- swiglu`): the 1.5B's one row (8960
/// values) 3.9 → 2.5 µs, nine rows 36 → 20 µs, SmolLM2's nine rows (13824) 6.2 → 3.8 µs;
/// SmolLM2's one row (1536, 0.7 µs) is left alone (d5f914f; docs/notes/cpu-kernels.md, "The
/// rest of a layer step"). The public docs of [`swiglu_with`] name the value.
const PARALLEL_SWIGLU_VALUES: usize = 1 << 12;

/// `parts + 1` increasing offsets into SwiGLU's `[rows, ff]` output that split it into about
/// equal parts, each inside a row at a multiple of 8 values, so that no part starts with a
/// partial vector. (A value's bits do not depend on where it sits: the SIMD loop's tail runs
/// the same operations lane 0 alone.)
fn swiglu_bounds(rows: usize, ff: usize, parts: usize) -> Vec<usize> {
    let total = rows * ff;
    (0..=parts)
        .map(|p| {
            let at = total * p / parts;
            if at == total {
                total
            } else {
                at / ff * ff + at % ff / 8 * 8
            }
        })
        .collect()
}

/// `out` = SwiGLU of the values from `start` of the `[rows, ff]` output (`out.len()` of them),
/// row by row, each row's piece `silu(gate) · up` of its columns.
fn silu_mul_values(gate_up: &[f32], ff: usize, start: usize, out: &mut [f32], simd: bool) {
    let mut at = start;
    let mut done = 0;
    while done < out.len() {
        let (row, col) = (at / ff, at % ff);
        let len = (ff - col).min(out.len() - done);
        let gate = &gate_up[row * 2 * ff + col..row * 2 * ff + col + len];
        let up = &gate_up[row * 2 * ff + ff + col..row * 2 * ff + ff + col + len];
        silu_mul(gate, up, &mut out[done..done + len], simd);
        at += len;
        done += len;
    }
}

/// `out = silu(gate) · up`, in SIMD where `simd`.
pub(crate) fn silu_mul(gate: &[f32], up: &[f32], out: &mut [f32], simd: bool) {
    if simd {
        simd::silu_mul_simd(gate, up, out);
    } else {
        Portable.silu_mul(gate, up, out);
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_inputs::{ISAS, values};
    use super::*;

    #[test]
    fn swiglu_split_over_threads_gives_each_rows_own_bits() {
        // 1100 values a row, 15 rows: past the threshold, so split over the team wherever it
        // has two threads or more (two parts meet inside row 7).
        let ff = 1100;
        let rows = 15;
        assert!(rows * ff >= PARALLEL_SWIGLU_VALUES && ff < PARALLEL_SWIGLU_VALUES);
        let gate_up: Vec<f32> = values(rows * 2 * ff, 9).iter().map(|v| v * 12.0).collect();
        for isa in ISAS {
            let all = swiglu_with(&gate_up, ff, isa);
            for (r, row) in gate_up.chunks_exact(2 * ff).enumerate() {
                let alone = swiglu_with(row, ff, isa);
                let got = &all[r * ff..(r + 1) * ff];
                let same = got
                    .iter()
                    .zip(&alone)
                    .all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(same, "{isa:?}: row {r} differs from its one-row call");
            }
        }
    }

    #[test]
    fn swiglu_bounds_split_rows_at_multiples_of_8() {
        for (rows, ff, parts) in [
            (1, 8960, 2),
            (9, 8960, 2),
            (5, 1100, 3),
            (3, 7, 4),
            (2, 64, 16),
        ] {
            let b = swiglu_bounds(rows, ff, parts);
            assert_eq!(b.len(), parts + 1);
            assert_eq!((b[0], b[parts]), (0, rows * ff));
            assert!(b.windows(2).all(|w| w[0] <= w[1]), "{b:?}");
            assert!(
                b.iter().all(|&at| at == rows * ff || at % ff % 8 == 0),
                "{b:?}"
            );
            // About equal: no part more than a row's 8 values over its share.
            let share = rows * ff / parts;
            assert!(b.windows(2).all(|w| w[1] - w[0] <= share + 8), "{b:?}");
        }
    }

    #[test]
    fn swiglu_matches_the_f64_reference() {
        let ff = 77;
        let mut gate_up = values(3 * 2 * ff, 8);
        for v in &mut gate_up {
            *v *= 12.0;
        }
        // Saturated and overflowing gates, and a NaN.
        gate_up[0] = -100.0;
        gate_up[1] = 100.0;
        gate_up[2] = -90.0;
        gate_up[5] = f32::NAN;
        for isa in ISAS {
            let got = swiglu_with(&gate_up, ff, isa);
            assert_eq!(got.len(), 3 * ff);
            for (r, row) in gate_up.chunks_exact(2 * ff).enumerate() {
                for c in 0..ff {
                    let (g, u) = (row[c] as f64, row[ff + c] as f64);
                    let want = g / (1.0 + (-g).exp()) * u;
                    let got = got[r * ff + c] as f64;
                    if want.is_nan() {
                        assert!(got.is_nan(), "{isa:?} [{r}, {c}]: {got}");
                    } else {
                        assert!(
                            (got - want).abs() <= 1e-6 * (1.0 + want.abs()),
                            "{isa:?} [{r}, {c}]: {got} vs {want}"
                        );
                    }
                }
            }
        }
    }
}
