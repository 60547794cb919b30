//! The product's driver: shape checks, padding `x`, rounding it for the `*A8` formats, and
//! splitting the output rows over the kernels' threads (SwiGLU inside the product included).

use std::ops::Range;
use std::sync::Mutex;

use crate::activations::{Interleave, QuantizedRows};
use crate::error::KernelError;
use crate::team::Team;
use crate::{Exec, Isa, avx2, scalar, tiles};

use super::{PackedMatrix, SPAN_GROUP};

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

/// Below this many stored weights a product runs on the calling thread: splitting costs more
/// than it saves.
const PARALLEL_MIN_WEIGHTS: usize = 1 << 16;

/// From this many weights a product is split into several blocks per thread.
const LARGE_PRODUCT_WEIGHTS: usize = 1 << 22;

impl PackedMatrix {
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
