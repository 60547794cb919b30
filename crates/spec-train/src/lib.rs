//! Training machinery shared by the trained drafting methods: Medusa heads (`spec-medusa`),
//! early-exit heads and distilled drafts.
//!
//! - [`data`]: training text from packages (ShareGPT conversations, HumanEval problems), answered
//!   by the target itself or by the package's own replies teacher-forced through the target
//!   ([`data::AnswerSource`]), and cached on disk with the target's last-layer hidden states.
//! - [`identity`]: which target a trained artefact belongs to.
//!
//! The loop, generic over any `B: AutodiffBackend` (Flex on the CPU, CUDA or wgpu elsewhere):
//!
//! - [`TrainTask`]: what a method implements: a batch per step, the loss, the held-out
//!   [`Evaluation`] and an identity that checkpoints carry.
//! - [`train`]: AdamW with weight decay and gradient clipping, the [`lr_at`] schedule (linear
//!   warm-up, cosine decay to a floor), per-step random numbers seeded from (seed, step),
//!   held-out evaluations, checkpoints, resume; it returns the model and a [`TrainReport`].
//! - [`TrainSettings`]: the run's settings (serde), checked by [`TrainSettings::validate`].
//! - [`checkpoint`]: directories of `model.safetensors`, the optimizer's state and
//!   `checkpoint.json`, written atomically; [`load_model`] reads trained weights back for
//!   inference.
//! - [`TopKHits`]: top-1 and top-5 accuracy of logits on any backend, reading back three
//!   integers.
//! - [`Progress`]: a terminal bar ([`TerminalProgress`]) or nothing ([`Silent`]).
//! - [`write_loss_curve`]: the loss curve as SVG.
//!
//! A resumed run equals the uninterrupted one: the batches, the backend's seed, the schedule
//! and the optimizer's moments depend only on (seed, step) and the checkpoint, so on a
//! deterministic backend the parameters match bit for bit (`tests/train.rs`).
//!
//! # Several GPUs
//!
//! [`train`] drives one device. burn 0.21 has the pieces for data parallelism; they would plug
//! in at one place, the step in `trainer.rs`, without changing [`TrainTask`]:
//!
//! - One process, several devices, as burn-train's multi-device strategies do it: per step,
//!   `Module::fork` the model onto each device, ask the task for one shard of the batch per
//!   device (the step's RNG stream plus the shard index), run `loss` and `backward` on each and
//!   turn each into `GradientsParams::from_grads`. Then either move every shard's gradients to
//!   the main device (`GradientsParams::to_device`), sum them with
//!   `burn::optim::GradientsAccumulator` and take a plain `Optimizer::step`
//!   (`MultiDeviceOptim::OptimMainDevice`), or put them in a `burn::optim::MultiGradientsParams`
//!   (`grads: Vec<(GradientsParams, DeviceId)>`) and call `Optimizer::step_multi`, which sums
//!   each parameter's gradients on a device picked per parameter and updates it there
//!   (`MultiDeviceOptim::OptimSharded`). Either way the gradients are summed, so each shard's
//!   loss is divided by the number of devices to keep the mean. Evaluation and checkpoints stay
//!   on the main device. burn-train runs the shards in threads (`MultiDevicesTrainStep`), which
//!   here would need a `Sync` task.
//! - Several processes or nodes: burn's `collective` feature (burn-collective, burn-optim's
//!   `collective`) adds `GradientsParams::all_reduce(peer_id, op)`: every process would
//!   all-reduce its gradients with a mean before a plain `step`. burn-train's DDP strategy
//!   (its `ddp` feature, which burn's `distributed` feature turns on together with
//!   burn-autodiff's and burn-cuda's `distributed`) wires that for burn-train's own `Learner`.
//!
//! Neither is wired: the machines this project tests on have one device each, so such a path
//! would run in no test.

pub mod data;
pub mod identity;

pub mod checkpoint;
mod curve;
mod error;
mod metrics;
mod progress;
mod schedule;
mod settings;
mod smoothing;
mod task;
mod trainer;

pub use checkpoint::{CheckpointMeta, latest_checkpoint, load_model, read_meta};
pub use curve::write_loss_curve;
pub use error::TrainError;
pub use metrics::{Evaluation, TopKHits};
pub use progress::{Progress, Silent, StepStatus, TerminalProgress};
pub use schedule::lr_at;
pub use settings::TrainSettings;
pub use smoothing::{LossSmoother, smoothed};
pub use task::TrainTask;
pub use trainer::{TrainOptions, TrainReport, train};
