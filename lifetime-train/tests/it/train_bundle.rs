//! The trainer on a small synthetic trace: a bundle that loads, validates, predicts sensibly, and
//! refuses to load when tampered with.

use lifetime_model::bundle::{
    seal, BundleError, LifetimeModel, LoadLimits, BINARY_MODEL_FILE, CHECKSUMMED_FILES, MANIFEST_FILE,
    SURVIVAL_MODEL_FILE,
};
use lifetime_model::features::FeatureGroup;
use lifetime_model::survival::LifetimeReading;
use lifetime_model::RequestFeatures;
use lifetime_train::train::{train_bundle, FeatureChoice, TrainConfig, TrainData};
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
fn the_survival_model_gives_one_distribution_for_request_time_and_every_age() {
    let dir = tempfile::tempdir().unwrap();
    let manifest = train(dir.path());
    let spec = manifest.survival.clone().expect("a survival model by default");
    let report = manifest.evaluation.survival.as_ref().expect("its evaluation");
    // It orders exits better than chance, overall and among the long-lived VMs, and it beats the
    // featureless curve on the Brier score.
    for (what, c) in [("all", &report.all.survival), ("long", &report.long.survival)] {
        assert!(c.harrell > 0.55 && c.uno > 0.5, "{what}: {c:?}");
    }
    assert!(report.integrated_brier < report.integrated_brier_marginal, "{report:?}");
    assert!(report.auc_p_long > 0.7, "{report:?}");
    assert_eq!(report.calibration.len(), 9);
    let validation = manifest.evaluation.validation.as_ref().unwrap();
    assert!(validation.hazard.as_ref().is_some_and(|h| h.rounds > 0) && validation.survival_auc.is_some());

    let model = LifetimeModel::load(dir.path()).expect("bundle loads");
    let vm = RequestFeatures {
        tenant_id: "t3".to_owned(),
        vm_type: "D4".to_owned(),
        cores: 4.0,
        memory_gib: 16.0,
        time_s: 5.5 * 86_400.0,
        ..RequestFeatures::default()
    };
    let row = model.encode(&vm);
    let curve = model.survival_curve(&row).expect("a curve");
    assert_eq!(curve.len(), spec.edges_s.len());
    assert!(curve.windows(2).all(|w| w[1] <= w[0]) && curve.iter().all(|s| (0.0..=1.0).contains(s)));
    // The lifetime served at request time is the remaining lifetime at age 0, and every path to
    // the remaining lifetime (HTTP's, the allocator's cached curve) reads the same distribution.
    let prediction = model.predict_row(&row, false);
    assert_eq!(prediction.expected_lifetime_s, model.predict_remaining(&vm, 0.0));
    for age in [0.0, 600.0, 7_200.0, 86_400.0] {
        let from_curve = model.remaining_from_curve(&curve, age);
        assert!((from_curve - model.predict_remaining(&vm, age)).abs() <= 1e-9 * from_curve, "age {age}");
    }
    // Another reading of the same distribution: a later quantile reads a later exit.
    let late = LifetimeModel::load(dir.path()).unwrap().with_reading(LifetimeReading::Quantile { q: 0.9 });
    assert!(late.predict_row(&row, false).expected_lifetime_s >= prediction.expected_lifetime_s);

    // A bundle trained without one still loads and serves the regression.
    let old = tempfile::tempdir().unwrap();
    let records = generate(&SyntheticConfig { span_days: 6.0, seed: 5, ..SyntheticConfig::default() });
    let data = TrainData { source: "synthetic seed 5".to_owned(), train: records, eval: None, trace_end_s: None };
    let config = TrainConfig { survival_edges_s: Vec::new(), ..quick_config() };
    let manifest = train_bundle(data, &config, old.path(), &()).expect("training succeeds");
    assert!(manifest.survival.is_none() && manifest.evaluation.survival.is_none());
    assert!(!old.path().join(SURVIVAL_MODEL_FILE).exists());
    let model = LifetimeModel::load(old.path()).expect("bundle loads");
    assert!(model.survival_curve(&model.encode(&vm)).is_none() && model.reading().is_none());
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

    // The trainer sealed every file the bundle loads.
    let manifest: lifetime_model::Manifest = serde_json::from_str(&original).unwrap();
    let sealed: Vec<&str> = manifest.checksums.keys().map(String::as_str).collect();
    let mut expected = CHECKSUMMED_FILES.to_vec();
    expected.push(SURVIVAL_MODEL_FILE);
    expected.sort_unstable();
    assert_eq!(sealed, expected);

    // A model file swapped for another model: its checksum no longer matches, and sealing it
    // anyway is refused because the probes no longer reproduce (the manifest stays as it was).
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
    let err = LifetimeModel::load(dir.path()).err().expect("checksum mismatch");
    assert!(matches!(err, BundleError::ChecksumMismatch { file: BINARY_MODEL_FILE, .. }), "{err}");
    let err = seal(dir.path(), &LoadLimits::default()).expect_err("probe mismatch");
    assert!(matches!(err, BundleError::Probe { .. } | BundleError::InputCount { .. }), "{err}");
    assert_eq!(std::fs::read_to_string(&manifest_path).unwrap(), original);

    // A truncated model file: refused by its checksum, and it cannot be sealed either.
    std::fs::write(&binary_path, &binary[..binary.len() / 2]).unwrap();
    assert!(matches!(LifetimeModel::load(dir.path()), Err(BundleError::ChecksumMismatch { .. })));
    assert!(matches!(seal(dir.path(), &LoadLimits::default()), Err(BundleError::Model { .. })));
    std::fs::write(&binary_path, &binary).unwrap();
    assert!(LifetimeModel::load(dir.path()).is_ok());
}

