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
//! CREATE SEQUENCE inventory_seq;                                           -- schema 10: hosts
//! CREATE TABLE inventory (host_id TEXT PRIMARY KEY, pos BIGINT NOT NULL,  -- added or changed (JSON)
//!     entry TEXT);                                                         -- or removed (NULL) at
//! ```                                                                      -- run time, in order
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
mod schema;
mod trace;
mod write;

use schema::init;
pub use trace::export;
use write::{commit_sets, log_batch, set_based, write_each, LogEntry, Statements};

use super::listener::{Listener, Waker};
use super::log_view::{LogView, CLAIM_AFTER};
use super::notifier::{self, Notifier};
pub use super::REJECTION_STANDS_S;
use super::{
    entry_json, parse_entry, parse_state, prediction_json, request_json, state_name, Committed, ExitRetention,
    Followed, StandingRejection, StoreError, StoredState, VmColumns,
};
use domain::{HostEntry, HostId, InventorySpec, Rejection, Resources, VmId, RESOURCE_DIMS};
use placement::journal::{Change, LoggedChange};
use postgres::error::SqlState;
use postgres::{Client, NoTls, Statement, Transaction};
use std::collections::BTreeMap;

/// Version of the schema this code writes and reads.
pub const SCHEMA_VERSION: i64 = 10;

const NEWER_SCHEMA_FIX: &str =
    "run the release that wrote it, or point `store` at a database of its own for this release";

/// How many hosts one statement seeds.
const SEED_CHUNK: usize = 500;

/// An agent counts as active while one of the last this many batches of the change log is its.
const ACTIVE_BATCHES: i64 = 1000;

/// How many batches the change log keeps.
pub const LOG_KEPT: i64 = 100_000;

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
    // `tcp_user_timeout` only counts while data of the agent's is unacknowledged. A statement the
    // server's TCP acknowledged and then vanished with (a commit waiting for the synchronous
    // standby, a statement waiting on a lock, when the primary's link goes) leaves nothing
    // unacknowledged: only keepalives find that connection dead, and they probe at the kernel's
    // interval (75 s) unless told otherwise. Probes are answered by a live server's kernel, so a
    // slow statement on a live connection is never cut.
    config.keepalives(true);
    if config.get_keepalives_idle() == DRIVER_KEEPALIVE_IDLE {
        config.keepalives_idle(KEEPALIVE_IDLE);
    }
    if config.get_keepalives_interval().is_none() {
        config.keepalives_interval(KEEPALIVE_INTERVAL);
    }
    if config.get_keepalives_retries().is_none() {
        config.keepalives_retries(KEEPALIVE_RETRIES);
    }
    Ok(config)
}

/// A connection to the database at `url` (named `name`, redacted) with [`connection_config`]'s
/// settings, and those settings, for the store's other connections.
fn connect(url: &str, name: &str) -> Result<(postgres::Client, postgres::Config), StoreError> {
    let config = connection_config(url).map_err(open_error(name))?;
    let client = config.connect(NoTls).map_err(open_error(name))?;
    Ok((client, config))
}

/// The store `name` (redacted) could not be opened.
fn open_error(name: &str) -> impl Fn(postgres::Error) -> StoreError + '_ {
    move |source| StoreError::Open { store: format!("`store` = {name}"), source: source.into() }
}

fn units(resources: &Resources) -> [i64; RESOURCE_DIMS] {
    resources.base_units().map(|u| i64::try_from(u).unwrap_or(i64::MAX))
}

