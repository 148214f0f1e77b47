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

pub mod sweep;

use crate::engine::{SimConfig, SimError, Time, VmPlacement, WorkloadSummary};
use crate::metrics::{self, MetricsRecorder, MetricsSummary};
use crate::predict;
use crate::workload::Workload;
use domain::{AllocationOutcome, AllocationRequest, HostId, HostState, InventorySpec, LifetimePrediction};
use placement::journal::LoggedChange;
use placement::reprediction::Repredictor;
use placement::{Allocator, AllocatorConfig, Change, ConflictAvoidance, HostShare, InventoryState, NewVm, PlacedVm};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::fmt;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Instant;

/// How far an agent's view of the store lags behind the store when it decides.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Lag {
    /// The store's last `n` commits are not in the view (its own excepted).
    Commits(u64),
    /// The commits of the last `s` seconds of trace time are not in the view (its own excepted).
    Seconds(f64),
    /// `agents - 1` commits: at saturation every other agent commits once while one decides.
    Saturated,
}

impl Lag {
    /// The lag for a run of `agents` agents (`Saturated` resolved).
    pub fn resolved(self, agents: usize) -> Lag {
        match self {
            Lag::Saturated => Lag::Commits(agents.saturating_sub(1) as u64),
            other => other,
        }
    }
}

impl fmt::Display for Lag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Lag::Commits(n) => write!(f, "{n}"),
            Lag::Seconds(s) => write!(f, "{s}s"),
            Lag::Saturated => f.write_str("n-1"),
        }
    }
}

impl FromStr for Lag {
    type Err = String;

    /// `8` (commits), `30s` (seconds of trace time) or `n-1` (saturated).
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let text = text.trim();
        if text.eq_ignore_ascii_case("n-1") {
            return Ok(Lag::Saturated);
        }
        if let Some(seconds) = text.strip_suffix('s') {
            return match seconds.trim().parse::<f64>() {
                Ok(s) if s.is_finite() && s >= 0.0 => Ok(Lag::Seconds(s)),
                _ => Err(format!("lag `{text}`: seconds must be a number >= 0 (e.g. 30s)")),
            };
        }
        text.parse::<u64>()
            .map(Lag::Commits)
            .map_err(|_| format!("lag `{text}` is not a number of commits (8), seconds of trace time (30s) or `n-1`"))
    }
}

