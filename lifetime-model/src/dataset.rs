//! Training and evaluation examples from a trace: features from the past only, labels that respect
//! censoring.
//!
//! [`replay`] walks a trace in time order. At each VM's arrival it applies every departure that has
//! happened by then to the tenant histories, encodes the VM's row, then records its start. Labels:
//! a VM that ended inside the period is *completed*; one still running when the period's data stops
//! (the trace end, or the training cut-off of a time split) is *censored* with the lifetime observed
//! so far, a lower bound. A VM censored after 5 h is known long-lived for a 2 h threshold; one censored
//! after 1 h has no 2 h label and is left out.

use crate::features::{FeatureEncoder, RequestFeatures};
use crate::history::{FeatureStore, Histories};
use traces::VmRecord;

/// What is known of a VM's lifetime at the end of the data that labels it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ObservedLifetime {
    /// The lifetime when completed; a lower bound when censored.
    pub seconds: f64,
    pub censored: bool,
}

impl ObservedLifetime {
    /// Observed lifetime of `record` when data stops at `data_end_s`.
    pub fn of(record: &VmRecord, data_end_s: f64) -> Self {
        match record.end_s {
            Some(end) if end <= data_end_s => ObservedLifetime { seconds: end - record.start_s, censored: false },
            _ => ObservedLifetime { seconds: (data_end_s - record.start_s).max(0.0), censored: true },
        }
    }

    /// Whether the VM lives at least `threshold_s`, when known.
    pub fn at_least(&self, threshold_s: f64) -> Option<bool> {
        if self.seconds >= threshold_s {
            Some(true)
        } else if self.censored {
            None
        } else {
            Some(false)
        }
    }

    /// Index of the lifetime interval given ascending `cutoffs_s`, when known.
    pub fn interval_class(&self, cutoffs_s: &[f64]) -> Option<usize> {
        let class = cutoffs_s.partition_point(|&c| c <= self.seconds);
        if self.censored && class < cutoffs_s.len() {
            None // it may still reach a higher class
        } else {
            Some(class)
        }
    }
}

/// Every VM of a trace as a feature row with its labels.
pub struct ReplayedTrace {
    pub n_features: usize,
    /// Row-major features at arrival, `n_features` per VM.
    pub rows: Vec<f64>,
    pub start_s: Vec<f64>,
    /// Label as seen by the training side of a time split (censored at the cut-off).
    pub train_label: Vec<ObservedLifetime>,
    /// Label with all the trace's data (for evaluation).
    pub full_label: Vec<ObservedLifetime>,
    /// The histories at the end of the replay (or where it was told to stop them): the feature
    /// store's content.
    pub histories: FeatureStore,
    pub trace_end_s: f64,
}

impl ReplayedTrace {
    pub fn row(&self, i: usize) -> &[f64] {
        &self.rows[i * self.n_features..(i + 1) * self.n_features]
    }

    pub fn len(&self) -> usize {
        self.start_s.len()
    }

    pub fn is_empty(&self) -> bool {
        self.start_s.is_empty()
    }
}

/// Deals the VMs' lifetimes out again at random (seeded): each VM keeps its features and arrival
/// but gets another VM's lifetime (or its censoring), so the labels no longer follow the features.
/// A lifetime that would end after the trace's last timestamp is censored there. For a
/// deliberately bad bundle (`lifetime-train --shuffle-labels`), which the quality gate must catch.
pub fn shuffle_lifetimes(records: &mut [VmRecord], seed: u64) {
    let trace_end_s = records.iter().map(|r| r.end_s.unwrap_or(r.start_s).max(r.start_s)).fold(f64::MIN, f64::max);
    let mut lifetimes: Vec<Option<f64>> = records.iter().map(VmRecord::lifetime_s).collect();
    // Fisher-Yates over a splitmix64 sequence: no dependency for one shuffle.
    let mut state = seed;
    let mut next = || {
        state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    };
    for i in (1..lifetimes.len()).rev() {
        let j = (next() % (i as u64 + 1)) as usize;
        lifetimes.swap(i, j);
    }
    for (record, lifetime) in records.iter_mut().zip(lifetimes) {
        record.end_s = lifetime.map(|l| record.start_s + l).filter(|end| *end <= trace_end_s);
    }
}

