//! The inference server: loads lifetime-model bundles from a models directory, serves predictions
//! over HTTP, and rolls out new bundles.
//!
//! - [`config`]: the TOML configuration.
//! - [`registry`]: the bundles on disk, the stable and canary deployment, validation, atomic swaps,
//!   the `rollout.toml` file that records promotions and rollbacks (`lifetime_model::registry`,
//!   which the allocator also follows).
//! - [`history`]: the live tenant history predictions read (issue 18).
//! - [`api`]: the axum routes, a thin layer over the registry and `lifetime-model`.

// axum's rejections are `Response`s; boxing them would only obscure the handlers.
#![allow(clippy::result_large_err)]

pub mod api;
pub mod config;
pub mod history;
pub use lifetime_model::registry;
