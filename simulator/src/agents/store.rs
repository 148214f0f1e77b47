//! The shared store the simulated agents commit to: one batch at a time, refused when it conflicts with what another agent committed since the batch's view.

use super::*;

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
    pub(super) state: InventoryState,
    pub(super) policy_states: HashMap<HostId, (String, Option<String>)>,
    pub(super) log: VecDeque<Batch>,
    /// Sequence number of `log[0]`.
    pub(super) base: u64,
}

/// How to take back one applied change of a batch the store then refuses.
pub(super) enum Undo {
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
            | LoggedChange::Drain { .. }
            | LoggedChange::Consolidation { .. } => {
                return Err(invalid(
                    "drains",
                    "drains, consolidation and migrations are not simulated with several agents",
                ))
            }
            LoggedChange::Resized { .. } => {
                return Err(invalid("resize", "VMs resized in place are not simulated with several agents"))
            }
            LoggedChange::HostInventory { .. } => {
                return Err(invalid("inventory", "a changing inventory is not simulated with several agents"))
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
    pub(super) fn policy_state(&self, host: &HostId, policy: &str) -> LoggedChange {
        let (policy, state) = match self.policy_states.get(host) {
            Some((policy, state)) => (policy.clone(), state.clone()),
            None => (policy.to_owned(), None),
        };
        LoggedChange::PolicyHostState { host: host.clone(), policy, state }
    }

    /// Drops the batches before `seq` (every agent has read them).
    pub(super) fn trim(&mut self, seq: u64) {
        while self.base < seq && self.log.pop_front().is_some() {
            self.base += 1;
        }
    }
}

/// A batch's changes: `Ok` committed, `Err` refused by the store.
pub type Committed = Result<Vec<Change>, Vec<Change>>;
