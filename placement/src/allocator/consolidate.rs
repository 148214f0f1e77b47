//! Consolidation on the allocator ([`crate::consolidation`]): rounds that choose hosts to empty
//! under the budget, take them out of scheduling and migrate their VMs onto other non-empty hosts
//! chosen by the placement policy; an emptied host returns to service at once. Migrations share the
//! drains' mechanics (a reservation on the target, completed by the caller), and every host state
//! change and migration goes to the journal.

use super::Allocator;
use crate::consolidation::score::{self, WasteRule};
use crate::consolidation::{
    ChooserKind, Consolidation, ConsolidationConfig, ConsolidationConfigError, ConsolidationReport, EmptyingHost,
    PlannedHost, RecentMove,
};
use crate::defrag::Migration;
use crate::journal::Change;
use crate::reprediction::Repredictor;
use crate::state::HostIndex;
use domain::{HostState, ResourceKind, VmId};
use std::sync::Arc;

/// Why a consolidation call was refused; nothing changed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ConsolidationError {
    #[error("consolidation is off: configure [consolidation] (or PUT it) first")]
    Off,
    #[error(transparent)]
    Config(#[from] ConsolidationConfigError),
    #[error(
        "chooser `oracle` reads true remaining lifetimes, which only the simulator knows: use `lifetime` (the model) \
         or a model-free chooser"
    )]
    NoOracle,
    #[error("consolidation migrations are in flight: pause it and let them complete before turning it off")]
    Busy,
}

impl Allocator {
    /// Turns consolidation on (or changes its settings, keeping what is in progress), or off
    /// (`None`: the hosts being emptied return to service; refused while migrations are in flight).
    pub fn set_consolidation(
        &mut self,
        config: Option<ConsolidationConfig>,
        now_s: f64,
    ) -> Result<(), ConsolidationError> {
        self.advance_clock(now_s);
        let Some(config) = config else {
            if self.consolidation.as_ref().is_some_and(|c| !c.in_flight.is_empty()) {
                return Err(ConsolidationError::Busy);
            }
            self.recent_exits = Default::default();
            if let Some(mut consolidation) = self.consolidation.take() {
                for host in std::mem::take(&mut consolidation.hosts) {
                    self.give_back(&host.host);
                }
                self.consolidation_changed = true;
            }
            return Ok(());
        };
        config.check()?;
        if config.chooser == ChooserKind::Oracle && self.consolidation_lifetimes.is_none() {
            return Err(ConsolidationError::NoOracle);
        }
        let (clock, hosts) = (self.clock_s, self.state.hosts().len());
        match &mut self.consolidation {
            // What the budget earned so far, it earned at the old rate; the bucket is one day
            // deep at the new one (a lowered budget does not spend what the old one saved).
            Some(existing) => {
                existing.accrue(clock, hosts);
                existing.budget = existing.budget.min(config.depth(hosts));
                existing.config = config;
            }
            None => self.consolidation = Some(Consolidation::new(config, clock)),
        }
        self.consolidation_changed = true;
        Ok(())
    }

    /// Puts back the consolidation recorded by the store (after its migrations were restored).
    pub fn restore_consolidation(&mut self, consolidation: Consolidation) {
        self.consolidation = Some(consolidation);
    }

    /// The true remaining lifetimes the `oracle` chooser reads (the simulator's).
    pub fn set_consolidation_lifetimes(&mut self, lifetimes: Arc<dyn Repredictor>) {
        self.consolidation_lifetimes = Some(lifetimes);
    }

    pub fn consolidation(&self) -> Option<&Consolidation> {
        self.consolidation.as_ref()
    }

    pub fn consolidation_report(&self) -> Option<ConsolidationReport> {
        self.consolidation.as_ref().map(|c| c.report(self.state.hosts().len()))
    }

    /// Pauses (no new hosts, no new migrations; those in flight complete) or resumes it.
    pub fn pause_consolidation(&mut self, paused: bool) -> Result<(), ConsolidationError> {
        let consolidation = self.consolidation.as_mut().ok_or(ConsolidationError::Off)?;
        consolidation.paused = paused;
        self.consolidation_changed = true;
        if !paused {
            self.pump_consolidation();
        }
        Ok(())
    }

    /// When the next round is due (none while off).
    pub fn consolidation_due_s(&self) -> Option<f64> {
        self.consolidation.as_ref().map(|c| c.next_round_s)
    }

