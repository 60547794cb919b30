//! The rest of a decoder layer's host step besides the products: attention over a KV cache and
//! SwiGLU, with AVX2 + FMA (detected at run time, as for the products) or portable loops.
//!
//! Written as plain loops these cost as much as a product: SmolLM2's attention over 65–96
//! positions took 34–36 µs a layer and its SwiGLU 8–10 µs (one libm `expf` call per value),
//! against 23–38 µs for its output projection (docs/benchmarks.md, eleventh session).
//!
//! What a row computes does not depend on the other rows of the step or on masked positions:
//! scores are independent dot products, a masked score (−∞) weighs exactly 0 and is skipped,
//! and the softmax denominator is summed in position order. So on one machine a verification
//! row, a tree path and a single decode step give the same bits, which greedy speculative
//! decoding relies on at near-ties.

use std::ops::Range;
use std::sync::Mutex;

use crate::{Isa, KernelError};

/// Below this many multiply-adds, attention runs on the calling thread.
const PARALLEL_ATTENTION_WORK: usize = 1 << 16;

/// The shapes of one [`attention`] call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttentionShape {
    /// New tokens: rows of `q` and of the output.
    pub rows: usize,
    /// Query heads; a multiple of `kv_heads` (grouped-query attention).
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    /// Positions each kv head has room for in `keys` and `values`.
    pub capacity: usize,
    /// Positions attended: the cached ones and the new rows' own.
    pub total: usize,
}

/// Scaled dot-product attention, `softmax(q kᵀ / √d + bias) v` per head.
///
/// - `q`: row `i`'s heads start at `i · q_stride` (`heads · head_dim` values, head-major);
/// - `keys`, `values`: `[kv_heads, capacity, head_dim]`, the first `total` positions filled;
/// - `bias`: `[rows, total]`, added to the scores: 0 where a row may attend, −∞ elsewhere.
///
/// Returns `[rows, heads · head_dim]`.
pub fn attention(
    q: &[f32],
    q_stride: usize,
    keys: &[f32],
    values: &[f32],
    shape: AttentionShape,
    bias: &[f32],
) -> Result<Vec<f32>, KernelError> {
    attention_with(q, q_stride, keys, values, shape, bias, Isa::Auto)
}

/// [`attention`] on the instruction set `isa`.
pub fn attention_with(
    q: &[f32],
    q_stride: usize,
    keys: &[f32],
    values: &[f32],
    s: AttentionShape,
    bias: &[f32],
    isa: Isa,
) -> Result<Vec<f32>, KernelError> {
    let d = s.head_dim;
    let bad = |what: &str| Err(KernelError::AttentionShape(format!("{what} for {s:?}")));
    if s.kv_heads == 0 || !s.heads.is_multiple_of(s.kv_heads) {
        return bad("heads not a multiple of kv heads");
    }
    if s.total > s.capacity {
        return bad("more positions than the cache holds");
    }
    if s.rows > 0 && (q_stride < s.heads * d || q.len() < (s.rows - 1) * q_stride + s.heads * d) {
        return bad(&format!(
            "{} query values at a stride of {q_stride}",
            q.len()
        ));
    }
    let cache_len = s.kv_heads * s.capacity * d;
    if keys.len() != cache_len || values.len() != cache_len {
        return bad(&format!("{} keys and {} values", keys.len(), values.len()));
    }
    if bias.len() != s.rows * s.total {
        return bad(&format!("a bias of {} entries", bias.len()));
    }
    if s.rows == 0 || d == 0 || s.heads == 0 {
        return Ok(vec![0.0; s.rows * s.heads * d]);
    }
    let inputs = Inputs {
        q,
        q_stride,
        keys,
        values,
        s,
        bias,
    };
    let simd = isa != Isa::Scalar && crate::avx2::available();
    // AVX-512 pairs two (head, row) pairs in one register where the caller did not ask for
    // AVX2 alone: the same bits as AVX2 (see `simd_imp::Wide`).
    let wide = isa == Isa::Auto;
    // Query heads that share a kv head run in one part, which keeps that head's keys and values
    // in cache; groups are split so that two threads get at least four parts.
    let group = s.heads / s.kv_heads;
    let splits = 4usize.div_ceil(s.kv_heads).min(group);
    let per_part = group.div_ceil(splits);
    let parts: Vec<Range<usize>> = (0..s.kv_heads)
        .flat_map(|kv| {
            (kv * group..(kv + 1) * group)
                .step_by(per_part)
                .map(move |h| h..(h + per_part).min((kv + 1) * group))
        })
        .collect();
    let part = |heads: Range<usize>| -> Vec<f32> {
        let mut out = vec![0.0f32; heads.len() * s.rows * d];
        if simd {
            simd_imp::attend_heads_simd(&inputs, heads, &mut out, wide);
        } else {
            attend_heads(Portable, &inputs, heads, &mut out);
        }
        out
    };
    let per_part: Vec<Vec<f32>> = if s.rows * s.total * s.heads * d >= PARALLEL_ATTENTION_WORK {
        let slots: Vec<Mutex<Vec<f32>>> = parts.iter().map(|_| Mutex::default()).collect();
        crate::run_parts(parts.len(), &|p| {
            let out = part(parts[p].clone());
            if let Ok(mut slot) = slots[p].lock() {
                *slot = out;
            }
        });
        slots
            .into_iter()
            .map(|slot| slot.into_inner().unwrap_or_default())
            .collect()
    } else {
        parts.iter().cloned().map(part).collect()
    };
    // Each part is [heads, rows, d]; the output [rows, heads · d].
    let mut out = vec![0.0f32; s.rows * s.heads * d];
    for (heads, values) in parts.iter().zip(&per_part) {
        for (k, head_rows) in values.chunks_exact(s.rows * d).enumerate() {
            for (i, row) in head_rows.chunks_exact(d).enumerate() {
                let at = (i * s.heads + heads.start + k) * d;
                out[at..at + d].copy_from_slice(row);
            }
        }
    }
    Ok(out)
}

/// `a · b` in eight lanes (lane `l` sums elements `l`, `l + 8`, …; the lanes, then the tail
/// past the last multiple of 8, are added in order): plain Rust, the same bits on every CPU.
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut lanes = [0.0f32; 8];
    let whole = a.len().min(b.len()) / 8 * 8;
    for (x, y) in a[..whole].chunks_exact(8).zip(b[..whole].chunks_exact(8)) {
        for l in 0..8 {
            lanes[l] += x[l] * y[l];
        }
    }
    let tail: f32 = a[whole..].iter().zip(&b[whole..]).map(|(x, y)| x * y).sum();
    lanes.iter().sum::<f32>() + tail
}

/// SwiGLU of rows laid out `[gate (ff) | up (ff)]`: `silu(gate) · up`, `[rows, ff]`.
pub fn swiglu(gate_up: &[f32], ff: usize) -> Vec<f32> {
    swiglu_with(gate_up, ff, Isa::Auto)
}

/// [`swiglu`] on the instruction set `isa`. From [`PARALLEL_SWIGLU_VALUES`] outputs (a
/// verification's or a prompt's rows) the values are split over the kernels' threads.
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
/// SmolLM2's one row (1536, 0.7 µs) is left alone.
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
        simd_imp::silu_mul_simd(gate, up, out);
    } else {
        Portable.silu_mul(gate, up, out);
    }
}

