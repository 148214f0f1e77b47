//! The realized prediction quality of a run, measured by the allocator's own outcome tracker: the
//! exact oracle is right about every VM that resolved, noise lowers every figure, censored VMs
//! resolve as long-lived once they outlive the threshold, the last threshold of the window stays
//! unresolved, fallbacks are not tracked, a model is tracked under its bundle's version, and the
//! figures reach the experiment's results.json and summary.md.

use domain::Priority;
use placement::{PolicyConfig, Registry, TieBreak};
use simulator::compare::{self, CrossingKind, Experiment};
use simulator::engine::{run, SimConfig, SimResult};
use simulator::predict::{PredictionConfig, PredictionSourceConfig};
use simulator::workload::{Inventory, SyntheticSpec, TraceSpec, Workload, WorkloadConfig};
use std::path::PathBuf;
use traces::{ExtraColumns, VmRecord};

fn synthetic(max_vms: usize) -> WorkloadConfig {
    WorkloadConfig {
        trace: TraceSpec::Synthetic(SyntheticSpec { days: 2.0, warmup_days: 0.5, ..SyntheticSpec::default() }),
        max_vms: Some(max_vms),
        ..WorkloadConfig::default()
    }
}

fn sim(workload: WorkloadConfig, policy: &str, source: PredictionSourceConfig) -> SimConfig {
    SimConfig {
        workload,
        inventory: Inventory::Auto { cores: 48.0, memory_gib: 384.0, headroom: 0.3, hosts_per_rack: 40 },
        policy: PolicyConfig::preset(policy),
        prediction: PredictionConfig { source, ..PredictionConfig::default() },
        ..SimConfig::default()
    }
}

fn simulate(config: &SimConfig) -> (Workload, SimResult) {
    let workload = Workload::load(&config.workload).unwrap();
    let result = run(&workload, config, &Registry::standard(), |_| {}).unwrap();
    (workload, result)
}

/// The exact oracle's class is the realized class of every VM: precision, recall, ROC AUC and
/// average precision are 1 and its lifetimes are exact. Exactly the VMs placed at least the
/// threshold before the end resolve (censored ones as long-lived once they outlive it); the others'
/// cohorts are not complete and they are in no figure.
#[test]
fn the_exact_oracle_is_right_about_every_resolved_vm() {
    let config = sim(synthetic(3000), "la-binary", PredictionSourceConfig::Oracle);
    let (workload, result) = simulate(&config);
    assert_eq!(result.counters.rejected, 0);
    let quality = result.quality.as_ref().expect("the oracle's predictions are tracked");
    assert_eq!(quality.version, "oracle");
    assert_eq!(quality.long_threshold_s, config.policy.long_threshold_s);
    let f = &quality.figures;
    assert_eq!(quality.tracked, result.counters.placed);
    assert_eq!(f.resolved + quality.unresolved, quality.tracked);
    let threshold = config.policy.long_threshold_s;
    let complete = workload.vms.iter().filter(|vm| vm.arrival_s + threshold <= workload.to_s).count() as u64;
    assert_eq!(f.resolved, complete, "every VM placed a threshold before the end resolves, and only those");
    assert!(quality.unresolved > 0, "the last threshold of the window is unresolved");
    let censored = workload
        .vms
        .iter()
        .filter(|vm| vm.end_s.is_none_or(|end| end > workload.to_s) && vm.arrival_s + threshold <= workload.to_s)
        .count();
    assert!(censored > 0, "some resolved VMs were still running at the end: they resolved as long-lived");
    assert!(f.realized_long_share.unwrap() > 0.05 && f.realized_long_share.unwrap() < 0.95, "{f:?}");
    assert_eq!((f.precision, f.recall), (Some(1.0), Some(1.0)), "{f:?}");
    assert_eq!((f.roc_auc, f.average_precision), (Some(1.0), Some(1.0)), "{f:?}");
    assert_eq!(f.predicted_long_share, f.realized_long_share);
    assert_eq!(f.mean_p_long, f.realized_long_share, "the oracle's p_long is 0 or 1");
    assert!(f.lifetime_log10_mae.unwrap() < 1e-9, "{f:?}");
}

