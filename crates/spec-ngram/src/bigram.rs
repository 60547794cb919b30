//! The bigram draft model: counts, smoothing, and its file format.
//!
//! # File format (`.bigram`), all integers little-endian
//!
//! | bytes            | content                                                            |
//! |------------------|--------------------------------------------------------------------|
//! | 8                | magic `SPECBG01`                                                   |
//! | 4                | `u32` vocabulary size `V` (the target model's, embedding rows)     |
//! | 8                | `u64` number of distinct bigrams `M`                               |
//! | 4 · V            | `u32` unigram counts `c(b)`                                        |
//! | 8 · (V + 1)      | `u64` row offsets (CSR): row `a` is entries `off[a] .. off[a+1]`   |
//! | 4 · M            | `u32` next tokens, strictly increasing within a row, `< V`         |
//! | 4 · M            | `u32` bigram counts `c(a, b)`, all `> 0`                           |
//! | 8                | `u64` FNV-1a 64 checksum of every byte before it                   |
//!
//! Loading checks the magic, the sizes against the file length, the checksum, the offsets
//! (`off[0] = 0`, non-decreasing, `off[V] = M`), the token order and range, and that counts are
//! positive; any failure is [`NgramError::Corrupt`]. The vocabulary size is checked against the
//! target's by [`crate::BigramDrafter::new`].

use std::collections::HashMap;
use std::path::Path;

use crate::error::{NgramError, Result};

const MAGIC: &[u8; 8] = b"SPECBG01";
/// Largest vocabulary accepted (well above any current tokenizer; bounds allocations on load).
const MAX_VOCAB: usize = 1 << 24;

/// Bigram counts being gathered over a corpus.
#[derive(Debug, Clone)]
pub struct BigramCounts {
    vocab: usize,
    unigram: Vec<u32>,
    pairs: HashMap<u64, u32>,
}

impl BigramCounts {
    /// Empty counts over a vocabulary of `vocab` tokens.
    pub fn new(vocab: usize) -> Result<Self> {
        if vocab == 0 || vocab > MAX_VOCAB {
            return Err(NgramError::InvalidVocab {
                got: vocab,
                max: MAX_VOCAB,
            });
        }
        Ok(Self {
            vocab,
            unigram: vec![0; vocab],
            pairs: HashMap::new(),
        })
    }

    /// Counts the tokens of one document and its adjacent pairs (none across documents).
    pub fn add_sequence(&mut self, tokens: &[u32]) -> Result<()> {
        if let Some(&token) = tokens.iter().find(|&&t| t as usize >= self.vocab) {
            return Err(NgramError::TokenOutOfRange {
                token,
                vocab: self.vocab,
            });
        }
        for &t in tokens {
            let c = &mut self.unigram[t as usize];
            *c = c.saturating_add(1);
        }
        for w in tokens.windows(2) {
            let c = self
                .pairs
                .entry(u64::from(w[0]) << 32 | u64::from(w[1]))
                .or_insert(0);
            *c = c.saturating_add(1);
        }
        Ok(())
    }

    /// Number of distinct bigrams seen.
    pub fn distinct_bigrams(&self) -> usize {
        self.pairs.len()
    }

    /// The smoothed model of these counts.
    pub fn finish(self) -> BigramModel {
        let mut pairs: Vec<(u64, u32)> = self.pairs.into_iter().collect();
        pairs.sort_unstable_by_key(|&(k, _)| k);
        let mut offsets = vec![0u64; self.vocab + 1];
        let mut next = Vec::with_capacity(pairs.len());
        let mut counts = Vec::with_capacity(pairs.len());
        for (key, count) in pairs {
            offsets[(key >> 32) as usize + 1] += 1;
            next.push(key as u32);
            counts.push(count);
        }
        for a in 0..self.vocab {
            offsets[a + 1] += offsets[a];
        }
        BigramModel::from_parts(self.unigram, offsets, next, counts)
    }
}

/// A smoothed bigram model `q(b | a)` over a vocabulary (see the crate docs for the rule).
#[derive(Debug, Clone)]
pub struct BigramModel {
    unigram: Vec<u32>,
    offsets: Vec<u64>,
    next: Vec<u32>,
    counts: Vec<u32>,
    /// `ln u(b)` for every token.
    log_unigram: Vec<f32>,
    /// Per previous token: `c(a)` and `T(a)`.
    row_totals: Vec<(u64, u64)>,
    /// The most frequent token (lowest index on ties) and `u` of it.
    top_unigram: (u32, f64),
}

