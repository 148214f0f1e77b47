//! The allocator: one policy over one live inventory, answering allocation requests.
//!
//! [`Allocator`] ties together the inventory ([`InventoryState`]), the policy's rules, the hosts'
//! lifetime summaries, the policy's per-host state ([`crate::host_state`]) and the host selection
//! engine (the incremental index, or the full scan for reference). It is the one piece of placement
//! logic: the allocator service wraps it with durability and the simulator drives it directly. It
//! never blocks and never does I/O; every change it makes is in its journal ([`crate::journal`]).
//!
//! Time is the caller's: every call takes `now_s` (Unix seconds in the service, trace time in the
//! simulator). It only moves forward; an earlier `now_s` is taken as the latest one seen.
//!
//! This file holds placement and release; the rest of the allocator's methods live beside it by
//! seam: [`timeline`] (host summaries, events in time, repredictions), [`drains`] (LARS),
//! [`consolidate`] (consolidation under a migration budget), [`explain`]
//! (dry runs), [`stats`] and [`follow`] (another allocator's committed changes).

mod avoidance;
mod consolidate;
mod drains;
mod explain;
mod follow;
mod inventory;
mod record;
mod stats;
mod timeline;

pub use avoidance::{ConflictAvoidance, HostShare};
pub use consolidate::ConsolidationError;
pub use drains::DrainError;
pub use explain::{Explanation, HostVerdict, RankedHost, RuleScore};
pub use follow::UndoError;
pub use inventory::DEFAULT_CLUSTER;
pub use record::Recorded;
pub use stats::AllocatorStats;

use crate::consolidation::Consolidation;
use crate::defrag::Drain;
use crate::host_state::HostStatePolicy;
use crate::journal::Change;
use crate::lifetime::{HostLifetime, OrderedTime, VmLifetime};
use crate::policy::{Policy, PolicyConfig, PolicyError};
use crate::registry::Registry;
use crate::reprediction::{RepredictionConfig, Repredictions, Repredictor};
use crate::rules::{HostView, RequestTraits, RuleRequest, TenantSpread};
use crate::select::{full_scan, scan_among, Chooser, IncrementalIndex, IndexConfig, Selection, TieBreak};
use crate::state::{HostIndex, InventoryState, NewVm, PlacedVm, RackIndex, StateError};
use domain::{
    AllocationDecision, AllocationOutcome, AllocationRequest, HostId, HostState, InventorySpec, Placement, Rejection,
    RejectionCode, RuleFilterStat, VmId, VmRequest,
};
use serde::{Deserialize, Serialize};
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::sync::Arc;

/// How hosts are chosen.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Engine {
    /// Cached evaluations per request class, updated only for changed hosts.
    #[default]
    Incremental,
    /// Every rule on every host, every time: the reference.
    FullScan,
}

