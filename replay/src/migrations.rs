//! The replay as the orchestrator of live migrations: an allocator that consolidates asks its
//! caller to move VMs and to confirm each move (`POST /v1/migrations/{vm_id}/complete`). With
//! `--confirm-migrations`, vmreplay reads the allocator's consolidation and confirms each move once
//! it has run for `migration_s` of trace time, at its start plus that time ([`due`]); what it did
//! and the allocator's counters at the end go into the summary ([`MigrationSummary`]).

use domain::VmId;
use placement::consolidation::{ConsolidationCounters, ConsolidationReport};
use serde::Serialize;

/// The migrations in flight that are done by `now_s` (trace time), each with its completion time
/// on the model's clock: it started at `started_at_s` and takes `migration_s`.
pub fn due(report: &ConsolidationReport, migration_s: f64, now_s: f64) -> Vec<(VmId, f64)> {
    report
        .in_flight
        .iter()
        .map(|m| (m.vm_id.clone(), m.started_at_s + migration_s))
        .filter(|&(_, done_s)| done_s <= now_s)
        .collect()
}

/// What the replay did as the migrations' orchestrator.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct MigrationSummary {
    /// The allocator whose migrations were confirmed.
    pub allocator: String,
    /// Trace seconds each migration took before its confirmation.
    pub migration_s: f64,
    /// Migrations confirmed (the allocator answered 200).
    pub confirmed: u64,
    /// Migrations that ended before their confirmation (the VM released meanwhile: 404).
    pub gone: u64,
    /// Failed reads of the consolidation and failed confirmations.
    pub errors: u64,
    /// Consolidation was off on the allocator (404 `consolidation-off`) at the last read.
    pub off: bool,
    /// The allocator's consolidation counters at the end (`None`: unreadable or off).
    pub consolidation: Option<ConsolidationCounters>,
}

impl MigrationSummary {
    /// The summary's lines.
    pub(crate) fn render_into(&self, out: &mut String) -> std::fmt::Result {
        use std::fmt::Write as _;
        writeln!(
            out,
            "migrations confirmed {} after {:.0} s each (gone before their turn {}, errors {}) on {}",
            self.confirmed, self.migration_s, self.gone, self.errors, self.allocator
        )?;
        match &self.consolidation {
            Some(c) => writeln!(
                out,
                "consolidation {} rounds, {} hosts started, {} emptied, {} given back; migrations {} started, \
                 {} completed, {} avoided, {} cancelled, {} wasted; {:.0} GiB moved",
                c.rounds,
                c.hosts_started,
                c.hosts_emptied,
                c.hosts_abandoned,
                c.migrations_started,
                c.migrations_completed,
                c.avoided,
                c.cancelled,
                c.wasted,
                c.moved_gib
            ),
            None if self.off => writeln!(out, "consolidation off on the allocator"),
            None => writeln!(out, "consolidation unknown (the last read failed)"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use domain::HostId;
    use placement::consolidation::{Consolidation, ConsolidationConfig};
    use placement::defrag::Migration;

    #[test]
    fn a_migration_is_due_once_it_has_run_its_time() {
        let mut consolidation = Consolidation::new(ConsolidationConfig::default(), 0.0);
        for (vm, started) in [("a", 100.0), ("b", 900.0)] {
            consolidation.in_flight.push(Migration {
                vm_id: VmId::from(vm),
                source: HostId::from("h1"),
                target: HostId::from("h2"),
                started_at_s: started,
            });
        }
        let report = consolidation.report(10);
        assert!(due(&report, 1200.0, 1299.0).is_empty());
        assert_eq!(due(&report, 1200.0, 1300.0), vec![(VmId::from("a"), 1300.0)]);
        assert_eq!(due(&report, 1200.0, 5000.0).len(), 2);
    }

    #[test]
    fn the_summary_says_what_was_confirmed_and_what_consolidation_did() {
        let mut summary =
            MigrationSummary { allocator: "http://a".into(), migration_s: 1200.0, confirmed: 7, ..Default::default() };
        let mut out = String::new();
        summary.render_into(&mut out).unwrap();
        assert!(out.contains("migrations confirmed 7 after 1200 s"), "{out}");
        assert!(out.contains("unknown"), "{out}");
        summary.consolidation =
            Some(ConsolidationCounters { hosts_emptied: 2, migrations_completed: 7, ..Default::default() });
        let mut out = String::new();
        summary.render_into(&mut out).unwrap();
        assert!(out.contains("2 emptied") && out.contains("7 completed"), "{out}");
    }
}
