//! Single-row prediction latency: the native `gbdt::TreeEnsemble` against LightGBM's C API.
//!
//! Trains a binary model of realistic size (200 iterations, 63 leaves, 15 features, 20k rows), then
//! times 100k single-row predictions with (1) `TreeEnsemble::predict`, (2) LightGBM's fast single-row
//! API (`predict_single_row_fast`) and (3) the plain single-row path (`predict_with_params`), and
//! prints a Markdown table. Run with `cargo bench -p lifetime-model --bench gbdt_predict`.

use std::hint::black_box;
use std::time::{Duration, Instant};

use lifetime_model::gbdt::TreeEnsemble;
use lightgbm3::{Booster, Dataset};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::json;

const N_FEATURES: usize = 15;
const TRAIN_ROWS: usize = 20_000;
const PREDICTIONS: usize = 100_000;
const WARMUP: usize = 2_000;
const ROW_POOL: usize = 4_096;

fn row(rng: &mut ChaCha8Rng) -> Vec<f64> {
    (0..N_FEATURES)
        .map(|j| match j {
            0 | 1 if rng.random::<f64>() < 0.05 => f64::NAN,
            2 => rng.random_range(0..30) as f64,
            3 if rng.random::<f64>() < 0.3 => 0.0,
            _ => rng.random_range(-2.0..2.0),
        })
        .collect()
}

fn label(x: &[f64], rng: &mut ChaCha8Rng) -> f32 {
    let f0 = if x[0].is_nan() { 0.5 } else { x[0] };
    let s = f0 - 0.5 * x[1].abs().min(3.0) + if x[2] as i64 % 3 == 0 { 0.8 } else { -0.4 } + x[3] * x[4] - 0.3 * x[5]
        + 0.2 * x.iter().skip(6).sum::<f64>()
        + rng.random_range(-1.0..1.0);
    if s > 0.0 {
        1.0
    } else {
        0.0
    }
}

struct Stats {
    median: f64,
    p99: f64,
    mean: f64,
}

/// Times `PREDICTIONS` calls of `predict` (after a warm-up), one timer pair per call.
fn measure(rows: &[Vec<f64>], mut predict: impl FnMut(&[f64]) -> f64) -> Stats {
    for r in rows.iter().cycle().take(WARMUP) {
        black_box(predict(black_box(r)));
    }
    let mut samples = Vec::with_capacity(PREDICTIONS);
    for r in rows.iter().cycle().take(PREDICTIONS) {
        let start = Instant::now();
        black_box(predict(black_box(r)));
        samples.push(start.elapsed());
    }
    samples.sort_unstable();
    let ns = |d: Duration| d.as_nanos() as f64;
    Stats {
        median: ns(samples[samples.len() / 2]),
        p99: ns(samples[samples.len() * 99 / 100]),
        mean: samples.iter().map(|&d| ns(d)).sum::<f64>() / samples.len() as f64,
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut rng = ChaCha8Rng::seed_from_u64(42);
    let mut flat = Vec::with_capacity(TRAIN_ROWS * N_FEATURES);
    let mut labels = Vec::with_capacity(TRAIN_ROWS);
    for _ in 0..TRAIN_ROWS {
        let x = row(&mut rng);
        labels.push(label(&x, &mut rng));
        flat.extend_from_slice(&x);
    }
    let params = json!({
        "objective": "binary",
        "num_iterations": 200,
        "num_leaves": 63,
        "min_data_in_leaf": 20,
        "learning_rate": 0.05,
        "verbosity": -1,
        "num_threads": 2,
        "seed": 7,
    });
    let started = Instant::now();
    let dataset = Dataset::from_slice(&flat, &labels, N_FEATURES as i32, true)?;
    let mut booster = Booster::train(dataset, &params)?;
    let train_time = started.elapsed();
    let text = booster.save_string()?;
    let started = Instant::now();
    let ensemble = TreeEnsemble::from_lightgbm_text(&text)?;
    let parse_time = started.elapsed();

    let rows: Vec<Vec<f64>> = (0..ROW_POOL).map(|_| row(&mut rng)).collect();
    booster.single_row_fast_init::<f64>(Some(&json!({"num_threads": 1})))?;

    // The three paths agree before anything is timed.
    for r in rows.iter().take(1_000) {
        let native = ensemble.predict(r);
        let fast = booster.predict_single_row_fast(r)?[0];
        let plain = booster.predict_with_params(r, N_FEATURES as i32, true, "num_threads=1")?[0];
        assert!((native - fast).abs() < 1e-9 && (native - plain).abs() < 1e-9, "{native} {fast} {plain}");
    }

    let native = measure(&rows, |r| ensemble.predict(r));
    let fast = measure(&rows, |r| booster.predict_single_row_fast(r).map_or(f64::NAN, |v| v[0]));
    let plain = measure(&rows, |r| {
        booster.predict_with_params(r, N_FEATURES as i32, true, "num_threads=1").map_or(f64::NAN, |v| v[0])
    });

    // Two threads sharing one ensemble (it is Send + Sync): aggregate throughput.
    let per_thread = PREDICTIONS / 2;
    let started = Instant::now();
    std::thread::scope(|s| {
        for t in 0..2 {
            let (ensemble, rows) = (&ensemble, &rows);
            s.spawn(move || {
                for r in rows.iter().cycle().skip(t * 997).take(per_thread) {
                    black_box(ensemble.predict(black_box(r)));
                }
            });
        }
    });
    let shared_ns = started.elapsed().as_nanos() as f64 / (2 * per_thread) as f64;

    println!(
        "model: binary, {} trees (200 iterations x 63 leaves max), {N_FEATURES} features, {TRAIN_ROWS} training rows; \
         trained in {:.1} s, parsed natively in {:.1} ms",
        ensemble.num_trees(),
        train_time.as_secs_f64(),
        parse_time.as_secs_f64() * 1e3
    );
    println!("{PREDICTIONS} single-row predictions per method, one thread, timer around each call:\n");
    println!("| method | median (ns) | p99 (ns) | mean (ns) |");
    println!("|---|---:|---:|---:|");
    for (name, s) in [
        ("native `TreeEnsemble::predict`", &native),
        ("LightGBM fast single-row C API (`predict_single_row_fast`)", &fast),
        ("LightGBM plain single-row (`predict_with_params`)", &plain),
    ] {
        println!("| {name} | {:.0} | {:.0} | {:.0} |", s.median, s.p99, s.mean);
    }
    println!();
    println!(
        "native / fast C API: median {:.2}, p99 {:.2}, mean {:.2} (native is {:.1}x faster at the median)",
        native.median / fast.median,
        native.p99 / fast.p99,
        native.mean / fast.mean,
        fast.median / native.median
    );
    println!("native, 2 threads sharing one ensemble: {shared_ns:.0} ns per prediction of aggregate throughput");
    Ok(())
}
