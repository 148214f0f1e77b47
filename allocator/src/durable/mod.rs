//! [`DurableAllocator`]: the [`Allocator`] with its state in a [`Store`], so that an allocation or a
//! release is acknowledged only once it is durable, and a restart rebuilds exactly the acknowledged
//! state.
//!
//! Commands come in batches ([`DurableAllocator::execute`]), which is how group commit works: the
//! writes of a batch (allocations, releases, host states) are applied to the in-memory allocator in
//! order, their effects go to the store in **one** transaction, and only after it commits are the
//! replies handed out. Reads in the batch (allocations, hosts, stats, explain) see the writes before
//! them in the batch and are answered after the same commit, so no reply ever shows unacknowledged
//! state. One `fsync` then pays for a whole batch instead of one request.
//!
//! If the commit fails, the in-memory state is thrown away and rebuilt from the store by the same
//! code as at startup ([`DurableAllocator::open`]), every write of the batch is answered
//! [`CommandError::NotDurable`] and the reads are answered from the rebuilt state: nothing
//! unacknowledged survives and nothing acknowledged is lost. If even the rebuild fails, every
//! command is answered [`CommandError::Unavailable`] and the next batch tries to rebuild again.
//!
//! Conflicting requests, idempotent replays and reads write nothing; a rejected allocation writes
//! only its rejection, which stands for a while (`rejections`: a request sent twice gets the
//! first answer).
//!
//! Each command is a struct with the type of its answer ([`Request`], in `commands`); a batch is a
//! list of [`Job`]s, each answered once the batch is over. This module does no HTTP and needs no
//! async runtime; [`crate::worker`] runs it on a thread.

mod commands;
mod rejections;

use crate::store::{
    self, Committed, ExitRetention, Followed, PlacementStore, StandingRejection, StoreError, StoreLocation, StoredVm,
    Waker,
};
pub use commands::{
    job, Allocate, Answer, BatchTiming, CompleteMigration, ConsolidationPlan, ConsolidationRound, ConsolidationStatus,
    Context, DrainStatus, Explain, FailMigration, Follow, GetAllocation, GetHost, HostFilter, Job, ListHosts,
    PauseConsolidation, Quality, RecordAt, Release, RemoveHost, Request, SetConsolidation, SetHostState,
    SetRepredictor, StartDrain, Stats, Status, UpdateHost,
};
pub use domain::hosts::{
    HostDetail, HostInfo, HostPage, HostStateChange, HostSummary, PolicyHostState, StoreStatus, VmInfo,
};
use domain::{HostId, InventorySpec, QualityReport, VmId};
use placement::allocator::{
    AllocateError, Allocator, AllocatorConfig, AllocatorError, ConflictAvoidance, ConsolidationError, DrainError,
    HostShare,
};
use placement::journal::{Change, LoggedChange};
use placement::outcomes::{OutcomeConfig, OutcomeTracker};
use placement::reprediction::Repredictor;
use placement::state::NewVm;
use placement::state::StateError;
use placement::Registry;
use rejections::{BatchRejections, StandingRejections};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Why the durable state could not be opened or rebuilt.
#[derive(Debug, thiserror::Error)]
pub enum DurableError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("allocator: {0}")]
    Allocator(#[from] AllocatorError),
    #[error("the store {store} contradicts the inventory: VM `{vm}` recorded on host `{host}`: {source}")]
    Contradiction { store: String, vm: VmId, host: HostId, source: Box<StateError> },
    #[error("the store {store} contradicts the inventory: recorded state of host `{host}`: {source}")]
    HostState { store: String, host: HostId, source: Box<StateError> },
    #[error("a refused batch could not be taken back in memory: {0}")]
    Undo(String),
}

