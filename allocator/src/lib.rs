//! The allocator service: the [`placement`] core made durable and served over HTTP.
//!
//! - [`store`]: the SQLite store of placed VMs, host states, migrations and policy host state (WAL,
//!   `synchronous = FULL`).
//! - [`durable`]: [`DurableAllocator`], the placement core over its store, with group commit.
//! - [`worker`]: the thread that owns the [`DurableAllocator`] and batches commits.
//! - [`api`]: the axum routes; [`config`]: the service's configuration.
//! - [`cli`]: the program: its flags, recovery, the worker and the server, given its policies'
//!   registry by the program's `main`.
//!
//! All placement logic (rules, policies, the index, LAVA, drains, explain, stats) lives in the
//! `placement` crate.

pub mod api;
pub mod cli;
pub mod config;
pub mod durable;
pub mod store;
pub mod worker;

pub use durable::{CommandError, DurableAllocator, DurableError, Request};
pub use store::{PlacementStore, SqliteStore, StoreError, StoreLocation};
