//! The trait a trained method implements to be trained by [`crate::train`].

use burn::module::AutodiffModule;
use burn::tensor::Tensor;
use burn::tensor::backend::AutodiffBackend;
use rand_chacha::ChaCha8Rng;

use crate::metrics::Evaluation;

/// What one method trains and on what: batches, the loss, the held-out evaluation.
///
/// The trainer owns the model, the optimizer, the schedule and the checkpoints; the task stays
/// free of them.
pub trait TrainTask<B: AutodiffBackend> {
    /// The trained module (its parameters are what the optimizer updates and what checkpoints
    /// hold).
    type Model: AutodiffModule<B> + core::fmt::Debug;
    /// One batch, ready on the device.
    type Batch;
    /// The task's own error (reading its data, for example).
    type Error: std::error::Error + Send + Sync + 'static;

    /// The batch for step `step` (0-based). It must depend only on the step and `rng`, which the
    /// trainer seeds from (seed, step), so that a resumed run sees the same batches.
    fn batch(
        &self,
        step: usize,
        rng: &mut ChaCha8Rng,
        batch_size: usize,
        device: &B::Device,
    ) -> Result<Self::Batch, Self::Error>;

    /// Tokens (or examples) in a batch, for the throughput.
    fn batch_tokens(&self, batch: &Self::Batch) -> usize;

    /// The scalar loss (shape `[1]`) to minimise, on the autodiff backend.
    fn loss(&self, model: &Self::Model, batch: Self::Batch) -> Tensor<B, 1>;

    /// The held-out loss and named metrics, on the model without gradients.
    fn evaluate(
        &self,
        model: &<Self::Model as AutodiffModule<B>>::InnerModule,
        device: &B::Device,
    ) -> Result<Evaluation, Self::Error>;

    /// What is trained: the target model's checksum, the method and its settings. Checkpoints
    /// store it and a resume refuses a checkpoint whose identity differs.
    fn identity(&self) -> serde_json::Value;
}
