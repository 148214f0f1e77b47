//! The allocator: one policy over one live inventory, answering allocation requests.
//!
//! [`Allocator`] ties together the inventory ([`InventoryState`]), the policy's rules, the hosts'
//! lifetime summaries and the host selection engine (the incremental index, or the full scan for
//! reference). It is the one piece of placement logic: the HTTP service wraps it with durability
//! ([`crate::durable`]) and the simulator drives it directly. It never blocks and never does I/O.
//!
//! Time is the caller's: every call takes `now_s` (Unix seconds in the service, trace time in the
//! simulator). It only moves forward; an earlier `now_s` is taken as the latest one seen.

use crate::defrag::{Drain, DrainHosts, DrainReport, DrainRequest, Migration, MigrationOrder};
use crate::lava::{LavaHost, LavaState};
use crate::lifetime::{HostLifetime, OrderedTime, VmLifetime};
use crate::policy::{Policy, PolicyConfig, PolicyError, ScoreKey};
use crate::reprediction::{ExitTimes, RepredictionConfig, Repredictions, Repredictor};
use crate::rules::{HostView, RuleRequest, TenantSpread};
use crate::select::{full_scan, Chooser, IncrementalIndex, IndexConfig, Selection, TieBreak};
use crate::state::{HostIndex, InventoryState, NewVm, PlacedVm, RackIndex, StateError};
use domain::{
    AllocationDecision, AllocationOutcome, AllocationRequest, HostId, HostState, InventorySpec, LifetimeClass,
    Placement, Rejection, RejectionCode, ResourceKind, RuleFilterStat, VmId, VmRequest,
};
use lifetime_model::RequestFeatures;
use serde::{Deserialize, Serialize};
use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap, HashMap};
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
    #[error("the inventory has no host")]
    NoHosts,
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

/// Why a drain or migration operation was refused; nothing changed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum DrainError {
    #[error("a drain is in progress; wait for it to finish (GET /v1/drains)")]
    Busy,
    #[error("no drain is in progress")]
    NoDrain,
    #[error("host `{0}` is not in the inventory")]
    UnknownHost(HostId),
    #[error("no host to drain: name hosts, or pick at least one non-empty available host")]
    NoHosts,
    #[error("VM `{0}` is not migrating")]
    NotMigrating(VmId),
}

/// A change to migrations that the store records.
#[derive(Debug, Clone, PartialEq)]
pub enum MigrationChange {
    Started { vm: VmId, target: HostId },
    Completed { vm: VmId, target: HostId },
    Cancelled { vm: VmId },
}

/// Occupancy and lifetime figures of the inventory (`GET /v1/stats`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct AllocatorStats {
    pub policy: String,
    pub hosts: usize,
    pub available_hosts: usize,
    pub empty_hosts: usize,
    pub vms: usize,
    /// Allocated cores / cores of non-empty hosts.
    pub packing_density: f64,
    /// Share of hosts with no VM, in percent.
    pub empty_hosts_pct: f64,
    /// Free cores on empty hosts / all free cores (paper 002 s D).
    pub empty_to_free_ratio: f64,
    pub allocated_cores: f64,
    pub capacity_cores: f64,
    pub allocated_memory_gib: f64,
    pub capacity_memory_gib: f64,
    pub vms_short: usize,
    pub vms_long: usize,
    pub cores_short: f64,
    pub cores_long: f64,
    /// Requests rejected since start, by reason.
    pub rejections: HashMap<String, u64>,
    /// Cached request classes of the incremental index.
    pub classes_cached: usize,
    /// Hosts by LAVA state and class (LAVA policy only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lava: Option<LavaStats>,
    /// Version of the remaining-lifetime model repredicting exit times, if one is loaded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reprediction_model: Option<String>,
    /// Model evaluations made by repredictions since start (a reprediction answered from the VM's
    /// last evaluation, its uptime still where the model's answer cannot have changed, is not one).
    pub repredictions: u64,
}

/// How many hosts are in each LAVA state, and the non-empty ones by class.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct LavaStats {
    pub empty: usize,
    pub open: usize,
    pub recycling: usize,
    /// Non-empty hosts per class index (0: < 1 h ... 4: >= 1000 h), as `"0"`..`"4"`.
    pub by_class: BTreeMap<String, usize>,
}

/// One host as `explain` ranks it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RankedHost {
    pub host_id: HostId,
    /// Score under each preference rule, in rule order (lower is better).
    pub scores: Vec<RuleScore>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RuleScore {
    pub rule: String,
    pub score: u32,
}

