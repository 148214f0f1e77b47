//! The PostgreSQL store (`store = "postgres://user@host:port/database"`): the placement store that
//! several allocation agents of one zone can share (SPEC section 8, paper 001 s4-5).
//!
//! The database itself refuses what would break the inventory, whatever an agent believes: every
//! host is a row with its capacity and what is used of it, under a `CHECK` that no dimension is
//! ever over-committed, and a VM id is the primary key of `vms`, so a second placement of it fails.
//! Such a refusal is [`StoreError::Refused`] and rolls the whole batch back. The hosts are seeded
//! from the inventory when the store is opened; a host whose capacity shrank below what its VMs use
//! is refused by the same check, naming the host.
//!
//! Only SQL that PostgreSQL-wire distributed databases also accept: no advisory locks, no
//! `LISTEN`, no server-side functions.
//!
//! Schema (version 4, in `meta`), demands and capacities in base units ([`Resources::base_units`]).
//! An older store is upgraded when opened, in the schema transaction: the `vms` of version 1 gain
//! the request's columns (`ALTER TABLE ... ADD COLUMN IF NOT EXISTS`), NULL in the rows they hold
//! (no request time, default request facts), versions 1 and 2 gain the (empty) `exits` table, and
//! versions 1 to 3 the (empty) `rejections` table.
//!
//! **Exits.** A release moves the VM's row from `vms` to `exits` in the batch's transaction (one
//! statement: `DELETE ... RETURNING` feeding an `INSERT`), with when it ended on the model's clock,
//! for the trace export ([`super::export`]). `exits` is keyed by the VM's start on the model's clock
//! (an export reads it in order, pruning reads only old rows); at most once a minute each agent
//! deletes the exits that ended more than the retention before the newest exit it wrote.
//!
//! ```sql
//! CREATE TABLE meta (key TEXT PRIMARY KEY, value BIGINT NOT NULL);          -- schema_version
//! CREATE TABLE hosts (
//!     host_id TEXT PRIMARY KEY,
//!     cores_cap BIGINT NOT NULL, memory_cap BIGINT NOT NULL, ssd_cap BIGINT NOT NULL,
//!     cores_used BIGINT NOT NULL DEFAULT 0, memory_used BIGINT NOT NULL DEFAULT 0,
//!     ssd_used BIGINT NOT NULL DEFAULT 0,
//!     state TEXT,                       -- set by an operator or a drain; NULL: the inventory's
//!     policy TEXT, policy_state TEXT,   -- a stateful policy's own JSON; NULL: its initial state
//!     CONSTRAINT hosts_never_over_committed CHECK (
//!         cores_used BETWEEN 0 AND cores_cap AND memory_used BETWEEN 0 AND memory_cap
//!         AND ssd_used BETWEEN 0 AND ssd_cap));
//! CREATE SEQUENCE vm_seq;                                                  -- placement order
//! CREATE TABLE vms (vm_id TEXT PRIMARY KEY, seq BIGINT NOT NULL UNIQUE,
//!     host_id TEXT NOT NULL REFERENCES hosts (host_id), tenant_id TEXT NOT NULL,
//!     vm_type TEXT NOT NULL, cores_base BIGINT NOT NULL, memory_base BIGINT NOT NULL,
//!     ssd_base BIGINT NOT NULL, placed_at_s DOUBLE PRECISION NOT NULL,     -- the allocator's clock
//!     prediction TEXT,                                                     -- as JSON
//!     requested_at_s DOUBLE PRECISION,                                     -- the request's, model clock
//!     request TEXT);           -- {priority, os, features} as JSON; NULL: regular, no OS, no features
//! CREATE TABLE migrations (vm_id TEXT PRIMARY KEY,                        -- in flight, with the
//!     target_host_id TEXT NOT NULL REFERENCES hosts (host_id),             -- demand reserved on
//!     cores_base BIGINT NOT NULL, memory_base BIGINT NOT NULL, ssd_base BIGINT NOT NULL); -- it
//! CREATE TABLE drain (id INTEGER PRIMARY KEY CHECK (id = 1), record TEXT NOT NULL);
//! CREATE TABLE log_head (id INTEGER PRIMARY KEY CHECK (id = 1), seq BIGINT NOT NULL);
//! CREATE TABLE changes (seq BIGINT PRIMARY KEY, agent TEXT NOT NULL, body TEXT NOT NULL);
//! CREATE TABLE rejections (vm_id TEXT PRIMARY KEY, seq BIGINT NOT NULL,  -- ids answered "rejected",
//!     at TIMESTAMPTZ NOT NULL DEFAULT now());                             -- at a log position
//! CREATE INDEX rejections_by_seq ON rejections (seq);
//! CREATE TABLE exits (start_s DOUBLE PRECISION NOT NULL,                 -- requested_at_s, else
//!     seq BIGINT NOT NULL, vm_id TEXT NOT NULL, ..., request TEXT,         -- placed_at_s; the
//!     ended_at_s DOUBLE PRECISION NOT NULL,                                -- columns of vms
//!     PRIMARY KEY (start_s, seq));
//! ```
//!
//! **The change log.** Every committed batch is one row of `changes`: the agent that wrote it and
//! its changes as [`LoggedChange`]s (JSON; a placement carries the whole VM record, its request's
//! time and facts included, so a following agent holds what the tables hold). Its number comes from `log_head`, taken as the last
//! statement of the batch's transaction: the row lock serialises the commits' ends, so the log's
//! order is the commit order and an agent that has read up to `seq` has missed nothing before it.
//! Each agent follows the rows it has not applied before it decides ([`PostgresStore::follow`]);
//! the state it loads comes with the log position it reflects. Its own batch committed right after
//! that position is applied already and skipped; one committed after other agents' rows it had not
//! read is taken back in memory and applied again from the log, in the store's order
//! ([`super::Committed`]). Rows are kept for [`LOG_KEPT`] batches; an agent further behind finds a
//! gap and rebuilds from the tables.
//!
//! **Rejections** ([`PostgresStore::apply_decisions`]). The same VM id can reach two agents at once
//! (a client's retry on another agent after a timeout), and their views may differ: one may reject
//! it while the other places it. A batch that answers requests "rejected" records their ids in
//! `rejections` at its log position, in the statement that moves the head; a batch with no write
//! is that one statement alone. The same statement reads which of the rejected ids are placed
//! (the batch is refused: decided again after following, the answer is that placement, replayed)
//! and which of the placed ids another agent rejected after this agent's view, or less than
//! [`REJECTION_STANDS_S`] ago ([`StoreError::RejectedElsewhere`]: the batch is refused, and those
//! requests are answered rejected, the first answer). Every commit holds the head's row lock from
//! that statement to its end, so what committed before it is exactly what it must see: its own
//! snapshot when the head moved by one only, else a second read (`decided_meanwhile`).
//! Rejections are trimmed with the log, once they no longer stand.

use super::export::{ExportError, ExportHeader, ExportSink, ExportWindow, ExportedVm};
use super::{
    parse_state, prediction_json, request_json, state_name, Committed, ExitRetention, Followed, StoreError,
    StoredState, VmColumns,
};
use domain::{HostId, InventorySpec, Resources, VmId, RESOURCE_DIMS};
use placement::journal::{Change, LoggedChange};
use postgres::error::SqlState;
use postgres::{Client, NoTls, Statement, Transaction};
use std::collections::BTreeMap;

/// Version of the schema this code writes and reads.
pub const SCHEMA_VERSION: i64 = 4;

const NEWER_SCHEMA_FIX: &str =
    "run the release that wrote it, or point `store` at a database of its own for this release";

/// How many hosts one statement seeds.
const SEED_CHUNK: usize = 500;

/// An agent counts as active while one of the last this many batches of the change log is its.
const ACTIVE_BATCHES: i64 = 1000;

/// How many batches the change log keeps.
pub const LOG_KEPT: i64 = 100_000;

/// How long (seconds, on the database's clock) an agent's "rejected" answer for a VM id stands
/// against placements of the same id by other agents: a client that timed out on one agent and
/// retried on another sends the same request twice at about the same time, and whichever answer
/// the store records first is the answer to both. Past it, a request for the id is decided afresh.
pub const REJECTION_STANDS_S: f64 = 30.0;

