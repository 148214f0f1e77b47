//! The allocator's durable state, behind one trait with two backends.
//!
//! A store records what the in-memory [`placement::Allocator`] cannot rebuild by itself: every
//! placed VM (in placement order, with what its request carried: its time on the model's clock and
//! its [`domain::RequestFacts`], for the learning loop), every host state set by an operator or a drain, migrations in
//! flight and the drain, and the per-host state of a stateful policy (LAVA) as opaque rows. It
//! writes exactly the placement core's journal ([`placement::Change`]): [`PlacementStore::apply`]
//! writes a whole batch of changes in one transaction, which is what makes group commit possible
//! (see [`crate::durable`]); [`PlacementStore::load`] reads it all back.
//!
//! - [`sqlite`]: one embedded SQLite file, the default (`store = "allocator.db"`), for one
//!   allocator process.
//! - [`postgres`]: a PostgreSQL database (`store = "postgres://..."`), the store that several
//!   agents of a zone can share; it refuses by itself (constraints, not only the agent's check) any
//!   over-commit of a host and any second placement of a VM id.
//!
//! Both version their schema, create or upgrade it when opened, and refuse a newer one naming the
//! fix. Both keep the VMs that left (released or exited) in an exits table, written with the
//! release, bounded by an [`ExitRetention`], and [`export`] reads the placements and exits back as
//! a trace in the project's format.

pub mod export;
mod listener;
mod log_view;
mod notifier;
pub mod postgres;
pub mod sqlite;

pub use export::{ExportError, ExportHeader, ExportSink, ExportWindow, ExportedVm, TraceExport};

pub use listener::Waker;
pub use postgres::PostgresStore;
pub use sqlite::{SqliteOptions, SqliteStore, Synchronous};

use domain::{
    HostId, HostState, InventorySpec, LifetimePrediction, Rejection, RequestDetails, RequestFacts, Resources, TenantId,
    VmId, RESOURCE_DIMS,
};
use placement::defrag::Drain;
use placement::journal::{Change, LoggedChange};
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
    #[error("allocator store {store}: consolidation record: {detail}")]
    CorruptConsolidation { store: String, detail: String },
    #[error("allocator store {store}: inventory entry of host `{host}`: {detail}")]
    CorruptInventory { store: String, host: String, detail: String },
    /// The store refused the batch because it contradicts what the store holds (a host would be
    /// over-committed, a VM id is placed already). Nothing of the batch was written.
    #[error("allocator store {store}: refused: {detail}")]
    Refused { store: String, detail: String },
    /// The batch places VMs that another agent answered "rejected" after this agent's view was
    /// taken (a client sent the same id to both at once): the first answer stands, so these VMs
    /// are answered rejected too. Nothing of the batch was written.
    #[error("allocator store {store}: refused: VMs {vms:?} were rejected by another agent meanwhile")]
    RejectedElsewhere { store: String, vms: Vec<VmId> },
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
    /// Consolidation's record, when it is on.
    pub consolidation: Option<placement::consolidation::Consolidation>,
    /// The "rejected" answers that still stand ([`REJECTION_STANDS_S`]).
    pub rejections: Vec<StandingRejection>,
    /// Hosts added or changed (`Some`) or removed (`None`) while the allocator ran, in the order
    /// written: the configured inventory with these is the zone's
    /// ([`domain::InventorySpec::with_changes`]).
    pub inventory: Vec<(HostId, Option<domain::HostEntry>)>,
}

/// A host's inventory entry as the stores keep it (JSON).
pub(crate) fn entry_json(entry: &domain::HostEntry, store: &str) -> Result<String, StoreError> {
    serde_json::to_string(entry).map_err(|e| StoreError::CorruptInventory {
        store: store.to_owned(),
        host: String::new(),
        detail: e.to_string(),
    })
}

/// [`entry_json`] read back.
pub(crate) fn parse_entry(store: &str, host: &HostId, json: &str) -> Result<domain::HostEntry, StoreError> {
    serde_json::from_str(json).map_err(|e| StoreError::CorruptInventory {
        store: store.to_owned(),
        host: host.to_string(),
        detail: e.to_string(),
    })
}

/// Seconds since the Unix epoch: the allocator's clock in the service, and the embedded store's for
/// its rejections.
pub fn unix_now_s() -> f64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64())
}

/// How long (seconds) a "rejected" answer for a VM id stands: a client that timed out and sent the
/// same request again, to the same agent or another one, gets that first answer again rather than
/// a placement, even if capacity freed up meanwhile (`crate::durable::rejections`). Past it, a
/// request for the id is decided afresh.
pub const REJECTION_STANDS_S: f64 = 30.0;

