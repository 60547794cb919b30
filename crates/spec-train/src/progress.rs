//! Reporting progress while training: a terminal bar, or nothing.

use std::io::IsTerminal;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::metrics::Evaluation;

/// Where one step stands, as the trainer reports it after the optimizer step.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepStatus {
    /// Steps done, this one included.
    pub done: usize,
    /// Steps in the whole run.
    pub steps: usize,
    /// This step's training loss.
    pub loss: f64,
    /// The training loss smoothed over recent steps.
    pub smoothed_loss: f64,
    /// This step's learning rate.
    pub learning_rate: f64,
    /// Tokens per second since this run (or resume) started.
    pub tokens_per_second: f64,
}

/// Receives the trainer's progress; every method does nothing unless implemented.
pub trait Progress {
    /// Training starts (or resumes) with `done` of `steps` steps behind it.
    fn start(&mut self, _done: usize, _steps: usize) {}
    /// A step is done.
    fn step(&mut self, _status: &StepStatus) {}
    /// A held-out evaluation after `done` steps.
    fn evaluated(&mut self, _done: usize, _evaluation: &Evaluation) {}
    /// Training ends (the run is complete or stopped early).
    fn finish(&mut self) {}
}

/// Reports nothing: for tests and quiet runs.
#[derive(Debug, Clone, Copy, Default)]
pub struct Silent;

impl Progress for Silent {}

/// An indicatif bar on stderr (step/steps, smoothed loss, tokens/s, time left), drawn only when
/// stderr is a terminal.
#[derive(Debug)]
pub struct TerminalProgress {
    bar: Option<ProgressBar>,
    last_eval: Option<f64>,
}

impl TerminalProgress {
    /// A bar when stderr is a terminal, an inert reporter otherwise.
    pub fn new() -> Self {
        Self {
            bar: None,
            last_eval: None,
        }
    }
}

impl Default for TerminalProgress {
    fn default() -> Self {
        Self::new()
    }
}

impl Progress for TerminalProgress {
    fn start(&mut self, done: usize, steps: usize) {
        if !std::io::stderr().is_terminal() {
            return;
        }
        let bar = ProgressBar::with_draw_target(Some(steps as u64), ProgressDrawTarget::stderr());
        if let Ok(style) = ProgressStyle::with_template(
            "{bar:30.cyan/blue} {pos}/{len} steps  {msg}  [{elapsed_precise}, {eta} left]",
        ) {
            bar.set_style(style.progress_chars("=> "));
        }
        bar.set_position(done as u64);
        // The time left follows this run's pace, not the resumed part's.
        bar.reset_eta();
        self.bar = Some(bar);
    }

    fn step(&mut self, status: &StepStatus) {
        if let Some(bar) = &self.bar {
            let eval = self
                .last_eval
                .map(|loss| format!("  held-out {loss:.4}"))
                .unwrap_or_default();
            bar.set_message(format!(
                "loss {:.4}{eval}  lr {:.2e}  {:.0} tok/s",
                status.smoothed_loss, status.learning_rate, status.tokens_per_second
            ));
            bar.set_position(status.done as u64);
        }
    }

    fn evaluated(&mut self, _done: usize, evaluation: &Evaluation) {
        self.last_eval = Some(evaluation.loss);
    }

    fn finish(&mut self) {
        if let Some(bar) = self.bar.take() {
            bar.finish();
        }
    }
}
