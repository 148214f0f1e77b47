//! LARS drains in a run (paper 000 s4.4 and s5.1): the periodic plan ([`DrainPlan`]), the drain
//! running, its migrations' completions and when the next one starts.

use crate::clock::Time;
pub use crate::config::DrainPlan;
use crate::config::SimConfig;
use crate::results::MigrationCounters;
use domain::{HostState, VmId};
use placement::Allocator;
use std::cmp::Reverse;
use std::collections::BinaryHeap;

pub(crate) fn add_drain(counters: &mut MigrationCounters, report: &placement::defrag::DrainReport) {
    counters.performed += report.performed;
    counters.avoided += report.avoided;
    counters.cancelled += report.cancelled;
    counters.no_target += report.no_target;
}

/// The LARS drains of a run: the one running, its migrations' completions, and the next one.
pub(crate) struct Drains {
    pub(crate) active: bool,
    /// When the next drain starts (while none is active).
    pub(crate) next_at: f64,
    pub(crate) last_start: f64,
    /// Where the next rolling drain starts in the inventory.
    pub(crate) rolling_next: usize,
    /// Completions of the migrations in flight, in time order (then start order).
    pub(crate) completions: BinaryHeap<Reverse<(Time, u64, VmId)>>,
    pub(crate) started: u64,
}

impl Drains {
    pub(crate) fn new(config: &SimConfig, from_s: f64) -> Self {
        Drains {
            active: false,
            next_at: config
                .drains
                .as_ref()
                .map_or(f64::INFINITY, |plan| from_s + plan.first_after_s.unwrap_or(plan.every_s)),
            last_start: f64::NEG_INFINITY,
            rolling_next: 0,
            completions: BinaryHeap::new(),
            started: 0,
        }
    }

    /// A migration started at `now` (from the allocator's journal): it completes `migration_s` later.
    pub(crate) fn started(&mut self, vm: VmId, migration_s: f64, now: f64) {
        self.started += 1;
        self.completions.push(Reverse((Time(now + migration_s), self.started, vm)));
    }

    /// After a call that may have moved the drain on: when the drain is done, adds its counters,
    /// makes its hosts available again and schedules the next drain.
    pub(crate) fn follow(
        &mut self,
        allocator: &mut Allocator,
        config: &SimConfig,
        now: f64,
        counters: &mut MigrationCounters,
    ) {
        self.active = !allocator.drain().is_none_or(|d| d.queue.is_empty() && d.in_flight.is_empty());
        if self.active {
            return;
        }
        if let Some(report) = allocator.drain_report() {
            add_drain(counters, &report);
            counters.drains_completed += 1;
            for host in &report.hosts {
                // The drained hosts exist: they came from this inventory.
                let _ = allocator.set_host_state(host, HostState::Available);
            }
        }
        self.schedule_next(config, now);
    }

    /// The next drain starts `every_s` after the last one started, and not before `now`.
    pub(crate) fn schedule_next(&mut self, config: &SimConfig, now: f64) {
        self.next_at = match &config.drains {
            Some(plan) if self.last_start.is_finite() => (self.last_start + plan.every_s).max(now),
            Some(_) => now,
            None => f64::INFINITY,
        };
    }
}
