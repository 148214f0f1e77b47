//! LARS: lifetime-aware defragmentation and maintenance (paper 000 s4.4, paper 002 H).
//!
//! A drain takes a few hosts out of scheduling (unavailable) and live-migrates their VMs away, at
//! most `max_in_flight` at a time, until the hosts are empty; they then stay unavailable until an
//! operator restores them. LARS migrates the VM with the longest predicted remaining lifetime first,
//! so that short-lived VMs exit on their own while the long ones move: every VM that exits before
//! its turn saves a migration. The baseline migrates in arrival order.
//!
//! A migration occupies both hosts for its duration: it reserves the VM's demand on the target
//! (chosen by the placement policy itself, with the VM's repredicted remaining lifetime) and frees
//! the source only when it completes. In simulation it completes 20 minutes later; in the service,
//! when the caller confirms it. This module holds the drain's bookkeeping; [`crate::Allocator`]
//! applies it to the inventory.

use domain::{HostId, Validate, ValidationError, ValidationLimits, VmId};
use serde::{Deserialize, Serialize};
use std::collections::VecDeque;

/// In which order a drain migrates the VMs of its hosts.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "kebab-case")]
pub enum MigrationOrder {
    /// LARS: longest predicted remaining lifetime first.
    #[default]
    LongestRemainingFirst,
    /// The baseline: the order the VMs arrived in.
    Arrival,
}

/// Which hosts to drain.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum DrainHosts {
    /// These hosts.
    #[cfg_attr(feature = "openapi", schema(value_type = Vec<String>))]
    Listed(Vec<HostId>),
    /// The `n` available non-empty hosts cheapest to empty: fewest VMs, then most free resources.
    Pick(#[serde(deserialize_with = "domain::whole_number::deserialize")] usize),
}

/// A request to drain hosts.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct DrainRequest {
    pub hosts: DrainHosts,
    #[serde(default)]
    pub order: MigrationOrder,
    /// Most migrations in flight at once (default 3).
    #[serde(default = "default_in_flight", deserialize_with = "domain::whole_number::deserialize")]
    pub max_in_flight: usize,
}

fn default_in_flight() -> usize {
    3
}

/// Most migrations in flight one drain may ask for.
pub const MAX_IN_FLIGHT: usize = 100;

impl Validate for DrainRequest {
    fn validate(&self, limits: &ValidationLimits, _path: &str) -> Result<(), ValidationError> {
        match &self.hosts {
            DrainHosts::Listed(hosts) if hosts.is_empty() || hosts.len() > 1000 => {
                return Err(ValidationError::invalid("hosts.listed", "must name 1 to 1000 hosts"));
            }
            DrainHosts::Listed(hosts) => {
                if let Some(at) =
                    hosts.iter().position(|h| h.as_str().is_empty() || h.as_str().len() > limits.max_text_len)
                {
                    return Err(ValidationError::invalid(
                        format!("hosts.listed[{at}]"),
                        format!("must be a host id of 1 to {} bytes", limits.max_text_len),
                    ));
                }
            }
            DrainHosts::Pick(0) => return Err(ValidationError::invalid("hosts.pick", "must be at least 1")),
            DrainHosts::Pick(_) => {}
        }
        if self.max_in_flight == 0 || self.max_in_flight > MAX_IN_FLIGHT {
            return Err(ValidationError::invalid("max_in_flight", format!("must be between 1 and {MAX_IN_FLIGHT}")));
        }
        Ok(())
    }
}

/// One migration in flight.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Migration {
    #[cfg_attr(feature = "openapi", schema(value_type = String))]
    pub vm_id: VmId,
    #[cfg_attr(feature = "openapi", schema(value_type = String))]
    pub source: HostId,
    #[cfg_attr(feature = "openapi", schema(value_type = String))]
    pub target: HostId,
    pub started_at_s: f64,
}

/// Where a drain stands.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct DrainReport {
    #[cfg_attr(feature = "openapi", schema(value_type = Vec<String>))]
    pub hosts: Vec<HostId>,
    pub order: MigrationOrder,
    pub max_in_flight: usize,
    /// Migrations completed.
    pub performed: u64,
    /// VMs that exited before their turn: migrations saved.
    pub avoided: u64,
    /// VMs that exited while migrating (the migration was abandoned).
    pub cancelled: u64,
    /// VMs no host could take when their turn came; they stay on their host and are tried again
    /// when the next migration completes.
    pub no_target: u64,
    /// Migrations the cloud reported failed (the VM stayed; it waits for its turn again).
    #[serde(default)]
    pub failed: u64,
    pub in_flight: Vec<Migration>,
    /// VMs waiting for their turn, next first.
    #[cfg_attr(feature = "openapi", schema(value_type = Vec<String>))]
    pub queued: Vec<VmId>,
    /// Every drained host is empty and nothing is in flight.
    pub done: bool,
}