/// Trees per iteration of a LightGBM text model times its iterations.
fn trees(model_text: &str) -> usize {
    model_text.lines().filter(|l| l.starts_with("Tree=")).count()
}

#[test]
fn the_feature_search_picks_a_set_and_the_bundle_schema_keeps_only_it() {
    let dir = tempfile::tempdir().unwrap();
    let manifest = train(dir.path());
    let validation = manifest.evaluation.validation.as_ref().expect("a validation report");
    let features = &validation.features;
    assert!(!features.forced);
    // The synthetic trace has tenants and VM types: every subset of the three groups is tried.
    assert_eq!(features.candidates.len(), 8, "{features:?}");
    assert!(features.candidates.iter().all(|c| c.auc.is_finite() && c.best_iteration >= 1));
    assert!(features.candidates.iter().any(|c| c.dropped == features.dropped));
    let names = manifest.schema.names();
    for group in FeatureGroup::ALL {
        let present = match group {
            FeatureGroup::Weekday => names.iter().any(|n| n == "weekday"),
            FeatureGroup::Tenant => names.iter().any(|n| n.starts_with("tenant_")),
            FeatureGroup::Job => names.iter().any(|n| n.starts_with("job_")),
        };
        assert_eq!(present, !features.dropped.contains(&group), "{group} in {names:?}");
    }
    let chosen = features.candidates.iter().find(|c| c.dropped == features.dropped).unwrap();
    assert_eq!(chosen.features, names.len());
    // Refit rounds: the validation's best, at least the minimum, and what the model files hold.
    let config = quick_config();
    for (rounds, file, per_round) in [
        (&validation.binary, "long_lived.lgbm.txt", 1),
        (&validation.multiclass, "lifetime_interval.lgbm.txt", manifest.class_cutoffs_s.len() + 1),
        (&validation.remaining, "remaining_lifetime.lgbm.txt", 1),
    ] {
        assert!(rounds.best_iteration >= 1 && rounds.best_value.is_finite(), "{rounds:?}");
        assert_eq!(rounds.rounds, rounds.best_iteration.max(config.min_rounds).min(config.iterations), "{rounds:?}");
        let text = std::fs::read_to_string(dir.path().join(file)).unwrap();
        assert_eq!(trees(&text), rounds.rounds * per_round, "{file}");
    }
    let exit = manifest.evaluation.exit_time.as_ref().expect("exit-time quality");
    assert!(exit.c_index > 0.5 && exit.c_index <= 1.0, "{exit:?}");
    assert!(exit.long_vms > 0 && exit.completed_long_vms <= exit.long_vms);
    assert!(exit.mae_log10_long.is_finite());
    let report = manifest.evaluation.to_markdown();
    assert!(report.contains("Harrell's C") && report.contains("validation AUC"), "{report}");
}

