//! The embedded store: one SQLite database file (WAL journal, `synchronous = FULL`, so that a
//! committed transaction survives a crash of the process or of the machine), for one allocator
//! process. The default; PostgreSQL ([`super::postgres`]) is for several agents per zone.
//!
//! It records what the in-memory [`placement::Allocator`] cannot rebuild by itself: every placed VM
//! (with a sequence number giving the placement order), every host state set by an operator or a
//! drain, migrations in flight and the drain, and the per-host state of a stateful policy (LAVA) as
//! opaque rows. It writes exactly the placement core's journal ([`placement::Change`]):
//! [`Store::apply`] writes a whole batch of changes in one transaction, which is what makes group
//! commit possible (see [`crate::durable`]); [`Store::load`] reads it all back.
//!
//! Schema (version 9). A store of an older version is upgraded in place when opened, in one
//! transaction: versions 1 and 2 gain the tables they lack (and versions 1 to 7 the empty
//! `rejections`, 1 to 8 the empty `inventory`), version 3's `lava_hosts` rows become
//! `policy_hosts` rows of policy `lava` (the same state as JSON), the `vms` of versions 1 to 4
//! gain the request's columns (`ALTER TABLE ... ADD COLUMN`), NULL in the rows they hold: no request
//! time, default request facts, and versions 1 to 5 gain the (empty) `exits` table. A store of a
//! newer version than this code is refused with a message naming the fix.
//!
//! **Exits.** A release moves the VM's row from `vms` to `exits` in the batch's transaction, with
//! when it ended on the model's clock ([`placement::Change::Released`]), so that the placements and
//! exits can be exported as a trace ([`super::export`]). The table is keyed by the VM's start on
//! the model's clock, so an export reads it in order and pruning reads only old rows: at most once
//! a minute, the exits that ended more than the retention (`[export] retention_s`) before the
//! newest exit this process wrote are deleted, in a transaction of their own after a batch's.
//!
//! **Rejections** (issue 56). A batch that answers allocations "rejected" records each VM id with
//! its answer and the wall-clock time in `rejections`, in its transaction; [`SqliteStore::load`]
//! reads back those of the last [`super::REJECTION_STANDS_S`], so that the first answer stands
//! across a restart too (`crate::durable::rejections`). Older rows are deleted by the next batch
//! that records one.
//!
//! ```sql
//! CREATE TABLE meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL);  -- schema_version, next_seq
//! CREATE TABLE vms (
//!     vm_id TEXT PRIMARY KEY, seq INTEGER NOT NULL UNIQUE, host_id TEXT NOT NULL,
//!     tenant_id TEXT NOT NULL, vm_type TEXT NOT NULL,
//!     cores_base INTEGER NOT NULL, memory_base INTEGER NOT NULL, ssd_base INTEGER NOT NULL,
//!     placed_at_s REAL NOT NULL,                                       -- the allocator's clock
//!     prediction TEXT,                                                 -- prediction as JSON
//!     requested_at_s REAL,                                             -- the request's, model clock
//!     request TEXT);        -- {priority, os, features} as JSON; NULL: regular, no OS, no features
//! CREATE TABLE host_states (host_id TEXT PRIMARY KEY, state TEXT NOT NULL);
//! CREATE TABLE policy_hosts (host_id TEXT PRIMARY KEY, policy TEXT NOT NULL,
//!     state TEXT NOT NULL);                                            -- the policy's own JSON
//! CREATE TABLE migrations (vm_id TEXT PRIMARY KEY, target_host_id TEXT NOT NULL);  -- in flight
//! CREATE TABLE drain (id INTEGER PRIMARY KEY CHECK (id = 1), record TEXT NOT NULL); -- LARS, JSON
//! CREATE TABLE consolidation (id INTEGER PRIMARY KEY CHECK (id = 1), record TEXT NOT NULL); -- JSON
//! CREATE TABLE exits (                                   -- released VMs: the columns of `vms`, and
//!     start_s REAL NOT NULL,                             -- requested_at_s, else placed_at_s
//!     seq INTEGER NOT NULL, vm_id TEXT NOT NULL, ..., request TEXT,
//!     ended_at_s REAL NOT NULL,                          -- model clock
//!     PRIMARY KEY (start_s, seq)) WITHOUT ROWID;
//! CREATE TABLE rejections (vm_id TEXT PRIMARY KEY, at_s REAL NOT NULL,  -- Unix time
//!     rejection TEXT NOT NULL);                                          -- the answer, JSON
//! CREATE INDEX rejections_by_time ON rejections (at_s);
//! CREATE TABLE inventory (host_id TEXT PRIMARY KEY,  -- hosts added or changed while it ran (a
//!     entry TEXT);                                   -- domain::HostEntry as JSON), NULL: removed
//! ```
//!
//! Demands are kept in base units ([`Resources::base_units`]), so a restored VM demands exactly
//! what it demanded before.

use super::{
    entry_json,
    export::{ExportError, ExportHeader, ExportSink, ExportWindow, ExportedVm},
    parse_entry, parse_state, prediction_json, request_json, state_name, unix_now_s, StandingRejection, StoreError,
    StoredState, VmColumns, REJECTION_STANDS_S,
};
use domain::{HostEntry, HostId, Rejection, RequestDetails, VmId};
use placement::consolidation::Consolidation;
use placement::defrag::Drain;
use placement::journal::Change;
use rusqlite::{params, Connection, OpenFlags, OptionalExtension};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Version of the schema this code writes and reads.
pub const SCHEMA_VERSION: i64 = 9;