/// A VM id answered "rejected" less than [`REJECTION_STANDS_S`] ago, as a store recorded it.
#[derive(Clone, Debug, PartialEq)]
pub struct StandingRejection {
    pub vm: VmId,
    /// How long ago it was answered (seconds, on the store's clock).
    pub age_s: f64,
    /// The answer itself, when the store keeps it (the embedded store does; the shared one keeps
    /// the id alone, which any agent answers alike).
    pub rejection: Option<Rejection>,
}

/// Where the durable state lives: the `store` setting of the allocator's configuration, either
/// the path of an SQLite file or a PostgreSQL URL.
#[derive(Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(from = "String", into = "String")]
pub enum StoreLocation {
    /// An SQLite file (created if missing).
    Sqlite(PathBuf),
    /// An SQLite file opened with other options than the service's (tests: another VFS, a
    /// weakened `synchronous`); never read from the configuration, which names a path.
    SqliteWith(PathBuf, SqliteOptions),
    /// A PostgreSQL connection URL (`postgres://user:password@host:port/database`).
    Postgres(String),
}

impl From<String> for StoreLocation {
    /// A `postgres://` or `postgresql://` URL is PostgreSQL; anything else is an SQLite file.
    fn from(setting: String) -> Self {
        if setting.starts_with("postgres://") || setting.starts_with("postgresql://") {
            StoreLocation::Postgres(setting)
        } else {
            StoreLocation::Sqlite(PathBuf::from(setting))
        }
    }
}

impl From<StoreLocation> for String {
    fn from(location: StoreLocation) -> String {
        match location {
            StoreLocation::Sqlite(path) | StoreLocation::SqliteWith(path, _) => path.display().to_string(),
            StoreLocation::Postgres(url) => url,
        }
    }
}

/// The setting, never with its password.
impl fmt::Display for StoreLocation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StoreLocation::Sqlite(path) | StoreLocation::SqliteWith(path, _) => write!(f, "{}", path.display()),
            StoreLocation::Postgres(url) => f.write_str(&postgres::redact(url)),
        }
    }
}

/// As [`fmt::Display`]: never the password.
impl fmt::Debug for StoreLocation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
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

/// How long the exits tables keep the VMs that left, on the model's clock (`[export] retention_s`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ExitRetention {
    /// An exit is deleted once it ended more than this many seconds before the newest exit the
    /// process wrote (infinite: never).
    pub retention_s: f64,
}

/// Default of [`ExitRetention::retention_s`]: 30 days.
pub const DEFAULT_EXIT_RETENTION_S: f64 = 30.0 * 86_400.0;

/// How often exits are pruned, at most.
pub const PRUNE_EVERY: std::time::Duration = std::time::Duration::from_secs(60);

impl Default for ExitRetention {
    fn default() -> Self {
        ExitRetention { retention_s: DEFAULT_EXIT_RETENTION_S }
    }
}

impl ExitRetention {
    /// The end before which exits go, given the newest exit written (none when nothing is to go).
    pub fn cutoff(&self, newest_exit_s: f64) -> Option<f64> {
        let cutoff = newest_exit_s - self.retention_s;
        cutoff.is_finite().then_some(cutoff)
    }

