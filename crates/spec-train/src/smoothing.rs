//! Exponential smoothing of a noisy loss, for the progress bar and the loss curve.

/// An exponential moving average with bias correction, so the first values are not pulled
/// toward zero.
#[derive(Debug, Clone, Copy)]
pub struct LossSmoother {
    decay: f64,
    average: f64,
    weight: f64,
}

impl LossSmoother {
    /// A smoother whose memory is about `window` values (`decay = 1 - 1 / window`).
    pub fn with_window(window: f64) -> Self {
        Self {
            decay: 1.0 - 1.0 / window.max(1.0),
            average: 0.0,
            weight: 0.0,
        }
    }

    /// Adds `value` and returns the smoothed value so far.
    pub fn push(&mut self, value: f64) -> f64 {
        self.average = self.decay * self.average + (1.0 - self.decay) * value;
        self.weight = self.decay * self.weight + (1.0 - self.decay);
        self.value()
    }

    /// The smoothed value so far (NaN before the first value).
    pub fn value(&self) -> f64 {
        self.average / self.weight
    }
}

/// `values` smoothed over a window of about `window` values.
pub fn smoothed(values: &[f64], window: f64) -> Vec<f64> {
    let mut smoother = LossSmoother::with_window(window);
    values.iter().map(|&v| smoother.push(v)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_constant_stays_constant_from_the_first_value() {
        for v in smoothed(&[2.0; 10], 5.0) {
            assert!((v - 2.0).abs() < 1e-12);
        }
    }

    #[test]
    fn window_one_follows_the_values() {
        assert_eq!(smoothed(&[3.0, 1.0, 4.0], 1.0), vec![3.0, 1.0, 4.0]);
    }

    #[test]
    fn a_step_is_approached_gradually() {
        let mut values = vec![1.0; 5];
        values.extend([0.0; 5]);
        let s = smoothed(&values, 4.0);
        assert!(s[5] < 1.0 && s[5] > 0.0);
        assert!(s[9] < s[5]);
    }
}