/// What to do about a store of a newer schema version than this code.
const NEWER_SCHEMA_FIX: &str = "run the release that wrote it, or move the file away to start from an empty store";

/// How long a write waits for a lock held by another connection (an operator's `sqlite3` shell, a
/// backup) before failing. The allocator itself uses one connection.
const BUSY_TIMEOUT: Duration = Duration::from_secs(2);

/// How an SQLite store is opened. The default is what the service runs with, and the
/// configuration cannot change it (`store = "<path>"` opens with the default); the rest exists for
/// tests ([`super::StoreLocation::SqliteWith`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SqliteOptions {
    /// The SQLite VFS the store's files are reached through (`None`: SQLite's default, `unix`).
    /// The power-loss test registers a fault-injecting one (`allocator/tests/power_loss/faulty_vfs.rs`).
    pub vfs: Option<String>,
    /// When a commit reaches the disk.
    pub synchronous: Synchronous,
}

/// SQLite's `synchronous` setting as the store uses it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Synchronous {
    /// `FULL`: the WAL is synced before a commit returns, so an acknowledged batch survives a
    /// power loss. The service's only setting.
    #[default]
    Full,
    /// `NORMAL` (in WAL mode the WAL is synced only at checkpoints): a commit returns, and its
    /// batch is acknowledged, before it is on disk, so a power loss loses the latest acknowledged
    /// batches. A deliberately weakened store, never the service's: the power-loss test uses it to
    /// show that its harness catches a store that acknowledges before syncing.
    Normal,
}

/// See the module documentation.
#[derive(Debug)]
pub struct SqliteStore {
    conn: Connection,
    path: PathBuf,
    /// Sequence number of the next placed VM.
    next_seq: i64,
    /// How exits are kept ([`super::ExitRetention`]), the newest exit this process wrote (model
    /// clock) and when exits were last pruned.
    retention: super::ExitRetention,
    newest_exit_s: f64,
    pruned_at: Option<Instant>,
}

impl SqliteStore {
    /// Opens the store at `path`, creating the file and its schema if needed.
    pub fn open(path: &Path) -> Result<Self, StoreError> {
        Self::open_with(path, &SqliteOptions::default())
    }

    /// [`SqliteStore::open`] through another VFS or with another `synchronous` setting (tests).
    pub fn open_with(path: &Path, options: &SqliteOptions) -> Result<Self, StoreError> {
        let conn = match &options.vfs {
            None => Connection::open(path),
            Some(vfs) => Connection::open_with_flags_and_vfs(path, OpenFlags::default(), vfs),
        }
        .map_err(|source| StoreError::Open { store: path.display().to_string(), source: source.into() })?;
        let mut store = SqliteStore {
            conn,
            path: path.to_owned(),
            next_seq: 1,
            retention: super::ExitRetention::default(),
            newest_exit_s: f64::NEG_INFINITY,
            pruned_at: None,
        };
        store.init(options.synchronous)?;
        Ok(store)
    }

