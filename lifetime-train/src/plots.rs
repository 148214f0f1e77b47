//! The SVG plots of a bundle's evaluation report (ROC curve, reprediction curve), written beside
//! its `evaluation.md`.

use lifetime_model::bundle::Manifest;
use lifetime_model::report::{hours, EvaluationReport};
use plotters::prelude::*;
use std::path::Path;

/// Writes what the trainer puts beside a bundle: `evaluation.md` (the report as Markdown, returned)
/// and the plots. A plot that cannot be drawn is no failure: its error comes back as a warning.
pub fn write_report(manifest: &Manifest, dir: &Path) -> Result<(String, Option<String>), std::io::Error> {
    let report = manifest.evaluation.to_markdown();
    std::fs::write(dir.join("evaluation.md"), &report)?;
    let warning = write_plots(&manifest.evaluation, dir).err().map(|err| format!("could not draw the plots: {err}"));
    Ok((report, warning))
}

/// Writes `roc.svg` and `reprediction.svg` into `dir`.
pub fn write_plots(report: &EvaluationReport, dir: &Path) -> Result<(), Box<dyn std::error::Error>> {
    plot_lines(
        &dir.join("roc.svg"),
        &format!("ROC, long-lived >= threshold (AUC {:.3})", report.binary.auc),
        "false positive rate",
        "true positive rate",
        &[("model", report.binary.roc.clone()), ("chance", vec![(0.0, 0.0), (1.0, 1.0)])],
    )?;
    let series: Vec<(String, Vec<(f64, f64)>)> = report
        .remaining
        .curves
        .iter()
        .map(|c| {
            let points = c.f1_by_quantile.iter().enumerate().map(|(k, &f1)| (k as f64, f1)).collect();
            (format!("beyond {}", hours(c.threshold_s)), points)
        })
        .collect();
    let series: Vec<(&str, Vec<(f64, f64)>)> = series.iter().map(|(n, p)| (n.as_str(), p.clone())).collect();
    plot_lines(
        &dir.join("reprediction.svg"),
        "Reprediction: F1 by uptime (k/20 of lifetime)",
        "uptime quantile k",
        "F1",
        &series,
    )?;
    Ok(())
}
fn plot_lines(
    path: &Path,
    title: &str,
    x_label: &str,
    y_label: &str,
    series: &[(&str, Vec<(f64, f64)>)],
) -> Result<(), Box<dyn std::error::Error>> {
    let x_max = series.iter().flat_map(|(_, p)| p.iter().map(|(x, _)| *x)).fold(1.0, f64::max);
    let root = SVGBackend::new(path, (640, 480)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(50)
        .build_cartesian_2d(0.0..x_max, 0.0..1.0)?;
    chart.configure_mesh().x_desc(x_label).y_desc(y_label).draw()?;
    let colors = [BLUE, RED, GREEN, MAGENTA];
    for (i, (name, points)) in series.iter().enumerate() {
        let color = colors[i % colors.len()];
        chart
            .draw_series(LineSeries::new(points.iter().copied(), color.stroke_width(2)))?
            .label(*name)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2)));
    }
    chart.configure_series_labels().background_style(WHITE.mix(0.8)).border_style(BLACK).draw()?;
    root.present()?;
    Ok(())
}