impl Engine {
    /// Every engine by its configuration name.
    pub const NAMES: [&'static str; 2] = ["incremental", "full-scan"];
}

/// Placement settings of an allocator (the `[allocator]` and `[policy]` parts of its config).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AllocatorConfig {
    pub policy: PolicyConfig,
    pub tie_break: TieBreak,
    /// Seed of the tie-breaking generator.
    pub seed: u64,
    pub engine: Engine,
    pub index: IndexConfig,
    /// VM type -> hardware generations it runs on; types not listed run on every generation.
    pub compatibility: HashMap<String, Vec<String>>,
    /// How hosts' exit times follow repredictions (NILAS, LAVA).
    pub reprediction: RepredictionConfig,
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum AllocatorError {
    #[error(transparent)]
    Policy(#[from] PolicyError),
    #[error("inventory: {0}")]
    Inventory(#[from] StateError),
}

/// A request that contradicts what is already placed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum AllocateError {
    #[error("VM `{vm}` is already placed with a different {field}; VM ids must be unique")]
    IdReused { vm: VmId, field: &'static str },
    #[error(
        "VM `{placed}` of this gang is already placed but `{missing}` is not; a gang is placed whole or not at all"
    )]
    PartialGang { placed: VmId, missing: VmId },
}

/// See the module documentation.
#[derive(Debug)]
pub struct Allocator {
    policy: Policy,
    state: InventoryState,
    lifetimes: Vec<HostLifetime>,
    /// Host events in time: a lifetime class dropping, an exit-time refresh, a LAVA deadline.
    /// An entry is stale unless it equals the host's `next_due`.
    due: BinaryHeap<Reverse<(OrderedTime, HostIndex)>>,
    next_due: Vec<f64>,
    /// When each host's exit time is next recomputed from repredictions.
    next_refresh: Vec<f64>,
    refresh_interval_s: Option<f64>,
    /// The model, and every host's VMs as its exit time reads them (with their last exit times).
    repredictions: Repredictions,
    /// The policy's per-host state, when its rules read one (LAVA).
    host_state: Option<Box<dyn HostStatePolicy>>,
    /// The drain in progress (or the last one, finished), LARS.
    drain: Option<Drain>,
    /// Consolidation under a migration budget, when on.
    consolidation: Option<Consolidation>,
    /// True remaining lifetimes for the `oracle` chooser (the simulator's).
    consolidation_lifetimes: Option<Arc<dyn Repredictor>>,
    /// The exits of the last hour while consolidation is on: the `lifetime` chooser leaves a VM
    /// whose batch is leaving where it is.
    recent_exits: crate::consolidation::batches::RecentExits,
    /// Changes since [`Allocator::take_changes`] was last called, in order; the drain's record and
    /// the hosts whose policy state changed are added when they are taken.
    journal: Vec<Change>,
    drain_changed: bool,
    consolidation_changed: bool,
    /// Hosts whose policy state changed since the changes were last taken, in any order and maybe
    /// more than once (sorted and deduplicated when taken). A vector that keeps its capacity: a
    /// set emptied at every take would allocate again at every placement of a stateful policy.
    state_changed: Vec<HostIndex>,
    index: Option<IncrementalIndex>,
    chooser: Chooser,
    avoidance: Option<ConflictAvoidance>,
    clock_s: f64,
    rejections: HashMap<RejectionCode, u64>,
}

impl Allocator {
    /// An allocator under `config`'s policy, built from the standard rules and presets.
    pub fn new(spec: &InventorySpec, config: &AllocatorConfig) -> Result<Self, AllocatorError> {
        Allocator::with_registry(spec, config, &Registry::standard())
    }

    /// An allocator whose policy may name the rules and presets of `registry` (an embedder's own).
    pub fn with_registry(
        spec: &InventorySpec,
        config: &AllocatorConfig,
        registry: &Registry,
    ) -> Result<Self, AllocatorError> {
        let policy = Policy::from_config(&config.policy, &config.compatibility, registry)?;
        // No host is an inventory too: a cloud's hosts may all come while the allocator runs.
        let state = InventoryState::from_spec(spec)?;
        let hosts = state.hosts().len();
        let host_state = policy.create_host_state(hosts);
        Ok(Allocator {
            policy,
            state,
            lifetimes: vec![HostLifetime::EMPTY; hosts],
            due: BinaryHeap::new(),
            next_due: vec![f64::INFINITY; hosts],
            next_refresh: vec![f64::INFINITY; hosts],
            refresh_interval_s: config.reprediction.interval_s(),
            repredictions: Repredictions::new(hosts),
            host_state,
            drain: None,
            consolidation: None,
            consolidation_lifetimes: None,
            recent_exits: Default::default(),
            journal: Vec::new(),
            drain_changed: false,
            consolidation_changed: false,
            state_changed: Vec::new(),
            index: (config.engine == Engine::Incremental).then(|| IncrementalIndex::new(config.index.clone(), hosts)),
            chooser: Chooser::new(config.tie_break, config.seed),
            avoidance: None,
            clock_s: f64::NEG_INFINITY,
            rejections: HashMap::new(),
        })
    }

    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// Switches the host selection engine; the state stays as it is (a new index starts empty and
    /// builds each request class on first use).
    pub fn set_engine(&mut self, engine: Engine, index: &IndexConfig) {
        self.index =
            (engine == Engine::Incremental).then(|| IncrementalIndex::new(index.clone(), self.state.hosts().len()));
    }

    pub fn state(&self) -> &InventoryState {
        &self.state
    }

    pub fn host_lifetime(&self, host: HostIndex) -> &HostLifetime {
        &self.lifetimes[host.get()]
    }

