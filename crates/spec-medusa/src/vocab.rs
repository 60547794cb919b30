//! The draft vocabulary: the tokens the heads choose among, the ones the training answers use
//! most (frequency-ranked drafting, Zhao et al. 2025, arXiv 2502.14856, "FR-Spec").
//!
//! A head's projection to the full vocabulary is most of its cost: for SmolLM2 (49,152 tokens,
//! 576 features) 28 M multiply-adds a head, a fifth of the target's own step, while a residual
//! block is 0.33 M. Cut to the tokens the answers actually use, the projection, its softmax in
//! training and its top-k in drafting shrink with it. Drafting stays exact: the target
//! verifies every candidate; a token outside the set is only never proposed.

use std::collections::HashMap;

use burn::tensor::backend::Backend;
use burn::tensor::{Int, Tensor, TensorData};

use crate::error::MedusaError;

/// The tokens heads draft from, in ascending id order; index `i` of a head's logits is token
/// `ids[i]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DraftVocab {
    ids: Vec<u32>,
    index: HashMap<u32, u32>,
}

impl DraftVocab {
    /// The set of `ids` in a vocabulary of `vocab_size` tokens.
    ///
    /// # Errors
    /// No ids, an id outside the vocabulary, or one given twice.
    pub fn new(mut ids: Vec<u32>, vocab_size: usize) -> Result<Self, MedusaError> {
        ids.sort_unstable();
        if ids.is_empty() {
            return Err(MedusaError::Settings(
                "a draft vocabulary needs tokens".into(),
            ));
        }
        if let Some(&id) = ids.iter().find(|&&id| id as usize >= vocab_size) {
            return Err(MedusaError::Settings(format!(
                "draft token {id} lies outside the vocabulary of {vocab_size}"
            )));
        }
        if let Some(pair) = ids.windows(2).find(|w| w[0] == w[1]) {
            return Err(MedusaError::Settings(format!(
                "draft token {} is listed twice",
                pair[0]
            )));
        }
        let index = ids
            .iter()
            .enumerate()
            .map(|(i, &t)| (t, i as u32))
            .collect();
        Ok(Self { ids, index })
    }

    /// The `size` tokens counted most often in `counts` (indexed by token id; ties to the lower
    /// id), leaving out tokens never counted.
    ///
    /// # Errors
    /// No token counted.
    pub fn most_frequent(counts: &[u64], size: usize) -> Result<Self, MedusaError> {
        let mut ranked: Vec<u32> = (0..counts.len() as u32)
            .filter(|&t| counts[t as usize] > 0)
            .collect();
        ranked.sort_by_key(|&t| (std::cmp::Reverse(counts[t as usize]), t));
        ranked.truncate(size);
        Self::new(ranked, counts.len())
    }

    pub fn ids(&self) -> &[u32] {
        &self.ids
    }

    pub fn len(&self) -> usize {
        self.ids.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    /// Where `token` sits in a head's logits, if it is in the set.
    pub fn index_of(&self, token: u32) -> Option<usize> {
        self.index.get(&token).map(|&i| i as usize)
    }

    /// The token at index `i` of a head's logits.
    pub fn token(&self, i: usize) -> Option<u32> {
        self.ids.get(i).copied()
    }

    /// The set's rows of an output weight `[vocab, hidden]`: `[len, hidden]`, in the set's order.
    pub fn rows<B: Backend>(&self, weight: Tensor<B, 2>) -> Tensor<B, 2> {
        let device = weight.device();
        let ids: Vec<i64> = self.ids.iter().map(|&t| i64::from(t)).collect();
        let n = ids.len();
        weight.select(
            0,
            Tensor::<B, 1, Int>::from_data(TensorData::new(ids, [n]), &device),
        )
    }

    /// The share of the occurrences in `counts` that the set holds.
    pub fn coverage(&self, counts: &[u64]) -> f64 {
        let total: u64 = counts.iter().sum();
        let held: u64 = self
            .ids
            .iter()
            .map(|&t| counts.get(t as usize).copied().unwrap_or(0))
            .sum();
        if total == 0 {
            0.0
        } else {
            held as f64 / total as f64
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn the_most_frequent_tokens_in_id_order() {
        let counts = [0, 5, 1, 5, 9, 0, 2];
        let vocab = DraftVocab::most_frequent(&counts, 3).unwrap();
        assert_eq!(vocab.ids(), &[1, 3, 4]);
        assert_eq!(vocab.index_of(3), Some(1));
        assert_eq!(vocab.index_of(2), None);
        assert_eq!(vocab.token(2), Some(4));
        assert!((vocab.coverage(&counts) - 19.0 / 22.0).abs() < 1e-12);
        // Never-counted tokens stay out even where the size has room.
        assert_eq!(DraftVocab::most_frequent(&counts, 10).unwrap().len(), 5);
    }

    #[test]
    fn bad_sets_are_refused() {
        assert!(DraftVocab::new(vec![], 4).is_err());
        assert!(
            DraftVocab::new(vec![1, 4], 4)
                .unwrap_err()
                .to_string()
                .contains("outside")
        );
        assert!(
            DraftVocab::new(vec![2, 1, 2], 4)
                .unwrap_err()
                .to_string()
                .contains("twice")
        );
        assert!(DraftVocab::most_frequent(&[0, 0], 2).is_err());
    }
}
