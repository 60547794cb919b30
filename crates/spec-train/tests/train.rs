//! The loop on a tiny synthetic task: the loss falls, a resumed run equals an uninterrupted one
//! bit for bit, and bad checkpoints and settings give their errors.

use std::convert::Infallible;
use std::path::Path;

use burn::backend::{Autodiff, Flex};
use burn::module::{AutodiffModule, Module};
use burn::nn::loss::CrossEntropyLossConfig;
use burn::nn::{Initializer, Linear, LinearConfig, Relu};
use burn::tensor::backend::Backend;
use burn::tensor::{Device, Int, Tensor, TensorData};
use rand::Rng;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use spec_train::{
    Evaluation, TopKHits, TrainError, TrainOptions, TrainSettings, TrainTask, latest_checkpoint,
    load_model, read_meta, train, write_loss_curve,
};

type Ad = Autodiff<Flex>;

const FEATURES: usize = 8;
const CLASSES: usize = 6;
const HIDDEN: usize = 32;

#[derive(Module, Debug)]
struct Mlp<B: Backend> {
    input: Linear<B>,
    activation: Relu,
    output: Linear<B>,
}

impl<B: Backend> Mlp<B> {
    fn new(device: &B::Device) -> Self {
        Self {
            input: LinearConfig::new(FEATURES, HIDDEN).init(device),
            activation: Relu::new(),
            output: LinearConfig::new(HIDDEN, CLASSES).init(device),
        }
    }

    /// Every weight 0.5: no random numbers, which other tests' runs reseed process-wide.
    fn constant(device: &B::Device) -> Self {
        let linear = |d_in, d_out| {
            LinearConfig::new(d_in, d_out)
                .with_initializer(Initializer::Constant { value: 0.5 })
                .init(device)
        };
        Self {
            input: linear(FEATURES, HIDDEN),
            activation: Relu::new(),
            output: linear(HIDDEN, CLASSES),
        }
    }

    fn forward(&self, x: Tensor<B, 2>) -> Tensor<B, 2> {
        self.output
            .forward(self.activation.forward(self.input.forward(x)))
    }
}

/// Points in 8 dimensions, labelled by which of 6 fixed directions they lie closest to.
#[derive(Debug)]
struct Nearest {
    directions: Vec<[f32; FEATURES]>,
    held_out: (Vec<f32>, Vec<i64>),
    /// Changes the identity only.
    tag: &'static str,
}

impl Nearest {
    fn new(tag: &'static str) -> Self {
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        let directions = (0..CLASSES)
            .map(|_| std::array::from_fn(|_| rng.random_range(-1.0f32..1.0)))
            .collect();
        let mut task = Self {
            directions,
            held_out: (Vec::new(), Vec::new()),
            tag,
        };
        task.held_out = task.examples(&mut ChaCha8Rng::seed_from_u64(99), 256);
        task
    }

    fn label(&self, x: &[f32]) -> i64 {
        let score = |d: &[f32; FEATURES]| d.iter().zip(x).map(|(a, b)| a * b).sum::<f32>();
        let mut best = 0;
        for (i, d) in self.directions.iter().enumerate() {
            if score(d) > score(&self.directions[best]) {
                best = i;
            }
        }
        best as i64
    }

    fn examples(&self, rng: &mut ChaCha8Rng, n: usize) -> (Vec<f32>, Vec<i64>) {
        let mut xs = Vec::with_capacity(n * FEATURES);
        let mut ys = Vec::with_capacity(n);
        for _ in 0..n {
            let x: [f32; FEATURES] = std::array::from_fn(|_| rng.random_range(-1.0f32..1.0));
            ys.push(self.label(&x));
            xs.extend(x);
        }
        (xs, ys)
    }

    fn tensors<B: Backend>(
        (xs, ys): &(Vec<f32>, Vec<i64>),
        device: &B::Device,
    ) -> (Tensor<B, 2>, Tensor<B, 1, Int>) {
        let n = ys.len();
        (
            Tensor::from_data(TensorData::new(xs.clone(), [n, FEATURES]), device),
            Tensor::from_data(TensorData::new(ys.clone(), [n]), device),
        )
    }
}

impl TrainTask<Ad> for Nearest {
    type Model = Mlp<Ad>;
    type Batch = (Tensor<Ad, 2>, Tensor<Ad, 1, Int>);
    type Error = Infallible;

    fn batch(
        &self,
        _step: usize,
        rng: &mut ChaCha8Rng,
        batch_size: usize,
        device: &Device<Ad>,
    ) -> Result<Self::Batch, Infallible> {
        Ok(Self::tensors(&self.examples(rng, batch_size), device))
    }

    fn batch_tokens(&self, batch: &Self::Batch) -> usize {
        batch.1.dims()[0]
    }