    /// The file the store lives in.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn sql(&self, context: &'static str) -> impl FnOnce(rusqlite::Error) -> StoreError + '_ {
        move |source| StoreError::Sql { store: self.path.display().to_string(), context, source: source.into() }
    }

    fn init(&mut self, synchronous: Synchronous) -> Result<(), StoreError> {
        self.conn.busy_timeout(BUSY_TIMEOUT).map_err(self.sql("setting the busy timeout"))?;
        let mode: String = self
            .conn
            .query_row("PRAGMA journal_mode = WAL", [], |row| row.get(0))
            .map_err(self.sql("switching to the WAL journal"))?;
        if !mode.eq_ignore_ascii_case("wal") {
            return Err(StoreError::Sql {
                store: self.path.display().to_string(),
                context: "switching to the WAL journal",
                source: format!("journal mode stayed `{mode}`").into(),
            });
        }
        let synchronous = match synchronous {
            Synchronous::Full => "FULL",
            Synchronous::Normal => "NORMAL",
        };
        self.conn.pragma_update(None, "synchronous", synchronous).map_err(self.sql("setting synchronous"))?;
        let tables: i64 = self
            .conn
            .query_row(
                "SELECT COUNT(*) FROM sqlite_master WHERE type = 'table'
                 AND name IN ('meta', 'vms', 'host_states', 'policy_hosts', 'migrations', 'drain', 'exits',
                              'consolidation', 'rejections')",
                [],
                |row| row.get(0),
            )
            .map_err(self.sql("reading the schema"))?;
        // Creating or upgrading the schema takes the write lock; a current store is only read here.
        if tables < 9 || self.stored_version()? != Some(SCHEMA_VERSION) {
            self.upgrade()?;
        }
        self.read_meta()
    }

    /// The schema version the store records, if it has a `meta` table with one.
    fn stored_version(&self) -> Result<Option<i64>, StoreError> {
        let has_meta: i64 = self
            .conn
            .query_row("SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name = 'meta'", [], |row| {
                row.get(0)
            })
            .map_err(self.sql("reading the schema"))?;
        if has_meta == 0 {
            return Ok(None);
        }
        self.conn
            .query_row("SELECT value FROM meta WHERE key = 'schema_version'", [], |row| row.get(0))
            .map(Some)
            .or_else(|e| if e == rusqlite::Error::QueryReturnedNoRows { Ok(None) } else { Err(e) })
            .map_err(self.sql("reading the schema version"))
    }

    /// Creates the schema, or brings an older one to this version, in one transaction.
    fn upgrade(&mut self) -> Result<(), StoreError> {
        let path = &self.path.clone();
        let sql = |context: &'static str| {
            move |source: rusqlite::Error| StoreError::Sql {
                store: path.display().to_string(),
                context,
                source: source.into(),
            }
        };
        let tx = self
            .conn
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
            .map_err(sql("starting the schema upgrade"))?;
        tx.execute_batch(
            "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL);
             INSERT OR IGNORE INTO meta (key, value) VALUES ('schema_version', 6), ('next_seq', 1);",
        )
        .map_err(sql("creating the schema"))?;
        let found: i64 = tx
            .query_row("SELECT value FROM meta WHERE key = 'schema_version'", [], |row| row.get(0))
            .map_err(sql("reading the schema version"))?;
        if found > SCHEMA_VERSION {
            return Err(StoreError::SchemaVersion {
                store: path.display().to_string(),
                found,
                ours: SCHEMA_VERSION,
                fix: NEWER_SCHEMA_FIX,
            });
        }
        tx.execute_batch(
            "CREATE TABLE IF NOT EXISTS vms (
                 vm_id TEXT PRIMARY KEY,
                 seq INTEGER NOT NULL UNIQUE,
                 host_id TEXT NOT NULL,
                 tenant_id TEXT NOT NULL,
                 vm_type TEXT NOT NULL,
                 cores_base INTEGER NOT NULL,
                 memory_base INTEGER NOT NULL,
                 ssd_base INTEGER NOT NULL,
                 placed_at_s REAL NOT NULL,
                 prediction TEXT,
                 requested_at_s REAL,
                 request TEXT
             );
             CREATE TABLE IF NOT EXISTS host_states (host_id TEXT PRIMARY KEY, state TEXT NOT NULL);
             CREATE TABLE IF NOT EXISTS policy_hosts (
                 host_id TEXT PRIMARY KEY,
                 policy TEXT NOT NULL,
                 state TEXT NOT NULL
             );
             CREATE TABLE IF NOT EXISTS migrations (vm_id TEXT PRIMARY KEY, target_host_id TEXT NOT NULL);
             CREATE TABLE IF NOT EXISTS drain (id INTEGER PRIMARY KEY CHECK (id = 1), record TEXT NOT NULL);
             CREATE TABLE IF NOT EXISTS consolidation (id INTEGER PRIMARY KEY CHECK (id = 1), record TEXT NOT NULL);
             CREATE TABLE IF NOT EXISTS exits (
                 start_s REAL NOT NULL,
                 seq INTEGER NOT NULL,
                 vm_id TEXT NOT NULL,
                 host_id TEXT NOT NULL,
                 tenant_id TEXT NOT NULL,
                 vm_type TEXT NOT NULL,
                 cores_base INTEGER NOT NULL,
                 memory_base INTEGER NOT NULL,
                 ssd_base INTEGER NOT NULL,
                 placed_at_s REAL NOT NULL,
                 prediction TEXT,
                 requested_at_s REAL,
                 request TEXT,
                 ended_at_s REAL NOT NULL,
                 PRIMARY KEY (start_s, seq)
             ) WITHOUT ROWID;
             CREATE TABLE IF NOT EXISTS rejections (
                 vm_id TEXT PRIMARY KEY,
                 at_s REAL NOT NULL,
                 rejection TEXT NOT NULL
             );
             CREATE INDEX IF NOT EXISTS rejections_by_time ON rejections (at_s);
             CREATE TABLE IF NOT EXISTS inventory (host_id TEXT PRIMARY KEY, entry TEXT);",
        )
        .map_err(sql("creating the schema"))?;
        // Version 5: the request's time and facts. A `vms` table of an older version lacks them; its
        // rows keep NULL (no request time, default facts).
        let columns: Vec<String> = {
            let mut statement =
                tx.prepare("SELECT name FROM pragma_table_info('vms')").map_err(sql("reading the schema"))?;
            let rows = statement.query_map([], |row| row.get(0)).map_err(sql("reading the schema"))?;
            rows.collect::<Result<_, _>>().map_err(sql("reading the schema"))?
        };
        for (column, declaration) in [("requested_at_s", "requested_at_s REAL"), ("request", "request TEXT")] {
            if !columns.iter().any(|name| name == column) {
                tx.execute_batch(&format!("ALTER TABLE vms ADD COLUMN {declaration}"))
                    .map_err(sql("adding the request's columns"))?;
            }
        }
        let has_lava: i64 = tx
            .query_row("SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name = 'lava_hosts'", [], |row| {
                row.get(0)
            })
            .map_err(sql("reading the schema"))?;
        if has_lava > 0 {
            // Version 3 kept LAVA's state in columns of its own: each row becomes the same state as
            // the JSON that LAVA's snapshot is.
            let rows: Vec<(String, String, i64, Option<f64>, String)> = {
                let mut statement = tx
                    .prepare("SELECT host_id, state, class, deadline_s, residual_vms FROM lava_hosts ORDER BY host_id")
                    .map_err(sql("reading the LAVA host states"))?;
                let rows = statement
                    .query_map([], |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?, row.get(3)?, row.get(4)?)))
                    .map_err(sql("reading the LAVA host states"))?;
                rows.collect::<Result<_, _>>().map_err(sql("reading the LAVA host states"))?
            };
            for (host, state, class, deadline_s, residual) in rows {
                let corrupt = |detail: String| StoreError::CorruptLava {
                    store: path.display().to_string(),
                    host: host.clone(),
                    detail,
                };
                let residual: serde_json::Value =
                    serde_json::from_str(&residual).map_err(|e| corrupt(format!("unreadable residual VMs: {e}")))?;
                let mut json = serde_json::json!({"state": state, "class": class, "residual_vms": residual});
                if let Some(deadline) = deadline_s {
                    json["deadline_s"] = serde_json::Value::from(deadline);
                }
                tx.execute(
                    "INSERT OR REPLACE INTO policy_hosts (host_id, policy, state) VALUES (?1, 'lava', ?2)",
                    params![host, json.to_string()],
                )
                .map_err(sql("moving the LAVA host states"))?;
            }
            tx.execute_batch("DROP TABLE lava_hosts").map_err(sql("moving the LAVA host states"))?;
        }
        tx.execute("UPDATE meta SET value = ?1 WHERE key = 'schema_version'", params![SCHEMA_VERSION])
            .map_err(sql("recording the schema version"))?;
        tx.commit().map_err(sql("committing the schema upgrade"))
    }

    fn read_meta(&mut self) -> Result<(), StoreError> {
        let version: i64 = self
            .conn
            .query_row("SELECT value FROM meta WHERE key = 'schema_version'", [], |row| row.get(0))
            .map_err(self.sql("reading the schema version"))?;
        if version != SCHEMA_VERSION {
            return Err(StoreError::SchemaVersion {
                store: self.path.display().to_string(),
                found: version,
                ours: SCHEMA_VERSION,
                fix: NEWER_SCHEMA_FIX,
            });
        }
        let next: i64 = self
            .conn
            .query_row("SELECT value FROM meta WHERE key = 'next_seq'", [], |row| row.get(0))
            .map_err(self.sql("reading the next sequence number"))?;
        let max: Option<i64> = self
            .conn
            .query_row("SELECT MAX(seq) FROM vms", [], |row| row.get(0))
            .map_err(self.sql("reading the last sequence number"))?;
        self.next_seq = next.max(max.map_or(1, |m| m + 1));
        Ok(())
    }

    /// Every placed VM in placement order, and every recorded host state.
    pub fn load(&self) -> Result<StoredState, StoreError> {
        let mut statement = self
            .conn
            .prepare(
                "SELECT seq, vm_id, host_id, tenant_id, vm_type, cores_base, memory_base, ssd_base, placed_at_s,
                        prediction, requested_at_s, request
                 FROM vms ORDER BY seq",
            )
            .map_err(self.sql("reading the placed VMs"))?;
        let rows = statement.query_map([], |row| vm_columns(row, 0)).map_err(self.sql("reading the placed VMs"))?;
        let mut vms = Vec::new();
        for row in rows {
            let columns = row.map_err(self.sql("reading the placed VMs"))?;
            vms.push(columns.decode(&self.path.display().to_string())?);
        }
        let mut statement = self
            .conn
            .prepare("SELECT host_id, state FROM host_states ORDER BY host_id")
            .map_err(self.sql("reading the host states"))?;
        let rows = statement
            .query_map([], |row| Ok((row.get::<_, String>(0)?, row.get::<_, String>(1)?)))
            .map_err(self.sql("reading the host states"))?;
        let mut host_states = Vec::new();
        for row in rows {
            let (host, state) = row.map_err(self.sql("reading the host states"))?;
            let parsed = parse_state(&state).ok_or_else(|| StoreError::CorruptHostState {
                store: self.path.display().to_string(),
                host: host.clone(),
                state,
            })?;
            host_states.push((HostId(host), parsed));
        }
        Ok(StoredState {
            vms,
            host_states,
            policy_hosts: self.load_policy_hosts()?,
            migrations: self.load_migrations()?,
            drain: self.load_drain()?,
            consolidation: self.load_consolidation()?,
            rejections: self.load_rejections()?,
            inventory: self.load_inventory()?,
        })
    }

    /// The hosts added, changed or removed while the allocator ran, in the order last written.
    fn load_inventory(&self) -> Result<Vec<(HostId, Option<HostEntry>)>, StoreError> {
        let mut statement = self
            .conn
            .prepare("SELECT host_id, entry FROM inventory ORDER BY rowid")
            .map_err(self.sql("reading the inventory"))?;
        let rows = statement
            .query_map([], |row| Ok((HostId(row.get(0)?), row.get::<_, Option<String>>(1)?)))
            .map_err(self.sql("reading the inventory"))?;
        let mut inventory = Vec::new();
        for row in rows {
            let (host, entry) = row.map_err(self.sql("reading the inventory"))?;
            let entry = entry.map(|json| parse_entry(&self.path.display().to_string(), &host, &json)).transpose()?;
            inventory.push((host, entry));
        }
        Ok(inventory)
    }

    /// The rejections of the last [`REJECTION_STANDS_S`] by the wall clock.
    fn load_rejections(&self) -> Result<Vec<StandingRejection>, StoreError> {
        let now = unix_now_s();
        let mut statement = self
            .conn
            .prepare("SELECT vm_id, at_s, rejection FROM rejections WHERE at_s > ?1 ORDER BY at_s")
            .map_err(self.sql("reading the rejections"))?;
        let rows = statement
            .query_map([now - REJECTION_STANDS_S], |row| {
                Ok((row.get::<_, String>(0)?, row.get::<_, f64>(1)?, row.get::<_, String>(2)?))
            })
            .map_err(self.sql("reading the rejections"))?;
        let mut standing = Vec::new();
        for row in rows {
            let (vm, at_s, json) = row.map_err(self.sql("reading the rejections"))?;
            let rejection = serde_json::from_str(&json).map_err(|e| StoreError::CorruptVm {
                store: self.path.display().to_string(),
                vm: vm.clone(),
                detail: format!("unreadable rejection: {e}"),
            })?;
            standing.push(StandingRejection { vm: VmId(vm), age_s: (now - at_s).max(0.0), rejection: Some(rejection) });
        }
        Ok(standing)
    }

    fn load_migrations(&self) -> Result<Vec<(VmId, HostId)>, StoreError> {
        let mut statement = self
            .conn
            .prepare("SELECT vm_id, target_host_id FROM migrations ORDER BY vm_id")
            .map_err(self.sql("reading the migrations"))?;
        let rows = statement
            .query_map([], |row| Ok((VmId(row.get(0)?), HostId(row.get(1)?))))
            .map_err(self.sql("reading the migrations"))?;
        rows.collect::<Result<_, _>>().map_err(self.sql("reading the migrations"))
    }

    fn load_drain(&self) -> Result<Option<Drain>, StoreError> {
        let record: Option<String> = self
            .conn
            .query_row("SELECT record FROM drain WHERE id = 1", [], |row| row.get(0))
            .map(Some)
            .or_else(|e| if e == rusqlite::Error::QueryReturnedNoRows { Ok(None) } else { Err(e) })
            .map_err(self.sql("reading the drain"))?;
        record
            .map(|json| serde_json::from_str(&json))
            .transpose()
            .map_err(|e| StoreError::CorruptDrain { store: self.path.display().to_string(), detail: e.to_string() })
    }

    fn load_consolidation(&self) -> Result<Option<Consolidation>, StoreError> {
        let record: Option<String> = self
            .conn
            .query_row("SELECT record FROM consolidation WHERE id = 1", [], |row| row.get(0))
            .optional()
            .map_err(self.sql("reading the consolidation"))?;
        record.map(|json| serde_json::from_str(&json)).transpose().map_err(|e| StoreError::CorruptConsolidation {
            store: self.path.display().to_string(),
            detail: e.to_string(),
        })
    }

    fn load_policy_hosts(&self) -> Result<Vec<(HostId, String, String)>, StoreError> {
        let mut statement = self
            .conn
            .prepare("SELECT host_id, policy, state FROM policy_hosts ORDER BY host_id")
            .map_err(self.sql("reading the policy host states"))?;
        let rows = statement
            .query_map([], |row| Ok((HostId(row.get(0)?), row.get(1)?, row.get(2)?)))
            .map_err(self.sql("reading the policy host states"))?;
        rows.collect::<Result<_, _>>().map_err(self.sql("reading the policy host states"))
    }

    /// See [`super::PlacementStore::policy_states`].
    pub fn policy_states(&self, hosts: &[HostId]) -> Result<Vec<(HostId, String, String)>, StoreError> {
        let mut statement = self
            .conn
            .prepare_cached("SELECT policy, state FROM policy_hosts WHERE host_id = ?1")
            .map_err(self.sql("reading the policy host states"))?;
        let mut states = Vec::new();
        for host in hosts {
            let row = statement
                .query_row([host.as_str()], |row| Ok((row.get::<_, String>(0)?, row.get::<_, String>(1)?)))
                .optional()
                .map_err(self.sql("reading the policy host states"))?;
            if let Some((policy, state)) = row {
                states.push((host.clone(), policy, state));
            }
        }
        Ok(states)
    }

    /// Writes `changes` in order, in one transaction: after `Ok` all of them are durable, after
    /// `Err` none of them is. `policy_state` gives a host's policy-state snapshot as the changes
    /// were taken ([`placement::Allocator::policy_host_snapshot`]; `None`: its initial state).
    pub fn apply(
        &mut self,
        changes: &[Change],
        policy_state: &dyn Fn(&HostId) -> Option<String>,
    ) -> Result<(), StoreError> {
        self.apply_decisions(changes, &[], policy_state)
    }

    /// [`SqliteStore::apply`] that also records the `rejected` answers (each VM id with its
    /// answer) in the same transaction.
    pub fn apply_decisions(
        &mut self,
        changes: &[Change],
        rejected: &[(VmId, Rejection)],
        policy_state: &dyn Fn(&HostId) -> Option<String>,
    ) -> Result<(), StoreError> {
        if changes.is_empty() && rejected.is_empty() {
            return Ok(());
        }
        let path = &self.path;
        let sql = |context: &'static str| {
            move |source: rusqlite::Error| StoreError::Sql {
                store: path.display().to_string(),
                context,
                source: source.into(),
            }
        };
        let store = path.display().to_string();
        let rejections = rejected
            .iter()
            .map(|(vm, rejection)| {
                let json = serde_json::to_string(rejection).map_err(|e| StoreError::CorruptVm {
                    store: store.clone(),
                    vm: vm.to_string(),
                    detail: format!("rejection cannot be written: {e}"),
                })?;
                Ok((vm, json))
            })
            .collect::<Result<Vec<_>, StoreError>>()?;
        let tx = self.conn.transaction().map_err(sql("starting a transaction"))?;
        let mut next_seq = self.next_seq;
        let mut newest_exit_s = self.newest_exit_s;
        {
            let mut place = tx
                .prepare_cached(
                    "INSERT INTO vms (vm_id, seq, host_id, tenant_id, vm_type, cores_base, memory_base, ssd_base,
                                      placed_at_s, prediction, requested_at_s, request)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)",
                )
                .map_err(sql("recording a placement"))?;
            let mut exit = tx
                .prepare_cached(
                    "INSERT INTO exits (start_s, seq, vm_id, host_id, tenant_id, vm_type, cores_base, memory_base,
                                        ssd_base, placed_at_s, prediction, requested_at_s, request, ended_at_s)
                     SELECT COALESCE(requested_at_s, placed_at_s), seq, vm_id, host_id, tenant_id, vm_type,
                            cores_base, memory_base, ssd_base, placed_at_s, prediction, requested_at_s, request, ?2
                     FROM vms WHERE vm_id = ?1",
                )
                .map_err(sql("recording an exit"))?;
            let mut release =
                tx.prepare_cached("DELETE FROM vms WHERE vm_id = ?1").map_err(sql("recording a release"))?;
            let mut host_state = tx
                .prepare_cached("INSERT OR REPLACE INTO host_states (host_id, state) VALUES (?1, ?2)")
                .map_err(sql("recording a host state"))?;
            let mut policy_host = tx
                .prepare_cached("INSERT OR REPLACE INTO policy_hosts (host_id, policy, state) VALUES (?1, ?2, ?3)")
                .map_err(sql("recording a policy host state"))?;
            let mut migration_start = tx
                .prepare_cached("INSERT OR REPLACE INTO migrations (vm_id, target_host_id) VALUES (?1, ?2)")
                .map_err(sql("recording a migration"))?;
            let mut migration_end =
                tx.prepare_cached("DELETE FROM migrations WHERE vm_id = ?1").map_err(sql("recording a migration"))?;
            let mut moved = tx
                .prepare_cached("UPDATE vms SET host_id = ?2 WHERE vm_id = ?1")
                .map_err(sql("recording a migration"))?;
            let mut policy_host_initial = tx
                .prepare_cached("DELETE FROM policy_hosts WHERE host_id = ?1")
                .map_err(sql("recording a policy host state"))?;
            for change in changes {
                match change {
                    Change::Placed { vm, host } => {
                        let prediction = prediction_json(vm, &store)?;
                        let request = request_json(vm, &store)?;
                        let units = vm.facts.demand.base_units().map(|u| i64::try_from(u).unwrap_or(i64::MAX));
                        place
                            .execute(params![
                                vm.id.as_str(),
                                next_seq,
                                host.as_str(),
                                vm.facts.tenant_id.as_str(),
                                vm.facts.vm_type,
                                units[0],
                                units[1],
                                units[2],
                                vm.placed_at_s,
                                prediction,
                                vm.facts.requested_at_s,
                                request,
                            ])
                            .map_err(sql("recording a placement"))?;
                        next_seq += 1;
                    }
                    Change::Released { vm, ended_at_s, .. } => {
                        exit.execute(params![vm.as_str(), ended_at_s]).map_err(sql("recording an exit"))?;
                        release.execute(params![vm.as_str()]).map_err(sql("recording a release"))?;
                        newest_exit_s = newest_exit_s.max(*ended_at_s);
                    }
                    Change::Resized { vm, .. } => {
                        let units = vm.facts.demand.base_units().map(|u| i64::try_from(u).unwrap_or(i64::MAX));
                        tx.prepare_cached(
                            "UPDATE vms SET vm_type = ?2, cores_base = ?3, memory_base = ?4, ssd_base = ?5
                             WHERE vm_id = ?1",
                        )
                        .and_then(|mut resize| {
                            resize.execute(params![vm.id.as_str(), vm.facts.vm_type, units[0], units[1], units[2]])
                        })
                        .map_err(sql("recording a resize"))?;
                    }
                    Change::HostState { host, state, .. } => {
                        host_state
                            .execute(params![host.as_str(), state_name(*state)])
                            .map_err(sql("recording a host state"))?;
                    }
                    Change::MigrationStarted { vm, target } => {
                        migration_start
                            .execute(params![vm.as_str(), target.as_str()])
                            .map_err(sql("recording a migration"))?;
                    }
                    Change::MigrationCompleted { vm, target } => {
                        migration_end.execute(params![vm.as_str()]).map_err(sql("recording a migration"))?;
                        moved.execute(params![vm.as_str(), target.as_str()]).map_err(sql("recording a migration"))?;
                    }
                    Change::MigrationCancelled { vm } => {
                        migration_end.execute(params![vm.as_str()]).map_err(sql("recording a migration"))?;
                    }
                    Change::Drain(drain) => {
                        let record = drain.as_ref().map(serde_json::to_string).transpose().map_err(|e| {
                            StoreError::CorruptDrain { store: path.display().to_string(), detail: e.to_string() }
                        })?;
                        write_record(&tx, "drain", record).map_err(sql("recording the drain"))?;
                    }
                    Change::Consolidation(consolidation) => {
                        let record = consolidation.as_ref().map(serde_json::to_string).transpose().map_err(|e| {
                            StoreError::CorruptConsolidation {
                                store: path.display().to_string(),
                                detail: e.to_string(),
                            }
                        })?;
                        write_record(&tx, "consolidation", record).map_err(sql("recording the consolidation"))?;
                    }
                    Change::PolicyHostState { host, policy } => {
                        match policy_state(host) {
                            None => policy_host_initial.execute(params![host.as_str()]),
                            Some(state) => policy_host.execute(params![host.as_str(), policy, state]),
                        }
                        .map_err(sql("recording a policy host state"))?;
                    }
                    Change::HostInventory { host, entry } => write_entry(&tx, host, entry.as_ref(), &store)?,
                }
            }
        }
        if !rejected.is_empty() {
            record_rejections(&tx, &rejections).map_err(sql("recording the rejections"))?;
        }
        if next_seq != self.next_seq {
            // Cached: parsing the statement afresh was a tenth of the worker's CPU per batch.
            tx.prepare_cached("UPDATE meta SET value = ?1 WHERE key = 'next_seq'")
                .and_then(|mut advance| advance.execute(params![next_seq]))
                .map_err(sql("advancing the sequence"))?;
        }
        tx.commit().map_err(sql("committing"))?;
        self.next_seq = next_seq;
        self.newest_exit_s = newest_exit_s;
        if self.retention.due(self.pruned_at, self.newest_exit_s) {
            // A transaction of its own: a failure here costs the batch nothing (the next try is a
            // minute later).
            self.pruned_at = Some(Instant::now());
            if let Err(error) = self.prune_exits() {
                tracing::warn!(%error, "pruning the exits table failed; trying again in a minute");
            }
        }
        Ok(())
    }

    /// Keeps exits as `retention` says from now on.
    pub fn set_exit_retention(&mut self, retention: super::ExitRetention) {
        self.retention = retention;
    }

    /// Deletes the exits that ended more than the retention before the newest exit this process
    /// wrote; answers how many. The table is keyed by start, and an exit never ends before it
    /// starts, so only the rows that started before the cut-off are read.
    pub fn prune_exits(&mut self) -> Result<usize, StoreError> {
        let Some(cutoff) = self.retention.cutoff(self.newest_exit_s) else { return Ok(0) };
        let deleted = self
            .conn
            .execute("DELETE FROM exits WHERE start_s < ?1 AND ended_at_s < ?1", params![cutoff])
            .map_err(self.sql("pruning the exits"))?;
        if deleted > 0 {
            tracing::info!(deleted, cutoff_s = cutoff, "pruned exits past their retention");
        }
        Ok(deleted)
    }
}

