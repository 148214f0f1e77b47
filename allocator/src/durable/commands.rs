//! The commands of the [`DurableAllocator`](super::DurableAllocator), each with the type of its
//! answer.
//!
//! A command is a struct that implements [`Request`]: its `run` returns its own output type, and
//! [`job`] pairs it with an [`Answer`] of that type, so an HTTP handler cannot be handed another
//! command's reply (a mismatch does not compile). A new command is one struct and its `run`.

use super::rejections::{self, BatchRejections, StandingRejections};
use super::CommandError;
use crate::store::StoreLocation;
use domain::hosts::{
    HostDetail, HostInfo, HostPage, HostStateChange, HostSummary, HostUpdate, HostUpdated, PolicyHostState,
    RecordOutcome, RecordedPlacement, StoreStatus,
};
use domain::{
    AllocationDecision, AllocationOutcome, AllocationRequest, ClusterId, HostId, HostState, QualityReport, RackId,
    Rejection, TenantId, VmId, VmInfo, VmRequest,
};
use placement::allocator::{Allocator, AllocatorStats, ConsolidationError, DrainError, Explanation, Recorded};
use placement::consolidation::{ConsolidationConfig, ConsolidationReport, PlannedHost};
use placement::defrag::{DrainReport, DrainRequest, Migration};
use placement::outcomes::OutcomeTracker;
use placement::reprediction::Repredictor;
use placement::state::{HostIndex, StateError};
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::oneshot;

/// What a command sees while its batch runs.
pub struct Context<'a> {
    pub(super) allocator: &'a mut Allocator,
    pub(super) now_s: f64,
    pub(super) location: &'a StoreLocation,
    pub(super) tracker: &'a OutcomeTracker,
    /// The outcome of each allocation of the batch (`allocator_decisions_total`).
    pub(super) outcomes: &'a mut Vec<&'static str>,
    /// The repredicting model the durable allocator sets again on every rebuild.
    pub(super) repredictor: &'a mut Option<Arc<dyn Repredictor>>,
    /// The "rejected" answers that stand: this agent's committed ones, and those of other agents
    /// it learnt of from the store. A request for one of their VM ids gets that answer again.
    pub(super) standing: &'a StandingRejections,
    /// The allocations this batch answered "rejected", each VM id with its answer: recorded with
    /// the batch's commit, and the answer to a request for one of them later in the batch.
    pub(super) rejected: &'a mut BatchRejections,
    /// When the batch runs, on the monotonic clock a rejection stands by.
    pub(super) now: Instant,
    /// The batch runs on a view that was not checked against the store first (another agent's
    /// latest commits may be missing from it; see [`Request::CHECKED_AT_COMMIT`]).
    pub(super) unchecked_view: bool,
    /// Set by a command whose answer an unchecked view could have made wrong without the commit
    /// noticing (a release of a VM the view lacks): the batch is decided again after following.
    pub(super) needs_fresh_view: bool,
}

/// A command with the type of its answer.
pub trait Request: Send + 'static {
    type Output: Send + 'static;
    /// Whether it changes the state. A write whose batch cannot be made durable is answered
    /// [`CommandError::NotDurable`]; a read is answered again from the rebuilt state.
    const WRITE: bool = false;

    /// Whether the command may run on a view that lacks other agents' latest commits, because
    /// the store's commit checks what its answer relies on: a placement that contradicts another
    /// agent's commit is refused and decided again, and a command that finds what a stale view
    /// could explain sets [`Context::needs_fresh_view`]. Others (reads) run only on a view
    /// followed up to the store's head, so they see every commit acknowledged before them.
    const CHECKED_AT_COMMIT: bool = false;

    /// Carries the command out on the live allocator; a write's effects go to its journal.
    fn run(&self, cx: &mut Context<'_>) -> Result<Self::Output, CommandError>;

    /// The model-clock time the command carries (an allocation's request time, a release's end),
    /// which a service on the request clock runs its batch at.
    fn time_s(&self) -> Option<f64> {
        None
    }
}

