//! LARS drains on the allocator (paper 000 s4.4): hosts become unavailable and their VMs migrate
//! away a few at a time; the drain's record and its migrations go to the journal.

use super::Allocator;
use crate::defrag::{Drain, DrainHosts, DrainReport, DrainRequest, Migration, MigrationOrder};
use crate::journal::Change;
use crate::state::{HostIndex, PlacedVm, StateError};
use domain::{HostId, HostState, ResourceKind, VmId, VmRequest};

/// Why a drain or migration operation was refused; nothing changed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum DrainError {
    #[error("a drain is in progress; wait for it to finish (GET /v1/drains)")]
    Busy,
    #[error("no drain is in progress")]
    NoDrain,
    #[error("host `{0}` is not in the inventory")]
    UnknownHost(HostId),
    #[error("no host to drain: name hosts, or pick at least one non-empty available host")]
    NoHosts,
    #[error("VM `{0}` is not migrating")]
    NotMigrating(VmId),
}

impl Allocator {
    /// Starts draining hosts (LARS, paper 000 s4.4): they become unavailable and their VMs migrate
    /// away, `max_in_flight` at a time, longest predicted remaining lifetime first (or in arrival
    /// order). Returns where the drain stands: the first migrations are in flight.
    pub fn start_drain(&mut self, request: &DrainRequest, now_s: f64) -> Result<DrainReport, DrainError> {
        self.advance_clock(now_s);
        if self.drain.as_ref().is_some_and(|d| !self.drain_done(d)) {
            return Err(DrainError::Busy);
        }
        let mut hosts: Vec<HostIndex> = match &request.hosts {
            DrainHosts::Listed(ids) => ids
                .iter()
                .map(|id| self.state.host_index(id).ok_or_else(|| DrainError::UnknownHost(id.clone())))
                .collect::<Result<_, _>>()?,
            DrainHosts::Pick(count) => self.drain_candidates(*count),
        };
        hosts.sort_unstable();
        hosts.dedup();
        if hosts.is_empty() {
            return Err(DrainError::NoHosts);
        }
        let mut queue: Vec<(f64, VmId)> = Vec::new();
        for &host in &hosts {
            let previous = self.state.hosts()[host.get()].state;
            if let Err(error) = self.state.set_host_state(host, HostState::Unavailable) {
                unreachable!("an indexed host exists: {error}");
            }
            self.host_changed(host);
            let id = self.state.hosts()[host.get()].id.clone();
            self.journal.push(Change::HostState { host: id, state: HostState::Unavailable, previous });
            for record in self.state.hosts()[host.get()].vms.clone() {
                let id = &record.id;
                if self.state.migration_target(id).is_some() {
                    continue;
                }
                let Some(vm) = self.state.vm(id).cloned() else { continue };
                let key = match request.order {
                    MigrationOrder::Arrival => vm.placed_at_s,
                    MigrationOrder::LongestRemainingFirst => -self.remaining_s(id, &vm),
                };
                queue.push((key, id.clone()));
            }
        }
        // Stable: VMs of equal key keep host and placement order.
        queue.sort_by(|a, b| a.0.total_cmp(&b.0));
        let ids = hosts.iter().map(|h| self.state.hosts()[h.get()].id.clone()).collect();
        self.drain =
            Some(Drain::new(ids, request.order, request.max_in_flight, queue.into_iter().map(|(_, id)| id).collect()));
        self.drain_changed = true;
        self.pump_drain();
        self.drain_report().ok_or(DrainError::NoDrain)
    }

    /// The migration of `vm` (a drain's or consolidation's) finished: it leaves its source for the
    /// host reserved for it, and the next VM starts migrating.
    pub fn complete_migration(&mut self, vm: &VmId, now_s: f64) -> Result<Migration, DrainError> {
        self.advance_clock(now_s);
        let migration = self.take_migration(vm, Drain::completed, Self::consolidation_completed)?;
        self.finish_move(vm, &migration.target);
        self.pump_drain();
        self.pump_consolidation();
        Ok(migration)
    }

    /// A migration the cloud reported failed (or cancelled before it moved the VM): the
    /// reservation on its target is given back and the VM stays where it is. A consolidation's
    /// host being emptied goes back to service (its emptying abandoned, counted as failed); a
    /// drain's VM waits for its turn again.
    pub fn fail_migration(&mut self, vm: &VmId, now_s: f64) -> Result<Migration, DrainError> {
        self.advance_clock(now_s);
        let migration = self.take_migration(vm, Drain::failed, Self::consolidation_failed)?;
        let target = match self.state.cancel_migration(vm) {
            Ok(target) => target,
            Err(error) => unreachable!("a migration in flight has its reservation: {error}"),
        };
        self.journal.push(Change::MigrationCancelled { vm: vm.clone() });
        self.refresh_lifetime(target);
        self.host_changed(target);
        self.pump_drain();
        self.pump_consolidation();
        Ok(migration)
    }

