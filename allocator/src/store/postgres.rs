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
//! **A batch in one round trip** (schema 5, issue 32). A batch is written by one server-side
//! function, `allocator_commit_batch` (PL/pgSQL, [`BATCH_FUNCTIONS`]), called outside any
//! transaction: the call is its own transaction, so the whole batch (placed VMs, released VMs,
//! host use, host and policy states, the change-log row, rejections) costs one round trip, and
//! a refusal raised anywhere in it rolls all of it back. Batches with drains or migrations are
//! still written change by change in a transaction, ending with the log's part of the same
//! function (`allocator_log_batch`). Not every PostgreSQL-wire distributed database runs
//! PL/pgSQL or `LISTEN`/`NOTIFY`: see docs/allocator.md.
//!
//! **Following without polling.** After each commit an agent notifies `allocator_log` with the
//! batch's position and agent, and (schema 9) the batch's changes when they fit in a
//! notification, from a connection of its own ([`Notifier`]: a `NOTIFY` inside the commit would
//! hold PostgreSQL's lock for notifications through the flush, and the zone's commits would queue
//! behind each other). Each agent listens on a connection of its own ([`Listener`], a thread) and
//! keeps the positions other agents committed, with their changes; a batch of allocations and
//! releases skips the follow query when its view holds every notified position, or applies the
//! notified changes without a query ([`PostgresStore::follow_notified`]), and an idle agent is
//! woken to follow ([`PostgresStore::set_waker`]). A notification can be lost (the listening
//! connection broke, or is late, an agent died before it notified): the commit still checks the
//! log position ([`super::Committed`]), so a batch decided on a view that lacked another agent's
//! batch is taken back and followed in the log's order, and while the listener is not connected
//! every batch follows first, as before. Reads and a batch that must see every acknowledged commit
//! always read the log.
//!
//! Schema (version 9, in `meta`), demands and capacities in base units ([`Resources::base_units`]).
//! An older store is upgraded when opened, in the schema transaction: the `vms` of version 1 gain
//! the request's columns (`ALTER TABLE ... ADD COLUMN IF NOT EXISTS`), NULL in the rows they hold
//! (no request time, default request facts), versions 1 and 2 gain the (empty) `exits` table,
//! versions 1 to 3 the (empty) `rejections` table, versions 1 to 5 the (empty) `releases` table,
//! versions 1 to 7 the sequence of positions (continuing from `log_head`, which goes) and the
//! hosts' `last_seq`, and every older version the batch functions of this one. Agents of
//! schema 7 must be stopped before one of schema 8 or 9 opens their store: they write `log_head`.
//! Agents of schema 8 may run on beside one of schema 9 (only the notifications changed, and they
//! read the position and agent of them as before; their own commits notify from inside), but do
//! not start on its store.
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
//!     last_seq BIGINT NOT NULL DEFAULT 0, -- the position of the last batch that wrote the host
//!     CONSTRAINT hosts_never_over_committed CHECK (
//!         cores_used BETWEEN 0 AND cores_cap AND memory_used BETWEEN 0 AND memory_cap
//!         AND ssd_used BETWEEN 0 AND ssd_cap));
//! CREATE SEQUENCE vm_seq;                                                  -- placement order
//! CREATE TABLE vms (vm_id TEXT PRIMARY KEY, seq BIGINT NOT NULL UNIQUE,
//!     host_id TEXT NOT NULL, tenant_id TEXT NOT NULL,     -- no foreign key since schema 5: each
//!                                                          -- batch locks its hosts, refusing a missing one
//!     vm_type TEXT NOT NULL, cores_base BIGINT NOT NULL, memory_base BIGINT NOT NULL,
//!     ssd_base BIGINT NOT NULL, placed_at_s DOUBLE PRECISION NOT NULL,     -- the allocator's clock
//!     prediction TEXT,                                                     -- as JSON
//!     requested_at_s DOUBLE PRECISION,                                     -- the request's, model clock
//!     request TEXT);           -- {priority, os, features} as JSON; NULL: regular, no OS, no features
//! CREATE TABLE migrations (vm_id TEXT PRIMARY KEY,                        -- in flight, with the
//!     target_host_id TEXT NOT NULL REFERENCES hosts (host_id),             -- demand reserved on
//!     cores_base BIGINT NOT NULL, memory_base BIGINT NOT NULL, ssd_base BIGINT NOT NULL); -- it
//! CREATE TABLE drain (id INTEGER PRIMARY KEY CHECK (id = 1), record TEXT NOT NULL);
//! CREATE TABLE consolidation (id INTEGER PRIMARY KEY CHECK (id = 1), record TEXT NOT NULL);
//! CREATE SEQUENCE log_seq;                                                 -- change-log positions
//! CREATE TABLE changes (seq BIGINT PRIMARY KEY, agent TEXT NOT NULL, body TEXT NOT NULL);
//! CREATE TABLE rejections (vm_id TEXT PRIMARY KEY, seq BIGINT NOT NULL,  -- ids answered "rejected",
//!     at TIMESTAMPTZ NOT NULL DEFAULT now());                             -- at a log position
//! CREATE INDEX rejections_by_seq ON rejections (seq);
//! CREATE TABLE releases (vm_id TEXT PRIMARY KEY, seq BIGINT NOT NULL);   -- the last release of
//! CREATE INDEX releases_by_seq ON releases (seq);                         -- each id, its position
//! CREATE TABLE exits (start_s DOUBLE PRECISION NOT NULL,                 -- requested_at_s, else
//!     seq BIGINT NOT NULL, vm_id TEXT NOT NULL, ..., request TEXT,         -- placed_at_s; the
//!     ended_at_s DOUBLE PRECISION NOT NULL,                                -- columns of vms
//!     PRIMARY KEY (start_s, seq));
//! ```
//!
//! **The change log** (schema 8, issue 44). Every committed batch is one row of `changes`: the
//! agent that wrote it and its changes as [`LoggedChange`]s (JSON; a placement carries the whole VM
//! record, its request's time and facts included, so a following agent holds what the tables
//! hold). Its position comes from the sequence `log_seq`, taken after every lock the batch takes
//! (its hosts' rows, then its VM ids' advisory locks): concurrent commits of different agents hold
//! no common row through their flush, so PostgreSQL flushes them together, while two batches that
//! touch one row get positions in the order they commit. (Until schema 7 the position was a
//! row of `log_head`, whose lock every commit held through its flush: the zone committed one batch
//! per `fdatasync`, whatever its agent count.) Positions are therefore not visible in their
//! order; which of them a view holds, and how a position missing below a visible one is settled
//! (still committing, or rolled back and then claimed by a follower with an empty row), is
//! [`super::log_view`]'s. Nothing refuses a batch once it has its position: every check comes
//! before, and its row is inserted right after it. Each agent follows the rows it does not hold before it decides
//! ([`PostgresStore::follow`]), applying them in position order; the state it loads comes with
//! the positions its snapshot saw. Its own batch is applied already: the commit answers the
//! positions of the last batches on each of its hosts (`hosts.last_seq`), and when the view held
//! them all the batch is in order ([`super::Committed::InOrder`]); otherwise it is taken back in
//! memory and applied again from the log, in the store's order (a batch that writes the drain,
//! the consolidation or migrations is in order only right after the view's settled part). Rows are
//! kept for [`LOG_KEPT`] positions; an agent behind the pruned part (`meta.log_pruned`) finds a gap
//! and rebuilds from the tables.
//!
//! **Rejections** ([`PostgresStore::apply_decisions`]). The same VM id can reach two agents at once
//! (a client's retry on another agent after a timeout), and their views may differ: one may reject
//! it while the other places it. A batch that answers requests "rejected" records their ids in
//! `rejections` at its log position; a batch with no write is the log function alone. Then the function reads which of the placed ids another agent rejected
//! after this agent's view, or less than [`REJECTION_STANDS_S`] ago
//! ([`StoreError::RejectedElsewhere`]: the batch is refused, and those requests are answered
//! rejected, the first answer), and which of the rejected ids are placed (the batch is refused:
//! decided again after following, the answer is that placement, replayed). Every commit holds an
//! advisory lock per VM id it places, rejects or releases from before it takes its position to its
//! end, and each statement of the function takes a snapshot of its own (read committed), so these
//! reads see every commit before this one that decided one of its ids. "After this agent's view"
//! is a position above the view's settled part that the view does not hold (the function is given
//! both). Rejections are trimmed with the log, once they no longer stand.
//!
//! **Releases** (schema 6, issue 31). A commit can reach the database long after its batch was
//! decided: held on the network by a partition, it lands after the client gave up on it, retried
//! on another agent, had the VM placed there and released it. The primary key cannot refuse that
//! placement (the id is no longer in `vms`), so the log function records each released id at its
//! log position in `releases` and refuses a batch that places an id released after this agent's
//! view (`AL003`: decided again after following, where the request, given up by its caller, is
//! not applied). A view older than the log keeps is refused the same way: the releases are
//! trimmed with the log.

