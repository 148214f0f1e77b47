//! Following another allocator of the same zone: applying the changes it committed to a shared
//! store, as they were made, without acting on them.
//!
//! A followed change goes straight into the inventory and the derived structures (the hosts'
//! lifetimes and repredictions, the index) and nowhere else: no policy hook runs (the other
//! allocator's policy state for the host arrives as its own change), no drain moves on, and
//! nothing enters this allocator's journal, because it is written already.

use super::Allocator;
use crate::journal::LoggedChange;
use crate::state::StateError;
use domain::HostId;

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
        }
        Ok(())
    }
}
