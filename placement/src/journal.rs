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
use crate::state::NewVm;
use domain::{HostId, HostState, VmId};
use std::sync::Arc;

/// One change to the placement state.
#[derive(Clone, Debug, PartialEq)]
pub enum Change {
    /// A VM was placed on a host.
    Placed { vm: Arc<NewVm>, host: HostId },
    /// A VM left its host (released or exited); a migration it was in is cancelled with it.
    Released { vm: VmId },
    /// An operator or a drain set a host's state.
    HostState { host: HostId, state: HostState },
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