/// Why a command was not carried out.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum CommandError {
    /// The request contradicts what is placed (a reused VM id, part of a gang).
    #[error(transparent)]
    Conflict(#[from] AllocateError),
    #[error("VM `{0}` is not placed")]
    UnknownVm(VmId),
    #[error("host `{0}` is not in the inventory")]
    UnknownHost(HostId),
    /// A host change that its VMs forbid (removed or shrunk under them).
    #[error("{0}")]
    HostInUse(String),
    /// A VM recorded on a host without room for it.
    #[error("{0}")]
    DoesNotFit(String),
    /// The batch's commit failed: this write was undone and nothing of it was kept; retry it.
    #[error("the change could not be made durable and was undone: {0}")]
    NotDurable(String),
    /// The store cannot be used right now.
    #[error("the allocator's store is unavailable: {0}")]
    Unavailable(String),
    #[error(transparent)]
    Drain(#[from] DrainError),
    #[error(transparent)]
    Consolidation(#[from] ConsolidationError),
}

/// Why the live state was thrown away and rebuilt from the store: the `reason` of
/// `allocator_reloads_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReloadReason {
    /// A change followed from the store contradicts the view (a flaw: none is expected).
    FollowContradiction,
    /// The change log no longer reaches back to the view's position (pruned past it).
    LogGap,
    /// Reading the change log failed (the store is unreachable).
    LogUnreadable,
    /// A batch's commit failed (the store is unreachable or failed).
    CommitFailed,
    /// A batch the store refused, or committed after others, could not be taken back in memory.
    TakeBackFailed,
    /// A batch panicked (a bug).
    Panic,
    /// The store could not be opened at the last attempt; trying again.
    StoreUnusable,
    /// A host was added, changed or removed (by this agent or another): the allocator is built
    /// on the new inventory.
    InventoryChanged,
}

impl ReloadReason {
    pub fn as_str(self) -> &'static str {
        match self {
            ReloadReason::FollowContradiction => "follow_contradiction",
            ReloadReason::LogGap => "log_gap",
            ReloadReason::LogUnreadable => "log_unreadable",
            ReloadReason::CommitFailed => "commit_failed",
            ReloadReason::TakeBackFailed => "take_back_failed",
            ReloadReason::Panic => "panic",
            ReloadReason::StoreUnusable => "store_unusable",
            ReloadReason::InventoryChanged => "inventory_changed",
        }
    }
}

/// The live allocator and the store it mirrors.
#[derive(Debug)]
struct Live {
    allocator: Allocator,
    store: Box<dyn PlacementStore>,
}

impl Live {
    /// Takes back in memory a batch of this agent's: one the store refused (it wrote nothing of
    /// it; `refused`), whose policy states are then read back from the store, or one it committed
    /// after other agents' batches, which following the log applies again (with its policy
    /// states). The changes other agents committed are followed next. An error means the batch
    /// could not be taken back: rebuild.
    fn take_back(&mut self, ops: &[Change], refused: bool) -> Result<(), DurableError> {
        let policy_hosts = self.allocator.undo(ops).map_err(|e| DurableError::Undo(e.to_string()))?;
        let policy = self.allocator.host_state().map(|p| p.name()).filter(|_| refused && !policy_hosts.is_empty());
        if let Some(policy) = policy {
            let mut recorded: std::collections::HashMap<HostId, (String, String)> = self
                .store
                .policy_states(&policy_hosts)?
                .into_iter()
                .map(|(host, policy, state)| (host, (policy, state)))
                .collect();
            for host in policy_hosts {
                // A host the store does not list is in its initial state.
                let (policy, state) = match recorded.remove(&host) {
                    Some((policy, state)) => (policy, Some(state)),
                    None => (policy.to_owned(), None),
                };
                self.allocator
                    .follow(&LoggedChange::PolicyHostState { host, policy, state })
                    .map_err(|e| DurableError::Undo(e.to_string()))?;
            }
        }
        self.allocator.take_changes().for_each(drop);
        Ok(())
    }
}

/// See the module documentation.
#[derive(Debug)]
pub struct DurableAllocator {
    spec: InventorySpec,
    config: AllocatorConfig,
    /// Where the policy's rules and presets come from (the program's), for every rebuild.
    registry: Registry,
    location: StoreLocation,
    live: Option<Live>,
    /// Why the last rebuild failed, while `live` is `None`.
    broken: Option<String>,
    /// The repredicting model, set again on every rebuild.
    repredictor: Option<Arc<dyn Repredictor>>,
    /// This agent's share of the hosts among the agents of a shared store, and those agents.
    share: Option<(Vec<String>, Arc<HostShare>)>,
    /// The realized outcomes of the predictions VMs were placed with: fed by every placement and
    /// release the store records, this agent's own and those it follows.
    outcomes: OutcomeTracker,
    /// How long the store keeps the VMs that left, set again on every rebuild.
    exit_retention: ExitRetention,
    /// Called when another agent committed (a store shared with others), set again on every
    /// rebuild.
    waker: WakerSlot,
    /// The "rejected" answers that stand (this agent's, and other agents' it learnt of).
    standing: StandingRejections,
    /// Why the live state was dropped, while it waits to be rebuilt.
    dropped: Option<ReloadReason>,
}

