//! Live history (issue 18): the serving bundle's feature store, kept current with every VM
//! arrival and exit the control service reports ([`HistoryEvent`]).
//!
//! A bundle's feature store is the tenants' and job identities' history as of its training cut-off
//! (`as_of_s`). Frozen, every tenant or job that appears later is unknown to the model, and every
//! known one's history goes stale. [`LiveHistory`] starts from that snapshot and applies the events
//! after it, through the very [`TenantHistory`] calls the trainer's replay makes ([`crate::dataset::replay`]): the
//! features served at an instant are those the trainer computes for the same VM from the same
//! events.
//!
//! What it holds is bounded: per history by [`TenantHistory`]'s own limits, in total by
//! [`LiveLimits`] (histories, tracked running VMs, the journal), the least recently active histories
//! evicted first. Events it cannot use are counted, never fatal: a second start of a running VM
//! (duplicate), the end of a VM it does not know, events from before the snapshot (the snapshot
//! has them), an end before its start.
//!
//! A new bundle brings a new snapshot: [`LiveHistory::rebase`] starts from it and applies again
//! the events of the journal that came after its cut-off.

use crate::history::{FeatureStore, Histories, HistoryKey, TenantHistory};
use domain::HistoryEvent;
use serde::Serialize;
use std::collections::{BTreeMap, HashMap, VecDeque};

/// Bounds on what a live history holds.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LiveLimits {
    /// Histories kept (tenants and job identities together); beyond, the least recently active one
    /// is forgotten.
    #[serde(alias = "max_tenants")]
    pub max_histories: usize,
    /// Running VMs whose start is remembered (to record their end); beyond, a start still counts
    /// but its end will not be known.
    pub max_running_vms: usize,
    /// Events kept to apply again over a new bundle's snapshot.
    pub max_journal: usize,
}

impl Default for LiveLimits {
    fn default() -> Self {
        LiveLimits { max_histories: 200_000, max_running_vms: 500_000, max_journal: 1_000_000 }
    }
}

/// What became of the events, since the start.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct LiveCounters {
    pub applied: u64,
    /// A start of a VM already running, or a second end.
    pub duplicates: u64,
    /// The end of a VM whose start is not known (it started before the snapshot, or its
    /// histories were evicted, or it was never tracked).
    pub unknown_vms: u64,
    /// Events at or before the snapshot's instant: the snapshot has them.
    pub before_snapshot: u64,
    /// An end before its VM's start.
    pub invalid: u64,
    /// Events older than the latest one applied (applied all the same).
    pub out_of_order: u64,
    /// Histories (tenants' or jobs') forgotten to stay within the limit.
    pub tenants_evicted: u64,
    /// Starts whose VM could not be tracked (too many running VMs).
    pub untracked: u64,
    /// Events dropped from the journal (a rebase over an older snapshot misses them).
    pub journal_dropped: u64,
    /// Starts that came after their VM's end (counted in `unknown_vms` first), recorded with it.
    pub reordered: u64,
}

/// Ends of unknown VMs kept to be matched by a start that comes late.
const EARLY_ENDS: usize = 1_024;

/// What one event did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Applied {
    Applied,
    Duplicate,
    UnknownVm,
    BeforeSnapshot,
    Invalid,
}

/// A history and when it was last touched (for eviction).
#[derive(Clone, Debug)]
struct LiveEntry {
    history: TenantHistory,
    touched: u64,
}

/// A running VM whose end can be recorded.
#[derive(Clone, Debug)]
struct RunningVm {
    /// The histories it counts in ([`HistoryKey::of`]).
    keys: [Option<HistoryKey>; 2],
    start_s: f64,
}

/// See the module documentation.
#[derive(Clone, Debug)]
pub struct LiveHistory {
    limits: LiveLimits,
    as_of_s: f64,
    histories: HashMap<HistoryKey, LiveEntry>,
    /// Histories by when they were last touched: the first is the next to evict.
    by_touch: BTreeMap<u64, HistoryKey>,
    /// How many of the histories are job identities' (kept as they change: the sizes are read after
    /// every batch of events).
    jobs: usize,
    clock: u64,
    running: HashMap<String, RunningVm>,
    /// Ends that came before their VM's start (events sent concurrently can arrive out of order),
    /// oldest first: the start, when it comes, is recorded with its end.
    early_ends: HashMap<String, f64>,
    early_order: VecDeque<String>,
    journal: VecDeque<HistoryEvent>,
    /// The latest instant of an event dropped from the journal.
    journal_forgot_s: f64,
    latest_s: f64,
    counters: LiveCounters,
}