impl Serialize for Lag {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Lag {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

/// Which agent an arrival goes to.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Assignment {
    /// Arrival `i` goes to agent `i mod N` (the control service spreads requests in turn).
    #[default]
    RoundRobin,
    /// Drawn uniformly with the run's seed.
    Random,
}

impl Assignment {
    pub const NAMES: [&'static str; 2] = ["round-robin", "random"];
}

/// When a VM whose commit the store refused is decided again.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RetryMode {
    /// At once, at the same trace time, on a view brought up to date: what the real agent does
    /// after a refusal. Nothing commits in between in a replay, so this attempt succeeds; the
    /// cost of conflicts shows as the retries, and as the first attempts that other agents'
    /// retried placements refuse.
    #[default]
    Immediate,
    /// Once one lag has passed (`d` more commits, or `s` seconds), on the lagging view that then
    /// holds the refusal's cause: the other agents' commits in flight meanwhile can refuse it
    /// again (cascades, 503s). The VM is placed that much later in trace time; at the trace's own
    /// rate `d` commits take `d` times about half a second, far longer than at saturation, so the
    /// packing figures of this mode carry that shift.
    AfterLag,
}

impl RetryMode {
    pub const NAMES: [&'static str; 2] = ["immediate", "after-lag"];
}

/// What becomes of a VM whose `max_attempts` attempts at one agent were all refused (the agent
/// answered 503).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum OnFailure {
    /// Sent again, to the next agent, one lag later (the control service's failover on a 5xx, or
    /// the client's retry): every VM runs in the end, so packing stays comparable with one agent.
    #[default]
    Resubmit,
    /// Never placed.
    Drop,
}

impl OnFailure {
    pub const NAMES: [&'static str; 2] = ["resubmit", "drop"];
}

/// Conflict avoidance (paper 001 s5.3; [`placement::ConflictAvoidance`]). With `share` (the
/// allocator service's way, `allocator/src/durable.rs`), each agent takes the best of its own share
/// of the hosts among the `top` best valid hosts whenever there are other agents. Without it
/// (Protean's), each agent draws a host at random among the `top` best valid hosts instead of the
/// best ones only, with a probability `gain` times the share of its last `window` commit attempts
/// that the store refused. Both always when an agent decides a refused VM again. The defaults are
/// the service's.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Avoidance {
    pub top: usize,
    pub window: usize,
    pub gain: f64,
    /// Each agent takes the best of its own share of the hosts among the top ones
    /// ([`placement::HostShare`], every agent knowing all the others) instead of a random one,
    /// and does so always when there are other agents (`gain` and `window` then play no part),
    /// as the allocator service does.
    pub share: bool,
}

impl Default for Avoidance {
    fn default() -> Self {
        Avoidance { top: 16, window: 50, gain: 10.0, share: true }
    }
}

/// The agents of one run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AgentsConfig {
    pub agents: usize,
    pub lag: Lag,
    pub assignment: Assignment,
    /// Attempts of one VM at one agent before it answers 503 (the allocator's `MAX_ATTEMPTS`).
    pub max_attempts: u32,
    /// Conflict avoidance (`None`: off).
    pub avoidance: Option<Avoidance>,
    pub on_failure: OnFailure,
    pub retry: RetryMode,
    /// Keep every VM's host in the result.
    pub record_placements: bool,
}

impl Default for AgentsConfig {
    fn default() -> Self {
        AgentsConfig {
            agents: 1,
            lag: Lag::Commits(0),
            assignment: Assignment::RoundRobin,
            max_attempts: 5,
            avoidance: Some(Avoidance::default()),
            on_failure: OnFailure::Resubmit,
            retry: RetryMode::Immediate,
            record_placements: false,
        }
    }
}

impl AgentsConfig {
    pub fn validate(&self) -> Result<(), SimError> {
        if self.agents == 0 || self.agents > u32::MAX as usize {
            return Err(invalid("agents", "must be at least 1"));
        }
        if self.max_attempts == 0 {
            return Err(invalid("max_attempts", "must be at least 1"));
        }
        if let Some(a) = self.avoidance {
            if a.top == 0 || a.window == 0 || !(a.gain.is_finite() && a.gain >= 0.0) {
                return Err(invalid("avoidance", "top and window must be at least 1, gain a number >= 0"));
            }
        }
        if let Lag::Seconds(s) = self.lag {
            if !(s.is_finite() && s >= 0.0) {
                return Err(invalid("lag", format!("must be >= 0 seconds, got {s}")));
            }
        }
        Ok(())
    }
}

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

/// One committed batch in the store's log.
#[derive(Clone, Debug)]
pub struct Batch {
    /// Trace time of the commit.
    pub time_s: f64,
    /// The agent that committed it.
    pub agent: usize,
    pub changes: Vec<LoggedChange>,
}

/// Why the store refused a batch.
#[derive(Clone, Debug, PartialEq)]
pub struct Refused(pub String);

/// The zone's shared store: the committed inventory, each host's policy-state row, and the change
/// log in commit order (its prefix that every agent has read is dropped).
#[derive(Debug)]
pub struct Store {
    state: InventoryState,
    policy_states: HashMap<HostId, (String, Option<String>)>,
    log: VecDeque<Batch>,
    /// Sequence number of `log[0]`.
    base: u64,
}

/// How to take back one applied change of a batch the store then refuses.
enum Undo {
    Placed(domain::VmId),
    Released(PlacedVm),
    HostState(placement::HostIndex, HostState),
    PolicyState(HostId, Option<(String, Option<String>)>),
}

