//! The SVG plots of the evaluation, drawn with `plotters` in the style of the workspace's other
//! plots (`lifetime-model`'s report, `control-service`'s replay): white background, 20 px sans-serif
//! caption, a legend with a white, bordered background.
//!
//! - [`time_series_svg`]: metrics over simulated time (x in hours), one line per series.
//! - [`bars_svg`]: one bar per label, e.g. the gain of each policy over a baseline (negative values
//!   go below the zero line).
//! - [`sweep_svg`]: a metric against a swept parameter (e.g. prediction accuracy), lines with points.
//! - [`panels_log2_svg`]: panels side by side sharing a doubling x axis (1, 2, 4, ... agents),
//!   lines with points and whiskers (the range over seeds).
//!
//! Points that are not finite are left out rather than failing the plot; an empty plot still gets
//! its axes, so a run with nothing to show still writes a valid file.

use plotters::coord::ranged1d::SegmentValue;
use plotters::prelude::*;
use plotters::style::text_anchor;
use std::ops::Range;
use std::path::{Path, PathBuf};

/// A chart's frame, the same in every plot here: its caption (`font_size` px), margins and axis
/// label areas.
fn frame<'a, 'b, DB: DrawingBackend>(
    area: &'a DrawingArea<DB, plotters::coord::Shift>,
    caption: &str,
    font_size: u32,
) -> ChartBuilder<'a, 'b, DB> {
    let mut builder = ChartBuilder::on(area);
    builder.caption(caption, ("sans-serif", font_size)).margin(12).x_label_area_size(40).y_label_area_size(60);
    builder
}

/// One named line of a plot.
#[derive(Clone, Debug, PartialEq)]
pub struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
}

impl Series {
    pub fn new(name: impl Into<String>, points: Vec<(f64, f64)>) -> Self {
        Series { name: name.into(), points }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum PlotError {
    #[error("cannot draw `{path}`: {message}")]
    Draw { path: PathBuf, message: String },
}

const SIZE: (u32, u32) = (800, 480);
const COLORS: [RGBColor; 8] = [
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
    RGBColor(255, 127, 14),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(23, 190, 207),
];

fn color(i: usize) -> RGBColor {
    COLORS[i % COLORS.len()]
}

/// Lines over time: `series` points are (hours, value).
pub fn time_series_svg(path: &Path, title: &str, y_label: &str, series: &[Series]) -> Result<(), PlotError> {
    draw_lines(path, title, "simulated time (h)", y_label, series, false).map_err(|e| draw_error(path, e))
}

/// Lines with a marker at each point, for sweeps over a parameter.
pub fn sweep_svg(path: &Path, title: &str, x_label: &str, y_label: &str, series: &[Series]) -> Result<(), PlotError> {
    draw_lines(path, title, x_label, y_label, series, true).map_err(|e| draw_error(path, e))
}

/// A point of a [`RangedSeries`]: x, y, and the range of y (over seeds), drawn as a whisker.
pub type RangedPoint = (f64, f64, Option<(f64, f64)>);

/// One line of a [`Panel`].
#[derive(Clone, Debug, PartialEq)]
pub struct RangedSeries {
    pub name: String,
    pub points: Vec<RangedPoint>,
}

/// One panel of [`panels_log2_svg`].
#[derive(Clone, Debug, PartialEq)]
pub struct Panel {
    pub caption: String,
    pub y_label: String,
    pub series: Vec<RangedSeries>,
}

/// Panels side by side, each with its own y axis, over one x axis in powers of two (x > 0; the
/// ticks read 1, 2, 4, ...).
pub fn panels_log2_svg(path: &Path, title: &str, x_label: &str, panels: &[Panel]) -> Result<(), PlotError> {
    draw_panels(path, title, x_label, panels).map_err(|e| draw_error(path, e))
}

/// One bar of [`bars_svg`]: a value, and optionally the range it comes from (drawn as a whisker;
/// the spread over seeds, for a mean).
#[derive(Clone, Debug, PartialEq)]
pub struct Bar {
    pub label: String,
    pub value: f64,
    pub range: Option<(f64, f64)>,
}

impl Bar {
    pub fn new(label: impl Into<String>, value: f64) -> Self {
        Bar { label: label.into(), value, range: None }
    }

    pub fn with_range(mut self, low: f64, high: f64) -> Self {
        self.range = Some((low, high));
        self
    }
}

/// One bar per label, with its value written above (or below) it and its range as a whisker.
pub fn bars_svg(path: &Path, title: &str, y_label: &str, bars: &[Bar]) -> Result<(), PlotError> {
    draw_bars(path, title, y_label, bars).map_err(|e| draw_error(path, e))
}

fn draw_error(path: &Path, err: Box<dyn std::error::Error>) -> PlotError {
    PlotError::Draw { path: path.to_owned(), message: err.to_string() }
}

/// The finite points of a series.
fn finite(points: &[(f64, f64)]) -> impl Iterator<Item = (f64, f64)> + '_ {
    points.iter().copied().filter(|(x, y)| x.is_finite() && y.is_finite())
}

/// The span of `values` with a margin of 5% each side; a single value gets a unit-wide span and
/// no value gives 0..1, so that the axes can always be drawn.
fn padded(values: impl Iterator<Item = f64>) -> Range<f64> {
    let (min, max) = values.fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| (lo.min(v), hi.max(v)));
    if !(min.is_finite() && max.is_finite()) {
        return 0.0..1.0;
    }
    if max - min <= f64::EPSILON * max.abs().max(1.0) {
        let half = (min.abs() * 0.05).max(0.5);
        return min - half..max + half;
    }
    let margin = (max - min) * 0.05;
    min - margin..max + margin
}

