//! `gbdt::TreeEnsemble` must reproduce LightGBM's own predictions on models LightGBM trained: binary
//! with a categorical feature and NaNs, 5-class multiclass, regression (with zero-as-missing) and a
//! random forest (`average_output`), on fresh rows full of NaNs, negatives, zeros and unseen
//! categories. A last test has LightGBM load randomly generated models that use every decision type.
//!
//! Note: lightgbm3's `Dataset` constructors hand LightGBM no parameters, so dataset-level parameters
//! (`categorical_feature`, `zero_as_missing`, `max_bin`, ...) given to `Booster::train` are silently
//! ignored. The tests that need them train through the C API (`train_via_c_api`).

use lifetime_model::gbdt::{OutputTransform, TreeEnsemble};
use lightgbm3::{Booster, Dataset};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::{json, Value};

const N_FEATURES: usize = 6;
const CAT: usize = 2;
const TOLERANCE: f64 = 1e-9;

/// One synthetic row. `fresh` rows stress the evaluator: more NaNs, unseen and negative categories,
/// fractional categories, exact and tiny zeros, out-of-range values.
fn row(rng: &mut ChaCha8Rng, fresh: bool) -> Vec<f64> {
    let nan_rate = if fresh { 0.15 } else { 0.1 };
    let mut x = vec![0.0; N_FEATURES];
    x[0] = if rng.random::<f64>() < nan_rate { f64::NAN } else { rng.random::<f64>() };
    x[1] = rng.random_range(-3.0..3.0);
    x[CAT] = if fresh {
        match rng.random_range(0..10) {
            0 => 25.0,
            1 => -1.0,
            2 => f64::NAN,
            3 => rng.random_range(0..20) as f64 + 0.5,
            4 => rng.random_range(-5..40) as f64,
            _ => rng.random_range(0..20) as f64,
        }
    } else {
        rng.random_range(0..20) as f64
    };
    // Many exact zeros (exercises zero-as-missing and the zero threshold).
    x[3] = if rng.random::<f64>() < 0.4 { 0.0 } else { rng.random_range(0..6) as f64 };
    x[4] = rng.random_range(-1.0..1.0);
    x[5] = if rng.random::<f64>() < 0.3 { 0.0 } else { rng.random_range(-10.0..10.0) };
    if fresh {
        for v in x.iter_mut() {
            match rng.random_range(0..40) {
                0 => *v = f64::NAN,
                1 => *v = 0.0,
                2 => *v = 1e-40,
                3 => *v = -1e6,
                4 => *v = 1e6,
                _ => {}
            }
        }
    }
    x
}

/// A latent score used by all the label generators.
fn latent(x: &[f64]) -> f64 {
    let f0 = if x[0].is_nan() { 0.8 } else { x[0] };
    let cat = x[CAT] as i64;
    let cat_effect = if [3, 7, 11, 15, 18].contains(&cat) { 1.5 } else { -0.3 };
    2.0 * f0 - 1.0 + 0.7 * x[1] + cat_effect + 0.3 * x[3] - 0.8 * x[4] * x[4] + 0.05 * x[5]
}

fn dataset(rng: &mut ChaCha8Rng, n: usize, label: impl Fn(&[f64], &mut ChaCha8Rng) -> f32) -> (Vec<f64>, Vec<f32>) {
    let mut flat = Vec::with_capacity(n * N_FEATURES);
    let mut labels = Vec::with_capacity(n);
    for _ in 0..n {
        let x = row(rng, false);
        labels.push(label(&x, rng));
        flat.extend_from_slice(&x);
    }
    (flat, labels)
}

fn train(flat: &[f64], labels: &[f32], params: Value) -> Booster {
    let data = Dataset::from_slice(flat, labels, N_FEATURES as i32, true).expect("dataset");
    Booster::train(data, &params).expect("training")
}

