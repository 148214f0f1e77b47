//! Following another allocator of the same zone: applying the changes it committed to a shared
//! store, as they were made, without acting on them.
//!
//! A followed change goes straight into the inventory and the derived structures (the hosts'
//! lifetimes and repredictions, the index) and nowhere else: no policy hook runs (the other
//! allocator's policy state for the host arrives as its own change), no drain moves on, and
//! nothing enters this allocator's journal, because it is written already.
//!
//! The other direction lives here too: [`Allocator::undo`] takes back this allocator's own changes
//! that the shared store refused, so that it can follow what the store holds and decide again
//! without rebuilding its whole state.

use super::Allocator;
use crate::journal::{Change, LoggedChange};
use crate::state::StateError;
use domain::HostId;

/// Why changes could not be taken back in memory: rebuild the allocator from the store instead.
#[derive(Debug, thiserror::Error)]
pub enum UndoError {
    #[error("a drain or a migration cannot be taken back in memory")]
    NotReversible,
    #[error(transparent)]
    State(#[from] StateError),
}

impl Allocator {
    /// Applies one change that another allocator committed. An error means this allocator's view
    /// contradicts the change (it missed something): rebuild it from the store.
    pub fn follow(&mut self, change: &LoggedChange) -> Result<(), StateError> {
        let host_index = |allocator: &Allocator, host: &HostId| {
            allocator.state.host_index(host).ok_or_else(|| StateError::UnknownHostId(host.clone()))
        };
        match change {
            LoggedChange::Placed { vm, host } => self.restore(vm.clone(), host, self.clock_s)?,
            LoggedChange::Released { vm } => {
                let migrating_to = self.state.migration_target(vm);
                let placed = self.state.release(vm)?;
                self.repredictions.remove(placed.host.get(), vm);
                for host in std::iter::once(placed.host).chain(migrating_to) {
                    self.refresh_lifetime(host);
                    self.host_changed(host);
                }
            }
            LoggedChange::Resized { vm, host } => {
                let placed = self.state.release(&vm.id)?;
                self.repredictions.remove(placed.host.get(), &vm.id);
                self.refresh_lifetime(placed.host);
                self.host_changed(placed.host);
                self.restore(vm.clone(), host, self.clock_s)?;
            }
            LoggedChange::HostState { host, state } => {
                let index = host_index(self, host)?;
                self.state.set_host_state(index, *state)?;
                self.host_changed(index);
            }
            LoggedChange::MigrationStarted { vm, target } => self.restore_migration(vm, target)?,
            LoggedChange::MigrationCompleted { vm, target } => {
                let target = host_index(self, target)?;
                if self.state.migration_target(vm) != Some(target) {
                    return Err(StateError::NotMigrating(vm.clone()));
                }
                let source = self.state.complete_migration(vm)?;
                self.repredictions.move_vm(vm, source.get(), target.get());
                for host in [source, target] {
                    self.refresh_lifetime(host);
                    self.host_changed(host);
                }
            }
            LoggedChange::MigrationCancelled { vm } => {
                // A release cancels its migration itself; a separate cancellation finds none left.
                if self.state.migration_target(vm).is_some() {
                    let target = self.state.cancel_migration(vm)?;
                    self.refresh_lifetime(target);
                    self.host_changed(target);
                }
            }
            LoggedChange::Drain { drain } => self.drain = drain.clone(),
            LoggedChange::Consolidation { consolidation } => self.consolidation = consolidation.as_deref().cloned(),
            LoggedChange::PolicyHostState { host, policy, state } => {
                let index = host_index(self, host)?;
                if let Some(policy_state) = self.host_state.as_mut().filter(|s| s.name() == policy) {
                    policy_state
                        .restore(index, state.as_deref())
                        .map_err(|e| StateError::HostPolicyState(e.to_string()))?;
                    self.refresh_lifetime(index);
                    self.host_changed(index);
                }
            }
            // The inventory this allocator was built on no longer holds.
            LoggedChange::HostInventory { host, .. } => return Err(StateError::InventoryChanged(host.clone())),
        }
        Ok(())
    }

    /// Applies one batch that another allocator committed. The store judges a batch by its net
    /// effect on each host, so the batch's own order can pass through a state the store never held:
    /// a placement before a release on a host that another agent's batch, committed first, filled
    /// meanwhile. So the releases of VMs placed before the batch go first (that only frees room);
    /// the rest follows in order. The end state is the batch's.
    pub fn follow_batch(&mut self, batch: &[LoggedChange]) -> Result<(), StateError> {
        let mut released = std::collections::HashSet::new();
        let early: Vec<bool> = batch
            .iter()
            .map(|change| match change {
                LoggedChange::Released { vm } => self.state.vm(vm).is_some() && released.insert(vm),
                _ => false,
            })
            .collect();
        for pass in [true, false] {
            for (change, _) in batch.iter().zip(&early).filter(|(_, early)| **early == pass) {
                self.follow(change)?;
            }
        }
        Ok(())
    }

    /// Takes back, newest first, changes this allocator made (and took from its journal) that a
    /// shared store refused to commit: placements are released, releases put back, host states set
    /// back. Policy states are not in the journal (a change names the host only), so the hosts
    /// whose policy state changed are returned: their state must be read back from the store (and
    /// followed as [`LoggedChange::PolicyHostState`]). A batch with a drain or a migration in it is
    /// left untouched ([`UndoError::NotReversible`]); any error means: rebuild from the store.
    ///
    /// What the changes did to the hosts' lifetimes and the index is derived, and follows.
    pub fn undo(&mut self, changes: &[Change]) -> Result<Vec<HostId>, UndoError> {
        let reversible = changes.iter().all(|change| {
            matches!(
                change,
                Change::Placed { .. }
                    | Change::Released { .. }
                    | Change::Resized { .. }
                    | Change::HostState { .. }
                    | Change::PolicyHostState { .. }
            )
        });
        if !reversible {
            return Err(UndoError::NotReversible);
        }
        let mut policy_hosts = Vec::new();
        for change in changes.iter().rev() {
            match change {
                Change::Placed { vm, .. } => self.follow(&LoggedChange::Released { vm: vm.id.clone() })?,
                Change::Released { was, .. } => {
                    let host = self.state.hosts()[was.host.get()].id.clone();
                    self.follow(&LoggedChange::Placed { vm: crate::state::NewVm::clone(&was.record), host })?
                }
                Change::HostState { host, previous, .. } => {
                    self.follow(&LoggedChange::HostState { host: host.clone(), state: *previous })?
                }
                Change::Resized { host, was, .. } => {
                    let vm = crate::state::NewVm::clone(&was.record);
                    self.follow(&LoggedChange::Resized { vm, host: host.clone() })?
                }
                Change::PolicyHostState { host, .. } => policy_hosts.push(host.clone()),
                Change::MigrationStarted { .. }
                | Change::MigrationCompleted { .. }
                | Change::MigrationCancelled { .. }
                | Change::Drain(_)
                | Change::Consolidation(_)
                | Change::HostInventory { .. } => return Err(UndoError::NotReversible),
            }
        }
        // Nothing taken back is a change of this allocator's to write.
        self.journal.clear();
        self.state_changed.clear();
        policy_hosts.sort_unstable();
        policy_hosts.dedup();
        Ok(policy_hosts)
    }
}