    /// The migration of `vm` in flight, taken out of the drain's record (`from_drain`) or else
    /// consolidation's (`from_consolidation`), each counting it as its caller says.
    fn take_migration(
        &mut self,
        vm: &VmId,
        from_drain: fn(&mut Drain, &VmId) -> Option<Migration>,
        from_consolidation: fn(&mut Self, &VmId) -> Option<Migration>,
    ) -> Result<Migration, DrainError> {
        if let Some(migration) = self.drain.as_mut().and_then(|d| from_drain(d, vm)) {
            self.drain_changed = true;
            Ok(migration)
        } else if let Some(migration) = from_consolidation(self, vm) {
            Ok(migration)
        } else if self.drain.is_none() && self.consolidation.is_none() {
            Err(DrainError::NoDrain)
        } else {
            Err(DrainError::NotMigrating(vm.clone()))
        }
    }

    /// Where the current (or last) drain stands.
    pub fn drain_report(&self) -> Option<DrainReport> {
        self.drain.as_ref().map(|drain| drain.report(self.drain_hosts_empty(drain)))
    }

    /// The drain as the store records it.
    pub fn drain(&self) -> Option<&Drain> {
        self.drain.as_ref()
    }

    /// Puts back a migration recorded by the store (after the VMs were restored).
    pub fn restore_migration(&mut self, vm: &VmId, target: &HostId) -> Result<(), StateError> {
        let index = self.state.host_index(target).ok_or_else(|| StateError::UnknownHostId(target.clone()))?;
        self.state.reserve(vm, index, false)?;
        self.host_changed(index);
        Ok(())
    }

    /// Puts back the drain recorded by the store (after its migrations were restored).
    pub fn restore_drain(&mut self, drain: Drain) {
        self.drain = Some(drain);
    }

    fn drain_hosts_empty(&self, drain: &Drain) -> bool {
        drain.hosts.iter().filter_map(|id| self.state.host_index(id)).all(|h| self.state.hosts()[h.get()].is_empty())
    }

    fn drain_done(&self, drain: &Drain) -> bool {
        drain.queue.is_empty() && drain.in_flight.is_empty()
    }

    /// The `count` available non-empty hosts cheapest to empty: fewest VMs, then most free
    /// (weighted as best fit weighs them), then lowest index.
    fn drain_candidates(&self, count: usize) -> Vec<HostIndex> {
        let mut hosts: Vec<(usize, u64, HostIndex)> = self
            .state
            .hosts()
            .iter()
            .enumerate()
            .filter(|(_, h)| h.state == HostState::Available && !h.vms.is_empty() && h.incoming.is_empty())
            .map(|(i, h)| (h.vms.len(), u64::MAX - h.free().base(ResourceKind::Cores), HostIndex(i as u32)))
            .collect();
        hosts.sort_unstable();
        hosts.into_iter().take(count).map(|(_, _, h)| h).collect()
    }

    /// A VM's predicted remaining lifetime now (repredicted when a model is loaded).
    fn remaining_s(&mut self, id: &VmId, vm: &PlacedVm) -> f64 {
        let initial = self.policy.classes().vm_lifetime(vm.prediction.as_ref()).lifetime_s;
        self.repredictions.remaining_s(vm.host.get(), id, initial, self.clock_s - vm.placed_at_s)
    }

    /// Starts migrations while the drain has room and VMs to move. A VM no host can take goes to the
    /// back of the queue and waits for the next event.
    pub(super) fn pump_drain(&mut self) {
        let mut tries = self.drain.as_ref().map_or(0, |d| d.queue.len());
        while tries > 0 && self.drain.as_ref().is_some_and(|d| d.has_room() && !d.queue.is_empty()) {
            tries -= 1;
            let Some(id) = self.drain.as_mut().and_then(|d| d.queue.pop_front()) else { break };
            self.drain_changed = true;
            let Some(vm) = self.state.vm(&id).cloned() else { continue };
            if self.state.hosts()[vm.host.get()].state == HostState::Available {
                // An operator restored the VM's host during the drain: it stays.
                continue;
            }
            let request = self.migration_request(&id, &vm);
            let Some(target) = self.select(&request, None).host else {
                if let Some(drain) = &mut self.drain {
                    drain.no_target += 1;
                    drain.queue.push_back(id);
                }
                continue;
            };
            if let Err(error) = self.state.reserve(&id, target, true) {
                unreachable!("the selected host takes the migrating VM: {error}");
            }
            self.host_changed(target);
            let target_id = self.state.hosts()[target.get()].id.clone();
            let migration = Migration {
                vm_id: id.clone(),
                source: self.state.hosts()[vm.host.get()].id.clone(),
                target: target_id.clone(),
                started_at_s: self.clock_s,
            };
            if let Some(drain) = &mut self.drain {
                drain.in_flight.push(migration);
            }
            self.journal.push(Change::MigrationStarted { vm: id, target: target_id });
        }
    }

    /// The VM as the placement policy sees it when it migrates: its whole request as placed
    /// (priority, OS, features included), with its repredicted remaining lifetime as the prediction
    /// (paper 002 H: "with the current VM state").
    pub(super) fn migration_request(&mut self, id: &VmId, vm: &PlacedVm) -> VmRequest {
        let mut request = vm.record.vm_request();
        request.prediction = vm.prediction.clone().map(|mut prediction| {
            if !prediction.source.is_fallback() {
                prediction.expected_lifetime_s = Some(self.remaining_s(id, vm));
                prediction.interval_class = None;
            }
            prediction
        });
        request
    }
}