/// A drain in progress: its hosts, the VMs still to move and its counters (persisted as JSON).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Drain {
    pub hosts: Vec<HostId>,
    pub order: MigrationOrder,
    pub max_in_flight: usize,
    /// VMs still to migrate, next first.
    pub queue: VecDeque<VmId>,
    pub in_flight: Vec<Migration>,
    pub performed: u64,
    pub avoided: u64,
    pub cancelled: u64,
    pub no_target: u64,
    #[serde(default)]
    pub failed: u64,
}

impl Drain {
    pub fn new(hosts: Vec<HostId>, order: MigrationOrder, max_in_flight: usize, queue: Vec<VmId>) -> Self {
        Drain {
            hosts,
            order,
            max_in_flight: max_in_flight.max(1),
            queue: queue.into(),
            in_flight: Vec::new(),
            performed: 0,
            avoided: 0,
            cancelled: 0,
            no_target: 0,
            failed: 0,
        }
    }

    /// A VM of the drained hosts exited: a saved migration if it was waiting, an abandoned one if
    /// it was moving. Returns whether the drain knew it.
    pub fn vm_exited(&mut self, vm: &VmId) -> bool {
        if let Some(at) = self.queue.iter().position(|v| v == vm) {
            self.queue.remove(at);
            self.avoided += 1;
            return true;
        }
        if let Some(at) = self.in_flight.iter().position(|m| &m.vm_id == vm) {
            self.in_flight.remove(at);
            self.cancelled += 1;
            return true;
        }
        false
    }

    /// The migration of `vm` failed: the VM stayed on its host and goes to the back of the queue
    /// (tried again at its turn). Returns the migration.
    pub fn failed(&mut self, vm: &VmId) -> Option<Migration> {
        let at = self.in_flight.iter().position(|m| &m.vm_id == vm)?;
        self.failed += 1;
        self.queue.push_back(vm.clone());
        Some(self.in_flight.remove(at))
    }

    /// The migration of `vm` completed; returns it.
    pub fn completed(&mut self, vm: &VmId) -> Option<Migration> {
        let at = self.in_flight.iter().position(|m| &m.vm_id == vm)?;
        self.performed += 1;
        Some(self.in_flight.remove(at))
    }

    pub fn has_room(&self) -> bool {
        self.in_flight.len() < self.max_in_flight
    }

    pub fn report(&self, hosts_empty: bool) -> DrainReport {
        DrainReport {
            hosts: self.hosts.clone(),
            order: self.order,
            max_in_flight: self.max_in_flight,
            performed: self.performed,
            avoided: self.avoided,
            cancelled: self.cancelled,
            no_target: self.no_target,
            failed: self.failed,
            in_flight: self.in_flight.clone(),
            queued: self.queue.iter().cloned().collect(),
            done: hosts_empty && self.in_flight.is_empty(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exits_count_as_avoided_or_cancelled() {
        let ids: Vec<VmId> = ["a", "b", "c"].into_iter().map(VmId::from).collect();
        let mut drain = Drain::new(vec![HostId::from("h")], MigrationOrder::Arrival, 0, ids.clone());
        assert_eq!(drain.max_in_flight, 1, "at least one migration at a time");
        let first = drain.queue.pop_front().unwrap();
        drain.in_flight.push(Migration {
            vm_id: first.clone(),
            source: HostId::from("h"),
            target: HostId::from("g"),
            started_at_s: 0.0,
        });
        assert!(!drain.has_room());
        assert!(drain.vm_exited(&ids[2]));
        assert!(drain.vm_exited(&ids[0]));
        assert!(!drain.vm_exited(&VmId::from("elsewhere")));
        let report = drain.report(false);
        assert_eq!((report.avoided, report.cancelled, report.queued.len()), (1, 1, 1));
        assert!(drain.completed(&ids[1]).is_none(), "b never started");
    }

    #[test]
    fn requests_default_to_lars_with_three_in_flight() {
        let request: DrainRequest = serde_json::from_str(r#"{"hosts": {"pick": 2}}"#).unwrap();
        assert_eq!(request.order, MigrationOrder::LongestRemainingFirst);
        assert_eq!(request.max_in_flight, 3);
        let listed: DrainRequest =
            serde_json::from_str(r#"{"hosts": {"listed": ["h1"]}, "order": "arrival", "max_in_flight": 1}"#).unwrap();
        assert_eq!(listed.hosts, DrainHosts::Listed(vec![HostId::from("h1")]));
        assert!(serde_json::from_str::<DrainRequest>(r#"{"hosts": {"pick": 1}, "speed": 2}"#).is_err());
    }
}