/// See the module documentation.
pub struct PostgresStore {
    client: Client,
    /// The URL with its password hidden, for messages.
    name: String,
    /// This agent's name in the change log (unique per process start).
    pub(crate) agent: String,
    /// The last change-log row this agent's view reflects.
    followed: i64,
    statements: Statements,
    /// The agents whose batches this one followed, with the last row of each.
    seen: std::collections::HashMap<String, i64>,
    /// How exits are kept, the newest exit this agent wrote (model clock) and when it last pruned.
    retention: ExitRetention,
    newest_exit_s: f64,
    pruned_at: Option<std::time::Instant>,
}

impl std::fmt::Debug for PostgresStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresStore").field("store", &self.name).finish_non_exhaustive()
    }
}

/// `url` with the password (if any) replaced by `***`: the one in the credentials and a `password`
/// parameter. A URL may name several hosts (`postgres://u:p@h1:5432,h2:5432/db?target_session_attrs=read-write`,
/// a primary and its standbys); they are kept, as are the other parameters.
pub fn redact(url: &str) -> String {
    let Some(scheme_end) = url.find("://").map(|i| i + 3) else { return url.to_owned() };
    let rest = &url[scheme_end..];
    let mut redacted = match rest.find('@') {
        // The driver reads the credentials up to the first `@`. A password with an unencoded `@`
        // of its own is hidden up to the authority's last `@` (before the path or the parameters,
        // which may hold an `@` too), to err on the side of hiding.
        Some(first) => {
            let authority_end = rest[first..].find(['/', '?']).map_or(rest.len(), |i| first + i);
            let at = rest[..authority_end].rfind('@').unwrap_or(first);
            match rest[..first].find(':') {
                Some(colon) => format!("{}{}:***{}", &url[..scheme_end], &rest[..colon], &rest[at..]),
                None => url.to_owned(),
            }
        }
        None => url.to_owned(),
    };
    if let Some(query) = redacted.find('?') {
        let params: Vec<String> = redacted[query + 1..]
            .split('&')
            .map(|param| match param.split_once('=') {
                Some((key, _)) if key == "password" => format!("{key}=***"),
                _ => param.to_owned(),
            })
            .collect();
        redacted = format!("{}?{}", &redacted[..query], params.join("&"));
    }
    redacted
}

fn units(resources: &Resources) -> [i64; RESOURCE_DIMS] {
    resources.base_units().map(|u| i64::try_from(u).unwrap_or(i64::MAX))
}

