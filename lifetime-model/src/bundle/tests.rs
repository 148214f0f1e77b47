//! The bundle's tests: loading and its refusals, confinement, sealing, and predictions that
//! equal each other however they are asked for.

use super::*;
use seal::with_checksums;
use std::time::{Duration, Instant};

fn default_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../models/default")
}

/// A copy of the default bundle's loaded files in a temporary directory.
fn default_copy() -> (tempfile::TempDir, PathBuf) {
    let temp = tempfile::tempdir().unwrap();
    let dir = temp.path().join("bundle");
    std::fs::create_dir(&dir).unwrap();
    copy_bundle(&default_dir(), &dir).unwrap();
    (temp, dir)
}

fn mkfifo(path: &Path) {
    use std::os::unix::ffi::OsStrExt;
    let name = std::ffi::CString::new(path.as_os_str().as_bytes()).unwrap();
    // SAFETY: `name` is a valid NUL-terminated path that outlives the call.
    assert_eq!(unsafe { libc::mkfifo(name.as_ptr(), 0o600) }, 0, "mkfifo {}", path.display());
}

/// The default bundle's curves come from the grid scorer, and are the grid walk's, bit for
/// bit, for its probes' rows and variations of them (the scorer's own tests cover every kind
/// of value; this one covers the bundle's wiring).
#[test]
fn survival_curves_are_the_grid_walks() {
    let model = LifetimeModel::load(default_dir()).unwrap();
    let survival = model.survival.as_ref().expect("the default bundle has a survival model");
    assert!(survival.scorer.is_some(), "the default hazard model is one the scorer reads");
    let mut rows: Vec<Vec<f64>> = model.manifest().probes.iter().map(|p| p.row.clone()).collect();
    for (i, probe) in model.manifest().probes.iter().enumerate() {
        let mut row = probe.row.clone();
        let at = i % row.len();
        row[at] = [f64::NAN, 0.0, 1e-40, -3.0][i % 4];
        rows.push(row);
    }
    for row in &rows {
        let curve = model.survival_curve(row).expect("a curve");
        let walked = curve_of(&survival.hazards, row, &survival.grid);
        assert_eq!(
            curve.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            walked.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            "{row:?}"
        );
    }
    // A row of another width is walked.
    let long: Vec<f64> = rows[0].iter().copied().chain([1.0]).collect();
    assert_eq!(model.survival_curve(&long), Some(curve_of(&survival.hazards, &long, &survival.grid)));
}

/// Curves remembered by their rows' ranks are the computed ones, bit for bit, for rows seen
/// again and rows that differ from one seen only between two thresholds; a row that crosses a
/// threshold is computed.
#[test]
fn remembered_curves_are_the_computed_ones() {
    let model = LifetimeModel::load(default_dir()).unwrap();
    let mut cache = CurveCache::default();
    let bits = |curve: Vec<f64>| curve.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
    let probes: Vec<Vec<f64>> = model.manifest().probes.iter().map(|p| p.row.clone()).collect();
    for row in &probes {
        let computed = bits(model.survival_curve(row).unwrap());
        assert_eq!(bits(model.survival_curve_cached(row, &mut cache).unwrap()), computed);
        assert_eq!(bits(model.survival_curve_cached(row, &mut cache).unwrap()), computed, "{row:?} again");
    }
    assert_eq!(cache.hits, probes.len() as u64);
    // The hour of day (the fifth input) moved by a millisecond stays between its thresholds.
    let hour = 4;
    let mut nudged = probes[0].clone();
    nudged[hour] += 1e-3 / 3600.0;
    let hits = cache.hits;
    assert_eq!(
        bits(model.survival_curve_cached(&nudged, &mut cache).unwrap()),
        bits(model.survival_curve(&nudged).unwrap())
    );
    assert_eq!(cache.hits, hits + 1, "a row between the same thresholds is remembered");
    // Every hour of the day: a new curve each time it crosses a threshold, the same as computed.
    let (mut misses, mut changes, mut last) = (cache.misses, 0, None);
    for minute in 0..24 * 60 {
        let mut row = probes[0].clone();
        row[hour] = minute as f64 / 60.0;
        let curve = bits(model.survival_curve_cached(&row, &mut cache).unwrap());
        assert_eq!(curve, bits(model.survival_curve(&row).unwrap()), "minute {minute}");
        changes += usize::from(last.as_ref() != Some(&curve));
        last = Some(curve);
        misses = cache.misses;
    }
    assert!(changes > 1 && misses > hits, "the hour moves the curve ({changes} changes)");
}