/// Replays `records` (any order) and encodes every VM. `cutoff_s` is where training data stops;
/// `trace_end_s` where the trace's data stops. `stop_history_at_s` freezes the returned histories at
/// that instant (the feature store must not know the evaluation period).
pub fn replay(
    records: &[VmRecord],
    encoder: &FeatureEncoder,
    cutoff_s: f64,
    trace_end_s: f64,
    stop_history_at_s: f64,
) -> ReplayedTrace {
    let schema = encoder.schema();
    let mut order: Vec<usize> = (0..records.len()).collect();
    order.sort_by(|&a, &b| records[a].start_s.total_cmp(&records[b].start_s));
    let mut ends: Vec<(f64, usize)> =
        records.iter().enumerate().filter_map(|(i, r)| r.end_s.map(|end| (end, i))).collect();
    ends.sort_by(|a, b| a.0.total_cmp(&b.0));

    let n_features = schema.len();
    let mut out = ReplayedTrace {
        n_features,
        rows: Vec::with_capacity(records.len() * n_features),
        start_s: Vec::with_capacity(records.len()),
        train_label: Vec::with_capacity(records.len()),
        full_label: Vec::with_capacity(records.len()),
        histories: FeatureStore::empty(stop_history_at_s),
        trace_end_s,
    };
    let mut histories = FeatureStore::empty(stop_history_at_s);
    let mut frozen: Option<FeatureStore> = None;
    let mut next_end = 0;
    for &i in &order {
        let record = &records[i];
        let now = record.start_s;
        if frozen.is_none() && now > stop_history_at_s {
            apply_ends(records, &ends, &mut next_end, stop_history_at_s, &mut histories);
            frozen = Some(histories.clone());
        }
        apply_ends(records, &ends, &mut next_end, now, &mut histories);
        let request = RequestFeatures::from(record);
        let past =
            histories.past(&record.tenant_id, &record.vm_type, now, schema.history_window_s, schema.long_threshold_s);
        encoder.encode_into(&request, &past, None, &mut out.rows);
        histories.record_start(&record.tenant_id, &record.vm_type, now);
        out.start_s.push(now);
        out.train_label.push(ObservedLifetime::of(record, cutoff_s));
        out.full_label.push(ObservedLifetime::of(record, trace_end_s));
    }
    out.histories = match frozen {
        Some(histories) => histories,
        None => {
            apply_ends(records, &ends, &mut next_end, stop_history_at_s, &mut histories);
            histories
        }
    };
    out
}

fn apply_ends(
    records: &[VmRecord],
    ends: &[(f64, usize)],
    next_end: &mut usize,
    until_s: f64,
    histories: &mut FeatureStore,
) {
    while *next_end < ends.len() && ends[*next_end].0 <= until_s {
        let (end, i) = ends[*next_end];
        let record = &records[i];
        histories.record_end(&record.tenant_id, &record.vm_type, record.start_s, end);
        *next_end += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn observed(seconds: f64, censored: bool) -> ObservedLifetime {
        ObservedLifetime { seconds, censored }
    }

    #[test]
    fn censored_vms_are_labelled_only_when_the_label_is_known() {
        let two_hours = 7_200.0;
        assert_eq!(observed(5.0 * 3_600.0, true).at_least(two_hours), Some(true));
        assert_eq!(observed(3_600.0, true).at_least(two_hours), None);
        assert_eq!(observed(3_600.0, false).at_least(two_hours), Some(false));
        let cutoffs = [900.0, 1_800.0, 3_600.0];
        assert_eq!(observed(1_000.0, false).interval_class(&cutoffs), Some(1));
        assert_eq!(observed(1_000.0, true).interval_class(&cutoffs), None);
        assert_eq!(observed(4_000.0, true).interval_class(&cutoffs), Some(3));
    }

    #[test]
    fn shuffled_lifetimes_are_the_same_lifetimes_dealt_to_other_vms_within_the_trace() {
        let mut records: Vec<VmRecord> = (0..200)
            .map(|i| VmRecord {
                vm_id: format!("v{i}"),
                tenant_id: "t".into(),
                vm_type: "D".into(),
                cores: 1.0,
                memory_gib: 1.0,
                priority: domain::Priority::Regular,
                start_s: f64::from(i) * 10.0,
                end_s: (i % 7 != 0).then(|| f64::from(i) * 10.0 + f64::from(i % 13) * 100.0),
                extra: Default::default(),
            })
            .collect();
        let before: Vec<_> = records.iter().map(VmRecord::lifetime_s).collect();
        let trace_end = records.iter().filter_map(|r| r.end_s).fold(0.0, f64::max).max(1_990.0);
        shuffle_lifetimes(&mut records, 3);
        let after: Vec<_> = records.iter().map(VmRecord::lifetime_s).collect();
        assert_ne!(before, after, "the labels moved");
        assert!(records.iter().all(|r| r.end_s.is_none_or(|end| end <= trace_end && end >= r.start_s)));
        // Every kept lifetime is one of the originals.
        let mut originals: Vec<f64> = before.iter().flatten().copied().collect();
        originals.sort_by(f64::total_cmp);
        assert!(after.iter().flatten().all(|l| originals.binary_search_by(|o| o.total_cmp(l)).is_ok()));
    }
}
