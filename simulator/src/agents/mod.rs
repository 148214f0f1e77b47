//! Several allocation agents of one zone on one shared store (issue 17), simulated: how often their
//! commits conflict, and how much packing density a zone loses to their stale views, for more
//! agents than one machine can run.
//!
//! The model follows the real agents (`allocator/src/durable.rs` over `store/postgres.rs`):
//!
//! - **Agents.** `N` [`Allocator`]s with the same configuration (the very policy code of the
//!   allocator service); each has its own tie-breaking seed (agent 0 the run's own seed). Every
//!   arrival goes to one agent: in turn (round robin over arrivals, as the control service spreads
//!   requests) or drawn with the run's seed. A VM's exit is committed by the agent that placed it.
//! - **The store** ([`Store`]): the zone's truth, an [`InventoryState`] with the policy-state rows,
//!   and a change log in commit order. A batch is refused whole when one of its placements would
//!   over-commit a host in any dimension or places a VM id twice, as PostgreSQL's `CHECK` and
//!   primary key refuse it; nothing else is refused (releases, host states and policy-state rows:
//!   last writer wins).
//! - **Lagging views.** Before every batch an agent follows the other agents' committed changes
//!   ([`Allocator::follow`]) up to its view's horizon, then decides locally, takes the allocator's
//!   journal as [`LoggedChange`]s and commits them. Its own commits it sees at once. The horizon is
//!   [`Lag`]: the store's last `d` commits are not in the view yet (`Lag::Commits`; `n-1` = every
//!   other agent commits once while one decides, the saturated zone), or the commits of the last
//!   `s` seconds of trace time (`Lag::Seconds`).
//! - **Conflicts.** A refused batch is a conflict. The agent takes its decision back (the
//!   placement is released in its view without policy hooks, the policy state of the hosts it
//!   touched is read back from the store) and decides the VM again ([`RetryMode`]): at once, on a
//!   view brought up to date (`Immediate`, the default: the real agent reads the store afresh
//!   after a refusal; nothing commits in between in a replay, so that attempt succeeds), or once
//!   one lag has passed (`AfterLag`: `d` more commits or `s` seconds), on the lagging view that
//!   then holds the refusal's cause, so that the commits of the other agents' decisions in flight
//!   meanwhile can refuse it again: cascades. After `max_attempts` refused attempts (5, as the
//!   allocator) the agent answers 503 (`failed`), and the request goes to the next agent (the
//!   control service's failover on a 5xx, or the client's retry; [`OnFailure::Resubmit`]), so
//!   that every VM runs in the end and packing stays comparable with one agent; or it is dropped
//!   ([`OnFailure::Drop`]). A VM placed later than its arrival runs its whole lifetime from its
//!   placement.
//! - **Conflict avoidance** ([`Avoidance`], on by default as in the service): with other agents,
//!   an agent takes the best of its own share of the hosts among the top ones; or (`share` off,
//!   Protean's scheme) it draws among the top hosts at random with a probability that follows its
//!   recent refused share. Always when it decides a refused VM again.
//! - **Contradictions.** A view that cannot apply a followed change (its own later commits came
//!   first, and the other agent's placement no longer fits beside them) is rebuilt from the store.
//!   Counted as `follow_rebuilds`. (The real agent avoids them: a batch committed after others it
//!   had not seen is taken back and applied again in the store's order.)
//!
//! Packing density and empty hosts are the store's, integrated exactly over time as
//! [`crate::engine::run`] does ([`MetricsRecorder`] after every event). With one agent the run is
//! [`crate::engine::run`]'s, placement for placement (test
//! `one_agent_places_exactly_as_the_single_allocator_run`). Drains (LARS) are not simulated here.

use crate::clock::Time;
use crate::engine::{SimConfig, SimError, VmPlacement, WorkloadSummary};
use crate::metrics::{self, MetricsRecorder, MetricsSummary};
use crate::predict;
use crate::workload::Workload;
use domain::{AllocationOutcome, AllocationRequest, HostId, HostState, InventorySpec, LifetimePrediction};
use placement::journal::LoggedChange;
use placement::reprediction::Repredictor;
use placement::{
    Allocator, AllocatorConfig, Change, ConflictAvoidance, HostShare, InventoryState, NewVm, PlacedVm, Registry,
};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::fmt;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Instant;