    /// The hosts a round would empty now, as the chooser sees them, whether or not it is paused or
    /// its trigger holds; changes nothing.
    pub fn consolidation_plan(&mut self, now_s: f64) -> Result<Vec<PlannedHost>, ConsolidationError> {
        self.advance_clock(now_s);
        let consolidation = self.consolidation.as_ref().ok_or(ConsolidationError::Off)?;
        let mut budget = consolidation.clone();
        budget.accrue(self.clock_s, self.state.hosts().len());
        let config = budget.config.clone();
        Ok(self.choose_hosts(&config, budget.room(self.state.hosts().len())))
    }

    /// A consolidation round: accrues the budget, and unless paused or the trigger does not hold,
    /// chooses hosts, takes them out of scheduling and starts their migrations. Returns the hosts
    /// it started; the next round is due `every_s` later.
    pub fn consolidate(&mut self, now_s: f64) -> Result<Vec<PlannedHost>, ConsolidationError> {
        self.advance_clock(now_s);
        let hosts = self.state.hosts().len();
        let clock = self.clock_s;
        let consolidation = self.consolidation.as_mut().ok_or(ConsolidationError::Off)?;
        consolidation.accrue(clock, hosts);
        consolidation.counters.rounds += 1;
        self.consolidation_changed = true;
        consolidation.next_round_s = clock + consolidation.config.every_s;
        let trigger_holds =
            consolidation.config.empty_below_pct.is_none_or(|below| self.state.occupancy().empty_hosts_pct < below);
        let every_s = consolidation.config.every_s;
        let stuck: Vec<domain::HostId> = consolidation
            .hosts
            .iter()
            .filter(|h| h.stuck_since_s.is_some_and(|since| clock - since >= every_s))
            .map(|h| h.host.clone())
            .collect();
        for host in &stuck {
            self.abandon(host);
        }
        let consolidation = self.consolidation.as_ref().ok_or(ConsolidationError::Off)?;
        let chooses = !consolidation.paused && trigger_holds;
        let (config, room) = (consolidation.config.clone(), consolidation.room(hosts));
        let plan = if chooses { self.choose_hosts(&config, room) } else { Vec::new() };
        if let Some(consolidation) = self.consolidation.as_mut() {
            consolidation.counters.rounds_choosing += u64::from(!plan.is_empty());
            consolidation.counters.hosts_started += plan.len() as u64;
        }
        for planned in &plan {
            let Some(index) = self.state.host_index(&planned.host) else { continue };
            let previous = self.state.hosts()[index.get()].state;
            if let Err(error) = self.state.set_host_state(index, HostState::Unavailable) {
                unreachable!("a planned host exists: {error}");
            }
            self.host_changed(index);
            self.journal.push(Change::HostState {
                host: planned.host.clone(),
                state: HostState::Unavailable,
                previous,
            });
            if let Some(consolidation) = self.consolidation.as_mut() {
                consolidation.hosts.push(EmptyingHost {
                    host: planned.host.clone(),
                    started_at_s: clock,
                    queue: planned.moves.iter().cloned().collect(),
                    expected_migrations: planned.expected_migrations,
                    expected_wasted: planned.expected_wasted,
                    moved: 0,
                    stuck_since_s: None,
                });
            }
        }
        self.pump_consolidation();
        Ok(plan)
    }

    /// The hosts the chooser picks with `room` migrations left in the budget, best first: every
    /// chooser ranks by its model-free key ([`score`]); the lifetime-aware ones skip the hosts whose
    /// moves would likely be wasted, reading at most `candidates` hosts.
    fn choose_hosts(&mut self, config: &ConsolidationConfig, mut room: f64) -> Vec<PlannedHost> {
        if room < 1.0 {
            return Vec::new();
        }
        let afford = room.floor() as usize;
        // Hosts that could be emptied: in service, holding VMs, none arriving or leaving.
        let mut ranked: Vec<(f64, HostIndex)> = self
            .state
            .hosts()
            .iter()
            .enumerate()
            .filter(|(_, h)| {
                h.state == HostState::Available
                    && !h.vms.is_empty()
                    && h.vms.len() <= afford
                    && h.incoming.is_empty()
                    && !h.vms.iter().any(|vm| self.state.migration_target(&vm.id).is_some())
            })
            .map(|(i, h)| {
                let share = used_share(h);
                let rank = match config.chooser {
                    ChooserKind::LeastUsed => score::least_used(h.vms.len(), share),
                    _ => score::fewest_vms(h.vms.len(), share),
                };
                (rank, HostIndex(i as u32))
            })
            .collect();
        // Best first; equal ranks in inventory order.
        ranked.sort_unstable_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
        let rule = WasteRule::new(config, self.state.hosts().len());
        let mut plan: Vec<PlannedHost> = Vec::new();
        let mut read = 0;
        for (rank, host) in ranked {
            if room < 1.0 || (config.chooser.reads_lifetimes() && read >= config.candidates) {
                break;
            }
            let record = &self.state.hosts()[host.get()];
            let cost = record.vms.len() as f64;
            if cost > room {
                continue;
            }
            let planned = if config.chooser.reads_lifetimes() {
                read += 1;
                match self.lifetime_view(config.chooser, host, &rule, rank) {
                    Some(planned) => planned,
                    None => continue,
                }
            } else {
                PlannedHost {
                    host: record.id.clone(),
                    moves: record.vms.iter().map(|vm| vm.id.clone()).collect(),
                    expected_migrations: cost,
                    expected_wasted: 0.0,
                    score: rank,
                }
            };
            if self.moves_have_targets(&planned, &plan) {
                room -= cost;
                plan.push(planned);
            }
        }
        plan
    }