use super::export::{ExportError, ExportHeader, ExportSink, ExportWindow, ExportedVm};
use super::listener::{Listener, Waker};
use super::log_view::{LogView, CLAIM_AFTER};
use super::notifier::{self, Notifier};
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
pub const SCHEMA_VERSION: i64 = 9;

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
    /// The change-log positions this agent's view holds.
    view: LogView,
    /// The listener's generation when this agent last followed (see [`Listener::up_to`]).
    followed_generation: u64,
    statements: Statements,
    /// The agents whose batches this one followed, with the last row of each.
    seen: std::collections::HashMap<String, i64>,
    /// How exits are kept, the newest exit this agent wrote (model clock) and when it last pruned.
    retention: ExitRetention,
    newest_exit_s: f64,
    pruned_at: Option<std::time::Instant>,
    /// Other agents' commits, as notified.
    listener: Listener,
    /// Tells the other agents of this agent's commits.
    notifier: Notifier,
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

/// The connection settings of `url`, with the agent's defaults for what it leaves out.
fn connection_config(url: &str) -> Result<postgres::Config, postgres::Error> {
    let mut config: postgres::Config = url.parse()?;
    // Cut off from the database, an agent must not wait for TCP to give up (minutes): its
    // clients get 503 and it reconnects.
    if config.get_connect_timeout().is_none() {
        config.connect_timeout(CONNECT_TIMEOUT);
    }
    if config.get_tcp_user_timeout().is_none() {
        config.tcp_user_timeout(TCP_USER_TIMEOUT);
    }
    config.keepalives(true).keepalives_idle(KEEPALIVE_IDLE);
    Ok(config)
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
        let config = connection_config(url).map_err(open_error)?;
        let mut client = config.connect(NoTls).map_err(open_error)?;
        // A transaction of an agent holds its hosts' row locks and the change log's head: the
        // other agents' commits wait for it. One cut off in the middle (partitioned, stopped)
        // would stall the zone until its connection died; the server ends such a session after
        // this long instead (only a batch written change by change holds a transaction open between
        // round trips, for a few of them).
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
        // On a connection of its own: the agent's waits for the agent's statements.
        let listener = Listener::start(config.clone(), &agent);
        let notifier = Notifier::start(config);
        Ok(PostgresStore {
            client,
            name,
            agent,
            view: LogView::default(),
            followed_generation: 0,
            listener,
            notifier,
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
        // A load is a follow: the listener's commits from now on are news to this view.
        let generation = self.listener.following();
        // The positions the snapshot sees in the window the log keeps; older ones are settled.
        let head = tx
            .query_one(
                "SELECT COALESCE(max(seq), 0), COALESCE((SELECT value FROM meta WHERE key = 'log_pruned'), 0)
                 FROM changes",
                &[],
            )
            .map_err(sql("reading the change log"))?;
        let (newest, pruned): (i64, i64) = (head.get(0), head.get(1));
        let floor = pruned.max(newest - LOG_KEPT).max(0);
        let visible: Vec<i64> = tx
            .query("SELECT seq FROM changes WHERE seq > $1 ORDER BY seq", &[&floor])
            .map_err(sql("reading the change log"))?
            .iter()
            .map(|row| row.get(0))
            .collect();
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
        let consolidation = tx
            .query_opt("SELECT record FROM consolidation WHERE id = 1", &[])
            .map_err(sql("reading the consolidation"))?
            .map(|row| serde_json::from_str(row.get::<_, &str>(0)))
            .transpose()
            .map_err(|e| StoreError::CorruptConsolidation { store: name.clone(), detail: e.to_string() })?;
        tx.commit().map_err(sql("reading the state"))?;
        self.view = LogView::loaded(floor, &visible, std::time::Instant::now());
        self.followed_generation = generation;
        Ok(StoredState { vms, host_states, policy_hosts, migrations, drain, consolidation })
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

    /// See [`super::PlacementStore::known_current`]: listening, and no other agent's commit
    /// notified past what this agent followed.
    pub fn known_current(&self) -> bool {
        !self.view.unsettled() && self.listener.up_to(self.followed_generation, |seq| self.view.holds(seq))
    }

    /// See [`super::PlacementStore::set_waker`].
    pub fn set_waker(&mut self, wake: Waker) {
        self.listener.set_waker(wake);
    }

    /// See [`super::PlacementStore::follow_notified`]: the batches other agents' notifications
    /// carried (see [`super::listener`]), while every commit since this agent last read the log
    /// was notified and none pending is overdue for a claim, which only reading the log does.
    pub fn follow_notified(&mut self) -> Result<Option<Followed>, StoreError> {
        let now = std::time::Instant::now();
        if !self.view.overdue(now, CLAIM_AFTER).is_empty() || self.listener.following() != self.followed_generation {
            return Ok(None);
        }
        let Some(notified) = self.listener.take_notified(self.followed_generation, |seq| self.view.holds(seq)) else {
            return Ok(None);
        };
        let mut batches = Vec::with_capacity(notified.len());
        let mut visible = Vec::with_capacity(notified.len());
        for (seq, agent, body) in notified {
            visible.push(seq);
            self.saw_agent(&agent, seq);
            batches.push(self.decode_batch(seq, &body)?);
        }
        self.view.saw(visible, now);
        Ok(Some(Followed::Batches(batches)))
    }

    /// An agent wrote the batch at `seq` (see [`Self::agents`]).
    fn saw_agent(&mut self, agent: &str, seq: i64) {
        match self.seen.get_mut(agent) {
            Some(last) => *last = (*last).max(seq),
            None => {
                self.seen.insert(agent.to_owned(), seq);
            }
        }
    }

    /// The changes of the batch at `seq`, as the change log keeps them.
    fn decode_batch(&self, seq: i64, body: &str) -> Result<Vec<LoggedChange>, StoreError> {
        serde_json::from_str(body).map_err(|e| StoreError::CorruptVm {
            store: self.name.clone(),
            vm: format!("change log row {seq}"),
            detail: e.to_string(),
        })
    }

    /// See [`super::PlacementStore::follow`].
    pub fn follow(&mut self) -> Result<Followed, StoreError> {
        let generation = self.listener.following();
        let rows = self
            .client
            .query(&self.statements.follow, &[&self.view.through()])
            .map_err(self.sql("reading the change log"))?;
        // No row: nothing committed past the view's settled part (rows pruned past it would leave
        // the rows that pruned them).
        let Some(first) = rows.first() else {
            self.followed_generation = generation;
            return Ok(Followed::Batches(Vec::new()));
        };
        let pruned: i64 = first.get(3);
        if self.view.through() < pruned {
            // Pruned past this agent: only a reload is exact.
            return Ok(Followed::Gap);
        }
        let mut batches = Vec::with_capacity(rows.len());
        let mut visible = Vec::with_capacity(rows.len());
        for row in &rows {
            let seq: i64 = row.get(0);
            visible.push(seq);
            if self.view.holds(seq) {
                // This agent's own, or followed already above the view's settled part.
                continue;
            }
            let agent: &str = row.get(1);
            if agent.is_empty() {
                // A position claimed as rolled back: no batch.
                continue;
            }
            self.saw_agent(agent, seq);
            batches.push(self.decode_batch(seq, row.get(2))?);
        }
        let now = std::time::Instant::now();
        self.view.saw(visible, now);
        self.followed_generation = generation;
        let overdue = self.view.overdue(now, CLAIM_AFTER);
        if !overdue.is_empty() {
            // Rolled back, almost surely: made visible as empty rows, followed next time (see
            // `log_view`). A batch still running at one of them is refused at its own insert.
            self.client.execute(&self.statements.claim, &[&overdue]).map_err(self.sql("claiming log positions"))?;
            metrics::counter!("allocator_log_positions_claimed_total").increment(overdue.len() as u64);
        }
        let since = self.view.through() - ACTIVE_BATCHES;
        self.seen.retain(|_, last| *last > since);
        Ok(Followed::Batches(batches))
    }

    /// See [`super::PlacementStore::agents`]: this agent and those that wrote one of the last
    /// [`ACTIVE_BATCHES`] batches it followed.
    pub fn agents(&self) -> Vec<&str> {
        let since = self.view.through() - ACTIVE_BATCHES;
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
        let released: Vec<&str> = changes
            .iter()
            .filter_map(|change| match change {
                Change::Released { vm, .. } => Some(vm.as_str()),
                _ => None,
            })
            .collect();
        let logged: Vec<LoggedChange> = changes.iter().map(|c| LoggedChange::of(c, policy_state)).collect();
        let body = serde_json::to_string(&logged).map_err(|e| StoreError::CorruptVm {
            store: self.name.clone(),
            vm: "change log".to_owned(),
            detail: e.to_string(),
        })?;
        let log = LogEntry {
            agent: &self.agent,
            body,
            followed: self.view.through(),
            held: self.view.held_above(),
            placed,
            rejected,
            released,
        };
        let name = self.name.as_str();
        // Whether the batch's effect on this agent's view is what it had on the store: the view
        // held every batch committed before it on the rows it touched.
        let (seq, in_order) = if changes.is_empty() {
            // Rejections only: the log's part alone, a transaction of its own, which the view
            // holds nothing of.
            (log_batch(&mut self.client, &self.statements, &log, &[], name)?, true)
        } else if set_based(changes) {
            let (seq, earlier) = commit_sets(&mut self.client, &self.statements, changes, &log, policy_state, name)?;
            (seq, earlier.iter().all(|seq| self.view.holds(*seq)))
        } else {
            let sql = |context: &'static str| {
                move |source: postgres::Error| {
                    refusal(name, &source).unwrap_or(StoreError::Sql {
                        store: name.to_owned(),
                        context,
                        source: source.into(),
                    })
                }
            };
            let mut tx = self.client.transaction().map_err(sql("starting a transaction"))?;
            let hosts = write_each(&mut tx, changes, policy_state, name)?;
            let hosts: Vec<&str> = hosts.iter().map(String::as_str).collect();
            // Last: the position comes after every lock the batch takes.
            let seq = log_batch(&mut tx, &self.statements, &log, &hosts, name)?;
            tx.commit().map_err(sql("committing"))?;
            // Drains and migrations touch rows whose last writer the store does not say: in
            // order only right after the view's settled part.
            (seq, seq == self.view.through() + 1)
        };
        // Committed: the other agents hear of it now, never from inside the transaction (see
        // `notifier`).
        self.notifier.send(notifier::payload(seq, &self.agent, &log.body));
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
        if in_order {
            self.view.add(seq);
            Ok(Committed::InOrder)
        } else {
            // Followed in the log's order, this batch among the others.
            Ok(Committed::AfterOthers)
        }
    }
}

/// The refusal a batch gets when other agents decided some of its VM ids meanwhile (the log
/// function's `AL001`, `AL002` and `AL003`, the ids in the error's detail): placed what it rejects
/// (decide again: a replay), rejected what it places (the first answer stands), or released what
/// it places after its view (decide again on the followed view).
fn decided_elsewhere(name: &str, db: &postgres::error::DbError) -> Option<StoreError> {
    let vms =
        || -> Vec<String> { db.detail().and_then(|detail| serde_json::from_str(detail).ok()).unwrap_or_default() };
    match db.code().code() {
        "AL002" => {
            metrics::counter!("allocator_decided_elsewhere_total", "decision" => "rejected").increment(1);
            Some(StoreError::RejectedElsewhere { store: name.to_owned(), vms: vms().into_iter().map(VmId).collect() })
        }
        "AL001" => {
            metrics::counter!("allocator_decided_elsewhere_total", "decision" => "placed").increment(1);
            Some(StoreError::Refused {
                store: name.to_owned(),
                detail: format!("VMs {:?} this batch rejects were placed by another agent meanwhile", vms()),
            })
        }
        "AL003" => {
            metrics::counter!("allocator_decided_elsewhere_total", "decision" => "released").increment(1);
            Some(StoreError::Refused { store: name.to_owned(), detail: format!("{} {:?}", db.message(), vms()) })
        }
        _ => None,
    }
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
/// How long data an agent sent may go unacknowledged before its connection fails, when its URL
/// names no `tcp_user_timeout`: a database whose machine or link vanished in the middle of a query
/// would otherwise hold the agent until TCP gives up (about 15 minutes; keepalives only probe idle
/// connections). A slow query on a live connection is not cut: the server acknowledges what it
/// receives.
const TCP_USER_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);
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
                     host_id TEXT NOT NULL,
                     tenant_id TEXT NOT NULL,
                     vm_type TEXT NOT NULL,
                     cores_base BIGINT NOT NULL, memory_base BIGINT NOT NULL, ssd_base BIGINT NOT NULL,
                     placed_at_s DOUBLE PRECISION NOT NULL,
                     prediction TEXT,
                     requested_at_s DOUBLE PRECISION,
                     request TEXT
                 );
                 ALTER TABLE vms DROP CONSTRAINT IF EXISTS vms_host_id_fkey;
                 ALTER TABLE vms ADD COLUMN IF NOT EXISTS requested_at_s DOUBLE PRECISION;
                 ALTER TABLE vms ADD COLUMN IF NOT EXISTS request TEXT;
                 CREATE TABLE IF NOT EXISTS migrations (
                     vm_id TEXT PRIMARY KEY,
                     target_host_id TEXT NOT NULL REFERENCES hosts (host_id),
                     cores_base BIGINT NOT NULL, memory_base BIGINT NOT NULL, ssd_base BIGINT NOT NULL
                 );
                 CREATE TABLE IF NOT EXISTS drain (id INTEGER PRIMARY KEY CHECK (id = 1), record TEXT NOT NULL);
                 CREATE TABLE IF NOT EXISTS consolidation (
                     id INTEGER PRIMARY KEY CHECK (id = 1), record TEXT NOT NULL);
                 ALTER TABLE hosts ADD COLUMN IF NOT EXISTS last_seq BIGINT NOT NULL DEFAULT 0;
                 CREATE TABLE IF NOT EXISTS changes (seq BIGINT PRIMARY KEY, agent TEXT NOT NULL, body TEXT NOT NULL);
                 -- Positions from a sequence since schema 8, where version 7 kept a head row.
                 CREATE TABLE IF NOT EXISTS log_head (id INTEGER PRIMARY KEY CHECK (id = 1), seq BIGINT NOT NULL);
                 INSERT INTO log_head (id, seq) VALUES (1, 0) ON CONFLICT (id) DO NOTHING;
                 CREATE SEQUENCE IF NOT EXISTS log_seq;
                 -- (Schema 8 has the sequence already: it never goes back.)
                 SELECT setval('log_seq', GREATEST(seq, (SELECT COALESCE(max(seq), 0) FROM changes),
                                                   COALESCE(pg_sequence_last_value('log_seq'), 0), 1),
                               GREATEST(seq, (SELECT COALESCE(max(seq), 0) FROM changes),
                                        COALESCE(pg_sequence_last_value('log_seq'), 0)) > 0)
                     FROM log_head WHERE id = 1;
                 DROP TABLE log_head;
                 CREATE TABLE IF NOT EXISTS rejections (
                     vm_id TEXT PRIMARY KEY, seq BIGINT NOT NULL, at TIMESTAMPTZ NOT NULL DEFAULT now());
                 CREATE INDEX IF NOT EXISTS rejections_by_seq ON rejections (seq);
                 CREATE TABLE IF NOT EXISTS releases (vm_id TEXT PRIMARY KEY, seq BIGINT NOT NULL);
                 CREATE INDEX IF NOT EXISTS releases_by_seq ON releases (seq);
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
                 INSERT INTO meta (key, value) VALUES ('schema_version', 9)
                     ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value;",
            )
            .map_err(sql("creating the schema"))?;
            tx.batch_execute(BATCH_FUNCTIONS).map_err(sql("creating the batch functions"))?;
        }
    }
    seed_hosts(&mut tx, inventory, name)?;
    tx.commit().map_err(sql("committing the schema set-up"))
}