/// What every head of one attention call reads.
struct Inputs<'a> {
    q: &'a [f32],
    q_stride: usize,
    keys: &'a [f32],
    values: &'a [f32],
    s: AttentionShape,
    bias: &'a [f32],
}

/// The vector operations attention is made of, per instruction set.
trait Lanes: Copy {
    /// `out[j] = q · keys[j]` for the `out.len()` keys of `keys` (`[_, d]`).
    fn scores(self, q: &[f32], keys: &[f32], d: usize, out: &mut [f32]);
    /// `row[j] = row[j] · scale + bias[j]`, then the largest of them (NaNs ignored, as
    /// `f32::max` does; a zero's sign is immaterial to the shift it becomes).
    fn scale_bias_max(self, row: &mut [f32], bias: &[f32], scale: f32) -> f32;
    /// `xs[j] = e^(xs[j] − shift)`.
    fn exp_shifted(self, xs: &mut [f32], shift: f32);
    /// `out += Σ_j weights[j] · values[j]` in position order, skipping zero weights (masked
    /// positions), over the `weights.len()` rows of `values` (`[_, d]`).
    fn weighted_sum(self, weights: &[f32], values: &[f32], d: usize, out: &mut [f32]);
    /// [`Lanes::scores`] of two queries against the same keys, each bit for bit as alone.
    // Inlined like every method here: a default method is compiled once, without the target
    // features of the `vectorize` call it serves, and its intrinsics would become calls.
    #[inline(always)]
    fn scores_pair(self, q: [&[f32]; 2], keys: &[f32], d: usize, out: [&mut [f32]; 2]) {
        scores_each(self, q, keys, d, out);
    }
    /// [`Lanes::weighted_sum`] of two rows of weights over the same values, each bit for bit as
    /// alone.
    #[inline(always)]
    fn weighted_sum_pair(
        self,
        weights: [&[f32]; 2],
        values: &[f32],
        d: usize,
        out: [&mut [f32]; 2],
    ) {
        weighted_sum_each(self, weights, values, d, out);
    }
    /// `out = silu(gate) · up`.
    fn silu_mul(self, gate: &[f32], up: &[f32], out: &mut [f32]);
}

/// [`Lanes::scores_pair`] as two [`Lanes::scores`]: the default, and where a pairing does not
/// apply.
#[inline(always)]
fn scores_each<L: Lanes>(lanes: L, q: [&[f32]; 2], keys: &[f32], d: usize, out: [&mut [f32]; 2]) {
    let [out_a, out_b] = out;
    lanes.scores(q[0], keys, d, out_a);
    lanes.scores(q[1], keys, d, out_b);
}

/// [`Lanes::weighted_sum_pair`] as two [`Lanes::weighted_sum`]: the default, and where a
/// pairing does not apply.
#[inline(always)]
fn weighted_sum_each<L: Lanes>(
    lanes: L,
    weights: [&[f32]; 2],
    values: &[f32],
    d: usize,
    out: [&mut [f32]; 2],
) {
    let [out_a, out_b] = out;
    lanes.weighted_sum(weights[0], values, d, out_a);
    lanes.weighted_sum(weights[1], values, d, out_b);
}

/// Bytes of keys (or values) one block of positions holds: every query of a part reads the
/// block while it is in L1, so a long context comes from L2 or L3 once a part rather than once
/// a (head, row) pair.
const KV_BLOCK_BYTES: usize = 16 * 1024;

/// Positions in one block of [`KV_BLOCK_BYTES`] for head dimension `d`: a multiple of 8, the
/// SIMD scores' own block of keys, so that no block but the last leaves keys over.
fn kv_block_positions(d: usize) -> usize {
    (KV_BLOCK_BYTES / (4 * d.max(1)) / 8 * 8).max(8)
}

/// The blocks of `block` positions that cover `0..total`; a remainder of fewer than 8 joins the
/// block before it, so that the SIMD scores never pad a block of keys with zeros (which
/// allocates) unless the whole context has fewer than 8 positions.
fn kv_blocks(total: usize, block: usize) -> impl Iterator<Item = Range<usize>> {
    let mut start = 0;
    std::iter::from_fn(move || {
        if start >= total {
            return None;
        }
        let end = if total - start < block + 8 {
            total
        } else {
            start + block
        };
        let range = start..end;
        start = end;
        Some(range)
    })
}

/// Query heads `heads` (sharing one kv head) of every row into `out` `[heads, rows, head_dim]`
/// (zeroed). Keys and values are walked a block of positions at a time, each block serving
/// every (head, row) pair before the next is read. Each pair's arithmetic is the same, in the
/// same order, as when it runs alone: a score depends only on its query and key, and the
/// weighted sum accumulates into `out` position by position across blocks.
#[inline(always)]
fn attend_heads<L: Lanes>(lanes: L, x: &Inputs<'_>, heads: Range<usize>, out: &mut [f32]) {
    let s = x.s;
    let (d, n, total) = (s.head_dim, s.rows, s.total);
    if total == 0 {
        // Nothing to attend: the output stays zero.
        return;
    }
    let kv = heads.start / (s.heads / s.kv_heads);
    let keys = &x.keys[kv * s.capacity * d..(kv * s.capacity + total) * d];
    let values = &x.values[kv * s.capacity * d..(kv * s.capacity + total) * d];
    let scale = 1.0 / (d as f32).sqrt();
    let block = kv_block_positions(d);
    // Pair p = (head k, row i), k = p / n, i = p % n, writes `out`'s row p.
    let pairs = out.len() / d.max(1);
    let query = |p: usize| {
        let at = (p % n) * x.q_stride + (heads.start + p / n) * d;
        &x.q[at..at + d]
    };
    let mut scores = vec![0.0f32; pairs * total];
    for Range { start, end } in kv_blocks(total, block) {
        let block_keys = &keys[start * d..end * d];
        // Two pairs at a time where there are two (a wider instruction set serves both with
        // one multiply-add); a pair's own arithmetic is the same either way.
        let mut rows = scores.chunks_exact_mut(total);
        let mut p = 0;
        while let Some(a) = rows.next() {
            match rows.next() {
                Some(b) => {
                    let (qa, qb) = (query(p), query(p + 1));
                    let out = [&mut a[start..end], &mut b[start..end]];
                    lanes.scores_pair([qa, qb], block_keys, d, out);
                    p += 2;
                }
                None => {
                    lanes.scores(query(p), block_keys, d, &mut a[start..end]);
                    p += 1;
                }
            }
        }
    }
    for (p, row) in scores.chunks_exact_mut(total).enumerate() {
        let bias = &x.bias[(p % n) * total..(p % n + 1) * total];
        let max = lanes.scale_bias_max(row, bias, scale);
        lanes.exp_shifted(row, max);
    }
    let sums = position_order_sums(&scores, total);
    for (row, sum) in scores.chunks_exact_mut(total).zip(sums) {
        let inv = 1.0 / sum;
        for w in row.iter_mut() {
            *w *= inv;
        }
    }
    for Range { start, end } in kv_blocks(total, block) {
        let block_values = &values[start * d..end * d];
        let mut weights = scores.chunks_exact(total);
        let mut outs = out.chunks_exact_mut(d);
        while let (Some(wa), Some(oa)) = (weights.next(), outs.next()) {
            match (weights.next(), outs.next()) {
                (Some(wb), Some(ob)) => {
                    let pair = [&wa[start..end], &wb[start..end]];
                    lanes.weighted_sum_pair(pair, block_values, d, [oa, ob]);
                }
                _ => lanes.weighted_sum(&wa[start..end], block_values, d, oa),
            }
        }
    }
}