/// A [`Waker`] in a struct that derives `Debug`.
#[derive(Default)]
struct WakerSlot(Option<Waker>);

impl std::fmt::Debug for WakerSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() { "Some(waker)" } else { "None" })
    }
}

/// When a VM started on the model's clock: its request time, else its placement time.
fn started_at(vm: &NewVm) -> f64 {
    vm.facts.requested_at_s.filter(|t| t.is_finite()).unwrap_or(vm.placed_at_s)
}

/// Feeds the outcome tracker with a batch this agent committed (a release carries its end on the
/// model's clock).
fn observe_own(outcomes: &mut OutcomeTracker, ops: &[Change]) {
    for op in ops {
        match op {
            Change::Placed { vm, .. } => outcomes.placed(&vm.id, vm.prediction.as_ref(), started_at(vm)),
            Change::Released { vm, ended_at_s, .. } => outcomes.released(vm, Some(*ended_at_s)),
            _ => {}
        }
    }
}

/// Feeds the outcome tracker with batches other agents committed.
fn observe_followed(outcomes: &mut OutcomeTracker, batches: &[Vec<LoggedChange>]) {
    for change in batches.iter().flatten() {
        match change {
            LoggedChange::Placed { vm, .. } => outcomes.placed(&vm.id, vm.prediction.as_ref(), started_at(vm)),
            LoggedChange::Released { vm } => outcomes.released(vm, None),
            _ => {}
        }
    }
}

/// After a rebuild: the running VMs await their outcomes again, except those that outlived the
/// threshold by the tracker's clock (resolved already).
fn observe_rebuilt(outcomes: &mut OutcomeTracker, allocator: &Allocator) {
    outcomes.forget_pending();
    let threshold = outcomes.config().long_threshold_s;
    let clock = outcomes.clock_s();
    let mut running: Vec<&NewVm> = allocator.state().vms().map(|(_, placed)| &**placed).collect();
    running.sort_by(|a, b| started_at(a).total_cmp(&started_at(b)));
    for vm in running {
        if started_at(vm) + threshold > clock {
            outcomes.placed(&vm.id, vm.prediction.as_ref(), started_at(vm));
        }
    }
}

/// Rebuilds the acknowledged state: the inventory, every stored VM in placement order, then the
/// stored host states.
fn recover(
    spec: &InventorySpec,
    config: &AllocatorConfig,
    registry: &Registry,
    location: &StoreLocation,
    now_s: f64,
    repredictor: Option<Arc<dyn Repredictor>>,
    exit_retention: ExitRetention,
) -> Result<(Live, Vec<StandingRejection>), DurableError> {
    let mut store = store::open(location, spec)?;
    store.set_exit_retention(exit_retention);
    let mut stored = store.load()?;
    let rejections = std::mem::take(&mut stored.rejections);
    // The configured inventory, as hosts added, changed and removed while it ran left it.
    let changed = spec.with_changes(stored.inventory.iter().map(|(host, entry)| (host, entry.as_ref())));
    let spec = &changed;
    let name = || location.to_string();
    let mut allocator = match store.agent() {
        // Agents sharing a zone draw their ties independently: with one sequence, agents with the
        // same view would pick the same host, and all but one commit would be refused.
        Some(agent) => {
            let salt =
                agent.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3));
            Allocator::with_registry(spec, &AllocatorConfig { seed: config.seed ^ salt, ..config.clone() }, registry)?
        }
        None => Allocator::with_registry(spec, config, registry)?,
    };
    allocator.set_repredictor(repredictor);
    for StoredVm { host, vm, .. } in stored.vms {
        let id = vm.id.clone();
        allocator.restore(vm, &host, now_s).map_err(|source| DurableError::Contradiction {
            store: name(),
            vm: id,
            host: host.clone(),
            source: Box::new(source),
        })?;
    }
    for (host, state) in stored.host_states {
        if let Err(source) = allocator.set_host_state(&host, state) {
            return Err(DurableError::HostState { store: name(), host, source: Box::new(source) });
        }
    }
    for (host, policy, state) in stored.policy_hosts {
        if let Err(source) = allocator.restore_host_state(&host, &policy, &state) {
            return Err(DurableError::HostState { store: name(), host, source: Box::new(source) });
        }
    }
    for (vm, target) in stored.migrations {
        allocator.restore_migration(&vm, &target).map_err(|source| DurableError::Contradiction {
            store: name(),
            vm,
            host: target,
            source: Box::new(source),
        })?;
    }
    if let Some(drain) = stored.drain {
        allocator.restore_drain(drain);
    }
    if let Some(consolidation) = stored.consolidation {
        allocator.restore_consolidation(consolidation);
    }
    // Rebuilding what the store holds is no change to write (timers that passed meanwhile replay
    // the same way on every restart).
    allocator.take_changes();
    Ok((Live { allocator, store }, rejections))
}