/// A command in a batch, with where its answer goes (made by [`job`]).
pub trait Job: Send {
    fn is_write(&self) -> bool;
    /// [`Request::CHECKED_AT_COMMIT`].
    fn checked_at_commit(&self) -> bool;
    fn time_s(&self) -> Option<f64>;
    /// Whether nobody waits for the answer any more (the request timed out or its connection
    /// closed).
    fn abandoned(&self) -> bool;
    /// Runs the command, keeping its answer until the batch is over.
    fn run(&mut self, cx: &mut Context<'_>);
    /// Answers `error` instead of what it ran to.
    fn fail(&mut self, error: CommandError);
    /// Hands the answer out, with where its batch's time went.
    fn answer(self: Box<Self>, timing: BatchTiming);
}

/// Where the time of a batch went, handed out with each of its answers, so that a request can say
/// how long it queued, was decided and committed (the allocator's `Server-Timing`).
#[derive(Clone, Copy, Debug)]
pub struct BatchTiming {
    /// When the batch began (its first command was taken off the queue before this).
    pub started: Instant,
    /// What the store's commits of the batch took (with their sync to disk), over every attempt.
    pub commit: Duration,
    /// When the answers were handed out.
    pub answered: Instant,
}

/// The message of a [`job`]'s answer: the result and its batch's timing.
type Reply<T> = (Result<T, CommandError>, Option<BatchTiming>);

/// The answer to a [`job`], once its batch is over.
#[derive(Debug)]
pub struct Answer<T>(oneshot::Receiver<Reply<T>>);

impl<T> Answer<T> {
    /// Waits for the batch (on the worker thread) to answer, with where the batch's time went (none
    /// when it was dropped unanswered).
    pub async fn wait_timed(self) -> Reply<T> {
        self.0.await.unwrap_or_else(|_| (Err(dropped()), None))
    }

    /// The answer of a batch that ran already ([`super::DurableAllocator::execute`]).
    pub fn ready(mut self) -> Result<T, CommandError> {
        self.0.try_recv().map_or_else(|_| Err(dropped()), |(answer, _)| answer)
    }
}

/// A job dropped unanswered: its batch panicked (and was not applied) or never ran.
fn dropped() -> CommandError {
    CommandError::Unavailable("the allocator failed on this batch; it was not applied".to_owned())
}

/// A command to run in a batch, and its answer.
pub fn job<R: Request>(request: R) -> (Box<dyn Job>, Answer<R::Output>) {
    let (reply, answer) = oneshot::channel();
    (Box::new(Pending { request, answer: None, reply }), Answer(answer))
}

struct Pending<R: Request> {
    request: R,
    answer: Option<Result<R::Output, CommandError>>,
    reply: oneshot::Sender<Reply<R::Output>>,
}

impl<R: Request> Job for Pending<R> {
    fn is_write(&self) -> bool {
        R::WRITE
    }

    fn checked_at_commit(&self) -> bool {
        R::CHECKED_AT_COMMIT
    }

    fn time_s(&self) -> Option<f64> {
        self.request.time_s().filter(|t| t.is_finite())
    }

    fn abandoned(&self) -> bool {
        self.reply.is_closed()
    }

    fn run(&mut self, cx: &mut Context<'_>) {
        self.answer = Some(self.request.run(cx));
    }

    fn fail(&mut self, error: CommandError) {
        self.answer = Some(Err(error));
    }

    fn answer(self: Box<Self>, timing: BatchTiming) {
        let answer = self.answer.unwrap_or_else(|| Err(dropped()));
        // The client may have gone; its answer is simply dropped.
        let _ = self.reply.send((answer, Some(timing)));
    }
}

/// Place a VM or a gang (write).
#[derive(Clone, Debug)]
pub struct Allocate(pub AllocationRequest);

impl Request for Allocate {
    type Output = AllocationDecision;
    const WRITE: bool = true;
    /// A placement on a stale view is refused by the store (a host over-committed, the id placed
    /// already) and decided again; a rejection is recorded and checked against placements of the
    /// same id at the commit.
    const CHECKED_AT_COMMIT: bool = true;

