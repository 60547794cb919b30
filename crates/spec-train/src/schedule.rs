//! The learning-rate schedule: linear warm-up, then cosine decay to a floor.
//!
//! A plain function of the step rather than burn's `lr_scheduler`s: those are stateful iterators
//! (their position would have to go into every checkpoint), and burn's `ComposedLrScheduler`
//! combines schedulers at the same step (sum, mean or product), not one after the other, so
//! "warm-up, then cosine" does not compose from them.

use crate::settings::TrainSettings;

/// The learning rate of step `step` (0-based).
///
/// Steps `0..warmup` rise linearly to the peak (`learning_rate * (step + 1) / warmup`); the
/// remaining steps follow half a cosine from the peak at step `warmup` down to
/// `learning_rate * min_lr_ratio` at the last step, `steps - 1`. Past the last step the floor
/// holds.
pub fn lr_at(settings: &TrainSettings, step: usize) -> f64 {
    let peak = settings.learning_rate;
    let warmup = settings.warmup_steps;
    if step < warmup {
        return peak * (step + 1) as f64 / warmup as f64;
    }
    let floor = peak * settings.min_lr_ratio;
    let decay_steps = settings.steps.saturating_sub(warmup + 1);
    if decay_steps == 0 {
        // A single step after the warm-up: it has the peak.
        return peak;
    }
    let progress = ((step - warmup) as f64 / decay_steps as f64).min(1.0);
    floor + (peak - floor) * 0.5 * (1.0 + (std::f64::consts::PI * progress).cos())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(steps: usize, warmup_steps: usize, min_lr_ratio: f64) -> TrainSettings {
        TrainSettings {
            steps,
            warmup_steps,
            min_lr_ratio,
            learning_rate: 1e-3,
            ..TrainSettings::default()
        }
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-12 * b.abs().max(1e-12)
    }

    #[test]
    fn warmup_rises_linearly_to_the_peak() {
        let s = settings(100, 10, 0.1);
        for step in 0..10 {
            assert!(close(lr_at(&s, step), 1e-3 * (step + 1) as f64 / 10.0));
        }
        assert!(close(lr_at(&s, 9), 1e-3));
        assert!(close(lr_at(&s, 10), 1e-3));
    }

    #[test]
    fn cosine_ends_on_the_floor_at_the_last_step() {
        let s = settings(100, 10, 0.1);
        assert!(close(lr_at(&s, 99), 1e-4));
        assert!(close(lr_at(&s, 500), 1e-4));
        // Half way through the decay: the mean of peak and floor.
        let mid = 10 + 89 / 2;
        let expected = 1e-4 + 0.9e-3 * 0.5 * (1.0 + (std::f64::consts::PI * 44.0 / 89.0).cos());
        assert!(close(lr_at(&s, mid), expected));
    }

    #[test]
    fn decay_is_monotonic() {
        let s = settings(50, 5, 0.0);
        for step in 5..49 {
            assert!(lr_at(&s, step + 1) <= lr_at(&s, step), "step {step}");
        }
        assert_eq!(lr_at(&s, 49), 0.0);
    }

    #[test]
    fn no_warmup_starts_at_the_peak() {
        let s = settings(20, 0, 0.5);
        assert!(close(lr_at(&s, 0), 1e-3));
        assert!(close(lr_at(&s, 19), 5e-4));
    }

    #[test]
    fn degenerate_runs_stay_finite() {
        // One step, all warm-up, or one step after the warm-up.
        assert!(close(lr_at(&settings(1, 0, 0.1), 0), 1e-3));
        assert!(close(lr_at(&settings(4, 4, 0.1), 3), 1e-3));
        assert!(close(lr_at(&settings(5, 4, 0.1), 4), 1e-3));
        assert!(close(lr_at(&settings(6, 4, 0.1), 5), 1e-4));
    }

    #[test]
    fn floor_ratio_one_is_constant_after_warmup() {
        let s = settings(30, 3, 1.0);
        for step in 3..30 {
            assert!(close(lr_at(&s, step), 1e-3));
        }
    }
}