impl Store {
    pub fn new(spec: &InventorySpec) -> Result<Store, SimError> {
        let state = InventoryState::from_spec(spec).map_err(|e| invalid("inventory", e.to_string()))?;
        Ok(Store { state, policy_states: HashMap::new(), log: VecDeque::new(), base: 0 })
    }

    /// The committed inventory.
    pub fn state(&self) -> &InventoryState {
        &self.state
    }

    /// The number of batches committed so far.
    pub fn head(&self) -> u64 {
        self.base + self.log.len() as u64
    }

    /// Commits `changes` of `agent` at `time_s` as one batch, or refuses it whole (`Ok(Err)`): a
    /// placement that over-commits a host in any dimension or places a VM id again. `Err` is a
    /// change the store cannot take at all (a drain), or a release of a VM it does not hold.
    pub fn commit(
        &mut self,
        agent: usize,
        time_s: f64,
        changes: Vec<LoggedChange>,
    ) -> Result<Result<(), Refused>, SimError> {
        let mut applied: Vec<Undo> = Vec::with_capacity(changes.len());
        let mut outcome: Result<Result<(), Refused>, SimError> = Ok(Ok(()));
        for change in &changes {
            match self.apply(change) {
                Ok(Ok(undo)) => applied.push(undo),
                Ok(Err(refused)) => {
                    outcome = Ok(Err(refused));
                    break;
                }
                Err(error) => {
                    outcome = Err(error);
                    break;
                }
            }
        }
        if !matches!(outcome, Ok(Ok(()))) {
            // Rolled back whole, as the transaction is.
            for undo in applied.into_iter().rev() {
                self.take_back(undo);
            }
            return outcome;
        }
        self.log.push_back(Batch { time_s, agent, changes });
        Ok(Ok(()))
    }

    fn apply(&mut self, change: &LoggedChange) -> Result<Result<Undo, Refused>, SimError> {
        let index = |state: &InventoryState, host: &HostId| {
            state.host_index(host).ok_or_else(|| invalid("store", format!("unknown host `{host}`")))
        };
        Ok(Ok(match change {
            LoggedChange::Placed { vm, host } => {
                let host_index = index(&self.state, host)?;
                // The checks of PostgreSQL's `CHECK` and primary key: room in every dimension, and
                // a VM id placed once.
                if let Err(error) = self.state.restore(Arc::new(vm.clone()), host_index) {
                    return Ok(Err(Refused(error.to_string())));
                }
                Undo::Placed(vm.id.clone())
            }
            LoggedChange::Released { vm } => {
                let placed = self
                    .state
                    .release(vm)
                    .map_err(|e| invalid("store", format!("a release the store cannot apply: {e}")))?;
                Undo::Released(placed)
            }
            LoggedChange::HostState { host, state } => {
                let host_index = index(&self.state, host)?;
                let previous = self.state.hosts()[host_index.get()].state;
                self.state.set_host_state(host_index, *state).map_err(|e| invalid("store", e.to_string()))?;
                Undo::HostState(host_index, previous)
            }
            LoggedChange::PolicyHostState { host, policy, state } => {
                index(&self.state, host)?;
                let previous = self.policy_states.insert(host.clone(), (policy.clone(), state.clone()));
                Undo::PolicyState(host.clone(), previous)
            }
            LoggedChange::MigrationStarted { .. }
            | LoggedChange::MigrationCompleted { .. }
            | LoggedChange::MigrationCancelled { .. }
            | LoggedChange::Drain { .. } => {
                return Err(invalid("drains", "drains and migrations are not simulated with several agents"))
            }
        }))
    }

    fn take_back(&mut self, undo: Undo) {
        // Each of these exactly reverses a change applied just before; none can fail.
        match undo {
            Undo::Placed(vm) => {
                let _ = self.state.release(&vm);
            }
            Undo::Released(placed) => {
                let _ = self.state.restore(Arc::clone(&placed.record), placed.host);
            }
            Undo::HostState(host, previous) => {
                let _ = self.state.set_host_state(host, previous);
            }
            Undo::PolicyState(host, previous) => match previous {
                Some(previous) => {
                    self.policy_states.insert(host, previous);
                }
                None => {
                    self.policy_states.remove(&host);
                }
            },
        }
    }