    fn run(&self, cx: &mut Context<'_>) -> Result<AllocationDecision, CommandError> {
        let started = Instant::now();
        // A rejection that stands is recorded already: recording it again would only make it
        // stand longer.
        let (result, record) = match self.standing_rejection(cx) {
            Some(rejection) => (Ok(rejections::replayed(rejection)), false),
            None => (cx.allocator.allocate(&self.0, cx.now_s), true),
        };
        metrics::histogram!("allocator_decision_duration_seconds").record(started.elapsed().as_secs_f64());
        let decision = result.inspect_err(|_| cx.outcomes.push("conflict"))?;
        cx.outcomes.push(match &decision.outcome {
            _ if decision.replayed => "replayed",
            AllocationOutcome::Placed { .. } => "placed",
            AllocationOutcome::Rejected { .. } => "rejected",
        });
        if let (AllocationOutcome::Rejected { rejection }, true) = (&decision.outcome, record) {
            for vm in self.0.vms() {
                cx.rejected.push(vm.vm_id.clone(), rejection.clone());
            }
        }
        Ok(decision)
    }

    fn time_s(&self) -> Option<f64> {
        self.0.vms().iter().filter_map(|vm| vm.facts.requested_at_s).filter(|t| t.is_finite()).reduce(f64::max)
    }
}

impl Allocate {
    /// The rejection that stands for a VM of this request that is not placed: answered earlier in
    /// this batch, or in the last [`crate::store::REJECTION_STANDS_S`] by this agent or another
    /// (the client sent the same request twice at about the same time, to one agent or two). The
    /// request gets that first answer, whatever capacity freed up since.
    fn standing_rejection<'c>(&self, cx: &'c Context<'_>) -> Option<&'c Rejection> {
        self.0
            .vms()
            .iter()
            .filter(|vm| cx.allocator.state().vm(&vm.vm_id).is_none())
            .find_map(|vm| cx.rejected.get(&vm.vm_id).or_else(|| cx.standing.get(&vm.vm_id, cx.now)))
    }
}

/// Release a VM (write). With `owner`, only if that tenant placed it: the ownership check and the
/// release happen in one step, so no other request can release and re-place the id in between; a
/// VM of another tenant answers as unknown, so its id does not leak. `ended_at_s` is the exit on
/// the model's clock, for the VM's realized outcome (the latest request time when absent).
#[derive(Clone, Debug)]
pub struct Release {
    pub vm: VmId,
    pub owner: Option<TenantId>,
    pub ended_at_s: Option<f64>,
}

impl Release {
    /// Release `vm`, whoever placed it, ending now.
    pub fn vm(vm: VmId) -> Self {
        Release { vm, owner: None, ended_at_s: None }
    }
}

impl Request for Release {
    /// The VM as it was placed.
    type Output = VmInfo;
    const WRITE: bool = true;
    /// A VM the view holds is released by the store too; one it lacks may have been placed by an
    /// agent whose commit the view has not followed yet: the batch is decided again after
    /// following rather than answered 404.
    const CHECKED_AT_COMMIT: bool = true;

    fn run(&self, cx: &mut Context<'_>) -> Result<VmInfo, CommandError> {
        let unknown = || CommandError::UnknownVm(self.vm.clone());
        if cx.unchecked_view && cx.allocator.state().vm(&self.vm).is_none() {
            cx.needs_fresh_view = true;
        }
        // Describe it while it is still there.
        let info = vm_info(cx.allocator, &self.vm)
            .filter(|info| self.owner.as_ref().is_none_or(|owner| info.tenant_id == *owner))
            .ok_or_else(unknown)?;
        // The journal's release carries the end, for the store's exits.
        cx.allocator.release_ended(&self.vm, cx.now_s, self.ended_at_s).map_err(|_| unknown())?;
        Ok(info)
    }

    fn time_s(&self) -> Option<f64> {
        self.ended_at_s
    }
}

/// Drain, fail or restore a host (write).
#[derive(Clone, Debug)]
pub struct SetHostState {
    pub host: HostId,
    pub state: HostState,
}

impl Request for SetHostState {
    type Output = HostStateChange;
    const WRITE: bool = true;