impl BigramModel {
    /// Builds the model from validated CSR parts.
    fn from_parts(unigram: Vec<u32>, offsets: Vec<u64>, next: Vec<u32>, counts: Vec<u32>) -> Self {
        let vocab = unigram.len();
        let n: u64 = unigram.iter().map(|&c| u64::from(c)).sum();
        let denom = (n + vocab as u64) as f64;
        let log_unigram = unigram
            .iter()
            .map(|&c| ((f64::from(c) + 1.0) / denom).ln() as f32)
            .collect();
        let row_totals = (0..vocab)
            .map(|a| {
                let (s, e) = (offsets[a] as usize, offsets[a + 1] as usize);
                let total = counts[s..e].iter().map(|&c| u64::from(c)).sum();
                (total, (e - s) as u64)
            })
            .collect();
        let top = unigram
            .iter()
            .enumerate()
            .fold(0, |best, (i, &c)| if c > unigram[best] { i } else { best });
        let top_unigram = (
            top as u32,
            (f64::from(unigram.get(top).copied().unwrap_or(0)) + 1.0) / denom,
        );
        Self {
            unigram,
            offsets,
            next,
            counts,
            log_unigram,
            row_totals,
            top_unigram,
        }
    }

    pub fn vocab_size(&self) -> usize {
        self.unigram.len()
    }

    /// Number of distinct bigrams stored.
    pub fn distinct_bigrams(&self) -> usize {
        self.next.len()
    }

    /// Tokens counted (`N`).
    pub fn total_tokens(&self) -> u64 {
        self.unigram.iter().map(|&c| u64::from(c)).sum()
    }

