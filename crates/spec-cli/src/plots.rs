//! The SVG plots of `spec bench` (plotters, SVG backend only: no fonts or bitmaps needed; text
//! is left to the SVG viewer).

use std::path::Path;

use anyhow::{Result, anyhow};
use plotters::prelude::*;

/// Grouped bars: one group per category, one bar per series (`None`: no bar).
#[derive(Debug, Clone)]
pub(crate) struct Bars {
    pub(crate) categories: Vec<String>,
    pub(crate) series: Vec<(String, Vec<Option<f64>>)>,
}

fn color(i: usize) -> RGBColor {
    const PALETTE: [RGBColor; 8] = [
        RGBColor(31, 119, 180),
        RGBColor(255, 127, 14),
        RGBColor(44, 160, 44),
        RGBColor(214, 39, 40),
        RGBColor(148, 103, 189),
        RGBColor(140, 86, 75),
        RGBColor(227, 119, 194),
        RGBColor(127, 127, 127),
    ];
    PALETTE[i % PALETTE.len()]
}

fn plot_error(e: impl std::fmt::Display) -> anyhow::Error {
    anyhow!("drawing a plot: {e}")
}

/// Speedup over plain decoding per category and method, with a line at 1×.
pub(crate) fn speedup_svg(path: &Path, bars: &Bars) -> Result<()> {
    let root = SVGBackend::new(path, (960, 520)).into_drawing_area();
    root.fill(&WHITE).map_err(plot_error)?;
    let n = bars.categories.len().max(1);
    let top = bars
        .series
        .iter()
        .flat_map(|(_, v)| v.iter().flatten())
        .fold(1.0f64, |a, &b| a.max(b))
        * 1.15;
    // Category `c` is centred on x = c, so the mesh's integer key points label the groups.
    let mut chart = ChartBuilder::on(&root)
        .caption("Speedup over plain decoding", ("sans-serif", 22))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(50)
        .build_cartesian_2d(-0.5f64..(n as f64 - 0.5), 0f64..top)
        .map_err(plot_error)?;
    let names = bars.categories.clone();
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(n)
        .x_label_formatter(&|x| {
            let i = x.round();
            if (x - i).abs() < 1e-6 && i >= 0.0 {
                names.get(i as usize).cloned().unwrap_or_default()
            } else {
                String::new()
            }
        })
        .y_desc("speedup (×)")
        .draw()
        .map_err(plot_error)?;
    let k = bars.series.len().max(1);
    let width = 0.8 / k as f64;
    for (s, (label, values)) in bars.series.iter().enumerate() {
        let c = color(s);
        let rects = values.iter().enumerate().filter_map(|(i, v)| {
            let x0 = i as f64 - 0.4 + s as f64 * width;
            v.map(|v| Rectangle::new([(x0, 0.0), (x0 + width * 0.92, v)], c.filled()))
        });
        chart
            .draw_series(rects)
            .map_err(plot_error)?
            .label(label.as_str())
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], c.filled()));
    }
    chart
        .draw_series(LineSeries::new(
            [(-0.5, 1.0), (n as f64 - 0.5, 1.0)],
            BLACK.stroke_width(1),
        ))
        .map_err(plot_error)?;
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperRight)
        .draw()
        .map_err(plot_error)?;
    root.present().map_err(plot_error)?;
    Ok(())
}

/// Acceptance rate at each draft position, one line per method.
pub(crate) fn acceptance_svg(path: &Path, series: &[(String, Vec<f64>)]) -> Result<()> {
    let root = SVGBackend::new(path, (960, 520)).into_drawing_area();
    root.fill(&WHITE).map_err(plot_error)?;
    let depth = series
        .iter()
        .map(|(_, v)| v.len())
        .max()
        .unwrap_or(0)
        .max(1);
    let mut chart = ChartBuilder::on(&root)
        .caption("Acceptance by draft position", ("sans-serif", 22))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(50)
        .build_cartesian_2d(0.5f64..(depth as f64 + 0.5), 0f64..1.05)
        .map_err(plot_error)?;
    chart
        .configure_mesh()
        .x_labels(depth.min(16))
        .x_label_formatter(&|x| {
            if (x - x.round()).abs() < 1e-6 {
                format!("{}", x.round())
            } else {
                String::new()
            }
        })
        .x_desc("draft position")
        .y_desc("accepted ÷ drafted")
        .draw()
        .map_err(plot_error)?;
    for (s, (label, values)) in series.iter().enumerate() {
        let c = color(s);
        let points: Vec<(f64, f64)> = values
            .iter()
            .enumerate()
            .map(|(i, v)| (i as f64 + 1.0, *v))
            .collect();
        chart
            .draw_series(LineSeries::new(points.clone(), c.stroke_width(2)))
            .map_err(plot_error)?
            .label(label.as_str())
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 14, y)], c.stroke_width(2)));
        chart
            .draw_series(points.into_iter().map(|p| Circle::new(p, 3, c.filled())))
            .map_err(plot_error)?;
    }
    if !series.is_empty() {
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .position(SeriesLabelPosition::UpperRight)
            .draw()
            .map_err(plot_error)?;
    }
    root.present().map_err(plot_error)?;
    Ok(())
}