/// The sum of each row of `rows` (`[_, total]`), in position order, so that masked positions
/// (exact zeros) change nothing; four rows at a time, whose sums are independent chains of
/// additions (one row's chain alone waits on each addition).
fn position_order_sums(rows: &[f32], total: usize) -> Vec<f32> {
    let mut sums = Vec::with_capacity(rows.len() / total.max(1));
    if total == 0 {
        return sums;
    }
    let mut groups = rows.chunks_exact(4 * total);
    for group in &mut groups {
        let (r0, rest) = group.split_at(total);
        let (r1, rest) = rest.split_at(total);
        let (r2, r3) = rest.split_at(total);
        let mut s = [0.0f32; 4];
        for j in 0..total {
            s[0] += r0[j];
            s[1] += r1[j];
            s[2] += r2[j];
            s[3] += r3[j];
        }
        sums.extend(s);
    }
    for row in groups.remainder().chunks_exact(total) {
        let mut s = 0.0f32;
        for &v in row {
            s += v;
        }
        sums.push(s);
    }
    sums
}

/// Plain loops, for any CPU.
#[derive(Clone, Copy)]
struct Portable;

impl Lanes for Portable {
    fn scale_bias_max(self, row: &mut [f32], bias: &[f32], scale: f32) -> f32 {
        let mut max = f32::NEG_INFINITY;
        for (score, &b) in row.iter_mut().zip(bias) {
            *score = *score * scale + b;
            max = max.max(*score);
        }
        max
    }

    fn scores(self, q: &[f32], keys: &[f32], d: usize, out: &mut [f32]) {
        for (score, key) in out.iter_mut().zip(keys.chunks_exact(d)) {
            *score = dot(q, key);
        }
    }

    fn exp_shifted(self, xs: &mut [f32], shift: f32) {
        for x in xs {
            *x = (*x - shift).exp();
        }
    }

    fn weighted_sum(self, weights: &[f32], values: &[f32], d: usize, out: &mut [f32]) {
        for (&w, value) in weights.iter().zip(values.chunks_exact(d)) {
            if w != 0.0 {
                for (o, &v) in out.iter_mut().zip(value) {
                    *o += w * v;
                }
            }
        }
    }