/// Why one host was not (or would not be) chosen.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct HostVerdict {
    pub host_id: HostId,
    /// The validator that rejects it, if one does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rejected_by: Option<String>,
    /// The first preference rule on which it scores worse than the best host, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outranked_at: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub scores: Vec<RuleScore>,
    pub explanation: String,
}

/// A dry run of one VM's placement (`POST /v1/explain`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Explanation {
    /// The host the allocator would pick now, if any.
    pub would_pick: Option<HostId>,
    /// The VM's lifetime class under the policy.
    pub lifetime_class: u8,
    /// How many hosts tie for the best score.
    pub ties: usize,
    pub top: Vec<RankedHost>,
    pub rule_stats: Vec<RuleFilterStat>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub why_not: Option<HostVerdict>,
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
    /// Every host's LAVA state (empty unless the policy is LAVA).
    lava: Vec<LavaHost>,
    /// Hosts whose LAVA state changed since [`Allocator::take_lava_changes`] was last called.
    lava_changed: BTreeSet<HostIndex>,
    /// The drain in progress (or the last one, finished), LARS.
    drain: Option<Drain>,
    /// Migration and drain changes since [`Allocator::take_migration_changes`] was last called.
    migration_changes: Vec<MigrationChange>,
    drain_changed: bool,
    index: Option<IncrementalIndex>,
    chooser: Chooser,
    clock_s: f64,
    rejections: HashMap<RejectionCode, u64>,
}