/// Half the noisy oracle's lifetimes are off by sigma 3 decades: every realized figure drops, and
/// precision and recall agree with the prediction report (scored on every VM's true lifetime).
/// With 0/1 scores, ROC AUC is (recall + specificity) / 2 and average precision is
/// precision x recall + base rate x (1 - recall).
#[test]
fn noise_lowers_every_realized_figure() {
    let config = sim(synthetic(3000), "la-binary", PredictionSourceConfig::NoisyAccuracy { accuracy: 0.5 });
    let (_, result) = simulate(&config);
    let quality = result.quality.as_ref().unwrap();
    assert_eq!(quality.version, "accuracy:0.5");
    let f = &quality.figures;
    let (precision, recall) = (f.precision.unwrap(), f.recall.unwrap());
    assert!(precision < 0.9 && recall < 0.9, "{f:?}");
    assert!(f.roc_auc.unwrap() < 0.9 && f.average_precision.unwrap() < 0.9, "{f:?}");
    assert!(f.lifetime_log10_mae.unwrap() > 0.5, "{f:?}");
    let report = &result.prediction;
    assert!((precision - report.precision_long).abs() < 0.05, "{f:?} vs {report:?}");
    assert!((recall - report.recall_long).abs() < 0.05, "{f:?} vs {report:?}");
    let base = f.realized_long_share.unwrap();
    let predicted = f.predicted_long_share.unwrap();
    // Specificity from the counts: false positives / negatives.
    let false_positive_rate = predicted * (1.0 - precision) / (1.0 - base);
    assert!((f.roc_auc.unwrap() - (recall + 1.0 - false_positive_rate) / 2.0).abs() < 1e-9, "{f:?}");
    let ap = precision * recall + base * (1.0 - recall);
    assert!((f.average_precision.unwrap() - ap).abs() < 1e-9, "{f:?}");
    // More accuracy, better figures (same seed, same workload).
    let better = sim(synthetic(3000), "la-binary", PredictionSourceConfig::NoisyAccuracy { accuracy: 0.9 });
    let (_, better) = simulate(&better);
    let g = &better.quality.as_ref().unwrap().figures;
    assert!(g.precision > f.precision && g.recall > f.recall, "{g:?} vs {f:?}");
    assert!(g.roc_auc > f.roc_auc && g.average_precision > f.average_precision, "{g:?} vs {f:?}");
}

fn record(id: &str, start_s: f64, end_s: Option<f64>) -> VmRecord {
    VmRecord {
        vm_id: id.to_owned(),
        tenant_id: "t".to_owned(),
        vm_type: "D".to_owned(),
        cores: 1.0,
        memory_gib: 2.0,
        priority: Priority::Regular,
        start_s,
        end_s,
        extra: ExtraColumns::default(),
    }
}

/// On a hand-made trace with a 100 s threshold: a VM that exits after it, one still running at the
/// end (censored) and one exiting after the window resolve as long-lived; short exits as short; a
/// VM placed less than the threshold before the end stays unresolved, even once it has exited.
#[test]
fn censored_vms_resolve_as_long_lived_once_they_outlive_the_threshold() {
    let records = vec![
        record("long", 0.0, Some(150.0)),
        record("short", 0.0, Some(50.0)),
        record("censored", 10.0, None),
        record("beyond", 20.0, Some(10_000.0)),
        record("short-late", 150.0, Some(170.0)),
        record("late", 200.0, None),
        record("last", 250.0, Some(260.0)),
    ];
    let workload = WorkloadConfig { trace: TraceSpec::Provided { name: "hand-made".into() }, ..Default::default() };
    let mut config = sim(workload, "la-binary", PredictionSourceConfig::Oracle);
    config.inventory = Inventory::Fixed { hosts: 2, cores: 8.0, memory_gib: 16.0, hosts_per_rack: 2 };
    config.policy.long_threshold_s = 100.0;
    config.tie_break = TieBreak::LowestIndex;
    let workload = Workload::from_records(records, &config.workload).unwrap();
    let result = run(&workload, &config, &Registry::standard(), |_| {}).unwrap();
    // The window ends at the last arrival (250): `late` (200) and `last` (250) are too recent.
    let quality = result.quality.unwrap();
    assert_eq!((quality.tracked, quality.unresolved), (7, 2));
    let f = &quality.figures;
    assert_eq!(f.resolved, 5);
    assert_eq!(f.realized_long_share, Some(3.0 / 5.0), "long, censored and beyond: {f:?}");
    assert_eq!((f.precision, f.recall), (Some(1.0), Some(1.0)));
}