    fn silu_mul(self, gate: &[f32], up: &[f32], out: &mut [f32]) {
        for ((o, &g), &u) in out.iter_mut().zip(gate).zip(up) {
            *o = g / (1.0 + (-g).exp()) * u;
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod simd_imp {
    use core::arch::x86_64::__m512;
    use pulp::bytemuck::{cast_slice, cast_slice_mut};
    use pulp::core_arch::x86::Avx512f;
    use pulp::x86::{V3, V4};
    use pulp::{NullaryFnOnce, cast, f32x8, i32x8};

    use std::ops::Range;

    use super::{Inputs, Lanes, Portable, attend_heads, scores_each, weighted_sum_each};
    use crate::avx2::{pair_halves, split_halves};

    /// `ln 2` split so that `n · LN2_HI` is exact for the `n` [`exp`] meets.
    const LN2_HI: f32 = 0.693_145_75;
    const LN2_LO: f32 = 1.428_606_8e-6;
    /// Below this `e^x` is 0 in f32 (`e^−103.97` is half the smallest subnormal).
    const EXP_ZERO_BELOW: f32 = -104.0;
    /// Above this `e^x` overflows to +∞ (`ln f32::MAX` is 88.72).
    const EXP_CLAMP_ABOVE: f32 = 89.0;

    /// `e^x` lane by lane within 2 ulp: `x = n ln 2 + r` with `|r| ≤ ln 2 / 2`, `e^r` by its
    /// Taylor polynomial to degree 7 (truncation error `r⁸/8! < 6e-9`), times `2^n` applied as
    /// two factors so that subnormal and overflowing results come out as IEEE rounding gives
    /// them. −∞ gives 0, +∞ gives +∞, NaN stays NaN.
    #[inline(always)]
    pub(super) fn exp(simd: V3, x: f32x8) -> f32x8 {
        let lo = simd.splat_f32x8(EXP_ZERO_BELOW);
        let clamped = simd.min_f32x8(simd.max_f32x8(x, lo), simd.splat_f32x8(EXP_CLAMP_ABOVE));
        let n =
            simd.round_f32x8(simd.mul_f32x8(clamped, simd.splat_f32x8(std::f32::consts::LOG2_E)));
        let r = simd.negate_mul_add_f32x8(n, simd.splat_f32x8(LN2_HI), clamped);
        let r = simd.negate_mul_add_f32x8(n, simd.splat_f32x8(LN2_LO), r);
        let mut p = simd.splat_f32x8(1.0 / 5040.0);
        for c in [
            1.0 / 720.0,
            1.0 / 120.0,
            1.0 / 24.0,
            1.0 / 6.0,
            0.5,
            1.0,
            1.0,
        ] {
            p = simd.mul_add_f32x8(p, r, simd.splat_f32x8(c));
        }
        let n: i32x8 = simd.convert_f32x8_to_i32x8(n);
        let half: i32x8 = cast(simd.avx2._mm256_srai_epi32::<1>(cast(n)));
        let rest: i32x8 = cast(simd.avx2._mm256_sub_epi32(cast(n), cast(half)));
        let y = simd.mul_f32x8(simd.mul_f32x8(p, two_to(simd, half)), two_to(simd, rest));
        let y = simd.select_f32x8(simd.cmp_lt_f32x8(x, lo), simd.splat_f32x8(0.0), y);
        simd.select_f32x8(simd.is_nan_f32x8(x), x, y)
    }

    /// `2^e` lane by lane for `−126 ≤ e ≤ 127`. (No closures in this module: a closure does
    /// not inherit the target features `vectorize` enables, and its intrinsics become calls.)
    #[inline(always)]
    fn two_to(simd: V3, e: i32x8) -> f32x8 {
        let biased = simd
            .avx2
            ._mm256_add_epi32(cast(e), cast(simd.splat_i32x8(127)));
        cast(simd.avx2._mm256_slli_epi32::<23>(biased))
    }

    /// `q · k_l` for the 8 keys `k` (`[8, q.len()]` vectors), lane `l`. Each key's 8 lane sums
    /// are reduced in the same order ((0+1)+(2+3)) + ((4+5)+(6+7)), whichever lane it takes.
    #[inline(always)]
    fn dot8(simd: V3, q: &[f32x8], k: &[f32x8]) -> f32x8 {
        let nv = q.len();
        // Eight independent multiply-add chains in registers; slices of length `nv` so that
        // indexing by `c < nv` needs no bounds checks.
        let key = |l: usize| &k[l * nv..(l + 1) * nv];
        let (k0, k1, k2, k3) = (key(0), key(1), key(2), key(3));
        let (k4, k5, k6, k7) = (key(4), key(5), key(6), key(7));
        let mut acc = [simd.splat_f32x8(0.0); 8];
        for (c, &qc) in q.iter().enumerate() {
            acc[0] = simd.mul_add_f32x8(qc, k0[c], acc[0]);
            acc[1] = simd.mul_add_f32x8(qc, k1[c], acc[1]);
            acc[2] = simd.mul_add_f32x8(qc, k2[c], acc[2]);
            acc[3] = simd.mul_add_f32x8(qc, k3[c], acc[3]);
            acc[4] = simd.mul_add_f32x8(qc, k4[c], acc[4]);
            acc[5] = simd.mul_add_f32x8(qc, k5[c], acc[5]);
            acc[6] = simd.mul_add_f32x8(qc, k6[c], acc[6]);
            acc[7] = simd.mul_add_f32x8(qc, k7[c], acc[7]);
        }
        reduce8(simd, acc)
    }

    /// Lane `l` of the result: the sum of `acc[l]`'s 8 lanes, in the order
    /// ((0+1)+(2+3)) + ((4+5)+(6+7)).
    #[inline(always)]
    fn reduce8(simd: V3, acc: [f32x8; 8]) -> f32x8 {
        let pairs = [
            hadd(simd, acc[0], acc[1]),
            hadd(simd, acc[2], acc[3]),
            hadd(simd, acc[4], acc[5]),
            hadd(simd, acc[6], acc[7]),
        ];
        let (low, high) = (
            hadd(simd, pairs[0], pairs[1]),
            hadd(simd, pairs[2], pairs[3]),
        );
        let lower = simd
            .avx
            ._mm256_permute2f128_ps::<0x20>(cast(low), cast(high));
        let upper = simd
            .avx
            ._mm256_permute2f128_ps::<0x31>(cast(low), cast(high));
        simd.add_f32x8(cast(lower), cast(upper))
    }

    /// Sums of neighbouring lanes: `[a0+a1, a2+a3, b0+b1, b2+b3]` in each 128-bit half.
    #[inline(always)]
    fn hadd(simd: V3, a: f32x8, b: f32x8) -> f32x8 {
        cast(simd.avx._mm256_hadd_ps(cast(a), cast(b)))
    }

    impl Lanes for V3 {
        #[inline(always)]
        fn scores(self, q: &[f32], keys: &[f32], d: usize, out: &mut [f32]) {
            if !d.is_multiple_of(8) || d == 0 {
                return Portable.scores(q, keys, d, out);
            }
            let q: &[f32x8] = cast_slice(q);
            let total = out.len();
            let whole = total / 8 * 8;
            for (block, out) in keys[..whole * d]
                .chunks_exact(8 * d)
                .zip(out[..whole].chunks_exact_mut(8))
            {
                let s: [f32; 8] = cast(dot8(self, q, cast_slice(block)));
                out.copy_from_slice(&s);
            }
            if whole < total && total >= 8 {
                // The last 8 keys again: a key's score does not depend on its slot, so the ones
                // already computed come out the same.
                let start = total - 8;
                let s: [f32; 8] = cast(dot8(self, q, cast_slice(&keys[start * d..total * d])));
                out[start..].copy_from_slice(&s);
            } else if whole < total {
                // Fewer than 8 keys: zero keys after them, through the same reduction.
                let mut block = vec![0.0f32; 8 * d];
                block[..total * d].copy_from_slice(&keys[..total * d]);
                let s: [f32; 8] = cast(dot8(self, q, cast_slice(&block)));
                out.copy_from_slice(&s[..total]);
            }
        }

        #[inline(always)]
        fn scale_bias_max(self, row: &mut [f32], bias: &[f32], scale: f32) -> f32 {
            let len = row.len().min(bias.len());
            let whole = len / 8 * 8;
            let (head, tail) = row[..len].split_at_mut(whole);
            let (bias_head, bias_tail) = bias[..len].split_at(whole);
            let scale_v = self.splat_f32x8(scale);
            let mut max_v = self.splat_f32x8(f32::NEG_INFINITY);
            for (v, &b) in cast_slice_mut::<f32, f32x8>(head)
                .iter_mut()
                .zip(cast_slice::<f32, f32x8>(bias_head))
            {
                // A multiplication, then an addition: the scalar loop's two roundings.
                *v = self.add_f32x8(self.mul_f32x8(*v, scale_v), b);
                // `vmaxps` returns its second operand where either is NaN: a NaN score is
                // passed over, as `f32::max` passes it over.
                max_v = cast(self.avx._mm256_max_ps(cast(*v), cast(max_v)));
            }
            let mut max = Portable.scale_bias_max(tail, bias_tail, scale);
            for m in cast::<f32x8, [f32; 8]>(max_v) {
                max = max.max(m);
            }
            max
        }

        #[inline(always)]
        fn exp_shifted(self, xs: &mut [f32], shift: f32) {
            let shift = self.splat_f32x8(shift);
            let whole = xs.len() / 8 * 8;
            let (head, tail) = xs.split_at_mut(whole);
            for v in cast_slice_mut::<f32, f32x8>(head) {
                *v = exp(self, self.sub_f32x8(*v, shift));
            }
            if !tail.is_empty() {
                let mut buf = [0.0f32; 8];
                buf[..tail.len()].copy_from_slice(tail);
                let y: [f32; 8] = cast(exp(self, self.sub_f32x8(cast(buf), shift)));
                tail.copy_from_slice(&y[..tail.len()]);
            }
        }

        #[inline(always)]
        fn weighted_sum(self, weights: &[f32], values: &[f32], d: usize, out: &mut [f32]) {
            if !d.is_multiple_of(8) || d == 0 {
                return Portable.weighted_sum(weights, values, d, out);
            }
            let nv = d / 8;
            let values: &[f32x8] = cast_slice(values);
            let out: &mut [f32x8] = cast_slice_mut(out);
            // Eight vectors of the output at a time stay in registers over all positions; the
            // same multiply-adds in the same order as one vector at a time.
            let mut start = 0;
            while start < nv {
                let width = (nv - start).min(8);
                let mut acc = [self.splat_f32x8(0.0); 8];
                acc[..width].copy_from_slice(&out[start..start + width]);
                for (&w, value) in weights.iter().zip(values.chunks_exact(nv)) {
                    if w != 0.0 {
                        let w = self.splat_f32x8(w);
                        if width == 8 {
                            for (acc, &v) in acc.iter_mut().zip(&value[start..start + 8]) {
                                *acc = self.mul_add_f32x8(w, v, *acc);
                            }
                        } else {
                            for (acc, &v) in acc.iter_mut().zip(&value[start..start + width]) {
                                *acc = self.mul_add_f32x8(w, v, *acc);
                            }
                        }
                    }
                }
                out[start..start + width].copy_from_slice(&acc[..width]);
                start += width;
            }
        }

        #[inline(always)]
        fn silu_mul(self, gate: &[f32], up: &[f32], out: &mut [f32]) {
            let whole = out.len().min(gate.len()).min(up.len()) / 8 * 8;
            let one = self.splat_f32x8(1.0);
            let gates: &[f32x8] = cast_slice(&gate[..whole]);
            let ups: &[f32x8] = cast_slice(&up[..whole]);
            let (outs, out_tail) = out.split_at_mut(whole);
            for ((o, &g), &u) in cast_slice_mut::<f32, f32x8>(outs)
                .iter_mut()
                .zip(gates)
                .zip(ups)
            {
                let e = exp(self, self.sub_f32x8(self.splat_f32x8(0.0), g));
                *o = self.div_f32x8(self.mul_f32x8(g, u), self.add_f32x8(one, e));
            }
            for ((o, &g), &u) in out_tail.iter_mut().zip(&gate[whole..]).zip(&up[whole..]) {
                let e: [f32; 8] = cast(exp(self, self.splat_f32x8(-g)));
                *o = g * u / (1.0 + e[0]);
            }
        }
    }

    /// AVX-512's 16 lanes as two 8-lane halves: two (head, row) pairs at once, each half doing
    /// lane for lane what [`V3`] does for one pair (same operands, same order, so the same
    /// bits); a lone pair and anything else goes to [`V3`].
    #[derive(Clone, Copy)]
    struct Wide(V4);

    impl Wide {
        /// `a` in lanes 0-7, `b` in 8-15.
        #[inline(always)]
        fn halves(self, a: f32x8, b: f32x8) -> __m512 {
            pair_halves(self.0, a, b)
        }

        /// [`Wide::halves`] undone.
        #[inline(always)]
        fn split(self, v: __m512) -> (f32x8, f32x8) {
            split_halves(self.0, v)
        }

        /// [`dot8`] of two queries against the same 8 keys: each key's 8-lane vector broadcast
        /// to both halves, each half accumulating as [`dot8`] does, then the same reduction.
        #[inline(always)]
        fn dot8_pair(self, qa: &[f32x8], qb: &[f32x8], k: &[f32x8]) -> (f32x8, f32x8) {
            // No closures here: a closure does not inherit `vectorize`'s target features.
            let (f, dq) = (self.0.avx512f, self.0.avx512dq);
            let nv = qa.len().min(qb.len());
            let (k0, k1, k2, k3) = (
                &k[..nv],
                &k[nv..2 * nv],
                &k[2 * nv..3 * nv],
                &k[3 * nv..4 * nv],
            );
            let (k4, k5, k6, k7) = (
                &k[4 * nv..5 * nv],
                &k[5 * nv..6 * nv],
                &k[6 * nv..7 * nv],
                &k[7 * nv..8 * nv],
            );
            let mut acc = [f._mm512_setzero_ps(); 8];
            for c in 0..nv {
                let q = self.halves(qa[c], qb[c]);
                acc[0] = f._mm512_fmadd_ps(q, dq._mm512_broadcast_f32x8(cast(k0[c])), acc[0]);
                acc[1] = f._mm512_fmadd_ps(q, dq._mm512_broadcast_f32x8(cast(k1[c])), acc[1]);
                acc[2] = f._mm512_fmadd_ps(q, dq._mm512_broadcast_f32x8(cast(k2[c])), acc[2]);
                acc[3] = f._mm512_fmadd_ps(q, dq._mm512_broadcast_f32x8(cast(k3[c])), acc[3]);
                acc[4] = f._mm512_fmadd_ps(q, dq._mm512_broadcast_f32x8(cast(k4[c])), acc[4]);
                acc[5] = f._mm512_fmadd_ps(q, dq._mm512_broadcast_f32x8(cast(k5[c])), acc[5]);
                acc[6] = f._mm512_fmadd_ps(q, dq._mm512_broadcast_f32x8(cast(k6[c])), acc[6]);
                acc[7] = f._mm512_fmadd_ps(q, dq._mm512_broadcast_f32x8(cast(k7[c])), acc[7]);
            }
            self.split(self.reduce8_pair(acc))
        }

        /// [`reduce8`] of each half of `acc`, in one: the same additions of the same lanes in
        /// the same order (`vhaddps` adds a lane pair's upper lane to its lower one, and so do
        /// these), in 16 lanes.
        #[inline(always)]
        fn reduce8_pair(self, acc: [__m512; 8]) -> __m512 {
            let f = self.0.avx512f;
            let pairs = [
                hadd16(f, acc[0], acc[1]),
                hadd16(f, acc[2], acc[3]),
                hadd16(f, acc[4], acc[5]),
                hadd16(f, acc[6], acc[7]),
            ];
            let low = hadd16(f, pairs[0], pairs[1]);
            let high = hadd16(f, pairs[2], pairs[3]);
            // Each half: its `low`'s lower 128 bits beside its `high`'s (as `reduce8`'s
            // `lower`), and their upper 128 bits (`upper`); indices 16-31 name `high`'s lanes.
            let lower =
                f._mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26, 27);
            let upper =
                f._mm512_setr_epi32(4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15, 28, 29, 30, 31);
            let lower = f._mm512_permutex2var_ps(low, lower, high);
            let upper = f._mm512_permutex2var_ps(low, upper, high);
            f._mm512_add_ps(lower, upper)
        }
    }

    impl Lanes for Wide {
        #[inline(always)]
        fn scores(self, q: &[f32], keys: &[f32], d: usize, out: &mut [f32]) {
            (*self.0).scores(q, keys, d, out);
        }

        #[inline(always)]
        fn scale_bias_max(self, row: &mut [f32], bias: &[f32], scale: f32) -> f32 {
            (*self.0).scale_bias_max(row, bias, scale)
        }

        #[inline(always)]
        fn exp_shifted(self, xs: &mut [f32], shift: f32) {
            (*self.0).exp_shifted(xs, shift);
        }

        #[inline(always)]
        fn weighted_sum(self, weights: &[f32], values: &[f32], d: usize, out: &mut [f32]) {
            (*self.0).weighted_sum(weights, values, d, out);
        }

        #[inline(always)]
        fn silu_mul(self, gate: &[f32], up: &[f32], out: &mut [f32]) {
            (*self.0).silu_mul(gate, up, out);
        }

        #[inline(always)]
        fn scores_pair(self, q: [&[f32]; 2], keys: &[f32], d: usize, out: [&mut [f32]; 2]) {
            let total = out[0].len();
            // Fewer than 8 keys (padded in `V3::scores`) or an odd head size: one at a time.
            if !d.is_multiple_of(8) || d == 0 || total < 8 || out[1].len() != total {
                return scores_each(self, q, keys, d, out);
            }
            let (qa, qb): (&[f32x8], &[f32x8]) = (cast_slice(q[0]), cast_slice(q[1]));
            let [out_a, out_b] = out;
            // As `V3::scores`: blocks of 8 keys, then the last 8 keys again for a remainder.
            let whole = total / 8 * 8;
            let remainder = (whole < total).then_some(total - 8);
            for start in (0..whole).step_by(8).chain(remainder) {
                let block = cast_slice(&keys[start * d..(start + 8) * d]);
                let (a, b) = self.dot8_pair(qa, qb, block);
                out_a[start..start + 8].copy_from_slice(&cast::<f32x8, [f32; 8]>(a));
                out_b[start..start + 8].copy_from_slice(&cast::<f32x8, [f32; 8]>(b));
            }
        }

        #[inline(always)]
        fn weighted_sum_pair(
            self,
            weights: [&[f32]; 2],
            values: &[f32],
            d: usize,
            out: [&mut [f32]; 2],
        ) {
            let (wa, wb) = (weights[0], weights[1]);
            if !d.is_multiple_of(8) || d == 0 || wa.len() != wb.len() {
                return weighted_sum_each(self, weights, values, d, out);
            }
            let [out_a, out_b] = out;
            let nv = d / 8;
            let values: &[f32x8] = cast_slice(values);
            let out_a: &mut [f32x8] = cast_slice_mut(out_a);
            let out_b: &mut [f32x8] = cast_slice_mut(out_b);
            // As `V3::weighted_sum`, each half its own pair's: eight output vectors at a time,
            // a zero weight (a masked position) leaving its half untouched.
            let mut start = 0;
            while start < nv {
                let width = (nv - start).min(8);
                let mut acc = [self.0.avx512f._mm512_setzero_ps(); 8];
                for u in 0..width {
                    acc[u] = self.halves(out_a[start + u], out_b[start + u]);
                }
                if width == 8 {
                    self.weighted_sum_pair_8(wa, wb, values, nv, start, &mut acc);
                } else {
                    for ((&a, &b), value) in wa.iter().zip(wb).zip(values.chunks_exact(nv)) {
                        let w = self.halves(self.0.splat_f32x8(a), self.0.splat_f32x8(b));
                        self.add_weighted(
                            w,
                            nonzero_halves(a, b),
                            &value[start..start + width],
                            &mut acc[..width],
                        );
                    }
                }
                for u in 0..width {
                    let (a, b) = self.split(acc[u]);
                    out_a[start + u] = a;
                    out_b[start + u] = b;
                }
                start += width;
            }
        }
    }

    /// [`hadd`] in each half of 16 lanes: lane pairs summed upper lane plus lower, as
    /// `vhaddps` sums them.
    #[inline(always)]
    fn hadd16(f: Avx512f, a: __m512, b: __m512) -> __m512 {
        let lower = f._mm512_shuffle_ps::<0b10_00_10_00>(a, b);
        let upper = f._mm512_shuffle_ps::<0b11_01_11_01>(a, b);
        f._mm512_add_ps(upper, lower)
    }

    /// The mask of the halves whose weight is not zero (NaN included, as `!=` counts it).
    #[inline(always)]
    fn nonzero_halves(a: f32, b: f32) -> u16 {
        halves_mask(a != 0.0, b != 0.0)
    }

    /// The lanes of the lower half where `low`, and of the upper half where `high`.
    #[inline(always)]
    fn halves_mask(low: bool, high: bool) -> u16 {
        (u16::from(low) * 0x00ff) | (u16::from(high) * 0xff00)
    }

    impl Wide {
        /// `acc[u] += w · value[u]` in the halves `mask` keeps: one position's multiply-adds,
        /// each half [`V3::weighted_sum`]'s for its pair, nothing where `mask` is 0.
        #[inline(always)]
        fn add_weighted(self, w: __m512, mask: u16, value: &[f32x8], acc: &mut [__m512]) {
            if mask == 0 {
                return;
            }
            let (f, dq) = (self.0.avx512f, self.0.avx512dq);
            for (acc, &v) in acc.iter_mut().zip(value) {
                let v = dq._mm512_broadcast_f32x8(cast(v));
                *acc = f._mm512_mask3_fmadd_ps(w, v, *acc, mask);
            }
        }

        /// The positions of [`Lanes::weighted_sum_pair`] for the eight output vectors from
        /// `start` (of `nv` a value row), into `acc`. Eight positions at a time, both pairs'
        /// weights in one register: where none of the sixteen is zero (a block of positions
        /// neither row masks), each position's weights are spread to the halves by one
        /// permutation and its multiply-adds go unmasked, which is what the masked ones do
        /// with every lane kept; otherwise, and for the last positions, one position at a
        /// time with its mask. The same multiply-adds in the same order either way.
        #[inline(always)]
        fn weighted_sum_pair_8(
            self,
            wa: &[f32],
            wb: &[f32],
            values: &[f32x8],
            nv: usize,
            start: usize,
            acc: &mut [__m512; 8],
        ) {
            let f = self.0.avx512f;
            let dq = self.0.avx512dq;
            let positions = wa.len().min(wb.len()).min(values.len() / nv.max(1));
            let whole = positions / 8 * 8;
            let zero = f._mm512_setzero_ps();
            // `spread[p]` takes lane `p` of each half to the whole half.
            let mut spread = [f._mm512_setzero_si512(); 8];
            for (p, spread) in (0..8).zip(&mut spread) {
                let (low, high) = (f._mm512_set1_epi32(p), f._mm512_set1_epi32(8 + p));
                *spread = f._mm512_mask_blend_epi32(0xff00, low, high);
            }
            let rows = values.chunks_exact(8 * nv);
            let weights = cast_slice::<f32, f32x8>(&wa[..whole])
                .iter()
                .zip(cast_slice::<f32, f32x8>(&wb[..whole]));
            for ((&a, &b), rows) in weights.zip(rows) {
                let ab = self.halves(a, b);
                // `_CMP_NEQ_UQ`: true for NaN, as `!=` is.
                let nonzero = f._mm512_cmp_ps_mask::<4>(ab, zero);
                for (p, (value, &spread)) in rows.chunks_exact(nv).zip(&spread).enumerate() {
                    let w = f._mm512_permutexvar_ps(spread, ab);
                    let value = &value[start..start + 8];
                    if nonzero == 0xffff {
                        for (acc, &v) in acc.iter_mut().zip(value) {
                            let v = dq._mm512_broadcast_f32x8(cast(v));
                            *acc = f._mm512_fmadd_ps(w, v, *acc);
                        }
                    } else {
                        let kept = |lane: usize| nonzero >> lane & 1 != 0;
                        self.add_weighted(w, halves_mask(kept(p), kept(8 + p)), value, acc);
                    }
                }
            }
            let tail = wa[whole..positions]
                .iter()
                .zip(&wb[whole..positions])
                .zip(values[whole * nv..].chunks_exact(nv));
            for ((&a, &b), value) in tail {
                let w = self.halves(self.0.splat_f32x8(a), self.0.splat_f32x8(b));
                self.add_weighted(w, nonzero_halves(a, b), &value[start..start + 8], acc);
            }
        }
    }

    struct HeadJob<'a, 'b, S> {
        simd: S,
        inputs: &'a Inputs<'a>,
        heads: Range<usize>,
        out: &'b mut [f32],
    }

    impl<S: Lanes> NullaryFnOnce for HeadJob<'_, '_, S> {
        type Output = ();

        #[inline(always)]
        fn call(self) {
            attend_heads(self.simd, self.inputs, self.heads, self.out);
        }
    }

    struct SiluJob<'a> {
        simd: V3,
        gate: &'a [f32],
        up: &'a [f32],
        out: &'a mut [f32],
    }

    impl NullaryFnOnce for SiluJob<'_> {
        type Output = ();

        #[inline(always)]
        fn call(self) {
            self.simd.silu_mul(self.gate, self.up, self.out);
        }
    }