impl DurableAllocator {
    /// Opens (or creates) the store at `location` and rebuilds the state it records over `spec`,
    /// under `config`'s policy, its rules and presets looked up in `registry`. Fails, naming the VM
    /// and host, when the store contradicts the inventory.
    pub fn open(
        spec: &InventorySpec,
        config: &AllocatorConfig,
        registry: &Registry,
        location: impl Into<StoreLocation>,
        now_s: f64,
    ) -> Result<Self, DurableError> {
        let location = location.into();
        let (live, rejections) = recover(spec, config, registry, &location, now_s, None, ExitRetention::default())?;
        let mut outcomes = OutcomeTracker::new(OutcomeConfig::default());
        observe_rebuilt(&mut outcomes, &live.allocator);
        let mut standing = StandingRejections::default();
        standing.extend_stored(rejections, Instant::now());
        Ok(DurableAllocator {
            spec: spec.clone(),
            config: config.clone(),
            registry: registry.clone(),
            location,
            live: Some(live),
            broken: None,
            repredictor: None,
            share: None,
            outcomes,
            exit_retention: ExitRetention::default(),
            waker: WakerSlot::default(),
            standing,
            dropped: None,
        })
    }

    /// Calls `wake` (from another thread; it must not block) whenever another agent of the store
    /// committed a batch this one has not followed; the caller then runs a [`Follow`], so that an
    /// idle agent's view is current before its next request. Only a shared store calls it.
    pub fn set_waker(&mut self, wake: Waker) {
        if let Some(live) = &mut self.live {
            live.store.set_waker(Arc::clone(&wake));
        }
        self.waker = WakerSlot(Some(wake));
    }

    /// Keeps the VMs that left in the store as `retention` says from now on (`[export]`).
    pub fn set_exit_retention(&mut self, retention: ExitRetention) {
        self.exit_retention = retention;
        if let Some(live) = &mut self.live {
            live.store.set_exit_retention(retention);
        }
    }

    /// Resolves and keeps outcomes as `config` says from now on (the VMs awaiting theirs are kept).
    pub fn set_outcome_config(&mut self, config: OutcomeConfig) {
        self.outcomes = OutcomeTracker::new(config);
        if let Some(live) = &self.live {
            observe_rebuilt(&mut self.outcomes, &live.allocator);
        }
    }

    /// The realized quality of the predictions VMs were placed with.
    pub fn quality(&self) -> QualityReport {
        self.outcomes.report()
    }

    /// Repredicts remaining lifetimes with `model` from now on (NILAS, LAVA), also after a rebuild.
    pub fn set_repredictor(&mut self, model: Option<Arc<dyn Repredictor>>) {
        self.repredictor = model.clone();
        if let Some(live) = &mut self.live {
            live.allocator.set_repredictor(model);
        }
    }

    /// The live allocator (none while the store is unusable). Read only: changes go through
    /// [`DurableAllocator::execute`].
    pub fn allocator(&self) -> Option<&Allocator> {
        self.live.as_ref().map(|live| &live.allocator)
    }

    pub fn location(&self) -> &StoreLocation {
        &self.location
    }