impl PostgresStore {
    /// Connects, creates or checks the schema, and seeds the inventory's hosts.
    pub fn open(url: &str, inventory: &InventorySpec) -> Result<Self, StoreError> {
        let name = redact(url);
        let open_error =
            |source: postgres::Error| StoreError::Open { store: format!("`store` = {name}"), source: source.into() };
        let mut config: postgres::Config = url.parse().map_err(open_error)?;
        // Cut off from the database, an agent must not wait for TCP to give up (minutes): its
        // clients get 503 and it reconnects.
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(CONNECT_TIMEOUT);
        }
        config.keepalives(true).keepalives_idle(KEEPALIVE_IDLE);
        let mut client = config.connect(NoTls).map_err(open_error)?;
        // A transaction of an agent holds its hosts' row locks and the change log's head: the
        // other agents' commits wait for it. One cut off in the middle (partitioned, stopped)
        // would stall the zone until its connection died; the server ends such a session after
        // this long instead (an agent's batch takes a few round trips).
        client
            .batch_execute(&format!(
                "SET idle_in_transaction_session_timeout = {}",
                IDLE_IN_TRANSACTION_TIMEOUT.as_millis()
            ))
            .map_err(open_error)?;
        let agent = format!(
            "{}-{}",
            std::process::id(),
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos())
        );
        // Agents starting together may race to create the schema: the loser's DDL fails, and its
        // second try finds the schema there.
        let mut attempt = 0;
        loop {
            attempt += 1;
            match init(&mut client, &name, inventory) {
                Err(StoreError::Sql { .. }) if attempt < 3 => continue,
                other => break other?,
            }
        }
        let statements = Statements::prepare(&mut client).map_err(|source| StoreError::Sql {
            store: name.clone(),
            context: "preparing the statements",
            source: source.into(),
        })?;
        Ok(PostgresStore {
            client,
            name,
            agent,
            followed: 0,
            statements,
            seen: std::collections::HashMap::new(),
            retention: ExitRetention::default(),
            newest_exit_s: f64::NEG_INFINITY,
            pruned_at: None,
        })
    }

    fn sql(&self, context: &'static str) -> impl FnOnce(postgres::Error) -> StoreError + '_ {
        move |source| {
            refusal(&self.name, &source).unwrap_or_else(|| StoreError::Sql {
                store: self.name.clone(),
                context,
                source: source.into(),
            })
        }
    }

    /// See [`super::PlacementStore::load`].
    pub fn load(&mut self) -> Result<StoredState, StoreError> {
        let name = self.name.clone();
        let sql = |context: &'static str| {
            let name = name.clone();
            move |source: postgres::Error| StoreError::Sql { store: name, context, source: source.into() }
        };
        // One snapshot: the tables as of the log position read with them.
        let mut tx = self
            .client
            .build_transaction()
            .isolation_level(postgres::IsolationLevel::RepeatableRead)
            .read_only(true)
            .start()
            .map_err(sql("starting to read the state"))?;
        let followed: i64 =
            tx.query_one("SELECT seq FROM log_head WHERE id = 1", &[]).map_err(sql("reading the change log"))?.get(0);
        let rows = tx
            .query(
                "SELECT seq, vm_id, host_id, tenant_id, vm_type, cores_base, memory_base, ssd_base, placed_at_s,
                        prediction, requested_at_s, request
                 FROM vms ORDER BY seq",
                &[],
            )
            .map_err(sql("reading the placed VMs"))?;
        let mut vms = Vec::with_capacity(rows.len());
        for row in rows {
            vms.push(vm_columns(&row, 0).decode(&name)?);
        }
        let mut host_states = Vec::new();
        let rows = tx
            .query("SELECT host_id, state FROM hosts WHERE state IS NOT NULL ORDER BY host_id", &[])
            .map_err(sql("reading the host states"))?;
        for row in rows {
            let (host, state): (String, String) = (row.get(0), row.get(1));
            let parsed = parse_state(&state).ok_or_else(|| StoreError::CorruptHostState {
                store: name.clone(),
                host: host.clone(),
                state,
            })?;
            host_states.push((HostId(host), parsed));
        }
        let policy_hosts = tx
            .query(
                "SELECT host_id, policy, policy_state FROM hosts WHERE policy_state IS NOT NULL ORDER BY host_id",
                &[],
            )
            .map_err(sql("reading the policy host states"))?
            .into_iter()
            .map(|row| (HostId(row.get(0)), row.get::<_, Option<String>>(1).unwrap_or_default(), row.get(2)))
            .collect();
        let migrations = tx
            .query("SELECT vm_id, target_host_id FROM migrations ORDER BY vm_id", &[])
            .map_err(sql("reading the migrations"))?
            .into_iter()
            .map(|row| (VmId(row.get(0)), HostId(row.get(1))))
            .collect();
        let drain = tx
            .query_opt("SELECT record FROM drain WHERE id = 1", &[])
            .map_err(sql("reading the drain"))?
            .map(|row| serde_json::from_str(row.get::<_, &str>(0)))
            .transpose()
            .map_err(|e| StoreError::CorruptDrain { store: name.clone(), detail: e.to_string() })?;
        tx.commit().map_err(sql("reading the state"))?;
        self.followed = followed;
        Ok(StoredState { vms, host_states, policy_hosts, migrations, drain })
    }

    /// See [`super::PlacementStore::policy_states`].
    pub fn policy_states(&mut self, hosts: &[HostId]) -> Result<Vec<(HostId, String, String)>, StoreError> {
        let ids: Vec<&str> = hosts.iter().map(HostId::as_str).collect();
        let rows = self
            .client
            .query(
                "SELECT host_id, policy, policy_state FROM hosts
                 WHERE host_id = ANY($1) AND policy_state IS NOT NULL",
                &[&ids],
            )
            .map_err(self.sql("reading the policy host states"))?;
        Ok(rows
            .into_iter()
            .map(|row| (HostId(row.get(0)), row.get::<_, Option<String>>(1).unwrap_or_default(), row.get(2)))
            .collect())
    }

    /// See [`super::PlacementStore::follow`].
    pub fn follow(&mut self) -> Result<Followed, StoreError> {
        let rows = self
            .client
            .query(&self.statements.follow, &[&self.followed])
            .map_err(self.sql("reading the change log"))?;
        let mut batches = Vec::with_capacity(rows.len());
        for row in rows {
            let seq: i64 = row.get(0);
            if seq != self.followed + 1 {
                // Pruned past this agent, or a row it cannot see yet: only a reload is exact.
                return Ok(Followed::Gap);
            }
            self.followed = seq;
            let agent: &str = row.get(1);
            match self.seen.get_mut(agent) {
                Some(last) => *last = seq,
                None => {
                    self.seen.insert(agent.to_owned(), seq);
                }
            }
            let batch: Vec<LoggedChange> = serde_json::from_str(row.get(2)).map_err(|e| StoreError::CorruptVm {
                store: self.name.clone(),
                vm: format!("change log row {seq}"),
                detail: e.to_string(),
            })?;
            batches.push(batch);
        }
        let since = self.followed - ACTIVE_BATCHES;
        self.seen.retain(|_, last| *last > since);
        Ok(Followed::Batches(batches))
    }

    /// See [`super::PlacementStore::agents`]: this agent and those that wrote one of the last
    /// [`ACTIVE_BATCHES`] batches it followed.
    pub fn agents(&self) -> Vec<&str> {
        let since = self.followed - ACTIVE_BATCHES;
        let mut agents: Vec<&str> =
            self.seen.iter().filter(|(_, last)| **last > since).map(|(agent, _)| agent.as_str()).collect();
        agents.push(&self.agent);
        agents.sort_unstable();
        agents.dedup();
        agents
    }

    /// See [`super::PlacementStore::apply`].
    pub fn apply(
        &mut self,
        changes: &[Change],
        policy_state: &dyn Fn(&HostId) -> Option<String>,
    ) -> Result<Committed, StoreError> {
        self.apply_decisions(changes, &[], policy_state)
    }

    /// See [`super::PlacementStore::apply_decisions`] and the module documentation (rejections).
    pub fn apply_decisions(
        &mut self,
        changes: &[Change],
        rejected: &[VmId],
        policy_state: &dyn Fn(&HostId) -> Option<String>,
    ) -> Result<Committed, StoreError> {
        if changes.is_empty() && rejected.is_empty() {
            return Ok(Committed::InOrder);
        }
        // One row per id (an upsert may touch a row once per statement).
        let mut rejected: Vec<&str> = rejected.iter().map(VmId::as_str).collect();
        rejected.sort_unstable();
        rejected.dedup();
        let placed: Vec<&str> = changes
            .iter()
            .filter_map(|change| match change {
                Change::Placed { vm, .. } => Some(vm.id.as_str()),
                _ => None,
            })
            .collect();
        if changes.is_empty() {
            return self.record_rejections(&rejected);
        }
        let name = self.name.clone();
        let sql = |context: &'static str| {
            let name = name.clone();
            move |source: postgres::Error| {
                refusal(&name, &source).unwrap_or(StoreError::Sql {
                    store: name.clone(),
                    context,
                    source: source.into(),
                })
            }
        };
        let mut tx = self.client.transaction().map_err(sql("starting a transaction"))?;
        if set_based(changes) {
            write_sets(&mut tx, &self.statements, changes, policy_state, &name)?;
        } else {
            write_each(&mut tx, changes, policy_state, &name)?;
        }
        // Last, so that the head's row lock is held only while the commit itself runs.
        let logged: Vec<LoggedChange> = changes.iter().map(|c| LoggedChange::of(c, policy_state)).collect();
        let body = serde_json::to_string(&logged).map_err(|e| StoreError::CorruptVm {
            store: name.clone(),
            vm: "change log".to_owned(),
            detail: e.to_string(),
        })?;
        // One round trip: the head moves and the batch's row goes in (with its rejections, and
        // what other agents decided of the same ids meanwhile).
        let seq = if placed.is_empty() && rejected.is_empty() {
            tx.query_one(&self.statements.append_log, &[&self.agent, &body])
                .map_err(sql("appending to the change log"))?
                .get(0)
        } else {
            let row = tx
                .query_one(
                    &self.statements.append_decided,
                    &[&self.agent, &body, &rejected, &placed, &self.followed, &REJECTION_STANDS_S],
                )
                .map_err(sql("appending to the change log"))?;
            let seq: i64 = row.get(0);
            let seen: i64 = row.get(1);
            let (mut placed_elsewhere, mut rejected_elsewhere): (Vec<String>, Vec<String>) = (row.get(2), row.get(3));
            if seq != seen + 1 {
                // Another agent committed while this one waited for the head: read again, now
                // that every commit before this one's is visible.
                let row = tx
                    .query_one(
                        &self.statements.decided_meanwhile,
                        &[&rejected, &placed, &self.followed, &seq, &REJECTION_STANDS_S],
                    )
                    .map_err(sql("reading the decisions of other agents"))?;
                (placed_elsewhere, rejected_elsewhere) = (row.get(0), row.get(1));
            }
            if let Some(refusal) = decided_elsewhere(&name, placed_elsewhere, rejected_elsewhere) {
                // Dropping the transaction rolls it back: nothing of the batch is written.
                return Err(refusal);
            }
            seq
        };
        if seq % 1000 == 0 {
            tx.execute("DELETE FROM changes WHERE seq <= $1", &[&(seq - LOG_KEPT)])
                .map_err(sql("trimming the change log"))?;
            tx.execute(
                "DELETE FROM rejections WHERE seq <= $1 AND at < now() - $2 * INTERVAL '1 second'",
                &[&(seq - LOG_KEPT), &REJECTION_STANDS_S],
            )
            .map_err(sql("trimming the rejections"))?;
        }
        tx.commit().map_err(sql("committing"))?;
        for change in changes {
            if let Change::Released { ended_at_s, .. } = change {
                self.newest_exit_s = self.newest_exit_s.max(*ended_at_s);
            }
        }
        if self.retention.due(self.pruned_at, self.newest_exit_s) {
            // A statement of its own: a failure here costs the batch nothing.
            self.pruned_at = Some(std::time::Instant::now());
            if let Err(error) = self.prune_exits() {
                tracing::warn!(%error, "pruning the exits table failed; trying again in a minute");
            }
        }
        if seq == self.followed + 1 {
            self.followed = seq;
            Ok(Committed::InOrder)
        } else {
            Ok(Committed::AfterOthers)
        }
    }
}

