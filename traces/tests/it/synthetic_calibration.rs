//! The synthetic generator is deterministic per seed and lands inside stated tolerances of the
//! published statistics it is calibrated to.

use std::collections::HashMap;
use traces::synthetic::{calibration, generate, SyntheticConfig};
use traces::{TraceStats, VmRecord};

const TWO_HOURS: f64 = 7_200.0;

fn uncensored(seed: u64) -> Vec<VmRecord> {
    generate(&SyntheticConfig { seed, span_days: 14.0, censor: false, ..SyntheticConfig::default() })
}

#[test]
fn same_seed_same_trace_other_seed_other_trace() {
    let config = SyntheticConfig { span_days: 2.0, ..SyntheticConfig::default() };
    let a = generate(&config);
    let b = generate(&config);
    let c = generate(&SyntheticConfig { seed: config.seed + 1, ..config.clone() });
    assert!(!a.is_empty());
    assert_eq!(a, b);
    assert_ne!(a, c);
}

#[test]
fn lifetimes_match_the_published_shape() {
    let records = uncensored(7);
    let stats = TraceStats::of(&records);
    let median = stats.quantile_s("p50").expect("median");
    let mean = stats.mean_lifetime_s.expect("mean");
    eprintln!("median {:.1} min, mean {:.2} d", median / 60.0, mean / 86_400.0);
    // Median about 16 minutes (within 25%), mean above a day.
    assert!((median / calibration::MEDIAN_LIFETIME_S - 1.0).abs() < 0.25, "median {median} s");
    assert!(mean > calibration::MIN_MEAN_LIFETIME_S, "mean {mean} s");
    // Most VMs are short-lived, yet most core-hours are in long-lived VMs.
    let under_2h = stats.share_under["2h"];
    let core_hours_under_10h: f64 = stats.core_hours_share[..2].iter().map(|(_, s)| s).sum();
    eprintln!("under 2h {under_2h:.3}, core-hours under 10h {core_hours_under_10h:.3}");
    assert!((0.68..0.82).contains(&under_2h), "share under 2 h {under_2h}");
    assert!(core_hours_under_10h < 0.1, "core-hours in VMs under 10 h {core_hours_under_10h}");
}

#[test]
fn core_mix_matches_protean_table_3_within_3_points() {
    let stats = TraceStats::of(&uncensored(11));
    for (cores, target) in calibration::CORE_MIX {
        let share = stats.core_mix.get(&cores.to_string()).copied().unwrap_or(0.0);
        eprintln!("{cores} cores: {share:.3} (target {target})");
        assert!((share - target).abs() < 0.03, "{cores} cores: {share} vs {target}");
    }
}

#[test]
fn requests_are_mostly_single_vms_with_rare_huge_gangs() {
    // VMs that had ended before time 0 are not in the trace: look at requests after it.
    let records: Vec<VmRecord> = uncensored(13).into_iter().filter(|r| r.start_s >= 0.0).collect();
    let mut sizes: HashMap<&str, usize> = HashMap::new();
    for record in &records {
        *sizes.entry(record.extra.get("request_id").expect("request_id")).or_default() += 1;
    }
    let single = sizes.values().filter(|&&n| n == 1).count() as f64 / sizes.len() as f64;
    let largest = sizes.values().copied().max().unwrap_or(0);
    eprintln!("single-VM requests {single:.3}, largest gang {largest}");
    assert!((single - calibration::SINGLE_VM_REQUEST_SHARE).abs() < 0.02, "single-VM share {single}");
    assert!(largest >= 20, "largest gang {largest}");
    // Every VM of a request shares its tenant, start and batch size.
    let mut first: HashMap<&str, &VmRecord> = HashMap::new();
    for record in &records {
        let request = record.extra.get("request_id").expect("request_id");
        let head = *first.entry(request).or_insert(record);
        assert_eq!((&head.tenant_id, head.start_s), (&record.tenant_id, record.start_s));
        assert_eq!(record.extra.get("batch_size"), Some(sizes[request].to_string().as_str()));
    }
}

#[test]
fn arrivals_follow_a_diurnal_cycle() {
    let records = uncensored(17);
    let mut per_hour = [0usize; 24];
    for record in records.iter().filter(|r| r.start_s >= 0.0) {
        per_hour[((record.start_s % 86_400.0) / 3_600.0) as usize] += 1;
    }
    let peak = *per_hour.iter().max().expect("hours") as f64;
    let trough = *per_hour.iter().min().expect("hours") as f64;
    eprintln!("peak/trough {:.2}", peak / trough);
    assert!(peak / trough > 2.0, "peak {peak} trough {trough}");
}

/// Area under the ROC curve of `scores` for `labels` (ties count half).
fn auc(mut scored: Vec<(f64, bool)>) -> f64 {
    scored.sort_by(|a, b| a.0.total_cmp(&b.0));
    let positives = scored.iter().filter(|s| s.1).count() as f64;
    let negatives = scored.len() as f64 - positives;
    let (mut rank_sum, mut i) = (0.0, 0);
    while i < scored.len() {
        let mut j = i;
        while j < scored.len() && scored[j].0 == scored[i].0 {
            j += 1;
        }
        let mid_rank = (i + j + 1) as f64 / 2.0;
        rank_sum += mid_rank * scored[i..j].iter().filter(|s| s.1).count() as f64;
        i = j;
    }
    (rank_sum - positives * (positives + 1.0) / 2.0) / (positives * negatives)
}

#[test]
fn lifetimes_are_predictable_from_the_past_but_not_perfectly() {
    // A deliberately simple predictor: the tenant's share of long-lived VMs among those it started
    // earlier and that have already ended (smoothed), plus a nudge for bigger VMs.
    let records = uncensored(19);
    let mut ended: Vec<(f64, &str, bool)> = records
        .iter()
        .map(|r| (r.end_s.expect("uncensored"), r.tenant_id.as_str(), r.lifetime_s() >= Some(TWO_HOURS)))
        .collect();
    ended.sort_by(|a, b| a.0.total_cmp(&b.0));
    let mut history: HashMap<&str, (f64, f64)> = HashMap::new();
    let mut next_end = 0;
    let mut scored = Vec::new();
    for record in &records {
        while next_end < ended.len() && ended[next_end].0 <= record.start_s {
            let (_, tenant, long) = ended[next_end];
            let entry = history.entry(tenant).or_default();
            entry.0 += f64::from(u8::from(long));
            entry.1 += 1.0;
            next_end += 1;
        }
        let (long, total) = history.get(record.tenant_id.as_str()).copied().unwrap_or_default();
        let score = (long + 0.3) / (total + 1.0) + 0.01 * record.cores.log2();
        if record.start_s > 3.0 * 86_400.0 {
            scored.push((score, record.lifetime_s() >= Some(TWO_HOURS)));
        }
    }
    let auc = auc(scored);
    eprintln!("history AUC {auc:.3}");
    assert!((0.75..0.97).contains(&auc), "AUC of a past-only predictor {auc}");
}