    fn loss(&self, model: &Mlp<Ad>, (x, y): Self::Batch) -> Tensor<Ad, 1> {
        let logits = model.forward(x);
        CrossEntropyLossConfig::new()
            .init(&logits.device())
            .forward(logits, y)
    }

    fn evaluate(&self, model: &Mlp<Flex>, device: &Device<Ad>) -> Result<Evaluation, Infallible> {
        let (x, y) = Self::tensors::<Flex>(&self.held_out, device);
        let logits = model.forward(x);
        let loss = CrossEntropyLossConfig::new()
            .init(device)
            .forward(logits.clone(), y.clone())
            .into_scalar();
        let hits = TopKHits::count(logits, y, None);
        Ok(Evaluation {
            loss: f64::from(loss),
            metrics: hits.metrics(""),
        })
    }

    fn identity(&self) -> serde_json::Value {
        serde_json::json!({ "task": "nearest-direction", "classes": CLASSES, "tag": self.tag })
    }
}

fn settings() -> TrainSettings {
    TrainSettings {
        steps: 200,
        batch_size: 32,
        learning_rate: 1e-2,
        warmup_steps: 5,
        min_lr_ratio: 0.1,
        weight_decay: 1e-4,
        grad_clip_norm: Some(5.0),
        seed: 3,
        eval_every: 50,
        checkpoint_every: 40,
    }
}

fn device() -> Device<Ad> {
    Default::default()
}

fn options(dir: Option<&Path>, resume: bool, stop_after: Option<usize>) -> TrainOptions {
    TrainOptions {
        checkpoint_dir: dir.map(Path::to_path_buf),
        resume,
        stop_after,
        ..TrainOptions::default()
    }
}

/// Every parameter's values, in module order, as bits.
fn parameter_bits<B: Backend, M: Module<B>>(model: &M) -> Vec<Vec<u32>> {
    use burn::store::ModuleSnapshot;
    model
        .collect(None, None, false)
        .into_iter()
        .map(|s| {
            s.to_data()
                .map(|d| d.iter::<f32>().map(f32::to_bits).collect())
                .unwrap_or_default()
        })
        .collect()
}

#[test]
fn the_loss_falls_on_a_synthetic_rule() {
    let task = Nearest::new("a");
    let (_, report) = train(
        &task,
        Mlp::new(&device()),
        &device(),
        &settings(),
        options(None, false, None),
    )
    .expect("training runs");
    let first = &report
        .evaluations
        .first()
        .expect("an evaluation before training")
        .1;
    let last = &report.evaluations.last().expect("a final evaluation").1;
    assert_eq!(report.steps, 200);
    assert_eq!(report.losses.len(), 200);
    assert_eq!(
        report
            .evaluations
            .iter()
            .map(|(s, _)| *s)
            .collect::<Vec<_>>(),
        vec![0, 50, 100, 150, 200]
    );
    assert_eq!(report.tokens, 200 * 32);
    assert!(
        last.loss < 0.4 * first.loss,
        "held-out loss {} -> {}",
        first.loss,
        last.loss
    );
    let top1 = last.metric("top1").expect("top1 reported");
    // Chance is 1/6.
    assert!(top1 > 0.8, "top-1 {top1}");
    assert!(last.metric("top5").expect("top5 reported") >= top1);

    let dir = tempfile::tempdir().expect("temp dir");
    let svg = dir.path().join("curve.svg");
    write_loss_curve(
        &svg,
        "nearest direction",
        &report.losses,
        &report.evaluations,
    )
    .expect("curve drawn");
    let text = std::fs::read_to_string(&svg).expect("svg written");
    assert!(text.starts_with("<svg") && text.contains("held-out loss"));
}