/// `key=value` pairs as LightGBM's C API wants them.
fn param_string(params: &Value) -> String {
    let Some(map) = params.as_object() else { panic!("params must be an object") };
    map.iter()
        .map(|(k, v)| match v.as_str() {
            Some(s) => format!("{k}={s}"),
            None => format!("{k}={v}"),
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// Trains through LightGBM's C API so that dataset-level parameters reach the dataset, and returns the
/// model reloaded as a `lightgbm3::Booster`.
fn train_via_c_api(flat: &[f64], labels: &[f32], params: &Value) -> Booster {
    use lightgbm3_sys as sys;
    use std::ffi::{CStr, CString};
    use std::ptr::null_mut;

    fn check(rc: std::os::raw::c_int) {
        if rc != 0 {
            // SAFETY: LightGBM returns a NUL-terminated, thread-local error message.
            let message = unsafe { CStr::from_ptr(sys::LGBM_GetLastError()) };
            panic!("LightGBM C API error: {}", message.to_string_lossy());
        }
    }

    let iterations = params["num_iterations"].as_u64().unwrap_or(100);
    let nrow = (flat.len() / N_FEATURES) as i32;
    assert_eq!(labels.len(), nrow as usize);
    let params = CString::new(param_string(params)).expect("params without NUL");
    let label = CString::new("label").expect("static string");
    // SAFETY: every pointer handed to LightGBM outlives the call that uses it (`flat`, `labels`, the
    // CStrings, `buffer`), the sizes passed match the buffers, and each handle is freed exactly once.
    let text = unsafe {
        let mut data: sys::DatasetHandle = null_mut();
        check(sys::LGBM_DatasetCreateFromMat(
            flat.as_ptr().cast(),
            sys::C_API_DTYPE_FLOAT64 as i32,
            nrow,
            N_FEATURES as i32,
            1,
            params.as_ptr(),
            null_mut(),
            &mut data,
        ));
        check(sys::LGBM_DatasetSetField(
            data,
            label.as_ptr(),
            labels.as_ptr().cast(),
            nrow,
            sys::C_API_DTYPE_FLOAT32 as i32,
        ));
        let mut booster: sys::BoosterHandle = null_mut();
        check(sys::LGBM_BoosterCreate(data, params.as_ptr(), &mut booster));
        for _ in 0..iterations {
            let mut finished = 0;
            check(sys::LGBM_BoosterUpdateOneIter(booster, &mut finished));
            if finished != 0 {
                break;
            }
        }
        let mut len = 0i64;
        check(sys::LGBM_BoosterSaveModelToString(booster, 0, -1, 0, 0, &mut len, null_mut()));
        let mut buffer = vec![0u8; len as usize];
        check(sys::LGBM_BoosterSaveModelToString(booster, 0, -1, 0, len, &mut len, buffer.as_mut_ptr().cast()));
        check(sys::LGBM_BoosterFree(booster));
        check(sys::LGBM_DatasetFree(data));
        CStr::from_bytes_until_nul(&buffer).expect("NUL-terminated").to_str().expect("UTF-8 model").to_owned()
    };
    Booster::from_string(&text).expect("LightGBM reloads its own model")
}

fn base_params(objective: &str) -> Value {
    json!({
        "objective": objective,
        "num_iterations": 50,
        "num_leaves": 15,
        "min_data_in_leaf": 5,
        "verbosity": -1,
        "num_threads": 2,
        "seed": 7,
        "deterministic": true,
    })
}

fn with(mut params: Value, extra: Value) -> Value {
    if let (Some(p), Some(e)) = (params.as_object_mut(), extra.as_object()) {
        for (k, v) in e {
            p.insert(k.clone(), v.clone());
        }
    }
    params
}

/// Compares normal and raw predictions of `ensemble` with LightGBM's on 2,000 fresh rows and
/// returns the largest absolute difference seen.
fn assert_matches(booster: &Booster, ensemble: &TreeEnsemble, seed: u64) -> f64 {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let n = 2_000;
    let rows: Vec<Vec<f64>> = (0..n).map(|_| row(&mut rng, true)).collect();
    let flat: Vec<f64> = rows.iter().flatten().copied().collect();
    let k = ensemble.num_outputs();
    assert_eq!(k, booster.num_classes() as usize);
    assert_eq!(ensemble.num_features(), booster.num_features() as usize);

    let expected = booster.predict_with_params(&flat, N_FEATURES as i32, true, "num_threads=1").expect("predict");
    let expected_raw =
        booster.raw_scores_with_params(&flat, N_FEATURES as i32, true, "num_threads=1").expect("raw scores");
    assert_eq!(expected.len(), n * k);

    let mut out = vec![0.0; k];
    let mut max_diff = 0.0f64;
    for (i, r) in rows.iter().enumerate() {
        ensemble.predict_into(r, &mut out);
        for c in 0..k {
            let diff = (out[c] - expected[i * k + c]).abs();
            assert!(
                diff < TOLERANCE,
                "row {i} {r:?} output {c}: native {} vs LightGBM {}",
                out[c],
                expected[i * k + c]
            );
            max_diff = max_diff.max(diff);
        }
        if k == 1 {
            assert_eq!(ensemble.predict(r), out[0]);
        }
        ensemble.predict_raw_into(r, &mut out);
        for c in 0..k {
            let diff = (out[c] - expected_raw[i * k + c]).abs();
            assert!(
                diff < TOLERANCE,
                "row {i} {r:?} raw {c}: native {} vs LightGBM {}",
                out[c],
                expected_raw[i * k + c]
            );
            max_diff = max_diff.max(diff);
        }
    }
    max_diff
}

/// Values of `key=` lines in the tree section of a model text.
fn tree_values<'a>(text: &'a str, key: &str) -> Vec<&'a str> {
    let prefix = format!("{key}=");
    text.lines().filter_map(|l| l.strip_prefix(prefix.as_str())).collect()
}

#[test]
fn binary_with_categorical_and_nan_matches_lightgbm() {
    let mut rng = ChaCha8Rng::seed_from_u64(1);
    let (flat, labels) = dataset(&mut rng, 4_000, |x, rng| {
        let p = 1.0 / (1.0 + (-latent(x)).exp());
        if rng.random::<f64>() < p {
            1.0
        } else {
            0.0
        }
    });
    let params = with(
        base_params("binary"),
        json!({"categorical_feature": CAT.to_string(), "min_data_per_group": 5, "cat_smooth": 1.0}),
    );
    let booster = train_via_c_api(&flat, &labels, &params);
    let text = booster.save_string().expect("save_string");

    // The model really exercises categorical bitsets and NaN default directions.
    assert!(tree_values(&text, "num_cat").iter().any(|v| *v != "0"), "no categorical split was learned");
    let nan_left = tree_values(&text, "decision_type").iter().flat_map(|v| v.split(' ')).any(|d| d == "10");
    assert!(nan_left, "no numerical split with NaN missing type and default-left");

    let ensemble = TreeEnsemble::from_lightgbm_text(&text).expect("parse");
    assert_eq!(ensemble.output_transform(), OutputTransform::Sigmoid { scale: 1.0 });
    assert_eq!(ensemble.num_trees(), 50);
    let max_diff = assert_matches(&booster, &ensemble, 101);
    eprintln!("binary: max |native - LightGBM| = {max_diff:e}");

    // Round trip through save_file: same text, same model; LightGBM reloads it identically too.
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("binary.txt");
    let path_str = path.to_str().expect("utf-8 path");
    booster.save_file(path_str).expect("save_file");
    let file_text = std::fs::read_to_string(&path).expect("read model file");
    let from_file = TreeEnsemble::from_lightgbm_text(&file_text).expect("parse file");
    let reloaded = Booster::from_file(path_str).expect("LightGBM reload");
    assert_matches(&reloaded, &from_file, 102);
    let mut rng = ChaCha8Rng::seed_from_u64(103);
    for _ in 0..500 {
        let r = row(&mut rng, true);
        assert_eq!(from_file.predict(&r).to_bits(), ensemble.predict(&r).to_bits());
    }
}

#[test]
fn multiclass_matches_lightgbm() {
    let mut rng = ChaCha8Rng::seed_from_u64(2);
    let (flat, labels) = dataset(&mut rng, 4_000, |x, rng| {
        let s = latent(x) + rng.random_range(-0.7..0.7);
        (s + 2.5).clamp(0.0, 4.99).floor() as f32
    });
    let params = with(base_params("multiclass"), json!({"num_class": 5}));
    let booster = train(&flat, &labels, params);
    let text = booster.save_string().expect("save_string");
    let ensemble = TreeEnsemble::from_lightgbm_text(&text).expect("parse");
    assert_eq!(ensemble.num_outputs(), 5);
    assert_eq!(ensemble.output_transform(), OutputTransform::Softmax);
    let max_diff = assert_matches(&booster, &ensemble, 201);
    eprintln!("multiclass: max |native - LightGBM| = {max_diff:e}");
}

#[test]
fn regression_matches_lightgbm() {
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    let (flat, labels) = dataset(&mut rng, 4_000, |x, rng| (3.0 * latent(x) + rng.random_range(-1.0..1.0)) as f32);
    let params = with(base_params("regression"), json!({"zero_as_missing": true}));
    let booster = train_via_c_api(&flat, &labels, &params);
    let text = booster.save_string().expect("save_string");
    let zero_missing = tree_values(&text, "decision_type").iter().flat_map(|v| v.split(' ')).any(|d| {
        let d: i32 = d.parse().unwrap_or(0);
        (d >> 2) & 3 == 1
    });
    assert!(zero_missing, "no split with missing type zero");
    let ensemble = TreeEnsemble::from_lightgbm_text(&text).expect("parse");
    assert_eq!(ensemble.output_transform(), OutputTransform::Identity);
    let max_diff = assert_matches(&booster, &ensemble, 301);
    eprintln!("regression: max |native - LightGBM| = {max_diff:e}");
}

#[test]
fn random_forest_average_output_matches_lightgbm() {
    let mut rng = ChaCha8Rng::seed_from_u64(4);
    let (flat, labels) = dataset(&mut rng, 3_000, |x, rng| (latent(x) + rng.random_range(-0.5..0.5)) as f32);
    let params = with(
        base_params("regression"),
        json!({"boosting": "rf", "bagging_freq": 1, "bagging_fraction": 0.7, "feature_fraction": 0.8,
               "num_iterations": 20}),
    );
    let booster = train(&flat, &labels, params);
    let text = booster.save_string().expect("save_string");
    assert!(text.lines().any(|l| l == "average_output"), "rf model without average_output");
    let ensemble = TreeEnsemble::from_lightgbm_text(&text).expect("parse");
    let max_diff = assert_matches(&booster, &ensemble, 401);
    eprintln!("random forest: max |native - LightGBM| = {max_diff:e}");
}

/// A random but well-formed LightGBM model text: trees grown like LightGBM's `Tree::Split`, with every
/// decision type (numerical with missing none / zero / NaN, default left or right; categorical with
/// random bitsets), thresholds on and around LightGBM's zero threshold.
fn random_model(rng: &mut ChaCha8Rng, num_trees: usize) -> String {
    let zero = f64::from(1e-35_f32);
    let thresholds = [0.0, zero, -zero, -0.5, 0.5, 1.5, -2.0, 3.0, 1e-300];
    let names: Vec<String> = (0..N_FEATURES).map(|i| format!("f{i}")).collect();
    let mut text = format!(
        "tree\nversion=v4\nnum_class=1\nnum_tree_per_iteration=1\nlabel_index=0\nmax_feature_idx={}\n\
         objective=binary sigmoid:1.5\nfeature_names={}\nfeature_infos={}\n\n",
        N_FEATURES - 1,
        names.join(" "),
        ["none"; N_FEATURES].join(" ")
    );
    let join = |values: &[String]| values.join(" ");
    for t in 0..num_trees {
        let num_leaves = rng.random_range(1..24usize);
        let (mut left, mut right, mut parent) = (Vec::<i32>::new(), Vec::<i32>::new(), vec![-1i32]);
        for n in 1..num_leaves {
            let leaf = rng.random_range(0..n);
            let node = (n - 1) as i32;
            let p = parent[leaf];
            if p >= 0 {
                if left[p as usize] == !(leaf as i32) {
                    left[p as usize] = node;
                } else {
                    right[p as usize] = node;
                }
            }
            left.push(!(leaf as i32));
            right.push(!(n as i32));
            parent[leaf] = node;
            parent.push(node);
        }
        let (mut features, mut threshold, mut decision, mut boundaries, mut bits) =
            (vec![], vec![], vec![], vec!["0".to_owned()], vec![]);
        let mut num_cat = 0;
        for _ in 1..num_leaves {
            features.push(rng.random_range(0..N_FEATURES).to_string());
            if rng.random::<f64>() < 0.3 {
                // Categorical; the missing-type and default-left bits must not matter.
                decision.push((1 | rng.random_range(0..8) << 1).to_string());
                threshold.push(num_cat.to_string());
                for _ in 0..rng.random_range(1..4) {
                    bits.push(rng.random::<u32>().to_string());
                }
                boundaries.push(bits.len().to_string());
                num_cat += 1;
            } else {
                decision.push((rng.random_range(0..2) << 1 | rng.random_range(0..3) << 2).to_string());
                let th = if rng.random::<f64>() < 0.7 {
                    thresholds[rng.random_range(0..thresholds.len())]
                } else {
                    rng.random_range(-3.0..3.0)
                };
                threshold.push(format!("{th:e}"));
            }
        }
        let leaves: Vec<String> = (0..num_leaves).map(|_| format!("{:e}", rng.random_range(-1.0..1.0))).collect();
        let ints = |v: &[i32]| v.iter().map(i32::to_string).collect::<Vec<_>>();
        text.push_str(&format!(
            "Tree={t}\nnum_leaves={num_leaves}\nnum_cat={num_cat}\nsplit_feature={}\nthreshold={}\n\
             decision_type={}\nleft_child={}\nright_child={}\nleaf_value={}\n",
            join(&features),
            join(&threshold),
            join(&decision),
            join(&ints(&left)),
            join(&ints(&right)),
            join(&leaves),
        ));
        if num_cat > 0 {
            text.push_str(&format!("cat_boundaries={}\ncat_threshold={}\n", join(&boundaries), join(&bits)));
        }
        text.push_str("is_linear=0\nshrinkage=1\n\n\n");
    }
    text.push_str("end of trees\n");
    text
}

/// Values on and around every threshold and category edge the random models use.
fn edge_row(rng: &mut ChaCha8Rng) -> Vec<f64> {
    let zero = f64::from(1e-35_f32);
    let specials = [
        f64::NAN,
        0.0,
        -0.0,
        1e-36,
        -1e-36,
        zero,
        -zero,
        1e-34,
        -1e-34,
        0.5,
        -0.5,
        1.5,
        -2.0,
        3.0,
        31.0,
        32.0,
        33.0,
        63.9,
        95.0,
        1e10,
        -1e10,
        f64::INFINITY,
        f64::NEG_INFINITY,
        1e-300,
    ];
    (0..N_FEATURES)
        .map(|_| match rng.random_range(0..3) {
            0 => specials[rng.random_range(0..specials.len())],
            1 => rng.random_range(-1..100) as f64,
            _ => rng.random_range(-3.0..3.0),
        })
        .collect()
}

#[test]
fn random_models_loaded_by_lightgbm_match() {
    let mut rng = ChaCha8Rng::seed_from_u64(5);
    for model in 0..5 {
        let text = random_model(&mut rng, 40);
        let ensemble = TreeEnsemble::from_lightgbm_text(&text).expect("parse generated model");
        let booster = Booster::from_string(&text).expect("LightGBM loads the generated model");
        let rows: Vec<Vec<f64>> = (0..3_000).map(|_| edge_row(&mut rng)).collect();
        let flat: Vec<f64> = rows.iter().flatten().copied().collect();
        let expected_raw =
            booster.raw_scores_with_params(&flat, N_FEATURES as i32, true, "num_threads=1").expect("raw scores");
        let expected = booster.predict_with_params(&flat, N_FEATURES as i32, true, "num_threads=1").expect("predict");
        let mut raw = [0.0];
        for (i, r) in rows.iter().enumerate() {
            ensemble.predict_raw_into(r, &mut raw);
            assert!(
                (raw[0] - expected_raw[i]).abs() < TOLERANCE,
                "model {model} row {r:?}: native raw {} vs LightGBM {}",
                raw[0],
                expected_raw[i]
            );
            let p = ensemble.predict(r);
            assert!((p - expected[i]).abs() < TOLERANCE, "model {model} row {r:?}: {p} vs {}", expected[i]);
        }
    }
}