/// Takes the row locks of `hosts` in one order for every agent (the database's order of host ids),
/// so that two batches never wait on each other's hosts in a cycle; refuses a host not in the store.
/// (`allocator_commit_batch` does the same for the set-based batches.)
const LOCK_HOSTS: &str = "SELECT host_id FROM hosts WHERE host_id = ANY($1::text[]) ORDER BY host_id FOR NO KEY UPDATE";

fn lock_hosts(tx: &mut Transaction<'_>, hosts: &[&str], name: &str) -> Result<(), StoreError> {
    if hosts.is_empty() {
        return Ok(());
    }
    let rows = tx.query(LOCK_HOSTS, &[&hosts]).map_err(|source| {
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
struct Statements {
    commit_batch: Statement,
    log_batch: Statement,
    follow: Statement,
    claim: Statement,
}

impl Statements {
    fn prepare(client: &mut Client) -> Result<Self, postgres::Error> {
        Ok(Statements {
            commit_batch: client.prepare(
                "SELECT allocator_commit_batch($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15,
                                               $16, $17, $18, $19, $20, $21, $22, $23, $24, $25)",
            )?,
            log_batch: client.prepare("SELECT allocator_log_batch($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)")?,
            // One snapshot for the rows and its transaction-id bounds (a row with no batch when
            // there is none to follow).
            // By the primary key, in its order (the log grows: a scan of it per follow cost ten
            // times the database's CPU per batch); the pruned mark with every row.
            follow: client.prepare(
                "SELECT seq, agent, body, COALESCE((SELECT value FROM meta WHERE key = 'log_pruned'), 0)
                 FROM changes WHERE seq > $1 ORDER BY seq",
            )?,
            claim: client.prepare(
                "INSERT INTO changes (seq, agent, body) SELECT seq, '', '[]' FROM unnest($1::bigint[]) AS seq
                 ON CONFLICT (seq) DO NOTHING",
            )?,
        })
    }
}

/// The server-side functions that write a batch (schema 5; schema 6 records releases), created or
/// replaced with the schema.
///
/// `allocator_log_batch` is the end of every batch: it moves the log's head (taking its row lock,
/// held to the commit: the log's order is the commit order), inserts the batch's row, records its
/// rejections and releases at that position, refuses the batch (an error rolls all of it back)
/// when another agent rejected one of the VM ids it places after this agent's view or less than
/// `p_stands` seconds ago (`AL002`, the ids as a JSON array in the detail), placed one of those it
/// rejects (`AL001`), or released one it places after this agent's view (`AL003`; also a view
/// older than the log keeps), and trims the log and the releases every 1,000 batches (the agent
/// notifies [`super::listener::CHANNEL`] after the commit: [`Notifier`]). Its
/// reads come after the head's lock is granted, each with a snapshot of its own (read
/// committed), so they see every batch committed before this one.
///
/// `allocator_commit_batch` writes a batch of placements, releases, host and policy states, then
/// calls the log's part: the placed VMs go in (the primary key refuses a second placement), the
/// released ones move to `exits`, each touched host's row is locked in the order of host ids (the
/// same for every agent: batches never deadlock on hosts; a host not in the store is refused
/// there, which is why `vms` needs no foreign key, whose per-row trigger cost 6% of the backend's
/// CPU) and gets its net use (the check refuses an over-commit), then the host and policy states.
/// Called outside a transaction, it is one.
///
/// Both read and write by key only, and say so to the planner (`SET enable_seqscan = off`): the
/// tables churn faster than autovacuum's statistics follow, and with them the planner scanned
/// the whole of `vms` (about 1,300 rows and 17,000 dead ones) for the released VMs of every batch
/// and `hosts` twice, in the agents bench (`pg_stat_user_tables`: one sequential scan of `vms`
/// per batch, no index scan), which was most of PostgreSQL's CPU per batch. Their statements
/// are planned once per connection (`plan_cache_mode = force_generic_plan`): with arrays for
/// parameters the plan cache otherwise planned each call afresh (13% of the backend's CPU).
const BATCH_FUNCTIONS: &str = "
DROP FUNCTION IF EXISTS allocator_log_batch(text, text, bigint, double precision, bigint, text[], text[]);
DROP FUNCTION IF EXISTS allocator_log_batch(text, text, bigint, double precision, bigint, text[], text[], text[]);
DROP FUNCTION IF EXISTS allocator_commit_batch(
    text, text, bigint, double precision, bigint, text[], text[], text[], text[], bigint[], bigint[], bigint[],
    double precision[], text[], double precision[], text[], text[], double precision[], text[], text[], text[],
    text[], text[], text[]);

CREATE OR REPLACE FUNCTION allocator_position(
    p_agent text, p_body text, p_followed bigint, p_held bigint[], p_stands double precision, p_log_kept bigint,
    p_placed text[], p_rejected text[], p_released text[]) RETURNS bigint
LANGUAGE plpgsql SET enable_seqscan = off SET plan_cache_mode = force_generic_plan AS $fn$
DECLARE
    v_key integer;
    v_ids text[];
    v_seq bigint;
BEGIN
    -- The VM ids' locks, in one order for every batch: another batch deciding one of them commits
    -- wholly before or after this one, so the reads below see it or it sees this one.
    FOR v_key IN SELECT DISTINCT hashtext(id) FROM unnest(p_placed || p_rejected || p_released) AS id ORDER BY 1
    LOOP
        PERFORM pg_advisory_xact_lock(4403, v_key);
    END LOOP;
    IF cardinality(p_placed) > 0 THEN
        SELECT array_agg(vm_id) INTO v_ids FROM rejections
            WHERE vm_id = ANY (p_placed)
              AND (seq > p_followed AND NOT seq = ANY (p_held) OR at > now() - p_stands * INTERVAL '1 second');
        IF v_ids IS NOT NULL THEN
            RAISE EXCEPTION 'VMs this batch places were rejected by another agent meanwhile'
                USING ERRCODE = 'AL002', DETAIL = array_to_json(v_ids)::text;
        END IF;
        -- A function, not `SELECT last_value FROM log_seq`: a scan with sequential scans off costs
        -- as much as JIT-compiling the query (130 ms a call), which it then does.
        IF p_followed < COALESCE(pg_sequence_last_value('log_seq'), 0) - p_log_kept THEN
            RAISE EXCEPTION 'this batch was decided on a view older than the change log keeps'
                USING ERRCODE = 'AL003', DETAIL = '[]';
        END IF;
        SELECT array_agg(vm_id) INTO v_ids FROM releases
            WHERE vm_id = ANY (p_placed) AND seq > p_followed AND NOT seq = ANY (p_held);
        IF v_ids IS NOT NULL THEN
            RAISE EXCEPTION 'VMs this batch places were released by another agent after its view'
                USING ERRCODE = 'AL003', DETAIL = array_to_json(v_ids)::text;
        END IF;
    END IF;
    IF cardinality(p_rejected) > 0 THEN
        SELECT array_agg(vm_id) INTO v_ids FROM vms WHERE vm_id = ANY (p_rejected);
        IF v_ids IS NOT NULL THEN
            RAISE EXCEPTION 'VMs this batch rejects were placed by another agent meanwhile'
                USING ERRCODE = 'AL001', DETAIL = array_to_json(v_ids)::text;
        END IF;
    END IF;
    -- Nothing refuses the batch from here on, and its row follows its position at once: a
    -- position stays unseen only while its batch commits, or when it was rolled back (a lost
    -- connection, a crash), which a follower then claims.
    v_seq := nextval('log_seq');
    INSERT INTO changes (seq, agent, body) VALUES (v_seq, p_agent, p_body);
    -- No NOTIFY here (schema 9): it would hold PostgreSQL's lock for notifications through the
    -- commit's flush, and every agent's commit would wait for the one before (the agent notifies
    -- after the commit instead).
    RETURN v_seq;
END
$fn$;

CREATE OR REPLACE FUNCTION allocator_log_at(
    p_seq bigint, p_agent text, p_stands double precision, p_log_kept bigint, p_rejected text[],
    p_released text[]) RETURNS void
LANGUAGE plpgsql SET enable_seqscan = off SET plan_cache_mode = force_generic_plan AS $fn$
BEGIN
    IF cardinality(p_rejected) > 0 THEN
        INSERT INTO rejections (vm_id, seq, at)
            SELECT r.vm_id, p_seq, now() FROM unnest(p_rejected) AS r(vm_id)
            ON CONFLICT (vm_id) DO UPDATE SET seq = EXCLUDED.seq, at = EXCLUDED.at;
    END IF;
    IF cardinality(p_released) > 0 THEN
        INSERT INTO releases (vm_id, seq)
            SELECT r.vm_id, p_seq FROM unnest(p_released) AS r(vm_id)
            ON CONFLICT (vm_id) DO UPDATE SET seq = EXCLUDED.seq;
    END IF;
    IF p_seq % 1000 = 0 THEN
        DELETE FROM changes WHERE seq <= p_seq - p_log_kept;
        DELETE FROM rejections WHERE seq <= p_seq - p_log_kept AND at < now() - p_stands * INTERVAL '1 second';
        DELETE FROM releases WHERE seq <= p_seq - p_log_kept;
        INSERT INTO meta (key, value) VALUES ('log_pruned', p_seq - p_log_kept)
            ON CONFLICT (key) DO UPDATE SET value = GREATEST(meta.value, EXCLUDED.value);
    END IF;
END
$fn$;

CREATE OR REPLACE FUNCTION allocator_log_batch(
    p_agent text, p_body text, p_followed bigint, p_held bigint[], p_stands double precision, p_log_kept bigint,
    p_placed text[], p_rejected text[], p_released text[], p_hosts text[]) RETURNS bigint
LANGUAGE plpgsql SET enable_seqscan = off SET plan_cache_mode = force_generic_plan AS $fn$
DECLARE
    v_seq bigint;
BEGIN
    v_seq := allocator_position(p_agent, p_body, p_followed, p_held, p_stands, p_log_kept, p_placed, p_rejected,
                                p_released);
    IF cardinality(p_hosts) > 0 THEN
        UPDATE hosts SET last_seq = v_seq WHERE host_id = ANY (p_hosts);
    END IF;
    PERFORM allocator_log_at(v_seq, p_agent, p_stands, p_log_kept, p_rejected, p_released);
    RETURN v_seq;
END
$fn$;

CREATE OR REPLACE FUNCTION allocator_commit_batch(
    p_agent text, p_body text, p_followed bigint, p_held bigint[], p_stands double precision, p_log_kept bigint,
    p_vm_id text[], p_host_id text[], p_tenant_id text[], p_vm_type text[],
    p_cores bigint[], p_memory bigint[], p_ssd bigint[], p_placed_at_s double precision[],
    p_prediction text[], p_requested_at_s double precision[], p_request text[],
    p_released text[], p_ended_at_s double precision[],
    p_state_host text[], p_state text[],
    p_policy_host text[], p_policy text[], p_policy_state text[],
    p_rejected text[]) RETURNS bigint[]
LANGUAGE plpgsql SET enable_seqscan = off SET plan_cache_mode = force_generic_plan AS $fn$
DECLARE
    v_hosts text[];
    v_cores bigint[];
    v_memory bigint[];
    v_ssd bigint[];
    v_touched text[];
    v_locked bigint;
    v_missing text;
    v_earlier bigint[];
    v_seq bigint;
BEGIN
    IF cardinality(p_vm_id) > 0 THEN
        INSERT INTO vms (vm_id, seq, host_id, tenant_id, vm_type, cores_base, memory_base, ssd_base,
                         placed_at_s, prediction, requested_at_s, request)
            SELECT v.vm_id, nextval('vm_seq'), v.host_id, v.tenant_id, v.vm_type, v.cores, v.memory, v.ssd,
                   v.placed_at_s, v.prediction, v.requested_at_s, v.request
            FROM unnest(p_vm_id, p_host_id, p_tenant_id, p_vm_type, p_cores, p_memory, p_ssd, p_placed_at_s,
                        p_prediction, p_requested_at_s, p_request)
                 WITH ORDINALITY
                 AS v(vm_id, host_id, tenant_id, vm_type, cores, memory, ssd, placed_at_s, prediction,
                      requested_at_s, request, position)
            ORDER BY v.position;
    END IF;
    -- The released VMs leave for exits, and each host's net use of the batch, in host order.
    WITH gone AS (DELETE FROM vms WHERE vm_id = ANY (p_released) RETURNING *),
         kept AS (INSERT INTO exits (start_s, seq, vm_id, host_id, tenant_id, vm_type, cores_base,
                                     memory_base, ssd_base, placed_at_s, prediction, requested_at_s,
                                     request, ended_at_s)
                  SELECT COALESCE(g.requested_at_s, g.placed_at_s), g.seq, g.vm_id, g.host_id,
                         g.tenant_id, g.vm_type, g.cores_base, g.memory_base, g.ssd_base,
                         g.placed_at_s, g.prediction, g.requested_at_s, g.request, e.ended_at_s
                  FROM gone g JOIN unnest(p_released, p_ended_at_s) AS e(vm_id, ended_at_s) ON e.vm_id = g.vm_id),
         moved AS (SELECT p.host_id, p.cores, p.memory, p.ssd
                   FROM unnest(p_host_id, p_cores, p_memory, p_ssd) AS p(host_id, cores, memory, ssd)
                   UNION ALL
                   SELECT g.host_id, -g.cores_base, -g.memory_base, -g.ssd_base FROM gone g),
         net AS (SELECT host_id, sum(cores)::bigint AS cores, sum(memory)::bigint AS memory,
                        sum(ssd)::bigint AS ssd
                 FROM moved GROUP BY host_id)
    SELECT array_agg(host_id ORDER BY host_id),
           array_agg(host_id ORDER BY host_id) FILTER (WHERE cores <> 0 OR memory <> 0 OR ssd <> 0),
           array_agg(cores ORDER BY host_id) FILTER (WHERE cores <> 0 OR memory <> 0 OR ssd <> 0),
           array_agg(memory ORDER BY host_id) FILTER (WHERE cores <> 0 OR memory <> 0 OR ssd <> 0),
           array_agg(ssd ORDER BY host_id) FILTER (WHERE cores <> 0 OR memory <> 0 OR ssd <> 0)
        INTO v_touched, v_hosts, v_cores, v_memory, v_ssd
        FROM net;
    -- Every host a VM goes to or leaves, sorted and distinct already: the common batch needs no
    -- statement for it.
    IF cardinality(p_state_host) > 0 OR cardinality(p_policy_host) > 0 THEN
        SELECT array_agg(DISTINCT h) INTO v_touched
            FROM unnest(COALESCE(v_touched, '{}') || p_state_host || p_policy_host) AS h;
    END IF;
    IF v_touched IS NOT NULL THEN
        -- Locked, the hosts' last positions are those of the last batches committed on them.
        SELECT count(*), array_agg(DISTINCT l.last_seq) FILTER (WHERE l.last_seq > p_followed)
            INTO v_locked, v_earlier
            FROM (SELECT host_id, last_seq FROM hosts WHERE host_id = ANY (v_touched)
                  ORDER BY host_id FOR NO KEY UPDATE) AS l;
        IF v_locked < cardinality(v_touched) THEN
            SELECT h INTO v_missing FROM unnest(v_touched) AS h
                WHERE NOT EXISTS (SELECT 1 FROM hosts WHERE host_id = h) ORDER BY h LIMIT 1;
            RAISE EXCEPTION 'host `%` is not in the store', v_missing USING ERRCODE = 'foreign_key_violation';
        END IF;
    END IF;
    IF v_hosts IS NOT NULL THEN
        UPDATE hosts SET cores_used = hosts.cores_used + d.cores, memory_used = hosts.memory_used + d.memory,
                         ssd_used = hosts.ssd_used + d.ssd
            FROM unnest(v_hosts, v_cores, v_memory, v_ssd) AS d(host_id, cores, memory, ssd)
            WHERE hosts.host_id = d.host_id;
    END IF;
    IF cardinality(p_policy_host) > 0 THEN
        UPDATE hosts SET policy = d.policy, policy_state = d.state
            FROM unnest(p_policy_host, p_policy, p_policy_state) AS d(host_id, policy, state)
            WHERE hosts.host_id = d.host_id;
    END IF;
    IF cardinality(p_state_host) > 0 THEN
        UPDATE hosts SET state = d.state
            FROM unnest(p_state_host, p_state) AS d(host_id, state)
            WHERE hosts.host_id = d.host_id;
    END IF;
    -- The position after every lock (the hosts' here, the VM ids' in `allocator_position`):
    -- batches that touch one row get positions in the order they commit.
    v_seq := allocator_position(p_agent, p_body, p_followed, p_held, p_stands, p_log_kept, p_vm_id, p_rejected,
                                p_released);
    IF v_touched IS NOT NULL THEN
        UPDATE hosts SET last_seq = v_seq WHERE host_id = ANY (v_touched);
    END IF;
    PERFORM allocator_log_at(v_seq, p_agent, p_stands, p_log_kept, p_rejected, p_released);
    RETURN ARRAY[v_seq] || COALESCE(v_earlier, '{}');
END
$fn$;
";

/// Whether [`commit_sets`] can write `changes`: placements, releases, host and policy states, with
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

/// What the log's part of a batch needs besides its changes (`allocator_log_batch`'s arguments).
struct LogEntry<'a> {
    agent: &'a str,
    /// The batch's changes as the log keeps them (JSON).
    body: String,
    /// The log positions this agent's view reflects: all up to `followed`, and `held` above it.
    followed: i64,
    held: Vec<i64>,
    /// The VM ids the batch places, and those it answered "rejected" (sorted, distinct).
    placed: Vec<&'a str>,
    rejected: Vec<&'a str>,
    /// The VM ids the batch releases.
    released: Vec<&'a str>,
}

/// Writes a batch of placements, releases, host and policy states with one call of
/// `allocator_commit_batch` ([`BATCH_FUNCTIONS`]) outside a transaction: one round trip, one
/// transaction. Answers the batch's log position.
fn commit_sets(
    client: &mut Client,
    statements: &Statements,
    changes: &[Change],
    log: &LogEntry<'_>,
    policy_state: &dyn Fn(&HostId) -> Option<String>,
    name: &str,
) -> Result<(i64, Vec<i64>), StoreError> {
    let mut vms = VmArrays::default();
    let (mut released, mut ends) = (Vec::new(), Vec::new());
    // One state per host, the batch's last (the function writes them as a set); the policy
    // states' snapshots are taken now, so the last one wins anyway.
    let mut states: BTreeMap<&str, &'static str> = BTreeMap::new();
    let mut policies: BTreeMap<&str, (&'static str, Option<String>)> = BTreeMap::new();
    for change in changes {
        match change {
            Change::Placed { vm, host } => {
                let [cores, memory, ssd] = units(&vm.demand);
                vms.vm_id.push(vm.id.as_str());
                vms.host_id.push(host.as_str());
                vms.tenant_id.push(vm.tenant.as_str());
                vms.vm_type.push(vm.vm_type.as_str());
                vms.base[0].push(cores);
                vms.base[1].push(memory);
                vms.base[2].push(ssd);
                vms.placed_at_s.push(vm.placed_at_s);
                vms.prediction.push(prediction_json(vm, name)?);
                vms.requested_at_s.push(vm.requested_at_s);
                vms.request.push(request_json(vm, name)?);
            }
            Change::Released { vm, ended_at_s, .. } => {
                released.push(vm.as_str());
                ends.push(*ended_at_s);
            }
            Change::HostState { host, state, .. } => {
                states.insert(host.as_str(), state_name(*state));
            }
            Change::PolicyHostState { host, policy } => {
                policies.insert(host.as_str(), (*policy, policy_state(host)));
            }
            // `set_based` sends the other changes to `write_each`.
            _ => {}
        }
    }
    let (state_hosts, state_names): (Vec<&str>, Vec<&str>) = states.into_iter().unzip();
    let policy_hosts: Vec<&str> = policies.keys().copied().collect();
    let (kinds, snapshots): (Vec<Option<&str>>, Vec<Option<&str>>) =
        policies.values().map(|(policy, state)| (state.as_ref().map(|_| *policy), state.as_deref())).unzip();
    let row = client
        .query_one(
            &statements.commit_batch,
            &[
                &log.agent,
                &log.body,
                &log.followed,
                &log.held,
                &REJECTION_STANDS_S,
                &LOG_KEPT,
                &vms.vm_id,
                &vms.host_id,
                &vms.tenant_id,
                &vms.vm_type,
                &vms.base[0],
                &vms.base[1],
                &vms.base[2],
                &vms.placed_at_s,
                &vms.prediction,
                &vms.requested_at_s,
                &vms.request,
                &released,
                &ends,
                &state_hosts,
                &state_names,
                &policy_hosts,
                &kinds,
                &snapshots,
                &log.rejected,
            ],
        )
        .map_err(|source| {
            refusal(name, &source).unwrap_or_else(|| StoreError::Sql {
                store: name.to_owned(),
                context: "committing a batch",
                source: source.into(),
            })
        })?;
    let mut positions: Vec<i64> = row.get(0);
    if positions.is_empty() {
        return Err(StoreError::Sql {
            store: name.to_owned(),
            context: "committing a batch",
            source: "the batch function answered no log position".into(),
        });
    }
    let seq = positions.remove(0);
    Ok((seq, positions))
}

/// The log's part of a batch, `allocator_log_batch` ([`BATCH_FUNCTIONS`]), on `client` (in a
/// batch's transaction, or a transaction of its own for a batch with no write). Answers the
/// batch's log position.
fn log_batch(
    client: &mut impl postgres::GenericClient,
    statements: &Statements,
    log: &LogEntry<'_>,
    hosts: &[&str],
    name: &str,
) -> Result<i64, StoreError> {
    let row = client
        .query_one(
            &statements.log_batch,
            &[
                &log.agent,
                &log.body,
                &log.followed,
                &log.held,
                &REJECTION_STANDS_S,
                &LOG_KEPT,
                &log.placed,
                &log.rejected,
                &log.released,
                &hosts,
            ],
        )
        .map_err(|source| {
            refusal(name, &source).unwrap_or_else(|| StoreError::Sql {
                store: name.to_owned(),
                context: "appending to the change log",
                source: source.into(),
            })
        })?;
    Ok(row.get(0))
}

/// The placed VMs of a batch, column by column, for [`commit_sets`].
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

/// Writes a one-row record table (`drain`, `consolidation`): the record's JSON, or no row.
fn write_record(tx: &mut Transaction<'_>, table: &'static str, record: Option<String>) -> Result<u64, postgres::Error> {
    match record {
        Some(record) => tx.execute(
            &format!(
                "INSERT INTO {table} (id, record) VALUES (1, $1) ON CONFLICT (id) DO UPDATE SET record = EXCLUDED.record"
            ),
            &[&record],
        ),
        None => tx.execute(&format!("DELETE FROM {table}"), &[]),
    }
}

/// Writes a batch change by change, in order: batches with drains or migrations, or that place and
/// release the same VM. The set-based [`commit_sets`] covers the rest.
fn write_each(
    tx: &mut Transaction<'_>,
    changes: &[Change],
    policy_state: &dyn Fn(&HostId) -> Option<String>,
    name: &str,
) -> Result<Vec<String>, StoreError> {
    let sql = |context: &'static str| {
        move |source: postgres::Error| {
            refusal(name, &source).unwrap_or(StoreError::Sql { store: name.to_owned(), context, source: source.into() })
        }
    };
    // What each host's use changes by, written once per host at the end, in host order: two
    // agents' batches then lock hosts in the same order and cannot deadlock, and the check
    // judges each host's net use.
    let mut used: BTreeMap<String, [i64; RESOURCE_DIMS]> = BTreeMap::new();
    // The hosts whose state the batch writes besides.
    let mut stated: std::collections::BTreeSet<String> = std::collections::BTreeSet::new();
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
                stated.insert(host.as_str().to_owned());
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
                write_record(tx, "drain", record).map_err(sql("recording the drain"))?;
            }
            Change::Consolidation(consolidation) => {
                let record =
                    consolidation.as_ref().map(serde_json::to_string).transpose().map_err(|e| {
                        StoreError::CorruptConsolidation { store: name.to_owned(), detail: e.to_string() }
                    })?;
                write_record(tx, "consolidation", record).map_err(sql("recording the consolidation"))?;
            }
            Change::PolicyHostState { host, policy } => {
                let state = policy_state(host);
                let policy = state.as_ref().map(|_| *policy);
                tx.execute(
                    "UPDATE hosts SET policy = $2, policy_state = $3 WHERE host_id = $1",
                    &[&host.as_str(), &policy, &state],
                )
                .map_err(sql("recording a policy host state"))?;
                stated.insert(host.as_str().to_owned());
            }
        }
    }
    // Every host a VM went to or left, also with no net change: the lock refuses a host not in
    // the store (`vms` has no foreign key since schema 5).
    let hosts: Vec<&str> = used.keys().map(String::as_str).collect();
    lock_hosts(tx, &hosts, name)?;
    for (host, delta) in used.iter().filter(|(_, delta)| delta.iter().any(|d| *d != 0)) {
        add_use(tx, host, *delta, name)?;
    }
    // Every host row the batch wrote, to carry the batch's position.
    stated.extend(used.into_keys());
    Ok(stated.into_iter().collect())
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
        // The batch's log position was claimed by a follower that took it for rolled back.
        SqlState::UNIQUE_VIOLATION if db.constraint() == Some("changes_pkey") => {
            format!("its log position was given up by another agent ({})", db.message())
        }
        SqlState::UNIQUE_VIOLATION => format!("a VM id is placed already ({})", db.message()),
        SqlState::CHECK_VIOLATION => {
            format!("a host would be over-committed ({}; {})", db.message(), db.detail().unwrap_or_default())
        }
        SqlState::FOREIGN_KEY_VIOLATION => format!("a host is not in the store ({})", db.message()),
        // Concurrent batches the database could not order: as good as a conflict, decided again.
        SqlState::T_R_DEADLOCK_DETECTED | SqlState::T_R_SERIALIZATION_FAILURE => {
            format!("a concurrent batch got in the way ({}; {})", db.message(), db.detail().unwrap_or_default())
        }
        _ => return decided_elsewhere(name, db),
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
    use super::{redact, BATCH_FUNCTIONS};

    #[test]
    fn no_batch_function_notifies_inside_the_commit() {
        assert!(!BATCH_FUNCTIONS.contains("pg_notify("), "notifications go after the commit (store::notifier)");
    }

    #[test]
    fn a_url_without_timeouts_gets_the_agents_and_one_with_them_keeps_its_own() {
        use std::time::Duration;
        let config = super::connection_config("postgres://alloc@db:5432/zone").unwrap();
        assert_eq!(config.get_connect_timeout(), Some(&super::CONNECT_TIMEOUT));
        assert_eq!(config.get_tcp_user_timeout(), Some(&super::TCP_USER_TIMEOUT));
        assert!(config.get_keepalives());
        let config =
            super::connection_config("postgres://alloc@db:5432/zone?connect_timeout=1&tcp_user_timeout=9").unwrap();
        assert_eq!(config.get_connect_timeout(), Some(&Duration::from_secs(1)));
        assert_eq!(config.get_tcp_user_timeout(), Some(&Duration::from_secs(9)));
    }

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