    /// Every host's lifetime summary, by host index.
    pub fn lifetimes(&self) -> &[HostLifetime] {
        &self.lifetimes
    }

    /// What the policy's rules read of `vm` (the first half of [`Allocator::rule_request`]).
    pub fn request_traits(&self, vm: &VmRequest) -> RequestTraits {
        let lifetime = self.policy.classes().vm_lifetime(vm.prediction.as_ref());
        RequestTraits::of(&vm.facts, lifetime.class, self.policy.read_traits())
    }

    /// What the rules see of `vm` now, with its `traits` ([`Allocator::request_traits`]): for
    /// checking a decision against [`crate::select::full_scan`].
    pub fn rule_request<'a>(&'a self, vm: &'a VmRequest, traits: &'a RequestTraits) -> RuleRequest<'a> {
        let lifetime = self.policy.classes().vm_lifetime(vm.prediction.as_ref());
        rule_request(&self.state, &self.policy, vm, traits, lifetime, self.clock_s)
    }

    /// The allocator's clock: the latest time it was given.
    pub fn clock_s(&self) -> f64 {
        self.clock_s
    }

    /// The policy's per-host state, if its rules read one (LAVA); `as_any().downcast_ref` gives the
    /// concrete type.
    pub fn host_state(&self) -> Option<&dyn HostStatePolicy> {
        self.host_state.as_deref()
    }

    /// Every change since the last call, in order (the drain's record and the hosts whose policy
    /// state changed last): what the store writes and the simulator follows ([`crate::journal`]).
    /// Callers take the changes after every operation; the journal keeps its capacity between takes.
    pub fn take_changes(&mut self) -> std::vec::Drain<'_, Change> {
        if std::mem::take(&mut self.drain_changed) {
            self.journal.push(Change::Drain(self.drain.clone().map(Box::new)));
        }
        if std::mem::take(&mut self.consolidation_changed) {
            self.journal.push(Change::Consolidation(self.consolidation.clone().map(Box::new)));
        }
        if let Some(policy) = &self.host_state {
            self.state_changed.sort_unstable();
            self.state_changed.dedup();
            for host in self.state_changed.drain(..) {
                self.journal.push(Change::PolicyHostState {
                    host: self.state.hosts()[host.get()].id.clone(),
                    policy: policy.name(),
                });
            }
        }
        self.journal.drain(..)
    }

    /// A host's state under the stateful policy, as the store keeps it (`None`: its initial state,
    /// or no stateful policy, or no such host): what a [`Change::PolicyHostState`] stands for.
    pub fn policy_host_snapshot(&self, host: &HostId) -> Option<String> {
        let index = self.state.host_index(host)?;
        self.host_state.as_ref()?.snapshot(index)
    }

    /// Puts back a host's policy state recorded by the store (after its VMs were restored). A row
    /// of another stateful policy than this one's (the policy was changed) is ignored.
    pub fn restore_host_state(&mut self, host: &HostId, policy: &str, snapshot: &str) -> Result<(), StateError> {
        let index = self.state.host_index(host).ok_or_else(|| StateError::UnknownHostId(host.clone()))?;
        let Some(state) = self.host_state.as_mut().filter(|s| s.name() == policy) else { return Ok(()) };
        state.restore(index, Some(snapshot)).map_err(|e| StateError::HostPolicyState(e.to_string()))?;
        self.refresh_lifetime(index);
        self.host_changed(index);
        // A timer that passed while the allocator was down fires now, at its own time.
        self.advance_clock(self.clock_s);
        Ok(())
    }

    /// The VM's predicted lifetime under this policy's classes.
    pub fn vm_lifetime(&self, vm: &PlacedVm) -> VmLifetime {
        self.policy.classes().vm_lifetime(vm.prediction.as_ref())
    }

    /// Where a placed VM is, as an allocation answer gives it.
    pub fn placement(&self, vm: &VmId) -> Option<Placement> {
        let placed = self.state.vm(vm)?;
        let host = &self.state.hosts()[placed.host.get()];
        Some(Placement {
            vm_id: vm.clone(),
            host_id: host.id.clone(),
            rack_id: host.rack.clone(),
            cluster_id: host.cluster.clone(),
            prediction: placed.prediction.clone(),
        })
    }

    /// Places a VM or a whole gang, or rejects it changing nothing. A request whose VMs are all
    /// placed already gets their placements back (`replayed`), so retries are safe.
    pub fn allocate(&mut self, request: &AllocationRequest, now_s: f64) -> Result<AllocationDecision, AllocateError> {
        if let Some(replay) = self.replay(request)? {
            return Ok(replay);
        }
        self.advance_clock(now_s);
        let mut placements = Vec::with_capacity(request.vms().len());
        // A gang that does not fit leaves no trace: its changes are cut from the journal and the
        // policy states it touched put back.
        let journal_mark = self.journal.len();
        let gang = request.vms().len() > 1;
        let mut states_before: Vec<(HostIndex, Option<String>)> = Vec::new();
        let mut last_stats = Vec::new();
        for (position, vm) in request.vms().iter().enumerate() {
            let mut selection = self.select(vm, None);
            // Candidates come from one cloud scheduler, which avoids nobody.
            if let Some(best) = selection.host.filter(|_| vm.candidates.is_none()) {
                selection.host = Some(self.avoiding(vm, best));
            }
            match selection.host {
                Some(host) => {
                    last_stats = std::mem::take(&mut selection.stats);
                    if let Some(state) = self.host_state.as_ref().filter(|_| gang) {
                        states_before.push((host, state.snapshot(host)));
                    }
                    self.place_on(vm, host, false);
                    placements.push(self.placement(&vm.vm_id).expect("just placed"));
                }
                None => {
                    for placed in &placements {
                        self.remove_vm(&placed.vm_id, None);
                    }
                    self.journal.truncate(journal_mark);
                    for (host, snapshot) in states_before.into_iter().rev() {
                        if let Some(state) = &mut self.host_state {
                            if let Err(error) = state.restore(host, snapshot.as_deref()) {
                                unreachable!("a snapshot taken a moment ago is readable: {error}");
                            }
                        }
                        self.refresh_lifetime(host);
                        self.host_changed(host);
                    }
                    // After the rollback: would this VM fit alone? Then it is the gang that does not.
                    let alone = position > 0 && self.select(vm, Some(self.chooser.clone())).host.is_some();
                    let code = if alone { RejectionCode::GangDoesNotFit } else { RejectionCode::NoFeasibleHost };
                    *self.rejections.entry(code).or_insert(0) += 1;
                    return Ok(AllocationDecision {
                        outcome: AllocationOutcome::Rejected { rejection: rejection(code, vm, &selection, request) },
                        rule_stats: selection.stats,
                        replayed: false,
                    });
                }
            }
        }
        Ok(AllocationDecision {
            outcome: AllocationOutcome::Placed { placements },
            rule_stats: last_stats,
            replayed: false,
        })
    }

    /// The earlier answer when every VM of the request is placed already.
    fn replay(&self, request: &AllocationRequest) -> Result<Option<AllocationDecision>, AllocateError> {
        let mut placed = None;
        let mut missing = None;
        for vm in request.vms() {
            match self.state.vm(&vm.vm_id) {
                Some(existing) => {
                    let field = if existing.facts.tenant_id != vm.facts.tenant_id {
                        Some("tenant")
                    } else if existing.facts.demand != vm.facts.demand {
                        Some("demand")
                    } else if existing.facts.vm_type != vm.facts.vm_type {
                        Some("vm_type")
                    } else {
                        None
                    };
                    if let Some(field) = field {
                        return Err(AllocateError::IdReused { vm: vm.vm_id.clone(), field });
                    }
                    placed.get_or_insert(&vm.vm_id);
                }
                None => {
                    missing.get_or_insert(&vm.vm_id);
                }
            }
        }
        match (placed, missing) {
            (Some(placed), Some(missing)) => {
                Err(AllocateError::PartialGang { placed: placed.clone(), missing: missing.clone() })
            }
            (Some(_), None) => {
                let placements = request.vms().iter().filter_map(|vm| self.placement(&vm.vm_id)).collect();
                Ok(Some(AllocationDecision {
                    outcome: AllocationOutcome::Placed { placements },
                    rule_stats: Vec::new(),
                    replayed: true,
                }))
            }
            _ => Ok(None),
        }
    }

    /// Releases a VM; its host's capacity is free at once.
    pub fn release(&mut self, vm: &VmId, now_s: f64) -> Result<PlacedVm, StateError> {
        self.release_ended(vm, now_s, None)
    }

    /// [`Allocator::release`] of a VM that ended at `ended_at_s` on the model's clock (that of its
    /// `requested_at_s`), as the journal's [`Change::Released`] records it (none: estimated,
    /// [`crate::journal::exit_time`]).
    pub fn release_ended(&mut self, vm: &VmId, now_s: f64, ended_at_s: Option<f64>) -> Result<PlacedVm, StateError> {
        self.advance_clock(now_s);
        if self.state.vm(vm).is_none() {
            return Err(StateError::UnknownVm(vm.clone()));
        }
        let placed = self.remove_vm(vm, ended_at_s);
        if self.consolidation.is_some() {
            self.recent_exits.record(&placed.facts.tenant_id, placed.placed_at_s, self.clock_s);
        }
        Ok(placed)
    }

    /// Drains (unavailable), fails or restores a host; its VMs stay. Returns the previous state.
    pub fn set_host_state(&mut self, host: &HostId, new_state: HostState) -> Result<HostState, StateError> {
        let index = self.state.host_index(host).ok_or_else(|| StateError::UnknownHostId(host.clone()))?;
        let previous = self.state.hosts()[index.get()].state;
        self.state.set_host_state(index, new_state)?;
        self.host_changed(index);
        self.journal.push(Change::HostState { host: host.clone(), state: new_state, previous });
        Ok(previous)
    }

    /// Puts back a VM recorded as placed on `host` (recovery from the durable store).
    pub fn restore(&mut self, vm: NewVm, host: &HostId, now_s: f64) -> Result<(), StateError> {
        self.advance_clock(now_s);
        let index = self.state.host_index(host).ok_or_else(|| StateError::UnknownHostId(host.clone()))?;
        let lifetime_s = self.policy.classes().vm_lifetime(vm.prediction.as_ref()).lifetime_s;
        let vm = Arc::new(vm);
        // No policy-state transition: the store's record of the host's policy state follows.
        self.state.restore(Arc::clone(&vm), index)?;
        self.repredictions.add(index.get(), &vm, lifetime_s);
        self.refresh_lifetime(index);
        self.host_changed(index);
        Ok(())
    }

    fn view(&self, host: HostIndex) -> HostView<'_> {
        HostView { index: host, record: &self.state.hosts()[host.get()], lifetime: &self.lifetimes[host.get()] }
    }

    /// Chooses a host for `vm` with the configured engine; `dry_run` draws ties with a copy of the
    /// generator so that the real sequence is untouched.
    fn select(&mut self, vm: &VmRequest, dry_run: Option<Chooser>) -> Selection {
        let lifetime = self.policy.classes().vm_lifetime(vm.prediction.as_ref());
        let mut dry = dry_run;
        // Split borrows: the request reads the state while the index and chooser change.
        let Allocator { policy, state, lifetimes, index, chooser, clock_s, .. } = self;
        let chooser = dry.as_mut().unwrap_or(chooser);
        let traits = RequestTraits::of(&vm.facts, lifetime.class, policy.read_traits());
        let request = rule_request(state, policy, vm, &traits, lifetime, *clock_s);
        if let Some(candidates) = &vm.candidates {
            // A cloud scheduler's survivors: the policy's choice among them (ids not in the
            // inventory are passed over; none known leaves no host).
            let among: Vec<HostIndex> = candidates.iter().filter_map(|id| state.host_index(id)).collect();
            return scan_among(policy, state, lifetimes, &request, chooser, &among);
        }
        match index {
            Some(index) => index.select(policy, state, lifetimes, &request, chooser),
            None => full_scan(policy, state, lifetimes, &request, chooser),
        }
    }

    /// Places `vm` on `host`, which the selection chose (every validator checked against this very
    /// state) or which the caller checked has room ([`InventoryState::check_fits`]), whatever its
    /// state, when `recorded` (a cloud put it there).
    fn place_on(&mut self, vm: &VmRequest, host: HostIndex, recorded: bool) {
        let new = Arc::new(NewVm::of(vm, self.clock_s));
        self.journal.push(Change::Placed { vm: Arc::clone(&new), host: self.state.hosts()[host.get()].id.clone() });
        let placed = if recorded {
            self.state.restore(Arc::clone(&new), host)
        } else {
            self.state.place(Arc::clone(&new), host)
        };
        if let Err(error) = placed {
            unreachable!("a host checked a moment ago refused its VM: {error}");
        }
        let lifetime = self.policy.classes().vm_lifetime(vm.prediction.as_ref());
        self.repredictions.add(host.get(), &new, lifetime.lifetime_s);
        if let Some(state) = &mut self.host_state {
            state.on_place(host, &self.state.hosts()[host.get()], lifetime.class, self.clock_s);
            self.state_changed.push(host);
        }
        self.refresh_lifetime(host);
        self.host_changed(host);
    }

    fn remove_vm(&mut self, vm: &VmId, ended_at_s: Option<f64>) -> PlacedVm {
        let migrating_to = self.state.migration_target(vm);
        let placed = match self.state.release(vm) {
            Ok(placed) => placed,
            Err(error) => unreachable!("releasing a VM known to be placed: {error}"),
        };
        self.repredictions.remove(placed.host.get(), vm);
        let ended_at_s = ended_at_s
            .filter(|t| t.is_finite())
            .unwrap_or_else(|| crate::journal::exit_time(&placed.record, self.clock_s));
        self.journal.push(Change::Released { vm: vm.clone(), was: placed.clone(), ended_at_s });
        if let Some(target) = migrating_to {
            // Its reservation went with it.
            self.journal.push(Change::MigrationCancelled { vm: vm.clone() });
            self.refresh_lifetime(target);
            self.host_changed(target);
        }
        let drained = self.drain.as_mut().is_some_and(|drain| drain.vm_exited(vm));
        self.drain_changed |= drained;
        if let Some(state) = &mut self.host_state {
            state.on_release(placed.host, &self.state.hosts()[placed.host.get()], vm, self.clock_s);
            self.state_changed.push(placed.host);
        }
        self.refresh_lifetime(placed.host);
        self.host_changed(placed.host);
        if drained {
            // A drained VM left: a migration slot may be free.
            self.pump_drain();
        }
        self.consolidation_vm_left(vm);
        placed
    }

    fn host_changed(&mut self, host: HostIndex) {
        if let Some(index) = &mut self.index {
            index.host_changed(host);
        }
    }
}