    /// Throws the in-memory state away and rebuilds it from the store, for `reason`.
    pub fn rebuild(&mut self, now_s: f64, reason: ReloadReason) -> Result<(), DurableError> {
        // Close the old connection first: the rebuild opens the file afresh, as at startup.
        self.live = None;
        self.dropped = None;
        // The hosts may differ: the share is taken again.
        self.share = None;
        metrics::counter!("allocator_reloads_total", "reason" => reason.as_str()).increment(1);
        let (spec, config, registry) = (&self.spec, &self.config, &self.registry);
        match recover(spec, config, registry, &self.location, now_s, self.repredictor.clone(), self.exit_retention) {
            Ok((mut live, rejections)) => {
                self.standing.extend_stored(rejections, Instant::now());
                observe_rebuilt(&mut self.outcomes, &live.allocator);
                if let Some(wake) = &self.waker.0 {
                    live.store.set_waker(Arc::clone(wake));
                }
                self.live = Some(live);
                self.broken = None;
                Ok(())
            }
            Err(error) => {
                self.broken = Some(error.to_string());
                Err(error)
            }
        }
    }

    /// Runs one command as a batch of its own.
    pub fn execute_one<R: Request>(&mut self, request: R, now_s: f64) -> Result<R::Output, CommandError> {
        let (job, answer) = job(request);
        self.execute(vec![job], now_s);
        answer.ready()
    }

    /// Runs a batch of commands with one commit, then answers each (see the module
    /// documentation).
    pub fn execute(&mut self, mut jobs: Vec<Box<dyn Job>>, now_s: f64) {
        let started = Instant::now();
        let commit = self.run_batch(&mut jobs, now_s);
        let timing = BatchTiming { started, commit, answered: Instant::now() };
        for job in jobs {
            job.answer(timing);
        }
    }

