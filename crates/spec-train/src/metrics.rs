//! Held-out results and the top-k accuracy of next-token logits.

use burn::tensor::backend::Backend;
use burn::tensor::{Bool, Int, Tensor};
use serde::{Deserialize, Serialize};

/// One held-out evaluation: the loss and named metrics (accuracies, for instance).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Evaluation {
    /// Mean held-out loss.
    pub loss: f64,
    /// Further metrics by name, in the task's order.
    pub metrics: Vec<(String, f64)>,
}

impl Evaluation {
    /// The metric called `name`, if the task reported one.
    pub fn metric(&self, name: &str) -> Option<f64> {
        self.metrics
            .iter()
            .find(|(metric, _)| metric == name)
            .map(|&(_, value)| value)
    }
}

/// Rows whose target is among the 1 and the 5 largest logits, summed over batches.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TopKHits {
    /// Rows counted (masked rows excluded).
    pub rows: usize,
    /// Rows whose target has the largest logit.
    pub top1: usize,
    /// Rows whose target is among the five largest logits.
    pub top5: usize,
}

impl TopKHits {
    /// Counts the hits of `logits` `[n, vocab]` against `targets` `[n]`, leaving out the rows
    /// where `valid` is false.
    ///
    /// The target's rank is the number of logits strictly above its own, so ties count in the
    /// target's favour; no sort runs and only three integers are read back.
    pub fn count<B: Backend>(
        logits: Tensor<B, 2>,
        targets: Tensor<B, 1, Int>,
        valid: Option<Tensor<B, 1, Bool>>,
    ) -> Self {
        let [rows, vocab] = logits.dims();
        if rows == 0 || vocab == 0 {
            return Self::default();
        }
        // Masked rows may carry an out-of-range placeholder target; the clamp keeps the gather
        // in bounds and the mask drops the row afterwards.
        let targets = targets.clamp(0, vocab as i64 - 1).reshape([rows, 1]);
        let target_logit = logits.clone().gather(1, targets).expand([rows, vocab]);
        let rank = logits
            .greater(target_logit)
            .int()
            .sum_dim(1)
            .reshape([rows]);
        let valid = valid.unwrap_or_else(|| rank.clone().greater_equal_elem(0));
        let count = |hit: Tensor<B, 1, Bool>| hit.bool_and(valid.clone()).int().sum();
        let counts = Tensor::cat(
            vec![
                valid.clone().int().sum(),
                count(rank.clone().lower_elem(1)),
                count(rank.lower_elem(5)),
            ],
            0,
        )
        .into_data();
        let values: Vec<i64> = counts.iter::<i64>().collect();
        let at = |i: usize| values.get(i).copied().unwrap_or(0).max(0) as usize;
        Self {
            rows: at(0),
            top1: at(1),
            top5: at(2),
        }
    }

    /// Top-1 accuracy over the rows counted (0 when none).
    pub fn top1_accuracy(&self) -> f64 {
        ratio(self.top1, self.rows)
    }

    /// Top-5 accuracy over the rows counted (0 when none).
    pub fn top5_accuracy(&self) -> f64 {
        ratio(self.top5, self.rows)
    }

    /// `top1` and `top5` accuracies as named metrics, names prefixed by `prefix`.
    pub fn metrics(&self, prefix: &str) -> Vec<(String, f64)> {
        vec![
            (format!("{prefix}top1"), self.top1_accuracy()),
            (format!("{prefix}top5"), self.top5_accuracy()),
        ]
    }
}

impl std::ops::AddAssign for TopKHits {
    fn add_assign(&mut self, other: Self) {
        self.rows += other.rows;
        self.top1 += other.top1;
        self.top5 += other.top5;
    }
}

fn ratio(part: usize, whole: usize) -> f64 {
    if whole == 0 {
        0.0
    } else {
        part as f64 / whole as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::backend::Flex;
    use burn::tensor::TensorData;

    type B = Flex;

    fn logits(rows: Vec<Vec<f32>>) -> Tensor<B, 2> {
        let n = rows.len();
        let v = rows.first().map_or(0, Vec::len);
        let flat: Vec<f32> = rows.into_iter().flatten().collect();
        Tensor::from_data(TensorData::new(flat, [n, v]), &Default::default())
    }

    fn targets(t: &[i64]) -> Tensor<B, 1, Int> {
        Tensor::from_data(TensorData::new(t.to_vec(), [t.len()]), &Default::default())
    }

    #[test]
    fn counts_top1_and_top5() {
        // Vocabulary of 7; the target's rank is 0, 1, 4, 5 and 6.
        let base = vec![0.7f32, 0.6, 0.5, 0.4, 0.3, 0.2, 0.1];
        let l = logits(vec![
            base.clone(),
            base.clone(),
            base.clone(),
            base.clone(),
            base,
        ]);
        let hits = TopKHits::count(l, targets(&[0, 1, 4, 5, 6]), None);
        assert_eq!(
            hits,
            TopKHits {
                rows: 5,
                top1: 1,
                top5: 3
            }
        );
        assert!((hits.top1_accuracy() - 0.2).abs() < 1e-12);
        assert!((hits.top5_accuracy() - 0.6).abs() < 1e-12);
    }

    #[test]
    fn masked_rows_do_not_count_even_with_placeholder_targets() {
        let l = logits(vec![
            vec![1.0, 0.0, 0.0],
            vec![0.0, 1.0, 0.0],
            vec![0.0, 0.0, 1.0],
        ]);
        let valid: Tensor<B, 1, Bool> =
            Tensor::from_data(TensorData::from([true, false, true]), &Default::default());
        let hits = TopKHits::count(l, targets(&[0, -100, 1]), Some(valid));
        assert_eq!(
            hits,
            TopKHits {
                rows: 2,
                top1: 1,
                top5: 2
            }
        );
    }

    #[test]
    fn ties_favour_the_target_and_sums_add_up() {
        let l = logits(vec![vec![1.0, 1.0, 0.0]]);
        let mut total = TopKHits::count(l, targets(&[1]), None);
        assert_eq!(total.top1, 1);
        total += TopKHits {
            rows: 3,
            top1: 0,
            top5: 1,
        };
        assert_eq!(
            total,
            TopKHits {
                rows: 4,
                top1: 1,
                top5: 2
            }
        );
        assert_eq!(TopKHits::default().top1_accuracy(), 0.0);
    }

    #[test]
    fn evaluation_finds_metrics_by_name() {
        let e = Evaluation {
            loss: 1.5,
            metrics: TopKHits {
                rows: 4,
                top1: 1,
                top5: 2,
            }
            .metrics("head0/"),
        };
        assert_eq!(e.metric("head0/top1"), Some(0.25));
        assert_eq!(e.metric("head0/top5"), Some(0.5));
        assert_eq!(e.metric("top1"), None);
    }
}
