//! The lifetime distribution of a VM: a discrete-time hazard model over lifetime intervals, and
//! what a policy reads of it.
//!
//! Interval `j` is `[edges[j-1], edges[j])` (`edges[-1] = 0`). The hazard model (LightGBM, binary
//! objective) takes the VM's request-time row plus the interval's index and answers
//! `h_j = P(T < edges[j] | T >= edges[j-1])`. It is trained on every VM, censored ones included: a
//! VM contributes one example per interval it was seen alive at the start of, labelled 1 for the
//! interval it ended in and 0 for every interval it outlived; a VM still running when the data
//! stops contributes only the intervals it outlived, so it counts as "alive at least this long"
//! and is never dropped (the standard person-period likelihood of discrete-time survival).
//!
//! From one row the model gives the whole survival curve `S(edges[j]) = prod_{k<=j} (1 - h_k)`.
//! Everything a VM's placement reads comes from that one curve, so it all agrees:
//! - the lifetime at request time ([`LifetimeReading`] at age 0);
//! - the remaining lifetime at age `a`, from `P(T > a + t | T > a) = S(a + t) / S(a)`: the
//!   request-time features do not change as the VM ages, so conditioning the request-time curve is
//!   exactly the reprediction, and it costs no model evaluation;
//! - `P(T >= threshold)`, a long-lived probability.
//!
//! Between edges the curve is linear (deaths spread evenly over an interval). Past the last edge
//! the VM's hazard rate of its last interval goes on (an exponential tail): the trainer ends the
//! intervals where its data stops supporting them (too few VMs were seen alive that long), and a
//! tree model asked about an interval it never saw would answer arbitrarily, while the last
//! supported rate keeps each VM's own tail and its ranking.

use crate::gbdt::TreeEnsemble;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// The default interval edges in seconds: finer where most VMs end (minutes), then hours and days,
/// up to 28 days.
pub fn default_edges_s() -> Vec<f64> {
    const MIN: f64 = 60.0;
    const HOUR: f64 = 3_600.0;
    const DAY: f64 = 86_400.0;
    vec![
        5.0 * MIN,
        10.0 * MIN,
        15.0 * MIN,
        30.0 * MIN,
        45.0 * MIN,
        HOUR,
        1.5 * HOUR,
        2.0 * HOUR,
        3.0 * HOUR,
        4.0 * HOUR,
        6.0 * HOUR,
        8.0 * HOUR,
        12.0 * HOUR,
        18.0 * HOUR,
        DAY,
        1.5 * DAY,
        2.0 * DAY,
        3.0 * DAY,
        4.0 * DAY,
        5.0 * DAY,
        7.0 * DAY,
        10.0 * DAY,
        14.0 * DAY,
        21.0 * DAY,
        28.0 * DAY,
    ]
}

/// Most intervals a hazard model may have (the grid evaluation tracks them in a 64-bit mask).
pub const MAX_INTERVALS: usize = 64;

/// What a policy reads of a lifetime distribution as "the" lifetime (or remaining lifetime).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case", deny_unknown_fields)]
pub enum LifetimeReading {
    /// The `q` quantile: the time by which the VM has ended with probability `q` (0.5: the median).
    /// A low `q` reads exits early, a high one late (conservative for NILAS: a host is not
    /// expected to empty before its VMs probably have).
    Quantile { q: f64 },
    /// The expected lifetime truncated at `horizon_s`: `E[min(T, horizon)]`, the area under the
    /// curve up to the horizon.
    TruncatedMean { horizon_s: f64 },
    /// The geometric mean, `exp(E[ln T])`: the typical scale of the lifetime, what a regression on
    /// log lifetime estimates. Unlike a quantile it weighs the whole distribution, its long tail
    /// included, and unlike the mean it is not dominated by that tail.
    GeometricMean,
}

impl Default for LifetimeReading {
    fn default() -> Self {
        LifetimeReading::Quantile { q: 0.5 }
    }
}

impl LifetimeReading {
    /// Refuses a reading that means nothing, naming what is wrong.
    pub fn check(&self) -> Result<(), String> {
        match *self {
            LifetimeReading::Quantile { q } if !(q > 0.0 && q < 1.0) => {
                Err(format!("a quantile must be strictly between 0 and 1, got {q}"))
            }
            LifetimeReading::TruncatedMean { horizon_s } if !(horizon_s.is_finite() && horizon_s > 0.0) => {
                Err(format!("a truncated mean's horizon must be a positive number of seconds, got {horizon_s}"))
            }
            _ => Ok(()),
        }
    }
}