    /// The observed followers of `prev` with their counts.
    pub fn followers(&self, prev: u32) -> impl Iterator<Item = (u32, u32)> + '_ {
        let a = (prev as usize).min(self.vocab_size());
        let (s, e) = match (self.offsets.get(a), self.offsets.get(a + 1)) {
            (Some(&s), Some(&e)) => (s as usize, e as usize),
            _ => (0, 0),
        };
        self.next[s..e]
            .iter()
            .copied()
            .zip(self.counts[s..e].iter().copied())
    }

    /// `ln q(· | prev)` over the whole vocabulary, written into `out` (length `V`). A `prev`
    /// outside the vocabulary is treated as unseen (the unigram row).
    pub fn log_row_into(&self, prev: u32, out: &mut Vec<f32>) {
        out.clear();
        let (c, t) = self
            .row_totals
            .get(prev as usize)
            .copied()
            .unwrap_or((0, 0));
        if c == 0 {
            out.extend_from_slice(&self.log_unigram);
            return;
        }
        let denom = (c + t) as f64;
        // Unseen followers: T(a) u(b) / (c(a) + T(a)).
        let backoff = ((t as f64) / denom).ln() as f32;
        out.extend(self.log_unigram.iter().map(|&lu| lu + backoff));
        for (b, cab) in self.followers(prev) {
            let u = f64::from(self.log_unigram[b as usize]).exp();
            out[b as usize] = ((f64::from(cab) + t as f64 * u) / denom).ln() as f32;
        }
    }

    /// `ln q(· | prev)` as a new vector.
    pub fn log_row(&self, prev: u32) -> Vec<f32> {
        let mut out = Vec::with_capacity(self.vocab_size());
        self.log_row_into(prev, &mut out);
        out
    }

    /// Up to `k` likely next tokens after `prev`, most likely first (lower index on ties), with
    /// their probabilities, without building the row: the likeliest of the observed followers
    /// and the most frequent unigram token. The first is the row's argmax ([`BigramModel::top`]);
    /// an unobserved frequent token may outrank a rare follower and not be listed.
    pub fn top_k(&self, prev: u32, k: usize) -> Vec<(u32, f64)> {
        let u = |b: u32| f64::from(self.log_unigram[b as usize]).exp();
        let (c, t) = self
            .row_totals
            .get(prev as usize)
            .copied()
            .unwrap_or((0, 0));
        let (top_unigram, u_top) = self.top_unigram;
        if c == 0 {
            return vec![(top_unigram, u_top)].into_iter().take(k).collect();
        }
        let denom = (c + t) as f64;
        let mut candidates: Vec<(u32, f64)> = self
            .followers(prev)
            .map(|(b, cab)| (b, (f64::from(cab) + t as f64 * u(b)) / denom))
            .collect();
        if candidates.iter().all(|&(b, _)| b != top_unigram) {
            candidates.push((top_unigram, t as f64 * u_top / denom));
        }
        candidates.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        candidates.truncate(k);
        candidates
    }

    /// The most likely next token after `prev` (lowest index on ties).
    pub fn argmax(&self, prev: u32) -> u32 {
        self.top(prev).0
    }

    /// The most likely next token after `prev` (lowest index on ties) and its probability,
    /// without building the row: an observed follower `b` has `q(b | a) ≥ T(a)·u(b) / (c(a) +
    /// T(a))`, so the row's maximum is an observed follower's or, if the most frequent unigram
    /// token was not observed after `a`, that token's back-off value.
    pub fn top(&self, prev: u32) -> (u32, f64) {
        let u = |b: u32| f64::from(self.log_unigram[b as usize]).exp();
        let (c, t) = self
            .row_totals
            .get(prev as usize)
            .copied()
            .unwrap_or((0, 0));
        let (top_unigram, u_top) = self.top_unigram;
        if c == 0 {
            return (top_unigram, u_top);
        }
        let denom = (c + t) as f64;
        let mut best: Option<(u32, f64)> = None;
        let mut top_unigram_seen = false;
        for (b, cab) in self.followers(prev) {
            top_unigram_seen |= b == top_unigram;
            let q = (f64::from(cab) + t as f64 * u(b)) / denom;
            if best.is_none_or(|(bb, bq)| q > bq || (q == bq && b < bb)) {
                best = Some((b, q));
            }
        }
        if !top_unigram_seen {
            let q = t as f64 * u_top / denom;
            if best.is_none_or(|(bb, bq)| q > bq || (q == bq && top_unigram < bb)) {
                best = Some((top_unigram, q));
            }
        }
        best.unwrap_or((top_unigram, u_top))
    }

    /// The file image of this model (format in the module docs).
    pub fn to_bytes(&self) -> Vec<u8> {
        let v = self.vocab_size();
        let m = self.next.len();
        let mut out = Vec::with_capacity(8 + 4 + 8 + 4 * v + 8 * (v + 1) + 8 * m + 8);
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&(v as u32).to_le_bytes());
        out.extend_from_slice(&(m as u64).to_le_bytes());
        self.unigram
            .iter()
            .for_each(|c| out.extend_from_slice(&c.to_le_bytes()));
        self.offsets
            .iter()
            .for_each(|o| out.extend_from_slice(&o.to_le_bytes()));
        self.next
            .iter()
            .for_each(|t| out.extend_from_slice(&t.to_le_bytes()));
        self.counts
            .iter()
            .for_each(|c| out.extend_from_slice(&c.to_le_bytes()));
        let sum = fnv1a(&out);
        out.extend_from_slice(&sum.to_le_bytes());
        out
    }

    /// Writes the model to `path`.
    pub fn save(&self, path: &Path) -> Result<()> {
        std::fs::write(path, self.to_bytes()).map_err(|source| NgramError::Io {
            path: path.to_path_buf(),
            source,
        })
    }

    /// Reads and validates a model file.
    pub fn load(path: &Path) -> Result<Self> {
        let bytes = std::fs::read(path).map_err(|source| NgramError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        Self::from_bytes(&bytes).map_err(|reason| NgramError::Corrupt {
            path: path.to_path_buf(),
            reason,
        })
    }

    /// Parses and validates a file image; the error says what is wrong.
    pub fn from_bytes(bytes: &[u8]) -> std::result::Result<Self, String> {
        let mut r = Reader { bytes, at: 0 };
        if r.take(8)? != MAGIC {
            return Err("wrong magic bytes (expected `SPECBG01`): not a bigram model file".into());
        }
        let v = r.u32()? as usize;
        let m = r.u64()?;
        if v == 0 || v > MAX_VOCAB {
            return Err(format!(
                "vocabulary size {v} is out of range 1..={MAX_VOCAB}"
            ));
        }
        let expected = (20u64 + 4 * v as u64 + 8 * (v as u64 + 1))
            .checked_add(m.checked_mul(8).ok_or("bigram count overflows")?)
            .and_then(|x| x.checked_add(8))
            .ok_or("bigram count overflows")?;
        if bytes.len() as u64 != expected {
            return Err(format!(
                "the file has {} bytes but its header (V = {v}, M = {m}) implies {expected}: truncated or corrupt",
                bytes.len()
            ));
        }
        let body = bytes.len() - 8;
        let stored = u64::from_le_bytes(
            bytes[body..]
                .try_into()
                .map_err(|_| "short checksum".to_string())?,
        );
        if fnv1a(&bytes[..body]) != stored {
            return Err("checksum mismatch: the file is corrupt".into());
        }
        let m = m as usize;
        let unigram = (0..v).map(|_| r.u32()).collect::<Result<Vec<_>, _>>()?;
        let offsets = (0..=v).map(|_| r.u64()).collect::<Result<Vec<_>, _>>()?;
        let next = (0..m).map(|_| r.u32()).collect::<Result<Vec<_>, _>>()?;
        let counts = (0..m).map(|_| r.u32()).collect::<Result<Vec<_>, _>>()?;
        if offsets[0] != 0 || offsets[v] != m as u64 || offsets.windows(2).any(|w| w[0] > w[1]) {
            return Err("row offsets are not a non-decreasing sequence from 0 to M".into());
        }
        for a in 0..v {
            let row = &next[offsets[a] as usize..offsets[a + 1] as usize];
            if row.windows(2).any(|w| w[0] >= w[1]) {
                return Err(format!("row {a}: next tokens are not strictly increasing"));
            }
            if let Some(&b) = row.iter().find(|&&b| b as usize >= v) {
                return Err(format!(
                    "row {a}: next token {b} is outside the vocabulary of {v}"
                ));
            }
        }
        if counts.contains(&0) {
            return Err("a stored bigram has count 0".into());
        }
        Ok(Self::from_parts(unigram, offsets, next, counts))
    }
}

struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn take(&mut self, n: usize) -> std::result::Result<&[u8], String> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.bytes.len());
        let end = end.ok_or_else(|| format!("unexpected end of file at byte {}", self.at))?;
        let out = &self.bytes[self.at..end];
        self.at = end;
        Ok(out)
    }

    fn u32(&mut self) -> std::result::Result<u32, String> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn u64(&mut self) -> std::result::Result<u64, String> {
        let b = self.take(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_le_bytes(a))
    }
}

fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn small() -> BigramModel {
        let mut counts = BigramCounts::new(6).unwrap();
        counts.add_sequence(&[0, 1, 2, 1, 2, 1, 3]).unwrap();
        counts.add_sequence(&[1, 2, 5]).unwrap();
        counts.finish()
    }

    #[test]
    fn rows_are_distributions_with_witten_bell_values() {
        let model = small();
        assert_eq!(model.total_tokens(), 10);
        for a in 0..7u32 {
            let total: f64 = model.log_row(a).iter().map(|&l| f64::from(l).exp()).sum();
            assert!((total - 1.0).abs() < 1e-5, "row {a} sums to {total}");
        }
        // Row 1: followers 2 (×3) and 3 (×1); c = 4, T = 2.
        let u = |b: usize| (f64::from([1, 4, 3, 1, 0, 1][b]) + 1.0) / (10.0 + 6.0);
        let row = model.log_row(1);
        let expect = (3.0 + 2.0 * u(2)) / 6.0;
        assert!((f64::from(row[2]).exp() - expect).abs() < 1e-6);
        let unseen = 2.0 * u(4) / 6.0;
        assert!((f64::from(row[4]).exp() - unseen).abs() < 1e-6);
        assert_eq!(model.argmax(1), 2);
        let (token, probability) = model.top(1);
        assert_eq!(token, 2);
        assert!((probability - expect).abs() < 1e-6);
        // The closed form agrees with a scan of every row (unseen previous tokens included).
        for a in 0..7u32 {
            let row = model.log_row(a);
            let (token, probability) = model.top(a);
            let best = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            assert_eq!(row[token as usize], best, "row {a}");
            assert!((probability.ln() - f64::from(best)).abs() < 1e-5, "row {a}");
        }
        // Token 4 never occurs as a previous token: the unigram row, argmax = token 1.
        assert_eq!(model.argmax(4), 1);
    }

    #[test]
    fn top_k_lists_the_likeliest_followers_in_order() {
        let m = small();
        for prev in 0..m.vocab_size() as u32 {
            let row: Vec<f64> = m
                .log_row(prev)
                .iter()
                .map(|&l| f64::from(l).exp())
                .collect();
            let top = m.top_k(prev, 3);
            assert!(!top.is_empty());
            assert_eq!(top[0].0, m.top(prev).0, "after {prev}");
            for w in top.windows(2) {
                assert!(w[0].1 >= w[1].1);
            }
            for &(b, q) in &top {
                assert!((row[b as usize] - q).abs() < 1e-5, "q({b} | {prev})");
            }
        }
    }

    #[test]
    fn round_trip_and_corruption_is_detected() {
        let model = small();
        let bytes = model.to_bytes();
        let back = BigramModel::from_bytes(&bytes).unwrap();
        assert_eq!(back.to_bytes(), bytes);
        assert_eq!(back.log_row(2), model.log_row(2));

        let err = BigramModel::from_bytes(&bytes[..bytes.len() - 3]).unwrap_err();
        assert!(err.contains("truncated"), "{err}");
        let mut flipped = bytes.clone();
        flipped[30] ^= 1;
        assert!(
            BigramModel::from_bytes(&flipped)
                .unwrap_err()
                .contains("checksum")
        );
        let mut magic = bytes.clone();
        magic[0] = b'X';
        assert!(
            BigramModel::from_bytes(&magic)
                .unwrap_err()
                .contains("magic")
        );
        assert!(BigramModel::from_bytes(&[]).is_err());
    }

    #[test]
    fn out_of_range_tokens_are_rejected() {
        let mut counts = BigramCounts::new(4).unwrap();
        let err = counts.add_sequence(&[1, 4]).unwrap_err();
        assert!(err.to_string().contains("token 4"), "{err}");
        assert!(BigramCounts::new(0).is_err());
    }
}
