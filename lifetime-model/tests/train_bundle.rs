//! The trainer on a small synthetic trace: a bundle that loads, validates, predicts sensibly, and
//! refuses to load when tampered with.

use lifetime_model::bundle::{BundleError, LifetimeModel, BINARY_MODEL_FILE, MANIFEST_FILE};
use lifetime_model::train::{train_bundle, TrainConfig, TrainData};
use lifetime_model::RequestFeatures;
use traces::synthetic::{generate, SyntheticConfig};

fn quick_config() -> TrainConfig {
    TrainConfig { version: "test-1".to_owned(), iterations: 60, max_remaining_vms: 20_000, ..TrainConfig::default() }
}

fn train(dir: &std::path::Path) -> lifetime_model::Manifest {
    let records = generate(&SyntheticConfig { span_days: 6.0, seed: 5, ..SyntheticConfig::default() });
    let data = TrainData { source: "synthetic seed 5".to_owned(), train: records, eval: None, trace_end_s: None };
    train_bundle(data, &quick_config(), dir, &()).expect("training succeeds")
}

#[test]
fn a_trained_bundle_loads_and_predicts_what_the_report_says() {
    let dir = tempfile::tempdir().unwrap();
    let manifest = train(dir.path());
    let report = &manifest.evaluation;
    // The synthetic trace is built to be predictable but not perfectly.
    assert!(report.binary.auc > 0.8 && report.binary.auc < 0.99, "AUC {}", report.binary.auc);
    assert!(report.binary.examples > 1_000);
    assert_eq!(report.remaining.curves[0].f1_by_quantile.len(), 20);
    // Repredictions with uptime beat the prediction at arrival (paper 000 Fig. 9).
    let curve = &report.remaining.curves[0].f1_by_quantile;
    assert!(curve[8] > curve[0] + 0.1, "F1 at quantile 8 {} vs 0 {}", curve[8], curve[0]);

    let model = LifetimeModel::load(dir.path()).expect("bundle loads");
    assert_eq!(model.version(), "test-1");
    let vm = |tenant: &str, cores: f64| RequestFeatures {
        tenant_id: tenant.to_owned(),
        vm_type: format!("D{cores}"),
        cores,
        memory_gib: 4.0 * cores,
        time_s: 5.5 * 86_400.0,
        ..RequestFeatures::default()
    };
    let p = model.predict(&vm("t1", 2.0), true);
    assert!((0.0..=1.0).contains(&p.p_long));
    assert!(p.expected_lifetime_s >= 1.0 && p.expected_lifetime_s <= 7.0 * 86_400.0);
    assert!((p.interval_class.expect("asked for") as usize) <= manifest.class_cutoffs_s.len());
    assert_eq!(model.predict(&vm("t1", 2.0), false).interval_class, None);
    // Remaining lifetime never exceeds the cap, and a VM that has already run a day is expected to
    // run on for longer than a fresh one of the same kind.
    let fresh = model.predict_remaining(&vm("t1", 2.0), 0.0);
    let old = model.predict_remaining(&vm("t1", 2.0), 86_400.0);
    assert!(old > fresh, "remaining after a day {old} vs at start {fresh}");
}

#[test]
fn tampered_bundles_are_rejected_with_a_reason() {
    let dir = tempfile::tempdir().unwrap();
    train(dir.path());
    let manifest_path = dir.path().join(MANIFEST_FILE);
    let original = std::fs::read_to_string(&manifest_path).unwrap();

    // A schema edited without its hash.
    let edited = original.replacen("\"history_window_s\": 604800.0", "\"history_window_s\": 3600.0", 1);
    assert_ne!(edited, original);
    std::fs::write(&manifest_path, &edited).unwrap();
    assert!(matches!(LifetimeModel::load(dir.path()), Err(BundleError::SchemaHash { .. })));
    std::fs::write(&manifest_path, &original).unwrap();

    // A model file swapped for another model: the probes no longer reproduce.
    let binary_path = dir.path().join(BINARY_MODEL_FILE);
    let binary = std::fs::read_to_string(&binary_path).unwrap();
    let other_dir = tempfile::tempdir().unwrap();
    let records = generate(&SyntheticConfig { span_days: 6.0, seed: 6, ..SyntheticConfig::default() });
    train_bundle(
        TrainData { source: "seed 6".into(), train: records, eval: None, trace_end_s: None },
        &quick_config(),
        other_dir.path(),
        &(),
    )
    .unwrap();
    let other_binary = std::fs::read_to_string(other_dir.path().join(BINARY_MODEL_FILE)).unwrap();
    std::fs::write(&binary_path, &other_binary).unwrap();
    let err = LifetimeModel::load(dir.path()).err().expect("probe mismatch");
    assert!(matches!(err, BundleError::Probe { .. } | BundleError::InputCount { .. }), "{err}");

    // A truncated model file.
    std::fs::write(&binary_path, &binary[..binary.len() / 2]).unwrap();
    assert!(matches!(LifetimeModel::load(dir.path()), Err(BundleError::Model { .. })));
    std::fs::write(&binary_path, &binary).unwrap();
    assert!(LifetimeModel::load(dir.path()).is_ok());
}