impl LiveHistory {
    /// A live history that starts from `snapshot`.
    pub fn new(snapshot: &FeatureStore, limits: LiveLimits) -> Self {
        let mut live = LiveHistory {
            limits,
            as_of_s: snapshot.as_of_s,
            histories: HashMap::new(),
            by_touch: BTreeMap::new(),
            jobs: 0,
            clock: 0,
            running: HashMap::new(),
            early_ends: HashMap::new(),
            early_order: VecDeque::new(),
            journal: VecDeque::new(),
            journal_forgot_s: f64::NEG_INFINITY,
            latest_s: f64::NEG_INFINITY,
            counters: LiveCounters::default(),
        };
        live.load(snapshot);
        live
    }

    fn load(&mut self, snapshot: &FeatureStore) {
        self.as_of_s = snapshot.as_of_s;
        self.histories.clear();
        self.by_touch.clear();
        self.jobs = 0;
        self.running.clear();
        self.latest_s = snapshot.as_of_s;
        // The least recently active histories first, so that the limit keeps the most recent ones.
        let mut histories: Vec<(HistoryKey, &TenantHistory)> = snapshot.iter().collect();
        histories.sort_by(|a, b| a.1.last_activity().total_cmp(&b.1.last_activity()).then(a.0.cmp(&b.0)));
        for (key, history) in histories {
            self.insert(key, history.clone());
        }
    }

    /// The instant of the snapshot this history started from.
    pub fn as_of_s(&self) -> f64 {
        self.as_of_s
    }

    pub fn counters(&self) -> LiveCounters {
        self.counters
    }

    /// What is held now.
    pub fn sizes(&self) -> LiveSizes {
        LiveSizes {
            tenants: self.histories.len() - self.jobs,
            jobs: self.jobs,
            running_vms: self.running.len(),
            journal_events: self.journal.len(),
        }
    }

    /// Applies one event (see the module documentation for what is not used, and why).
    pub fn apply(&mut self, event: &HistoryEvent) -> Applied {
        let outcome = self.apply_inner(event);
        if outcome == Applied::Applied {
            if self.journal.len() == self.limits.max_journal {
                if let Some(dropped) = self.journal.pop_front() {
                    self.journal_forgot_s = self.journal_forgot_s.max(dropped.at_s());
                    self.counters.journal_dropped += 1;
                }
            }
            if self.limits.max_journal > 0 {
                self.journal.push_back(event.clone());
            }
        }
        outcome
    }

    fn apply_inner(&mut self, event: &HistoryEvent) -> Applied {
        let at_s = event.at_s();
        if at_s <= self.as_of_s {
            self.counters.before_snapshot += 1;
            return Applied::BeforeSnapshot;
        }
        match event {
            HistoryEvent::Started { vm_id, tenant_id, vm_type, .. } => {
                if self.running.contains_key(vm_id) {
                    self.counters.duplicates += 1;
                    return Applied::Duplicate;
                }
                self.note_time(at_s);
                // An empty tenant is no tenant, an empty type no job: nothing to learn of them.
                let keys = HistoryKey::of(tenant_id, vm_type);
                if keys.iter().any(Option::is_some) {
                    for key in keys.iter().flatten() {
                        self.touch(key).history.record_start(at_s);
                    }
                    match self.early_ends.remove(vm_id) {
                        Some(end_s) if end_s >= at_s => {
                            for key in keys.iter().flatten() {
                                self.touch(key).history.record_end(at_s, end_s);
                            }
                            self.counters.reordered += 1;
                        }
                        _ if self.running.len() < self.limits.max_running_vms => {
                            self.running.insert(vm_id.clone(), RunningVm { keys, start_s: at_s });
                        }
                        _ => self.counters.untracked += 1,
                    }
                }
            }
            HistoryEvent::Ended { vm_id, .. } => {
                let Some(vm) = self.running.get(vm_id) else {
                    // Perhaps its start is on its way: kept a while (bounded) to be matched.
                    if !self.early_ends.contains_key(vm_id) {
                        if self.early_order.len() == EARLY_ENDS {
                            if let Some(oldest) = self.early_order.pop_front() {
                                self.early_ends.remove(&oldest);
                            }
                        }
                        self.early_order.push_back(vm_id.clone());
                        self.early_ends.insert(vm_id.clone(), at_s);
                    }
                    self.counters.unknown_vms += 1;
                    return Applied::UnknownVm;
                };
                if at_s < vm.start_s {
                    self.counters.invalid += 1;
                    return Applied::Invalid;
                }
                let Some(vm) = self.running.remove(vm_id) else { return Applied::UnknownVm };
                self.note_time(at_s);
                for key in vm.keys.iter().flatten() {
                    if self.histories.contains_key(key) {
                        self.touch(key).history.record_end(vm.start_s, at_s);
                    }
                }
            }
        }
        self.counters.applied += 1;
        Applied::Applied
    }