impl PostgresStore {
    /// Connects, creates or checks the schema, and seeds the inventory's hosts.
    pub fn open(url: &str, inventory: &InventorySpec) -> Result<Self, StoreError> {
        let name = redact(url);
        let (mut client, config) = connect(url, &name)?;
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
            .map_err(open_error(&name))?;
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
        refusal_or_sql(&self.name, context)
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
        // The rejections that stand, on the database's clock (the agents' may differ).
        let rejections = tx
            .query(
                "SELECT vm_id, EXTRACT(EPOCH FROM now() - at)::float8 FROM rejections
                 WHERE at > now() - $1 * INTERVAL '1 second'",
                &[&REJECTION_STANDS_S],
            )
            .map_err(sql("reading the rejections"))?
            .into_iter()
            .map(|row| StandingRejection { vm: VmId(row.get(0)), age_s: row.get(1), rejection: None })
            .collect();
        let mut inventory = Vec::new();
        for row in
            tx.query("SELECT host_id, entry FROM inventory ORDER BY pos", &[]).map_err(sql("reading the inventory"))?
        {
            let host = HostId(row.get(0));
            let entry = row.get::<_, Option<&str>>(1).map(|json| parse_entry(&name, &host, json)).transpose()?;
            inventory.push((host, entry));
        }
        tx.commit().map_err(sql("reading the state"))?;
        self.view = LogView::loaded(floor, &visible, std::time::Instant::now());
        self.followed_generation = generation;
        Ok(StoredState { vms, host_states, policy_hosts, migrations, drain, consolidation, rejections, inventory })
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
        let Some(notified) =
            self.listener.take_notified(self.followed_generation, self.view.through(), |seq| self.view.holds(seq))
        else {
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
        rejected: &[(VmId, Rejection)],
        policy_state: &dyn Fn(&HostId) -> Option<String>,
    ) -> Result<Committed, StoreError> {
        if changes.is_empty() && rejected.is_empty() {
            return Ok(Committed::InOrder);
        }
        // One row per id (an upsert may touch a row once per statement); the answers themselves
        // are not kept here: any agent answers a standing id alike.
        let mut rejected: Vec<&str> = rejected.iter().map(|(vm, _)| vm.as_str()).collect();
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
            let sql = |context: &'static str| refusal_or_sql(name, context);
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

/// How long an agent waits to connect when its URL names no `connect_timeout`.
const CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);
/// How long data an agent sent may go unacknowledged before its connection fails, when its URL
/// names no `tcp_user_timeout`: a database whose machine or link vanished while the agent was
/// sending would otherwise hold the agent until TCP gives up (about 15 minutes). A slow query on a
/// live connection is not cut: the server acknowledges what it receives. With keepalives on, it is
/// also how long probes may go unanswered (Linux: the user timeout overrides the probe count).
const TCP_USER_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);
/// Time without anything received before TCP keepalive probes start on an agent's connection,
/// when its URL names no `keepalives_idle`: a connection waiting for an answer to a statement the
/// server acknowledged fails about this plus [`KEEPALIVE_INTERVAL`] after the server vanished.
const KEEPALIVE_IDLE: std::time::Duration = std::time::Duration::from_secs(5);
/// The driver's own `keepalives_idle` (what a URL that names none gets).
const DRIVER_KEEPALIVE_IDLE: std::time::Duration = std::time::Duration::from_secs(2 * 60 * 60);
/// The pause between keepalive probes, when the URL names no `keepalives_interval`.
const KEEPALIVE_INTERVAL: std::time::Duration = std::time::Duration::from_secs(1);
/// Unanswered probes before the connection fails, when the URL names no `keepalives_retries` and
/// sets `tcp_user_timeout=0` (otherwise the user timeout decides).
const KEEPALIVE_RETRIES: u32 = 5;
/// How long the server lets an agent's session sit idle inside a transaction before it ends the
/// session, releasing its locks (see [`PostgresStore::open`]).
const IDLE_IN_TRANSACTION_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

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

/// What a failed statement of a write means: the store's refusal ([`refusal`]), else an SQL error
/// in `context`.
fn refusal_or_sql<'a>(name: &'a str, context: &'static str) -> impl FnOnce(postgres::Error) -> StoreError + 'a {
    move |source| {
        refusal(name, &source).unwrap_or_else(|| StoreError::Sql {
            store: name.to_owned(),
            context,
            source: source.into(),
        })
    }
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
    use super::schema::BATCH_FUNCTIONS;

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
        assert_eq!(config.get_keepalives_idle(), super::KEEPALIVE_IDLE);
        assert_eq!(config.get_keepalives_interval(), Some(super::KEEPALIVE_INTERVAL));
        assert_eq!(config.get_keepalives_retries(), Some(super::KEEPALIVE_RETRIES));
        let config = super::connection_config(
            "postgres://alloc@db:5432/zone?connect_timeout=1&tcp_user_timeout=9&keepalives_idle=30\
             &keepalives_interval=3&keepalives_retries=2",
        )
        .unwrap();
        assert_eq!(config.get_connect_timeout(), Some(&Duration::from_secs(1)));
        assert_eq!(config.get_tcp_user_timeout(), Some(&Duration::from_secs(9)));
        assert_eq!(config.get_keepalives_idle(), Duration::from_secs(30));
        assert_eq!(config.get_keepalives_interval(), Some(Duration::from_secs(3)));
        assert_eq!(config.get_keepalives_retries(), Some(2));
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