    /// The policy-state row of `host`, as `follow` takes it (`None`: the initial state).
    fn policy_state(&self, host: &HostId, policy: &str) -> LoggedChange {
        let (policy, state) = match self.policy_states.get(host) {
            Some((policy, state)) => (policy.clone(), state.clone()),
            None => (policy.to_owned(), None),
        };
        LoggedChange::PolicyHostState { host: host.clone(), policy, state }
    }

    /// Drops the batches before `seq` (every agent has read them).
    fn trim(&mut self, seq: u64) {
        while self.base < seq && self.log.pop_front().is_some() {
            self.base += 1;
        }
    }
}

/// A batch's changes: `Ok` committed, `Err` refused by the store.
pub type Committed = Result<Vec<Change>, Vec<Change>>;

/// One agent: its allocator (its view of the zone) and where it is in the store's log.
#[derive(Debug)]
pub struct Agent {
    pub allocator: Allocator,
    /// The next batch of the log to read.
    pub cursor: u64,
    config: AllocatorConfig,
    repredictor: Option<Arc<dyn Repredictor>>,
    /// The log position of this agent's latest committed policy-state row of each host: another
    /// agent's older row of the host, read later, is not the store's any more and is skipped.
    own_rows: HashMap<HostId, u64>,
    /// Wall-clock seconds spent rebuilding the view.
    pub rebuild_s: f64,
    /// Its latest commit attempts (refused or not), for conflict avoidance.
    attempts: VecDeque<bool>,
    /// How many of them it keeps.
    window: usize,
    /// Its share of the hosts among all the run's agents ([`Agent::share_hosts`]).
    share: Option<Arc<HostShare>>,
}