#[test]
fn rows_predicted_together_equal_each_row_alone() {
    let model = LifetimeModel::load(default_dir()).unwrap();
    // The probes' rows, then variations of them (missing values, other sizes and times).
    let mut rows: Vec<Vec<f64>> = model.manifest().probes.iter().map(|p| p.row.clone()).collect();
    for i in 0..300 {
        let mut row = rows[i % model.manifest().probes.len()].clone();
        let at = i % row.len();
        row[at] = match i % 4 {
            0 => f64::NAN,
            1 => 0.0,
            2 => row[at] * 1.5 + 1.0,
            _ => (i as f64).ln(),
        };
        rows.push(row);
    }
    let matrix: Vec<f64> = rows.iter().flatten().copied().collect();
    let (mut p_long, mut lifetime) = (vec![f64::NAN; rows.len()], vec![f64::NAN; rows.len()]);
    model.p_long_rows(&matrix, &mut p_long);
    model.expected_lifetime_rows(&matrix, &mut lifetime);
    for (i, row) in rows.iter().enumerate() {
        let alone = model.predict_row(row, false);
        assert_eq!(p_long[i].to_bits(), alone.p_long.to_bits(), "row {i}");
        assert_eq!(lifetime[i].to_bits(), alone.expected_lifetime_s.to_bits(), "row {i}");
    }
}

#[test]
fn a_fifo_is_refused_at_once_instead_of_waiting_for_a_writer() {
    let temp = tempfile::tempdir().unwrap();
    let root = canonical_root(temp.path()).unwrap();
    let fifo = temp.path().join("model.txt");
    mkfifo(&fifo);
    let started = Instant::now();
    let error = read_confined(&fifo, &root, 1 << 20).expect_err("a FIFO is not read");
    assert!(matches!(error, BundleError::NotRegularFile { kind: "FIFO", .. }), "{error}");
    assert!(started.elapsed() < Duration::from_secs(1));
}

#[test]
fn devices_and_directories_are_not_regular_files() {
    let dev = canonical_root(Path::new("/dev")).unwrap();
    let error = read_confined(Path::new("/dev/zero"), &dev, 1 << 20).expect_err("a device is not read");
    assert!(matches!(error, BundleError::NotRegularFile { kind: "character device", .. }), "{error}");
    let temp = tempfile::tempdir().unwrap();
    let root = canonical_root(temp.path()).unwrap();
    std::fs::create_dir(temp.path().join("sub")).unwrap();
    let error = read_confined(&temp.path().join("sub"), &root, 1 << 20).expect_err("a directory is not read");
    assert!(matches!(error, BundleError::NotRegularFile { kind: "directory", .. }), "{error}");
}

#[test]
fn symlinks_are_followed_only_inside_the_root() {
    let temp = tempfile::tempdir().unwrap();
    let root_dir = temp.path().join("models");
    std::fs::create_dir(&root_dir).unwrap();
    let root = canonical_root(&root_dir).unwrap();
    std::fs::write(root_dir.join("inside.txt"), "inside").unwrap();
    std::fs::write(temp.path().join("outside.txt"), "outside").unwrap();
    std::os::unix::fs::symlink(root_dir.join("inside.txt"), root_dir.join("to-inside")).unwrap();
    std::os::unix::fs::symlink(temp.path().join("outside.txt"), root_dir.join("to-outside")).unwrap();
    std::os::unix::fs::symlink("/dev/zero", root_dir.join("to-zero")).unwrap();
    assert_eq!(read_confined(&root_dir.join("to-inside"), &root, 100).unwrap(), b"inside");
    for link in ["to-outside", "to-zero"] {
        let error = read_confined(&root_dir.join(link), &root, 100).expect_err("leaves the root");
        assert!(matches!(error, BundleError::OutsideRoot { .. }), "{link}: {error}");
    }
}

