//! What the control service counted during the run ([`stats_delta`]) and its figures over time ([`series_point`], [`thin_indices`]).

use crate::LatencySummary;
use domain::quality::VersionQuality;
use domain::ControlStats;
use serde::Serialize;
use std::collections::BTreeMap;

/// What the control service counted during the run: the difference of its `/v1/stats` at the start
/// and the end, so that earlier runs do not count.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct StatsDelta {
    pub requests: u64,
    pub placed: u64,
    pub rejected: u64,
    pub failed: u64,
    pub cache_hits: u64,
    pub cache_misses: u64,
    /// hits / (hits + misses); `None` without lookups.
    pub cache_hit_rate: Option<f64>,
    pub fallbacks: BTreeMap<String, u64>,
    pub predictions_by_source: BTreeMap<String, u64>,
    pub safeguard_trips: u64,
    pub safeguard_active_at_end: bool,
    /// Times the quality gate closed during the run.
    pub quality_gate_trips: u64,
    /// Some counter went down: the service restarted during the run, and the figures count from
    /// the restart.
    pub counters_reset: bool,
}

/// `end - start` of one counter; after a restart (the counter went down) the end value, which is
/// what was counted since.
fn counter_delta(start: u64, end: u64, reset: &mut bool) -> u64 {
    if end >= start {
        end - start
    } else {
        *reset = true;
        end
    }
}

fn map_delta(start: &BTreeMap<String, u64>, end: &BTreeMap<String, u64>, reset: &mut bool) -> BTreeMap<String, u64> {
    end.iter()
        .map(|(name, &e)| (name.clone(), counter_delta(start.get(name).copied().unwrap_or(0), e, reset)))
        .filter(|(_, d)| *d > 0)
        .collect()
}

pub fn stats_delta(start: &ControlStats, end: &ControlStats) -> StatsDelta {
    let mut reset = false;
    let cache_hits = counter_delta(start.cache.hits, end.cache.hits, &mut reset);
    let cache_misses = counter_delta(start.cache.misses, end.cache.misses, &mut reset);
    let lookups = cache_hits + cache_misses;
    StatsDelta {
        requests: counter_delta(start.requests, end.requests, &mut reset),
        placed: counter_delta(start.placed, end.placed, &mut reset),
        rejected: counter_delta(start.rejected, end.rejected, &mut reset),
        failed: counter_delta(start.failed, end.failed, &mut reset),
        cache_hits,
        cache_misses,
        cache_hit_rate: (lookups > 0).then(|| cache_hits as f64 / lookups as f64),
        fallbacks: map_delta(&start.fallbacks, &end.fallbacks, &mut reset),
        predictions_by_source: map_delta(&start.predictions_by_source, &end.predictions_by_source, &mut reset),
        safeguard_trips: counter_delta(start.safeguard.trips, end.safeguard.trips, &mut reset),
        safeguard_active_at_end: end.safeguard.active,
        quality_gate_trips: counter_delta(start.quality.trips, end.quality.trips, &mut reset),
        counters_reset: reset,
    }
}

/// One sample of the allocators' state during the run.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct SeriesPoint {
    /// Real seconds since the start of the run.
    pub elapsed_s: f64,
    /// Trace time the replay had reached (the latest request sent).
    pub trace_s: f64,
    /// VMs this run placed and has not released yet.
    pub vms_alive: u64,
    /// VMs on the allocators (every client's), summed over zones.
    pub allocator_vms: Option<u64>,
    pub hosts: Option<u64>,
    pub empty_hosts: Option<u64>,
    /// Used over offered cores of the non-empty hosts, 0..1 (over several zones, weighted by their
    /// non-empty hosts).
    pub packing_density: Option<f64>,
    /// Percent of hosts that are empty.
    pub empty_hosts_pct: Option<f64>,
    /// The realized prediction quality per model version (the control service's `quality`: every
    /// zone's window added up), as it stood at this sample.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub quality: Vec<QualitySample>,
    /// Client latency of the allocation requests answered since the previous sample (the whole
    /// run's is the summary's `latency`), for latency over time in long runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interval_latency: Option<LatencySummary>,
}

