//! What the workspace's tests and benches share across crates, as a dev-dependency (never
//! published, never linked by a library or a binary):
//!
//! - [`binaries`]: the workspace's binaries, found beside the running test;
//! - [`timing`]: a call's latency figures over many timed calls (the benches');
//!
//! and with the `services` feature:
//!
//! - `listening`: starting a server on a free port so that only its own answer counts (another
//!   test's server may take the port first);
//! - `process`: a started service (killed when dropped), the command line and the service
//!   credential every service binary is started with;
//! - `postgres`: throwaway PostgreSQL clusters (and standbys), removed when dropped;
//! - `stack`: the three services started on loopback as a stack.
//!
//! `env!("CARGO_BIN_EXE_...")` names a binary only in the crate that owns it: the helpers take a
//! binary's path, or find the workspace's binaries in the target directory ([`binaries`]).

pub mod binaries;
#[cfg(feature = "services")]
pub mod listening;
#[cfg(feature = "services")]
pub mod postgres;
#[cfg(feature = "services")]
pub mod process;
#[cfg(feature = "services")]
pub mod stack;
pub mod timing;