/// The allocator configuration of agent `agent` of a run: the run's, with a seed of its own
/// (agent 0 keeps the run's seed, so that one agent is the single-allocator run).
pub fn agent_config(config: &SimConfig, agent: usize) -> AllocatorConfig {
    let mut allocator = config.allocator_config();
    allocator.seed = config.seed ^ (agent as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    allocator
}

impl Agent {
    pub fn new(
        spec: &InventorySpec,
        config: AllocatorConfig,
        repredictor: Option<Arc<dyn Repredictor>>,
    ) -> Result<Agent, SimError> {
        let mut allocator = Allocator::new(spec, &config)?;
        allocator.set_repredictor(repredictor.clone());
        Ok(Agent {
            allocator,
            cursor: 0,
            config,
            repredictor,
            own_rows: HashMap::new(),
            rebuild_s: 0.0,
            attempts: VecDeque::new(),
            window: 50,
            share: None,
        })
    }

    /// Gives agent `me` of `agents` its share of the hosts, for conflict avoidance with shares.
    pub fn share_hosts(&mut self, me: usize, agents: usize) {
        let names: Vec<String> = (0..agents).map(|i| format!("agent-{i}")).collect();
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        let hosts: Vec<HostId> = self.allocator.state().hosts().iter().map(|host| host.id.clone()).collect();
        self.share = Some(Arc::new(HostShare::rendezvous(names[me], &names, &hosts)));
    }

    /// Reads the store's log from the cursor while `visible` says a batch is in the view, following
    /// the other agents' changes. A change the view cannot apply rebuilds it from the store (then
    /// it holds everything). Returns the changes followed and whether it was rebuilt.
    pub fn catch_up(
        &mut self,
        me: usize,
        store: &Store,
        spec: &InventorySpec,
        now_s: f64,
        visible: impl Fn(u64, &Batch) -> bool,
    ) -> Result<(u64, bool), SimError> {
        let mut followed = 0;
        while self.cursor < store.head() {
            let batch = &store.log[(self.cursor - store.base) as usize];
            if !visible(self.cursor, batch) {
                break;
            }
            if batch.agent != me {
                for change in &batch.changes {
                    if let LoggedChange::PolicyHostState { host, .. } = change {
                        // The store holds this agent's later row of the host (last writer wins).
                        if self.own_rows.get(host).is_some_and(|&own| own > self.cursor) {
                            continue;
                        }
                    }
                    if self.allocator.follow(change).is_err() {
                        self.rebuild(store, spec, now_s)?;
                        return Ok((followed, true));
                    }
                    followed += 1;
                }
            }
            self.cursor += 1;
        }
        // Following journals nothing, but a policy timer that a followed row left in the past
        // fires as the view's clock is read (a LAVA deadline): that transition is this agent's
        // own, and stays in its journal to be committed with its next batch.
        Ok((followed, false))
    }

    /// Throws the view away and builds it again from the store: every VM in placement order, the
    /// host states, the policy-state rows.
    pub fn rebuild(&mut self, store: &Store, spec: &InventorySpec, now_s: f64) -> Result<(), SimError> {
        let started = Instant::now();
        let mut allocator = Allocator::new(spec, &self.config)?;
        allocator.set_repredictor(self.repredictor.clone());
        let contradiction = |e: placement::StateError| invalid("agents", format!("rebuilding a view: {e}"));
        let mut vms: Vec<&PlacedVm> = store.state.vms().map(|(_, placed)| placed).collect();
        vms.sort_by(|a, b| {
            a.record.placed_at_s.total_cmp(&b.record.placed_at_s).then_with(|| a.record.id.cmp(&b.record.id))
        });
        for placed in vms {
            let host = store.state.hosts()[placed.host.get()].id.clone();
            allocator.restore(NewVm::clone(&placed.record), &host, now_s).map_err(contradiction)?;
        }
        for host in store.state.hosts().iter().filter(|h| h.state != HostState::Available) {
            allocator
                .follow(&LoggedChange::HostState { host: host.id.clone(), state: host.state })
                .map_err(contradiction)?;
        }
        let mut rows: Vec<_> = store.policy_states.iter().collect();
        rows.sort_by(|a, b| a.0.cmp(b.0));
        for (host, (policy, state)) in rows {
            let row =
                LoggedChange::PolicyHostState { host: host.clone(), policy: policy.clone(), state: state.clone() };
            allocator.follow(&row).map_err(contradiction)?;
        }
        // What is journaled now is timers that fired on restored rows: committed with the next batch.
        self.allocator = allocator;
        self.cursor = store.head();
        self.own_rows.clear();
        self.rebuild_s += started.elapsed().as_secs_f64();
        Ok(())
    }

    /// Commits what this agent's allocator journaled since its last commit as one batch at
    /// `now_s`: `Ok(Ok(changes))` when the store took it (or there was nothing to commit),
    /// `Ok(Err(changes))` when it refused it (to be taken back with [`Agent::undo`]).
    pub fn commit(&mut self, me: usize, store: &mut Store, now_s: f64) -> Result<Committed, SimError> {
        let changes: Vec<Change> = self.allocator.take_changes().collect();
        if changes.is_empty() {
            return Ok(Ok(changes));
        }
        let allocator = &self.allocator;
        let logged = changes.iter().map(|c| LoggedChange::of(c, &|h| allocator.policy_host_snapshot(h))).collect();
        let seq = store.head();
        let outcome = store.commit(me, now_s, logged)?;
        if self.attempts.len() >= self.window {
            self.attempts.pop_front();
        }
        self.attempts.push_back(outcome.is_err());
        Ok(match outcome {
            Ok(()) => {
                for change in &changes {
                    if let Change::PolicyHostState { host, .. } = change {
                        self.own_rows.insert(host.clone(), seq);
                    }
                }
                Ok(changes)
            }
            Err(_) => Err(changes),
        })
    }

    /// The share of its latest commit attempts that the store refused (0 with none).
    pub fn refused_share(&self) -> f64 {
        if self.attempts.is_empty() {
            0.0
        } else {
            self.attempts.iter().filter(|&&refused| refused).count() as f64 / self.attempts.len() as f64
        }
    }

    /// Sets conflict avoidance for the next decision, as the allocator service does before each
    /// batch: always when deciding a refused VM again, else `gain` times the refused share.
    pub fn avoid_conflicts(&mut self, avoidance: Option<Avoidance>, again: bool) {
        let Some(a) = avoidance else { return };
        self.window = a.window;
        let share = self.share.clone().filter(|_| a.share);
        // With a share of the hosts among other agents, always (as the allocator service does).
        let others = share.as_ref().is_some_and(|share| share.agents() > 1);
        let probability = if again || others { 1.0 } else { (a.gain * self.refused_share()).min(1.0) };
        self.allocator.set_conflict_avoidance(Some(ConflictAvoidance { top: a.top, probability, share }));
    }

    /// Takes back this agent's own `changes` that the store refused (taken from its journal): its
    /// placements are released in the view (no policy hook runs), and the policy state of the
    /// hosts they touched is read back from the store. Anything else (not made by an allocation)
    /// rebuilds the view.
    pub fn undo(
        &mut self,
        changes: &[Change],
        store: &Store,
        spec: &InventorySpec,
        now_s: f64,
    ) -> Result<(), SimError> {
        let mut policy_hosts: Vec<HostId> = Vec::new();
        for change in changes.iter().rev() {
            let undone = match change {
                Change::Placed { vm, .. } => {
                    self.allocator.follow(&LoggedChange::Released { vm: vm.id.clone() }).is_ok()
                }
                Change::PolicyHostState { host, .. } => {
                    policy_hosts.push(host.clone());
                    true
                }
                _ => false,
            };
            if !undone {
                return self.rebuild(store, spec, now_s);
            }
        }
        if let Some(policy) = self.allocator.host_state().map(|p| p.name()) {
            policy_hosts.sort_unstable();
            policy_hosts.dedup();
            for host in &policy_hosts {
                if self.allocator.follow(&store.policy_state(host, policy)).is_err() {
                    return self.rebuild(store, spec, now_s);
                }
            }
        }
        Ok(())
    }
}

/// Whether `view` holds exactly the VMs of `store` on the same hosts, with the same use and host
/// states.
pub fn in_step(view: &InventoryState, store: &InventoryState) -> bool {
    view.vm_count() == store.vm_count()
        && view.hosts().len() == store.hosts().len()
        && view.hosts().iter().zip(store.hosts()).all(|(a, b)| a.id == b.id && a.used == b.used && a.state == b.state)
        && store.vms().all(|(id, placed)| view.vm(id).is_some_and(|v| v.host == placed.host))
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
    mut progress: impl FnMut(u64),
) -> Result<AgentsResult, SimError> {
    config.validate()?;
    agents.validate()?;
    if config.drains.is_some() {
        return Err(invalid("drains", "drains are not simulated with several agents"));
    }
    let inventory = config.inventory.size(workload)?;
    let predictions = predict::predict(workload, &config.prediction, &config.policy, config.seed)?;
    let mut fleet = (0..agents.agents)
        .map(|i| Agent::new(&inventory.spec, agent_config(config, i), predictions.repredictor.clone()))
        .collect::<Result<Vec<_>, _>>()?;
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
            .map(|(vm, host_id)| VmPlacement { vm_id: vm.request.vm_id.0.clone(), host_id })
            .collect()
    });
    Ok(AgentsResult {
        config: config.clone(),
        agents: agents.clone(),
        workload: WorkloadSummary {
            vms: workload.vms.len(),
            warmup_vms: workload.warmup_vms,
            from_s: workload.from_s,
            to_s: workload.to_s,
            records_read: workload.records_read,
            records_skipped: workload.records_skipped,
            hosts: inventory.hosts,
            host_cores: inventory.host_capacity.cores(),
            host_memory_gib: inventory.host_capacity.memory_gib(),
            peak: inventory.peak,
        },
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