impl fmt::Display for LifetimeReading {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LifetimeReading::Quantile { q } if *q == 0.5 => write!(f, "median"),
            LifetimeReading::Quantile { q } => write!(f, "q{q}"),
            LifetimeReading::TruncatedMean { horizon_s } => write!(f, "mean{horizon_s}s"),
            LifetimeReading::GeometricMean => write!(f, "geomean"),
        }
    }
}

/// `median`, `quantile:Q` (`q:Q`), `mean:SECONDS` (the truncated mean) or `geomean`, as the CLIs
/// take it.
impl FromStr for LifetimeReading {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let number = |value: &str| value.trim().parse::<f64>().map_err(|_| format!("{value:?} is not a number"));
        let reading = match text.trim().split_once(':') {
            None if text.trim() == "median" => LifetimeReading::Quantile { q: 0.5 },
            None if text.trim() == "geomean" => LifetimeReading::GeometricMean,
            Some(("quantile" | "q", q)) => LifetimeReading::Quantile { q: number(q)? },
            Some(("mean", horizon)) => LifetimeReading::TruncatedMean { horizon_s: number(horizon)? },
            _ => {
                return Err(format!(
                    "unknown lifetime reading {text:?}: use median, quantile:Q (0 < Q < 1), mean:SECONDS or geomean"
                ))
            }
        };
        reading.check()?;
        Ok(reading)
    }
}

/// What a bundle's survival model is: its intervals and the reading it serves by default.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SurvivalSpec {
    /// Ascending upper edges of the intervals, in seconds.
    pub edges_s: Vec<f64>,
    /// What `expected_lifetime_s` and the remaining lifetime read of the distribution.
    pub reading: LifetimeReading,
    /// Whether P(long) comes from this distribution (`P(T >= long_threshold)`) rather than the
    /// dedicated classifier: the trainer's choice on validation AUC.
    #[serde(default)]
    pub p_long_from_survival: bool,
}

impl SurvivalSpec {
    pub fn check(&self) -> Result<(), String> {
        if self.edges_s.is_empty() || self.edges_s.len() > MAX_INTERVALS {
            return Err(format!("a survival model needs 1 to {MAX_INTERVALS} interval edges"));
        }
        if self.edges_s[0] <= 0.0
            || self.edges_s.windows(2).any(|w| w[0] >= w[1] || w[1].is_nan())
            || !self.edges_s.iter().all(|e| e.is_finite())
        {
            return Err("survival interval edges must be positive, finite and ascending".to_owned());
        }
        self.reading.check()
    }

    /// The interval of a lifetime of `seconds`: the first edge above it (`edges.len()` past the last).
    pub fn interval_of(&self, seconds: f64) -> usize {
        self.edges_s.partition_point(|&e| e <= seconds)
    }

    /// The hazard model's input for interval `j` (appended to the VM's row).
    pub fn interval_input(j: usize) -> f64 {
        j as f64
    }
}

/// A survival curve: `S` at each edge of its spec (ascending edges, `S(0) = 1`).
#[derive(Clone, Debug, PartialEq)]
pub struct SurvivalCurve<'a> {
    pub edges_s: &'a [f64],
    pub survival: &'a [f64],
}

/// The survival curve of a base row at each interval's edge, from a hazard model whose last input
/// is the interval (`grid`: [`SurvivalSpec::interval_input`] of each interval): one walk per tree
/// for the whole curve.
pub fn curve_of(hazards: &TreeEnsemble, row: &[f64], grid: &[f64]) -> Vec<f64> {
    let mut with_interval = Vec::with_capacity(row.len() + 1);
    with_interval.extend_from_slice(row);
    with_interval.push(0.0);
    let mut curve = vec![0.0; grid.len()];
    hazards.predict_raw_grid(&with_interval, row.len(), grid, &mut curve);
    survival_from_logits(&mut curve);
    curve
}

/// The survival at each edge from the hazard model's raw scores (logits), in place.
pub fn survival_from_logits(values: &mut [f64]) {
    let mut alive = 1.0;
    for v in values.iter_mut() {
        let hazard = 1.0 / (1.0 + (-*v).exp());
        alive *= 1.0 - hazard;
        *v = alive;
    }
}