    /// Runs the batch; returns what its commits took.
    fn run_batch(&mut self, jobs: &mut [Box<dyn Job>], now_s: f64) -> Duration {
        metrics::histogram!("allocator_batch_commands").record(jobs.len() as f64);
        let mut commit = Duration::ZERO;
        let mut attempt = 1;
        // Whether the batch follows the store before it runs even when the store knows of no
        // commit this agent lacks: when a command needs it, and when a command's answer said so.
        let mut follow_first = jobs.iter().any(|job| !job.checked_at_commit());
        loop {
            let unchecked_view = match self.catch_up(now_s, follow_first) {
                Ok(unchecked) => unchecked,
                Err(reason) => {
                    for job in jobs.iter_mut() {
                        job.fail(CommandError::Unavailable(reason.clone()));
                    }
                    return commit;
                }
            };
            let Some(live) = &mut self.live else { unreachable!("catch_up answers when there is no live state") };
            if let Some(me) = live.store.agent() {
                let agents = live.store.agents();
                if self.share.as_ref().is_none_or(|(known, _)| *known != agents) {
                    let share =
                        HostShare::rendezvous(me, &agents, live.allocator.state().hosts().iter().map(|h| &h.id));
                    tracing::info!(
                        agents = agents.len(),
                        "the agents of the store changed; taking a share of the hosts"
                    );
                    self.share = Some((agents.iter().map(|a| (*a).to_owned()).collect(), Arc::new(share)));
                }
                let share = self.share.as_ref().map(|(_, share)| Arc::clone(share));
                // Alone, an agent takes the best hosts; with others, the best of its own share
                // among the top ones; a batch decided again after a refusal, always.
                let others = share.as_ref().is_some_and(|share| share.agents() > 1);
                let probability = if others || attempt > 1 { 1.0 } else { 0.0 };
                live.allocator.set_conflict_avoidance(Some(ConflictAvoidance {
                    top: AVOIDANCE_TOP,
                    probability,
                    share,
                }));
            }
            let mut outcomes: Vec<&'static str> = Vec::new();
            let mut rejected = BatchRejections::default();
            let mut cx = Context {
                allocator: &mut live.allocator,
                now_s,
                location: &self.location,
                tracker: &self.outcomes,
                outcomes: &mut outcomes,
                repredictor: &mut self.repredictor,
                standing: &self.standing,
                rejected: &mut rejected,
                now: Instant::now(),
                unchecked_view,
                needs_fresh_view: false,
            };
            for job in jobs.iter_mut() {
                // A caller that gave up (its request timed out, its connection closed) was told
                // nothing was settled, and may have placed the VM through another agent and
                // released it since: a write decided now, perhaps long after (a partition held
                // this agent's commit, which was refused and is decided again), would place a VM
                // nobody knows of. It is not applied.
                if job.is_write() && job.abandoned() {
                    metrics::counter!("allocator_abandoned_writes_total").increment(1);
                    job.fail(CommandError::Unavailable(ABANDONED.to_owned()));
                    continue;
                }
                job.run(&mut cx);
            }
            let needs_fresh_view = cx.needs_fresh_view;
            // Exactly what the batch changed, as the placement core recorded it.
            let ops: Vec<_> = live.allocator.take_changes().collect();
            if needs_fresh_view {
                // Nothing was sent to the store: take the batch back and decide it again on a
                // view followed up to the store's head.
                metrics::counter!("allocator_fresh_view_retries_total").increment(1);
                follow_first = true;
                if live.take_back(&ops, true).is_err() {
                    self.drop_live(ReloadReason::TakeBackFailed);
                }
                continue;
            }
            if ops.is_empty() && rejected.is_empty() {
                record_outcomes(&outcomes);
                return commit;
            }
            metrics::histogram!("allocator_batch_writes").record(ops.len() as f64);
            let started = Instant::now();
            let allocator = &live.allocator;
            let committed =
                live.store.apply_decisions(&ops, rejected.as_slice(), &|host| allocator.policy_host_snapshot(host));
            commit += started.elapsed();
            metrics::histogram!("allocator_commit_duration_seconds").record(started.elapsed().as_secs_f64());
            let (error, refused) = match committed {
                Ok(order) => {
                    metrics::counter!("allocator_commits_total").increment(1);
                    record_outcomes(&outcomes);
                    rejected.stand(&mut self.standing, Instant::now());
                    if ops.iter().any(|op| matches!(op, Change::HostInventory { .. })) {
                        // Durable now: the allocator is built again on the new inventory.
                        if let Err(error) = self.rebuild(now_s, ReloadReason::InventoryChanged) {
                            tracing::error!(%error, "rebuilding on the changed inventory failed; answering 503 until it works");
                        }
                    } else if order != Committed::AfterOthers {
                        observe_own(&mut self.outcomes, &ops);
                    } else {
                        // Apply the batch again in the store's order, after the others' batches.
                        let taken_back = live.take_back(&ops, false).inspect_err(|error| {
                            tracing::warn!(%error, "a batch committed after others could not be taken back; reloading");
                        });
                        if taken_back.is_err() {
                            self.drop_live(ReloadReason::TakeBackFailed);
                        }
                        self.follow_store();
                    }
                    return commit;
                }
                // Another agent committed first what makes this batch impossible (its view was
                // stale): take the batch back, follow the store, and decide the batch again. Only
                // a batch that cannot be taken back in memory costs a rebuild.
                // Or another agent answered "rejected" for a VM id this batch places (a client's
                // duplicate sent there at the same time): decided again, that answer stands.
                Err(error @ (StoreError::Refused { .. } | StoreError::RejectedElsewhere { .. })) => {
                    metrics::counter!("allocator_commit_conflicts_total").increment(1);
                    tracing::debug!(%error, attempt, "the store refused the batch; deciding it again on fresh state");
                    if let StoreError::RejectedElsewhere { vms, .. } = &error {
                        let now = Instant::now();
                        for vm in vms {
                            self.standing.insert_elsewhere(vm.clone(), now);
                        }
                    }
                    // The store said the view was stale: decided again on the log's state, not on
                    // notifications (the batch that made this one impossible may not be notified yet).
                    follow_first = true;
                    let taken_back = live.take_back(&ops, true).inspect_err(|error| {
                        tracing::warn!(%error, "the refused batch could not be taken back; reloading");
                    });
                    let kept = taken_back.is_ok() || self.rebuild(now_s, ReloadReason::TakeBackFailed).is_ok();
                    if kept && attempt < MAX_ATTEMPTS {
                        attempt += 1;
                        metrics::counter!("allocator_commit_retries_total").increment(1);
                        std::thread::sleep(retry_jitter(attempt));
                        continue;
                    }
                    (error, true)
                }
                Err(error) => (error, false),
            };
            metrics::counter!("allocator_commit_failures_total").increment(1);
            record_outcomes(&vec!["not_durable"; outcomes.len()]);
            let reason = error.to_string();
            if refused {
                // Nothing of it was written and it is taken back already: no reload; a follow, so
                // that the reads see every commit.
                tracing::warn!(%error, attempts = MAX_ATTEMPTS, "the store refused the batch at every attempt; answering its writes 503");
                self.follow_store();
            } else {
                tracing::error!(%error, writes = ops.len(), "commit failed; rebuilding from the store");
                if let Err(error) = self.rebuild(now_s, ReloadReason::CommitFailed) {
                    tracing::error!(%error, "rebuilding from the store failed; answering 503 until it works");
                }
            }
            // The writes are answered as not durable; the reads again, from the current state.
            let mut outcomes = Vec::new();
            let mut unrecorded = BatchRejections::default();
            for job in jobs.iter_mut() {
                match &mut self.live {
                    _ if job.is_write() => job.fail(CommandError::NotDurable(reason.clone())),
                    Some(live) => job.run(&mut Context {
                        allocator: &mut live.allocator,
                        now_s,
                        location: &self.location,
                        tracker: &self.outcomes,
                        outcomes: &mut outcomes,
                        repredictor: &mut self.repredictor,
                        standing: &self.standing,
                        rejected: &mut unrecorded,
                        now: Instant::now(),
                        unchecked_view: false,
                        needs_fresh_view: false,
                    }),
                    None => job.fail(CommandError::Unavailable(reason.clone())),
                }
            }
            return commit;
        }
    }

