//! Host side of truncation (top-k, top-p, min-p): each row's kept set, found without sorting the
//! whole vocabulary.
//!
//! [`crate::sampling`] computes the probabilities on the device, reads them back once and calls
//! [`truncate_row`] on every row. The rule is the one the `sampling` module docs state, with
//! this arithmetic: the f32 probabilities are walked in order, their running sum kept in f64; the
//! row's mass before truncation is 1 (as in the f64 reference); min-p compares in f64.
//!
//! # Why the kept set is exact
//!
//! Let `L` be the row in (probability descending, index ascending) order. Top-k keeps a prefix of
//! `L`, top-p the shortest prefix of that whose running sum reaches `t · mass`, min-p the prefix of
//! tokens with `p ≥ m · p_max`; their intersection is the shortest of the three prefixes, so one
//! walk down `L` that stops at the first of the three stops finds it. Only the start of `L` is
//! ever needed, and it is found without sorting the vocabulary:
//!
//! - With top-k: one pass keeps the `k` best (p, index) pairs in a min-heap (a pair enters only
//!   when it beats the heap's worst, so most of the vocabulary costs one comparison); those `k`
//!   pairs, sorted, are exactly the first `k` entries of `L`, and the walk never goes further.
//! - Without top-k: the candidates `C = {p ≥ τ}` (`{p > 0}` for `τ = 0`) are a prefix of `L`, ties
//!   included, since every token before a member of `C` in `L` is at least as probable. Sorted,
//!   `C` is that prefix, and the running sum over it is, term by term, the running sum over `L`
//!   (the same f64 additions in the same order). So if the walk stops inside `C`, it stops where
//!   a walk over all of `L` would; if it runs out of `C` first, it is redone over all tokens with
//!   mass (`τ = 0`) or, with min-p, over those above its floor (nothing below it is kept).
//!   Exactness needs nothing of `τ`; `τ` only decides how often the redo happens. With
//!   `τ = (1 − t) / (2V)` it is rare: the nucleus's last token `p_last` has mass `> 1 − t` at and
//!   after it in `L`, spread over at most `V` tokens of probability `≤ p_last`, so
//!   `p_last > (1 − t) / V` (the factor 2 absorbs rounding).
//! - Sorting `C` is skipped too where it would be long (a flat row's nucleus can hold tens of
//!   thousands of tokens): when `τ ≥ 2⁻²⁹` every candidate is a multiple of 2⁻⁵², so f64 sums of
//!   candidates below 2 never round, in any order. The walk's running sums are then the exact
//!   prefix masses, and [`bucket_walk`] gets them from per-bucket masses (buckets by exponent and
//!   top mantissa bits are runs of `L`), sorting only the bucket where the target is crossed.
//!
//! Tokens of probability 0 are never needed: a prefix ending in zeros keeps the same
//! distribution as one without them.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use crate::sampling::SamplingConfig;

/// A (probability, index) pair as one integer that orders like `L`: higher probability first,
/// then lower index. For `p ≥ 0` the bits of an f32 order like its value (`-0.0` is folded into
/// `+0.0` first).
fn key(p: f32, index: usize) -> u64 {
    (u64::from((p + 0.0).to_bits()) << 32) | u64::from(u32::MAX - index as u32)
}

fn unkey(key: u64) -> (f32, usize) {
    (
        f32::from_bits((key >> 32) as u32),
        (u32::MAX - key as u32) as usize,
    )
}

/// The `k` best entries of `row`, best first (`k < row.len()`).
fn top_k(row: &[f32], k: usize) -> Vec<u64> {
    let mut heap: BinaryHeap<Reverse<u64>> = row[..k]
        .iter()
        .enumerate()
        .map(|(i, &p)| Reverse(key(p, i)))
        .collect();
    // The scan goes up in index, so a later entry equal to the heap's worst probability loses the
    // tie: it enters only when strictly more probable.
    let mut worst = heap.peek().map_or(0.0, |Reverse(k)| unkey(*k).0);
    for (i, &p) in row.iter().enumerate().skip(k) {
        if p > worst {
            if let Some(mut top) = heap.peek_mut() {
                *top = Reverse(key(p, i));
            }
            worst = heap.peek().map_or(0.0, |Reverse(k)| unkey(*k).0);
        }
    }
    let mut best: Vec<u64> = heap.into_iter().map(|Reverse(k)| k).collect();
    best.sort_unstable_by(|a, b| b.cmp(a));
    best
}