/// τ against tokens drafted a step, one point a method (`(label, drafted, τ)`): how much of a
/// tree's (or a chain's) size turns into accepted tokens.
pub(crate) fn tau_by_size_svg(path: &Path, points: &[(String, f64, f64)]) -> Result<()> {
    let root = SVGBackend::new(path, (960, 520)).into_drawing_area();
    root.fill(&WHITE).map_err(plot_error)?;
    let x_max = points.iter().map(|p| p.1).fold(1.0f64, f64::max) * 1.1;
    let y_max = points.iter().map(|p| p.2).fold(1.0f64, f64::max) * 1.1;
    let mut chart = ChartBuilder::on(&root)
        .caption("τ against drafted tokens a step", ("sans-serif", 22))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(50)
        .build_cartesian_2d(0f64..x_max, 0f64..y_max)
        .map_err(plot_error)?;
    chart
        .configure_mesh()
        .x_desc("drafted tokens a step (a tree's nodes)")
        .y_desc("τ (tokens a target pass)")
        .draw()
        .map_err(plot_error)?;
    for (i, (label, x, y)) in points.iter().enumerate() {
        let c = color(i);
        chart
            .draw_series(std::iter::once(Circle::new((*x, *y), 5, c.filled())))
            .map_err(plot_error)?
            .label(label.as_str())
            .legend(move |(x, y)| Circle::new((x + 7, y), 4, c.filled()));
    }
    if !points.is_empty() {
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .position(SeriesLabelPosition::LowerRight)
            .draw()
            .map_err(plot_error)?;
    }
    root.present().map_err(plot_error)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plots_are_svg_with_labels() {
        let dir = tempfile::tempdir().unwrap();
        let bars = Bars {
            categories: vec!["code".into(), "rag".into(), "all".into()],
            series: vec![
                ("prompt-lookup".into(), vec![Some(1.8), None, Some(1.3)]),
                ("sampling".into(), vec![Some(0.7), Some(1.1), Some(0.9)]),
            ],
        };
        let path = dir.path().join("s.svg");
        speedup_svg(&path, &bars).unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        assert!(svg.starts_with("<svg"));
        for label in ["code", "rag", "prompt-lookup", "sampling", "Speedup"] {
            assert!(svg.contains(label), "missing {label}");
        }
        // Five bars plus one legend swatch per series, in the series colours.
        assert!(svg.matches("fill=\"#1F77B4\"").count() >= 3);

        let path = dir.path().join("a.svg");
        acceptance_svg(&path, &[("pl".into(), vec![0.9, 0.5, 0.25])]).unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        assert!(svg.contains("draft position") && svg.contains("pl"));
        assert!(svg.contains("<polyline") || svg.contains("<path"));
        let path = dir.path().join("t.svg");
        tau_by_size_svg(
            &path,
            &[("plain".into(), 0.0, 1.0), ("tree".into(), 11.5, 4.2)],
        )
        .unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        assert!(svg.contains("drafted tokens a step") && svg.contains("tree"));
        assert!(svg.matches("<circle").count() >= 2);
        // An empty run still writes a valid (empty) plot.
        acceptance_svg(&path, &[]).unwrap();
        tau_by_size_svg(&path, &[]).unwrap();
        speedup_svg(
            &path,
            &Bars {
                categories: vec![],
                series: vec![],
            },
        )
        .unwrap();
    }
}