    /// Brings the live state up to what the store holds before a batch: rebuilt if there is none,
    /// then the changes other agents committed since, followed, unless `follow_first` is false and
    /// the store knows of no such change ([`PlacementStore::known_current`]). Answers whether the
    /// view was left unchecked that way; says why when the store cannot be used.
    fn catch_up(&mut self, now_s: f64, follow_first: bool) -> Result<bool, String> {
        // Only a store other agents write can lack anything (the embedded store's follow is free).
        let shared = self.live.as_ref().is_some_and(|live| live.store.agent().is_some());
        let mut unchecked =
            !follow_first && shared && self.live.as_ref().is_some_and(|live| live.store.known_current());
        if !unchecked && !follow_first && shared {
            // What other agents' notifications carried: as current as a view that skipped the
            // follow, at no round trip.
            unchecked = self.follow_notified();
        }
        if !unchecked {
            self.follow_store();
        }
        if self.live.is_none() {
            let reason = self.dropped.unwrap_or(ReloadReason::StoreUnusable);
            if let Err(error) = self.rebuild(now_s, reason) {
                tracing::error!(%error, "the allocator's store is still unusable");
            }
            // A view just loaded is the store's.
            return match self.live {
                Some(_) => Ok(false),
                None => Err(self.broken.clone().unwrap_or_else(|| "not open".to_owned())),
            };
        }
        Ok(unchecked)
    }

    /// Applies the batches other agents' notifications carried
    /// ([`PlacementStore::follow_notified`]); answers whether it did (and the view is in step).
    fn follow_notified(&mut self) -> bool {
        let cpu = thread_cpu_s();
        let followed = self.live.as_mut().and_then(|live| live.store.follow_notified().transpose());
        let applied = followed.is_some();
        if let Some(followed) = followed {
            metrics::counter!("allocator_notified_follows_total").increment(1);
            self.apply_followed(followed);
        }
        count_follow_cpu(cpu);
        applied && self.live.is_some()
    }

    /// Applies the changes committed to the store that the live view lacks; drops the live view
    /// (to be rebuilt) when they cannot be followed.
    fn follow_store(&mut self) {
        if let Some(live) = &mut self.live {
            let (started, cpu) = (Instant::now(), thread_cpu_s());
            let followed = live.store.follow();
            metrics::histogram!("allocator_follow_duration_seconds").record(started.elapsed().as_secs_f64());
            self.apply_followed(followed);
            count_follow_cpu(cpu);
        }
    }

    /// Drops the live state, to be rebuilt before the next batch, for `reason`.
    fn drop_live(&mut self, reason: ReloadReason) {
        self.live = None;
        self.dropped = Some(reason);
    }