    fn run(&self, cx: &mut Context<'_>) -> Result<HostStateChange, CommandError> {
        let previous = cx
            .allocator
            .set_host_state(&self.host, self.state)
            .map_err(|_| CommandError::UnknownHost(self.host.clone()))?;
        Ok(HostStateChange { host_id: self.host.clone(), previous, state: self.state })
    }
}

/// Add a host to the inventory, or change its capacity, state or place (write; see
/// [`Allocator::update_host`]).
#[derive(Clone, Debug)]
pub struct UpdateHost {
    pub host: HostId,
    pub update: HostUpdate,
}

impl Request for UpdateHost {
    type Output = HostUpdated;
    const WRITE: bool = true;

    fn run(&self, cx: &mut Context<'_>) -> Result<HostUpdated, CommandError> {
        cx.allocator.update_host(&self.host, &self.update).map_err(|error| match error {
            StateError::CapacityBelowUse { .. } => CommandError::HostInUse(error.to_string()),
            _ => CommandError::UnknownHost(self.host.clone()),
        })
    }
}

/// Remove an empty host from the inventory (write).
#[derive(Clone, Debug)]
pub struct RemoveHost(pub HostId);

impl Request for RemoveHost {
    type Output = ();
    const WRITE: bool = true;

    fn run(&self, cx: &mut Context<'_>) -> Result<(), CommandError> {
        cx.allocator.remove_host(&self.0).map_err(|error| match error {
            StateError::HostNotEmpty { .. } => CommandError::HostInUse(error.to_string()),
            _ => CommandError::UnknownHost(self.0.clone()),
        })
    }
}

/// Record that a VM is on a host, whatever was decided (write; a cloud's scheduler put or moved it
/// there: [`Allocator::record_at`]).
#[derive(Clone, Debug)]
pub struct RecordAt {
    pub vm: VmRequest,
    pub host: HostId,
}

impl Request for RecordAt {
    type Output = RecordedPlacement;
    const WRITE: bool = true;
    /// A VM another agent placed and this view lacks is placed again here: the store refuses it
    /// (the id is placed already) and the batch is decided again on the followed view.
    const CHECKED_AT_COMMIT: bool = true;

    fn run(&self, cx: &mut Context<'_>) -> Result<RecordedPlacement, CommandError> {
        let recorded = cx.allocator.record_at(&self.vm, &self.host, cx.now_s).map_err(|error| match error {
            StateError::UnknownHostId(host) => CommandError::UnknownHost(host),
            other => CommandError::DoesNotFit(other.to_string()),
        })?;
        let (recorded, from_host_id) = match recorded {
            Recorded::Unchanged => (RecordOutcome::Unchanged, None),
            Recorded::Placed => (RecordOutcome::Placed, None),
            Recorded::Moved { from } => (RecordOutcome::Moved, Some(from)),
            Recorded::Resized => (RecordOutcome::Resized, None),
        };
        Ok(RecordedPlacement { vm_id: self.vm.vm_id.clone(), host_id: self.host.clone(), recorded, from_host_id })
    }

    fn time_s(&self) -> Option<f64> {
        self.vm.facts.requested_at_s.filter(|t| t.is_finite())
    }
}

/// Start draining hosts (LARS) (write).
#[derive(Clone, Debug)]
pub struct StartDrain(pub DrainRequest);

impl Request for StartDrain {
    type Output = DrainReport;
    const WRITE: bool = true;

    fn run(&self, cx: &mut Context<'_>) -> Result<DrainReport, CommandError> {
        Ok(cx.allocator.start_drain(&self.0, cx.now_s)?)
    }
}

/// A migration finished: the VM moves to its target (write).
#[derive(Clone, Debug)]
pub struct CompleteMigration {
    pub vm: VmId,
    /// When it finished on the model's clock, which a service on the request clock runs at (as
    /// a release's `ended_at_s`).
    pub completed_at_s: Option<f64>,
}

impl CompleteMigration {
    /// `vm`'s migration finished now.
    pub fn of(vm: VmId) -> Self {
        CompleteMigration { vm, completed_at_s: None }
    }
}

impl Request for CompleteMigration {
    type Output = Migration;
    const WRITE: bool = true;