/// The candidates `p ≥ tau` (`p > 0` when `tau == 0`) as keys, in increasing index order.
fn candidates(row: &[f32], tau: f32) -> Vec<u64> {
    // `p > 0` is `p ≥` the smallest subnormal.
    let tau = if tau > 0.0 { tau } else { f32::from_bits(1) };
    let count = row.iter().filter(|&&p| p >= tau).count();
    if count * 32 < row.len() {
        // Few pass: the branch is predictable and only they are written.
        let mut keys = Vec::with_capacity(count);
        for (i, &p) in row.iter().enumerate() {
            if p >= tau {
                keys.push(key(p, i));
            }
        }
        return keys;
    }
    // Branch-free: in a flat row, whether a token passes is a coin flip the branch predictor
    // loses. Every key is written; the end moves only past the ones that pass.
    let mut keys = vec![0u64; count + 1];
    let mut end = 0;
    for (i, &p) in row.iter().enumerate() {
        keys[end.min(count)] = key(p, i);
        end += usize::from(p >= tau);
    }
    keys.truncate(count);
    keys
}

/// Walks the candidates `p ≥ tau` in `L`'s order (sorted), as [`walk`] does.
fn sorted_walk(row: &[f32], tau: f32, nucleus: Option<f64>, floor: Option<f64>) -> Walk {
    let mut keys = candidates(row, tau);
    keys.sort_unstable_by(|a, b| b.cmp(a));
    walk(keys.into_iter().map(unkey), nucleus, floor)
}

/// Below this, an f32 is not a multiple of 2⁻⁵², and f64 sums of such values may round.
const EXACT_FLOOR: f32 = 1.0 / (1u64 << 29) as f32;

/// Buckets of `L`: the exponent and the top 4 mantissa bits of an f32 `p ≤ 2`.
const BUCKETS: usize = 1 << 11;

fn bucket(p: f32) -> usize {
    (p.to_bits() >> 19) as usize
}

/// The walk of top-p over the candidates `p ≥ tau`, without sorting all of them.
///
/// Every candidate is a multiple of 2⁻⁵² (`tau ≥ 2⁻²⁹`, 24-bit mantissas) and, checked below,
/// their sum is under 2, so every f64 sum of candidates here is exact: no addition rounds,
/// whatever the order. The sequential walk's running sums are therefore the exact prefix masses
/// of `L`, which this computes bucket by bucket: buckets are runs of `L` (the bucket falls as `p`
/// falls), so every bucket above the one where the exact mass reaches `target` is kept whole,
/// and only that bucket is sorted and walked. `None` when the preconditions fail.
fn bucket_walk(row: &[f32], tau: f32, target: f64) -> Option<Walk> {
    // Written so that a NaN `tau` also bails out.
    if tau.is_nan() || tau < EXACT_FLOOR {
        return None;
    }
    let keys = candidates(row, tau);
    let mut mass = vec![0.0f64; BUCKETS];
    for &k in &keys {
        let (p, _) = unkey(k);
        *mass.get_mut(bucket(p))? += f64::from(p);
    }
    // Bucket sums are exact if their total is under 2; that total is then exact as well.
    let total = mass.iter().sum::<f64>();
    if total.is_nan() || total >= 2.0 {
        return None;
    }
    let mut cumulative = 0.0f64;
    let Some(crossing) = (0..BUCKETS).rev().find(|&b| {
        let reached = cumulative + mass[b] >= target;
        if !reached {
            cumulative += mass[b];
        }
        reached
    }) else {
        return Some(Walk::RanOut(keys.into_iter().map(unkey).collect()));
    };
    let mut kept = Vec::new();
    let mut tied = Vec::new();
    for k in keys {
        let (p, i) = unkey(k);
        match bucket(p).cmp(&crossing) {
            std::cmp::Ordering::Greater => kept.push((p, i)),
            std::cmp::Ordering::Equal => tied.push(k),
            std::cmp::Ordering::Less => {}
        }
    }
    tied.sort_unstable_by(|a, b| b.cmp(a));
    for (p, i) in tied.into_iter().map(unkey) {
        kept.push((p, i));
        cumulative += f64::from(p);
        if cumulative >= target {
            break;
        }
    }
    Some(Walk::Stopped(kept))
}

/// Where a walk over a prefix of `L` ended.
enum Walk {
    /// A rule stopped it; these are the kept entries.
    Stopped(Vec<(f32, usize)>),
    /// The entries ran out first; these are all of them.
    RanOut(Vec<(f32, usize)>),
}

/// Walks entries in `L`'s order, keeping them until top-p is reached (the entry that reaches it
/// is kept) or min-p excludes one (it is not).
fn walk(
    entries: impl Iterator<Item = (f32, usize)>,
    nucleus: Option<f64>,
    floor: Option<f64>,
) -> Walk {
    let mut kept = Vec::new();
    let mut cumulative = 0.0f64;
    for (p, i) in entries {
        if floor.is_some_and(|f| f64::from(p) < f) {
            return Walk::Stopped(kept);
        }
        kept.push((p, i));
        cumulative += f64::from(p);
        if nucleus.is_some_and(|target| cumulative >= target) {
            return Walk::Stopped(kept);
        }
    }
    Walk::RanOut(kept)
}