mod agent;
mod config;
mod store;
pub mod sweep;

pub use agent::*;
pub use config::*;
pub use store::*;

fn invalid(field: &'static str, message: impl Into<String>) -> SimError {
    SimError::Invalid { field, message: message.into() }
}

/// What the agents and the store did.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct AgentCounters {
    pub arrivals: u64,
    /// VMs placed (at their first attempt or a later one).
    pub placed: u64,
    /// VMs placed only after a conflict.
    pub placed_after_conflict: u64,
    /// VMs no host could take in the deciding agent's view.
    pub rejected: u64,
    /// Answers 503: a VM's `max_attempts` attempts at one agent all refused.
    pub failed: u64,
    /// VMs never placed because an agent answered 503 ([`OnFailure::Drop`]).
    pub dropped: u64,
    pub exits: u64,
    /// Batches the store committed (placements, releases, policy states alone).
    pub commits: u64,
    /// Commit attempts that carried a placement.
    pub placement_attempts: u64,
    /// Of those, refused by the store.
    pub conflicts: u64,
    /// Decisions made again after a conflict (by the same agent, or by the next after a 503).
    pub retries: u64,
    /// Changes of other agents the agents followed.
    pub followed_changes: u64,
    /// Views rebuilt from the store because they could not apply a followed change.
    pub follow_rebuilds: u64,
    /// VMs running at the end of the window.
    pub vms_at_end: u64,
    /// Trace seconds between a VM's arrival and its placement, summed over the VMs placed (> 0
    /// only for VMs decided again after a conflict), and the longest.
    pub delay_s_sum: f64,
    pub delay_s_max: f64,
    /// Agents whose view, brought up to date at the end, does not hold exactly the store's VMs on
    /// the same hosts (a self-check: always 0).
    pub views_out_of_step: u64,
}

impl AgentCounters {
    /// Conflicts per commit attempt that carried a placement, percent.
    pub fn conflict_rate_pct(&self) -> f64 {
        if self.placement_attempts == 0 {
            0.0
        } else {
            100.0 * self.conflicts as f64 / self.placement_attempts as f64
        }
    }
}

/// One run's outcome, with what reproduces it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AgentsResult {
    pub config: SimConfig,
    pub agents: AgentsConfig,
    pub workload: WorkloadSummary,
    pub counters: AgentCounters,
    /// The store's packing density, empty hosts, ... (exact time averages; no stranding).
    pub metrics: MetricsSummary,
    /// Wall-clock seconds of the event loop.
    pub wall_s: f64,
    /// Of which rebuilding views from the store.
    pub rebuild_wall_s: f64,
    /// Of which following other agents' changes (rebuilds included).
    pub follow_wall_s: f64,
    pub events: u64,
    /// Every VM's host in workload order, when `record_placements` is set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub placements: Option<Vec<VmPlacement>>,
}

/// Kinds of events in the order they run at equal times (as in [`crate::engine`]).
#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    Exit,
    Retry,
    Arrival,
    Sample,
}

/// A VM to decide again after a conflict.
#[derive(Clone, Copy, Debug)]
struct Retry {
    /// Trace time (lag in seconds) or store head (lag in commits) from which it is decided again.
    ready: f64,
    vm: u32,
    agent: u32,
    attempt: u32,
    /// Decided on a view brought up to date ([`RetryMode::Immediate`]).
    fresh: bool,
}

/// How often the progress callback is called, in events.
const PROGRESS_EVERY: u64 = 1024;
/// How often the log's read prefix is dropped, in events.
const TRIM_EVERY: u64 = 256;
const NO_AGENT: u32 = u32::MAX;

/// The state of one run.
struct Run<'a> {
    workload: &'a Workload,
    spec: InventorySpec,
    per_vm: Vec<Option<LifetimePrediction>>,
    agents: Vec<Agent>,
    store: Store,
    lag: Lag,
    max_attempts: u32,
    avoidance: Option<Avoidance>,
    on_failure: OnFailure,
    /// At the end of the window, with no event left: every view is up to date (time passes).
    fresh: bool,
    retry: RetryMode,
    /// The decision being made reads an up-to-date view (an immediate retry).
    fresh_decision: bool,
    /// The agent that placed each VM.
    owner: Vec<u32>,
    exits: BinaryHeap<Reverse<(Time, u32)>>,
    retries: VecDeque<Retry>,
    counters: AgentCounters,
    hosts: Option<Vec<Option<String>>>,
    follow_s: f64,
}

