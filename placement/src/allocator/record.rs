//! Recording where a cloud really put a VM: its own scheduler (OpenStack Nova, say) decided, or
//! retried elsewhere, or moved it, and reports the outcome after the fact. The record follows the
//! cloud: a VM not placed is placed there, one placed elsewhere moves there (a migration started
//! and completed at once, so that no exit is recorded), one already there stays, or takes its new
//! demand when the cloud resized it (no exit either). Whatever the host's state: the cloud has put
//! it there. Its capacity is still checked, so that nothing is ever over-committed.

use super::Allocator;
use crate::host_state::Moved;
use crate::journal::Change;
use crate::state::{HostIndex, NewVm, StateError};
use domain::{HostId, VmId, VmRequest};
use std::sync::Arc;

/// What recording a VM on a host changed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Recorded {
    /// It was there already.
    Unchanged,
    /// It was not placed; now it is.
    Placed,
    /// It was on another host (`from`); now it is on this one (with its new demand when the cloud
    /// resized it on the way: a cold resize).
    Moved { from: HostId },
    /// It was there with another demand or type (the cloud resized it); now it has this one.
    Resized,
}

impl Allocator {
    /// Records that `vm` is on `host` (see the module's doc); changes nothing on error (an unknown
    /// host, a VM that does not fit there). A demand or type other than the placed VM's is a
    /// resize, except while a drain or consolidation moves the VM (its demand is booked on two
    /// hosts): then the VM keeps its demand.
    pub fn record_at(&mut self, vm: &VmRequest, host: &HostId, now_s: f64) -> Result<Recorded, StateError> {
        self.advance_clock(now_s);
        let target = self.state.host_index(host).ok_or_else(|| StateError::UnknownHostId(host.clone()))?;
        let Some(placed) = self.state.vm(&vm.vm_id) else {
            self.state.check_fits(target, &vm.vm_id, &vm.facts.demand)?;
            self.place_on(vm, target, true);
            return Ok(Recorded::Placed);
        };
        let source = placed.host;
        let resized = placed.record.facts.demand != vm.facts.demand || placed.record.facts.vm_type != vm.facts.vm_type;
        if source == target && resized && self.state.migration_target(&vm.vm_id).is_none() {
            self.resize(vm, target)?;
            return Ok(Recorded::Resized);
        }
        if source == target {
            return Ok(Recorded::Unchanged);
        }
        // Moved and resized (a cold resize lands elsewhere): checked whole before anything moves.
        if resized {
            self.state.check_fits(target, &vm.vm_id, &vm.facts.demand)?;
        }
        let moved = self.move_to(vm, source, target, host)?;
        if resized {
            self.resize(vm, target)?;
        }
        Ok(moved)
    }

    /// Moves `vm` from `source` to `target` (`host`): a drain's or consolidation's planned move
    /// completes as planned, one planned elsewhere is abandoned.
    fn move_to(
        &mut self,
        vm: &VmRequest,
        source: HostIndex,
        target: HostIndex,
        host: &HostId,
    ) -> Result<Recorded, StateError> {
        let from = self.state.hosts()[source.get()].id.clone();
        match self.state.migration_target(&vm.vm_id) {
            // The move a drain or consolidation planned: completed as planned.
            Some(planned) if planned == target => {
                if self.complete_migration(&vm.vm_id, self.clock_s).is_err() {
                    self.finish_move(&vm.vm_id, host);
                }
                return Ok(Recorded::Moved { from });
            }
            // The cloud moved it elsewhere: the planned move is abandoned.
            Some(_) => {
                let demand = self.state.vm(&vm.vm_id).map(|placed| placed.record.facts.demand).unwrap_or_default();
                self.state.check_fits(target, &vm.vm_id, &demand)?;
                let planned = self.state.cancel_migration(&vm.vm_id)?;
                self.journal.push(Change::MigrationCancelled { vm: vm.vm_id.clone() });
                self.consolidation_vm_left(&vm.vm_id);
                self.drain_changed |= self.drain.as_mut().is_some_and(|drain| drain.vm_exited(&vm.vm_id));
                self.refresh_lifetime(planned);
                self.host_changed(planned);
            }
            None => {}
        }
        self.state.reserve(&vm.vm_id, target, false)?;
        self.journal.push(Change::MigrationStarted { vm: vm.vm_id.clone(), target: host.clone() });
        self.finish_move(&vm.vm_id, host);
        Ok(Recorded::Moved { from })
    }

    /// Gives `vm`, placed on `host`, the demand and type of its request where it is, keeping its
    /// placement time and prediction; refused, changing nothing, when the host has no room for
    /// the new demand.
    fn resize(&mut self, vm: &VmRequest, host: HostIndex) -> Result<(), StateError> {
        let was = self.state.release(&vm.vm_id)?;
        let mut record = NewVm::clone(&was.record);
        (record.facts.demand, record.facts.vm_type) = (vm.facts.demand, vm.facts.vm_type.clone());
        if let Err(error) = self.state.check_fits(host, &vm.vm_id, &record.facts.demand) {
            if let Err(back) = self.state.restore(Arc::clone(&was.record), host) {
                unreachable!("a VM released a moment ago fits back: {back}");
            }
            return Err(error);
        }
        let record = Arc::new(record);
        if let Err(error) = self.state.restore(Arc::clone(&record), host) {
            unreachable!("a host checked a moment ago refused its VM: {error}");
        }
        let lifetime_s = self.policy.classes().vm_lifetime(record.prediction.as_ref()).lifetime_s;
        self.repredictions.remove(host.get(), &vm.vm_id);
        self.repredictions.add(host.get(), &record, lifetime_s);
        let host_id = self.state.hosts()[host.get()].id.clone();
        self.journal.push(Change::Resized { vm: record, host: host_id, was });
        self.refresh_lifetime(host);
        self.host_changed(host);
        Ok(())
    }

    /// Completes the state's migration of `vm` to `target` (reserved there): the VM leaves its
    /// source, its prediction and the policy's host states follow it, and the journal records it.
    pub(super) fn finish_move(&mut self, vm: &VmId, target_id: &HostId) {
        let source = match self.state.complete_migration(vm) {
            Ok(source) => source,
            Err(error) => unreachable!("a migration in the state completes: {error}"),
        };
        let target: HostIndex = self.state.vm(vm).map_or(source, |v| v.host);
        self.repredictions.move_vm(vm, source.get(), target.get());
        if let Some(state) = &mut self.host_state {
            let class = self.state.vm(vm).map_or(0, |v| self.policy.classes().vm_lifetime(v.prediction.as_ref()).class);
            let hosts = self.state.hosts();
            let (from, to) = (
                Moved { host: source, record: &hosts[source.get()] },
                Moved { host: target, record: &hosts[target.get()] },
            );
            state.on_migrate(vm, class, from, to, self.clock_s);
            self.state_changed.extend([source, target]);
        }
        for host in [source, target] {
            self.refresh_lifetime(host);
            self.host_changed(host);
        }
        self.journal.push(Change::MigrationCompleted { vm: vm.clone(), target: target_id.clone() });
    }
}