impl SurvivalCurve<'_> {
    /// `S(t)`: linear between edges, flat past the last one.
    pub fn at(&self, t: f64) -> f64 {
        if t.is_nan() || t <= 0.0 {
            return 1.0;
        }
        let j = self.edges_s.partition_point(|&e| e <= t);
        if j >= self.edges_s.len() {
            let (last_edge, last, rate) = self.tail();
            return if last <= 0.0 || rate == 0.0 { last } else { last * (-rate * (t - last_edge)).exp() };
        }
        let (lo, s_lo) = if j == 0 { (0.0, 1.0) } else { (self.edges_s[j - 1], self.survival[j - 1]) };
        let (hi, s_hi) = (self.edges_s[j], self.survival[j]);
        s_lo + (s_hi - s_lo) * (t - lo) / (hi - lo)
    }

    /// `S(age + t) / S(age)` for each `t` of `after_s`, into `out`: the chances that a VM alive at
    /// `age_s` is still alive `t` later. A VM the curve says should have ended reads 0; past the
    /// last edge the tail's rate alone decides (as [`SurvivalCurve::remaining_s`] reads it).
    pub fn conditional(&self, age_s: f64, after_s: &[f64], out: &mut [f64]) {
        let age = age_s.max(0.0);
        if self.edges_s.last().is_some_and(|&last| age >= last) {
            let (_, last, rate) = self.tail();
            for (o, &t) in out.iter_mut().zip(after_s) {
                *o = if last <= 0.0 || !rate.is_finite() { 0.0 } else { (-rate * t.max(0.0)).exp() };
            }
            return;
        }
        let alive = self.at(age);
        for (o, &t) in out.iter_mut().zip(after_s) {
            *o = if alive <= 0.0 { 0.0 } else { (self.at(age + t.max(0.0)) / alive).clamp(0.0, 1.0) };
        }
    }

    /// The remaining lifetime of a VM alive at `age_s`, as `reading` reads `S(age + t) / S(age)`.
    /// Infinite when the curve never gets there (a quantile beyond the last edge).
    pub fn remaining_s(&self, age_s: f64, reading: LifetimeReading) -> f64 {
        let age = age_s.max(0.0);
        if self.edges_s.last().is_some_and(|&last| age >= last) {
            // Memoryless past the last edge: computed from the rate alone, since S(age) itself may
            // underflow for an old VM the model gave a high hazard.
            let (_, last, rate) = self.tail();
            if last > 0.0 && rate.is_finite() {
                return match reading {
                    LifetimeReading::Quantile { q } if rate > 0.0 => -(1.0 - q).ln() / rate,
                    LifetimeReading::Quantile { .. } => f64::INFINITY,
                    LifetimeReading::TruncatedMean { horizon_s } if rate > 0.0 => -(-rate * horizon_s).exp_m1() / rate,
                    LifetimeReading::TruncatedMean { horizon_s } => horizon_s,
                    LifetimeReading::GeometricMean if rate > 0.0 => (exponential_mean_log(0.0, rate)).exp(),
                    LifetimeReading::GeometricMean => f64::INFINITY,
                };
            }
        }
        let alive = self.at(age);
        if alive <= 0.0 {
            // The model says it should have ended: read it as ending now.
            return 0.0;
        }
        match reading {
            LifetimeReading::Quantile { q } => self.conditional_quantile(age, alive, q),
            LifetimeReading::TruncatedMean { horizon_s } => self.conditional_area(age, alive, horizon_s),
            LifetimeReading::GeometricMean => self.conditional_mean_log(age, alive).exp(),
        }
    }

    /// The last edge, the survival there, and the hazard rate (per second) of the last interval,
    /// which goes on past it.
    fn tail(&self) -> (f64, f64, f64) {
        let n = self.edges_s.len().min(self.survival.len());
        if n == 0 {
            return (0.0, 1.0, 0.0);
        }
        let (lo, s_lo) = if n == 1 { (0.0, 1.0) } else { (self.edges_s[n - 2], self.survival[n - 2]) };
        let (hi, s_hi) = (self.edges_s[n - 1], self.survival[n - 1]);
        let rate = if s_hi <= 0.0 || s_lo <= 0.0 { f64::INFINITY } else { (s_lo / s_hi).ln().max(0.0) / (hi - lo) };
        (hi, s_hi, rate)
    }

    /// The knots of the curve after `age` (time after age, conditional survival), starting at (0, 1).
    fn knots_after(&self, age: f64, alive: f64) -> impl Iterator<Item = (f64, f64)> + '_ {
        let first = self.edges_s.partition_point(|&e| e <= age);
        std::iter::once((0.0, 1.0))
            .chain(self.edges_s[first..].iter().zip(&self.survival[first..]).map(move |(&e, &s)| (e - age, s / alive)))
    }

    fn conditional_quantile(&self, age: f64, alive: f64, q: f64) -> f64 {
        let target = 1.0 - q;
        let mut previous = (0.0, 1.0);
        for (t, s) in self.knots_after(age, alive) {
            if s <= target {
                let (t0, s0) = previous;
                if s0 <= target || s0 == s {
                    return t;
                }
                return t0 + (t - t0) * (s0 - target) / (s0 - s);
            }
            previous = (t, s);
        }
        // Past the last edge: `s0 * exp(-rate * (t - t0)) = target`.
        let (t0, s0) = previous;
        let (_, _, rate) = self.tail();
        if rate > 0.0 && rate.is_finite() {
            t0 + (s0 / target).ln() / rate
        } else if rate.is_infinite() {
            t0
        } else {
            f64::INFINITY
        }
    }

    /// `E[ln R]` of the remaining lifetime `R` of a VM alive at `age`: deaths are spread evenly over
    /// each interval (the curve is linear there), and the exponential tail takes the rest.
    fn conditional_mean_log(&self, age: f64, alive: f64) -> f64 {
        // The integral of ln u from 0 to t.
        let integral = |t: f64| if t > 0.0 { t * t.ln() - t } else { 0.0 };
        let mut sum = 0.0;
        let mut previous = (0.0, 1.0);
        for (t, s) in self.knots_after(age, alive) {
            let (t0, s0) = previous;
            if t > t0 && s0 > s {
                sum += (s0 - s) * (integral(t) - integral(t0)) / (t - t0);
            }
            previous = (t, s);
        }
        let (t0, s0) = previous;
        let (_, _, rate) = self.tail();
        if s0 <= 0.0 || rate.is_infinite() {
            sum
        } else if rate == 0.0 {
            f64::INFINITY
        } else {
            sum + s0 * exponential_mean_log(t0, rate)
        }
    }

    fn conditional_area(&self, age: f64, alive: f64, horizon: f64) -> f64 {
        let mut area = 0.0;
        let mut previous = (0.0, 1.0);
        for (t, s) in self.knots_after(age, alive) {
            let (t0, s0) = previous;
            if t >= horizon {
                let s_h = s0 + (s - s0) * (horizon - t0) / (t - t0);
                return area + (horizon - t0) * (s0 + s_h) / 2.0;
            }
            area += (t - t0) * (s0 + s) / 2.0;
            previous = (t, s);
        }
        // Past the last edge, the exponential tail.
        let (t0, s0) = previous;
        let (_, _, rate) = self.tail();
        let span = (horizon - t0).max(0.0);
        if rate == 0.0 {
            area + span * s0
        } else if rate.is_infinite() {
            area
        } else {
            area + s0 * -(-rate * span).exp_m1() / rate
        }
    }
}