    /// Whether exits should be pruned now: never pruned by this process, or last [`PRUNE_EVERY`]
    /// ago, and there is something to judge by.
    pub fn due(&self, pruned_at: Option<std::time::Instant>, newest_exit_s: f64) -> bool {
        self.cutoff(newest_exit_s).is_some() && pruned_at.is_none_or(|at| at.elapsed() >= PRUNE_EVERY)
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
    fn apply(
        &mut self,
        changes: &[Change],
        policy_state: &dyn Fn(&HostId) -> Option<String>,
    ) -> Result<Committed, StoreError> {
        self.apply_decisions(changes, &[], policy_state)
    }

    /// [`PlacementStore::apply`] of a batch that also answered the allocation requests of the VM
    /// ids `rejected` "rejected" (with each answer), which it records in the same transaction, so
    /// that the answers stand for [`REJECTION_STANDS_S`], across a restart too
    /// ([`StoredState::rejections`]). A store that several agents share also makes that answer
    /// safe against a duplicate of the same request sent to another agent at the same moment (a
    /// client's retry): it refuses the batch with [`StoreError::Refused`] when one of `rejected`
    /// is placed already (decide again: the answer is that placement, replayed), and with
    /// [`StoreError::RejectedElsewhere`] when another agent answered one of the VMs this batch
    /// places "rejected" after this agent's view was taken or less than [`REJECTION_STANDS_S`]
    /// ago.
    fn apply_decisions(
        &mut self,
        changes: &[Change],
        rejected: &[(VmId, Rejection)],
        policy_state: &dyn Fn(&HostId) -> Option<String>,
    ) -> Result<Committed, StoreError>;

    /// Keeps the VMs that left as `retention` says from now on (pruned after a batch, at most once
    /// every [`PRUNE_EVERY`]).
    fn set_exit_retention(&mut self, retention: ExitRetention);

    /// This agent's name in a store that several agents share (`None`: only this one writes it).
    fn agent(&self) -> Option<&str> {
        None
    }

    /// The agents that write the store lately, this one included, by name (none: only this one
    /// writes it). Each takes its own share of the hosts among them ([`placement::HostShare`]).
    fn agents(&self) -> Vec<&str> {
        Vec::new()
    }

    /// The recorded policy states (host, policy, its JSON) of `hosts`, as [`PlacementStore::load`]
    /// gives them: a host not listed is in its initial state.
    fn policy_states(&mut self, hosts: &[HostId]) -> Result<Vec<(HostId, String, String)>, StoreError>;

    /// The changes committed since this agent's last [`PlacementStore::load`] or follow, or its
    /// last batch committed [`Committed::InOrder`]: other agents' batches, and its own committed
    /// [`Committed::AfterOthers`]. A store that only this agent writes has none.
    fn follow(&mut self) -> Result<Followed, StoreError> {
        Ok(Followed::Batches(Vec::new()))
    }

    /// Other agents' batches that this agent knows of without reading the store (their
    /// notifications carried them), in the log's order, as [`PlacementStore::follow`] gives them:
    /// a view that applied them is as current as one that [`PlacementStore::known_current`] let
    /// skip the follow, no more (a commit not notified yet is not in it). `None` when the store
    /// must be read (no notifications to rely on, a batch too large to notify, a position to
    /// claim).
    fn follow_notified(&mut self) -> Result<Option<Followed>, StoreError> {
        Ok(None)
    }

    /// Whether this agent's view is known to hold every batch committed to the store, so that a
    /// batch whose answers the store checks at its commit may skip [`PlacementStore::follow`]. A
    /// store only this agent writes always is; a shared one knows it from other agents'
    /// notifications, which may be late: the commit's log position ([`Committed`]) is what is
    /// exact, and a store that cannot tell answers `false`.
    fn known_current(&self) -> bool {
        true
    }

    /// Calls `wake` (from another thread, without blocking) when another agent committed a batch
    /// this agent has not followed: an idle agent follows then, off the request path. A store only
    /// this agent writes never calls it.
    fn set_waker(&mut self, wake: Waker) {
        let _ = wake;
    }
}

/// Where a committed batch went in the store's order of commits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Committed {
    /// Right after what this agent last followed: its view is the store's.
    InOrder,
    /// After other agents' batches this agent has not followed yet. Its view applied the batch
    /// before them, which the store did not: take the batch back in memory and follow the log,
    /// which now includes it (applied in the store's order, no intermediate state over-commits a
    /// host that the store never over-committed).
    AfterOthers,
}

/// What other agents committed since this one last looked.
#[derive(Clone, Debug, PartialEq)]
pub enum Followed {
    /// The committed batches, in commit order, each with its changes in order (none: nothing
    /// new, or a store no one else writes). Follow each as a whole
    /// ([`placement::Allocator::follow_batch`]).
    Batches(Vec<Vec<LoggedChange>>),
    /// The log no longer reaches back to this agent's position: reload the whole state.
    Gap,
}

/// Opens (creating or upgrading its schema) the store at `location` for the zone `inventory`.
pub fn open(location: &StoreLocation, inventory: &InventorySpec) -> Result<Box<dyn PlacementStore>, StoreError> {
    Ok(match location {
        StoreLocation::Sqlite(path) => Box::new(SqliteStore::open(path)?),
        StoreLocation::SqliteWith(path, options) => Box::new(SqliteStore::open_with(path, options)?),
        StoreLocation::Postgres(url) => Box::new(PostgresStore::open(url, inventory)?),
    })
}

/// Exports the VMs of the store at `location` that started in `window` into `sink` as a trace
/// ([`export`]); answers how many rows were written. Each backend reads on a connection of its own.
pub fn export_trace(
    location: &StoreLocation,
    window: &ExportWindow,
    sink: &mut dyn ExportSink,
) -> Result<u64, ExportError> {
    match location {
        StoreLocation::Sqlite(path) => sqlite::export(path, None, window, sink),
        StoreLocation::SqliteWith(path, options) => sqlite::export(path, options.vfs.as_deref(), window, sink),
        StoreLocation::Postgres(url) => postgres::export(url, window, sink),
    }
}

/// The columns of one placed VM, as both stores keep them (demands in base units, the prediction
/// and the request's facts as JSON).
pub(crate) struct VmColumns {
    pub seq: i64,
    pub vm_id: String,
    pub host_id: String,
    pub tenant_id: String,
    pub vm_type: String,
    pub base: [i64; RESOURCE_DIMS],
    pub placed_at_s: f64,
    pub prediction: Option<String>,
    pub requested_at_s: Option<f64>,
    /// The request's [`RequestDetails`] as JSON; none: the defaults (and every VM a store of an
    /// older schema kept).
    pub request: Option<String>,
}

