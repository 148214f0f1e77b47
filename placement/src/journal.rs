//! The change journal: every state change the placement core makes, as one [`Change`] value.
//!
//! The allocator appends to its journal as it works and [`crate::Allocator::take_changes`] hands the
//! changes over after each operation: the allocator service's store writes exactly these (one
//! transaction per batch of commands), and the simulator follows the same stream (the migrations a
//! drain starts). Nothing else builds a store record.
//!
//! Two kinds of change are coalesced and come last in a take, in host order: the drain's record
//! (written whole, once, however often it moved) and each host whose policy state changed (a host
//! whose state changed and changed back is named again, which is harmless). A policy-state change
//! names the host only: its state is the allocator's as the changes are taken
//! ([`crate::Allocator::policy_host_snapshot`]), so a consumer that does not keep it (the simulator)
//! never pays for serialising it.
//!
//! Recording is cheap: a placement shares its VM record with the inventory (an `Arc`), and a
//! release hands over the inventory's own copy of the id.

use crate::defrag::Drain;
use crate::state::{NewVm, PlacedVm};
use domain::{HostId, HostState, VmId};
use serde::{Deserialize, Serialize};
use std::sync::Arc;

/// One change to the placement state.
#[derive(Clone, Debug, PartialEq)]
pub enum Change {
    /// A VM was placed on a host.
    Placed { vm: Arc<NewVm>, host: HostId },
    /// A VM left its host (released or exited); a migration it was in is cancelled with it. `was`
    /// is where it was and its record (shared, not copied), so that the release can be taken back
    /// ([`crate::Allocator::undo`]).
    Released { vm: VmId, was: PlacedVm },
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
    /// A host's state under the stateful policy `policy` changed; its snapshot is
    /// [`crate::Allocator::policy_host_snapshot`] at the time of the take.
    PolicyHostState { host: HostId, policy: &'static str },
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
    /// `state`: the policy's snapshot of the host (`None`: its initial state).
    PolicyHostState {
        host: HostId,
        policy: String,
        state: Option<String>,
    },
}

impl LoggedChange {
    /// The change as the log keeps it; `policy_state` snapshots a host's policy state as the
    /// change was taken ([`crate::Allocator::policy_host_snapshot`]).
    pub fn of(change: &Change, policy_state: &dyn Fn(&HostId) -> Option<String>) -> LoggedChange {
        match change {
            Change::Placed { vm, host } => LoggedChange::Placed { vm: NewVm::clone(vm), host: host.clone() },
            Change::Released { vm, .. } => LoggedChange::Released { vm: vm.clone() },
            Change::HostState { host, state, .. } => LoggedChange::HostState { host: host.clone(), state: *state },
            Change::MigrationStarted { vm, target } => {
                LoggedChange::MigrationStarted { vm: vm.clone(), target: target.clone() }
            }
            Change::MigrationCompleted { vm, target } => {
                LoggedChange::MigrationCompleted { vm: vm.clone(), target: target.clone() }
            }
            Change::MigrationCancelled { vm } => LoggedChange::MigrationCancelled { vm: vm.clone() },
            Change::Drain(drain) => LoggedChange::Drain { drain: drain.as_deref().cloned() },
            Change::PolicyHostState { host, policy } => LoggedChange::PolicyHostState {
                host: host.clone(),
                policy: (*policy).to_owned(),
                state: policy_state(host),
            },
        }
    }
}
