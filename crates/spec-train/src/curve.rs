//! The loss curve as an SVG file: the training loss per step, the same smoothed, and the
//! held-out loss at each evaluation (plotters' SVG backend: no fonts or bitmaps needed).

use std::path::Path;

use plotters::prelude::*;

use crate::error::TrainError;
use crate::metrics::Evaluation;
use crate::smoothing::smoothed;

/// Draws the curve of a run into `path`.
///
/// `losses[s]` is the training loss of step `s`, drawn at `s + 1` steps done; each evaluation
/// is drawn at its number of steps done. The smoothing window is a fiftieth of the run.
pub fn write_loss_curve(
    path: &Path,
    title: &str,
    losses: &[f64],
    evaluations: &[(usize, Evaluation)],
) -> Result<(), TrainError> {
    let plot_error = |e: &dyn std::fmt::Display| TrainError::Plot {
        path: path.to_path_buf(),
        reason: e.to_string(),
    };
    let raw: Vec<(f64, f64)> = finite_points(
        losses
            .iter()
            .enumerate()
            .map(|(s, &loss)| ((s + 1) as f64, loss)),
    );
    let window = (losses.len() as f64 / 50.0).max(1.0);
    let smooth: Vec<(f64, f64)> = finite_points(
        smoothed(losses, window)
            .into_iter()
            .enumerate()
            .map(|(s, loss)| ((s + 1) as f64, loss)),
    );
    let held_out: Vec<(f64, f64)> = finite_points(
        evaluations
            .iter()
            .map(|(done, evaluation)| (*done as f64, evaluation.loss)),
    );

    let all = || raw.iter().chain(&held_out);
    let x_max = all().map(|p| p.0).fold(1.0f64, f64::max);
    let y_max = all().map(|p| p.1).fold(f64::MIN, f64::max);
    let y_min = all().map(|p| p.1).fold(f64::MAX, f64::min);
    let (y_min, y_max) = if y_min <= y_max {
        let pad = ((y_max - y_min) * 0.05).max(1e-6);
        ((y_min - pad).max(0.0_f64.min(y_min)), y_max + pad)
    } else {
        (0.0, 1.0)
    };

    let root = SVGBackend::new(path, (960, 520)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| plot_error(&e))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 22))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(0f64..x_max, y_min..y_max)
        .map_err(|e| plot_error(&e))?;
    chart
        .configure_mesh()
        .x_desc("steps")
        .y_desc("loss")
        .draw()
        .map_err(|e| plot_error(&e))?;

    let faint = RGBColor(31, 119, 180).mix(0.25);
    let train = RGBColor(31, 119, 180);
    let eval = RGBColor(214, 39, 40);
    chart
        .draw_series(LineSeries::new(raw, faint.stroke_width(1)))
        .map_err(|e| plot_error(&e))?
        .label("training loss")
        .legend(move |(x, y)| PathElement::new([(x, y), (x + 16, y)], faint.stroke_width(2)));
    chart
        .draw_series(LineSeries::new(smooth, train.stroke_width(2)))
        .map_err(|e| plot_error(&e))?
        .label("training loss, smoothed")
        .legend(move |(x, y)| PathElement::new([(x, y), (x + 16, y)], train.stroke_width(2)));
    chart
        .draw_series(LineSeries::new(held_out.clone(), eval.stroke_width(2)))
        .map_err(|e| plot_error(&e))?;
    chart
        .draw_series(
            held_out
                .into_iter()
                .map(|p| Circle::new(p, 4, eval.filled())),
        )
        .map_err(|e| plot_error(&e))?
        .label("held-out loss")
        .legend(move |(x, y)| Circle::new((x + 8, y), 4, eval.filled()));
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperRight)
        .draw()
        .map_err(|e| plot_error(&e))?;
    root.present().map_err(|e| plot_error(&e))?;
    Ok(())
}

/// The points with finite coordinates (a NaN would break the axes).
fn finite_points(points: impl Iterator<Item = (f64, f64)>) -> Vec<(f64, f64)> {
    points
        .filter(|(x, y)| x.is_finite() && y.is_finite())
        .collect()
}