fn draw_lines(
    path: &Path,
    title: &str,
    x_label: &str,
    y_label: &str,
    series: &[Series],
    markers: bool,
) -> Result<(), Box<dyn std::error::Error>> {
    let x_range = padded(series.iter().flat_map(|s| finite(&s.points).map(|(x, _)| x)));
    let y_range = padded(series.iter().flat_map(|s| finite(&s.points).map(|(_, y)| y)));
    let root = SVGBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = frame(&root, title, 20).build_cartesian_2d(x_range, y_range)?;
    chart.configure_mesh().x_desc(x_label).y_desc(y_label).draw()?;
    for (i, s) in series.iter().enumerate() {
        let color = color(i);
        chart
            .draw_series(LineSeries::new(finite(&s.points), color.stroke_width(2)))?
            .label(s.name.as_str())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2)));
        if markers {
            chart.draw_series(finite(&s.points).map(|p| Circle::new(p, 3, color.filled())))?;
        }
    }
    if !series.is_empty() {
        chart.configure_series_labels().background_style(WHITE.mix(0.8)).border_style(BLACK).draw()?;
    }
    root.present()?;
    Ok(())
}

fn draw_panels(path: &Path, title: &str, x_label: &str, panels: &[Panel]) -> Result<(), Box<dyn std::error::Error>> {
    let log2 = |x: f64| if x > 0.0 { x.log2() } else { f64::NAN };
    let root = SVGBackend::new(path, (SIZE.0 * panels.len().max(1) as u32 * 3 / 4, SIZE.1)).into_drawing_area();
    root.fill(&WHITE)?;
    let root = root.titled(title, ("sans-serif", 20))?;
    let areas = root.split_evenly((1, panels.len().max(1)));
    let xs = || panels.iter().flat_map(|p| p.series.iter()).flat_map(|s| s.points.iter().map(|p| log2(p.0)));
    let x_range = padded(xs().filter(|x| x.is_finite()));
    for (panel, area) in panels.iter().zip(&areas) {
        let points = || panel.series.iter().flat_map(|s| s.points.iter()).filter(|p| log2(p.0).is_finite());
        let y_range = padded(
            points()
                .flat_map(|&(_, y, range)| {
                    let (lo, hi) = range.unwrap_or((y, y));
                    [y, lo, hi]
                })
                .filter(|v| v.is_finite())
                .chain([0.0]),
        );
        let mut chart = frame(area, panel.caption.as_str(), 16).build_cartesian_2d(x_range.clone(), y_range)?;
        // Ticks at the whole powers of two only.
        let ticks = (x_range.end.floor() - x_range.start.ceil()).max(0.0) as usize + 1;
        chart
            .configure_mesh()
            .x_labels(ticks)
            .x_label_formatter(&|x: &f64| {
                if (x - x.round()).abs() < 1e-6 {
                    format!("{}", 2f64.powf(x.round()))
                } else {
                    String::new()
                }
            })
            .x_desc(x_label)
            .y_desc(panel.y_label.as_str())
            .draw()?;
        for (i, s) in panel.series.iter().enumerate() {
            let color = color(i);
            let line: Vec<(f64, f64)> = s
                .points
                .iter()
                .map(|&(x, y, _)| (log2(x), y))
                .filter(|(x, y)| x.is_finite() && y.is_finite())
                .collect();
            chart
                .draw_series(LineSeries::new(line.iter().copied(), color.stroke_width(2)))?
                .label(s.name.as_str())
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2)));
            chart.draw_series(line.iter().map(|&p| Circle::new(p, 3, color.filled())))?;
            for &(x, _, range) in &s.points {
                let Some((lo, hi)) = range.filter(|(lo, hi)| lo.is_finite() && hi.is_finite() && hi > lo) else {
                    continue;
                };
                if log2(x).is_finite() {
                    chart.draw_series(std::iter::once(PathElement::new(
                        vec![(log2(x), lo), (log2(x), hi)],
                        color.stroke_width(1),
                    )))?;
                }
            }
        }
        if !panel.series.is_empty() {
            chart
                .configure_series_labels()
                .position(SeriesLabelPosition::UpperLeft)
                .background_style(WHITE.mix(0.8))
                .border_style(BLACK)
                .draw()?;
        }
    }
    root.present()?;
    Ok(())
}