/// Fallbacks stand in for a missing model answer: the allocator does not track them, nor does the
/// simulator; the oracle's own answers stay exact.
#[test]
fn fallbacks_are_not_tracked() {
    let mut config = sim(synthetic(2000), "la-binary", PredictionSourceConfig::Oracle);
    config.prediction.fallback_fraction = 0.25;
    let (_, result) = simulate(&config);
    let quality = result.quality.as_ref().unwrap();
    assert_eq!(quality.version, "oracle+fallback:0.25");
    let fallbacks = result.prediction.fallbacks as u64;
    assert_eq!(quality.tracked, result.counters.placed - fallbacks);
    assert_eq!((quality.figures.precision, quality.figures.recall), (Some(1.0), Some(1.0)));
    // No prediction at all: nothing to judge.
    let none = sim(synthetic(500), "la-binary", PredictionSourceConfig::None);
    assert_eq!(simulate(&none).1.quality, None);
}

/// A model's answers are tracked under its bundle's version, with its own probabilities.
#[test]
fn a_model_is_judged_under_its_bundles_version() {
    let bundle = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../models/default");
    let config = sim(synthetic(1500), "la-binary", PredictionSourceConfig::Model { bundle, reading: None });
    let (_, result) = simulate(&config);
    let quality = result.quality.as_ref().unwrap();
    assert_eq!(quality.version, "default-1");
    let f = &quality.figures;
    assert!(f.resolved > 500, "{f:?}");
    let auc = f.roc_auc.unwrap();
    assert!(auc > 0.5 && auc < 1.0, "a real model ranks better than chance, not perfectly: {f:?}");
    let mean = f.mean_p_long.unwrap();
    assert!(mean > 0.0 && mean < 1.0, "{f:?}");
}