impl Run<'_> {
    /// Whether batch `seq` of the log is in the view of an agent deciding at `now_s`.
    fn visible(&self, now_s: f64) -> impl Fn(u64, &Batch) -> bool {
        let head = self.store.head();
        let lag = if self.fresh || self.fresh_decision { Lag::Commits(0) } else { self.lag };
        move |seq, batch| match lag {
            Lag::Commits(d) => seq < head.saturating_sub(d),
            Lag::Seconds(s) => batch.time_s <= now_s - s,
            Lag::Saturated => true,
        }
    }

    fn catch_up(&mut self, agent: usize, now_s: f64) -> Result<(), SimError> {
        let started = Instant::now();
        let visible = self.visible(now_s);
        let (followed, rebuilt) = self.agents[agent].catch_up(agent, &self.store, &self.spec, now_s, visible)?;
        self.counters.followed_changes += followed;
        self.counters.follow_rebuilds += u64::from(rebuilt);
        self.follow_s += started.elapsed().as_secs_f64();
        Ok(())
    }

    /// Commits what the agent's allocator journaled; `Ok(Err)`: refused (the changes are returned).
    fn commit(&mut self, agent: usize, now_s: f64) -> Result<Committed, SimError> {
        let head = self.store.head();
        let outcome = self.agents[agent].commit(agent, &mut self.store, now_s)?;
        self.counters.commits += self.store.head() - head;
        Ok(outcome)
    }

    /// One attempt at placing VM `index` by `agent` (`retried`: after a conflict).
    fn decide(&mut self, index: usize, agent: usize, attempt: u32, retried: bool, now_s: f64) -> Result<(), SimError> {
        self.catch_up(agent, now_s)?;
        let workload = self.workload;
        let vm = &workload.vms[index];
        let mut request = vm.request.clone();
        request.prediction = self.per_vm[index].clone();
        self.agents[agent].avoid_conflicts(self.avoidance, attempt > 1);
        let decision = self.agents[agent].allocator.allocate(&AllocationRequest::Vm(request), now_s)?;
        let host = match decision.outcome {
            AllocationOutcome::Placed { mut placements } => placements.pop().map(|p| p.host_id.0),
            AllocationOutcome::Rejected { .. } => None,
        };
        if host.is_some() {
            self.counters.placement_attempts += 1;
        }
        match self.commit(agent, now_s)? {
            Ok(_) => match host {
                Some(host) => {
                    self.counters.placed += 1;
                    if retried {
                        let delay = (now_s - vm.arrival_s).max(0.0);
                        self.counters.placed_after_conflict += 1;
                        self.counters.delay_s_sum += delay;
                        self.counters.delay_s_max = self.counters.delay_s_max.max(delay);
                    }
                    self.owner[index] = agent as u32;
                    if let Some(end) = vm.end_s {
                        // A VM placed late (after conflicts) runs its whole lifetime from then on.
                        let exit = end + (now_s - vm.arrival_s).max(0.0);
                        self.exits.push(Reverse((Time(exit.max(now_s)), index as u32)));
                    }
                    self.record(index, Some(host));
                }
                None => {
                    self.counters.rejected += 1;
                    self.record(index, None);
                }
            },
            Err(refused) => {
                self.counters.conflicts += 1;
                self.agents[agent].undo(&refused, &self.store, &self.spec, now_s)?;
                // Decided again at once on an up-to-date view, or one lag later on the lagging view
                // that then holds the refusal's cause.
                let fresh = self.retry == RetryMode::Immediate;
                let ready = match (self.lag, fresh) {
                    (Lag::Seconds(_), true) => now_s,
                    (Lag::Seconds(s), false) => now_s + s,
                    (Lag::Commits(d), false) => (self.store.head() + d) as f64,
                    (_, _) => self.store.head() as f64,
                };
                let again = if attempt < self.max_attempts {
                    Some((agent, attempt + 1))
                } else {
                    // The agent answers 503; the control service sends the request to the next
                    // agent (or the client sends it again), unless failed VMs are dropped.
                    self.counters.failed += 1;
                    match self.on_failure {
                        OnFailure::Resubmit => Some(((agent + 1) % self.agents.len(), 1)),
                        OnFailure::Drop => {
                            self.counters.dropped += 1;
                            self.record(index, None);
                            None
                        }
                    }
                };
                if let Some((agent, attempt)) = again {
                    self.counters.retries += 1;
                    self.retries.push_back(Retry { ready, vm: index as u32, agent: agent as u32, attempt, fresh });
                }
            }
        }
        Ok(())
    }

    fn record(&mut self, index: usize, host: Option<String>) {
        if let Some(hosts) = &mut self.hosts {
            hosts[index] = host;
        }
    }

    /// VM `index` exits: its agent releases it and commits the release.
    fn exit(&mut self, index: usize, now_s: f64) -> Result<(), SimError> {
        let agent = self.owner[index] as usize;
        self.catch_up(agent, now_s)?;
        let workload = self.workload;
        let id = &workload.vms[index].request.vm_id;
        self.agents[agent]
            .allocator
            .release(id, now_s)
            .map_err(|e| invalid("agents", format!("agent {agent} cannot release its VM: {e}")))?;
        if self.commit(agent, now_s)?.is_err() {
            return Err(invalid("store", format!("the store refused the release of `{id}`")));
        }
        self.counters.exits += 1;
        Ok(())
    }

    /// The agents' clocks move on (their timers fire); what that changes is committed.
    fn tick(&mut self, now_s: f64) -> Result<(), SimError> {
        for agent in 0..self.agents.len() {
            self.agents[agent].allocator.advance_clock(now_s);
            if self.commit(agent, now_s)?.is_err() {
                return Err(invalid("store", "the store refused a batch of timer changes"));
            }
        }
        Ok(())
    }
}

