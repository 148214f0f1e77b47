//! In-process prediction latency on a real bundle (`models/default`, or the bundle directory given
//! as the first argument), beside LightGBM's own fast single-row C API on the same model file.
//!
//! `cargo bench -p lifetime-model --bench bundle_predict [-- BUNDLE_DIR]`. Rows: the bundle's probe
//! rows (encoded requests of its held-out period). Median, p99 and mean of 100k single calls.

use lifetime_model::bundle::{LifetimeModel, BINARY_MODEL_FILE, REMAINING_MODEL_FILE};
use lifetime_model::gbdt::TreeEnsemble;
use lifetime_model::RequestFeatures;
use lightgbm3::Booster;
use serde_json::json;
use std::path::PathBuf;
use test_support::timing::per_call;

const CALLS: usize = 100_000;

fn main() {
    let dir = std::env::args()
        .skip(1)
        .find(|a| !a.starts_with('-'))
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../models/default"));
    let model = LifetimeModel::load(&dir).expect("the bundle loads");
    let rows: Vec<Vec<f64>> = model.manifest().probes.iter().map(|p| p.row.clone()).collect();
    let text = std::fs::read_to_string(dir.join(BINARY_MODEL_FILE)).expect("model file");
    let native = TreeEnsemble::from_lightgbm_text(&text).expect("parses");
    let remaining_text = std::fs::read_to_string(dir.join(REMAINING_MODEL_FILE)).expect("model file");
    let remaining = TreeEnsemble::from_lightgbm_text(&remaining_text).expect("parses");
    let mut booster = Booster::from_string(&text).expect("LightGBM loads it");
    booster.single_row_fast_init::<f64>(Some(&json!({"num_threads": 1}))).expect("fast init");
    let requests: Vec<RequestFeatures> = (0..64)
        .map(|i| RequestFeatures {
            tenant_id: format!("t{}", i * 7),
            vm_type: ["D2", "F1", "E4", "D8"][i % 4].to_owned(),
            cores: [2.0, 1.0, 4.0, 8.0][i % 4],
            memory_gib: [8.0, 2.0, 32.0, 32.0][i % 4],
            time_s: 900_000.0 + 600.0 * i as f64,
            extra: vec![("batch_size".to_owned(), "1".to_owned()), ("os".to_owned(), "linux".to_owned())],
            ..RequestFeatures::default()
        })
        .collect();

    println!("bundle {} ({} trees in the long-lived model), {} calls each", model.version(), native.num_trees(), CALLS);
    let mut results = vec![
        (
            "LightGBM fast single-row C API, long-lived model",
            per_call(&rows, CALLS, |r| booster.predict_single_row_fast(r).expect("predicts")[0]),
        ),
        ("native TreeEnsemble, long-lived model", per_call(&rows, CALLS, |r| native.predict(r))),
        (
            "LifetimeModel::predict_row (long-lived + expected lifetime)",
            per_call(&rows, CALLS, |r| model.predict_row(r, false).p_long),
        ),
        (
            "LifetimeModel::predict_row (all three models)",
            per_call(&rows, CALLS, |r| model.predict_row(r, true).p_long),
        ),
        (
            "LifetimeModel::predict (encode + tenant history + long-lived + expected lifetime)",
            per_call(&requests, CALLS, |q| model.predict(q, false).p_long),
        ),
        (
            "reprediction: LifetimeModel::predict_remaining_row",
            per_call(&rows, CALLS, |r| model.predict_remaining_row(r, 3_600.0)),
        ),
        (
            "regression path (bundles without a survival model): long-lived + remaining at uptime 0",
            per_call(&rows, CALLS, |r| {
                let mut with_uptime = r.clone();
                with_uptime.push(0.0);
                native.predict(r) + remaining.predict(&with_uptime)
            }),
        ),
        (
            "regression path: reprediction (remaining-lifetime model at an uptime)",
            per_call(&rows, CALLS, |r| {
                let mut with_uptime = r.clone();
                with_uptime.push(3_600f64.log10());
                remaining.predict(&with_uptime)
            }),
        ),
    ];
    if let Some(edges) = model.survival_edges_s() {
        println!("survival model: {} intervals, reading {:?}", edges.len(), model.reading());
        let curves: Vec<Vec<f64>> = rows.iter().map(|r| model.survival_curve(r).expect("a curve")).collect();
        results.push((
            "survival path: LifetimeModel::survival_curve (every interval's hazard, one walk per tree)",
            per_call(&rows, CALLS, |r| model.survival_curve(r).map_or(0.0, |c| c[0])),
        ));
        results.push((
            "survival path: reprediction read off a VM's cached curve (remaining_from_curve)",
            per_call(&curves, CALLS, |c| model.remaining_from_curve(c, 3_600.0)),
        ));
    }
    println!("| what | median | p99 | mean |");
    println!("|---|---:|---:|---:|");
    for (name, s) in &results {
        println!("| {name} | {:.1} us | {:.1} us | {:.1} us |", s.median_ns / 1e3, s.p99_ns / 1e3, s.mean_ns / 1e3);
    }
    println!("native / LightGBM fast single-row (median): {:.2}x", results[1].1.median_ns / results[0].1.median_ns);
}