/// Applies `config`'s top-k, top-p and min-p to one row of probabilities in place: kept tokens
/// get `p / kept mass`, the others 0.
///
/// The row is `exp(x − max) / denominator`, as computed on the device: the mass before
/// truncation is 1 (the f64 reference's, not the f32 entries' rounded sum) and the largest entry
/// is `1 / denominator` (the f32 division the device did for the maximum, whose exponential is
/// exactly 1). Returns `false`, leaving the row alone, when the denominator shows the row is not
/// a distribution (NaN, or 0 where every logit is `-inf`).
pub(crate) fn truncate_row(row: &mut [f32], denominator: f32, config: &SamplingConfig) -> bool {
    if !(denominator.is_finite() && denominator > 0.0) {
        return false;
    }
    let p_max = f64::from(1.0 / denominator);
    let vocab = row.len();
    let top_p = config.effective_top_p();
    let min_p = config.effective_min_p();
    let kept = match config.effective_top_k(vocab) {
        Some(k) => {
            let best = top_k(row, k);
            let mass: f64 = best.iter().map(|&k| f64::from(unkey(k).0)).sum();
            let p_max = f64::from(unkey(best[0]).0);
            match walk(
                best.into_iter().map(unkey),
                top_p.map(|t| t * mass),
                min_p.map(|m| m * p_max),
            ) {
                Walk::Stopped(kept) | Walk::RanOut(kept) => kept,
            }
        }
        None if top_p.is_none() => {
            // Min-p alone: no order needed.
            let floor = min_p.map_or(0.0, |m| m * p_max);
            row.iter()
                .enumerate()
                .filter(|&(_, &p)| f64::from(p) >= floor && p > 0.0)
                .map(|(i, &p)| (p, i))
                .collect()
        }
        None => {
            // The mass to reach: `t` times the row's mass, 1.
            let target = top_p.map_or(f64::INFINITY, |t| t);
            let floor = min_p.map(|m| m * p_max);
            // The bound of the module docs; min-p's floor if that is higher.
            let tau =
                (top_p.map_or(0.0, |t| 1.0 - t) / (2.0 * vocab as f64)).max(floor.unwrap_or(0.0));
            let first = bucket_walk(row, tau as f32, target)
                .unwrap_or_else(|| sorted_walk(row, tau as f32, Some(target), floor));
            let mut kept = match first {
                Walk::Stopped(kept) => kept,
                // Complete when no token below `tau` can be kept: min-p keeps nothing below its
                // floor, and `tau == 0` took every token with mass.
                Walk::RanOut(kept) if floor.is_some_and(|f| tau <= f) || tau as f32 <= 0.0 => kept,
                Walk::RanOut(_) => {
                    match sorted_walk(row, floor.unwrap_or(0.0) as f32, Some(target), floor) {
                        Walk::Stopped(kept) | Walk::RanOut(kept) => kept,
                    }
                }
            };
            // `bucket_walk` leaves min-p to here; its cut is a prefix of `L` too.
            if let Some(f) = floor {
                kept.retain(|&(p, _)| f64::from(p) >= f);
            }
            kept
        }
    };
    let mass: f64 = kept.iter().map(|&(p, _)| f64::from(p)).sum();
    row.fill(0.0);
    for (p, i) in kept {
        row[i] = (f64::from(p) / mass) as f32;
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    /// A row as the device computes it: `exp(x − max) / denominator` in f32.
    fn softmax(logits: &[f32]) -> (Vec<f32>, f32) {
        let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let exp: Vec<f32> = logits.iter().map(|&x| (x - max).exp()).collect();
        let denominator: f32 = exp.iter().sum();
        (exp.iter().map(|&e| e / denominator).collect(), denominator)
    }

    /// The rule the slow way: sort the whole row, walk it from the top.
    fn full_sort(row: &[f32], config: &SamplingConfig) -> Vec<usize> {
        let vocab = row.len();
        let mut order: Vec<usize> = (0..vocab).collect();
        order.sort_by(|&a, &b| row[b].total_cmp(&row[a]).then(a.cmp(&b)));
        let top_k = config.effective_top_k(vocab);
        order.truncate(top_k.unwrap_or(vocab));
        let mass: f64 = match top_k {
            Some(_) => order.iter().map(|&i| f64::from(row[i])).sum(),
            None => 1.0,
        };
        let floor = config
            .effective_min_p()
            .map(|m| m * f64::from(row[order[0]]));
        let mut kept = Vec::new();
        let mut cumulative = 0.0f64;
        for i in order {
            let p = f64::from(row[i]);
            if floor.is_some_and(|f| p < f) || p == 0.0 {
                break;
            }
            kept.push(i);
            cumulative += p;
            if config
                .effective_top_p()
                .is_some_and(|t| cumulative >= t * mass)
            {
                break;
            }
        }
        kept.sort_unstable();
        kept
    }

    fn check(logits: &[f32], config: &SamplingConfig, what: &str) {
        let (row, denominator) = softmax(logits);
        check_row(&row, denominator, config, what);
    }

    fn check_row(row: &[f32], denominator: f32, config: &SamplingConfig, what: &str) {
        let row = row.to_vec();
        let want = full_sort(&row, config);
        let mut got = row.clone();
        assert!(truncate_row(&mut got, denominator, config), "{what}");
        let kept: Vec<usize> = (0..got.len()).filter(|&i| got[i] > 0.0).collect();
        assert_eq!(kept, want, "{what}: {config:?}");
        let mass: f64 = want.iter().map(|&i| f64::from(row[i])).sum();
        for &i in &want {
            let p = f64::from(row[i]) / mass;
            assert!(
                (f64::from(got[i]) - p).abs() <= 1e-6 * p,
                "{what}: {config:?}"
            );
        }
    }

    fn configs() -> Vec<SamplingConfig> {
        let t = SamplingConfig::with_temperature(1.0);
        vec![
            t.top_p(0.9),
            t.top_p(0.5),
            t.top_p(0.01),
            // Bound below 2⁻²⁹ for large rows: the sorted walk instead of buckets.
            t.top_p(0.999_999),
            t.top_k(1),
            t.top_k(3),
            t.top_k(40).top_p(0.8),
            t.top_k(7).min_p(0.2),
            t.min_p(0.05),
            t.top_p(0.95).min_p(0.1),
            t.top_k(5).top_p(0.6).min_p(0.3),
        ]
    }

    #[test]
    fn matches_a_full_sort_on_random_rows() {
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        for vocab in [2usize, 9, 300, 5_000, 40_000] {
            for scale in [0.3f32, 2.0, 8.0] {
                let logits: Vec<f32> = (0..vocab)
                    .map(|_| rng.random_range(-1.0f32..1.0) * scale)
                    .collect();
                for config in configs() {
                    check(&logits, &config, &format!("vocab {vocab} scale {scale}"));
                }
            }
        }
    }

    #[test]
    fn matches_a_full_sort_on_edge_rows() {
        let mut rng = ChaCha8Rng::seed_from_u64(8);
        let flat = vec![0.25f32; 4_999];
        // Few distinct values: ties at every cut-off, resolved by index.
        let levels: Vec<f32> = (0..6_000).map(|_| rng.random_range(0..4) as f32).collect();
        let mut one_hot = vec![f32::NEG_INFINITY; 3_000];
        one_hot[1_234] = 0.0;
        // A language-model-like row: a flat background under a few strong tokens; the nucleus
        // may run deep into the background.
        let mut peaked: Vec<f32> = (0..60_000)
            .map(|_| rng.random_range(-4.0f32..4.0))
            .collect();
        for _ in 0..8 {
            let at = rng.random_range(0..peaked.len());
            peaked[at] += rng.random_range(6.0f32..12.0);
        }
        let mut masked = peaked.clone();
        for x in masked.iter_mut().step_by(3) {
            *x = f32::NEG_INFINITY;
        }
        // Probabilities that underflow to 0 (and a subnormal or two).
        let steep: Vec<f32> = (0..2_000).map(|i| -(i as f32) * 0.06).collect();
        for (what, logits) in [
            ("flat", &flat),
            ("levels", &levels),
            ("one-hot", &one_hot),
            ("peaked", &peaked),
            ("masked", &masked),
            ("steep", &steep),
        ] {
            for config in configs() {
                check(logits, &config, what);
            }
        }
    }

    /// A row whose mass falls short of top-p's target (rounding could do that near `t = 1`):
    /// the walk runs out of candidates, redoes with every token with mass, and keeps them all.
    #[test]
    fn a_row_short_of_mass_keeps_everything_with_mass() {
        let mut row = vec![0.2f32];
        row.extend(std::iter::repeat_n(1e-4f32, 1_000));
        row.extend(std::iter::repeat_n(1e-7f32, 1_000));
        row.extend(std::iter::repeat_n(0.0f32, 10));
        let t = SamplingConfig::with_temperature(1.0);
        for config in [t.top_p(0.9), t.top_p(0.9).min_p(0.0001), t.top_p(0.25)] {
            check_row(&row, 5.0, &config, "short");
        }
    }

    #[test]
    fn a_bad_row_is_reported() {
        let mut row = vec![0.5f32, 0.5];
        let config = SamplingConfig::with_temperature(1.0).top_p(0.9);
        assert!(!truncate_row(&mut row, f32::NAN, &config));
        assert!(!truncate_row(&mut row, 0.0, &config));
        assert_eq!(row, vec![0.5, 0.5]);
    }
}