fn draw_bars(path: &Path, title: &str, y_label: &str, bars: &[Bar]) -> Result<(), Box<dyn std::error::Error>> {
    // A non-finite value gets no bar, but keeps its label so that the gap shows.
    let value = |v: f64| if v.is_finite() { v } else { 0.0 };
    let ranges = || bars.iter().filter_map(|b| b.range).filter(|(lo, hi)| lo.is_finite() && hi.is_finite());
    // The zero line is always in view: bars start from it.
    let y_range =
        padded(bars.iter().map(|b| value(b.value)).chain(ranges().flat_map(|(lo, hi)| [lo, hi])).chain([0.0]));
    let count = i32::try_from(bars.len()).unwrap_or(i32::MAX).max(1);
    let root = SVGBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = frame(&root, title, 20).build_cartesian_2d((0..count).into_segmented(), y_range)?;
    let label = |v: &SegmentValue<i32>| match v {
        SegmentValue::CenterOf(i) | SegmentValue::Exact(i) => {
            usize::try_from(*i).ok().and_then(|i| bars.get(i)).map(|b| b.label.clone()).unwrap_or_default()
        }
        SegmentValue::Last => String::new(),
    };
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(bars.len().max(1))
        .x_label_formatter(&label)
        .y_desc(y_label)
        .draw()?;
    chart.draw_series(std::iter::once(PathElement::new(
        vec![(SegmentValue::Exact(0), 0.0), (SegmentValue::Last, 0.0)],
        BLACK.stroke_width(1),
    )))?;
    for (i, b) in bars.iter().enumerate() {
        let Ok(i) = i32::try_from(i) else { break };
        let v = value(b.value);
        let color = if v < 0.0 { color(1) } else { color(0) };
        let mut bar =
            Rectangle::new([(SegmentValue::Exact(i), 0.0), (SegmentValue::Exact(i + 1), v)], color.mix(0.8).filled());
        // A gap between neighbouring bars.
        bar.set_margin(0, 0, 8, 8);
        chart.draw_series(std::iter::once(bar))?;
        if let Some((low, high)) = b.range.filter(|(lo, hi)| lo.is_finite() && hi.is_finite()) {
            let whisker = PathElement::new(
                vec![(SegmentValue::CenterOf(i), low), (SegmentValue::CenterOf(i), high)],
                BLACK.stroke_width(2),
            );
            chart.draw_series(std::iter::once(whisker))?;
        }
        // Above a positive bar, below a negative one.
        let anchor = if v < 0.0 { text_anchor::VPos::Top } else { text_anchor::VPos::Bottom };
        let style = TextStyle::from(("sans-serif", 14).into_font())
            .pos(text_anchor::Pos::new(text_anchor::HPos::Center, anchor));
        chart.draw_series(std::iter::once(Text::new(format!("{v:.2}"), (SegmentValue::CenterOf(i), v), style)))?;
    }
    root.present()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(path: &Path) -> String {
        std::fs::read_to_string(path).unwrap()
    }

    #[test]
    fn time_series_are_drawn_with_their_names() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("series.svg");
        let series = [
            Series::new("packing density PBFR", vec![(0.0, 80.0), (1.5, 82.0), (3.0, 81.0)]),
            Series::new("packing density LA", vec![(0.0, 84.0), (1.5, f64::NAN), (3.0, 85.0)]),
        ];
        time_series_svg(&path, "Packing density", "%", &series).unwrap();
        let svg = read(&path);
        assert!(svg.starts_with("<svg") && svg.contains("Packing density"), "{svg}");
        assert!(svg.contains("packing density PBFR") && svg.contains("packing density LA"));
    }

    #[test]
    fn bars_are_drawn_with_their_labels_and_negative_values() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("bars.svg");
        let bars = [
            Bar::new("LA-binary", 1.5).with_range(1.2, 1.9),
            Bar::new("LA-multiclass", -0.25),
            Bar::new("DPBFR", f64::INFINITY),
        ];
        bars_svg(&path, "Gain over PBFR", "pp", &bars).unwrap();
        let svg = read(&path);
        for name in ["LA-binary", "LA-multiclass", "DPBFR", "1.50", "-0.25"] {
            assert!(svg.contains(name), "{name} missing");
        }
    }

    #[test]
    fn sweeps_are_drawn_with_markers_and_their_names() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sweep.svg");
        let series =
            [Series::new("NILAS", vec![(0.5, 1.0), (0.7, 2.0), (0.9, 3.0)]), Series::new("LAVA", vec![(0.5, 4.0)])];
        sweep_svg(&path, "Empty hosts gain by accuracy", "accuracy", "pp", &series).unwrap();
        let svg = read(&path);
        assert!(svg.contains("NILAS") && svg.contains("LAVA") && svg.contains("<circle"), "{svg}");
    }

    #[test]
    fn panels_share_a_doubling_axis_and_draw_their_whiskers() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("panels.svg");
        let line = |name: &str| RangedSeries {
            name: name.to_owned(),
            points: vec![
                (1.0, 0.0, None),
                (2.0, 0.5, Some((0.4, 0.6))),
                (64.0, 3.0, Some((2.5, 3.5))),
                (0.0, 1.0, None),
            ],
        };
        let panels = [
            Panel { caption: "conflicts".into(), y_label: "%".into(), series: vec![line("lag 1"), line("lag 8")] },
            Panel { caption: "loss".into(), y_label: "pp".into(), series: vec![line("lag 1")] },
        ];
        panels_log2_svg(&path, "Agents", "agents", &panels).unwrap();
        let svg = read(&path);
        for text in ["Agents", "conflicts", "loss", "lag 8"] {
            assert!(svg.contains(text), "{text} missing");
        }
        // The ticks read as powers of two, not as their logarithms.
        let labels: Vec<&str> = svg.lines().map(str::trim).collect();
        for tick in ["1", "2", "64"] {
            assert!(labels.contains(&tick), "tick {tick} missing");
        }
        assert!(!labels.contains(&"6"), "a tick at log2(64)");
    }

    #[test]
    fn nothing_to_draw_still_gives_a_valid_plot_and_a_bad_path_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("empty.svg");
        time_series_svg(&path, "Nothing", "%", &[]).unwrap();
        assert!(read(&path).contains("</svg>"));
        bars_svg(&path, "No bars", "pp", &[]).unwrap();
        assert!(read(&path).contains("No bars"));
        let nan_only = [Series::new("nan", vec![(f64::NAN, f64::NAN)])];
        sweep_svg(&path, "NaN", "x", "y", &nan_only).unwrap();
        let err = time_series_svg(&dir.path().join("missing/dir/x.svg"), "t", "y", &nan_only).unwrap_err();
        assert!(err.to_string().contains("missing/dir/x.svg"), "{err}");
    }
}
