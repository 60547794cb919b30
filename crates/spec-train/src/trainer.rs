//! The training loop: AdamW on the task's loss, the schedule, held-out evaluations and
//! checkpoints that resume exactly.

use std::path::PathBuf;
use std::time::Instant;

use burn::module::AutodiffModule;
use burn::optim::grad_clipping::GradientClippingConfig;
use burn::optim::{AdamWConfig, GradientsParams, Optimizer};
use burn::tensor::ElementConversion;
use burn::tensor::backend::AutodiffBackend;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

use crate::checkpoint::{
    AdamWOptimizer, CHECKPOINT_FORMAT, CheckpointMeta, check_same_run, latest_checkpoint,
    load_training_state, read_meta, save_checkpoint,
};
use crate::error::TrainError;
use crate::metrics::Evaluation;
use crate::progress::{Progress, Silent, StepStatus};
use crate::schedule::lr_at;
use crate::settings::TrainSettings;
use crate::smoothing::LossSmoother;
use crate::task::TrainTask;

/// Steps the progress bar's smoothed loss remembers.
const PROGRESS_SMOOTHING_WINDOW: f64 = 20.0;

/// How a run is carried out, as opposed to what it computes ([`TrainSettings`]).
pub struct TrainOptions {
    /// Where checkpoints go; `None`: no checkpoints.
    pub checkpoint_dir: Option<PathBuf>,
    /// Continue from the latest checkpoint in `checkpoint_dir`. Without it a directory that
    /// already holds a checkpoint is refused rather than overwritten.
    pub resume: bool,
    /// Stop once this many steps are done (a checkpoint is written there), leaving the rest of
    /// the run to a resume; the schedule still spans `settings.steps`.
    pub stop_after: Option<usize>,
    /// Receives the progress.
    pub progress: Box<dyn Progress>,
}

impl Default for TrainOptions {
    fn default() -> Self {
        Self {
            checkpoint_dir: None,
            resume: false,
            stop_after: None,
            progress: Box::new(Silent),
        }
    }
}

impl std::fmt::Debug for TrainOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TrainOptions")
            .field("checkpoint_dir", &self.checkpoint_dir)
            .field("resume", &self.resume)
            .field("stop_after", &self.stop_after)
            .finish_non_exhaustive()
    }
}

/// What a run did.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrainReport {
    /// Steps done in all, resumed ones included.
    pub steps: usize,
    /// Steps the run resumed from, if it resumed.
    pub resumed_from: Option<usize>,
    /// Wall-clock seconds of this run's steps and evaluations.
    pub seconds: f64,
    /// Tokens (as the task counts them) this run trained on.
    pub tokens: u64,
    /// `tokens / seconds`.
    pub tokens_per_second: f64,
    /// The training loss of every step done, resumed ones included.
    pub losses: Vec<f64>,
    /// Held-out evaluations, each after the number of steps given (0: before training).
    pub evaluations: Vec<(usize, Evaluation)>,
    /// The last checkpoint written, if any.
    pub checkpoint: Option<PathBuf>,
}