    fn run(&self, cx: &mut Context<'_>) -> Result<Migration, CommandError> {
        let migration = cx.allocator.complete_migration(&self.vm, cx.now_s)?;
        cx.outcomes.push("migrated");
        Ok(migration)
    }

    fn time_s(&self) -> Option<f64> {
        self.completed_at_s
    }
}

/// A migration failed: the VM stays on its source, the reservation on its target is given back
/// (write).
#[derive(Clone, Debug)]
pub struct FailMigration {
    pub vm: VmId,
}

impl Request for FailMigration {
    type Output = Migration;
    const WRITE: bool = true;

    fn run(&self, cx: &mut Context<'_>) -> Result<Migration, CommandError> {
        let migration = cx.allocator.fail_migration(&self.vm, cx.now_s)?;
        cx.outcomes.push("migration_failed");
        Ok(migration)
    }
}

/// Turn consolidation on with these settings, change them (what is in progress stays), or turn it
/// off (`None`) (write). `only_if_off`: the config file's `[consolidation]` at start, which gives
/// way to a record the store holds (settings an operator PUT through the API).
#[derive(Clone, Debug)]
pub struct SetConsolidation {
    pub config: Option<ConsolidationConfig>,
    pub only_if_off: bool,
}

impl Request for SetConsolidation {
    /// Where consolidation stands now (`None`: off).
    type Output = Option<ConsolidationReport>;
    const WRITE: bool = true;

    fn run(&self, cx: &mut Context<'_>) -> Result<Option<ConsolidationReport>, CommandError> {
        if !(self.only_if_off && cx.allocator.consolidation().is_some()) {
            cx.allocator.set_consolidation(self.config.clone(), cx.now_s)?;
        }
        Ok(cx.allocator.consolidation_report())
    }
}

/// Pause consolidation (no new host, no new migration; those in flight complete) or resume it
/// (write).
#[derive(Clone, Copy, Debug)]
pub struct PauseConsolidation(pub bool);

impl Request for PauseConsolidation {
    type Output = ConsolidationReport;
    const WRITE: bool = true;

    fn run(&self, cx: &mut Context<'_>) -> Result<ConsolidationReport, CommandError> {
        cx.allocator.pause_consolidation(self.0)?;
        cx.allocator.consolidation_report().ok_or(CommandError::Consolidation(ConsolidationError::Off))
    }
}

/// A consolidation round (write): `due_only` runs it only if it is due (the service's timer),
/// else now (an operator's `POST /v1/consolidation/rounds`). Answers the hosts it started.
#[derive(Clone, Copy, Debug)]
pub struct ConsolidationRound {
    pub due_only: bool,
}

impl Request for ConsolidationRound {
    type Output = Vec<PlannedHost>;
    const WRITE: bool = true;

    fn run(&self, cx: &mut Context<'_>) -> Result<Vec<PlannedHost>, CommandError> {
        match cx.allocator.consolidation_due_s() {
            None if self.due_only => Ok(Vec::new()),
            Some(due) if self.due_only && due > cx.now_s => Ok(Vec::new()),
            _ => Ok(cx.allocator.consolidate(cx.now_s)?),
        }
    }
}

/// The hosts a consolidation round would empty now, and where it stands; changes nothing.
#[derive(Clone, Copy, Debug)]
pub struct ConsolidationPlan;

impl Request for ConsolidationPlan {
    type Output = (Vec<PlannedHost>, ConsolidationReport);

    fn run(&self, cx: &mut Context<'_>) -> Result<Self::Output, CommandError> {
        let plan = cx.allocator.consolidation_plan(cx.now_s)?;
        let report = cx.allocator.consolidation_report().ok_or(CommandError::Consolidation(ConsolidationError::Off))?;
        Ok((plan, report))
    }
}

/// Where consolidation stands.
#[derive(Clone, Copy, Debug)]
pub struct ConsolidationStatus;

impl Request for ConsolidationStatus {
    type Output = ConsolidationReport;