#[test]
fn files_over_the_limit_are_refused_by_size_and_while_reading() {
    let temp = tempfile::tempdir().unwrap();
    let root = canonical_root(temp.path()).unwrap();
    let path = temp.path().join("big.txt");
    std::fs::write(&path, vec![b'x'; 101]).unwrap();
    assert!(matches!(read_confined(&path, &root, 100), Err(BundleError::TooLarge { limit: 100, .. })));
    assert_eq!(read_confined(&path, &root, 101).unwrap().len(), 101);
    // A sparse file far over the limit is refused from its size, without reading it.
    let sparse = temp.path().join("sparse.txt");
    std::fs::File::create(&sparse).unwrap().set_len(1 << 40).unwrap();
    assert!(matches!(read_confined(&sparse, &root, 1 << 20), Err(BundleError::TooLarge { .. })));
    // /proc files claim a size of 0 and have more: only the bounded read catches them, as it
    // catches a file that grows after its size was checked.
    let proc_root = canonical_root(Path::new("/proc")).unwrap();
    let status = Path::new("/proc/self/status");
    assert_eq!(std::fs::metadata(status).unwrap().len(), 0);
    assert!(matches!(read_confined(status, &proc_root, 16), Err(BundleError::TooLarge { limit: 16, .. })));
}

#[test]
fn every_loaded_file_is_covered_by_its_checksum() {
    let (_temp, dir) = default_copy();
    LifetimeModel::load(&dir).expect("an intact copy loads");
    assert!(dir.join(SURVIVAL_MODEL_FILE).exists(), "the default bundle has a survival model");
    for file in CHECKSUMMED_FILES.into_iter().chain([SURVIVAL_MODEL_FILE]) {
        let path = dir.join(file);
        let original = std::fs::read(&path).unwrap();
        // Trailing whitespace: the file still parses the same, so only the checksum can tell.
        let mut edited = original.clone();
        edited.push(b'\n');
        std::fs::write(&path, &edited).unwrap();
        let error = LifetimeModel::load(&dir).err().expect("an edited file is refused");
        assert!(matches!(&error, BundleError::ChecksumMismatch { file: found, .. } if *found == file), "{error}");
        std::fs::write(&path, &original).unwrap();
    }
    LifetimeModel::load(&dir).expect("restored, it loads again");
}

#[test]
fn a_missing_checksum_refuses_the_bundle_until_it_is_sealed() {
    let (_temp, dir) = default_copy();
    let path = dir.join(MANIFEST_FILE);
    let mut manifest: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    manifest["checksums"].as_object_mut().unwrap().remove(MULTICLASS_MODEL_FILE);
    std::fs::write(&path, serde_json::to_vec_pretty(&manifest).unwrap()).unwrap();
    let error = LifetimeModel::load(&dir).err().expect("refused");
    assert!(matches!(error, BundleError::MissingChecksum { file: MULTICLASS_MODEL_FILE }), "{error}");
    let sealed = seal(&dir, &LoadLimits::default()).unwrap();
    assert_eq!(sealed.checksums.len(), CHECKSUMMED_FILES.len() + 1, "the survival model's too");
    LifetimeModel::load(&dir).expect("sealed, it loads");
}

#[test]
fn sealing_changes_only_the_checksums_member() {
    let checksums: BTreeMap<String, String> =
        [("a.txt".to_owned(), "00ff".to_owned()), ("b.json".to_owned(), "11".to_owned())].into();
    let appended =
        with_checksums("{\n  \"x\": \"a}\\\"{,\",\n  \"y\": [1.0000000000000002, {\"z\": 1}]\n}", &checksums).unwrap();
    let value: serde_json::Value = serde_json::from_str(&appended).unwrap();
    assert_eq!(value["checksums"]["a.txt"], "00ff");
    assert_eq!(value["x"], "a}\"{,");
    assert!(appended.contains("1.0000000000000002"), "{appended}");
    let replaced = with_checksums(&appended.replace("00ff", "dead"), &checksums).unwrap();
    assert_eq!(replaced, appended);
    let only: serde_json::Value = serde_json::from_str(&with_checksums("{}", &checksums).unwrap()).unwrap();
    assert_eq!(only["checksums"]["b.json"], "11");
    assert!(with_checksums("[1, 2]", &checksums).is_none());
    assert!(with_checksums("{\"unterminated\": [", &checksums).is_none());
}