/// Records the rejections `rejected` (each VM with its answer as JSON) at the wall clock's time and
/// forgets those that no longer stand.
fn record_rejections(tx: &rusqlite::Transaction<'_>, rejected: &[(&VmId, String)]) -> rusqlite::Result<()> {
    let now = unix_now_s();
    let mut insert =
        tx.prepare_cached("INSERT OR REPLACE INTO rejections (vm_id, at_s, rejection) VALUES (?1, ?2, ?3)")?;
    for (vm, json) in rejected {
        insert.execute(params![vm.as_str(), now, json])?;
    }
    tx.prepare_cached("DELETE FROM rejections WHERE at_s <= ?1")?.execute(params![now - REJECTION_STANDS_S])?;
    Ok(())
}

/// The columns an export reads of `vms` and `exits`: the start on the model's clock, then
/// [`VmColumns`] without the prediction (a trace has none), then the end (NULL: still running).
const EXPORT_COLUMNS: &str = "seq, vm_id, host_id, tenant_id, vm_type, cores_base, memory_base, ssd_base, placed_at_s,
                              NULL, requested_at_s, request";

fn export_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<(f64, VmColumns, Option<f64>)> {
    Ok((row.get(0)?, vm_columns(row, 1)?, row.get(13)?))
}

/// A VM's columns, in `vms` order (`seq` .. `request`), from column `at` of `row` on.
fn vm_columns(row: &rusqlite::Row<'_>, at: usize) -> rusqlite::Result<VmColumns> {
    Ok(VmColumns {
        seq: row.get(at)?,
        vm_id: row.get(at + 1)?,
        host_id: row.get(at + 2)?,
        tenant_id: row.get(at + 3)?,
        vm_type: row.get(at + 4)?,
        base: [row.get(at + 5)?, row.get(at + 6)?, row.get(at + 7)?],
        placed_at_s: row.get(at + 8)?,
        prediction: row.get(at + 9)?,
        requested_at_s: row.get(at + 10)?,
        request: row.get(at + 11)?,
    })
}

