//! The run's SVG plots: packing density and empty hosts, and the realized prediction quality per model version.

use crate::*;
use std::path::{Path, PathBuf};

/// Draws packing density and empty hosts (both in percent) over trace time, in hours, as SVG.
pub fn write_plot(series: &[SeriesPoint], path: &Path) -> Result<(), ReplayError> {
    draw_plot(series, path).map_err(|err| ReplayError::Plot { path: path.to_owned(), message: err.to_string() })
}

fn draw_plot(series: &[SeriesPoint], path: &Path) -> Result<(), Box<dyn std::error::Error>> {
    use plotters::prelude::*;
    let hours = |p: &SeriesPoint| p.trace_s / 3_600.0;
    let x_min = series.iter().map(hours).fold(f64::INFINITY, f64::min);
    let x_max = series.iter().map(hours).fold(f64::NEG_INFINITY, f64::max);
    let (x_min, x_max) = if x_min.is_finite() && x_max > x_min { (x_min, x_max) } else { (0.0, 1.0) };
    let density: Vec<(f64, f64)> = series.iter().filter_map(|p| Some((hours(p), p.packing_density? * 100.0))).collect();
    let empty: Vec<(f64, f64)> = series.iter().filter_map(|p| Some((hours(p), p.empty_hosts_pct?))).collect();
    let root = SVGBackend::new(path, (800, 480)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption("Packing density and empty hosts during the replay", ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(50)
        .build_cartesian_2d(x_min..x_max, 0.0..100.0)?;
    chart.configure_mesh().x_desc("trace time (h)").y_desc("%").draw()?;
    for (name, points, color) in [("packing density", density, BLUE), ("empty hosts", empty, RED)] {
        chart
            .draw_series(LineSeries::new(points, color.stroke_width(2)))?
            .label(name)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2)));
    }
    chart.configure_series_labels().background_style(WHITE.mix(0.8)).border_style(BLACK).draw()?;
    root.present()?;
    Ok(())
}

/// Where the quality plot goes beside the `--plot` file: `replay.svg` -> `replay-quality.svg`.
pub fn quality_plot_path(plot: &Path) -> PathBuf {
    let stem = plot.file_stem().map_or_else(|| "replay".into(), |s| s.to_string_lossy().into_owned());
    plot.with_file_name(format!("{stem}-quality.svg"))
}

/// True when some sample carries a model version's realized quality (worth a plot).
pub fn has_quality(series: &[SeriesPoint]) -> bool {
    series.iter().any(|p| !p.quality.is_empty())
}

/// Draws the realized quality of each model version over trace time, in hours, as SVG: four
/// panels (ROC AUC, average precision, precision, recall of the long-lived class), one line per
/// version. A sample without a figure (too few outcomes, one class only) leaves a gap.
pub fn write_quality_plot(series: &[SeriesPoint], path: &Path) -> Result<(), ReplayError> {
    draw_quality_plot(series, path).map_err(|err| ReplayError::Plot { path: path.to_owned(), message: err.to_string() })
}

/// Reads one figure of a sample.
type Figure = fn(&QualitySample) -> Option<f64>;

/// A version's line: runs of (trace hours, value) between missing values.
type VersionLine = (String, Vec<Vec<(f64, f64)>>);

/// The figures the quality plot draws, with their panel titles.
const QUALITY_PANELS: [(&str, Figure); 4] = [
    ("ROC AUC", |q| q.roc_auc),
    ("average precision", |q| q.average_precision),
    ("precision (long-lived)", |q| q.precision),
    ("recall (long-lived)", |q| q.recall),
];

/// Each version's points of one figure, in sample order, cut into runs at missing values.
pub(crate) fn quality_lines(series: &[SeriesPoint], figure: Figure) -> Vec<VersionLine> {
    let mut versions: Vec<String> = Vec::new();
    for point in series {
        for q in &point.quality {
            if !versions.contains(&q.version) {
                versions.push(q.version.clone());
            }
        }
    }
    versions
        .into_iter()
        .map(|version| {
            let mut runs: Vec<Vec<(f64, f64)>> = Vec::new();
            let mut run: Vec<(f64, f64)> = Vec::new();
            for point in series {
                match point.quality.iter().find(|q| q.version == version).and_then(figure).filter(|v| v.is_finite()) {
                    Some(v) => run.push((point.trace_s / 3_600.0, v)),
                    None if !run.is_empty() => runs.push(std::mem::take(&mut run)),
                    None => {}
                }
            }
            if !run.is_empty() {
                runs.push(run);
            }
            (version, runs)
        })
        .collect()
}

fn draw_quality_plot(series: &[SeriesPoint], path: &Path) -> Result<(), Box<dyn std::error::Error>> {
    use plotters::prelude::*;
    let hours = |p: &SeriesPoint| p.trace_s / 3_600.0;
    let x_min = series.iter().map(hours).fold(f64::INFINITY, f64::min);
    let x_max = series.iter().map(hours).fold(f64::NEG_INFINITY, f64::max);
    let (x_min, x_max) = if x_min.is_finite() && x_max > x_min { (x_min, x_max) } else { (0.0, 1.0) };
    let root = SVGBackend::new(path, (1000, 700)).into_drawing_area();
    root.fill(&WHITE)?;
    let root = root.titled("Realized prediction quality during the replay, per model version", ("sans-serif", 20))?;
    for (area, (title, figure)) in root.split_evenly((2, 2)).iter().zip(QUALITY_PANELS) {
        let mut chart = ChartBuilder::on(area)
            .caption(title, ("sans-serif", 16))
            .margin(10)
            .x_label_area_size(35)
            .y_label_area_size(45)
            .build_cartesian_2d(x_min..x_max, 0.0..1.0)?;
        chart.configure_mesh().x_desc("trace time (h)").draw()?;
        for (k, (version, runs)) in quality_lines(series, figure).into_iter().enumerate() {
            let color = Palette99::pick(k).to_rgba();
            let mut labelled = false;
            for run in runs {
                let drawn = chart.draw_series(LineSeries::new(run, color.stroke_width(2)))?;
                if !labelled {
                    labelled = true;
                    drawn
                        .label(version.clone())
                        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2)));
                }
            }
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::LowerRight)
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()?;
    }
    root.present()?;
    Ok(())
}
