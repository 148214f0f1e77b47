//! The allocator: live inventory, the Protean-style rule engine, the lifetime-aware placement
//! policies and durable state; the `allocator` binary will be a thin HTTP layer over this library.
//!
//! So far: [`state`], the live inventory that every policy, the service and the simulator share,
//! whose checked arithmetic makes over-committing a host impossible. The rule engine, policies,
//! durable store and service follow (issue 4).

pub mod state;

pub use state::{HostIndex, HostRecord, InventoryState, PlacedVm, StateError};