#[test]
fn a_resumed_run_equals_the_uninterrupted_one() {
    let task = Nearest::new("a");
    let start = Mlp::<Ad>::new(&device());
    // burn initialises parameters lazily and a clone of an uninitialised parameter draws its
    // own values: read them once so that both runs start from the same weights.
    let initial = parameter_bits(&start);
    let (whole, whole_report) = train(
        &task,
        start.clone(),
        &device(),
        &settings(),
        options(None, false, None),
    )
    .expect("uninterrupted run");

    let dir = tempfile::tempdir().expect("temp dir");
    let k = 73;
    let (_, first_part) = train(
        &task,
        start,
        &device(),
        &settings(),
        options(Some(dir.path()), false, Some(k)),
    )
    .expect("first part");
    assert_eq!(first_part.steps, k);
    assert_eq!(first_part.losses[..], whole_report.losses[..k]);
    let checkpoint = latest_checkpoint(dir.path())
        .expect("listing")
        .expect("a checkpoint");
    assert!(
        checkpoint.ends_with("step-00000073"),
        "{}",
        checkpoint.display()
    );
    // The older checkpoint (step 40) is gone once a newer one is in place.
    let entries = std::fs::read_dir(dir.path()).expect("listing").count();
    assert_eq!(entries, 1);

    // A fresh model (other weights, other parameter ids) and a fresh optimizer.
    let fresh = Mlp::<Ad>::constant(&device());
    assert_ne!(parameter_bits(&fresh), initial);
    let (resumed, resumed_report) = train(
        &task,
        fresh,
        &device(),
        &settings(),
        options(Some(dir.path()), true, None),
    )
    .expect("resumed run");
    assert_eq!(resumed_report.resumed_from, Some(k));
    assert_eq!(resumed_report.steps, 200);
    assert_eq!(resumed_report.tokens, (200 - k as u64) * 32);
    // The first resumed step's loss, and every one after it, bit for bit.
    assert_eq!(
        resumed_report.losses[k].to_bits(),
        whole_report.losses[k].to_bits()
    );
    assert_eq!(
        resumed_report
            .losses
            .iter()
            .map(|l| l.to_bits())
            .collect::<Vec<_>>(),
        whole_report
            .losses
            .iter()
            .map(|l| l.to_bits())
            .collect::<Vec<_>>()
    );
    assert_eq!(resumed_report.evaluations, whole_report.evaluations);
    assert_eq!(parameter_bits(&resumed), parameter_bits(&whole));

    // The final checkpoint holds the final weights, readable without autodiff.
    let last = latest_checkpoint(dir.path())
        .expect("listing")
        .expect("final checkpoint");
    let mut inference = Mlp::<Flex>::new(&Default::default());
    let meta = load_model(&last, &mut inference).expect("weights load");
    assert_eq!(meta.step, 200);
    assert_eq!(parameter_bits(&inference), parameter_bits(&whole.valid()));

    // Resuming a finished run does nothing more.
    let (_, again) = train(
        &task,
        Mlp::new(&device()),
        &device(),
        &settings(),
        options(Some(dir.path()), true, None),
    )
    .expect("nothing left to do");
    assert_eq!(again.steps, 200);
    assert_eq!(again.tokens, 0);
}

/// A directory with one checkpoint after 5 steps.
fn checkpointed(task: &Nearest) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("temp dir");
    train(
        task,
        Mlp::new(&device()),
        &device(),
        &settings(),
        options(Some(dir.path()), false, Some(5)),
    )
    .expect("first part");
    dir
}

fn resume(task: &Nearest, dir: &Path, settings: &TrainSettings) -> TrainError {
    train(
        task,
        Mlp::new(&device()),
        &device(),
        settings,
        options(Some(dir), true, None),
    )
    .expect_err("the resume is refused")
}

fn one_line(error: &TrainError) -> String {
    let line = error.to_string();
    assert!(!line.contains('\n'), "{line}");
    line
}

#[test]
fn a_truncated_model_file_is_a_corrupt_checkpoint() {
    let task = Nearest::new("a");
    let dir = checkpointed(&task);
    let checkpoint = latest_checkpoint(dir.path())
        .expect("listing")
        .expect("a checkpoint");
    let model = checkpoint.join("model.safetensors");
    let bytes = std::fs::read(&model).expect("model file");
    std::fs::write(&model, &bytes[..bytes.len() / 2]).expect("truncate");
    let error = resume(&task, dir.path(), &settings());
    let line = one_line(&error);
    assert!(
        matches!(error, TrainError::CorruptCheckpoint { .. }),
        "{line}"
    );
    assert!(line.contains("model.safetensors"), "{line}");

    // The weights alone are refused the same way.
    let mut inference = Mlp::<Flex>::new(&Default::default());
    assert!(matches!(
        load_model(&checkpoint, &mut inference),
        Err(TrainError::CorruptCheckpoint { .. })
    ));
}

#[test]
fn a_truncated_optimizer_file_is_a_corrupt_checkpoint() {
    let task = Nearest::new("a");
    let dir = checkpointed(&task);
    let checkpoint = latest_checkpoint(dir.path())
        .expect("listing")
        .expect("a checkpoint");
    let file = checkpoint.join("optimizer.mpk");
    let bytes = std::fs::read(&file).expect("optimizer file");
    std::fs::write(&file, &bytes[..bytes.len() - 7]).expect("truncate");
    let error = resume(&task, dir.path(), &settings());
    let line = one_line(&error);
    assert!(
        matches!(error, TrainError::CorruptCheckpoint { .. }),
        "{line}"
    );
    assert!(line.contains("optimizer.mpk"), "{line}");
}