impl PostgresStore {
    /// Records that a batch with no write answered `rejected` (sorted, distinct) "rejected": one
    /// statement, a transaction of its own, which moves the log's head (an empty batch in the log)
    /// so that the rejection has a position. Refused when one of them is placed already.
    fn record_rejections(&mut self, rejected: &[&str]) -> Result<Committed, StoreError> {
        let none: [&str; 0] = [];
        let row = self
            .client
            .query_one(
                &self.statements.append_decided,
                &[&self.agent, &"[]", &rejected, &none.as_slice(), &self.followed, &REJECTION_STANDS_S],
            )
            .map_err(self.sql("recording rejections"))?;
        let seq: i64 = row.get(0);
        let seen: i64 = row.get(1);
        let mut placed_elsewhere: Vec<String> = row.get(2);
        if seq != seen + 1 {
            // Committed already; a placement committed before it that the statement's snapshot
            // missed is visible now. (The rejection's row then stands for nothing: that id is
            // placed, and a later placement of it is decided after the rejection.)
            placed_elsewhere = self
                .client
                .query_one(
                    &self.statements.decided_meanwhile,
                    &[&rejected, &none.as_slice(), &self.followed, &seq, &REJECTION_STANDS_S],
                )
                .map_err(self.sql("reading the decisions of other agents"))?
                .get(0);
        }
        if seq % 1000 == 0 {
            // As a batch with writes would (statements of their own: a failure costs nothing).
            let trimmed = self
                .client
                .batch_execute(&format!(
                    "DELETE FROM changes WHERE seq <= {cut};
                     DELETE FROM rejections WHERE seq <= {cut} AND at < now() - INTERVAL '{stands} seconds'",
                    cut = seq - LOG_KEPT,
                    stands = REJECTION_STANDS_S
                ))
                .map_err(self.sql("trimming the change log"));
            if let Err(error) = trimmed {
                tracing::warn!(%error, "trimming the change log failed; trying again in 1,000 batches");
            }
        }
        if let Some(refusal) = decided_elsewhere(&self.name, placed_elsewhere, Vec::new()) {
            return Err(refusal);
        }
        if seq == self.followed + 1 {
            self.followed = seq;
            Ok(Committed::InOrder)
        } else {
            Ok(Committed::AfterOthers)
        }
    }
}

/// The refusal a batch gets when other agents decided some of its VM ids meanwhile: placed what it
/// rejects (decide again: a replay), or rejected what it places (the first answer stands).
fn decided_elsewhere(name: &str, placed: Vec<String>, rejected: Vec<String>) -> Option<StoreError> {
    if !rejected.is_empty() {
        metrics::counter!("allocator_decided_elsewhere_total", "decision" => "rejected").increment(1);
        return Some(StoreError::RejectedElsewhere {
            store: name.to_owned(),
            vms: rejected.into_iter().map(VmId).collect(),
        });
    }
    if !placed.is_empty() {
        metrics::counter!("allocator_decided_elsewhere_total", "decision" => "placed").increment(1);
        return Some(StoreError::Refused {
            store: name.to_owned(),
            detail: format!("VMs {placed:?} this batch rejects were placed by another agent meanwhile"),
        });
    }
    None
}

impl PostgresStore {
    /// Keeps exits as `retention` says from now on.
    pub fn set_exit_retention(&mut self, retention: ExitRetention) {
        self.retention = retention;
    }

    /// Deletes the exits that ended more than the retention before the newest exit this agent
    /// wrote; answers how many. Only the rows that started before the cut-off are read (the key's
    /// order): an exit never ends before it starts.
    pub fn prune_exits(&mut self) -> Result<u64, StoreError> {
        let Some(cutoff) = self.retention.cutoff(self.newest_exit_s) else { return Ok(0) };
        let deleted = self
            .client
            .execute("DELETE FROM exits WHERE start_s < $1 AND ended_at_s < $1", &[&cutoff])
            .map_err(self.sql("pruning the exits"))?;
        if deleted > 0 {
            tracing::info!(deleted, cutoff_s = cutoff, "pruned exits past their retention");
        }
        Ok(deleted)
    }
}

/// The columns an export reads: the start on the model's clock, [`VmColumns`] without the
/// prediction (a trace has none), the end (NULL: still running).
const EXPORT_COLUMNS: &str = "seq, vm_id, host_id, tenant_id, vm_type, cores_base, memory_base, ssd_base, placed_at_s,
                              NULL::text, requested_at_s, request";

/// How long an agent waits to connect when its URL names no `connect_timeout`.
const CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);
/// Idle time before TCP keepalive probes start on an agent's connection.
const KEEPALIVE_IDLE: std::time::Duration = std::time::Duration::from_secs(10);
/// How long the server lets an agent's session sit idle inside a transaction before it ends the
/// session, releasing its locks (see [`PostgresStore::open`]).
const IDLE_IN_TRANSACTION_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// How many rows an export fetches at a time.
const EXPORT_FETCH: i32 = 2_000;

/// Exports the VMs of the database at `url` that started in `window` ([`super::export`]): a
/// connection of its own, one repeatable-read snapshot (a VM released meanwhile is read once,
/// running or exited), rows fetched [`EXPORT_FETCH`] at a time through portals.
pub fn export(url: &str, window: &ExportWindow, sink: &mut dyn ExportSink) -> Result<u64, ExportError> {
    let name = redact(url);
    let sql = |context: &'static str| {
        let name = name.clone();
        move |source: postgres::Error| StoreError::Sql { store: name, context, source: source.into() }
    };
    let mut client = Client::connect(url, NoTls)
        .map_err(|source| StoreError::Open { store: format!("`store` = {name}"), source: source.into() })?;
    let mut tx = client
        .build_transaction()
        .isolation_level(postgres::IsolationLevel::RepeatableRead)
        .read_only(true)
        .start()
        .map_err(sql("starting to read the export"))?;
    let (from, to) = (window.from_s, window.to_s);
    const RUNNING: &str = "FROM vms WHERE COALESCE(requested_at_s, placed_at_s) >= $1
                           AND COALESCE(requested_at_s, placed_at_s) < $2";
    const EXITED: &str = "FROM exits WHERE start_s >= $1 AND start_s < $2";
    let count: i64 = tx
        .query_one(&format!("SELECT (SELECT COUNT(*) {RUNNING}) + (SELECT COUNT(*) {EXITED})"), &[&from, &to])
        .map_err(sql("counting the export's rows"))?
        .get(0);
    let os: bool = tx
        .query_one(
            &format!(
                "SELECT EXISTS (SELECT 1 {RUNNING} AND request::jsonb ? 'os')
                     OR EXISTS (SELECT 1 {EXITED} AND request::jsonb ? 'os')"
            ),
            &[&from, &to],
        )
        .map_err(sql("reading the export's OS column"))?
        .get(0);
    let features: Vec<String> = tx
        .query(
            &format!(
                "SELECT jsonb_object_keys(request::jsonb -> 'features') {RUNNING} AND request IS NOT NULL
                 UNION
                 SELECT jsonb_object_keys(request::jsonb -> 'features') {EXITED} AND request IS NOT NULL
                 LIMIT {}",
                super::export::MAX_FEATURE_COLUMNS + 1
            ),
            &[&from, &to],
        )
        .map_err(sql("reading the export's feature names"))?
        .into_iter()
        .map(|row| row.get(0))
        .collect();
    sink.header(&ExportHeader::new(window, count.max(0) as u64, os, features)?)?;
    let running = tx
        .bind(
            &format!(
                "SELECT COALESCE(requested_at_s, placed_at_s), {EXPORT_COLUMNS}, NULL::float8 {RUNNING}
                 ORDER BY COALESCE(requested_at_s, placed_at_s), seq"
            ),
            &[&from, &to],
        )
        .map_err(sql("reading the running VMs"))?;
    let exited = tx
        .bind(&format!("SELECT start_s, {EXPORT_COLUMNS}, ended_at_s {EXITED} ORDER BY start_s, seq"), &[&from, &to])
        .map_err(sql("reading the exits"))?;
    // Both portals are fetched from one transaction, a batch at a time, as the merge asks.
    let tx = std::cell::RefCell::new(tx);
    let fetch = |portal: &postgres::Portal, context: &'static str| {
        let name = name.clone();
        let tx = &tx;
        let mut buffered: std::collections::VecDeque<postgres::Row> = std::collections::VecDeque::new();
        let mut done = false;
        let portal = portal.clone();
        std::iter::from_fn(move || -> Option<Result<ExportedVm, ExportError>> {
            if buffered.is_empty() && !done {
                match tx.borrow_mut().query_portal(&portal, EXPORT_FETCH) {
                    Ok(rows) => {
                        done = rows.len() < EXPORT_FETCH as usize;
                        buffered.extend(rows);
                    }
                    Err(source) => {
                        done = true;
                        return Some(Err(
                            StoreError::Sql { store: name.clone(), context, source: source.into() }.into()
                        ));
                    }
                }
            }
            let row = buffered.pop_front()?;
            let columns = vm_columns(&row, 1);
            let (start_s, ended_at_s, seq) = (row.get(0), row.get(13), columns.seq);
            Some(columns.decode(&name).map_err(ExportError::from).map(|stored| ExportedVm {
                start_s,
                seq,
                vm: stored.vm,
                ended_at_s,
            }))
        })
    };
    let written = super::export::merge(
        fetch(&running, "reading the running VMs"),
        fetch(&exited, "reading the exits"),
        window.max_rows,
        sink,
    )?;
    tx.into_inner().commit().map_err(sql("finishing the export"))?;
    Ok(written)
}

