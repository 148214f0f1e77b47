//! A call's latency figures over many timed calls, for the benches that time single calls in
//! process (a model's prediction, a reprediction).

use std::hint::black_box;
use std::time::Instant;

/// Calls made, untimed, before the timed ones: caches and branch predictors warm.
const WARM_UP: usize = 2_000;

/// The median, 99th percentile and mean of a set of timings, in nanoseconds.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Latency {
    pub median_ns: f64,
    pub p99_ns: f64,
    pub mean_ns: f64,
}

impl Latency {
    /// The figures of `samples` (nanoseconds; at least one).
    pub fn of(mut samples: Vec<f64>) -> Latency {
        assert!(!samples.is_empty(), "no timings");
        samples.sort_by(f64::total_cmp);
        let n = samples.len();
        Latency {
            median_ns: samples[n / 2],
            p99_ns: samples[n * 99 / 100],
            mean_ns: samples.iter().sum::<f64>() / n as f64,
        }
    }
}

/// `calls` calls of `call` on `inputs` in turn, a timer around each, after the warm-up; `call`'s
/// result is kept from the optimizer.
pub fn per_call<T>(inputs: &[T], calls: usize, mut call: impl FnMut(&T) -> f64) -> Latency {
    for input in inputs.iter().cycle().take(WARM_UP) {
        black_box(call(black_box(input)));
    }
    let samples = inputs
        .iter()
        .cycle()
        .take(calls)
        .map(|input| {
            let start = Instant::now();
            black_box(call(black_box(input)));
            start.elapsed().as_nanos() as f64
        })
        .collect();
    Latency::of(samples)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_figures_are_the_median_the_99th_percentile_and_the_mean() {
        let latency = Latency::of((1..=100).rev().map(f64::from).collect());
        assert_eq!(latency, Latency { median_ns: 51.0, p99_ns: 100.0, mean_ns: 50.5 });
    }

    #[test]
    fn every_input_is_called_in_turn() {
        let mut seen = Vec::new();
        per_call(&[1.0, 2.0, 3.0], 4, |x| {
            seen.push(*x);
            *x
        });
        assert_eq!(seen.len(), WARM_UP + 4);
        // The timed calls start again at the first input.
        assert_eq!(seen[WARM_UP - 2..], [1.0, 2.0, 1.0, 2.0, 3.0, 1.0]);
    }
}
