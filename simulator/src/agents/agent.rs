//! One simulated agent: its own allocator over a possibly stale view of the store, deciding batches and following the store's log.

use super::*;

/// One agent: its allocator (its view of the zone) and where it is in the store's log.
#[derive(Debug)]
pub struct Agent {
    pub allocator: Allocator,
    /// The next batch of the log to read.
    pub cursor: u64,
    config: AllocatorConfig,
    /// Where its policy's rules come from, for rebuilding the view.
    registry: Registry,
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
    /// An agent with an empty view, its policy's rules and presets looked up in `registry`.
    pub fn new(spec: &InventorySpec, config: AllocatorConfig, registry: &Registry) -> Result<Agent, SimError> {
        let allocator = Allocator::with_registry(spec, &config, registry)?;
        Ok(Agent {
            allocator,
            cursor: 0,
            config,
            registry: registry.clone(),
            repredictor: None,
            own_rows: HashMap::new(),
            rebuild_s: 0.0,
            attempts: VecDeque::new(),
            window: 50,
            share: None,
        })
    }

    /// Repredicts with `repredictor` from now on, also after a rebuild.
    pub fn set_repredictor(&mut self, repredictor: Option<Arc<dyn Repredictor>>) {
        self.allocator.set_repredictor(repredictor.clone());
        self.repredictor = repredictor;
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
        let mut allocator = Allocator::with_registry(spec, &self.config, &self.registry)?;
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
