//! The change journal: every state change the placement core makes, as one [`Change`] value.
//!
//! The allocator appends to its journal as it works and [`crate::Allocator::take_changes`] hands the
//! changes over after each operation: the allocator service's store writes exactly these (one
//! transaction per batch of commands), and the simulator follows the same stream (the migrations a
//! drain starts). Nothing else builds a store record.
//!
//! Three kinds of change are coalesced and come last in a take, in host order: the drain's and the
//! consolidation's records (each written whole, once, however often it moved) and each host whose policy state changed (a host
//! whose state changed and changed back is named again, which is harmless). A policy-state change
//! names the host only: its state is the allocator's as the changes are taken
//! ([`crate::Allocator::policy_host_snapshot`]), so a consumer that does not keep it (the simulator)
//! never pays for serialising it.
//!
//! Recording is cheap: a placement shares its VM record with the inventory (an `Arc`), and a
//! release hands that record over.

use crate::consolidation::Consolidation;
use crate::defrag::Drain;
use crate::state::{NewVm, PlacedVm};
use domain::{HostEntry, HostId, HostState, VmId};
use serde::{Deserialize, Serialize};
use std::sync::Arc;

/// One change to the placement state.
#[derive(Clone, Debug, PartialEq)]
pub enum Change {
    /// A VM was placed on a host.
    Placed { vm: Arc<NewVm>, host: HostId },
    /// A VM left its host (released or exited); a migration it was in is cancelled with it. `was`
    /// is where it was and its record (shared, not copied), so that the release can be taken back
    /// ([`crate::Allocator::undo`]). `ended_at_s` is when it ended on the model's clock (that of
    /// its `requested_at_s`): as the caller named it ([`crate::Allocator::release_ended`]), else
    /// [`exit_time`] of the allocator's clock, so that a trace of the VMs that left can be exported.
    Released { vm: VmId, was: PlacedVm, ended_at_s: f64 },
    /// A VM's demand (or type) changed where it is (a cloud resized it): `vm` is its new record
    /// (its placement time and prediction kept), `was` the old one, on `host`. Not an exit.
    Resized { vm: Arc<NewVm>, host: HostId, was: PlacedVm },
    /// An operator or a drain set a host's state (`previous`: the state it had).
    HostState { host: HostId, state: HostState, previous: HostState },
    /// A VM started migrating to `target` (its demand is reserved there).
    MigrationStarted { vm: VmId, target: HostId },
    /// A VM finished migrating: it is on `target` now.
    MigrationCompleted { vm: VmId, target: HostId },
    /// A migration was abandoned (the VM exited).
    MigrationCancelled { vm: VmId },
    /// The drain's record (`None`: no drain).
    Drain(Option<Box<Drain>>),
    /// The consolidation's record (`None`: off).
    Consolidation(Option<Box<Consolidation>>),
    /// A host's state under the stateful policy `policy` changed; its snapshot is
    /// [`crate::Allocator::policy_host_snapshot`] at the time of the take.
    PolicyHostState { host: HostId, policy: &'static str },
    /// A host was added or changed (`entry`), or removed (`None`), while the allocator ran. The
    /// allocator built on the old inventory is rebuilt once the change is durable
    /// ([`crate::Allocator::update_host`]).
    HostInventory { host: HostId, entry: Option<HostEntry> },
}

/// When a VM that leaves at `released_at_s` on the allocator's clock ended on the model's clock (that
/// of its `requested_at_s`), when its release named no end: its start on the model's clock plus the
/// time it was placed on the allocator's. A VM with no request time started on the allocator's
/// clock, so that is `released_at_s` itself. Never before the VM's start.
pub fn exit_time(vm: &NewVm, released_at_s: f64) -> f64 {
    match vm.facts.requested_at_s.filter(|t| t.is_finite()) {
        Some(start) => start + (released_at_s - vm.placed_at_s).max(0.0),
        None => released_at_s.max(vm.placed_at_s),
    }
}

/// A [`Change`] as another allocator of the same zone reads it from a shared store's change log:
/// self-contained (a policy-state change carries its snapshot) and serialisable.
/// [`crate::Allocator::follow`] applies it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "change", rename_all = "snake_case")]
pub enum LoggedChange {
    Placed {
        vm: NewVm,
        host: HostId,
    },
    Released {
        vm: VmId,
    },
    /// The VM's new record, where it is.
    Resized {
        vm: NewVm,
        host: HostId,
    },
    HostState {
        host: HostId,
        state: HostState,
    },
    MigrationStarted {
        vm: VmId,
        target: HostId,
    },
    MigrationCompleted {
        vm: VmId,
        target: HostId,
    },
    MigrationCancelled {
        vm: VmId,
    },
    Drain {
        drain: Option<Drain>,
    },
    Consolidation {
        consolidation: Option<Box<Consolidation>>,
    },
    /// `state`: the policy's snapshot of the host (`None`: its initial state).
    PolicyHostState {
        host: HostId,
        policy: String,
        state: Option<String>,
    },
    /// A host added or changed (`entry`), or removed (`None`): a follower rebuilds on the store's
    /// inventory.
    HostInventory {
        host: HostId,
        entry: Option<HostEntry>,
    },
}

impl LoggedChange {
    /// The change as the log keeps it; `policy_state` snapshots a host's policy state as the
    /// change was taken ([`crate::Allocator::policy_host_snapshot`]).
    pub fn of(change: &Change, policy_state: &dyn Fn(&HostId) -> Option<String>) -> LoggedChange {
        match change {
            Change::Placed { vm, host } => LoggedChange::Placed { vm: NewVm::clone(vm), host: host.clone() },
            Change::Released { vm, .. } => LoggedChange::Released { vm: vm.clone() },
            Change::Resized { vm, host, .. } => LoggedChange::Resized { vm: NewVm::clone(vm), host: host.clone() },
            Change::HostState { host, state, .. } => LoggedChange::HostState { host: host.clone(), state: *state },
            Change::MigrationStarted { vm, target } => {
                LoggedChange::MigrationStarted { vm: vm.clone(), target: target.clone() }
            }
            Change::MigrationCompleted { vm, target } => {
                LoggedChange::MigrationCompleted { vm: vm.clone(), target: target.clone() }
            }
            Change::MigrationCancelled { vm } => LoggedChange::MigrationCancelled { vm: vm.clone() },
            Change::Drain(drain) => LoggedChange::Drain { drain: drain.as_deref().cloned() },
            Change::Consolidation(consolidation) => {
                LoggedChange::Consolidation { consolidation: consolidation.clone() }
            }
            Change::PolicyHostState { host, policy } => LoggedChange::PolicyHostState {
                host: host.clone(),
                policy: (*policy).to_owned(),
                state: policy_state(host),
            },
            Change::HostInventory { host, entry } => {
                LoggedChange::HostInventory { host: host.clone(), entry: entry.clone() }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::allocator::{Allocator, AllocatorConfig};
    use domain::{AllocationRequest, InventorySpec, RequestFacts, Resources, VmRequest};

    fn ends(allocator: &mut Allocator) -> Vec<(String, f64)> {
        allocator
            .take_changes()
            .filter_map(|change| match change {
                Change::Released { vm, ended_at_s, .. } => Some((vm.as_str().to_owned(), ended_at_s)),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn a_release_records_the_end_it_names_else_the_start_plus_the_time_placed() {
        let spec = InventorySpec::homogeneous("z", 2, 2, Resources::from_whole(8.0, 32.0, 0.0).unwrap());
        let mut allocator = Allocator::new(&spec, &AllocatorConfig::default()).unwrap();
        for (id, at) in [("named", Some(100.0)), ("estimated", Some(200.0)), ("no-time", None)] {
            let mut vm = VmRequest::new(id, "t", "D", Resources::from_whole(1.0, 1.0, 0.0).unwrap());
            vm.facts.requested_at_s = at;
            allocator.allocate(&AllocationRequest::Vm(vm), 1_000.0).unwrap();
        }
        allocator.take_changes().for_each(drop);
        allocator.release_ended(&VmId::from("named"), 1_010.0, Some(160.0)).unwrap();
        // A non-finite end is no end: estimated.
        allocator.release_ended(&VmId::from("estimated"), 1_030.0, Some(f64::NAN)).unwrap();
        allocator.release(&VmId::from("no-time"), 1_040.0).unwrap();
        assert_eq!(
            ends(&mut allocator),
            [("named".to_owned(), 160.0), ("estimated".to_owned(), 230.0), ("no-time".to_owned(), 1_040.0)]
        );
    }

    #[test]
    fn an_estimated_exit_is_never_before_the_start() {
        let vm = NewVm {
            id: VmId::from("a"),
            facts: RequestFacts {
                tenant_id: "t".into(),
                vm_type: "D".to_owned(),
                demand: Resources::from_whole(1.0, 1.0, 0.0).unwrap(),
                requested_at_s: Some(7.0),
                details: Default::default(),
            },
            placed_at_s: 50.0,
            prediction: None,
        };
        assert_eq!(exit_time(&vm, 40.0), 7.0, "a clock that went back");
        assert_eq!(
            exit_time(&NewVm { facts: RequestFacts { requested_at_s: None, ..vm.facts.clone() }, ..vm.clone() }, 40.0),
            50.0
        );
        assert_eq!(exit_time(&vm, 80.0), 37.0);
    }
}