/// Trains `model` on `task` for `settings.steps` steps (or up to `options.stop_after`) on
/// `device`, and returns the trained model with a report.
///
/// Each step seeds the batch's random numbers and the backend's (dropout, for instance) from
/// (seed, step), so a run resumed from a checkpoint retraces the uninterrupted run. The
/// backend's seed is process-wide on some backends (Flex): parameters that another thread
/// initialises while training runs draw from the reseeded generator. A fresh run evaluates
/// once before the first step; every run evaluates after every `eval_every` steps and after the
/// last step.
pub fn train<B, T>(
    task: &T,
    model: T::Model,
    device: &B::Device,
    settings: &TrainSettings,
    options: TrainOptions,
) -> Result<(T::Model, TrainReport), TrainError>
where
    B: AutodiffBackend,
    T: TrainTask<B>,
{
    settings.validate()?;
    let TrainOptions {
        checkpoint_dir,
        resume,
        stop_after,
        mut progress,
    } = options;
    let identity = task.identity();
    let mut model = model;
    let mut optimizer: AdamWOptimizer<B, T::Model> = adamw(settings).init();
    let mut losses = Vec::new();
    let mut evaluations = Vec::new();
    let mut resumed_from = None;

    if let Some(dir) = &checkpoint_dir
        && let Some(path) = latest_checkpoint(dir)?
    {
        let meta = read_meta(&path)?;
        if !resume {
            return Err(TrainError::CheckpointExists {
                path: dir.clone(),
                step: meta.step,
            });
        }
        check_same_run(&path, &meta, settings, &identity)?;
        (model, optimizer) = load_training_state(&path, &meta, model, optimizer, device)?;
        resumed_from = Some(meta.step);
        losses = meta.losses;
        evaluations = meta.evaluations;
    }

    let end = stop_after.map_or(settings.steps, |stop| stop.min(settings.steps));
    let mut done = losses.len();
    let started = Instant::now();
    let mut tokens = 0u64;
    let mut smoother = LossSmoother::with_window(PROGRESS_SMOOTHING_WINDOW);
    for &loss in &losses {
        smoother.push(loss);
    }
    let mut last_checkpoint = None;
    progress.start(done, settings.steps);

    let evaluate = |model: &T::Model, done: usize| -> Result<Evaluation, TrainError> {
        task.evaluate(&model.valid(), device)
            .map_err(|e| TrainError::Task {
                step: done,
                source: Box::new(e),
            })
    };
    if done == 0 && end > 0 {
        let evaluation = evaluate(&model, 0)?;
        progress.evaluated(0, &evaluation);
        evaluations.push((0, evaluation));
    }

    while done < end {
        let step = done;
        let learning_rate = lr_at(settings, step);
        B::seed(device, backend_seed(settings.seed, step));
        let mut rng = batch_rng(settings.seed, step);
        let batch = task
            .batch(step, &mut rng, settings.batch_size, device)
            .map_err(|e| TrainError::Task {
                step,
                source: Box::new(e),
            })?;
        tokens += task.batch_tokens(&batch) as u64;
        let loss = task.loss(&model, batch);
        let value: f64 = loss.clone().into_scalar().elem();
        if !value.is_finite() {
            return Err(TrainError::NonFiniteLoss {
                step,
                loss: value,
                learning_rate,
            });
        }
        let grads = GradientsParams::from_grads(loss.backward(), &model);
        model = optimizer.step(learning_rate, model, grads);
        losses.push(value);
        done += 1;

        progress.step(&StepStatus {
            done,
            steps: settings.steps,
            loss: value,
            smoothed_loss: smoother.push(value),
            learning_rate,
            tokens_per_second: tokens as f64 / started.elapsed().as_secs_f64().max(1e-9),
        });
        if done % settings.eval_every == 0 || done == settings.steps {
            let evaluation = evaluate(&model, done)?;
            progress.evaluated(done, &evaluation);
            evaluations.push((done, evaluation));
        }
        if let Some(dir) = &checkpoint_dir
            && (done % settings.checkpoint_every == 0 || done == end)
        {
            let meta = CheckpointMeta {
                format: CHECKPOINT_FORMAT,
                step: done,
                settings: settings.clone(),
                identity: identity.clone(),
                losses: losses.clone(),
                evaluations: evaluations.clone(),
                param_ids: Default::default(),
                sha256: Default::default(),
            };
            last_checkpoint = Some(save_checkpoint(dir, meta, &model, &optimizer)?);
        }
    }
    progress.finish();

    let seconds = started.elapsed().as_secs_f64();
    let report = TrainReport {
        steps: done,
        resumed_from,
        seconds,
        tokens,
        tokens_per_second: if seconds > 0.0 {
            tokens as f64 / seconds
        } else {
            0.0
        },
        losses,
        evaluations,
        checkpoint: last_checkpoint,
    };
    Ok((model, report))
}

/// AdamW with the run's weight decay and clipping, burn's defaults otherwise (betas 0.9 and
/// 0.999, epsilon 1e-5). The decay applies to every parameter.
fn adamw(settings: &TrainSettings) -> AdamWConfig {
    AdamWConfig::new()
        .with_weight_decay(settings.weight_decay as f32)
        .with_grad_clipping(
            settings
                .grad_clip_norm
                .map(|norm| GradientClippingConfig::Norm(norm as f32)),
        )
}

/// The batch's random numbers for `step`: the seed picks the key, the step the stream.
fn batch_rng(seed: u64, step: usize) -> ChaCha8Rng {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    rng.set_stream(step as u64);
    rng
}

/// The backend's seed for `step`, mixed so that neighbouring steps and seeds differ widely.
fn backend_seed(seed: u64, step: usize) -> u64 {
    splitmix64(seed ^ splitmix64(step as u64))
}

fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::Rng;

    #[test]
    fn batch_rngs_depend_only_on_seed_and_step() {
        let draw = |seed, step| batch_rng(seed, step).random::<u64>();
        assert_eq!(draw(1, 5), draw(1, 5));
        assert_ne!(draw(1, 5), draw(1, 6));
        assert_ne!(draw(1, 5), draw(2, 5));
        assert_ne!(backend_seed(0, 0), backend_seed(0, 1));
        assert_ne!(backend_seed(0, 1), backend_seed(1, 0));
    }
}
