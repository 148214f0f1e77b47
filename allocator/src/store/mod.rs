//! The allocator's durable state, behind one trait with two backends.
//!
//! A store records what the in-memory [`placement::Allocator`] cannot rebuild by itself: every
//! placed VM (in placement order), every host state set by an operator or a drain, migrations in
//! flight and the drain, and the per-host state of a stateful policy (LAVA) as opaque rows. It
//! writes exactly the placement core's journal ([`placement::Change`]): [`PlacementStore::apply`]
//! writes a whole batch of changes in one transaction, which is what makes group commit possible
//! (see [`crate::durable`]); [`PlacementStore::load`] reads it all back.
//!
//! - [`sqlite`]: one embedded SQLite file, the default (`store = "allocator.db"`), for one
//!   allocator process. It versions its schema, upgrades an older one in place and refuses a newer
//!   one naming the fix.
//!
//! A PostgreSQL backend for several agents per zone (issue 17) comes behind the same trait.

pub mod sqlite;

pub use sqlite::SqliteStore;

use domain::{HostId, HostState, VmId};
use placement::defrag::Drain;
use placement::journal::Change;
use placement::state::NewVm;
use std::fmt;
use std::path::{Path, PathBuf};

/// The cause of a store error, from whichever database client.
pub type Source = Box<dyn std::error::Error + Send + Sync>;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("opening the allocator store {store}: {source}")]
    Open { store: String, source: Source },
    #[error("allocator store {store}: schema version {found} is newer than this allocator's ({ours}); {fix}")]
    SchemaVersion { store: String, found: i64, ours: i64, fix: &'static str },
    #[error("allocator store {store}: {context}: {source}")]
    Sql { store: String, context: &'static str, source: Source },
    #[error("allocator store {store}: VM `{vm}`: {detail}")]
    CorruptVm { store: String, vm: String, detail: String },
    #[error("allocator store {store}: host `{host}`: unknown state `{state}`")]
    CorruptHostState { store: String, host: String, state: String },
    #[error("allocator store {store}: upgrading from schema version 3: LAVA state of host `{host}`: {detail}")]
    CorruptLava { store: String, host: String, detail: String },
    #[error("allocator store {store}: drain record: {detail}")]
    CorruptDrain { store: String, detail: String },
}

/// One VM as the store recorded it.
#[derive(Clone, Debug, PartialEq)]
pub struct StoredVm {
    /// Position in placement order (increasing, never reused).
    pub seq: i64,
    pub host: HostId,
    pub vm: NewVm,
}

/// Everything the store holds.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StoredState {
    /// Placed VMs in placement order.
    pub vms: Vec<StoredVm>,
    /// Host states set by operators, by host id.
    pub host_states: Vec<(HostId, HostState)>,
    /// Per-host policy state (host, policy, its JSON) of hosts not in their initial state.
    pub policy_hosts: Vec<(HostId, String, String)>,
    /// Migrations in flight: VM -> target host.
    pub migrations: Vec<(VmId, HostId)>,
    /// The current (or last) drain.
    pub drain: Option<Drain>,
}

/// Where the durable state lives: the `store` setting of the allocator's configuration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StoreLocation {
    /// An SQLite file (created if missing).
    Sqlite(PathBuf),
}

impl fmt::Display for StoreLocation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StoreLocation::Sqlite(path) => write!(f, "{}", path.display()),
        }
    }
}

impl From<&Path> for StoreLocation {
    fn from(path: &Path) -> Self {
        StoreLocation::Sqlite(path.to_owned())
    }
}

impl From<&PathBuf> for StoreLocation {
    fn from(path: &PathBuf) -> Self {
        StoreLocation::Sqlite(path.clone())
    }
}

impl From<PathBuf> for StoreLocation {
    fn from(path: PathBuf) -> Self {
        StoreLocation::Sqlite(path)
    }
}

/// A durable placement store. See the module documentation.
pub trait PlacementStore: Send + fmt::Debug {
    /// Every placed VM in placement order, every recorded host state, policy state, migration and
    /// the drain.
    fn load(&mut self) -> Result<StoredState, StoreError>;

    /// Writes `changes` in order, in one transaction: after `Ok` all of them are durable, after
    /// `Err` none of them is. `policy_state` gives a host's policy-state snapshot as the changes
    /// were taken ([`placement::Allocator::policy_host_snapshot`]; `None`: its initial state).
    fn apply(&mut self, changes: &[Change], policy_state: &dyn Fn(&HostId) -> Option<String>)
        -> Result<(), StoreError>;
}

/// Opens (creating or upgrading its schema) the store at `location`.
pub fn open(location: &StoreLocation) -> Result<Box<dyn PlacementStore>, StoreError> {
    Ok(match location {
        StoreLocation::Sqlite(path) => Box::new(SqliteStore::open(path)?),
    })
}

pub(crate) fn state_name(state: HostState) -> &'static str {
    match state {
        HostState::Available => "available",
        HostState::Unavailable => "unavailable",
        HostState::Failed => "failed",
    }
}

pub(crate) fn parse_state(name: &str) -> Option<HostState> {
    match name {
        "available" => Some(HostState::Available),
        "unavailable" => Some(HostState::Unavailable),
        "failed" => Some(HostState::Failed),
        _ => None,
    }
}

impl PlacementStore for SqliteStore {
    fn load(&mut self) -> Result<StoredState, StoreError> {
        SqliteStore::load(self)
    }

    fn apply(
        &mut self,
        changes: &[Change],
        policy_state: &dyn Fn(&HostId) -> Option<String>,
    ) -> Result<(), StoreError> {
        SqliteStore::apply(self, changes, policy_state)
    }
}
