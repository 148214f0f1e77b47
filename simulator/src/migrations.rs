//! The migrations of a run as its metrics count them: every live migration completed within the
//! measured span (LARS drains and consolidation alike), the memory it moved; those cancelled (the
//! VM exited while it moved: a migration spent for nothing); and those wasted, within an hour and
//! within six of the move (the VM exited that soon after it, or during it). Fed from the allocator's
//! journal and the run's exits.

use crate::metrics::MetricsSummary;
use domain::VmId;
use placement::consolidation::{WASTED_WITHIN_6H_S, WASTED_WITHIN_S};
use std::collections::{HashMap, HashSet};

/// See the module documentation.
#[derive(Debug)]
pub struct MigrationLedger {
    measured_from_s: f64,
    /// VMs moved within the span, by id: when they arrived on their target.
    recent: HashMap<VmId, f64>,
    /// VMs migrating now.
    moving: HashSet<VmId>,
    migrations: u64,
    cancelled: u64,
    /// Completed moves whose VM exited within the hour, and within six.
    wasted: u64,
    wasted_long: u64,
    moved_gib: f64,
    /// VMs placed within the span.
    placements: u64,
}

impl MigrationLedger {
    pub fn new(measured_from_s: f64) -> Self {
        MigrationLedger {
            measured_from_s,
            recent: HashMap::new(),
            moving: HashSet::new(),
            migrations: 0,
            cancelled: 0,
            wasted: 0,
            wasted_long: 0,
            moved_gib: 0.0,
            placements: 0,
        }
    }

    /// A migration of `vm` started.
    pub fn started(&mut self, vm: VmId) {
        self.moving.insert(vm);
    }

    /// A migration of `vm` (with `memory_gib`) completed at `now_s`.
    pub fn moved(&mut self, vm: VmId, memory_gib: f64, now_s: f64) {
        self.moving.remove(&vm);
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

    /// `vm` exited at `now_s`: its migration cancelled if it was moving, wasted if it moved
    /// within the hour (or the six hours).
    pub fn exited(&mut self, vm: &VmId, now_s: f64) {
        if self.moving.remove(vm) {
            self.cancelled += u64::from(now_s >= self.measured_from_s);
        }
        if let Some(moved_at) = self.recent.remove(vm) {
            self.wasted += u64::from(now_s - moved_at <= WASTED_WITHIN_S);
            self.wasted_long += u64::from(now_s - moved_at <= WASTED_WITHIN_6H_S);
        }
    }

    /// The counts into `metrics`, per host-day of `hosts` over its span.
    pub fn fill(&self, metrics: &mut MetricsSummary, hosts: usize) {
        metrics.migrations = self.migrations;
        metrics.migrations_cancelled = self.cancelled;
        // A cancelled migration was spent for nothing: wasted in both windows.
        metrics.migrations_wasted = self.wasted + self.cancelled;
        metrics.migrations_wasted_6h = self.wasted_long + self.cancelled;
        metrics.migrated_gib = self.moved_gib;
        let spent = (self.migrations + self.cancelled) as f64;
        let host_days = hosts as f64 * metrics.span_s / 86_400.0;
        metrics.migrations_per_host_day = if host_days > 0.0 { spent / host_days } else { 0.0 };
        metrics.migrations_per_100_placements =
            if self.placements > 0 { 100.0 * spent / self.placements as f64 } else { 0.0 };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn migrations_within_the_span_count_cancelled_ones_are_wasted_and_exits_within_one_and_six_hours_waste() {
        let mut ledger = MigrationLedger::new(1000.0);
        ledger.moved(VmId::from("before"), 4.0, 500.0);
        ledger.moved(VmId::from("a"), 8.0, 2000.0);
        ledger.moved(VmId::from("b"), 16.0, 2000.0);
        ledger.moved(VmId::from("c"), 2.0, 2000.0);
        ledger.started(VmId::from("d"));
        ledger.started(VmId::from("e"));
        ledger.exited(&VmId::from("d"), 2100.0);
        ledger.moved(VmId::from("e"), 1.0, 2200.0);
        ledger.exited(&VmId::from("e"), 2200.0 + 7.0 * 3600.0);
        ledger.exited(&VmId::from("before"), 1500.0);
        (0..4).for_each(|_| ledger.placed(1500.0));
        ledger.placed(10.0);
        ledger.exited(&VmId::from("a"), 2000.0 + 3600.0);
        ledger.exited(&VmId::from("b"), 2000.0 + 3601.0);
        ledger.exited(&VmId::from("c"), 2000.0 + 6.0 * 3600.0);
        let mut metrics = crate::metrics::MetricsRecorder::new(0.0).summary();
        metrics.span_s = 86_400.0;
        ledger.fill(&mut metrics, 10);
        // a, b, c and e moved; d was cancelled by its exit (wasted in both windows); a exited
        // within the hour, b and c within six; e after six.
        assert_eq!((metrics.migrations, metrics.migrations_cancelled, metrics.migrated_gib), (4, 1, 27.0));
        assert_eq!((metrics.migrations_wasted, metrics.migrations_wasted_6h), (2, 4));
        assert!((metrics.migrations_per_host_day - 0.5).abs() < 1e-12, "5 spent on 10 host-days");
        assert_eq!(metrics.migrations_per_100_placements, 125.0, "5 spent for the 4 placements in the span");
    }
}
