//! The change journal: every state change the placement core makes, as one [`Change`] value.
//!
//! The allocator appends to its journal as it works and [`crate::Allocator::take_changes`] hands the
//! changes over after each operation: the allocator service's store writes exactly these (one
//! transaction per batch of commands), and the simulator follows the same stream (the migrations a
//! drain starts). Nothing else builds a store record.
//!
//! Two kinds of change are coalesced and come last in a take, in host order: the drain's record
//! (written whole, once, however often it moved) and each changed host's policy state (its final
//! state; a host whose state changed and changed back is written again, which is harmless).

use crate::defrag::Drain;
use crate::state::NewVm;
use domain::{HostId, HostState, VmId};

/// One change to the placement state.
#[derive(Clone, Debug, PartialEq)]
pub enum Change {
    /// A VM was placed on a host.
    Placed { vm: NewVm, host: HostId },
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
    /// A host's state under the stateful policy `policy` (`None`: its initial state, no row).
    PolicyHostState { host: HostId, policy: &'static str, state: Option<String> },
}