    fn run(&self, cx: &mut Context<'_>) -> Result<ConsolidationReport, CommandError> {
        cx.allocator.consolidation_report().ok_or(CommandError::Consolidation(ConsolidationError::Off))
    }
}

/// Where a VM is.
#[derive(Clone, Debug)]
pub struct GetAllocation(pub VmId);

impl Request for GetAllocation {
    type Output = VmInfo;

    fn run(&self, cx: &mut Context<'_>) -> Result<VmInfo, CommandError> {
        vm_info(cx.allocator, &self.0).ok_or_else(|| CommandError::UnknownVm(self.0.clone()))
    }
}

/// Which hosts `GET /v1/hosts` lists.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct HostFilter {
    pub state: Option<HostState>,
    pub rack: Option<RackId>,
    pub cluster: Option<ClusterId>,
    /// Only hosts with no VM (`true`) or with some (`false`).
    pub empty: Option<bool>,
    pub limit: usize,
    pub offset: usize,
}

impl Default for HostFilter {
    fn default() -> Self {
        HostFilter { state: None, rack: None, cluster: None, empty: None, limit: usize::MAX, offset: 0 }
    }
}

/// A page of hosts.
#[derive(Clone, Debug)]
pub struct ListHosts(pub HostFilter);

impl Request for ListHosts {
    type Output = HostPage;

    fn run(&self, cx: &mut Context<'_>) -> Result<HostPage, CommandError> {
        let filter = &self.0;
        let allocator = &*cx.allocator;
        let matching = allocator.state().hosts().iter().enumerate().filter(|(_, host)| {
            filter.state.is_none_or(|state| host.state == state)
                && filter.rack.as_ref().is_none_or(|rack| &host.rack == rack)
                && filter.cluster.as_ref().is_none_or(|cluster| &host.cluster == cluster)
                && filter.empty.is_none_or(|empty| host.is_empty() == empty)
        });
        let mut total = 0;
        let mut hosts = Vec::new();
        for (i, record) in matching {
            if total >= filter.offset && hosts.len() < filter.limit {
                let vms = record.vms.iter().map(|vm| vm.id.clone()).collect();
                hosts.push(HostSummary { host: host_info(allocator, HostIndex(i as u32)), vms });
            }
            total += 1;
        }
        Ok(HostPage { total, offset: filter.offset, hosts })
    }
}

/// One host and its VMs in full.
#[derive(Clone, Debug)]
pub struct GetHost(pub HostId);

impl Request for GetHost {
    type Output = HostDetail;

    fn run(&self, cx: &mut Context<'_>) -> Result<HostDetail, CommandError> {
        let allocator = &*cx.allocator;
        let index = allocator.state().host_index(&self.0).ok_or_else(|| CommandError::UnknownHost(self.0.clone()))?;
        let record = &allocator.state().hosts()[index.get()];
        let vms = record.vms.iter().filter_map(|vm| vm_info(allocator, &vm.id)).collect();
        Ok(HostDetail { host: host_info(allocator, index), vms })
    }
}

/// Occupancy, packing density, VMs by lifetime, rejections by reason.
#[derive(Clone, Copy, Debug)]
pub struct Stats;

impl Request for Stats {
    type Output = AllocatorStats;

    fn run(&self, cx: &mut Context<'_>) -> Result<AllocatorStats, CommandError> {
        Ok(cx.allocator.stats())
    }
}

/// The realized quality of the predictions VMs were placed with.
#[derive(Clone, Copy, Debug)]
pub struct Quality;

impl Request for Quality {
    type Output = QualityReport;

    fn run(&self, cx: &mut Context<'_>) -> Result<QualityReport, CommandError> {
        Ok(cx.tracker.report())
    }
}

/// A dry run of one VM's placement.
#[derive(Clone, Debug)]
pub struct Explain {
    pub vm: VmRequest,
    pub why_not: Option<HostId>,
    pub top: usize,
}

