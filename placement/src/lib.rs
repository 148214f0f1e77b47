//! The placement core: one policy over one live inventory, with no HTTP, no async runtime and no
//! database in it. The `allocator` service wraps it with durability and an API; the simulator drives
//! the very same [`Allocator`].
//!
//! - [`state`]: the live inventory; its checked arithmetic makes over-committing a host impossible.
//! - [`lifetime`]: lifetime classes of VMs and hosts (LA-binary, LA-multiclass).
//! - [`reprediction`]: remaining-lifetime repredictions and the hosts' exit times (NILAS, LAVA).
//! - [`lava`]: LAVA's per-host state machine (empty, open, recycling; class, residual VMs, deadline).
//! - [`defrag`]: LARS drains: hosts emptied by migrations, longest remaining lifetime first.
//! - [`rules`]: validator and preference rules, each a small type declaring what it reads.
//! - [`policy`]: PBFR, DPBFR, LA-binary, LA-multiclass, NILAS, LAVA as ordered rule lists.
//! - [`select`]: the full-scan reference and the incremental index that choose a host.
//! - [`allocator`]: [`Allocator`], the placement logic: gangs, idempotency, stats, explain.

pub mod allocator;
pub mod defrag;
pub mod lava;
pub mod lifetime;
pub mod policy;
pub mod reprediction;
pub mod rules;
pub mod select;
pub mod state;

pub use allocator::{
    AllocateError, Allocator, AllocatorConfig, AllocatorError, AllocatorStats, DrainError, Engine, Explanation,
};
pub use policy::{Policy, PolicyConfig, PolicyKind};
pub use select::{IndexConfig, TieBreak};
pub use state::{HostIndex, HostRecord, InventoryState, NewVm, Occupancy, PlacedVm, StateError};