    /// Applies what a follow found to the live view; drops the view (to be rebuilt) when it cannot.
    fn apply_followed(&mut self, followed: Result<Followed, StoreError>) {
        if let Some(live) = &mut self.live {
            let out_of_step = match followed {
                Ok(Followed::Batches(batches)) => {
                    let changes = batches.iter().map(Vec::len).sum::<usize>();
                    metrics::counter!("allocator_followed_changes_total").increment(changes as u64);
                    // How far behind the store this agent's view was: the change log's lag.
                    metrics::histogram!("allocator_follow_lag_batches").record(batches.len() as f64);
                    observe_followed(&mut self.outcomes, &batches);
                    match batches.iter().try_for_each(|batch| live.allocator.follow_batch(batch)) {
                        Ok(()) => None,
                        Err(StateError::InventoryChanged(host)) => {
                            tracing::info!(%host, "another agent changed the inventory; rebuilding on it");
                            Some(ReloadReason::InventoryChanged)
                        }
                        Err(error) => {
                            tracing::warn!(%error, "a followed change contradicts this agent's view; reloading");
                            Some(ReloadReason::FollowContradiction)
                        }
                    }
                }
                Ok(Followed::Gap) => {
                    tracing::warn!("the change log has a gap at this agent's position; reloading");
                    Some(ReloadReason::LogGap)
                }
                Err(error) => {
                    tracing::error!(%error, "reading the change log failed; rebuilding from the store");
                    Some(ReloadReason::LogUnreadable)
                }
            };
            // Followed changes are written already: nothing of them is this agent's to write.
            live.allocator.take_changes().for_each(drop);
            if let Some(reason) = out_of_step {
                metrics::counter!("allocator_follow_rebuilds_total", "reason" => reason.as_str()).increment(1);
                self.drop_live(reason);
            }
        }
    }
}

/// Conflict avoidance (Protean, paper 001 s5.3, with shares): an agent of a shared store that
/// knows other agents (those that wrote one of the change log's last 1,000 batches) takes the best
/// of its own share of the hosts ([`HostShare`]) among the best `AVOIDANCE_TOP` valid hosts, or
/// when none is its own, its best own host among the best `AVOIDANCE_TOP` per agent. Dense
/// packing leaves very few hosts with the best score (2 at the median in the agents bench), and
/// agents deciding at the same time would all go for them; with shares they go to different
/// hosts. Protean draws at random among the top hosts, with a probability that follows the recent
/// share of refused commits: measured against it in docs/benchmarks.md and docs/evaluation.md.
const AVOIDANCE_TOP: usize = 16;

/// How often a batch the store refused is decided again on fresh state before its writes are
/// answered as not durable (retryable).
const MAX_ATTEMPTS: u32 = 5;

/// The answer nobody reads to a write whose caller gave up before it was decided.
const ABANDONED: &str = "the caller stopped waiting before the request was decided; it was not applied";

/// A random pause before deciding a refused batch again, up to 0.5 ms doubled per attempt. Agents
/// that lost a race for the same host (a dense-packing policy sends every agent to the one host
/// with the right hole) would otherwise all come back at once and race again.
fn retry_jitter(attempt: u32) -> std::time::Duration {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.subsec_nanos());
    // The clock's low bits are as good as random here; mixed so that they spread over the range.
    let mixed = u64::from(nanos).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 32;
    std::time::Duration::from_micros(mixed % (500 << attempt.min(6)))
}

fn record_outcomes(outcomes: &[&'static str]) {
    for outcome in outcomes {
        metrics::counter!("allocator_decisions_total", "outcome" => *outcome).increment(1);
    }
}

/// This thread's CPU time so far, in seconds (0 where the clock cannot be read).
fn thread_cpu_s() -> f64 {
    let mut now = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `clock_gettime` writes one `timespec` through the pointer, which is valid for it.
    let read = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut now) };
    if read == 0 {
        now.tv_sec as f64 + now.tv_nsec as f64 * 1e-9
    } else {
        0.0
    }
}

/// Adds the worker's CPU since `since_s` ([`thread_cpu_s`]) to what following other agents' commits
/// cost (`allocator_follow_cpu_microseconds_total`: reading them from the store and applying them to
/// the view), which the scale-out bench splits from deciding.
fn count_follow_cpu(since_s: f64) {
    metrics::counter!("allocator_follow_cpu_microseconds_total")
        .increment(((thread_cpu_s() - since_s).max(0.0) * 1e6) as u64);
}

#[cfg(test)]
mod tests;