    /// A lifetime-aware chooser's view of `host`: its VMs longest-expected-first and the risk of
    /// wasting their moves; none if the rule leaves it alone.
    fn lifetime_view(
        &mut self,
        chooser: ChooserKind,
        host: HostIndex,
        rule: &WasteRule,
        rank: f64,
    ) -> Option<PlannedHost> {
        let Allocator { state, repredictions, policy, consolidation_lifetimes, recent_exits, clock_s, .. } = self;
        let record = &state.hosts()[host.get()];
        let truth = consolidation_lifetimes.as_ref().filter(|_| chooser == ChooserKind::Oracle);
        let mut vms: Vec<VmView> = Vec::with_capacity(record.vms.len());
        for vm in &record.vms {
            let id = &vm.id;
            let age_s = *clock_s - vm.placed_at_s;
            let leaving = chooser.reads_batches() && recent_exits.vm_leaving(vm, *clock_s);
            let initial_s = policy.classes().vm_lifetime(vm.prediction.as_ref()).lifetime_s;
            let row = truth.map(|t| t.encode(id, &vm.features())).unwrap_or_default();
            let remaining_s = match (chooser, truth) {
                (ChooserKind::Oracle, Some(t)) => t.remaining_s(&row, age_s),
                _ if leaving => 0.0,
                (ChooserKind::Lifetime, _) => {
                    repredictions.remaining_s(host.get(), id, initial_s, age_s).min(age_s + score::AGE_SCALE_S)
                }
                _ => age_s + score::AGE_SCALE_S,
            };
            vms.push(VmView { id, age_s, initial_s, row, remaining_s, leaving });
        }
        // LARS: longest expected stay first (equal ones in the host's order).
        vms.sort_by(|a, b| b.remaining_s.total_cmp(&a.remaining_s));
        let mut alive = Vec::with_capacity(vms.len());
        for (j, vm) in vms.iter().enumerate() {
            let times = rule.times(j);
            let mut out = [0.0; 2];
            match (chooser, truth) {
                (ChooserKind::Oracle, Some(t)) => t.survival(&vm.row, vm.age_s, &times, &mut out),
                (ChooserKind::Lifetime, _) => {
                    repredictions.survival(host.get(), vm.id, vm.initial_s, vm.age_s, &times, &mut out);
                    // The shorter of the model's and the age's: see `score`.
                    let mut prior = [0.0; 2];
                    score::age_survival(vm.age_s, &times, &mut prior);
                    out[0] = out[0].min(prior[0]);
                    out[1] = out[1].min(prior[1]);
                }
                _ => score::age_survival(vm.age_s, &times, &mut out),
            }
            if vm.leaving {
                // Likely gone within the hour after its move: see `batches`.
                out[1] = 0.0;
            }
            alive.push(out);
        }
        let risk = rule.risk(alive);
        rule.allows(&risk).then(|| PlannedHost {
            host: record.id.clone(),
            moves: vms.iter().map(|v| v.id.clone()).collect(),
            expected_migrations: risk.expected_migrations,
            expected_wasted: risk.expected_wasted,
            score: rank,
        })
    }