/// Creates the schema, or checks its version, and seeds the inventory's hosts, in one transaction.
fn init(client: &mut Client, name: &str, inventory: &InventorySpec) -> Result<(), StoreError> {
    let sql = |context: &'static str| {
        move |source: postgres::Error| StoreError::Sql { store: name.to_owned(), context, source: source.into() }
    };
    let mut tx = client.transaction().map_err(sql("starting the schema set-up"))?;
    tx.batch_execute("CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value BIGINT NOT NULL)")
        .map_err(sql("creating the schema"))?;
    let found: Option<i64> = tx
        .query_opt("SELECT value FROM meta WHERE key = 'schema_version'", &[])
        .map_err(sql("reading the schema version"))?
        .map(|row| row.get(0));
    match found {
        Some(version) if version > SCHEMA_VERSION => {
            return Err(StoreError::SchemaVersion {
                store: name.to_owned(),
                found: version,
                ours: SCHEMA_VERSION,
                fix: NEWER_SCHEMA_FIX,
            })
        }
        Some(SCHEMA_VERSION) => {}
        _ => {
            tx.batch_execute(
                "CREATE TABLE IF NOT EXISTS hosts (
                     host_id TEXT PRIMARY KEY,
                     cores_cap BIGINT NOT NULL, memory_cap BIGINT NOT NULL, ssd_cap BIGINT NOT NULL,
                     cores_used BIGINT NOT NULL DEFAULT 0, memory_used BIGINT NOT NULL DEFAULT 0,
                     ssd_used BIGINT NOT NULL DEFAULT 0,
                     state TEXT,
                     policy TEXT,
                     policy_state TEXT,
                     CONSTRAINT hosts_never_over_committed CHECK (
                         cores_used BETWEEN 0 AND cores_cap AND memory_used BETWEEN 0 AND memory_cap
                         AND ssd_used BETWEEN 0 AND ssd_cap)
                 );
                 CREATE SEQUENCE IF NOT EXISTS vm_seq;
                 CREATE TABLE IF NOT EXISTS vms (
                     vm_id TEXT PRIMARY KEY,
                     seq BIGINT NOT NULL UNIQUE,
                     host_id TEXT NOT NULL REFERENCES hosts (host_id),
                     tenant_id TEXT NOT NULL,
                     vm_type TEXT NOT NULL,
                     cores_base BIGINT NOT NULL, memory_base BIGINT NOT NULL, ssd_base BIGINT NOT NULL,
                     placed_at_s DOUBLE PRECISION NOT NULL,
                     prediction TEXT,
                     requested_at_s DOUBLE PRECISION,
                     request TEXT
                 );
                 ALTER TABLE vms ADD COLUMN IF NOT EXISTS requested_at_s DOUBLE PRECISION;
                 ALTER TABLE vms ADD COLUMN IF NOT EXISTS request TEXT;
                 CREATE TABLE IF NOT EXISTS migrations (
                     vm_id TEXT PRIMARY KEY,
                     target_host_id TEXT NOT NULL REFERENCES hosts (host_id),
                     cores_base BIGINT NOT NULL, memory_base BIGINT NOT NULL, ssd_base BIGINT NOT NULL
                 );
                 CREATE TABLE IF NOT EXISTS drain (id INTEGER PRIMARY KEY CHECK (id = 1), record TEXT NOT NULL);
                 CREATE TABLE IF NOT EXISTS log_head (id INTEGER PRIMARY KEY CHECK (id = 1), seq BIGINT NOT NULL);
                 INSERT INTO log_head (id, seq) VALUES (1, 0) ON CONFLICT (id) DO NOTHING;
                 CREATE TABLE IF NOT EXISTS changes (seq BIGINT PRIMARY KEY, agent TEXT NOT NULL, body TEXT NOT NULL);
                 CREATE TABLE IF NOT EXISTS rejections (
                     vm_id TEXT PRIMARY KEY, seq BIGINT NOT NULL, at TIMESTAMPTZ NOT NULL DEFAULT now());
                 CREATE INDEX IF NOT EXISTS rejections_by_seq ON rejections (seq);
                 CREATE TABLE IF NOT EXISTS exits (
                     start_s DOUBLE PRECISION NOT NULL,
                     seq BIGINT NOT NULL,
                     vm_id TEXT NOT NULL,
                     host_id TEXT NOT NULL,
                     tenant_id TEXT NOT NULL,
                     vm_type TEXT NOT NULL,
                     cores_base BIGINT NOT NULL, memory_base BIGINT NOT NULL, ssd_base BIGINT NOT NULL,
                     placed_at_s DOUBLE PRECISION NOT NULL,
                     prediction TEXT,
                     requested_at_s DOUBLE PRECISION,
                     request TEXT,
                     ended_at_s DOUBLE PRECISION NOT NULL,
                     PRIMARY KEY (start_s, seq)
                 );
                 INSERT INTO meta (key, value) VALUES ('schema_version', 4)
                     ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value;",
            )
            .map_err(sql("creating the schema"))?;
        }
    }
    seed_hosts(&mut tx, inventory, name)?;
    tx.commit().map_err(sql("committing the schema set-up"))
}

/// Takes the row locks of `hosts` in one order for every agent (the database's order of host ids),
/// so that two batches never wait on each other's hosts in a cycle; refuses a host not in the store.
const LOCK_HOSTS: &str = "SELECT host_id FROM hosts WHERE host_id = ANY($1::text[]) ORDER BY host_id FOR NO KEY UPDATE";

fn lock_hosts(tx: &mut Transaction<'_>, statement: &Statement, hosts: &[&str], name: &str) -> Result<(), StoreError> {
    if hosts.is_empty() {
        return Ok(());
    }
    let rows = tx.query(statement, &[&hosts]).map_err(|source| {
        refusal(name, &source).unwrap_or_else(|| StoreError::Sql {
            store: name.to_owned(),
            context: "locking hosts",
            source: source.into(),
        })
    })?;
    if rows.len() < hosts.len() {
        let found: std::collections::HashSet<String> = rows.iter().map(|row| row.get(0)).collect();
        let missing = hosts.iter().find(|host| !found.contains(**host)).copied().unwrap_or_default();
        return Err(StoreError::Refused {
            store: name.to_owned(),
            detail: format!("host `{missing}` is not in the store"),
        });
    }
    Ok(())
}

/// The statements of every batch, prepared once per connection: a statement sent as text is parsed
/// and planned again each time, and the client prepares it first, in a round trip of its own.
/// They write a batch by sets (arrays), not row by row: a batch of several requests costs a
/// handful of round trips, and the time in which other agents can commit under it is short.
struct Statements {
    insert_vms: Statement,
    delete_vms: Statement,
    lock_hosts: Statement,
    add_use: Statement,
    set_policy: Statement,
    append_log: Statement,
    follow: Statement,
    append_decided: Statement,
    decided_meanwhile: Statement,
}

