//! The placement core: one policy over one live inventory, with no HTTP, no async runtime and no
//! database in it. The `allocator` service wraps it with durability and an API; the simulator drives
//! the very same [`Allocator`].
//!
//! - [`state`]: the live inventory; its checked arithmetic makes over-committing a host impossible.
//! - [`lifetime`]: lifetime classes of VMs and hosts (LA-binary, LA-multiclass).
//! - [`reprediction`]: remaining-lifetime repredictions and the hosts' exit times (NILAS, LAVA).
//! - [`host_state`]: the extension point for policy state kept per host (hooks, host codes, snapshots).
//! - [`lava`]: LAVA behind it: per-host state machine (empty, open, recycling; class, residual VMs,
//!   deadline) and its preference rule.
//! - [`journal`]: [`journal::Change`], every state change the core makes, taken after each operation.
//! - [`defrag`]: LARS drains: hosts emptied by migrations, longest remaining lifetime first.
//! - [`consolidation`]: consolidation under a migration budget: which hosts to empty, and its record.
//! - [`rules`]: validator and preference rules, each a small type declaring what it reads.
//! - [`config`]: the `[policy]` settings as data.
//! - [`policy`]: a policy built from its settings: validators and ordered preference rules.
//! - [`registry`]: the composition root: every rule and preset (PBFR, DPBFR, LA-binary,
//!   LA-multiclass, NILAS, LAVA) by name; an embedder adds its own.
//! - [`select`]: the full-scan reference and the incremental index that choose a host.
//! - [`allocator`]: [`Allocator`], the placement logic: gangs, idempotency, stats, explain.

pub mod allocator;
pub mod config;
pub mod consolidation;
pub mod defrag;
pub mod host_state;
pub mod journal;
pub mod lava;
pub mod lifetime;
pub mod outcomes;
pub mod policy;
pub mod registry;
pub mod reprediction;
pub mod rules;
pub mod select;
pub mod state;

pub use allocator::{
    AllocateError, Allocator, AllocatorConfig, AllocatorError, AllocatorStats, ConflictAvoidance, ConsolidationError,
    DrainError, Engine, Explanation, HostShare,
};
pub use journal::Change;
pub use policy::{Policy, PolicyConfig};
pub use registry::Registry;
pub use select::{IndexConfig, TieBreak};
pub use state::{HostIndex, HostRecord, InventoryState, NewVm, Occupancy, PlacedVm, StateError};
