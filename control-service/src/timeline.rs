//! What the console shows over time: at a fixed interval the control service samples its counters
//! and every zone's occupancy, and keeps the last samples in memory (`GET /v1/stats/history`), so
//! a dashboard opened now shows the last hour, not only what happened since it was opened.
//!
//! Counters are kept as they are (rates are differences of consecutive samples); a restart starts
//! them, and the timeline, from zero.

use domain::ControlStats;
use serde::Serialize;
use std::collections::{BTreeMap, VecDeque};
use std::sync::Mutex;

/// One sample of the control service's counters and its zones' occupancy.
#[derive(Clone, Debug, PartialEq, Serialize, utoipa::ToSchema)]
pub struct Sample {
    /// When it was taken (Unix seconds).
    pub at_s: f64,
    pub requests: u64,
    pub placed: u64,
    pub rejected: u64,
    pub failed: u64,
    /// VM predictions by source since start (`model`, `cache`, `fallback_timeout`, ...).
    pub predictions_by_source: BTreeMap<String, u64>,
    /// The zones whose allocator answered.
    pub zones: BTreeMap<String, ZoneSample>,
}

/// One zone's occupancy in a [`Sample`].
#[derive(Clone, Debug, PartialEq, Serialize, utoipa::ToSchema)]
pub struct ZoneSample {
    pub hosts: u64,
    pub empty_hosts: u64,
    pub vms: u64,
    /// Allocated cores / cores of non-empty hosts.
    pub packing_density: f64,
    pub empty_hosts_pct: f64,
    /// Requests the zone's allocator rejected since it started, all reasons.
    pub rejections: u64,
}

/// The last samples, oldest first.
#[derive(Debug)]
pub struct Timeline {
    samples: Mutex<VecDeque<Sample>>,
    capacity: usize,
    /// How often a sample is taken.
    pub interval_ms: u64,
}

/// `GET /v1/stats/history`.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct History {
    /// How often a sample is taken.
    pub interval_ms: u64,
    /// Oldest first.
    pub samples: Vec<Sample>,
}

impl Timeline {
    /// A timeline of at most `capacity` samples taken every `interval_ms` (0 samples: none kept).
    pub fn new(capacity: usize, interval_ms: u64) -> Self {
        Timeline { samples: Mutex::new(VecDeque::with_capacity(capacity.min(100_000))), capacity, interval_ms }
    }

    pub fn push(&self, sample: Sample) {
        if self.capacity == 0 {
            return;
        }
        let mut samples = self.samples.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        while samples.len() >= self.capacity {
            samples.pop_front();
        }
        samples.push_back(sample);
    }

    /// The samples, oldest first.
    pub fn samples(&self) -> Vec<Sample> {
        self.samples.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).iter().cloned().collect()
    }

    pub fn history(&self) -> History {
        History { interval_ms: self.interval_ms, samples: self.samples() }
    }
}

/// The sample of one `/v1/stats` answer taken at `at_s`. A zone whose statistics are missing or
/// unreadable is left out (the chart shows a gap, not a zero).
pub fn sample(stats: &ControlStats, at_s: f64) -> Sample {
    let zones = stats
        .zones
        .iter()
        .filter_map(|(zone, z)| {
            let s = z.stats.as_ref()?;
            let whole = |field: &str| s.get(field).and_then(serde_json::Value::as_u64);
            let real = |field: &str| s.get(field).and_then(serde_json::Value::as_f64);
            let rejections = s
                .get("rejections")
                .and_then(serde_json::Value::as_object)
                .map_or(0, |by_reason| by_reason.values().filter_map(serde_json::Value::as_u64).sum());
            Some((
                zone.clone(),
                ZoneSample {
                    hosts: whole("hosts")?,
                    empty_hosts: whole("empty_hosts")?,
                    vms: whole("vms")?,
                    packing_density: real("packing_density")?,
                    empty_hosts_pct: real("empty_hosts_pct")?,
                    rejections,
                },
            ))
        })
        .collect();
    Sample {
        at_s,
        requests: stats.requests,
        placed: stats.placed,
        rejected: stats.rejected,
        failed: stats.failed,
        predictions_by_source: stats.predictions_by_source.clone(),
        zones,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use domain::ZoneStats;

    fn stats(placed: u64, zone: Option<serde_json::Value>) -> ControlStats {
        let mut stats = ControlStats { placed, ..ControlStats::default() };
        let error = zone.is_none().then(|| "unreachable".to_owned());
        stats.zones.insert("zone-1".to_owned(), ZoneStats { allocator: "a".to_owned(), stats: zone, error });
        stats
    }

    #[test]
    fn keeps_the_last_samples_oldest_first() {
        let timeline = Timeline::new(3, 1_000);
        for placed in 0..5 {
            timeline.push(sample(&stats(placed, None), placed as f64));
        }
        let placed: Vec<u64> = timeline.samples().iter().map(|s| s.placed).collect();
        assert_eq!(placed, vec![2, 3, 4]);
        let off = Timeline::new(0, 1_000);
        off.push(sample(&stats(1, None), 1.0));
        assert!(off.samples().is_empty());
    }

    #[test]
    fn reads_a_zones_occupancy_and_leaves_out_a_zone_without_statistics() {
        let zone = serde_json::json!({"hosts": 10, "empty_hosts": 4, "vms": 7, "packing_density": 0.8,
            "empty_hosts_pct": 40.0, "rejections": {"no_capacity": 2, "incompatible": 1}});
        let taken = sample(&stats(7, Some(zone)), 12.5);
        assert_eq!(taken.at_s, 12.5);
        assert_eq!(
            taken.zones["zone-1"],
            ZoneSample {
                hosts: 10,
                empty_hosts: 4,
                vms: 7,
                packing_density: 0.8,
                empty_hosts_pct: 40.0,
                rejections: 3
            }
        );
        assert!(sample(&stats(7, None), 1.0).zones.is_empty());
        let unreadable = serde_json::json!({"hosts": "many"});
        assert!(sample(&stats(7, Some(unreadable)), 1.0).zones.is_empty());
    }
}