/// Replays `workload` under `config` through `agents.agents` agents on one store; `progress` is
/// called with the number of events done every so often and at the end.
pub fn run_agents(
    workload: &Workload,
    config: &SimConfig,
    agents: &AgentsConfig,
    registry: &Registry,
    mut progress: impl FnMut(u64),
) -> Result<AgentsResult, SimError> {
    config.validate()?;
    agents.validate()?;
    if config.drains.is_some() {
        return Err(invalid("drains", "drains are not simulated with several agents"));
    }
    let inventory = config.inventory.size(workload)?;
    let mut fleet = (0..agents.agents)
        .map(|i| Agent::new(&inventory.spec, agent_config(config, i), registry))
        .collect::<Result<Vec<_>, _>>()?;
    let policy = fleet.first().map(|agent| agent.allocator.policy()).ok_or_else(|| invalid("agents", "no agent"))?;
    let predictions = predict::predict(workload, &config.prediction, &config.policy, policy, config.seed)?;
    for agent in &mut fleet {
        agent.set_repredictor(predictions.repredictor.clone());
    }
    if agents.avoidance.is_some_and(|a| a.share) {
        for (i, agent) in fleet.iter_mut().enumerate() {
            agent.share_hosts(i, agents.agents);
        }
    }
    let mut run = Run {
        workload,
        store: Store::new(&inventory.spec)?,
        spec: inventory.spec.clone(),
        per_vm: predictions.per_vm,
        agents: fleet,
        lag: agents.lag.resolved(agents.agents),
        max_attempts: agents.max_attempts,
        avoidance: agents.avoidance,
        on_failure: agents.on_failure,
        fresh: false,
        retry: agents.retry,
        fresh_decision: false,
        owner: vec![NO_AGENT; workload.vms.len()],
        exits: BinaryHeap::new(),
        retries: VecDeque::new(),
        counters: AgentCounters::default(),
        hosts: agents.record_placements.then(|| vec![None; workload.vms.len()]),
        follow_s: 0.0,
    };
    // Arrivals to agents: in turn, or drawn.
    let mut draw = ChaCha8Rng::seed_from_u64(config.seed ^ 0xA6E7_5A55_1C0F_FEE5);
    let n = agents.agents;

    let started = Instant::now();
    let mut exact = MetricsRecorder::new(config.measured_from_s(workload.from_s)).without_series();
    let mut next_arrival = 0usize;
    let mut next_sample = workload.from_s;
    let mut final_sample_done = false;
    let mut events = 0u64;
    let mut last_now = workload.from_s;
    let end = workload.to_s;
    loop {
        let mut next: Option<(f64, Kind)> = None;
        let mut consider = |time: f64, kind: Kind| {
            if time <= end && next.is_none_or(|(t, k)| (time, kind) < (t, k)) {
                next = Some((time, kind));
            }
        };
        if let Some(Reverse((Time(t), _))) = run.exits.peek() {
            consider(*t, Kind::Exit);
        }
        if let Some(retry) = run.retries.front() {
            match run.lag {
                Lag::Seconds(_) => consider(retry.ready, Kind::Retry),
                // Ready once enough commits followed it; at the end of the window, whatever.
                _ if retry.ready <= run.store.head() as f64 => consider(last_now, Kind::Retry),
                _ => {}
            }
        }
        if let Some(vm) = workload.vms.get(next_arrival) {
            consider(vm.arrival_s, Kind::Arrival);
        }
        if !final_sample_done {
            consider(next_sample.min(end), Kind::Sample);
        }
        let (now, kind) = match next {
            Some(next) => next,
            // Retries waiting for commits that never come: decided at the end, on views that are
            // up to date by then.
            None if !run.retries.is_empty() => {
                run.fresh = true;
                (end.max(last_now), Kind::Retry)
            }
            None => break,
        };
        last_now = now;
        match kind {
            Kind::Exit => {
                let Some(Reverse((_, index))) = run.exits.pop() else { break };
                run.exit(index as usize, now)?;
            }
            Kind::Retry => {
                let Some(retry) = run.retries.pop_front() else { break };
                run.fresh_decision = retry.fresh;
                run.decide(retry.vm as usize, retry.agent as usize, retry.attempt, true, now)?;
                run.fresh_decision = false;
            }
            Kind::Arrival => {
                let index = next_arrival;
                next_arrival += 1;
                run.counters.arrivals += 1;
                let agent = match agents.assignment {
                    Assignment::RoundRobin => index % n,
                    Assignment::Random => draw.random_range(0..n),
                };
                run.decide(index, agent, 1, false, now)?;
            }
            Kind::Sample => {
                run.tick(now)?;
                if now >= end {
                    final_sample_done = true;
                } else {
                    next_sample += config.sample_interval_s;
                }
            }
        }
        exact.record(metrics::instant(run.store.state(), now));
        events += 1;
        if events % TRIM_EVERY == 0 {
            let read = run.agents.iter().map(|a| a.cursor).min().unwrap_or(0);
            run.store.trim(read);
        }
        if events % PROGRESS_EVERY == 0 {
            progress(events);
        }
    }
    progress(events);
    run.counters.vms_at_end = run.store.state().vm_count() as u64;
    // The self-check: every view, brought up to date, holds exactly the store's inventory.
    run.fresh = true;
    for agent in 0..run.agents.len() {
        run.catch_up(agent, last_now)?;
        if !in_step(run.agents[agent].allocator.state(), run.store.state()) {
            run.counters.views_out_of_step += 1;
        }
    }
    let placements = run.hosts.take().map(|hosts| {
        workload
            .vms
            .iter()
            .zip(hosts)
            .zip(&run.per_vm)
            .map(|((vm, host_id), prediction)| VmPlacement::new(&vm.request.vm_id.0, host_id, prediction.as_ref()))
            .collect()
    });
    Ok(AgentsResult {
        config: config.clone(),
        agents: agents.clone(),
        workload: WorkloadSummary::of(workload, &inventory),
        counters: run.counters,
        metrics: exact.summary(),
        wall_s: started.elapsed().as_secs_f64(),
        rebuild_wall_s: run.agents.iter().map(|a| a.rebuild_s).sum(),
        follow_wall_s: run.follow_s,
        events,
        placements,
    })
}

#[cfg(test)]
mod tests;