    /// [`attend_heads`] with AVX2 + FMA (the caller checked that the CPU has them).
    pub(super) fn attend_heads_simd(
        inputs: &Inputs<'_>,
        heads: Range<usize>,
        out: &mut [f32],
        wide: bool,
    ) {
        if let Some(v4) = V4::try_new().filter(|_| wide) {
            return v4.vectorize(HeadJob {
                simd: Wide(v4),
                inputs,
                heads,
                out,
            });
        }
        match V3::try_new() {
            Some(simd) => simd.vectorize(HeadJob {
                simd,
                inputs,
                heads,
                out,
            }),
            None => attend_heads(Portable, inputs, heads, out),
        }
    }

    pub(super) fn silu_mul_simd(gate: &[f32], up: &[f32], out: &mut [f32]) {
        match V3::try_new() {
            Some(simd) => simd.vectorize(SiluJob {
                simd,
                gate,
                up,
                out,
            }),
            None => Portable.silu_mul(gate, up, out),
        }
    }
}

#[cfg(not(target_arch = "x86_64"))]
mod simd_imp {
    use super::{Inputs, Lanes, Portable};

    pub(super) fn attend_heads_simd(
        inputs: &Inputs<'_>,
        heads: std::ops::Range<usize>,
        out: &mut [f32],
        _wide: bool,
    ) {
        super::attend_heads(Portable, inputs, heads, out);
    }