    /// Whether each VM `host` would move finds a non-empty host to go to now, other than the hosts
    /// already planned (a dry run of the policy, one VM at a time, with `host` and the planned
    /// hosts out of service as the round will have them: VMs of one host competing for the same
    /// room are not seen, and a VM that finds none when its turn comes gives its host back).
    /// Without it, a zone whose non-empty hosts are full would start hosts it cannot empty.
    fn moves_have_targets(&mut self, host: &PlannedHost, plan: &[PlannedHost]) -> bool {
        let out: Vec<HostIndex> = std::iter::once(&host.host)
            .chain(plan.iter().map(|p| &p.host))
            .filter_map(|h| self.state.host_index(h))
            .filter(|h| self.state.hosts()[h.get()].state == HostState::Available)
            .collect();
        self.set_hosts_state(&out, HostState::Unavailable);
        let found = host.moves.iter().all(|id| {
            let Some(vm) = self.state.vm(id).cloned() else { return true };
            let request = self.migration_request(id, &vm);
            let dry = Some(self.chooser.clone());
            self.select(&request, dry).host.is_some_and(|target| {
                target != vm.host && !self.state.hosts()[target.get()].is_empty() && !out.contains(&target)
            })
        });
        self.set_hosts_state(&out, HostState::Available);
        found
    }

    /// Sets the hosts' state for a dry run (not journaled: no one sees it).
    fn set_hosts_state(&mut self, hosts: &[HostIndex], state: HostState) {
        for &index in hosts {
            if let Err(error) = self.state.set_host_state(index, state) {
                unreachable!("an indexed host exists: {error}");
            }
            self.host_changed(index);
        }
    }

    /// Starts migrations while there is room and VMs to move, hosts in the order they started,
    /// then settles the hosts. A VM that no non-empty host can take (moving it to an empty host
    /// would gain nothing) stays at the head of its host's queue, and the next host is tried; a
    /// round later its host goes back to service.
    pub(super) fn pump_consolidation(&mut self) {
        let mut next_host = 0;
        loop {
            let (clock, hosts) = (self.clock_s, self.state.hosts().len());
            let Some(consolidation) = self.consolidation.as_mut() else { return };
            if consolidation.paused || !consolidation.has_room(hosts) {
                break;
            }
            self.consolidation_changed = true;
            let Some(offset) = consolidation.hosts[next_host.min(consolidation.hosts.len())..]
                .iter()
                .position(|h| !h.queue.is_empty())
            else {
                break;
            };
            let at = next_host + offset;
            // A chooser that reads batches lets a VM whose batch is leaving leave by itself first.
            let waits = |id: &VmId| {
                consolidation.config.chooser.reads_batches()
                    && self.state.vm(id).is_some_and(|vm| self.recent_exits.vm_leaving(vm, clock))
            };
            let Some(first) = consolidation.hosts[at].queue.iter().position(|id| !waits(id)) else {
                next_host = at + 1;
                continue;
            };
            if first > 0 {
                consolidation.hosts[at].queue.rotate_left(first);
            }
            let Some(id) = consolidation.hosts[at].queue.front().cloned() else { break };
            let source = consolidation.hosts[at].host.clone();
            let Some(vm) = self.state.vm(&id).cloned() else {
                consolidation.hosts[at].queue.pop_front();
                continue;
            };
            if self.state.migration_target(&id).is_some() {
                consolidation.hosts[at].queue.pop_front();
                continue;
            }
            let request = self.migration_request(&id, &vm);
            let target = self.select(&request, None).host.filter(|t| !self.state.hosts()[t.get()].is_empty());
            let Some(consolidation) = self.consolidation.as_mut() else { return };
            let Some(target) = target else {
                let host = &mut consolidation.hosts[at];
                host.stuck_since_s.get_or_insert(clock);
                consolidation.counters.no_target += 1;
                next_host = at + 1;
                continue;
            };
            let host = &mut consolidation.hosts[at];
            host.queue.pop_front();
            host.stuck_since_s = None;
            if let Err(error) = self.state.reserve(&id, target, true) {
                unreachable!("the selected host takes the migrating VM: {error}");
            }
            self.host_changed(target);
            let target_id = self.state.hosts()[target.get()].id.clone();
            if let Some(consolidation) = self.consolidation.as_mut() {
                consolidation.in_flight.push(Migration {
                    vm_id: id.clone(),
                    source,
                    target: target_id.clone(),
                    started_at_s: self.clock_s,
                });
                consolidation.budget -= 1.0;
                consolidation.counters.migrations_started += 1;
            }
            self.journal.push(Change::MigrationStarted { vm: id, target: target_id });
        }
        self.settle_consolidation();
    }