/// Exports the VMs of the store at `path` that started in `window` ([`super::export`]): a
/// connection of its own, read only, in one read transaction (a snapshot: a VM released meanwhile
/// is read once, running or exited), while the allocator goes on writing (WAL).
pub fn export(
    path: &Path,
    vfs: Option<&str>,
    window: &ExportWindow,
    sink: &mut dyn ExportSink,
) -> Result<u64, ExportError> {
    let name = path.display().to_string();
    let sql = |context: &'static str| {
        let name = name.clone();
        move |source: rusqlite::Error| StoreError::Sql { store: name, context, source: source.into() }
    };
    let flags = OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX | OpenFlags::SQLITE_OPEN_URI;
    let mut conn = match vfs {
        None => Connection::open_with_flags(path, flags),
        Some(vfs) => Connection::open_with_flags_and_vfs(path, flags, vfs),
    }
    .map_err(|source| StoreError::Open { store: name.clone(), source: source.into() })?;
    conn.busy_timeout(BUSY_TIMEOUT).map_err(sql("setting the busy timeout"))?;
    let tx = conn.transaction().map_err(sql("starting to read the export"))?;
    let (from, to) = (window.from_s, window.to_s);
    const RUNNING: &str = "FROM vms WHERE COALESCE(requested_at_s, placed_at_s) >= ?1
                           AND COALESCE(requested_at_s, placed_at_s) < ?2";
    const EXITED: &str = "FROM exits WHERE start_s >= ?1 AND start_s < ?2";
    // The header first: how many rows, the names of the details they hold, the feature names (in
    // SQL: the rows' JSON is never parsed here).
    let count = |from_where: &str| -> Result<u64, StoreError> {
        tx.query_row(&format!("SELECT COUNT(*) {from_where}"), params![from, to], |row| row.get::<_, i64>(0))
            .map(|n| n.max(0) as u64)
            .map_err(sql("counting the export's rows"))
    };
    let rows = count(RUNNING)? + count(EXITED)?;
    // The keys of the rows' request JSON at `path` (`$`: the details' names; `$.features`).
    let keys = |path: &str, limit: usize, context: &'static str| -> Result<Vec<String>, StoreError> {
        let mut statement = tx
            .prepare(&format!(
                "SELECT f.key FROM vms, json_each(vms.request, '{path}') AS f
                     WHERE vms.request IS NOT NULL AND COALESCE(requested_at_s, placed_at_s) >= ?1
                       AND COALESCE(requested_at_s, placed_at_s) < ?2
                 UNION
                 SELECT f.key FROM exits, json_each(exits.request, '{path}') AS f
                     WHERE exits.request IS NOT NULL AND start_s >= ?1 AND start_s < ?2
                 LIMIT {limit}"
            ))
            .map_err(sql(context))?;
        let names = statement.query_map(params![from, to], |row| row.get(0)).map_err(sql(context))?;
        names.collect::<Result<_, _>>().map_err(sql(context))
    };
    let details = keys("$", RequestDetails::names().len(), "reading the export's detail names")?;
    let features = keys("$.features", super::export::MAX_FEATURE_COLUMNS + 1, "reading the export's feature names")?;
    sink.header(&ExportHeader::new(window, rows, details, features)?)?;
    let mut running = tx
        .prepare(&format!(
            "SELECT COALESCE(requested_at_s, placed_at_s), {EXPORT_COLUMNS}, NULL {RUNNING}
             ORDER BY COALESCE(requested_at_s, placed_at_s), seq"
        ))
        .map_err(sql("reading the running VMs"))?;
    let mut exited = tx
        .prepare(&format!("SELECT start_s, {EXPORT_COLUMNS}, ended_at_s {EXITED} ORDER BY start_s, seq"))
        .map_err(sql("reading the exits"))?;
    let decode = |row: rusqlite::Result<(f64, VmColumns, Option<f64>)>,
                  context: &'static str|
     -> Result<ExportedVm, ExportError> {
        let (start_s, columns, ended_at_s) = row.map_err(sql(context))?;
        let seq = columns.seq;
        Ok(ExportedVm { start_s, seq, vm: columns.decode(&name)?.vm, ended_at_s })
    };
    let running = running
        .query_map(params![from, to], export_row)
        .map_err(sql("reading the running VMs"))?
        .map(|row| decode(row, "reading the running VMs"));
    let exited = exited
        .query_map(params![from, to], export_row)
        .map_err(sql("reading the exits"))?
        .map(|row| decode(row, "reading the exits"));
    super::export::merge(running, exited, window.max_rows, sink)
}