impl VmColumns {
    /// The stored VM, refusing a negative demand, an unreadable prediction or unreadable request
    /// facts by the VM's name.
    pub(crate) fn decode(self, store: &str) -> Result<StoredVm, StoreError> {
        let corrupt =
            |detail: String| StoreError::CorruptVm { store: store.to_owned(), vm: self.vm_id.clone(), detail };
        let mut units = [0u64; RESOURCE_DIMS];
        for (slot, value) in units.iter_mut().zip(self.base) {
            *slot = u64::try_from(value).map_err(|_| corrupt(format!("negative demand {value}")))?;
        }
        let prediction: Option<LifetimePrediction> = self
            .prediction
            .as_deref()
            .map(serde_json::from_str)
            .transpose()
            .map_err(|e| corrupt(format!("unreadable prediction: {e}")))?;
        let details: RequestDetails = self
            .request
            .as_deref()
            .map(serde_json::from_str)
            .transpose()
            .map_err(|e| corrupt(format!("unreadable request facts: {e}")))?
            .unwrap_or_default();
        let facts = RequestFacts {
            tenant_id: TenantId(self.tenant_id),
            vm_type: self.vm_type,
            demand: Resources::from_base_units(units),
            requested_at_s: self.requested_at_s,
            details,
        };
        Ok(StoredVm {
            seq: self.seq,
            host: HostId(self.host_id),
            vm: NewVm { id: VmId(self.vm_id), facts, placed_at_s: self.placed_at_s, prediction },
        })
    }
}

/// A VM's prediction as both stores keep it: JSON, or none.
pub(crate) fn prediction_json(vm: &NewVm, store: &str) -> Result<Option<String>, StoreError> {
    vm.prediction.as_ref().map(serde_json::to_string).transpose().map_err(|e| StoreError::CorruptVm {
        store: store.to_owned(),
        vm: vm.id.to_string(),
        detail: format!("prediction cannot be written: {e}"),
    })
}

/// A VM's request facts as both stores keep them: JSON, or none for the defaults (the common case,
/// which then costs neither an allocation nor a byte).
pub(crate) fn request_json(vm: &NewVm, store: &str) -> Result<Option<String>, StoreError> {
    if vm.facts.details.is_default() {
        return Ok(None);
    }
    serde_json::to_string(&vm.facts.details).map(Some).map_err(|e| StoreError::CorruptVm {
        store: store.to_owned(),
        vm: vm.id.to_string(),
        detail: format!("request facts cannot be written: {e}"),
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

    fn apply_decisions(
        &mut self,
        changes: &[Change],
        rejected: &[(VmId, Rejection)],
        policy_state: &dyn Fn(&HostId) -> Option<String>,
    ) -> Result<Committed, StoreError> {
        // No other agent writes an SQLite store.
        SqliteStore::apply_decisions(self, changes, rejected, policy_state).map(|()| Committed::InOrder)
    }

    fn policy_states(&mut self, hosts: &[HostId]) -> Result<Vec<(HostId, String, String)>, StoreError> {
        SqliteStore::policy_states(self, hosts)
    }

    fn set_exit_retention(&mut self, retention: ExitRetention) {
        SqliteStore::set_exit_retention(self, retention);
    }
}

impl PlacementStore for PostgresStore {
    fn load(&mut self) -> Result<StoredState, StoreError> {
        PostgresStore::load(self)
    }

    fn policy_states(&mut self, hosts: &[HostId]) -> Result<Vec<(HostId, String, String)>, StoreError> {
        PostgresStore::policy_states(self, hosts)
    }

    fn set_exit_retention(&mut self, retention: ExitRetention) {
        PostgresStore::set_exit_retention(self, retention);
    }

    fn apply_decisions(
        &mut self,
        changes: &[Change],
        rejected: &[(VmId, Rejection)],
        policy_state: &dyn Fn(&HostId) -> Option<String>,
    ) -> Result<Committed, StoreError> {
        PostgresStore::apply_decisions(self, changes, rejected, policy_state)
    }

    fn agent(&self) -> Option<&str> {
        Some(&self.agent)
    }

    fn agents(&self) -> Vec<&str> {
        PostgresStore::agents(self)
    }

    fn follow(&mut self) -> Result<Followed, StoreError> {
        PostgresStore::follow(self)
    }

    fn follow_notified(&mut self) -> Result<Option<Followed>, StoreError> {
        PostgresStore::follow_notified(self)
    }

    fn known_current(&self) -> bool {
        PostgresStore::known_current(self)
    }

    fn set_waker(&mut self, wake: Waker) {
        PostgresStore::set_waker(self, wake);
    }
}