impl Allocator {
    pub fn new(spec: &InventorySpec, config: &AllocatorConfig) -> Result<Self, AllocatorError> {
        let policy = Policy::from_config(&config.policy, &config.compatibility)?;
        let state = InventoryState::from_spec(spec)?;
        if state.hosts().is_empty() {
            return Err(AllocatorError::NoHosts);
        }
        let hosts = state.hosts().len();
        Ok(Allocator {
            policy,
            state,
            lifetimes: vec![HostLifetime::EMPTY; hosts],
            due: BinaryHeap::new(),
            next_due: vec![f64::INFINITY; hosts],
            next_refresh: vec![f64::INFINITY; hosts],
            refresh_interval_s: config.reprediction.interval_s(),
            repredictions: Repredictions::new(hosts),
            lava: vec![LavaHost::default(); hosts],
            lava_changed: BTreeSet::new(),
            drain: None,
            migration_changes: Vec::new(),
            drain_changed: false,
            index: (config.engine == Engine::Incremental).then(|| IncrementalIndex::new(config.index.clone(), hosts)),
            chooser: Chooser::new(config.tie_break, config.seed),
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

    /// What the rules see of `vm` now: for checking a decision against [`crate::select::full_scan`].
    pub fn rule_request<'a>(&'a self, vm: &'a VmRequest) -> RuleRequest<'a> {
        let lifetime = self.policy.classes().vm_lifetime(vm.prediction.as_ref());
        rule_request(&self.state, vm, lifetime, self.clock_s, self.policy.exit_floor_s())
    }

    /// The allocator's clock: the latest time it was given.
    pub fn clock_s(&self) -> f64 {
        self.clock_s
    }

    /// Uses `model` to repredict remaining lifetimes from now on (`None`: initial predictions minus
    /// age), and recomputes every host's exit time with it. Only policies that read exit times
    /// (NILAS, LAVA) use it.
    pub fn set_repredictor(&mut self, model: Option<Arc<dyn Repredictor>>) {
        if !self.policy.reads_exit_times() {
            return;
        }
        // Rows for the VMs already placed, from what the state keeps of them.
        let state = &self.state;
        self.repredictions.set_model(model, |id| {
            state.vm(id).map(|vm| stored_features(&vm.tenant, &vm.vm_type, &vm.demand, vm.placed_at_s))
        });
        self.refresh_exits();
    }

    /// Model evaluations made by repredictions since start (O(1); also in [`Allocator::stats`]): a
    /// reprediction the model's split thresholds show to be unchanged since the VM's last
    /// evaluation reuses it and is not counted ([`crate::reprediction`]).
    pub fn repredictions_made(&self) -> u64 {
        self.repredictions.count
    }

    /// Version of the repredicting model, if one is set.
    pub fn repredictor_version(&self) -> Option<&str> {
        self.repredictions.model_version()
    }

    /// Recomputes every non-empty host's exit time now (what the periodic refresh does host by
    /// host); the hosts whose summary changed are re-evaluated by the index.
    pub fn refresh_exits(&mut self) {
        for index in 0..self.state.hosts().len() {
            let host = HostIndex(index as u32);
            if !self.state.hosts()[index].is_empty() {
                let before = self.lifetimes[index];
                self.repredict_host(host);
                if self.lifetimes[index] != before {
                    self.host_changed(host);
                }
            }
        }
    }

    /// A host's LAVA state (LAVA policy only).
    pub fn lava_host(&self, host: HostIndex) -> Option<&LavaHost> {
        self.policy.is_lava().then(|| &self.lava[host.get()])
    }

    /// The hosts whose LAVA state changed since the last call, with their state now: what the
    /// store must write.
    pub fn take_lava_changes(&mut self) -> Vec<(HostIndex, LavaHost)> {
        std::mem::take(&mut self.lava_changed).into_iter().map(|h| (h, self.lava[h.get()].clone())).collect()
    }

    /// Puts back a host's LAVA state recorded by the store (after its VMs were restored).
    pub fn restore_lava(&mut self, host: &HostId, lava: LavaHost) -> Result<(), StateError> {
        let index = self.state.host_index(host).ok_or_else(|| StateError::UnknownHostId(host.clone()))?;
        if !self.policy.is_lava() {
            return Ok(());
        }
        self.lava[index.get()] = lava;
        self.refresh_lifetime(index);
        self.host_changed(index);
        // A deadline that passed while the allocator was down applies now, at the deadline.
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
        // LAVA states before the gang touched them, to put back if it does not fit.
        let mut lava_before: Vec<(HostIndex, LavaHost)> = Vec::new();
        let mut last_stats = Vec::new();
        for (position, vm) in request.vms().iter().enumerate() {
            let selection = self.select(vm, None);
            last_stats = selection.stats.clone();
            match selection.host {
                Some(host) => {
                    if self.policy.is_lava() {
                        lava_before.push((host, self.lava[host.get()].clone()));
                    }
                    self.place_on(vm, host);
                    placements.push(self.placement(&vm.vm_id).expect("just placed"));
                }
                None => {
                    for placed in &placements {
                        self.remove_vm(&placed.vm_id);
                    }
                    for (host, lava) in lava_before.into_iter().rev() {
                        self.lava[host.get()] = lava;
                        self.refresh_lifetime(host);
                        self.host_changed(host);
                    }
                    // After the rollback: would this VM fit alone? Then it is the gang that does not.
                    let alone = position > 0 && self.select(vm, Some(self.chooser.clone())).host.is_some();
                    let code = if alone { RejectionCode::GangDoesNotFit } else { RejectionCode::NoFeasibleHost };
                    *self.rejections.entry(code).or_insert(0) += 1;
                    return Ok(AllocationDecision {
                        outcome: AllocationOutcome::Rejected { rejection: rejection(code, vm, &selection, request) },
                        rule_stats: last_stats,
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
                    let field = if existing.tenant != vm.tenant_id {
                        Some("tenant")
                    } else if existing.demand != vm.demand {
                        Some("demand")
                    } else if existing.vm_type != vm.vm_type {
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
        self.advance_clock(now_s);
        if self.state.vm(vm).is_none() {
            return Err(StateError::UnknownVm(vm.clone()));
        }
        Ok(self.remove_vm(vm))
    }

    /// Drains (unavailable), fails or restores a host; its VMs stay. Returns the previous state.
    pub fn set_host_state(&mut self, host: &HostId, new_state: HostState) -> Result<HostState, StateError> {
        let index = self.state.host_index(host).ok_or_else(|| StateError::UnknownHostId(host.clone()))?;
        let previous = self.state.hosts()[index.get()].state;
        self.state.set_host_state(index, new_state)?;
        self.host_changed(index);
        Ok(previous)
    }

    /// Puts back a VM recorded as placed on `host` (recovery from the durable store).
    pub fn restore(&mut self, vm: NewVm, host: &HostId, now_s: f64) -> Result<(), StateError> {
        self.advance_clock(now_s);
        let index = self.state.host_index(host).ok_or_else(|| StateError::UnknownHostId(host.clone()))?;
        let features = self
            .repredictions
            .has_model()
            .then(|| stored_features(&vm.tenant, &vm.vm_type, &vm.demand, vm.placed_at_s));
        let (id, placed_at_s) = (vm.id.clone(), vm.placed_at_s);
        let lifetime_s = self.policy.classes().vm_lifetime(vm.prediction.as_ref()).lifetime_s;
        // No LAVA transition: the store's record of the host's LAVA state follows.
        self.state.restore(vm, index)?;
        self.repredictions.add(index.get(), &id, placed_at_s, lifetime_s, features);
        self.refresh_lifetime(index);
        self.host_changed(index);
        Ok(())
    }

    /// A dry run: where `vm` would go, the best hosts with their scores and, for `why_not`, why that
    /// host loses. Changes nothing (not even the tie-breaking sequence).
    pub fn explain(
        &mut self,
        vm: &VmRequest,
        why_not: Option<&HostId>,
        top: usize,
        now_s: f64,
    ) -> Result<Explanation, StateError> {
        self.advance_clock(now_s);
        let why_not = why_not
            .map(|id| self.state.host_index(id).ok_or_else(|| StateError::UnknownHostId(id.clone())))
            .transpose()?;
        let selection = self.select(vm, Some(self.chooser.clone()));
        let lifetime = self.policy.classes().vm_lifetime(vm.prediction.as_ref());
        let request = rule_request(&self.state, vm, lifetime, self.clock_s, self.policy.exit_floor_s());
        let validators = self.policy.validators().len();
        let mut ranked: Vec<(ScoreKey, HostIndex)> = (0..self.state.hosts().len())
            .map(|i| HostIndex(i as u32))
            .filter(|h| self.policy.first_rejection(&self.view(*h), &request, 0..validators).is_none())
            .map(|h| (self.policy.score(&self.view(h), &request), h))
            .collect();
        ranked.sort_unstable();
        let top = ranked.iter().take(top).map(|(key, h)| self.ranked(*h, key)).collect();
        let verdict = why_not.map(|host| self.verdict(host, &request, selection.score, selection.host));
        Ok(Explanation {
            would_pick: selection.host.map(|h| self.state.hosts()[h.get()].id.clone()),
            lifetime_class: lifetime.class,
            ties: selection.ties,
            top,
            rule_stats: selection.stats,
            why_not: verdict,
        })
    }

    fn ranked(&self, host: HostIndex, key: &ScoreKey) -> RankedHost {
        RankedHost { host_id: self.state.hosts()[host.get()].id.clone(), scores: self.rule_scores(key) }
    }

    fn rule_scores(&self, key: &ScoreKey) -> Vec<RuleScore> {
        self.policy
            .preferences()
            .iter()
            .zip(key)
            .map(|(rule, &score)| RuleScore { rule: rule.name().to_owned(), score })
            .collect()
    }

    fn verdict(
        &self,
        host: HostIndex,
        request: &RuleRequest,
        best: Option<ScoreKey>,
        pick: Option<HostIndex>,
    ) -> HostVerdict {
        let host_id = self.state.hosts()[host.get()].id.clone();
        let view = self.view(host);
        let validators = self.policy.validators();
        if let Some(rule) = self.policy.first_rejection(&view, request, 0..validators.len()) {
            let name = validators[rule].name();
            return HostVerdict {
                host_id,
                rejected_by: Some(name.to_owned()),
                outranked_at: None,
                scores: Vec::new(),
                explanation: format!("validator `{name}` rejects it"),
            };
        }
        let key = self.policy.score(&view, request);
        let scores = self.rule_scores(&key);
        let lost =
            best.and_then(|best| (0..self.policy.preferences().len()).find(|&l| key[l] > best[l]).map(|l| (l, best)));
        match lost {
            Some((level, best)) => {
                let name = self.policy.preferences()[level].name();
                HostVerdict {
                    host_id,
                    rejected_by: None,
                    outranked_at: Some(name.to_owned()),
                    explanation: format!(
                        "it scores {} on `{name}` where the best hosts score {} (lower is better)",
                        key[level], best[level]
                    ),
                    scores,
                }
            }
            None => HostVerdict {
                host_id,
                rejected_by: None,
                outranked_at: None,
                scores,
                explanation: if pick == Some(host) {
                    "it is the host that would be picked".to_owned()
                } else {
                    "it ties with the best hosts; another one was drawn".to_owned()
                },
            },
        }
    }

    /// Occupancy and lifetime figures; O(VMs) for the by-class counts.
    pub fn stats(&self) -> AllocatorStats {
        let occupancy = self.state.occupancy();
        let hosts = self.state.hosts();
        let cores = |r: &domain::Resources| r.whole(ResourceKind::Cores);
        let (mut vms_long, mut cores_long) = (0, 0.0);
        for (_, vm) in self.state.vms() {
            if domain::prediction::placement_class(vm.prediction.as_ref()) == LifetimeClass::Long {
                vms_long += 1;
                cores_long += cores(&vm.demand);
            }
        }
        AllocatorStats {
            policy: self.policy.name().to_owned(),
            hosts: occupancy.hosts,
            available_hosts: hosts.iter().filter(|h| h.state == HostState::Available).count(),
            empty_hosts: occupancy.empty_hosts,
            vms: self.state.vm_count(),
            packing_density: occupancy.packing_density,
            empty_hosts_pct: occupancy.empty_hosts_pct,
            empty_to_free_ratio: occupancy.empty_to_free,
            allocated_cores: occupancy.allocated_cores,
            capacity_cores: occupancy.capacity_cores,
            allocated_memory_gib: occupancy.allocated_memory_gib,
            capacity_memory_gib: occupancy.capacity_memory_gib,
            vms_short: self.state.vm_count() - vms_long,
            vms_long,
            cores_short: occupancy.allocated_cores - cores_long,
            cores_long,
            rejections: self
                .rejections
                .iter()
                .map(|(code, n)| {
                    (
                        serde_json::to_value(code).ok().and_then(|v| v.as_str().map(str::to_owned)).unwrap_or_default(),
                        *n,
                    )
                })
                .collect(),
            classes_cached: self.index.as_ref().map_or(0, IncrementalIndex::classes_cached),
            lava: self.policy.is_lava().then(|| self.lava_stats()),
            reprediction_model: self.repredictions.model_version().map(str::to_owned),
            repredictions: self.repredictions.count,
        }
    }

    fn lava_stats(&self) -> LavaStats {
        let mut stats = LavaStats::default();
        for lava in &self.lava {
            match lava.state {
                LavaState::Empty => stats.empty += 1,
                LavaState::Open => stats.open += 1,
                LavaState::Recycling => stats.recycling += 1,
            }
            if lava.state != LavaState::Empty {
                *stats.by_class.entry(lava.class.to_string()).or_insert(0) += 1;
            }
        }
        stats
    }

    /// Bytes held by the incremental index.
    pub fn index_heap_bytes(&self) -> usize {
        self.index.as_ref().map_or(0, IncrementalIndex::heap_bytes)
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
        let request = rule_request(state, vm, lifetime, *clock_s, policy.exit_floor_s());
        match index {
            Some(index) => index.select(policy, state, lifetimes, &request, chooser),
            None => full_scan(policy, state, lifetimes, &request, chooser),
        }
    }

    fn place_on(&mut self, vm: &VmRequest, host: HostIndex) {
        let new = NewVm {
            id: vm.vm_id.clone(),
            tenant: vm.tenant_id.clone(),
            vm_type: vm.vm_type.clone(),
            demand: vm.demand,
            placed_at_s: self.clock_s,
            prediction: vm.prediction.clone(),
        };
        // The selection checked every validator against this very state, so this cannot fail.
        if let Err(error) = self.state.place(new, host) {
            unreachable!("a selected host refused its VM: {error}");
        }
        let features = self.repredictions.has_model().then(|| RequestFeatures::from_request(vm, self.clock_s));
        let lifetime_s = self.policy.classes().vm_lifetime(vm.prediction.as_ref()).lifetime_s;
        self.repredictions.add(host.get(), &vm.vm_id, self.clock_s, lifetime_s, features);
        if self.policy.is_lava() {
            let class = self.policy.classes().vm_lifetime(vm.prediction.as_ref()).class;
            self.lava[host.get()].on_place(&self.state.hosts()[host.get()], class, self.clock_s);
            self.lava_changed.insert(host);
        }
        self.refresh_lifetime(host);
        self.host_changed(host);
    }

    fn remove_vm(&mut self, vm: &VmId) -> PlacedVm {
        let migrating_to = self.state.migration_target(vm);
        let placed = match self.state.release(vm) {
            Ok(placed) => placed,
            Err(error) => unreachable!("releasing a VM known to be placed: {error}"),
        };
        self.repredictions.remove(placed.host.get(), vm);
        if let Some(target) = migrating_to {
            // Its reservation went with it.
            self.migration_changes.push(MigrationChange::Cancelled { vm: vm.clone() });
            self.refresh_lifetime(target);
            self.host_changed(target);
        }
        let drained = self.drain.as_mut().is_some_and(|drain| drain.vm_exited(vm));
        self.drain_changed |= drained;
        if self.policy.is_lava() {
            self.lava[placed.host.get()].on_release(&self.state.hosts()[placed.host.get()], vm, self.clock_s);
            self.lava_changed.insert(placed.host);
        }
        self.refresh_lifetime(placed.host);
        self.host_changed(placed.host);
        if drained {
            // A drained VM left: a migration slot may be free.
            self.pump_drain();
        }
        placed
    }

    /// Starts draining hosts (LARS, paper 000 s4.4): they become unavailable and their VMs migrate
    /// away, `max_in_flight` at a time, longest predicted remaining lifetime first (or in arrival
    /// order). Returns where the drain stands: the first migrations are in flight.
    pub fn start_drain(&mut self, request: &DrainRequest, now_s: f64) -> Result<DrainReport, DrainError> {
        self.advance_clock(now_s);
        if self.drain.as_ref().is_some_and(|d| !self.drain_done(d)) {
            return Err(DrainError::Busy);
        }
        let mut hosts: Vec<HostIndex> = match &request.hosts {
            DrainHosts::Listed(ids) => ids
                .iter()
                .map(|id| self.state.host_index(id).ok_or_else(|| DrainError::UnknownHost(id.clone())))
                .collect::<Result<_, _>>()?,
            DrainHosts::Pick(count) => self.drain_candidates(*count),
        };
        hosts.sort_unstable();
        hosts.dedup();
        if hosts.is_empty() {
            return Err(DrainError::NoHosts);
        }
        let mut queue: Vec<(f64, VmId)> = Vec::new();
        for &host in &hosts {
            if let Err(error) = self.state.set_host_state(host, HostState::Unavailable) {
                unreachable!("an indexed host exists: {error}");
            }
            self.host_changed(host);
            for id in self.state.hosts()[host.get()].vms.clone() {
                if self.state.migration_target(&id).is_some() {
                    continue;
                }
                let Some(vm) = self.state.vm(&id).cloned() else { continue };
                let key = match request.order {
                    MigrationOrder::Arrival => vm.placed_at_s,
                    MigrationOrder::LongestRemainingFirst => -self.remaining_s(&id, &vm),
                };
                queue.push((key, id));
            }
        }
        // Stable: VMs of equal key keep host and placement order.
        queue.sort_by(|a, b| a.0.total_cmp(&b.0));
        let ids = hosts.iter().map(|h| self.state.hosts()[h.get()].id.clone()).collect();
        self.drain =
            Some(Drain::new(ids, request.order, request.max_in_flight, queue.into_iter().map(|(_, id)| id).collect()));
        self.drain_changed = true;
        self.pump_drain();
        self.drain_report().ok_or(DrainError::NoDrain)
    }

    /// The migration of `vm` finished: it leaves its source for the host reserved for it, and the
    /// next VM starts migrating.
    pub fn complete_migration(&mut self, vm: &VmId, now_s: f64) -> Result<Migration, DrainError> {
        self.advance_clock(now_s);
        let drain = self.drain.as_mut().ok_or(DrainError::NoDrain)?;
        let migration = drain.completed(vm).ok_or_else(|| DrainError::NotMigrating(vm.clone()))?;
        self.drain_changed = true;
        let source = match self.state.complete_migration(vm) {
            Ok(source) => source,
            Err(error) => unreachable!("a drain's migration is in the state: {error}"),
        };
        let target = self.state.vm(vm).map_or(source, |v| v.host);
        self.repredictions.move_vm(vm, source.get(), target.get());
        if self.policy.is_lava() {
            let class = self.state.vm(vm).map_or(0, |v| self.policy.classes().vm_lifetime(v.prediction.as_ref()).class);
            self.lava[source.get()].on_release(&self.state.hosts()[source.get()], vm, self.clock_s);
            self.lava[target.get()].on_place(&self.state.hosts()[target.get()], class, self.clock_s);
            self.lava_changed.extend([source, target]);
        }
        for host in [source, target] {
            self.refresh_lifetime(host);
            self.host_changed(host);
        }
        self.migration_changes.push(MigrationChange::Completed { vm: vm.clone(), target: migration.target.clone() });
        self.pump_drain();
        Ok(migration)
    }

    /// Where the current (or last) drain stands.
    pub fn drain_report(&self) -> Option<DrainReport> {
        self.drain.as_ref().map(|drain| drain.report(self.drain_hosts_empty(drain)))
    }

    /// The drain as the store records it.
    pub fn drain(&self) -> Option<&Drain> {
        self.drain.as_ref()
    }

    /// Migration changes since the last call, and the drain if it changed: what the store must write.
    pub fn take_migration_changes(&mut self) -> (Vec<MigrationChange>, Option<Option<Drain>>) {
        let drain = std::mem::take(&mut self.drain_changed).then(|| self.drain.clone());
        (std::mem::take(&mut self.migration_changes), drain)
    }

    /// Puts back a migration recorded by the store (after the VMs were restored).
    pub fn restore_migration(&mut self, vm: &VmId, target: &HostId) -> Result<(), StateError> {
        let index = self.state.host_index(target).ok_or_else(|| StateError::UnknownHostId(target.clone()))?;
        self.state.reserve(vm, index, false)?;
        self.host_changed(index);
        Ok(())
    }

    /// Puts back the drain recorded by the store (after its migrations were restored).
    pub fn restore_drain(&mut self, drain: Drain) {
        self.drain = Some(drain);
    }

    fn drain_hosts_empty(&self, drain: &Drain) -> bool {
        drain.hosts.iter().filter_map(|id| self.state.host_index(id)).all(|h| self.state.hosts()[h.get()].is_empty())
    }

    fn drain_done(&self, drain: &Drain) -> bool {
        drain.queue.is_empty() && drain.in_flight.is_empty()
    }

    /// The `count` available non-empty hosts cheapest to empty: fewest VMs, then most free
    /// (weighted as best fit weighs them), then lowest index.
    fn drain_candidates(&self, count: usize) -> Vec<HostIndex> {
        let mut hosts: Vec<(usize, u64, HostIndex)> = self
            .state
            .hosts()
            .iter()
            .enumerate()
            .filter(|(_, h)| h.state == HostState::Available && !h.vms.is_empty() && h.incoming.is_empty())
            .map(|(i, h)| (h.vms.len(), u64::MAX - h.free().base(ResourceKind::Cores), HostIndex(i as u32)))
            .collect();
        hosts.sort_unstable();
        hosts.into_iter().take(count).map(|(_, _, h)| h).collect()
    }

    /// A VM's predicted remaining lifetime now (repredicted when a model is loaded).
    fn remaining_s(&mut self, id: &VmId, vm: &PlacedVm) -> f64 {
        let initial = self.policy.classes().vm_lifetime(vm.prediction.as_ref()).lifetime_s;
        self.repredictions.remaining_s(vm.host.get(), id, initial, self.clock_s - vm.placed_at_s)
    }

    /// Starts migrations while the drain has room and VMs to move. A VM no host can take goes to the
    /// back of the queue and waits for the next event.
    fn pump_drain(&mut self) {
        let mut tries = self.drain.as_ref().map_or(0, |d| d.queue.len());
        while tries > 0 && self.drain.as_ref().is_some_and(|d| d.has_room() && !d.queue.is_empty()) {
            tries -= 1;
            let Some(id) = self.drain.as_mut().and_then(|d| d.queue.pop_front()) else { break };
            self.drain_changed = true;
            let Some(vm) = self.state.vm(&id).cloned() else { continue };
            if self.state.hosts()[vm.host.get()].state == HostState::Available {
                // An operator restored the VM's host during the drain: it stays.
                continue;
            }
            let request = self.migration_request(&id, &vm);
            let Some(target) = self.select(&request, None).host else {
                if let Some(drain) = &mut self.drain {
                    drain.no_target += 1;
                    drain.queue.push_back(id);
                }
                continue;
            };
            if let Err(error) = self.state.reserve(&id, target, true) {
                unreachable!("the selected host takes the migrating VM: {error}");
            }
            self.host_changed(target);
            let target_id = self.state.hosts()[target.get()].id.clone();
            let migration = Migration {
                vm_id: id.clone(),
                source: self.state.hosts()[vm.host.get()].id.clone(),
                target: target_id.clone(),
                started_at_s: self.clock_s,
            };
            if let Some(drain) = &mut self.drain {
                drain.in_flight.push(migration);
            }
            self.migration_changes.push(MigrationChange::Started { vm: id, target: target_id });
        }
    }

    /// The VM as the placement policy sees it when it migrates: its repredicted remaining lifetime
    /// as the prediction (paper 002 H: "with the current VM state").
    fn migration_request(&mut self, id: &VmId, vm: &PlacedVm) -> VmRequest {
        let mut request = VmRequest::new(id.as_str(), vm.tenant.as_str(), &vm.vm_type, vm.demand);
        request.prediction = vm.prediction.clone().map(|mut prediction| {
            if !prediction.source.is_fallback() {
                prediction.expected_lifetime_s = Some(self.remaining_s(id, vm));
                prediction.interval_class = None;
            }
            prediction
        });
        request
    }

    fn host_changed(&mut self, host: HostIndex) {
        if let Some(index) = &mut self.index {
            index.host_changed(host);
        }
    }

    /// Recomputes a host's lifetime summary from its VMs after a VM arrived or left, and schedules
    /// its next event. For policies that read exit times, each VM's last predicted exit is reused
    /// (a VM new to the host is predicted now): repredicting every VM of the host is the periodic
    /// refresh's job ([`Allocator::repredict_host`]).
    fn refresh_lifetime(&mut self, host: HostIndex) {
        self.update_lifetime(host, false);
    }

    /// Repredicts the remaining lifetime of every VM on the host and recomputes its summary.
    fn repredict_host(&mut self, host: HostIndex) {
        self.update_lifetime(host, true);
    }

    fn update_lifetime(&mut self, host: HostIndex, repredict: bool) {
        let now = self.clock_s;
        let reads_exits = self.policy.reads_exit_times();
        let mode = match (reads_exits, repredict) {
            (false, _) => ExitTimes::Initial,
            (true, false) => ExitTimes::Reuse,
            (true, true) => ExitTimes::Repredict,
        };
        let exit_s = self.repredictions.host_exit_s(host.get(), now, mode);
        let classes = self.policy.classes();
        let record = &self.state.hosts()[host.get()];
        let mut summary = HostLifetime::at(classes, exit_s, now);
        if reads_exits {
            // These policies read exit times, not the class (whose drops would only cost events).
            summary.next_change_s = f64::INFINITY;
            let next = &mut self.next_refresh[host.get()];
            *next = match self.refresh_interval_s {
                Some(_) if record.is_empty() => f64::INFINITY,
                Some(interval) if repredict || *next == f64::INFINITY => now + interval,
                Some(_) => *next,
                None => f64::INFINITY,
            };
        }
        summary.lava = self.lava[host.get()].summary();
        self.lifetimes[host.get()] = summary;
        self.schedule(host);
    }

    /// Puts the host's next event (class drop, exit refresh, LAVA deadline) in the heap.
    fn schedule(&mut self, host: HostIndex) {
        let lava_deadline = self.lava[host.get()].deadline_s.unwrap_or(f64::INFINITY);
        let due = self.lifetimes[host.get()].next_change_s.min(self.next_refresh[host.get()]).min(lava_deadline);
        if due.is_finite() && due != self.next_due[host.get()] {
            self.due.push(Reverse((OrderedTime(due), host)));
        }
        self.next_due[host.get()] = due;
    }

    /// Moves the clock to `now_s` and applies the host events that fell due: lifetime classes
    /// dropping, exit times refreshed, LAVA deadlines (every other call does this itself; the
    /// simulator calls it to move time between events).
    pub fn advance_clock(&mut self, now_s: f64) {
        if now_s.is_finite() && now_s > self.clock_s {
            self.clock_s = now_s;
        }
        while let Some(Reverse((OrderedTime(at), host))) = self.due.peek().copied() {
            if at > self.clock_s {
                break;
            }
            self.due.pop();
            // Stale when the host changed after this event was scheduled.
            if self.next_due[host.get()] != at {
                continue;
            }
            self.next_due[host.get()] = f64::INFINITY;
            let before = self.lifetimes[host.get()];
            if self.lava[host.get()].on_deadline(&self.state.hosts()[host.get()], at) {
                self.lava_changed.insert(host);
            }
            if self.next_refresh[host.get()] <= at {
                self.repredict_host(host);
            } else {
                self.refresh_lifetime(host);
            }
            if self.lifetimes[host.get()] != before && self.policy.reads_host_lifetime() {
                self.host_changed(host);
            }
        }
    }
}

/// What repredictions can know of a VM restored from the store: its identity, shape and placement
/// time (the store does not keep the request's other features).
fn stored_features(
    tenant: &domain::TenantId,
    vm_type: &str,
    demand: &domain::Resources,
    placed_at_s: f64,
) -> RequestFeatures {
    RequestFeatures {
        tenant_id: tenant.to_string(),
        vm_type: vm_type.to_owned(),
        cores: demand.whole(ResourceKind::Cores),
        memory_gib: demand.whole(ResourceKind::MemoryGib),
        time_s: placed_at_s,
        ..RequestFeatures::default()
    }
}

/// What the rules see of `vm` at `now_s`; its exit is read as at least `exit_floor_s` from now.
fn rule_request<'a>(
    state: &'a InventoryState,
    vm: &'a VmRequest,
    lifetime: VmLifetime,
    now_s: f64,
    exit_floor_s: f64,
) -> RuleRequest<'a> {
    static NO_VMS: std::sync::LazyLock<HashMap<RackIndex, u32>> = std::sync::LazyLock::new(HashMap::new);
    RuleRequest {
        demand: vm.demand,
        lifetime_class: lifetime.class,
        vm_type: &vm.vm_type,
        exit_s: now_s + lifetime.lifetime_s.max(exit_floor_s),
        spread: vm.max_per_rack.map(|max_per_rack| TenantSpread {
            max_per_rack,
            vms_per_rack: state.tenant_racks(&vm.tenant_id).unwrap_or(&NO_VMS),
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
            vm.demand
        ),
        _ => format!("no host can take VM `{}` ({}): {blame}", vm.vm_id, vm.demand),
    };
    Rejection { code, detail, vm_id: Some(vm.vm_id.clone()), eliminated_by }
}
