//! Statistics of a trace: what `vmtrace stats` prints.
//!
//! Censoring: the trace ends at the latest start or end time it contains. Lifetime quantiles and the
//! mean are over VMs that ended inside the trace. "Share under X" counts a VM as under X when it ended
//! sooner, as not under X when it lived (or, censored, has been running) at least X, and leaves it out
//! when it is censored before X, since then nobody knows. Core-hours count each VM from its start to
//! its end (or the trace end) and are bucketed by that observed lifetime.

use crate::record::VmRecord;
use serde::Serialize;
use std::collections::{BTreeMap, HashSet};
use std::fmt;

const HOUR: f64 = 3_600.0;
const DAY: f64 = 86_400.0;

/// Thresholds of the "share under" figures.
pub const SHARE_UNDER_THRESHOLDS: [(&str, f64); 3] = [("1h", HOUR), ("2h", 2.0 * HOUR), ("1d", DAY)];
/// Upper bounds of the core-hour buckets: LAVA's lifetime classes <1h, 1-10h, 10-100h, 100-1000h, more.
pub const CORE_HOUR_BUCKETS: [(&str, f64); 5] = [
    ("<1h", HOUR),
    ("1-10h", 10.0 * HOUR),
    ("10-100h", 100.0 * HOUR),
    ("100-1000h", 1000.0 * HOUR),
    (">=1000h", f64::INFINITY),
];
/// Quantiles reported for completed lifetimes.
pub const QUANTILES: [f64; 6] = [0.10, 0.25, 0.50, 0.75, 0.90, 0.99];

/// Accumulates records one at a time; [`TraceStatsBuilder::finish`] computes the statistics.
#[derive(Default)]
pub struct TraceStatsBuilder {
    vms: u64,
    censored: u64,
    negative_start: u64,
    low_priority: u64,
    first_start: f64,
    last_time: f64,
    completed_lifetimes: Vec<f64>,
    /// (start, end or None, cores) of every VM, to settle censored ones once the trace end is known.
    spans: Vec<(f64, Option<f64>, f64)>,
    tenants: HashSet<String>,
    vms_without_tenant: u64,
    vm_types: HashSet<String>,
    cores: BTreeMap<String, u64>,
    /// When the trace was cut, if known better than its latest timestamp.
    trace_end_override: Option<f64>,
}

impl TraceStatsBuilder {
    pub fn new() -> Self {
        TraceStatsBuilder { first_start: f64::INFINITY, last_time: f64::NEG_INFINITY, ..Default::default() }
    }

    /// Sets the time the trace was cut (its censoring time). Without it, the latest start or end
    /// time in the trace is taken, which overstates it when ends were sampled inside bins.
    pub fn with_trace_end(mut self, trace_end_s: Option<f64>) -> Self {
        self.trace_end_override = trace_end_s;
        self
    }

    pub fn push(&mut self, record: &VmRecord) {
        self.vms += 1;
        self.first_start = self.first_start.min(record.start_s);
        self.last_time = self.last_time.max(record.start_s).max(record.end_s.unwrap_or(f64::NEG_INFINITY));
        if record.start_s < 0.0 {
            self.negative_start += 1;
        }
        if record.priority == domain::Priority::Low {
            self.low_priority += 1;
        }
        match record.lifetime_s() {
            Some(lifetime) => self.completed_lifetimes.push(lifetime),
            None => self.censored += 1,
        }
        self.spans.push((record.start_s, record.end_s, record.cores));
        if record.tenant_id.is_empty() {
            self.vms_without_tenant += 1;
        } else if !self.tenants.contains(&record.tenant_id) {
            self.tenants.insert(record.tenant_id.clone());
        }
        if !self.vm_types.contains(&record.vm_type) {
            self.vm_types.insert(record.vm_type.clone());
        }
        *self.cores.entry(format_number(record.cores)).or_default() += 1;
    }