/// One model version's realized quality in one `/v1/stats` sample.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct QualitySample {
    pub version: String,
    /// Outcomes in the window (resolved, cohort complete).
    pub resolved: u64,
    pub roc_auc: Option<f64>,
    pub average_precision: Option<f64>,
    pub precision: Option<f64>,
    pub recall: Option<f64>,
}

impl QualitySample {
    pub fn of(version: &VersionQuality) -> Self {
        let f = &version.figures;
        QualitySample {
            version: version.version.clone(),
            resolved: f.resolved,
            roc_auc: f.roc_auc,
            average_precision: f.average_precision,
            precision: f.precision,
            recall: f.recall,
        }
    }
}

/// A time-series point from a `/v1/stats` answer. Zones whose allocator did not answer, and fields
/// an allocator does not report, are left out rather than read as zero.
pub fn series_point(elapsed_s: f64, trace_s: f64, vms_alive: u64, stats: &ControlStats) -> SeriesPoint {
    let mut point = SeriesPoint {
        elapsed_s,
        trace_s,
        vms_alive,
        quality: stats.quality.versions.iter().map(QualitySample::of).collect(),
        ..SeriesPoint::default()
    };
    let (mut density_sum, mut density_weight, mut empty_pct_sum, mut empty_pct_zones) = (0.0, 0.0, 0.0, 0u32);
    let add = |slot: &mut Option<u64>, value: Option<u64>| {
        if let Some(v) = value {
            *slot = Some(slot.unwrap_or(0) + v);
        }
    };
    for zone in stats.zones.values() {
        let Some(zone_stats) = &zone.stats else { continue };
        let uint = |name: &str| zone_stats.get(name).and_then(serde_json::Value::as_u64);
        let float = |name: &str| zone_stats.get(name).and_then(serde_json::Value::as_f64);
        let (hosts, empty) = (uint("hosts"), uint("empty_hosts"));
        add(&mut point.allocator_vms, uint("vms"));
        add(&mut point.hosts, hosts);
        add(&mut point.empty_hosts, empty);
        if let Some(density) = float("packing_density") {
            let weight = match (hosts, empty) {
                (Some(h), Some(e)) => h.saturating_sub(e) as f64,
                _ => 1.0,
            };
            density_sum += density * weight;
            density_weight += weight;
        }
        if let Some(pct) = float("empty_hosts_pct") {
            empty_pct_sum += pct;
            empty_pct_zones += 1;
        }
    }
    point.packing_density = if density_weight > 0.0 {
        Some(density_sum / density_weight)
    } else if stats.zones.len() == 1 {
        // One zone with every host empty: weight 0, and its own figure is the answer.
        stats.zones.values().find_map(|z| z.stats.as_ref()?.get("packing_density")?.as_f64())
    } else {
        None
    };
    point.empty_hosts_pct = match (point.hosts, point.empty_hosts) {
        (Some(hosts), Some(empty)) if hosts > 0 => Some(100.0 * empty as f64 / hosts as f64),
        _ if empty_pct_zones > 0 => Some(empty_pct_sum / f64::from(empty_pct_zones)),
        _ => None,
    };
    point
}

/// Indices of at most `max` of `n` rows, evenly spread, first and last included.
pub fn thin_indices(n: usize, max: usize) -> Vec<usize> {
    if n <= max {
        return (0..n).collect();
    }
    match max {
        0 => Vec::new(),
        1 => vec![n - 1],
        _ => {
            let mut picked: Vec<usize> =
                (0..max).map(|i| ((i as f64 * (n - 1) as f64) / (max - 1) as f64).round() as usize).collect();
            picked.dedup();
            picked
        }
    }
}