impl Request for Explain {
    type Output = Explanation;

    fn run(&self, cx: &mut Context<'_>) -> Result<Explanation, CommandError> {
        cx.allocator.explain(&self.vm, self.why_not.as_ref(), self.top, cx.now_s).map_err(|error| match error {
            StateError::UnknownHostId(host) => CommandError::UnknownHost(host),
            other => CommandError::Unavailable(other.to_string()),
        })
    }
}

/// Whether the store is usable, with a few figures.
#[derive(Clone, Copy, Debug)]
pub struct Status;

impl Request for Status {
    type Output = StoreStatus;

    fn run(&self, cx: &mut Context<'_>) -> Result<StoreStatus, CommandError> {
        Ok(StoreStatus {
            store: cx.location.to_string(),
            hosts: cx.allocator.state().hosts().len(),
            vms: cx.allocator.state().vm_count(),
        })
    }
}

/// Nothing but what every batch does first: follow what other agents committed. Sent by the
/// worker when the store says another agent committed, so that an idle agent's view is current
/// before its next request comes.
#[derive(Clone, Copy, Debug)]
pub struct Follow;

impl Request for Follow {
    type Output = ();
    // It answers nothing: the notified batches are enough (no query), as for a placement.
    const CHECKED_AT_COMMIT: bool = true;

    fn run(&self, _cx: &mut Context<'_>) -> Result<(), CommandError> {
        Ok(())
    }
}

/// Where the current drain stands.
#[derive(Clone, Copy, Debug)]
pub struct DrainStatus;

impl Request for DrainStatus {
    type Output = DrainReport;

    fn run(&self, cx: &mut Context<'_>) -> Result<DrainReport, CommandError> {
        cx.allocator.drain_report().ok_or(CommandError::Drain(DrainError::NoDrain))
    }
}

/// Repredict with this model from now on (a new bundle was deployed), also after rebuilds.
#[derive(Clone, Debug)]
pub struct SetRepredictor(pub Option<Arc<dyn Repredictor>>);

impl Request for SetRepredictor {
    /// The repredicting model's version now, if any.
    type Output = Option<String>;

    fn run(&self, cx: &mut Context<'_>) -> Result<Option<String>, CommandError> {
        cx.repredictor.clone_from(&self.0);
        cx.allocator.set_repredictor(self.0.clone());
        Ok(cx.allocator.repredictor_version().map(str::to_owned))
    }
}

fn vm_info(allocator: &Allocator, id: &VmId) -> Option<VmInfo> {
    let vm = allocator.state().vm(id)?;
    let host = allocator.state().host(vm.host)?;
    Some(VmInfo {
        vm_id: id.clone(),
        host_id: host.id.clone(),
        rack_id: host.rack.clone(),
        cluster_id: host.cluster.clone(),
        tenant_id: vm.facts.tenant_id.clone(),
        vm_type: vm.facts.vm_type.clone(),
        demand: vm.facts.demand,
        placed_at_s: vm.placed_at_s,
        lifetime_class: allocator.vm_lifetime(vm).class,
        prediction: vm.prediction.clone(),
    })
}

fn host_info(allocator: &Allocator, index: HostIndex) -> HostInfo {
    let record = &allocator.state().hosts()[index.get()];
    let lifetime = allocator.host_lifetime(index);
    HostInfo {
        host_id: record.id.clone(),
        rack_id: record.rack.clone(),
        cluster_id: record.cluster.clone(),
        hardware: record.hardware.clone(),
        state: record.state,
        capacity: record.capacity,
        used: record.used,
        free: record.free(),
        lifetime_class: lifetime.class,
        predicted_exit_s: lifetime.exit_s.is_finite().then_some(lifetime.exit_s),
        vm_count: record.vms.len(),
        policy_state: allocator.host_state().and_then(|policy| {
            let state = policy.snapshot(index).and_then(|json| serde_json::from_str(&json).ok())?;
            Some(PolicyHostState { policy: policy.name().to_owned(), state })
        }),
    }
}
