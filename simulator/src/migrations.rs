//! The migrations of a run as its metrics count them: every live migration completed within the
//! measured span (LARS drains and consolidation alike), the memory it moved, and those wasted (the
//! VM exited within an hour of its move). Fed from the allocator's journal and the run's exits.

use crate::metrics::MetricsSummary;
use domain::VmId;
use placement::consolidation::WASTED_WITHIN_S;
use std::collections::HashMap;

/// See the module documentation.
#[derive(Debug)]
pub struct MigrationLedger {
    measured_from_s: f64,
    /// VMs moved within the span, by id: when they arrived on their target.
    recent: HashMap<VmId, f64>,
    migrations: u64,
    wasted: u64,
    moved_gib: f64,
    /// VMs placed within the span.
    placements: u64,
}

impl MigrationLedger {
    pub fn new(measured_from_s: f64) -> Self {
        MigrationLedger {
            measured_from_s,
            recent: HashMap::new(),
            migrations: 0,
            wasted: 0,
            moved_gib: 0.0,
            placements: 0,
        }
    }

    /// A migration of `vm` (with `memory_gib`) completed at `now_s`.
    pub fn moved(&mut self, vm: VmId, memory_gib: f64, now_s: f64) {
        if now_s < self.measured_from_s {
            return;
        }
        self.migrations += 1;
        self.moved_gib += memory_gib;
        self.recent.insert(vm, now_s);
    }

    /// A VM was placed at `now_s`.
    pub fn placed(&mut self, now_s: f64) {
        self.placements += u64::from(now_s >= self.measured_from_s);
    }

    /// `vm` exited at `now_s`: a wasted migration if it moved within the hour.
    pub fn exited(&mut self, vm: &VmId, now_s: f64) {
        if let Some(moved_at) = self.recent.remove(vm) {
            if now_s - moved_at <= WASTED_WITHIN_S {
                self.wasted += 1;
            }
        }
    }

    /// The counts into `metrics`, per host-day of `hosts` over its span.
    pub fn fill(&self, metrics: &mut MetricsSummary, hosts: usize) {
        metrics.migrations = self.migrations;
        metrics.migrations_wasted = self.wasted;
        metrics.migrated_gib = self.moved_gib;
        let host_days = hosts as f64 * metrics.span_s / 86_400.0;
        metrics.migrations_per_host_day = if host_days > 0.0 { self.migrations as f64 / host_days } else { 0.0 };
        metrics.migrations_per_100_placements =
            if self.placements > 0 { 100.0 * self.migrations as f64 / self.placements as f64 } else { 0.0 };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_migrations_within_the_span_count_and_an_exit_within_the_hour_wastes_one() {
        let mut ledger = MigrationLedger::new(1000.0);
        ledger.moved(VmId::from("before"), 4.0, 500.0);
        ledger.moved(VmId::from("a"), 8.0, 2000.0);
        ledger.moved(VmId::from("b"), 16.0, 2000.0);
        ledger.exited(&VmId::from("before"), 1500.0);
        (0..4).for_each(|_| ledger.placed(1500.0));
        ledger.placed(10.0);
        ledger.exited(&VmId::from("a"), 2000.0 + 3600.0);
        ledger.exited(&VmId::from("b"), 2000.0 + 3601.0);
        let mut metrics = crate::metrics::MetricsRecorder::new(0.0).summary();
        metrics.span_s = 86_400.0;
        ledger.fill(&mut metrics, 10);
        assert_eq!((metrics.migrations, metrics.migrations_wasted, metrics.migrated_gib), (2, 1, 24.0));
        assert!((metrics.migrations_per_host_day - 0.2).abs() < 1e-12);
        assert_eq!(metrics.migrations_per_100_placements, 50.0, "2 migrations for the 4 placements in the span");
    }
}