    pub fn finish(mut self) -> TraceStats {
        let trace_end = match self.trace_end_override {
            Some(end) => end,
            None if self.vms == 0 => 0.0,
            None => self.last_time,
        };
        self.completed_lifetimes.sort_by(f64::total_cmp);
        let lifetimes = &self.completed_lifetimes;
        let quantiles =
            QUANTILES.iter().map(|&q| (format!("p{}", (q * 100.0).round()), quantile(lifetimes, q))).collect();
        let mean =
            if lifetimes.is_empty() { None } else { Some(lifetimes.iter().sum::<f64>() / lifetimes.len() as f64) };

        let mut share_under = BTreeMap::new();
        for (name, threshold) in SHARE_UNDER_THRESHOLDS {
            let (mut under, mut known) = (0u64, 0u64);
            for &(start, end, _) in &self.spans {
                match end {
                    Some(end) => {
                        known += 1;
                        under += u64::from(end - start < threshold);
                    }
                    None if trace_end - start >= threshold => known += 1,
                    None => {}
                }
            }
            share_under.insert(name.to_owned(), ratio(under, known));
        }

        let mut core_hours = [0.0; CORE_HOUR_BUCKETS.len()];
        for &(start, end, cores) in &self.spans {
            let observed = end.unwrap_or(trace_end).max(start) - start;
            let bucket = CORE_HOUR_BUCKETS
                .iter()
                .position(|&(_, upper)| observed < upper)
                .unwrap_or(CORE_HOUR_BUCKETS.len() - 1);
            core_hours[bucket] += cores * observed / HOUR;
        }
        let total_core_hours: f64 = core_hours.iter().sum();
        let core_hours_share = CORE_HOUR_BUCKETS
            .iter()
            .zip(core_hours)
            .map(|(&(name, _), hours)| {
                (name.to_owned(), if total_core_hours > 0.0 { hours / total_core_hours } else { 0.0 })
            })
            .collect();

        let core_mix = self.cores.iter().map(|(cores, &n)| (cores.clone(), ratio(n, self.vms))).collect();
        TraceStats {
            vms: self.vms,
            tenants: self.tenants.len() as u64,
            vms_without_tenant: self.vms_without_tenant,
            vm_types: self.vm_types.len() as u64,
            first_start_s: if self.vms == 0 { 0.0 } else { self.first_start },
            trace_end_s: trace_end,
            span_days: if self.vms == 0 { 0.0 } else { (trace_end - self.first_start) / DAY },
            censored_share: ratio(self.censored, self.vms),
            negative_start_share: ratio(self.negative_start, self.vms),
            low_priority_share: ratio(self.low_priority, self.vms),
            completed_vms: lifetimes.len() as u64,
            lifetime_quantiles_s: quantiles,
            mean_lifetime_s: mean,
            share_under,
            core_hours_share,
            total_core_hours,
            core_mix,
        }
    }
}

/// Summary statistics of one trace.
#[derive(Clone, Debug, Serialize)]
pub struct TraceStats {
    pub vms: u64,
    pub tenants: u64,
    pub vms_without_tenant: u64,
    pub vm_types: u64,
    pub first_start_s: f64,
    /// When the trace was cut: given, or else its latest start or end time. Censored VMs count as
    /// running until then.
    pub trace_end_s: f64,
    pub span_days: f64,
    pub censored_share: f64,
    pub negative_start_share: f64,
    pub low_priority_share: f64,
    pub completed_vms: u64,
    /// Quantiles of completed lifetimes, by name (`p50` ...), in seconds.
    pub lifetime_quantiles_s: Vec<(String, Option<f64>)>,
    pub mean_lifetime_s: Option<f64>,
    /// Share of VMs living less than 1 h, 2 h, 1 day (among VMs whose answer is known).
    pub share_under: BTreeMap<String, f64>,
    /// Share of core-hours by lifetime bucket, in bucket order.
    pub core_hours_share: Vec<(String, f64)>,
    pub total_core_hours: f64,
    /// Share of VMs by core count.
    pub core_mix: BTreeMap<String, f64>,
}

impl TraceStats {
    /// Computes the statistics of every record of an iterator.
    pub fn of<'a>(records: impl IntoIterator<Item = &'a VmRecord>) -> TraceStats {
        let mut builder = TraceStatsBuilder::new();
        records.into_iter().for_each(|r| builder.push(r));
        builder.finish()
    }

    pub fn quantile_s(&self, name: &str) -> Option<f64> {
        self.lifetime_quantiles_s.iter().find(|(n, _)| n == name).and_then(|(_, v)| *v)
    }
}

fn ratio(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        part as f64 / whole as f64
    }
}

/// Nearest-rank quantile of sorted values.
fn quantile(sorted: &[f64], q: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    Some(sorted[rank - 1])
}

fn format_number(value: f64) -> String {
    if value.fract() == 0.0 && value.abs() < 1e15 {
        format!("{}", value as i64)
    } else {
        format!("{value:.3}")
    }
}

/// Human form of a duration in seconds.
pub fn format_duration(seconds: f64) -> String {
    match seconds {
        s if s < 60.0 => format!("{s:.0} s"),
        s if s < HOUR => format!("{:.1} min", s / 60.0),
        s if s < DAY => format!("{:.2} h", s / HOUR),
        s => format!("{:.2} d", s / DAY),
    }
}

