//! The settings of one training run.

use serde::{Deserialize, Serialize};

use crate::error::TrainError;

/// How long, how fast and how often: everything the loop needs besides the task and the model.
///
/// Steps are counted from 0; "after step `s`" means `s + 1` steps are done.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrainSettings {
    /// Optimizer steps in the whole run.
    pub steps: usize,
    /// Examples (or sequences) per batch; what one counts is the task's business.
    pub batch_size: usize,
    /// Peak learning rate, reached at the end of the warm-up.
    pub learning_rate: f64,
    /// Steps of linear warm-up from `learning_rate / warmup_steps` to `learning_rate`.
    pub warmup_steps: usize,
    /// The cosine decay ends at `learning_rate * min_lr_ratio` on the last step.
    pub min_lr_ratio: f64,
    /// AdamW's decoupled weight decay.
    pub weight_decay: f64,
    /// Gradient clipping by L2 norm; burn's AdamW clips each parameter tensor's gradient
    /// separately, not their global norm.
    pub grad_clip_norm: Option<f64>,
    /// Seeds the batches (with the step) and the backend's random numbers.
    pub seed: u64,
    /// Held-out evaluation after every this many steps (and after the last one).
    pub eval_every: usize,
    /// A checkpoint after every this many steps (and after the last one) when the run has a
    /// checkpoint directory.
    pub checkpoint_every: usize,
}

impl Default for TrainSettings {
    fn default() -> Self {
        Self {
            steps: 1000,
            batch_size: 8,
            learning_rate: 1e-3,
            warmup_steps: 50,
            min_lr_ratio: 0.1,
            weight_decay: 0.0,
            grad_clip_norm: Some(1.0),
            seed: 0,
            eval_every: 100,
            checkpoint_every: 250,
        }
    }
}

impl TrainSettings {
    /// Checks every setting; the error names the first one out of range.
    pub fn validate(&self) -> Result<(), TrainError> {
        if self.steps == 0 {
            return Err(TrainError::invalid("steps", "must be at least 1"));
        }
        if self.batch_size == 0 {
            return Err(TrainError::invalid("batch_size", "must be at least 1"));
        }
        if !(self.learning_rate.is_finite() && self.learning_rate > 0.0) {
            return Err(TrainError::invalid(
                "learning_rate",
                format!("must be finite and above 0, is {}", self.learning_rate),
            ));
        }
        if self.warmup_steps > self.steps {
            return Err(TrainError::invalid(
                "warmup_steps",
                format!(
                    "{} is more than the {} steps of the run",
                    self.warmup_steps, self.steps
                ),
            ));
        }
        if !(0.0..=1.0).contains(&self.min_lr_ratio) {
            return Err(TrainError::invalid(
                "min_lr_ratio",
                format!("must lie in [0, 1], is {}", self.min_lr_ratio),
            ));
        }
        if !(self.weight_decay.is_finite() && self.weight_decay >= 0.0) {
            return Err(TrainError::invalid(
                "weight_decay",
                format!("must be finite and at least 0, is {}", self.weight_decay),
            ));
        }
        if let Some(norm) = self.grad_clip_norm
            && !(norm.is_finite() && norm > 0.0)
        {
            return Err(TrainError::invalid(
                "grad_clip_norm",
                format!("must be finite and above 0 (or absent), is {norm}"),
            ));
        }
        if self.eval_every == 0 {
            return Err(TrainError::invalid(
                "eval_every",
                "must be at least 1 (set it to `steps` to evaluate only at the end)",
            ));
        }
        if self.checkpoint_every == 0 {
            return Err(TrainError::invalid(
                "checkpoint_every",
                "must be at least 1 (set it to `steps` to checkpoint only at the end)",
            ));
        }
        Ok(())
    }