fn default_bundle() -> LifetimeModel {
    let dir = default_dir();
    LifetimeModel::load(&dir).unwrap_or_else(|error| panic!("{}: {error}", dir.display()))
}

/// The default bundle without its survival model: remaining lifetimes from the regression,
/// as a bundle trained with `--survival-reading regression` (or before survival) reads them.
fn regression_bundle() -> LifetimeModel {
    let model = default_bundle();
    assert!(model.survival.is_some(), "the default bundle has a survival model");
    model.without_survival()
}

/// Repredicting a VM every `step` seconds of uptime (every second for the first 1,000), reusing
/// the last evaluation while the uptime stays in its constant range, gives bit for bit what
/// evaluating every time gives.
#[test]
fn remaining_predictions_are_constant_over_their_uptime_ranges() {
    let model = regression_bundle();
    let (mut evaluations, mut calls) = (0u64, 0u64);
    for probe in &model.manifest().probes {
        for step in [60.0, 900.0, 3_601.5] {
            let mut cached: Option<(ConstantRange, f64)> = None;
            let mut uptime = 0.0;
            while uptime < 30.0 * 86_400.0 {
                let key = encode_uptime(uptime);
                let expected = model.predict_remaining_row(&probe.row, uptime);
                calls += 1;
                let got = match cached {
                    Some((range, remaining)) if range.contains(key) => remaining,
                    _ => {
                        evaluations += 1;
                        let range = model.remaining_constant_range(key).expect("the uptime is a numerical input");
                        assert!(range.contains(key), "uptime {uptime}: {key} not in {range:?}");
                        let remaining = model.predict_remaining_encoded(&probe.row, key);
                        // The range's ends answer like its inside.
                        for end in [crate::gbdt::tests::next_up(range.above), range.up_to]
                            .into_iter()
                            .filter(|v| v.is_finite())
                        {
                            let at_end = model.predict_remaining_encoded(&probe.row, end);
                            assert_eq!(at_end.to_bits(), remaining.to_bits(), "{end} in {range:?}");
                        }
                        cached = Some((range, remaining));
                        remaining
                    }
                };
                assert_eq!(got.to_bits(), expected.to_bits(), "uptime {uptime}, row {:?}", probe.row);
                // Every second at first, where the thresholds are densest.
                uptime += if uptime < 1_000.0 { 1.0 } else { step };
            }
        }
    }
    assert!(evaluations * 4 < calls, "the ranges save evaluations: {evaluations} of {calls}");
}

#[test]
fn rows_on_the_stack_and_on_the_heap_predict_like_a_vector() {
    let model = regression_bundle();
    let row = &model.manifest().probes[0].row;
    let mut long = row.clone();
    long.resize(STACK_ROW + 5, 1.0);
    for candidate in [row, &long] {
        for uptime in [0.0, 100.0, 86_400.0] {
            let mut with_uptime = candidate.clone();
            with_uptime.push(encode_uptime(uptime));
            let expected = model.remaining_from_log10(model.remaining.predict(&with_uptime));
            assert_eq!(model.predict_remaining_row(candidate, uptime).to_bits(), expected.to_bits());
        }
    }
}

/// Bundles written before features and rounds were chosen on validation (and exit-time
/// quality was measured) have neither report, and still load.
#[test]
fn manifests_without_the_validation_and_exit_time_reports_load() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../models/default").join(MANIFEST_FILE);
    let mut manifest: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let evaluation = manifest["evaluation"].as_object_mut().expect("an evaluation report");
    evaluation.remove("validation");
    evaluation.remove("exit_time");
    let old: Manifest = serde_json::from_value(manifest).expect("an old manifest parses");
    assert!(old.evaluation.validation.is_none() && old.evaluation.exit_time.is_none());
    // And what is absent is not written back.
    let written = serde_json::to_string(&old).unwrap();
    assert!(!written.contains("\"validation\"") && !written.contains("\"exit_time\""));
    default_bundle();
}
