//! The inventory while the allocator runs: hosts added, resized, moved or removed (a cloud's
//! compute hosts come and go). Capacity and state changes apply at once; the change itself is
//! journaled ([`Change::HostInventory`]) and the allocator is rebuilt on the new inventory once
//! it is durable (the dense per-host structures are sized at construction). Until then a new host
//! receives nothing and a removed one is failed, so the rest of a batch sees a consistent state.

use super::Allocator;
use crate::journal::Change;
use crate::state::StateError;
use domain::{ClusterId, HostEntry, HostId, HostState, HostUpdate, HostUpdated, RackId};

/// The cluster (and rack, and hardware) of a host added with none named.
pub const DEFAULT_CLUSTER: &str = "cloud";

impl Allocator {
    /// Adds `host`, or changes its capacity, state or place (see the module's doc). An update that
    /// changes nothing journals nothing. Refused, changing nothing: a capacity below what the host
    /// uses.
    pub fn update_host(&mut self, host: &HostId, update: &HostUpdate) -> Result<HostUpdated, StateError> {
        let Some(index) = self.state.host_index(host) else {
            let cluster_id = update.cluster_id.clone().unwrap_or_else(|| ClusterId(DEFAULT_CLUSTER.to_owned()));
            let entry = HostEntry {
                rack_id: update.rack_id.clone().unwrap_or_else(|| RackId(cluster_id.as_str().to_owned())),
                cluster_id,
                hardware: update.hardware.clone().unwrap_or_else(|| "default".to_owned()),
                capacity: update.capacity,
            };
            let state = update.state.unwrap_or_default();
            self.journal.push(Change::HostInventory { host: host.clone(), entry: Some(entry.clone()) });
            if state != HostState::Available {
                let previous = HostState::Available;
                self.journal.push(Change::HostState { host: host.clone(), state, previous });
            }
            return Ok(HostUpdated { host_id: host.clone(), added: true, entry, state });
        };
        let record = &self.state.hosts()[index.get()];
        let entry = HostEntry {
            cluster_id: update.cluster_id.clone().unwrap_or_else(|| record.cluster.clone()),
            rack_id: update.rack_id.clone().unwrap_or_else(|| record.rack.clone()),
            // A host's hardware is its cluster's: a new cluster takes the one named.
            hardware: update.hardware.clone().unwrap_or_else(|| record.hardware.clone()),
            capacity: update.capacity,
        };
        let moved = entry.cluster_id != record.cluster || entry.rack_id != record.rack;
        let changed = moved || entry.capacity != record.capacity;
        if changed {
            self.state.set_capacity(index, entry.capacity)?;
            self.journal.push(Change::HostInventory { host: host.clone(), entry: Some(entry.clone()) });
            self.refresh_lifetime(index);
            self.host_changed(index);
        }
        let state = match update.state {
            Some(state) if state != self.state.hosts()[index.get()].state => {
                self.set_host_state(host, state)?;
                state
            }
            _ => self.state.hosts()[index.get()].state,
        };
        Ok(HostUpdated { host_id: host.clone(), added: false, entry, state })
    }

    /// Removes an empty host (no VM on it or arriving); refused otherwise, changing nothing.
    pub fn remove_host(&mut self, host: &HostId) -> Result<(), StateError> {
        let index = self.state.host_index(host).ok_or_else(|| StateError::UnknownHostId(host.clone()))?;
        let record = &self.state.hosts()[index.get()];
        let vms = record.vms.len() + record.incoming.len();
        if vms > 0 {
            return Err(StateError::HostNotEmpty { host: host.clone(), vms });
        }
        // Failed until the rebuild drops it: nothing more is placed there meanwhile.
        self.state.set_host_state(index, HostState::Failed)?;
        self.host_changed(index);
        self.journal.push(Change::HostInventory { host: host.clone(), entry: None });
        Ok(())
    }
}
