//! Grouped-query attention over the KV cache: the shape checks, the split of query heads into
//! parts run on the kernels' threads, and the walk over blocks of positions that every part's
//! (head, row) pairs share. The vector operations come from [`Lanes`].

use std::ops::Range;
use std::sync::Mutex;

use super::lanes::{Lanes, Portable};
use super::simd;
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
    // AVX2 alone: the same bits as AVX2 (see `lanes_avx512::Wide`).
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
            simd::attend_heads_simd(&inputs, heads, &mut out, wide);
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

/// What every head of one attention call reads.
pub(super) struct Inputs<'a> {
    q: &'a [f32],
    q_stride: usize,
    keys: &'a [f32],
    values: &'a [f32],
    s: AttentionShape,
    bias: &'a [f32],
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
pub(super) fn attend_heads<L: Lanes>(
    lanes: L,
    x: &Inputs<'_>,
    heads: Range<usize>,
    out: &mut [f32],
) {
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

#[cfg(test)]
mod tests {
    use super::super::test_inputs::{ISAS, values};
    use super::*;

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
}