    /// Hosts that are empty now return to service; hosts an operator took over leave the plan.
    pub(super) fn settle_consolidation(&mut self) {
        let Some(consolidation) = self.consolidation.as_ref() else { return };
        let mut emptied = Vec::new();
        let mut dropped = Vec::new();
        for host in &consolidation.hosts {
            let Some(index) = self.state.host_index(&host.host) else { continue };
            let record = &self.state.hosts()[index.get()];
            if record.state != HostState::Unavailable {
                dropped.push(host.host.clone());
            } else if record.is_empty() {
                emptied.push(host.host.clone());
            }
        }
        if emptied.is_empty() && dropped.is_empty() {
            return;
        }
        self.consolidation_changed = true;
        for host in &emptied {
            self.give_back(host);
        }
        if let Some(consolidation) = self.consolidation.as_mut() {
            consolidation.counters.hosts_emptied += emptied.len() as u64;
            consolidation.counters.hosts_abandoned += dropped.len() as u64;
            consolidation.hosts.retain(|h| !emptied.contains(&h.host) && !dropped.contains(&h.host));
        }
    }

    /// Gives a host being emptied back to service before it emptied.
    fn abandon(&mut self, host: &domain::HostId) {
        if let Some(consolidation) = self.consolidation.as_mut() {
            consolidation.hosts.retain(|h| &h.host != host);
            consolidation.counters.hosts_abandoned += 1;
            self.consolidation_changed = true;
        }
        self.give_back(host);
    }

    /// The host is available again (journaled).
    fn give_back(&mut self, host: &domain::HostId) {
        let Some(index) = self.state.host_index(host) else { return };
        let previous = self.state.hosts()[index.get()].state;
        if previous != HostState::Unavailable {
            return;
        }
        if let Err(error) = self.state.set_host_state(index, HostState::Available) {
            unreachable!("an indexed host exists: {error}");
        }
        self.host_changed(index);
        self.journal.push(Change::HostState { host: host.clone(), state: HostState::Available, previous });
    }

    /// The consolidation migration of `vm` completed (counted; the caller moves the VM).
    pub(super) fn consolidation_completed(&mut self, vm: &VmId) -> Option<Migration> {
        let clock = self.clock_s;
        let memory = self.state.vm(vm).map_or(0.0, |v| v.facts.demand.memory_gib());
        let consolidation = self.consolidation.as_mut()?;
        let at = consolidation.in_flight.iter().position(|m| &m.vm_id == vm)?;
        let migration = consolidation.in_flight.remove(at);
        self.consolidation_changed = true;
        consolidation.counters.migrations_completed += 1;
        consolidation.counters.moved_gib += memory;
        consolidation.forget_old_moves(clock);
        consolidation.recent_moves.push_back(RecentMove { vm: vm.clone(), at_s: clock });
        if let Some(host) = consolidation.hosts.iter_mut().find(|h| h.host == migration.source) {
            host.moved += 1;
        }
        Some(migration)
    }

    /// The consolidation migration of `vm` failed: counted, and its source goes back to service
    /// (the caller gives the reservation back).
    pub(super) fn consolidation_failed(&mut self, vm: &VmId) -> Option<Migration> {
        let consolidation = self.consolidation.as_mut()?;
        let at = consolidation.in_flight.iter().position(|m| &m.vm_id == vm)?;
        let migration = consolidation.in_flight.remove(at);
        consolidation.counters.migrations_failed += 1;
        self.consolidation_changed = true;
        self.abandon(&migration.source);
        Some(migration)
    }

    /// A VM left: the consolidation's record follows, and its host may be empty now.
    pub(super) fn consolidation_vm_left(&mut self, vm: &VmId) {
        let clock = self.clock_s;
        if let Some(consolidation) = self.consolidation.as_mut() {
            // Only a VM the consolidation knew can free a slot or empty one of its hosts.
            if consolidation.vm_exited(vm, clock) {
                self.consolidation_changed = true;
                self.pump_consolidation();
            }
        }
    }
}

/// A VM as a lifetime-aware chooser reads it.
struct VmView<'a> {
    id: &'a VmId,
    age_s: f64,
    /// Its lifetime as placed (the policy's reading of its prediction).
    initial_s: f64,
    /// The oracle's row (the oracle chooser only).
    row: Vec<f64>,
    /// Its expected remaining lifetime: LARS moves the longest first.
    remaining_s: f64,
    /// One of its batch left within the hour (the `lifetime` chooser only).
    leaving: bool,
}

/// The larger of a host's CPU and memory shares in use.
fn used_share(record: &crate::state::HostRecord) -> f64 {
    let share = |kind: ResourceKind| {
        let capacity = record.capacity.base(kind);
        if capacity == 0 {
            0.0
        } else {
            record.used.base(kind) as f64 / capacity as f64
        }
    };
    share(ResourceKind::Cores).max(share(ResourceKind::MemoryGib))
}