    fn note_time(&mut self, at_s: f64) {
        if at_s < self.latest_s {
            self.counters.out_of_order += 1;
        }
        self.latest_s = self.latest_s.max(at_s);
    }

    /// The history's entry, created if need be, marked as the most recently active.
    fn touch(&mut self, key: &HistoryKey) -> &mut LiveEntry {
        if !self.histories.contains_key(key) {
            self.insert(key.clone(), TenantHistory::default());
        }
        self.clock += 1;
        let clock = self.clock;
        let entry = self.histories.get_mut(key).expect("inserted above");
        self.by_touch.remove(&entry.touched);
        entry.touched = clock;
        self.by_touch.insert(clock, key.clone());
        entry
    }

    fn insert(&mut self, key: HistoryKey, history: TenantHistory) {
        while self.histories.len() >= self.limits.max_histories.max(1) {
            let Some((_, oldest)) = self.by_touch.pop_first() else { break };
            self.histories.remove(&oldest);
            self.jobs -= usize::from(matches!(oldest, HistoryKey::Job(_)));
            self.counters.tenants_evicted += 1;
        }
        self.clock += 1;
        self.by_touch.insert(self.clock, key.clone());
        self.jobs += usize::from(matches!(key, HistoryKey::Job(_)));
        self.histories.insert(key, LiveEntry { history, touched: self.clock });
    }

    /// Starts again from a new bundle's `snapshot` and applies the journal's events that came after
    /// its cut-off. Returns how many were applied again, and whether events after the cut-off had
    /// already left the journal (then the history misses them).
    pub fn rebase(&mut self, snapshot: &FeatureStore) -> (usize, bool) {
        let journal = std::mem::take(&mut self.journal);
        let lost = self.journal_forgot_s > snapshot.as_of_s;
        let counters = self.counters;
        let still_running = std::mem::take(&mut self.running);
        self.load(snapshot);
        // The VMs running at the new cut-off, whose ends may come after it: the snapshot has their
        // starts, and their ends must still be recorded.
        let cut_off = snapshot.as_of_s;
        for event in journal.iter().take_while(|event| event.at_s() <= cut_off) {
            match event {
                HistoryEvent::Started { vm_id, tenant_id, vm_type, at_s }
                    if self.running.len() < self.limits.max_running_vms =>
                {
                    let keys = HistoryKey::of(tenant_id, vm_type);
                    self.running.insert(vm_id.clone(), RunningVm { keys, start_s: *at_s });
                }
                HistoryEvent::Ended { vm_id, .. } => {
                    self.running.remove(vm_id);
                }
                HistoryEvent::Started { .. } => {}
            }
        }
        for (vm_id, vm) in still_running {
            if vm.start_s <= cut_off && self.running.len() < self.limits.max_running_vms {
                self.running.entry(vm_id).or_insert(vm);
            }
        }
        let mut replayed = 0;
        for event in &journal {
            if event.at_s() > snapshot.as_of_s && self.apply_inner(event) == Applied::Applied {
                replayed += 1;
            }
        }
        // Counters count what arrived, not what was applied again.
        self.counters = counters;
        self.journal = journal;
        (replayed, lost)
    }
}

impl Histories for LiveHistory {
    fn get(&self, key: &HistoryKey) -> Option<&TenantHistory> {
        self.histories.get(key).map(|entry| &entry.history)
    }
}

