//! The `lifetime-train` binary as a user runs it.

use std::process::Command;
use traces::csv_format::CsvTraceWriter;
use traces::synthetic::{generate, SyntheticConfig};

fn lifetime_train(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_lifetime-train")).args(args).output().expect("runs");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn trains_a_bundle_with_its_report_and_plots() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("trace.csv.gz");
    let records = generate(&SyntheticConfig { span_days: 4.0, seed: 9, ..SyntheticConfig::default() });
    let mut writer = CsvTraceWriter::create(&trace, records[0].extra.names()).unwrap();
    records.iter().for_each(|r| writer.write(r).unwrap());
    writer.finish().unwrap();
    let out = dir.path().join("bundle");
    let (ok, stdout, stderr) = lifetime_train(&[
        "--train",
        trace.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
        "--version",
        "cli-1",
        "--iterations",
        "20",
        "--max-remaining-vms",
        "5000",
        "--class-cutoffs-minutes",
        "15,60,240",
        "--drop",
        "weekday",
    ]);
    assert!(ok, "{stderr}");
    assert!(stdout.contains("ROC AUC") && stdout.contains("precision at recall 0.80"), "{stdout}");
    for file in ["manifest.json", "evaluation.md", "roc.svg", "reprediction.svg", "feature_store.json"] {
        assert!(out.join(file).is_file(), "{file} missing");
    }
    let model = lifetime_model::LifetimeModel::load(&out).unwrap();
    assert_eq!(model.version(), "cli-1");
    assert_eq!(model.manifest().class_cutoffs_s, [900.0, 3_600.0, 14_400.0]);
    assert!(!model.schema().names().iter().any(|n| n == "weekday"));
    assert!(stdout.contains("Harrell's C") && stdout.contains("Feature groups forced: dropped weekday"), "{stdout}");
}

#[test]
fn bad_arguments_name_the_flag() {
    let (ok, _, stderr) = lifetime_train(&["--train", "x.csv", "--out", "o", "--class-cutoffs-minutes", "60,15"]);
    assert!(!ok);
    assert!(stderr.contains("--class-cutoffs-minutes"), "{stderr}");
    let (ok, _, stderr) = lifetime_train(&["--train", "x.csv", "--out", "o", "--drop", "weekday,hour"]);
    assert!(!ok);
    assert!(stderr.contains("--drop") && stderr.contains("hour"), "{stderr}");
    let (ok, _, stderr) = lifetime_train(&["--train", "missing.csv", "--out", "o"]);
    assert!(!ok);
    assert!(stderr.contains("missing.csv"), "{stderr}");
}

/// An operator who edits a bundle by hand re-seals it with `lifetime-train --seal DIR`: the edited
/// bundle is refused until then, and loads after.
#[test]
fn seal_rewrites_the_checksums_of_a_hand_edited_bundle() {
    let source = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../models/default");
    let dir = tempfile::tempdir().unwrap();
    let bundle = dir.path().join("edited");
    std::fs::create_dir(&bundle).unwrap();
    lifetime_model::bundle::copy_bundle(&source, &bundle).unwrap();
    // Same tenants, other bytes: what a hand edit of the feature store looks like.
    let store = bundle.join(lifetime_model::bundle::FEATURE_STORE_FILE);
    let mut text = std::fs::read_to_string(&store).unwrap();
    text.push('\n');
    std::fs::write(&store, text).unwrap();
    let refused = lifetime_model::LifetimeModel::load(&bundle).err().expect("the edit is detected");
    assert!(refused.to_string().contains("feature_store.json"), "{refused}");

    let (ok, stdout, stderr) = lifetime_train(&["--seal", bundle.to_str().unwrap()]);
    assert!(ok, "{stderr}");
    assert!(stdout.contains("sealed bundle default") && stdout.contains("feature_store.json"), "{stdout}");
    let model = lifetime_model::LifetimeModel::load(&bundle).expect("the re-sealed bundle loads");
    assert_eq!(model.version(), "default-1");

    // Sealing never trains: --seal and --train together are refused.
    let (ok, _, stderr) = lifetime_train(&["--seal", bundle.to_str().unwrap(), "--train", "x.csv"]);
    assert!(!ok && stderr.contains("--seal"), "{stderr}");
}