impl Statements {
    fn prepare(client: &mut Client) -> Result<Self, postgres::Error> {
        Ok(Statements {
            insert_vms: client.prepare(
                "INSERT INTO vms (vm_id, seq, host_id, tenant_id, vm_type, cores_base, memory_base, ssd_base,
                                  placed_at_s, prediction, requested_at_s, request)
                 SELECT v.vm_id, nextval('vm_seq'), v.host_id, v.tenant_id, v.vm_type, v.cores, v.memory, v.ssd,
                        v.placed_at_s, v.prediction, v.requested_at_s, v.request
                 FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::int8[], $6::int8[], $7::int8[],
                             $8::float8[], $9::text[], $10::float8[], $11::text[])
                      WITH ORDINALITY
                      AS v(vm_id, host_id, tenant_id, vm_type, cores, memory, ssd, placed_at_s, prediction,
                           requested_at_s, request, position)
                 ORDER BY v.position",
            )?,
            // The released VMs leave `vms` for `exits`, each with its end, in one statement.
            delete_vms: client.prepare(
                "WITH gone AS (DELETE FROM vms WHERE vm_id = ANY($1::text[]) RETURNING *),
                      kept AS (INSERT INTO exits (start_s, seq, vm_id, host_id, tenant_id, vm_type, cores_base,
                                                  memory_base, ssd_base, placed_at_s, prediction, requested_at_s,
                                                  request, ended_at_s)
                               SELECT COALESCE(g.requested_at_s, g.placed_at_s), g.seq, g.vm_id, g.host_id,
                                      g.tenant_id, g.vm_type, g.cores_base, g.memory_base, g.ssd_base,
                                      g.placed_at_s, g.prediction, g.requested_at_s, g.request, e.ended_at_s
                               FROM gone g
                               JOIN unnest($1::text[], $2::float8[]) AS e(vm_id, ended_at_s) ON e.vm_id = g.vm_id)
                 SELECT host_id, cores_base, memory_base, ssd_base FROM gone",
            )?,
            lock_hosts: client.prepare(LOCK_HOSTS)?,
            add_use: client.prepare(
                "UPDATE hosts SET cores_used = hosts.cores_used + d.cores, memory_used = hosts.memory_used + d.memory,
                                  ssd_used = hosts.ssd_used + d.ssd
                 FROM unnest($1::text[], $2::int8[], $3::int8[], $4::int8[]) AS d(host_id, cores, memory, ssd)
                 WHERE hosts.host_id = d.host_id",
            )?,
            set_policy: client.prepare(
                "UPDATE hosts SET policy = d.policy, policy_state = d.state
                 FROM unnest($1::text[], $2::text[], $3::text[]) AS d(host_id, policy, state)
                 WHERE hosts.host_id = d.host_id",
            )?,
            append_log: client.prepare(
                "WITH head AS (UPDATE log_head SET seq = seq + 1 WHERE id = 1 RETURNING seq)
                 INSERT INTO changes (seq, agent, body) SELECT seq, $1, $2 FROM head RETURNING seq",
            )?,
            follow: client.prepare("SELECT seq, agent, body FROM changes WHERE seq > $1 ORDER BY seq")?,
            // The head moves, the batch's row goes in, its rejections are recorded at its position;
            // and, as of the statement's snapshot: which of the rejected ids ($3) are placed, which
            // of the placed ones ($4) another agent rejected after this agent's view ($5), and the
            // head before this statement waited for it (if another commit came in between, the
            // snapshot may miss it: read again with `decided_meanwhile`).
            append_decided: client.prepare(
                "WITH head AS (UPDATE log_head SET seq = seq + 1 WHERE id = 1 RETURNING seq),
                      logged AS (INSERT INTO changes (seq, agent, body) SELECT seq, $1, $2 FROM head RETURNING seq),
                      recorded AS (INSERT INTO rejections (vm_id, seq, at)
                                   SELECT r.vm_id, logged.seq, now() FROM logged, unnest($3::text[]) AS r(vm_id)
                                   ON CONFLICT (vm_id) DO UPDATE SET seq = EXCLUDED.seq, at = EXCLUDED.at)
                 SELECT logged.seq, (SELECT seq FROM log_head WHERE id = 1),
                        ARRAY(SELECT vm_id FROM vms WHERE vm_id = ANY($3::text[])),
                        ARRAY(SELECT vm_id FROM rejections WHERE vm_id = ANY($4::text[])
                                                            AND (seq > $5 OR at > now() - $6 * INTERVAL '1 second'))
                 FROM logged",
            )?,
            decided_meanwhile: client.prepare(
                "SELECT ARRAY(SELECT vm_id FROM vms WHERE vm_id = ANY($1::text[])),
                        ARRAY(SELECT vm_id FROM rejections WHERE vm_id = ANY($2::text[]) AND seq < $4
                                                            AND (seq > $3 OR at > now() - $5 * INTERVAL '1 second'))",
            )?,
        })
    }
}

/// Whether [`write_sets`] can write `changes`: placements, releases, host and policy states, with
/// no VM both placed and released (their order would matter).
fn set_based(changes: &[Change]) -> bool {
    let mut placed = std::collections::HashSet::new();
    for change in changes {
        match change {
            Change::Placed { vm, .. } => {
                placed.insert(vm.id.as_str());
            }
            Change::Released { .. } | Change::HostState { .. } | Change::PolicyHostState { .. } => {}
            _ => return false,
        }
    }
    !changes.iter().any(|change| matches!(change, Change::Released { vm, .. } if placed.contains(vm.as_str())))
}

/// Writes a batch of placements, releases, host and policy states as sets: one statement inserts
/// the placed VMs, one deletes the released ones, one locks the touched hosts (in one order for
/// every agent), one adds each host's net use (the check judges it), one writes the policy states.
fn write_sets(
    tx: &mut Transaction<'_>,
    statements: &Statements,
    changes: &[Change],
    policy_state: &dyn Fn(&HostId) -> Option<String>,
    name: &str,
) -> Result<(), StoreError> {
    let sql = |context: &'static str| {
        move |source: postgres::Error| {
            refusal(name, &source).unwrap_or(StoreError::Sql { store: name.to_owned(), context, source: source.into() })
        }
    };
    let mut used: BTreeMap<String, [i64; RESOURCE_DIMS]> = BTreeMap::new();
    let use_on = |used: &mut BTreeMap<String, [i64; RESOURCE_DIMS]>, host: &str, delta: [i64; RESOURCE_DIMS]| {
        let entry = used.entry(host.to_owned()).or_insert([0; RESOURCE_DIMS]);
        for (sum, d) in entry.iter_mut().zip(delta) {
            *sum += d;
        }
    };
    let placed: Vec<_> = changes
        .iter()
        .filter_map(|change| match change {
            Change::Placed { vm, host } => Some((vm, host)),
            _ => None,
        })
        .collect();
    if !placed.is_empty() {
        let mut columns = VmArrays::default();
        for (vm, host) in &placed {
            let [cores, memory, ssd] = units(&vm.demand);
            columns.vm_id.push(vm.id.as_str());
            columns.host_id.push(host.as_str());
            columns.tenant_id.push(vm.tenant.as_str());
            columns.vm_type.push(vm.vm_type.as_str());
            columns.base[0].push(cores);
            columns.base[1].push(memory);
            columns.base[2].push(ssd);
            columns.placed_at_s.push(vm.placed_at_s);
            columns.prediction.push(prediction_json(vm, name)?);
            columns.requested_at_s.push(vm.requested_at_s);
            columns.request.push(request_json(vm, name)?);
            use_on(&mut used, host.as_str(), [cores, memory, ssd]);
        }
        tx.execute(
            &statements.insert_vms,
            &[
                &columns.vm_id,
                &columns.host_id,
                &columns.tenant_id,
                &columns.vm_type,
                &columns.base[0],
                &columns.base[1],
                &columns.base[2],
                &columns.placed_at_s,
                &columns.prediction,
                &columns.requested_at_s,
                &columns.request,
            ],
        )
        .map_err(sql("recording placements"))?;
    }
    let (released, ends): (Vec<&str>, Vec<f64>) = changes
        .iter()
        .filter_map(|change| match change {
            Change::Released { vm, ended_at_s, .. } => Some((vm.as_str(), *ended_at_s)),
            _ => None,
        })
        .unzip();
    let deleted = if released.is_empty() {
        Vec::new()
    } else {
        tx.query(&statements.delete_vms, &[&released, &ends]).map_err(sql("recording releases"))?
    };
    for row in &deleted {
        use_on(&mut used, row.get(0), [-row.get::<_, i64>(1), -row.get::<_, i64>(2), -row.get::<_, i64>(3)]);
    }
    used.retain(|_, delta| delta.iter().any(|d| *d != 0));
    // The policy states, one per host (the snapshot is taken now, so the last one wins anyway).
    let mut policies: BTreeMap<&str, (&'static str, Option<String>)> = BTreeMap::new();
    for change in changes {
        if let Change::PolicyHostState { host, policy } = change {
            policies.insert(host.as_str(), (*policy, policy_state(host)));
        }
    }
    let mut hosts: Vec<&str> = used.keys().map(String::as_str).chain(policies.keys().copied()).collect();
    for change in changes {
        if let Change::HostState { host, .. } = change {
            hosts.push(host.as_str());
        }
    }
    hosts.sort_unstable();
    hosts.dedup();
    lock_hosts(tx, &statements.lock_hosts, &hosts, name)?;
    if !used.is_empty() {
        let ids: Vec<&str> = used.keys().map(String::as_str).collect();
        let dims: [Vec<i64>; RESOURCE_DIMS] = std::array::from_fn(|d| used.values().map(|delta| delta[d]).collect());
        tx.execute(&statements.add_use, &[&ids, &dims[0], &dims[1], &dims[2]])
            .map_err(sql("recording what hosts use"))?;
    }
    if !policies.is_empty() {
        let ids: Vec<&str> = policies.keys().copied().collect();
        let (kinds, states): (Vec<Option<&str>>, Vec<Option<&str>>) =
            policies.values().map(|(policy, state)| (state.as_ref().map(|_| *policy), state.as_deref())).unzip();
        tx.execute(&statements.set_policy, &[&ids, &kinds, &states]).map_err(sql("recording policy host states"))?;
    }
    for change in changes {
        if let Change::HostState { host, state, .. } = change {
            tx.execute("UPDATE hosts SET state = $2 WHERE host_id = $1", &[&host.as_str(), &state_name(*state)])
                .map_err(sql("recording a host state"))?;
        }
    }
    Ok(())
}