/// What a live history holds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LiveSizes {
    pub tenants: usize,
    pub jobs: usize,
    pub running_vms: usize,
    pub journal_events: usize,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::TenantSummary;

    const HOUR: f64 = 3_600.0;

    fn started(vm: &str, tenant: &str, at_s: f64) -> HistoryEvent {
        HistoryEvent::Started { vm_id: vm.to_owned(), tenant_id: tenant.to_owned(), vm_type: String::new(), at_s }
    }

    fn ended(vm: &str, at_s: f64) -> HistoryEvent {
        HistoryEvent::Ended { vm_id: vm.to_owned(), at_s }
    }

    fn summary(live: &LiveHistory, tenant: &str, now_s: f64) -> TenantSummary {
        live.past(tenant, "", now_s, 24.0 * HOUR, 2.0 * HOUR).tenant
    }

    impl LiveHistory {
        fn tenant(&self, tenant_id: &str) -> Option<&TenantHistory> {
            self.get(&HistoryKey::Tenant(tenant_id.to_owned()))
        }
    }

    fn with_tenants(as_of_s: f64, tenants: Vec<(&str, TenantHistory)>) -> FeatureStore {
        let tenants = tenants.into_iter().map(|(id, h)| (id.to_owned(), h)).collect();
        FeatureStore { tenants, ..FeatureStore::empty(as_of_s) }
    }

    #[test]
    fn events_after_the_snapshot_are_what_the_trainer_records() {
        let mut snapshot_history = TenantHistory::default();
        snapshot_history.record_start(50.0);
        let snapshot = with_tenants(100.0, vec![("old", snapshot_history)]);
        let mut live = LiveHistory::new(&snapshot, LiveLimits::default());
        // What the trainer's replay does with the same events.
        let mut trainer = TenantHistory::default();
        trainer.record_start(200.0);
        trainer.record_start(300.0);
        trainer.record_end(200.0, 200.0 + 3.0 * HOUR);
        for event in [started("a", "new", 200.0), started("b", "new", 300.0), ended("a", 200.0 + 3.0 * HOUR)] {
            assert_eq!(live.apply(&event), Applied::Applied);
        }
        assert_eq!(live.tenant("new"), Some(&trainer));
        assert_eq!(summary(&live, "new", 5.0 * HOUR), trainer.summary(5.0 * HOUR, 24.0 * HOUR, 2.0 * HOUR));
        assert!(live.tenant("old").is_some(), "the snapshot's tenants stay");
    }

    #[test]
    fn unusable_events_are_counted_and_change_nothing() {
        let snapshot = FeatureStore::empty(100.0);
        let mut live = LiveHistory::new(&snapshot, LiveLimits::default());
        assert_eq!(live.apply(&started("a", "t", 200.0)), Applied::Applied);
        let before = live.tenant("t").cloned();
        assert_eq!(live.apply(&started("a", "t", 250.0)), Applied::Duplicate);
        assert_eq!(live.apply(&ended("ghost", 300.0)), Applied::UnknownVm);
        assert_eq!(live.apply(&started("old", "t", 90.0)), Applied::BeforeSnapshot);
        assert_eq!(live.apply(&ended("a", 150.0)), Applied::Invalid);
        assert_eq!(live.tenant("t").cloned(), before);
        assert_eq!(live.apply(&ended("a", 400.0)), Applied::Applied);
        assert_eq!(live.apply(&ended("a", 500.0)), Applied::UnknownVm, "a second end");
        let c = live.counters();
        assert_eq!((c.applied, c.duplicates, c.unknown_vms, c.before_snapshot, c.invalid), (2, 1, 2, 1, 1));
    }

    #[test]
    fn an_end_that_overtook_its_start_is_recorded_when_the_start_comes() {
        let snapshot = FeatureStore::empty(0.0);
        let mut live = LiveHistory::new(&snapshot, LiveLimits::default());
        assert_eq!(live.apply(&ended("a", 3.0 * HOUR)), Applied::UnknownVm);
        assert_eq!(live.apply(&started("a", "t", 10.0)), Applied::Applied);
        let mut expected = TenantHistory::default();
        expected.record_start(10.0);
        expected.record_end(10.0, 3.0 * HOUR);
        assert_eq!(live.tenant("t"), Some(&expected));
        assert_eq!(live.counters().reordered, 1);
        assert_eq!(live.sizes().running_vms, 0, "not running");
    }

    #[test]
    fn memory_stays_bounded_under_a_flood_of_new_tenants() {
        let snapshot = FeatureStore::empty(0.0);
        let limits = LiveLimits { max_histories: 100, max_running_vms: 150, max_journal: 500 };
        let mut live = LiveHistory::new(&snapshot, limits);
        for i in 0..10_000 {
            live.apply(&started(&format!("vm{i}"), &format!("t{i}"), 1.0 + f64::from(i)));
        }
        let sizes = live.sizes();
        assert_eq!((sizes.tenants, sizes.running_vms, sizes.journal_events), (100, 150, 500));
        let c = live.counters();
        assert_eq!((c.tenants_evicted, c.untracked, c.journal_dropped), (9_900, 9_850, 9_500));
        // The most recent tenants are the ones kept.
        assert!(live.tenant("t9999").is_some() && live.tenant("t0").is_none());
    }

    #[test]
    fn a_new_snapshot_keeps_what_happened_after_its_cut_off() {
        let empty = FeatureStore::empty(0.0);
        let mut live = LiveHistory::new(&empty, LiveLimits::default());
        for event in [started("a", "t", 10.0), started("b", "t", 20.0), ended("a", 30.0), started("c", "t", 40.0)] {
            live.apply(&event);
        }
        let expected = live.tenant("t").cloned();
        // A bundle trained up to 25 s: it knows a and b started; the rest comes from the journal.
        let mut known = TenantHistory::default();
        known.record_start(10.0);
        known.record_start(20.0);
        let newer = with_tenants(25.0, vec![("t", known)]);
        assert_eq!(live.rebase(&newer), (2, false));
        assert_eq!(live.tenant("t").cloned(), expected);
        assert_eq!(live.as_of_s(), 25.0);
        // b started before the new cut-off: its end is still recorded.
        assert_eq!(live.apply(&ended("b", 50.0)), Applied::Applied);
        let mut after = expected.expect("t");
        after.record_end(20.0, 50.0);
        assert_eq!(live.tenant("t"), Some(&after));
    }

    #[test]
    fn a_rebase_over_events_the_journal_forgot_says_so() {
        let empty = FeatureStore::empty(0.0);
        let mut live = LiveHistory::new(&empty, LiveLimits { max_journal: 2, ..LiveLimits::default() });
        for (i, at) in [10.0, 20.0, 30.0].into_iter().enumerate() {
            live.apply(&started(&format!("v{i}"), "t", at));
        }
        let (replayed, lost) = live.rebase(&FeatureStore::empty(5.0));
        assert_eq!((replayed, lost), (2, true));
    }

    #[test]
    fn a_vm_counts_in_its_jobs_history_as_the_trainer_counts_it() {
        let mut live = LiveHistory::new(&FeatureStore::empty(0.0), LiveLimits::default());
        let mut trainer = FeatureStore::empty(0.0);
        let job = |vm: &str, vm_type: &str, at_s: f64| HistoryEvent::Started {
            vm_id: vm.to_owned(),
            tenant_id: "t".to_owned(),
            vm_type: vm_type.to_owned(),
            at_s,
        };
        for (vm, vm_type, at_s) in [("a", "nightly", 10.0), ("b", "web", 20.0), ("c", "nightly", 30.0)] {
            live.apply(&job(vm, vm_type, at_s));
            trainer.record_start("t", vm_type, at_s);
        }
        live.apply(&ended("a", 3.0 * HOUR));
        trainer.record_end("t", "nightly", 10.0, 3.0 * HOUR);
        let at = |h: &dyn Histories| h.past("t", "nightly", 4.0 * HOUR, 24.0 * HOUR, 2.0 * HOUR);
        assert_eq!(at(&live), at(&trainer));
        assert_eq!((at(&live).job.vms_in_window, at(&live).job.long_known), (2.0, 2.0));
        assert_eq!(at(&live).tenant.vms_in_window, 3.0);
        let sizes = live.sizes();
        assert_eq!((sizes.tenants, sizes.jobs, sizes.running_vms), (1, 2, 2));

        // Evicted job histories leave the count too: two histories at most, the tenant's and the
        // latest job's.
        let mut small =
            LiveHistory::new(&FeatureStore::empty(0.0), LiveLimits { max_histories: 2, ..LiveLimits::default() });
        for (vm, vm_type, at_s) in [("a", "x", 10.0), ("b", "y", 20.0), ("c", "z", 30.0)] {
            small.apply(&job(vm, vm_type, at_s));
        }
        let sizes = small.sizes();
        assert_eq!((sizes.tenants, sizes.jobs), (1, 1));
        assert!(small.get(&HistoryKey::Job(crate::history::job_id("t", "z"))).is_some());
    }
}