#[test]
fn bad_json_is_a_corrupt_checkpoint() {
    let task = Nearest::new("a");
    let dir = checkpointed(&task);
    let checkpoint = latest_checkpoint(dir.path())
        .expect("listing")
        .expect("a checkpoint");
    let json = checkpoint.join("checkpoint.json");
    let text = std::fs::read_to_string(&json).expect("json");
    std::fs::write(&json, &text[..text.len() / 3]).expect("truncate");
    let error = resume(&task, dir.path(), &settings());
    let line = one_line(&error);
    assert!(
        matches!(error, TrainError::CorruptCheckpoint { .. }),
        "{line}"
    );
    assert!(line.contains("checkpoint.json"), "{line}");
    assert!(read_meta(&checkpoint).is_err());
}

#[test]
fn another_identity_or_trajectory_is_refused() {
    let dir = checkpointed(&Nearest::new("a"));
    let error = resume(&Nearest::new("b"), dir.path(), &settings());
    let line = one_line(&error);
    assert!(
        matches!(error, TrainError::CheckpointMismatch { .. }),
        "{line}"
    );
    assert!(line.contains("/tag"), "{line}");

    let other = TrainSettings {
        learning_rate: 2e-2,
        ..settings()
    };
    let error = resume(&Nearest::new("a"), dir.path(), &other);
    let line = one_line(&error);
    assert!(
        matches!(error, TrainError::CheckpointMismatch { .. }),
        "{line}"
    );
    assert!(line.contains("learning_rate"), "{line}");

    // The cadence may change on resume.
    let cadence = TrainSettings {
        eval_every: 7,
        checkpoint_every: 9,
        ..settings()
    };
    let (_, report) = train(
        &Nearest::new("a"),
        Mlp::new(&device()),
        &device(),
        &cadence,
        options(Some(dir.path()), true, Some(9)),
    )
    .expect("cadence changes are fine");
    assert_eq!(report.steps, 9);
}

#[test]
fn an_occupied_directory_needs_resume() {
    let task = Nearest::new("a");
    let dir = checkpointed(&task);
    let error = train(
        &task,
        Mlp::new(&device()),
        &device(),
        &settings(),
        options(Some(dir.path()), false, None),
    )
    .expect_err("refused");
    assert!(
        matches!(error, TrainError::CheckpointExists { step: 5, .. }),
        "{}",
        one_line(&error)
    );
}

#[test]
fn invalid_settings_are_refused_before_training() {
    let task = Nearest::new("a");
    let base = settings();
    let cases = [
        (
            TrainSettings {
                steps: 0,
                warmup_steps: 0,
                ..base.clone()
            },
            "steps",
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
                learning_rate: -1.0,
                ..base.clone()
            },
            "learning_rate",
        ),
        (
            TrainSettings {
                warmup_steps: 201,
                ..base.clone()
            },
            "warmup_steps",
        ),
        (
            TrainSettings {
                min_lr_ratio: 1.01,
                ..base.clone()
            },
            "min_lr_ratio",
        ),
        (
            TrainSettings {
                min_lr_ratio: -0.5,
                ..base.clone()
            },
            "min_lr_ratio",
        ),
    ];
    for (bad, name) in cases {
        let error = train(
            &task,
            Mlp::new(&device()),
            &device(),
            &bad,
            TrainOptions::default(),
        )
        .expect_err(name);
        let line = one_line(&error);
        assert!(
            matches!(&error, TrainError::InvalidSetting { setting, .. } if *setting == name),
            "{line}"
        );
    }
}

/// A task whose loss is NaN from the first step.
#[derive(Debug)]
struct Poisoned(Nearest);

impl TrainTask<Ad> for Poisoned {
    type Model = Mlp<Ad>;
    type Batch = (Tensor<Ad, 2>, Tensor<Ad, 1, Int>);
    type Error = Infallible;

    fn batch(
        &self,
        step: usize,
        rng: &mut ChaCha8Rng,
        batch_size: usize,
        device: &Device<Ad>,
    ) -> Result<Self::Batch, Infallible> {
        self.0.batch(step, rng, batch_size, device)
    }

    fn batch_tokens(&self, batch: &Self::Batch) -> usize {
        self.0.batch_tokens(batch)
    }

    fn loss(&self, model: &Mlp<Ad>, batch: Self::Batch) -> Tensor<Ad, 1> {
        self.0.loss(model, batch) * f32::NAN
    }

    fn evaluate(&self, model: &Mlp<Flex>, device: &Device<Ad>) -> Result<Evaluation, Infallible> {
        self.0.evaluate(model, device)
    }

    fn identity(&self) -> serde_json::Value {
        self.0.identity()
    }
}

#[test]
fn a_nan_loss_stops_training() {
    let task = Poisoned(Nearest::new("a"));
    let error = train(
        &task,
        Mlp::new(&device()),
        &device(),
        &settings(),
        TrainOptions::default(),
    )
    .expect_err("NaN loss");
    let line = one_line(&error);
    assert!(
        matches!(error, TrainError::NonFiniteLoss { step: 0, .. }),
        "{line}"
    );
}