/// The placed VMs of a batch, column by column, for [`Statements::insert_vms`].
#[derive(Default)]
struct VmArrays<'a> {
    vm_id: Vec<&'a str>,
    host_id: Vec<&'a str>,
    tenant_id: Vec<&'a str>,
    vm_type: Vec<&'a str>,
    base: [Vec<i64>; RESOURCE_DIMS],
    placed_at_s: Vec<f64>,
    prediction: Vec<Option<String>>,
    requested_at_s: Vec<Option<f64>>,
    request: Vec<Option<String>>,
}

/// Writes a batch change by change, in order: batches with drains or migrations, or that place and
/// release the same VM. The set-based [`write_sets`] covers the rest.
fn write_each(
    tx: &mut Transaction<'_>,
    changes: &[Change],
    policy_state: &dyn Fn(&HostId) -> Option<String>,
    name: &str,
) -> Result<(), StoreError> {
    let sql = |context: &'static str| {
        move |source: postgres::Error| {
            refusal(name, &source).unwrap_or(StoreError::Sql { store: name.to_owned(), context, source: source.into() })
        }
    };
    // What each host's use changes by, written once per host at the end, in host order: two
    // agents' batches then lock hosts in the same order and cannot deadlock, and the check
    // judges each host's net use.
    let mut used: BTreeMap<String, [i64; RESOURCE_DIMS]> = BTreeMap::new();
    let mut use_on = |host: &str, delta: [i64; RESOURCE_DIMS]| {
        let entry = used.entry(host.to_owned()).or_insert([0; RESOURCE_DIMS]);
        for (sum, d) in entry.iter_mut().zip(delta) {
            *sum += d;
        }
    };
    for change in changes {
        match change {
            Change::Placed { vm, host } => {
                let prediction = prediction_json(vm, name)?;
                let request = request_json(vm, name)?;
                let [cores, memory, ssd] = units(&vm.demand);
                tx.execute(
                    "INSERT INTO vms (vm_id, seq, host_id, tenant_id, vm_type, cores_base, memory_base, ssd_base,
                                          placed_at_s, prediction, requested_at_s, request)
                         VALUES ($1, nextval('vm_seq'), $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)",
                    &[
                        &vm.id.as_str(),
                        &host.as_str(),
                        &vm.tenant.as_str(),
                        &vm.vm_type,
                        &cores,
                        &memory,
                        &ssd,
                        &vm.placed_at_s,
                        &prediction,
                        &vm.requested_at_s,
                        &request,
                    ],
                )
                .map_err(sql("recording a placement"))?;
                use_on(host.as_str(), [cores, memory, ssd]);
            }
            Change::Released { vm, ended_at_s, .. } => {
                let row = tx
                    .query_opt(
                        "WITH gone AS (DELETE FROM vms WHERE vm_id = $1 RETURNING *),
                              kept AS (INSERT INTO exits (start_s, seq, vm_id, host_id, tenant_id, vm_type, cores_base,
                                                          memory_base, ssd_base, placed_at_s, prediction,
                                                          requested_at_s, request, ended_at_s)
                                       SELECT COALESCE(requested_at_s, placed_at_s), seq, vm_id, host_id, tenant_id,
                                              vm_type, cores_base, memory_base, ssd_base, placed_at_s, prediction,
                                              requested_at_s, request, $2
                                       FROM gone)
                         SELECT host_id, cores_base, memory_base, ssd_base FROM gone",
                        &[&vm.as_str(), ended_at_s],
                    )
                    .map_err(sql("recording a release"))?;
                if let Some(row) = row {
                    let host: String = row.get(0);
                    use_on(&host, [-row.get::<_, i64>(1), -row.get::<_, i64>(2), -row.get::<_, i64>(3)]);
                }
            }
            Change::HostState { host, state, .. } => {
                tx.execute("UPDATE hosts SET state = $2 WHERE host_id = $1", &[&host.as_str(), &state_name(*state)])
                    .map_err(sql("recording a host state"))?;
            }
            Change::MigrationStarted { vm, target } => {
                let row = tx
                    .query_one("SELECT cores_base, memory_base, ssd_base FROM vms WHERE vm_id = $1", &[&vm.as_str()])
                    .map_err(sql("recording a migration"))?;
                let demand = [row.get::<_, i64>(0), row.get::<_, i64>(1), row.get::<_, i64>(2)];
                tx.execute(
                    "INSERT INTO migrations (vm_id, target_host_id, cores_base, memory_base, ssd_base)
                         VALUES ($1, $2, $3, $4, $5)",
                    &[&vm.as_str(), &target.as_str(), &demand[0], &demand[1], &demand[2]],
                )
                .map_err(sql("recording a migration"))?;
                use_on(target.as_str(), demand);
            }
            Change::MigrationCompleted { vm, target } => {
                // The target holds the reservation already: the source gives the demand back.
                let source: String = tx
                    .query_one("SELECT host_id FROM vms WHERE vm_id = $1", &[&vm.as_str()])
                    .map_err(sql("recording a migration"))?
                    .get(0);
                let row = tx
                    .query_one(
                        "DELETE FROM migrations WHERE vm_id = $1 RETURNING cores_base, memory_base, ssd_base",
                        &[&vm.as_str()],
                    )
                    .map_err(sql("recording a migration"))?;
                tx.execute("UPDATE vms SET host_id = $2 WHERE vm_id = $1", &[&vm.as_str(), &target.as_str()])
                    .map_err(sql("recording a migration"))?;
                use_on(&source, [-row.get::<_, i64>(0), -row.get::<_, i64>(1), -row.get::<_, i64>(2)]);
            }
            Change::MigrationCancelled { vm } => {
                let row = tx
                    .query_opt(
                        "DELETE FROM migrations WHERE vm_id = $1
                             RETURNING target_host_id, cores_base, memory_base, ssd_base",
                        &[&vm.as_str()],
                    )
                    .map_err(sql("recording a migration"))?;
                if let Some(row) = row {
                    let target: String = row.get(0);
                    use_on(&target, [-row.get::<_, i64>(1), -row.get::<_, i64>(2), -row.get::<_, i64>(3)]);
                }
            }
            Change::Drain(drain) => {
                let record = drain
                    .as_ref()
                    .map(serde_json::to_string)
                    .transpose()
                    .map_err(|e| StoreError::CorruptDrain { store: name.to_owned(), detail: e.to_string() })?;
                match record {
                    Some(record) => tx.execute(
                        "INSERT INTO drain (id, record) VALUES (1, $1)
                             ON CONFLICT (id) DO UPDATE SET record = EXCLUDED.record",
                        &[&record],
                    ),
                    None => tx.execute("DELETE FROM drain", &[]),
                }
                .map_err(sql("recording the drain"))?;
            }
            Change::PolicyHostState { host, policy } => {
                let state = policy_state(host);
                let policy = state.as_ref().map(|_| *policy);
                tx.execute(
                    "UPDATE hosts SET policy = $2, policy_state = $3 WHERE host_id = $1",
                    &[&host.as_str(), &policy, &state],
                )
                .map_err(sql("recording a policy host state"))?;
            }
        }
    }
    used.retain(|_, delta| delta.iter().any(|d| *d != 0));
    let hosts: Vec<&str> = used.keys().map(String::as_str).collect();
    let statement = tx.prepare(LOCK_HOSTS).map_err(sql("locking hosts"))?;
    lock_hosts(tx, &statement, &hosts, name)?;
    for (host, delta) in &used {
        add_use(tx, host, *delta, name)?;
    }
    Ok(())
}