/// A sweep writes the realized figures into results.json (every run and every row) and summary.md,
/// and finds where each policy stops beating the baseline.
#[test]
fn the_sweep_reports_realized_quality_and_crossings() {
    let text = r#"
        name = "quality-sweep"
        baseline = "pbfr"
        sweep_label = "prediction accuracy a"
        seeds = [1, 2]
        [base.workload]
        max_vms = 1500
        [base.workload.trace]
        kind = "synthetic"
        days = 1.0
        warmup_days = 0.5
        [[policies]]
        name = "pbfr"
        policy = { kind = "pbfr" }
        [[policies]]
        name = "lava"
        policy = { kind = "lava" }
        [[predictions]]
        name = "a=0.5"
        prediction = { source = { kind = "noisy-accuracy", accuracy = 0.5 } }
        x = 0.5
        [[predictions]]
        name = "a=1.0"
        prediction = { source = { kind = "noisy-accuracy", accuracy = 1.0 } }
        x = 1.0
    "#;
    let mut experiment = Experiment::from_toml(text).unwrap();
    experiment.base.quality_window = Some(300);
    let workload = Workload::load(&experiment.base.workload).unwrap();
    let runs =
        compare::run_all(&workload, experiment.plan(&Registry::standard()).unwrap(), &Registry::standard(), 2, &|_| {})
            .unwrap();
    let comparison = compare::Comparison::new(experiment, runs);
    assert!(comparison.runs.iter().all(|r| r.result.quality.is_some()));
    let row = comparison.rows.iter().find(|r| r.cell.label == "lava / a=0.5").unwrap();
    let precision = row.quality.as_ref().unwrap().precision.unwrap();
    let of = |seed: u64| {
        let run =
            comparison.runs.iter().find(|r| r.plan.cell.label == "lava / a=0.5" && r.plan.config.seed == seed).unwrap();
        run.result.quality.as_ref().unwrap().figures.precision.unwrap()
    };
    assert!((precision.mean - (of(1) + of(2)) / 2.0).abs() < 1e-12);
    let exact = comparison.rows.iter().find(|r| r.cell.label == "lava / a=1.0").unwrap();
    assert!(exact.quality.as_ref().unwrap().precision.unwrap().mean > precision.mean);

    assert_eq!(comparison.crossings.len(), 1, "lava only: pbfr is the baseline");
    let crossing = &comparison.crossings[0];
    assert_eq!((crossing.policy.as_str(), crossing.per_seed.len()), ("lava", 2));
    if crossing.mean.kind == CrossingKind::Crosses {
        let x = crossing.mean.x.unwrap();
        assert!((0.5..=1.0).contains(&x), "{crossing:?}");
        let p = crossing.mean.quality.precision.unwrap();
        assert!(p >= precision.mean - 1e-12, "{crossing:?}");
    }

    let dir = tempfile::tempdir().unwrap();
    compare::write_outputs(&comparison, dir.path()).unwrap();
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("results.json")).unwrap()).unwrap();
    let run = &json["runs"][1]["result"]["quality"];
    assert!(run["figures"]["precision"].is_f64() && run["figures"]["average_precision"].is_f64(), "{run}");
    assert!(run["figures"]["roc_auc"].is_f64() && run["figures"]["lifetime_log10_mae"].is_f64(), "{run}");
    assert!(json["rows"][1]["quality"]["recall"]["mean"].is_f64());
    assert!(json["crossings"][0]["per_seed"].is_array());
    let md = std::fs::read_to_string(dir.path().join("summary.md")).unwrap();
    assert!(md.contains("realized precision | recall | ROC AUC | AP |"), "{md}");
    assert!(md.contains("realized precision / recall / ROC AUC / AP"), "{md}");
    assert!(md.contains("Where each policy stops beating `pbfr`"), "{md}");
    assert!(md.contains("sliding window of 300 outcomes"), "{md}");
    assert!(dir.path().join("sweep_gain_by_precision.svg").exists());
}

/// With `quality_window`, the figures of the allocator's sliding window are read at every metric
/// sample once it is full: exact for the oracle, spread around the whole run's for noise.
#[test]
fn a_sliding_window_shows_how_far_a_gates_figures_move() {
    let mut config = sim(synthetic(3000), "la-binary", PredictionSourceConfig::Oracle);
    config.quality_window = Some(400);
    let (_, result) = simulate(&config);
    let windows = result.quality.as_ref().unwrap().windows.clone().expect("windows measured");
    assert_eq!(windows.window, 400);
    assert!(windows.samples > 5, "{windows:?}");
    let precision = windows.precision.unwrap();
    assert_eq!((precision.min, precision.max), (1.0, 1.0));

    config.prediction.source = PredictionSourceConfig::NoisyAccuracy { accuracy: 0.5 };
    let (_, noisy) = simulate(&config);
    let quality = noisy.quality.as_ref().unwrap();
    let p = quality.windows.as_ref().unwrap().precision.unwrap();
    assert!(p.min <= p.p5 && p.p5 <= p.p50 && p.p50 <= p.p95 && p.p95 <= p.max, "{p:?}");
    assert!(p.max - p.min > 0.0, "400 outcomes are a noisy sample: {p:?}");
    // The warm-up's VMs, all placed at the start and mostly long-lived, fill the first windows:
    // a window's figures follow the mix of VMs it holds, not only the predictions' accuracy.
    let whole = quality.figures.precision.unwrap();
    assert!(p.min < whole && whole < p.max, "{p:?} vs {whole}");
    // The windows do not change the whole run's figures, nor the placements.
    config.quality_window = None;
    let (_, plain) = simulate(&config);
    assert_eq!(plain.quality.as_ref().unwrap().figures, quality.figures);
    assert_eq!(plain.metrics, noisy.metrics);

    config.quality_window = Some(0);
    assert!(config.validate().is_err());
}
