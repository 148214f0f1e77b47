//! The allocator: live inventory, the Protean-style rule engine, the lifetime-aware placement
//! policies and durable state, with no HTTP in it; the `allocator` binary is a thin HTTP layer over
//! this library, and the simulator drives the same [`Allocator`].
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
//! - [`store`]: the SQLite store of placed VMs and host states (WAL, `synchronous = FULL`).
//! - [`durable`]: [`DurableAllocator`], the allocator over its store, with group commit.
//!
//! The service layer of the `allocator` binary (the only modules that know HTTP or tokio):
//! [`worker`] (the thread that owns the [`DurableAllocator`] and batches commits), [`api`] (axum
//! routes) and [`config`].

pub mod allocator;
pub mod api;
pub mod config;
pub mod defrag;
pub mod durable;
pub mod lava;
pub mod lifetime;
pub mod policy;
pub mod reprediction;
pub mod rules;
pub mod select;
pub mod state;
pub mod store;
pub mod worker;

pub use allocator::{
    AllocateError, Allocator, AllocatorConfig, AllocatorError, AllocatorStats, DrainError, Engine, Explanation,
};
pub use durable::{Command, CommandError, DurableAllocator, DurableError, Reply};
pub use policy::{Policy, PolicyConfig, PolicyKind};
pub use select::{IndexConfig, TieBreak};
pub use state::{HostIndex, HostRecord, InventoryState, NewVm, Occupancy, PlacedVm, StateError};
pub use store::{Store, StoreError};