#[test]
fn forced_feature_groups_are_dropped_without_a_search() {
    let dir = tempfile::tempdir().unwrap();
    let records = generate(&SyntheticConfig { span_days: 6.0, seed: 5, ..SyntheticConfig::default() });
    let data = TrainData { source: "synthetic seed 5".to_owned(), train: records, eval: None, trace_end_s: None };
    let config = TrainConfig {
        features: FeatureChoice::Drop(vec![FeatureGroup::Job, FeatureGroup::Tenant, FeatureGroup::Weekday]),
        ..quick_config()
    };
    let manifest = train_bundle(data, &config, dir.path(), &()).unwrap();
    let features = &manifest.evaluation.validation.as_ref().unwrap().features;
    assert!(features.forced);
    assert_eq!(features.candidates.len(), 1);
    assert_eq!(features.dropped, FeatureGroup::ALL);
    assert!(manifest.schema.groups().is_empty(), "{:?}", manifest.schema.names());
    // No tenant or job feature: the feature store is empty, and the bundle still predicts.
    let store = std::fs::read_to_string(dir.path().join("feature_store.json")).unwrap();
    assert!(store.contains("\"tenants\":{}") && !store.contains("jobs"), "{}", &store[..store.len().min(200)]);
    let model = LifetimeModel::load(dir.path()).unwrap();
    let p = model.predict(&RequestFeatures { tenant_id: "t1".into(), cores: 2.0, ..RequestFeatures::default() }, false);
    assert!((0.0..=1.0).contains(&p.p_long));
}

/// Whatever the evaluation trace holds, the choices and the models are the same: only the
/// training period decides them.
#[test]
fn the_evaluation_period_never_shapes_the_choices_or_the_models() {
    let records = generate(&SyntheticConfig { span_days: 6.0, seed: 8, ..SyntheticConfig::default() });
    let split_at = 4.0 * 86_400.0;
    let (train, eval): (Vec<_>, Vec<_>) = records.into_iter().partition(|r| r.start_s < split_at);
    // The same arrivals with other lifetimes and types.
    let mut other = eval.clone();
    for (k, r) in other.iter_mut().enumerate() {
        r.end_s = Some(r.start_s + if k % 2 == 0 { 30.0 } else { 20_000.0 });
        r.vm_type = format!("x{}", k % 7);
    }
    let bundle = |eval: Vec<traces::VmRecord>| {
        let dir = tempfile::tempdir().unwrap();
        let data = TrainData { source: "seed 8".into(), train: train.clone(), eval: Some(eval), trace_end_s: None };
        let manifest = train_bundle(data, &quick_config(), dir.path(), &()).unwrap();
        let binary = std::fs::read_to_string(dir.path().join(BINARY_MODEL_FILE)).unwrap();
        let remaining = std::fs::read_to_string(dir.path().join("remaining_lifetime.lgbm.txt")).unwrap();
        (manifest, binary, remaining)
    };
    let (a, a_binary, a_remaining) = bundle(eval);
    let (b, b_binary, b_remaining) = bundle(other);
    assert_eq!(a.evaluation.validation, b.evaluation.validation);
    assert!(a.evaluation.validation.as_ref().unwrap().valid_from_s < a.training.cutoff_s);
    assert_eq!(a.schema, b.schema);
    assert_eq!(a.decision_threshold, b.decision_threshold);
    assert_eq!(a_binary, b_binary);
    assert_eq!(a_remaining, b_remaining);
    assert_ne!(a.evaluation.binary.auc, b.evaluation.binary.auc, "the evaluations differ");
}