    /// The first setting that changes the trajectory of training and differs from `other`'s,
    /// as `name: this vs other`. The cadence of evaluations and checkpoints does not count.
    pub fn trajectory_difference(&self, other: &Self) -> Option<String> {
        macro_rules! compare {
            ($($field:ident),*) => {
                $(
                    if self.$field != other.$field {
                        return Some(format!(
                            "{}: {:?} vs {:?}",
                            stringify!($field),
                            self.$field,
                            other.$field
                        ));
                    }
                )*
            };
        }
        compare!(
            steps,
            batch_size,
            learning_rate,
            warmup_steps,
            min_lr_ratio,
            weight_decay,
            grad_clip_norm,
            seed
        );
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn setting_of(error: TrainError) -> &'static str {
        match error {
            TrainError::InvalidSetting { setting, .. } => setting,
            other => panic!("expected an invalid setting, got {other}"),
        }
    }

    #[test]
    fn defaults_are_valid() {
        assert!(TrainSettings::default().validate().is_ok());
    }

    #[test]
    fn each_bad_value_names_its_setting() {
        let base = TrainSettings::default();
        let cases: Vec<(TrainSettings, &str)> = vec![
            (
                TrainSettings {
                    steps: 0,
                    ..base.clone()
                },
                "steps",
            ),
            (
                TrainSettings {
                    batch_size: 0,
                    ..base.clone()
                },
                "batch_size",
            ),
            (
                TrainSettings {
                    learning_rate: 0.0,
                    ..base.clone()
                },
                "learning_rate",
            ),
            (
                TrainSettings {
                    learning_rate: -1e-3,
                    ..base.clone()
                },
                "learning_rate",
            ),
            (
                TrainSettings {
                    learning_rate: f64::NAN,
                    ..base.clone()
                },
                "learning_rate",
            ),
            (
                TrainSettings {
                    warmup_steps: base.steps + 1,
                    ..base.clone()
                },
                "warmup_steps",
            ),
            (
                TrainSettings {
                    min_lr_ratio: -0.1,
                    ..base.clone()
                },
                "min_lr_ratio",
            ),
            (
                TrainSettings {
                    min_lr_ratio: 1.5,
                    ..base.clone()
                },
                "min_lr_ratio",
            ),
            (
                TrainSettings {
                    weight_decay: -1.0,
                    ..base.clone()
                },
                "weight_decay",
            ),
            (
                TrainSettings {
                    grad_clip_norm: Some(0.0),
                    ..base.clone()
                },
                "grad_clip_norm",
            ),
            (
                TrainSettings {
                    eval_every: 0,
                    ..base.clone()
                },
                "eval_every",
            ),
            (
                TrainSettings {
                    checkpoint_every: 0,
                    ..base.clone()
                },
                "checkpoint_every",
            ),
        ];
        for (settings, expected) in cases {
            let error = settings.validate().expect_err(expected);
            let line = error.to_string();
            assert!(!line.contains('\n'), "{line}");
            assert_eq!(setting_of(error), expected);
        }
    }

    #[test]
    fn warmup_may_fill_the_run() {
        let settings = TrainSettings {
            steps: 10,
            warmup_steps: 10,
            ..TrainSettings::default()
        };
        assert!(settings.validate().is_ok());
    }

    #[test]
    fn cadence_is_no_trajectory_difference() {
        let a = TrainSettings::default();
        let b = TrainSettings {
            eval_every: 7,
            checkpoint_every: 3,
            ..a.clone()
        };
        assert_eq!(a.trajectory_difference(&b), None);
        let c = TrainSettings {
            learning_rate: 2e-3,
            ..a.clone()
        };
        let difference = a.trajectory_difference(&c).unwrap_or_default();
        assert!(difference.starts_with("learning_rate"), "{difference}");
    }

    #[test]
    fn unknown_fields_are_refused() {
        let json = r#"{"steps":1,"batch_size":1,"learning_rate":0.1,"warmup_steps":0,
            "min_lr_ratio":0.1,"weight_decay":0,"grad_clip_norm":null,"seed":0,"eval_every":1,
            "checkpoint_every":1,"lr":3}"#;
        assert!(serde_json::from_str::<TrainSettings>(json).is_err());
    }
}