impl fmt::Display for TraceStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let pct = |x: f64| format!("{:.1}%", x * 100.0);
        writeln!(f, "VMs                 {}", self.vms)?;
        writeln!(
            f,
            "span                {:.2} days (t = {:.0} s .. {:.0} s)",
            self.span_days, self.first_start_s, self.trace_end_s
        )?;
        writeln!(
            f,
            "tenants             {}{}",
            self.tenants,
            if self.vms_without_tenant > 0 {
                format!(" ({} VMs without tenant)", self.vms_without_tenant)
            } else {
                String::new()
            }
        )?;
        writeln!(f, "VM types            {}", self.vm_types)?;
        writeln!(f, "censored            {} (still running at the end)", pct(self.censored_share))?;
        writeln!(f, "negative start      {} (running before the start)", pct(self.negative_start_share))?;
        writeln!(f, "low priority        {}", pct(self.low_priority_share))?;
        writeln!(f, "lifetime of the {} completed VMs:", self.completed_vms)?;
        for (name, value) in &self.lifetime_quantiles_s {
            writeln!(f, "  {name:<5}             {}", value.map_or("-".to_owned(), format_duration))?;
        }
        writeln!(f, "  mean              {}", self.mean_lifetime_s.map_or("-".to_owned(), format_duration))?;
        writeln!(f, "share of VMs living less than:")?;
        for (name, _) in SHARE_UNDER_THRESHOLDS {
            writeln!(f, "  {name:<4}              {}", pct(self.share_under.get(name).copied().unwrap_or(0.0)))?;
        }
        writeln!(f, "share of core-hours by lifetime ({:.0} core-hours):", self.total_core_hours)?;
        for (name, share) in &self.core_hours_share {
            writeln!(f, "  {name:<10}        {}", pct(*share))?;
        }
        writeln!(f, "core mix (share of VMs):")?;
        let mut mix: Vec<_> = self.core_mix.iter().collect();
        mix.sort_by(|a, b| a.0.parse::<f64>().unwrap_or(0.0).total_cmp(&b.0.parse::<f64>().unwrap_or(0.0)));
        for (cores, share) in mix {
            writeln!(f, "  {cores:>6} cores      {}", pct(*share))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::ExtraColumns;

    fn vm(start_s: f64, end_s: Option<f64>, cores: f64, tenant: &str) -> VmRecord {
        VmRecord {
            vm_id: format!("v{start_s}"),
            tenant_id: tenant.to_owned(),
            vm_type: "a".to_owned(),
            cores,
            memory_gib: 1.0,
            priority: domain::Priority::Regular,
            start_s,
            end_s,
            extra: ExtraColumns::default(),
        }
    }

    #[test]
    fn censored_vms_count_only_where_their_answer_is_known() {
        // Trace ends at 10 h. Completed: 30 min and 3 h. Censored: started at 9.5 h (unknown for
        // 1 h, not known), started at 0 (ran 10 h: known not under 1 h, 2 h; unknown for 1 day).
        let records = [
            vm(0.0, Some(1_800.0), 1.0, "a"),
            vm(0.0, Some(3.0 * HOUR), 2.0, "a"),
            vm(9.5 * HOUR, None, 1.0, "b"),
            vm(0.0, None, 4.0, ""),
        ];
        let mut builder = TraceStatsBuilder::new().with_trace_end(Some(10.0 * HOUR));
        records.iter().for_each(|r| builder.push(r));
        let stats = builder.finish();
        assert_eq!(stats.share_under["1h"], 1.0 / 3.0);
        assert_eq!(stats.share_under["2h"], 1.0 / 3.0);
        assert_eq!(stats.share_under["1d"], 1.0);
        assert_eq!((stats.tenants, stats.vms_without_tenant), (2, 1));
        assert_eq!(stats.censored_share, 0.5);
        assert_eq!(stats.quantile_s("p50"), Some(1_800.0));
        assert_eq!(stats.mean_lifetime_s, Some((1_800.0 + 3.0 * HOUR) / 2.0));
        // Core-hours: 0.5 (<1h) + 6 (1-10h) + 0.5 (<1h) + 40 (10-100h) = 47.
        assert_eq!(stats.total_core_hours, 47.0);
        assert_eq!(stats.core_hours_share[0], ("<1h".to_owned(), 1.0 / 47.0));
        assert_eq!(stats.core_hours_share[2], ("10-100h".to_owned(), 40.0 / 47.0));
        assert_eq!(stats.core_mix["4"], 0.25);
    }

    #[test]
    fn empty_trace_has_no_quantiles() {
        let stats = TraceStatsBuilder::new().finish();
        assert_eq!(stats.vms, 0);
        assert_eq!(stats.quantile_s("p50"), None);
        assert!(stats.to_string().contains("VMs                 0"));
    }
}
