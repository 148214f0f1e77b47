//! `offline_quality`: the offline evaluation of a model bundle on the VMs of a replay window, beside
//! the predictions the stack served for the same VMs (`vmreplay --predictions`).
//!
//! ```text
//! cargo run --release -p replay --example offline_quality -- \
//!     --bundle target/eval-models/azure-v1 \
//!     --train ../shared/data/azure-v1-tracegen/trace-dev.csv.gz \
//!     --eval ../shared/data/azure-v1-tracegen/trace-test.csv.gz \
//!     --from-s 2099702.785 --duration-s 86400 \
//!     --served live=live.csv --served frozen=frozen.csv
//! ```
//!
//! Offline is the trainer's evaluation (`lifetime_train::train`): the training trace before the
//! bundle's cut-off and the evaluation trace replayed in time order through
//! `lifetime_model::dataset::replay` with the bundle's encoder, so every VM's tenant history is the
//! trace's own past (every arrival and exit before it); labels are the trainer's, censoring-aware
//! (long-lived: lived at least the bundle's threshold, or still running past it). The VMs are those
//! the stack's outcome windows hold at the end of a replay of the window: started in
//! `[from, from + duration)` with their cohort complete (`start + threshold <= cohort end`, the
//! allocator's model clock at the end, `GET /v1/quality` `clock_s`; by default the window's end).
//!
//! Each `--served NAME=CSV` is a replay's predictions. Its column takes the served `p_long` and
//! class of the same VMs with the same labels; VMs it did not place with a model's answer
//! (rejected, failed, fallback) are counted and left out of every column, so that all columns
//! score the same VMs. The served figures equal what the stack's windows report when those hold
//! exactly these VMs. Per column it also says how many VMs were served the offline `p_long`
//! exactly (the same features) and the mean absolute difference.
//!
//! Figures are computed twice: with `domain::quality` (the 1,000 score bins the allocators count
//! in, so they compare with `/v1/stats` to the last digit) and exactly (`lifetime_model::metrics`,
//! as the trainer's report).

use anyhow::{bail, Context, Result};
use clap::Parser;
use domain::quality::{QualityFigures, QualityTally, ResolvedOutcome};
use lifetime_model::dataset::replay;
use lifetime_model::metrics::Scored;
use lifetime_model::LifetimeModel;
use serde::Serialize;
use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use traces::{TraceSource, VmRecord};

#[derive(Parser)]
#[command(
    name = "offline_quality",
    about = "Offline quality of a bundle on a replay window's VMs, beside served predictions"
)]
struct Cli {
    /// The model bundle's directory.
    #[arg(long)]
    bundle: PathBuf,
    /// The trace the bundle was trained on (lifetime-train --train); VMs from the bundle's cut-off
    /// on are dropped, as the trainer drops them.
    #[arg(long)]
    train: PathBuf,
    /// The later trace the window is in (lifetime-train --eval).
    #[arg(long)]
    eval: PathBuf,
    /// Window start, trace seconds (vmreplay --from-s).
    #[arg(long)]
    from_s: f64,
    /// Window length, trace seconds (vmreplay --duration-s).
    #[arg(long)]
    duration_s: f64,
    /// The model clock at the end of the replay (allocator GET /v1/quality `clock_s`): VMs whose
    /// cohort completed by then count [default: the window's end].
    #[arg(long)]
    cohort_end_s: Option<f64>,
    /// A replay's predictions, `NAME=PATH` (vmreplay --predictions); repeat for several.
    #[arg(long, value_name = "NAME=PATH")]
    served: Vec<String>,
    /// Also break the figures down by slices of the window this long (e.g. 86400: per day, by
    /// start time), each with every VM of the slice whose cohort completed by the cohort end.
    #[arg(long, value_name = "SECONDS")]
    by_s: Option<f64>,
    /// Also write the table as JSON.
    #[arg(long)]
    json: Option<PathBuf>,
}

/// One served prediction of a VM.
struct Served {
    p_long: f64,
    long: bool,
}