/// Writes a one-row record table (`drain`, `consolidation`): the record's JSON, or no row.
/// Writes a host added or changed (`entry`) or removed (`None`; its state rows go with it).
fn write_entry(
    tx: &rusqlite::Transaction<'_>,
    host: &HostId,
    entry: Option<&HostEntry>,
    store: &str,
) -> Result<(), StoreError> {
    let sql = |source: rusqlite::Error| StoreError::Sql {
        store: store.to_owned(),
        context: "recording the inventory",
        source: source.into(),
    };
    let json = entry.map(|entry| entry_json(entry, store)).transpose()?;
    // Deleted first: a host changed again moves to the end of the order.
    tx.execute("DELETE FROM inventory WHERE host_id = ?1", params![host.as_str()]).map_err(sql)?;
    tx.execute("INSERT INTO inventory (host_id, entry) VALUES (?1, ?2)", params![host.as_str(), json]).map_err(sql)?;
    if entry.is_none() {
        tx.execute("DELETE FROM host_states WHERE host_id = ?1", params![host.as_str()]).map_err(sql)?;
        tx.execute("DELETE FROM policy_hosts WHERE host_id = ?1", params![host.as_str()]).map_err(sql)?;
    }
    Ok(())
}

fn write_record(
    tx: &rusqlite::Transaction<'_>,
    table: &'static str,
    record: Option<String>,
) -> rusqlite::Result<usize> {
    match record {
        Some(record) => {
            tx.execute(&format!("INSERT OR REPLACE INTO {table} (id, record) VALUES (1, ?1)"), params![record])
        }
        None => tx.execute(&format!("DELETE FROM {table}"), []),
    }
}

#[cfg(test)]
mod tests;