/// Adds `delta` (base units, negative to give back) to what `host` uses; the table's check refuses
/// an over-commit.
fn add_use(tx: &mut Transaction<'_>, host: &str, delta: [i64; RESOURCE_DIMS], name: &str) -> Result<(), StoreError> {
    let updated = tx
        .execute(
            "UPDATE hosts SET cores_used = cores_used + $2, memory_used = memory_used + $3, ssd_used = ssd_used + $4
             WHERE host_id = $1",
            &[&host, &delta[0], &delta[1], &delta[2]],
        )
        .map_err(|source| {
            refusal(name, &source).unwrap_or_else(|| StoreError::Sql {
                store: name.to_owned(),
                context: "recording what a host uses",
                source: source.into(),
            })
        })?;
    if updated == 0 {
        return Err(StoreError::Refused {
            store: name.to_owned(),
            detail: format!("host `{host}` is not in the store"),
        });
    }
    Ok(())
}

/// Adds the inventory's hosts that the store lacks, and brings every host's capacity to the
/// inventory's. A capacity below what a host's VMs use is refused, naming the host.
fn seed_hosts(tx: &mut Transaction<'_>, inventory: &InventorySpec, name: &str) -> Result<(), StoreError> {
    // Only the hosts that are missing or differ are written: an agent that starts (or reloads)
    // while others commit then takes no lock on their hosts' rows.
    let stored: std::collections::HashMap<String, [i64; RESOURCE_DIMS]> = tx
        .query("SELECT host_id, cores_cap, memory_cap, ssd_cap FROM hosts", &[])
        .map_err(|source| StoreError::Sql {
            store: name.to_owned(),
            context: "reading the hosts",
            source: source.into(),
        })?
        .into_iter()
        .map(|row| (row.get(0), [row.get(1), row.get(2), row.get(3)]))
        .collect();
    let hosts: Vec<_> =
        inventory.hosts().filter(|host| stored.get(host.host.as_str()) != Some(&units(&host.capacity))).collect();
    for chunk in hosts.chunks(SEED_CHUNK) {
        let mut statement = String::from("INSERT INTO hosts (host_id, cores_cap, memory_cap, ssd_cap) VALUES ");
        let mut values: Vec<Box<dyn postgres::types::ToSql + Sync>> = Vec::with_capacity(chunk.len() * 4);
        for (i, host) in chunk.iter().enumerate() {
            if i > 0 {
                statement.push(',');
            }
            statement.push_str(&format!("(${}, ${}, ${}, ${})", 4 * i + 1, 4 * i + 2, 4 * i + 3, 4 * i + 4));
            let [cores, memory, ssd] = units(&host.capacity);
            values.push(Box::new(host.host.as_str().to_owned()));
            values.extend([Box::new(cores) as Box<dyn postgres::types::ToSql + Sync>, Box::new(memory), Box::new(ssd)]);
        }
        statement.push_str(
            " ON CONFLICT (host_id) DO UPDATE SET cores_cap = EXCLUDED.cores_cap, memory_cap = EXCLUDED.memory_cap,
                                                ssd_cap = EXCLUDED.ssd_cap",
        );
        let params: Vec<&(dyn postgres::types::ToSql + Sync)> = values.iter().map(|v| v.as_ref()).collect();
        if let Err(source) = tx.execute(statement.as_str(), &params) {
            if source.code() == Some(&SqlState::CHECK_VIOLATION) {
                return Err(StoreError::Refused {
                    store: name.to_owned(),
                    detail: "the inventory gives a host less capacity than its VMs in the store use; give it its \
                             capacity back, or release those VMs first"
                        .to_owned(),
                });
            }
            return Err(StoreError::Sql {
                store: name.to_owned(),
                context: "seeding the hosts",
                source: source.into(),
            });
        }
    }
    Ok(())
}

/// The store's own refusals: a second placement of a VM id, an over-committed host.
fn refusal(name: &str, error: &postgres::Error) -> Option<StoreError> {
    let db = error.as_db_error()?;
    let detail = match *db.code() {
        SqlState::UNIQUE_VIOLATION => format!("a VM id is placed already ({})", db.message()),
        SqlState::CHECK_VIOLATION => {
            format!("a host would be over-committed ({}; {})", db.message(), db.detail().unwrap_or_default())
        }
        SqlState::FOREIGN_KEY_VIOLATION => format!("a host is not in the store ({})", db.message()),
        // Concurrent batches the database could not order: as good as a conflict, decided again.
        SqlState::T_R_DEADLOCK_DETECTED | SqlState::T_R_SERIALIZATION_FAILURE => {
            format!("a concurrent batch got in the way ({}; {})", db.message(), db.detail().unwrap_or_default())
        }
        _ => return None,
    };
    Some(StoreError::Refused { store: name.to_owned(), detail })
}

/// A VM's columns, in `vms` order (`seq` .. `request`), from column `at` of `row` on.
fn vm_columns(row: &postgres::Row, at: usize) -> VmColumns {
    VmColumns {
        seq: row.get(at),
        vm_id: row.get(at + 1),
        host_id: row.get(at + 2),
        tenant_id: row.get(at + 3),
        vm_type: row.get(at + 4),
        base: [row.get(at + 5), row.get(at + 6), row.get(at + 7)],
        placed_at_s: row.get(at + 8),
        prediction: row.get(at + 9),
        requested_at_s: row.get(at + 10),
        request: row.get(at + 11),
    }
}

#[cfg(test)]
mod tests {
    use super::redact;

    #[test]
    fn passwords_never_reach_a_message() {
        assert_eq!(redact("postgres://alloc:s3cret@db:5432/zone"), "postgres://alloc:***@db:5432/zone");
        assert_eq!(redact("postgres://alloc@db/zone"), "postgres://alloc@db/zone");
        assert_eq!(redact("postgresql://db/zone"), "postgresql://db/zone");
        assert_eq!(redact("postgres://u:p@ss@db/z"), "postgres://u:***@db/z");
        // Several hosts (a primary and its standby), and parameters, kept.
        assert_eq!(
            redact("postgres://alloc:s3cret@10.0.0.1:5432,10.0.0.2:5432/zone?target_session_attrs=read-write"),
            "postgres://alloc:***@10.0.0.1:5432,10.0.0.2:5432/zone?target_session_attrs=read-write"
        );
        assert_eq!(
            redact("postgres://alloc@h1:5432,h2:5433/zone?application_name=a@b"),
            "postgres://alloc@h1:5432,h2:5433/zone?application_name=a@b"
        );
        assert_eq!(
            redact("postgres://alloc:s3cret@h1,h2/zone?application_name=a@b&target_session_attrs=read-write"),
            "postgres://alloc:***@h1,h2/zone?application_name=a@b&target_session_attrs=read-write"
        );
        // A password given as a parameter.
        assert_eq!(
            redact("postgres://alloc@h1,h2/zone?password=s3cret&target_session_attrs=read-write"),
            "postgres://alloc@h1,h2/zone?password=***&target_session_attrs=read-write"
        );
    }
}