    pub(super) fn silu_mul_simd(gate: &[f32], up: &[f32], out: &mut [f32]) {
        Portable.silu_mul(gate, up, out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    const ISAS: [Isa; 3] = [Isa::Auto, Isa::Avx2, Isa::Scalar];

    fn values(n: usize, seed: u64) -> Vec<f32> {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        (0..n).map(|_| rng.random_range(-1.0f32..1.0)).collect()
    }

    /// Attention in f64, row by row and head by head, skipping masked positions.
    fn reference(
        q: &[f32],
        q_stride: usize,
        keys: &[f32],
        values: &[f32],
        s: AttentionShape,
        bias: &[f32],
    ) -> Vec<f64> {
        let d = s.head_dim;
        let mut out = vec![0.0f64; s.rows * s.heads * d];
        for i in 0..s.rows {
            for h in 0..s.heads {
                let kv = h / (s.heads / s.kv_heads);
                let q_row = &q[i * q_stride + h * d..i * q_stride + (h + 1) * d];
                let scores: Vec<f64> = (0..s.total)
                    .map(|j| {
                        let key = &keys[(kv * s.capacity + j) * d..(kv * s.capacity + j + 1) * d];
                        let dot: f64 = q_row
                            .iter()
                            .zip(key)
                            .map(|(&a, &b)| a as f64 * b as f64)
                            .sum();
                        dot / (d as f64).sqrt() + bias[i * s.total + j] as f64
                    })
                    .collect();
                let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let weights: Vec<f64> = scores.iter().map(|&v| (v - max).exp()).collect();
                let sum: f64 = weights.iter().sum();
                for (j, w) in weights.iter().enumerate() {
                    let value = &values[(kv * s.capacity + j) * d..(kv * s.capacity + j + 1) * d];
                    for e in 0..d {
                        out[(i * s.heads + h) * d + e] += w / sum * value[e] as f64;
                    }
                }
            }
        }
        out
    }

    /// A causal bias for `rows` new tokens after `total - rows` cached ones, with every third
    /// cached position also masked (as a tree's other branches are).
    fn bias(rows: usize, total: usize) -> Vec<f32> {
        let cached = total - rows;
        let mut b = vec![0.0f32; rows * total];
        for i in 0..rows {
            for j in 0..total {
                if j > cached + i || (j < cached && j % 3 == 2) {
                    b[i * total + j] = f32::NEG_INFINITY;
                }
            }
        }
        b
    }

    #[test]
    fn attention_matches_the_f64_reference() {
        // (heads, kv heads, head dim): SmolLM2's, Qwen's, a dim off the vector width.
        for (heads, kv_heads, d) in [(9, 3, 64), (12, 2, 128), (4, 4, 8), (2, 1, 12)] {
            for (rows, total) in [(1, 1), (1, 37), (3, 40), (5, 133), (16, 300)] {
                let capacity = total + 3;
                let s = AttentionShape {
                    rows,
                    heads,
                    kv_heads,
                    head_dim: d,
                    capacity,
                    total,
                };
                let q_stride = (heads + 2 * kv_heads) * d;
                let q = values(rows * q_stride, 1);
                let keys = values(kv_heads * capacity * d, 2);
                let vals = values(kv_heads * capacity * d, 3);
                let b = bias(rows, total);
                let want = reference(&q, q_stride, &keys, &vals, s, &b);
                for isa in ISAS {
                    let got = attention_with(&q, q_stride, &keys, &vals, s, &b, isa).unwrap();
                    let err = got
                        .iter()
                        .zip(&want)
                        .map(|(&g, &w)| (g as f64 - w).abs())
                        .fold(0.0, f64::max);
                    assert!(err < 1e-5, "{isa:?} {s:?}: max error {err}");
                }
            }
        }
    }

    /// AVX-512's paired heads (`Isa::Auto` where the CPU has it) give AVX2's bits exactly, for
    /// odd and even numbers of (head, row) pairs, contexts not a multiple of 8 and fewer than
    /// 8 positions, and masked positions holding NaN values: some masked for every row, some
    /// for the first row only (as a tree's branches are), which the other rows then see.
    #[test]
    fn attention_is_the_same_bits_with_paired_heads() {
        for (heads, kv_heads, d) in [(9, 3, 64), (12, 2, 128), (4, 4, 8), (6, 2, 24), (2, 1, 12)] {
            for (rows, total) in [(1, 5), (1, 37), (2, 40), (3, 133), (5, 300), (9, 1030)] {
                let s = AttentionShape {
                    rows,
                    heads,
                    kv_heads,
                    head_dim: d,
                    capacity: total + 2,
                    total,
                };
                let q_stride = heads * d;
                let q = values(rows * q_stride, 11);
                let keys = values(kv_heads * s.capacity * d, 12);
                let mut vals = values(kv_heads * s.capacity * d, 13);
                // `bias` masks every third cached position for every row; the first row also
                // skips the positions after those.
                let mut b = bias(rows, total);
                let cached = total - rows;
                for j in (1..cached).step_by(3) {
                    b[j] = f32::NEG_INFINITY;
                }
                for kv in 0..kv_heads {
                    for j in (1..cached).filter(|j| j % 3 == 2 || (rows > 1 && j % 3 == 1)) {
                        vals[(kv * s.capacity + j) * d..(kv * s.capacity + j + 1) * d]
                            .fill(f32::NAN);
                    }
                }
                let bits = |isa| -> Vec<u32> {
                    let out = attention_with(&q, q_stride, &keys, &vals, s, &b, isa).unwrap();
                    out.iter().map(|v| v.to_bits()).collect()
                };
                let wide = bits(Isa::Auto);
                let first_row = &wide[..heads * d];
                assert!(
                    first_row.iter().all(|&v| f32::from_bits(v).is_finite()),
                    "{s:?}"
                );
                assert_eq!(wide, bits(Isa::Avx2), "{s:?}");
                // A causal mask alone (a decode step, a chain's verification): whole blocks of
                // positions that no row masks, which the paired weighted sums take eight
                // positions at a time without masks.
                let causal = |isa| -> Vec<u32> {
                    let (vals, b) = (values(vals.len(), 14), causal_bias(rows, total));
                    let out = attention_with(&q, q_stride, &keys, &vals, s, &b, isa).unwrap();
                    out.iter().map(|v| v.to_bits()).collect()
                };
                assert_eq!(causal(Isa::Auto), causal(Isa::Avx2), "causal, {s:?}");
            }
        }
    }

    /// The bias of `rows` new tokens after `total - rows` cached ones, each row seeing every
    /// cached position, the rows before it and itself.
    fn causal_bias(rows: usize, total: usize) -> Vec<f32> {
        let cached = total - rows;
        let mut b = vec![0.0f32; rows * total];
        for i in 0..rows {
            b[i * total + cached + i + 1..(i + 1) * total].fill(f32::NEG_INFINITY);
        }
        b
    }

    /// A row's output, bit for bit, does not depend on the rows beside it or on masked
    /// positions anywhere among the keys (a tree's other branches): what greedy speculative
    /// decoding needs so that a verification agrees with single decode steps.
    #[test]
    fn a_row_ignores_other_rows_and_masked_positions() {
        let (heads, kv_heads, d) = (6, 2, 64);
        let width = heads * d;
        // 45 positions fit one block of keys; 150 take three (64 positions a block at d = 64),
        // with the inserted masked positions moving keys across block boundaries.
        for (cached, isa) in [45, 150].into_iter().flat_map(|c| ISAS.map(|isa| (c, isa))) {
            // One row alone over `cached + 1` positions.
            let keys = values(kv_heads * (cached + 1) * d, 4);
            let vals = values(kv_heads * (cached + 1) * d, 5);
            let q = values(width, 6);
            let alone = AttentionShape {
                rows: 1,
                heads,
                kv_heads,
                head_dim: d,
                capacity: cached + 1,
                total: cached + 1,
            };
            let want = attention_with(&q, width, &keys, &vals, alone, &vec![0.0; cached + 1], isa)
                .unwrap();

            // The same row second of three, with three masked positions put in among the
            // cached ones and the other rows' positions after its own.
            let inserted = [0usize, 17, cached - 15];
            let total = cached + 3 + 3;
            let capacity = total;
            let mut keys2 = vec![0.0f32; kv_heads * capacity * d];
            let mut vals2 = keys2.clone();
            let mut bias2 = vec![0.0f32; 3 * total];
            let mut src = 0;
            for j in 0..total {
                let masked_for_row = inserted.contains(&j) || j == cached + 3 || j == cached + 5;
                if !inserted.contains(&j) && j != cached + 3 && j != cached + 5 {
                    for kv in 0..kv_heads {
                        let (to, from) = ((kv * capacity + j) * d, (kv * (cached + 1) + src) * d);
                        keys2[to..to + d].copy_from_slice(&keys[from..from + d]);
                        vals2[to..to + d].copy_from_slice(&vals[from..from + d]);
                    }
                    src += 1;
                } else {
                    // Whatever sits at a masked position must not matter.
                    for kv in 0..kv_heads {
                        let to = (kv * capacity + j) * d;
                        keys2[to..to + d].fill(1e3);
                        vals2[to..to + d].fill(f32::NAN);
                    }
                }
                if masked_for_row {
                    bias2[total + j] = f32::NEG_INFINITY;
                }
            }
            assert_eq!(src, cached + 1);
            let mut q3 = values(3 * width, 7);
            q3[width..2 * width].copy_from_slice(&q);
            let three = AttentionShape {
                rows: 3,
                capacity,
                total,
                ..alone
            };
            let got = attention_with(&q3, width, &keys2, &vals2, three, &bias2, isa).unwrap();
            let got: Vec<u32> = got[width..2 * width].iter().map(|v| v.to_bits()).collect();
            let want: Vec<u32> = want.iter().map(|v| v.to_bits()).collect();
            assert_eq!(got, want, "{isa:?}, {cached} cached");
        }
    }

    #[test]
    fn kv_blocks_cover_the_context_once_without_short_blocks() {
        for block in [8, 32, 64] {
            for total in 0..300 {
                let blocks: Vec<Range<usize>> = kv_blocks(total, block).collect();
                let mut next = 0;
                for b in &blocks {
                    assert_eq!(b.start, next, "{total} positions, blocks of {block}");
                    assert!(b.end > b.start && b.len() < block + 8, "{b:?} of {total}");
                    assert!(b.len() >= 8 || total < 8, "{b:?} of {total}");
                    next = b.end;
                }
                assert_eq!(next, total, "{total} positions, blocks of {block}");
            }
        }
    }

    #[test]
    fn attention_rejects_inputs_that_do_not_fit_the_shape() {
        let s = AttentionShape {
            rows: 2,
            heads: 4,
            kv_heads: 2,
            head_dim: 8,
            capacity: 10,
            total: 6,
        };
        let (q, kv, b) = (vec![0.0; 64], vec![0.0; 160], vec![0.0; 12]);
        assert!(attention(&q, 32, &kv, &kv, s, &b).is_ok());
        assert!(attention(&q[..40], 32, &kv, &kv, s, &b).is_err());
        assert!(attention(&q, 32, &kv[..159], &kv, s, &b).is_err());
        assert!(attention(&q, 32, &kv, &kv, s, &b[..11]).is_err());
        assert!(attention(&q, 32, &kv, &kv, AttentionShape { heads: 3, ..s }, &b).is_err());
        assert!(attention(&q, 32, &kv, &kv, AttentionShape { total: 11, ..s }, &b).is_err());
    }

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

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn simd_exp_is_within_two_ulp() {
        let Some(simd) = pulp::x86::V3::try_new() else {
            return;
        };
        let ulps = |a: f32, b: f32| (a.to_bits() as i64 - b.to_bits() as i64).abs();
        let mut xs: Vec<f32> = (0..200_000).map(|i| -110.0 + i as f32 * 0.001).collect();
        xs.extend([
            0.0, -0.0, 1.0, 88.7, 88.72, 88.73, -87.3, -103.0, -103.9, -104.5,
        ]);
        for chunk in xs.chunks(8) {
            let mut lanes = [0.0f32; 8];
            lanes[..chunk.len()].copy_from_slice(chunk);
            let got: [f32; 8] =
                pulp::cast(simd.vectorize(|| simd_imp::exp(simd, pulp::cast(lanes))));
            for (&x, &y) in chunk.iter().zip(&got) {
                let want = (x as f64).exp() as f32;
                assert!(ulps(y, want) <= 2, "e^{x}: {y} vs {want}");
            }
        }
        let special = [
            f32::NEG_INFINITY,
            f32::INFINITY,
            f32::NAN,
            -1e30,
            1e30,
            0.0,
            0.0,
            0.0,
        ];
        let got: [f32; 8] = pulp::cast(simd.vectorize(|| simd_imp::exp(simd, pulp::cast(special))));
        assert_eq!(got[0], 0.0);
        assert_eq!(got[1], f32::INFINITY);
        assert!(got[2].is_nan());
        assert_eq!(got[3], 0.0);
        assert_eq!(got[4], f32::INFINITY);
        assert_eq!(got[5], 1.0);
    }
}