/// `E[ln(start + X)]` for `X` exponential with `rate`: the midpoint rule over 64 quantiles, which
/// is within 1% of the exact value in the lifetime (its error is in the last quantile's log).
fn exponential_mean_log(start: f64, rate: f64) -> f64 {
    const POINTS: usize = 64;
    (0..POINTS)
        .map(|k| {
            let p = (k as f64 + 0.5) / POINTS as f64;
            (start + -(1.0 - p).ln() / rate).max(f64::MIN_POSITIVE).ln()
        })
        .sum::<f64>()
        / POINTS as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn curve<'a>(edges: &'a [f64], survival: &'a [f64]) -> SurvivalCurve<'a> {
        SurvivalCurve { edges_s: edges, survival }
    }

    #[test]
    fn survival_is_the_product_of_one_minus_the_hazards() {
        // Logit 0 is a hazard of 1/2.
        let mut values = [0.0, 0.0, f64::NEG_INFINITY];
        survival_from_logits(&mut values);
        assert_eq!(values, [0.5, 0.25, 0.25]);
    }

    #[test]
    fn quantiles_interpolate_linearly_between_edges() {
        let edges = [100.0, 200.0, 400.0];
        let survival = [0.5, 0.25, 0.25];
        let c = curve(&edges, &survival);
        assert_eq!(c.at(50.0), 0.75);
        assert_eq!(c.at(1_000.0), 0.25, "flat past the last edge");
        assert_eq!(c.remaining_s(0.0, LifetimeReading::Quantile { q: 0.5 }), 100.0);
        assert_eq!(c.remaining_s(0.0, LifetimeReading::Quantile { q: 0.25 }), 50.0);
        assert_eq!(c.remaining_s(0.0, LifetimeReading::Quantile { q: 0.625 }), 150.0);
        // A quarter of the VMs never end within the curve: the 0.9 quantile is beyond it.
        assert_eq!(c.remaining_s(0.0, LifetimeReading::Quantile { q: 0.9 }), f64::INFINITY);
        // Alive at 100 s (S = 0.5): half of those end by 200 s.
        assert_eq!(c.remaining_s(100.0, LifetimeReading::Quantile { q: 0.5 }), 100.0);
        // Alive at 150 s (S = 0.375): a third of those end by 200 s, and none after.
        assert_eq!(c.remaining_s(150.0, LifetimeReading::Quantile { q: 0.5 }), f64::INFINITY);
        let quarter = c.remaining_s(150.0, LifetimeReading::Quantile { q: 0.25 });
        assert!((quarter - 37.5).abs() < 1e-9, "{quarter}");
    }

    #[test]
    fn the_last_intervals_hazard_rate_goes_on_past_the_last_edge() {
        let edges = [100.0, 200.0];
        let survival = [0.5, 0.25];
        let c = curve(&edges, &survival);
        assert!((c.at(300.0) - 0.125).abs() < 1e-12);
        // Memoryless past the last edge: half of the VMs alive at any age there end within 100 s.
        for age in [200.0, 1_000.0, 1e6] {
            let median = c.remaining_s(age, LifetimeReading::Quantile { q: 0.5 });
            assert!((median - 100.0).abs() < 1e-9, "age {age}: {median}");
            let mean = c.remaining_s(age, LifetimeReading::TruncatedMean { horizon_s: 1e9 });
            assert!((mean - 100.0 / 2f64.ln()).abs() < 1e-6, "age {age}: {mean}");
        }
        // Before the edge, the quantile crosses into the tail: S = 0.2 at 200 + 100 log2(1.25).
        let q = c.remaining_s(0.0, LifetimeReading::Quantile { q: 0.8 });
        assert!((q - (200.0 + 100.0 * 1.25f64.log2())).abs() < 1e-9, "{q}");
    }

    #[test]
    fn conditional_survival_renormalises_at_the_age_and_keeps_the_tail_memoryless() {
        let edges = [100.0, 200.0];
        let survival = [0.5, 0.25];
        let c = curve(&edges, &survival);
        let mut out = [0.0; 3];
        c.conditional(0.0, &[0.0, 100.0, 200.0], &mut out);
        assert_eq!(out, [1.0, 0.5, 0.25]);
        // Alive at 100 s: half of those are alive at 200 s.
        c.conditional(100.0, &[0.0, 100.0, -5.0], &mut out);
        assert_eq!(out, [1.0, 0.5, 1.0], "a negative time reads as now");
        // Past the last edge, the last interval's rate: half of them go every 100 s.
        c.conditional(5_000.0, &[0.0, 100.0, 200.0], &mut out);
        assert!((out[1] - 0.5).abs() < 1e-12 && (out[2] - 0.25).abs() < 1e-12, "{out:?}");
        let ended = [0.5, 0.0];
        curve(&edges, &ended).conditional(250.0, &[0.0, 10.0], &mut out[..2]);
        assert_eq!(&out[..2], &[0.0, 0.0], "a VM the curve says ended reads as gone");
    }

    #[test]
    fn the_truncated_mean_is_the_area_under_the_conditional_curve() {
        let edges = [100.0, 200.0];
        let survival = [0.5, 0.0];
        let c = curve(&edges, &survival);
        // Area: 100 * (1 + 0.5) / 2 + 100 * 0.5 / 2 = 75 + 25.
        assert_eq!(c.remaining_s(0.0, LifetimeReading::TruncatedMean { horizon_s: 1_000.0 }), 100.0);
        assert_eq!(c.remaining_s(0.0, LifetimeReading::TruncatedMean { horizon_s: 100.0 }), 75.0);
        assert_eq!(c.remaining_s(0.0, LifetimeReading::TruncatedMean { horizon_s: 50.0 }), 50.0 * (1.0 + 0.75) / 2.0);
        // At age 100 (alive 0.5): conditional 1 -> 0 over 100 s.
        assert_eq!(c.remaining_s(100.0, LifetimeReading::TruncatedMean { horizon_s: 1_000.0 }), 50.0);
        // Past the end of the curve with S = 0: ends now.
        assert_eq!(c.remaining_s(300.0, LifetimeReading::TruncatedMean { horizon_s: 1_000.0 }), 0.0);
        // A flat tail counts up to the horizon.
        let flat = [1.0, 1.0];
        assert_eq!(curve(&edges, &flat).remaining_s(0.0, LifetimeReading::TruncatedMean { horizon_s: 500.0 }), 500.0);
    }

    #[test]
    fn the_remaining_lifetime_agrees_with_the_request_time_distribution() {
        // Conditioning on survival to the first edge is the request-time curve renormalised.
        let edges = default_edges_s();
        let mut survival: Vec<f64> = (0..edges.len()).map(|j| -1.0 + 0.05 * j as f64).collect();
        survival_from_logits(&mut survival);
        let c = curve(&edges, &survival);
        for q in [0.1, 0.3, 0.5, 0.7] {
            let total = c.remaining_s(0.0, LifetimeReading::Quantile { q });
            for age in [60.0, 600.0, 3_600.0] {
                if age >= total {
                    continue;
                }
                // P(T > total | T > age) = (1 - q) / S(age): the remaining time to `total` is that quantile.
                let q_age = 1.0 - (1.0 - q) / c.at(age);
                let remaining = c.remaining_s(age, LifetimeReading::Quantile { q: q_age });
                assert!((age + remaining - total).abs() < 1e-6 * total, "q {q} age {age}: {remaining} vs {total}");
            }
        }
    }

    #[test]
    fn the_geometric_mean_weighs_the_whole_distribution() {
        // Deaths spread evenly over [0, 100 s]: E[ln T] = ln 100 - 1.
        let (edges, survival) = ([100.0], [0.0]);
        let g = curve(&edges, &survival).remaining_s(0.0, LifetimeReading::GeometricMean);
        assert!((g - 100.0 / std::f64::consts::E).abs() < 1e-9, "{g}");
        // Memoryless past the last edge: an exponential of rate ln 2 / 100 s, E[ln X] = -gamma - ln rate.
        let (edges, survival) = ([100.0, 200.0], [0.5, 0.25]);
        let c = curve(&edges, &survival);
        let exact = (-0.577_215_664_901_532_9 - (2f64.ln() / 100.0).ln()).exp();
        for age in [200.0, 5_000.0] {
            let g = c.remaining_s(age, LifetimeReading::GeometricMean);
            assert!((g / exact - 1.0).abs() < 0.01, "age {age}: {g} vs {exact}");
        }
        // It lies between the median and the mean when the tail is long, and a longer tail raises it.
        let median = c.remaining_s(0.0, LifetimeReading::Quantile { q: 0.5 });
        let mean = c.remaining_s(0.0, LifetimeReading::TruncatedMean { horizon_s: 1e9 });
        let g = c.remaining_s(0.0, LifetimeReading::GeometricMean);
        assert!(g < mean && g > 0.5 * median, "{g} {median} {mean}");
        let longer = [0.5, 0.4];
        assert!(curve(&edges, &longer).remaining_s(0.0, LifetimeReading::GeometricMean) > g);
        // A VM that may never end has no finite geometric mean.
        let flat = [1.0, 1.0];
        assert_eq!(curve(&edges, &flat).remaining_s(0.0, LifetimeReading::GeometricMean), f64::INFINITY);
    }

    #[test]
    fn readings_parse_and_refuse_nonsense() {
        assert_eq!("geomean".parse(), Ok(LifetimeReading::GeometricMean));
        assert_eq!(LifetimeReading::GeometricMean.to_string(), "geomean");
        assert_eq!("median".parse(), Ok(LifetimeReading::Quantile { q: 0.5 }));
        assert_eq!("quantile:0.7".parse(), Ok(LifetimeReading::Quantile { q: 0.7 }));
        assert_eq!("mean:86400".parse(), Ok(LifetimeReading::TruncatedMean { horizon_s: 86_400.0 }));
        assert!("quantile:1.5".parse::<LifetimeReading>().unwrap_err().contains("between 0 and 1"));
        assert!("mean:-3".parse::<LifetimeReading>().unwrap_err().contains("horizon"));
        assert!("mode".parse::<LifetimeReading>().unwrap_err().contains("median, quantile:Q"));
        let json = serde_json::to_string(&LifetimeReading::Quantile { q: 0.7 }).unwrap();
        assert_eq!(json, r#"{"kind":"quantile","q":0.7}"#);
    }
}