/// A column of the table.
#[derive(Serialize)]
struct Column {
    name: String,
    /// Binned as the allocators count (comparable with /v1/stats).
    figures: QualityFigures,
    exact_roc_auc: f64,
    exact_average_precision: f64,
    /// VMs whose served p_long equals the offline one (served columns).
    #[serde(skip_serializing_if = "Option::is_none")]
    same_p_long: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    mean_abs_p_long_difference: Option<f64>,
}

#[derive(Serialize)]
struct Report {
    bundle: String,
    version: String,
    cutoff_s: f64,
    window_from_s: f64,
    window_to_s: f64,
    cohort_end_s: f64,
    long_threshold_s: f64,
    decision_threshold: f64,
    /// VMs starting in the window.
    window_vms: usize,
    /// Of them, with a complete cohort and a label.
    cohort_complete: usize,
    /// Left out: not placed with a model's answer in some served replay, by replay.
    left_out: Vec<(String, usize)>,
    /// VMs every column scores.
    scored: usize,
    columns: Vec<Column>,
    /// With `--by-s`: the same columns per slice of the window.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    slices: Vec<Slice>,
}

#[derive(Serialize)]
struct Slice {
    from_s: f64,
    to_s: f64,
    columns: Vec<Column>,
}

fn load(path: &Path) -> Result<Vec<VmRecord>> {
    let reader = TraceSource::from_path(path, None)?.open()?;
    reader.collect::<Result<Vec<_>, _>>().with_context(|| format!("reading {}", path.display()))
}

/// The VMs a replay placed with a model's answer: trace id -> served prediction.
fn read_served(path: &Path) -> Result<HashMap<String, Served>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let mut lines = text.lines();
    if lines.next() != Some(replay::PREDICTION_CSV_HEADER) {
        bail!("{}: not a vmreplay --predictions file (header)", path.display());
    }
    let mut served = HashMap::new();
    for (n, line) in lines.enumerate() {
        // The ids of the traces used here hold no commas or quotes; refuse anything quoted.
        if line.contains('"') {
            bail!("{} line {}: quoted fields are not supported here", path.display(), n + 2);
        }
        let fields: Vec<&str> = line.split(',').collect();
        let [trace_vm_id, _, _, _, _, outcome, p_long, class, version, source, _] = fields[..] else {
            bail!("{} line {}: expected 11 fields", path.display(), n + 2);
        };
        // Only placed VMs with a model's answer are tracked by the allocators (a cached answer
        // names its version too; fallbacks do not).
        if outcome != "placed" || version.is_empty() || !matches!(source, "model" | "cache") {
            continue;
        }
        let p_long: f64 = p_long.parse().with_context(|| format!("{} line {}: p_long", path.display(), n + 2))?;
        served.insert(trace_vm_id.to_owned(), Served { p_long, long: class == "long" });
    }
    Ok(served)
}

/// A VM's prediction (offline or served) beside its label.
fn outcome(p_long: f64, predicted_long: bool, realized_long: bool) -> ResolvedOutcome {
    ResolvedOutcome { p_long, predicted_long, realized_long, lifetime_log10_error: None }
}