/// What `policy`'s rules see of `vm` at `now_s`; its exit is read as at least the policy's exit
/// floor from now.
fn rule_request<'a>(
    state: &'a InventoryState,
    policy: &Policy,
    vm: &'a VmRequest,
    traits: &'a RequestTraits,
    lifetime: VmLifetime,
    now_s: f64,
) -> RuleRequest<'a> {
    let exit_floor_s = policy.exit_floor_s();
    static NO_VMS: std::sync::LazyLock<HashMap<RackIndex, u32>> = std::sync::LazyLock::new(HashMap::new);
    RuleRequest {
        traits,
        exit_s: now_s + lifetime.lifetime_s.max(exit_floor_s),
        spread: vm.max_per_rack.map(|max_per_rack| TenantSpread {
            max_per_rack,
            vms_per_rack: state.tenant_racks(&vm.facts.tenant_id).unwrap_or(&NO_VMS),
        }),
    }
}

fn rejection(code: RejectionCode, vm: &VmRequest, selection: &Selection, request: &AllocationRequest) -> Rejection {
    // With no valid host, only validators can have removed any.
    let eliminated_by: Vec<RuleFilterStat> =
        selection.stats.iter().filter(|s| s.hosts_kept < s.hosts_in).cloned().collect();
    let blame = eliminated_by
        .iter()
        .map(|s| format!("{} eliminated {}", s.rule, s.hosts_in - s.hosts_kept))
        .collect::<Vec<_>>()
        .join(", ");
    let detail = match code {
        RejectionCode::GangDoesNotFit => format!(
            "the gang of {} VMs does not fit all together: VM `{}` ({}) finds no host once the others are placed",
            request.vms().len(),
            vm.vm_id,
            vm.facts.demand
        ),
        _ => format!("no host can take VM `{}` ({}): {blame}", vm.vm_id, vm.facts.demand),
    };
    Rejection { code, detail, vm_id: Some(vm.vm_id.clone()), eliminated_by }
}