fn column(name: &str, outcomes: &[ResolvedOutcome], offline: Option<&[f64]>) -> Column {
    let scores: Vec<f64> = outcomes.iter().map(|o| o.p_long).collect();
    let labels: Vec<bool> = outcomes.iter().map(|o| o.realized_long).collect();
    let exact = Scored::new(&scores, &labels);
    let (same, mad) = match offline {
        Some(offline) => {
            let same = scores.iter().zip(offline).filter(|(a, b)| a.to_bits() == b.to_bits()).count();
            let mad = scores.iter().zip(offline).map(|(a, b)| (a - b).abs()).sum::<f64>() / scores.len().max(1) as f64;
            (Some(same), Some(mad))
        }
        None => (None, None),
    };
    Column {
        name: name.to_owned(),
        figures: QualityTally::of(outcomes).figures(),
        exact_roc_auc: exact.roc_auc(),
        exact_average_precision: exact.average_precision(),
        same_p_long: same,
        mean_abs_p_long_difference: mad,
    }
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    let model = LifetimeModel::load(&cli.bundle).with_context(|| format!("loading {}", cli.bundle.display()))?;
    let manifest = model.manifest();
    let cutoff = manifest.training.cutoff_s;
    let trace_end = manifest.training.trace_end_s;
    let threshold = manifest.long_threshold_s;
    let to_s = cli.from_s + cli.duration_s;
    let cohort_end = cli.cohort_end_s.unwrap_or(to_s);

    // As the trainer: the training trace before the cut-off, then the evaluation trace, in arrival
    // order (a stable sort, so the replay's order is this one).
    let mut records: Vec<VmRecord> = load(&cli.train)?.into_iter().filter(|r| r.start_s < cutoff).collect();
    records.extend(load(&cli.eval)?);
    records.sort_by(|a, b| a.start_s.total_cmp(&b.start_s));
    eprintln!("offline_quality: replaying {} VMs with the bundle's encoder", records.len());
    let replayed = replay(&records, model.encoder(), cutoff, trace_end, cutoff);

    let served: Vec<(String, HashMap<String, Served>)> = cli
        .served
        .iter()
        .map(|spec| {
            let Some((name, path)) = spec.split_once('=') else { bail!("--served takes NAME=PATH, got {spec}") };
            Ok((name.to_owned(), read_served(Path::new(path))?))
        })
        .collect::<Result<_>>()?;

    let window: Vec<usize> =
        (0..records.len()).filter(|&i| records[i].start_s >= cli.from_s && records[i].start_s < to_s).collect();
    let complete: Vec<(usize, bool)> = window
        .iter()
        .filter(|&&i| records[i].start_s + threshold <= cohort_end)
        .filter_map(|&i| replayed.full_label[i].at_least(threshold).map(|long| (i, long)))
        .collect();
    let mut left_out = Vec::new();
    let mut missing: HashSet<usize> = HashSet::new();
    for (name, vms) in &served {
        let absent: Vec<usize> =
            complete.iter().map(|&(i, _)| i).filter(|i| !vms.contains_key(&records[*i].vm_id)).collect();
        left_out.push((name.clone(), absent.len()));
        missing.extend(absent);
    }
    let kept: Vec<(usize, bool)> = complete.iter().copied().filter(|(i, _)| !missing.contains(i)).collect();

    let offline: Vec<ResolvedOutcome> = kept
        .iter()
        .map(|&(i, long)| {
            let prediction = model.predict_row(replayed.row(i), false);
            outcome(prediction.p_long, prediction.class == domain::LifetimeClass::Long, long)
        })
        .collect();
    let served_scores: Vec<(&str, Vec<ResolvedOutcome>)> = served
        .iter()
        .map(|(name, vms)| {
            let scored = kept
                .iter()
                .map(|&(i, long)| {
                    let s = &vms[&records[i].vm_id];
                    outcome(s.p_long, s.long, long)
                })
                .collect();
            (name.as_str(), scored)
        })
        .collect();
    // The columns over the kept VMs (by position) that `pick` keeps.
    let columns_of = |pick: &dyn Fn(usize) -> bool| -> Vec<Column> {
        let subset = |outcomes: &[ResolvedOutcome]| -> Vec<ResolvedOutcome> {
            outcomes.iter().enumerate().filter(|(k, _)| pick(*k)).map(|(_, o)| *o).collect()
        };
        let offline = subset(&offline);
        let offline_scores: Vec<f64> = offline.iter().map(|o| o.p_long).collect();
        let mut columns = vec![column("offline", &offline, None)];
        for (name, scored) in &served_scores {
            columns.push(column(name, &subset(scored), Some(&offline_scores)));
        }
        columns
    };
    let columns = columns_of(&|_| true);
    let mut slices = Vec::new();
    if let Some(by) = cli.by_s.filter(|by| by.is_finite() && *by > 0.0) {
        let mut from = cli.from_s;
        while from < to_s {
            let to = (from + by).min(to_s);
            let in_slice = |k: usize| (from..to).contains(&records[kept[k].0].start_s);
            if (0..kept.len()).any(in_slice) {
                slices.push(Slice { from_s: from, to_s: to, columns: columns_of(&in_slice) });
            }
            from = to;
        }
    }
    let report = Report {
        bundle: cli.bundle.display().to_string(),
        version: manifest.version.clone(),
        cutoff_s: cutoff,
        window_from_s: cli.from_s,
        window_to_s: to_s,
        cohort_end_s: cohort_end,
        long_threshold_s: threshold,
        decision_threshold: manifest.decision_threshold,
        window_vms: window.len(),
        cohort_complete: complete.len(),
        left_out,
        scored: kept.len(),
        columns,
        slices,
    };
    print!("{}", markdown(&report));
    if let Some(path) = &cli.json {
        std::fs::write(path, serde_json::to_vec_pretty(&report)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

fn markdown(report: &Report) -> String {
    let fig = |v: Option<f64>| v.map_or_else(|| "-".to_owned(), |v| format!("{v:.4}"));
    let pct = |v: Option<f64>| v.map_or_else(|| "-".to_owned(), |v| format!("{:.2}%", v * 100.0));
    let mut out = format!(
        "bundle {} ({}), cut-off {:.0} s; window [{:.0} s, {:.0} s): {} VMs, {} with a complete cohort by {:.0} s \
         (threshold {:.0} s); left out (not placed with a model's answer): {}; scored: {}\n\n",
        report.bundle,
        report.version,
        report.cutoff_s,
        report.window_from_s,
        report.window_to_s,
        report.window_vms,
        report.cohort_complete,
        report.cohort_end_s,
        report.long_threshold_s,
        if report.left_out.is_empty() {
            "-".to_owned()
        } else {
            report.left_out.iter().map(|(n, c)| format!("{n} {c}")).collect::<Vec<_>>().join(", ")
        },
        report.scored,
    );
    let names: Vec<&str> = report.columns.iter().map(|c| c.name.as_str()).collect();
    out += &format!("| | {} |\n|---|{}\n", names.join(" | "), "---:|".repeat(names.len()));
    let mut row = |label: &str, cell: &dyn Fn(&Column) -> String| {
        let cells: Vec<String> = report.columns.iter().map(cell).collect();
        out += &format!("| {label} | {} |\n", cells.join(" | "));
    };
    row("VMs resolved", &|c| c.figures.resolved.to_string());
    row("ROC AUC", &|c| fig(c.figures.roc_auc));
    row("average precision", &|c| fig(c.figures.average_precision));
    row("precision (long)", &|c| fig(c.figures.precision));
    row("recall (long)", &|c| fig(c.figures.recall));
    row("realized long share", &|c| pct(c.figures.realized_long_share));
    row("predicted long share", &|c| pct(c.figures.predicted_long_share));
    row("mean p_long", &|c| fig(c.figures.mean_p_long));
    row("ROC AUC (exact)", &|c| format!("{:.4}", c.exact_roc_auc));
    row("average precision (exact)", &|c| format!("{:.4}", c.exact_average_precision));
    row("served p_long = offline", &|c| c.same_p_long.map_or_else(|| "-".to_owned(), |n| n.to_string()));
    row("mean abs(p_long - offline)", &|c| {
        c.mean_abs_p_long_difference.map_or_else(|| "-".to_owned(), |d| format!("{d:.4}"))
    });
    if !report.slices.is_empty() {
        let head: Vec<String> = names.iter().flat_map(|n| [format!("{n} AUC"), format!("{n} AP")]).collect();
        out += &format!(
            "\n| slice (trace s, by start) | VMs | {} |\n|---|---:|{}\n",
            head.join(" | "),
            "---:|".repeat(head.len())
        );
        for slice in &report.slices {
            let cells: Vec<String> =
                slice.columns.iter().flat_map(|c| [fig(c.figures.roc_auc), fig(c.figures.average_precision)]).collect();
            out += &format!(
                "| [{:.0}, {:.0}) | {} | {} |\n",
                slice.from_s,
                slice.to_s,
                slice.columns.first().map_or(0, |c| c.figures.resolved),
                cells.join(" | ")
            );
        }
    }
    out
}
