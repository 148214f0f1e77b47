//! Realized outcomes of lifetime predictions: which VMs were placed with a model's prediction,
//! and, once each is resolved, how that prediction fared. A VM resolves when it exits (long-lived
//! if it lived at least the threshold) or when it outlives the threshold while still running
//! (long-lived, as the trainer labels a censored VM that ran past it). Outcomes go to a sliding
//! window per model version, so a stable model and its canary are judged apart.
//!
//! An outcome enters its window only once its cohort is complete: when every VM that started with
//! it has resolved, that is `threshold` after its start. Short-lived VMs resolve within the
//! threshold and long-lived ones only at it, so a window of whatever resolved so far would hold the
//! short ones of the recent starts without their long ones, and a good model's precision would
//! read low for the first threshold after every start of serving.
//!
//! Times are on the model's clock: the request times VMs carried and the exit times releases
//! name, not the allocator's wall clock (a replay compresses time). The tracker's clock is the
//! latest such time seen.

use domain::prediction::DEFAULT_LONG_THRESHOLD_S;
use domain::quality::{QualityReport, QualityTally, ResolvedOutcome, VersionQuality};
use domain::{LifetimeClass, LifetimePrediction, VmId};
use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap, VecDeque};
use std::sync::Arc;

/// How outcomes are resolved and kept.
#[derive(Clone, Debug, PartialEq)]
pub struct OutcomeConfig {
    /// Lifetime at and above which a VM is long-lived (the model's threshold).
    pub long_threshold_s: f64,
    /// Most outcomes kept per version (the sliding window).
    pub window: usize,
    /// Most versions kept; the least recently seen is dropped first.
    pub max_versions: usize,
    /// Most VMs awaiting their outcome; beyond it new ones are not tracked (counted).
    pub max_pending: usize,
}

impl Default for OutcomeConfig {
    fn default() -> Self {
        OutcomeConfig {
            long_threshold_s: DEFAULT_LONG_THRESHOLD_S,
            window: 5_000,
            max_versions: 8,
            max_pending: 1_000_000,
        }
    }
}

/// A VM placed with a model's prediction, awaiting its outcome.
#[derive(Clone, Debug)]
struct Pending {
    version: Arc<str>,
    p_long: f64,
    predicted_long: bool,
    expected_lifetime_s: Option<f64>,
    start_s: f64,
}

#[derive(Debug)]
struct VersionWindow {
    version: Arc<str>,
    resolved_total: u64,
    pending: u64,
    outcomes: VecDeque<ResolvedOutcome>,
    /// Order of the last time the version was seen (placed or resolved), for eviction.
    last_seen: u64,
}

/// See the module documentation.
#[derive(Debug)]
pub struct OutcomeTracker {
    config: OutcomeConfig,
    clock_s: f64,
    /// By VM id, shared with its deadline (one allocation per VM).
    pending: HashMap<Arc<str>, Pending>,
    /// (start + threshold, VM): when a still-running VM resolves as long-lived. Entries of VMs that
    /// resolved otherwise are skipped when they come up (their start no longer matches).
    deadlines: BinaryHeap<Reverse<(Deadline, Arc<str>)>>,
    /// Resolved outcomes by (start + threshold, order): each enters its window when the clock
    /// reaches its key (its cohort complete).
    maturing: BTreeMap<(Deadline, u64), (Arc<str>, ResolvedOutcome)>,
    versions: Vec<VersionWindow>,
    seen: u64,
    /// VMs not tracked because `max_pending` were awaiting their outcome.
    untracked: u64,
}

/// A deadline in seconds, ordered (finite by construction).
#[derive(Clone, Copy, Debug, PartialEq)]
struct Deadline(f64);

impl Eq for Deadline {}

impl PartialOrd for Deadline {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Deadline {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0.total_cmp(&other.0)
    }
}

impl OutcomeTracker {
    pub fn new(config: OutcomeConfig) -> Self {
        OutcomeTracker {
            config,
            clock_s: f64::NEG_INFINITY,
            pending: HashMap::new(),
            deadlines: BinaryHeap::new(),
            maturing: BTreeMap::new(),
            versions: Vec::new(),
            seen: 0,
            untracked: 0,
        }
    }

    pub fn config(&self) -> &OutcomeConfig {
        &self.config
    }

    /// The latest time seen (minus infinity before any).
    pub fn clock_s(&self) -> f64 {
        self.clock_s
    }

    /// VMs awaiting their outcome.
    pub fn pending(&self) -> usize {
        self.pending.len()
    }

    /// VMs not tracked because too many were pending.
    pub fn untracked(&self) -> u64 {
        self.untracked
    }

    /// A VM was placed at `start_s` (its request time) with `prediction`. Only a model's answer is
    /// tracked (one that names its version: also a shadow answer the safeguard overrode); a VM
    /// placed again under the same id starts afresh.
    pub fn placed(&mut self, vm: &VmId, prediction: Option<&LifetimePrediction>, start_s: f64) {
        let Some(prediction) = prediction else { return };
        let Some(version) = prediction.model_version.as_deref() else { return };
        if !start_s.is_finite() {
            return;
        }
        self.advance(start_s);
        let known = self.pending.get_key_value(vm.as_str()).map(|(key, _)| Arc::clone(key));
        if known.is_none() && self.pending.len() >= self.config.max_pending {
            self.untracked += 1;
            return;
        }
        let version = self.touch(version);
        let pending = Pending {
            version: Arc::clone(&version),
            p_long: prediction.p_long,
            predicted_long: prediction.class == LifetimeClass::Long,
            expected_lifetime_s: prediction.expected_lifetime_s,
            start_s,
        };
        let key = known.unwrap_or_else(|| Arc::from(vm.as_str()));
        if let Some(previous) = self.pending.insert(Arc::clone(&key), pending) {
            if let Some(window) = self.window_mut(&previous.version) {
                window.pending = window.pending.saturating_sub(1);
            }
        }
        if let Some(window) = self.window_mut(&version) {
            window.pending += 1;
        }
        self.deadlines.push(Reverse((Deadline(start_s + self.config.long_threshold_s), key)));
    }

    /// A VM exited at `ended_at_s` (the tracker's clock when unknown): its outcome resolves unless
    /// it already did (it outlived the threshold).
    pub fn released(&mut self, vm: &VmId, ended_at_s: Option<f64>) {
        if let Some(end) = ended_at_s.filter(|t| t.is_finite()) {
            self.advance(end);
        }
        let Some(pending) = self.pending.remove(vm.as_str()) else { return };
        let end = ended_at_s.filter(|t| t.is_finite()).unwrap_or(self.clock_s).max(pending.start_s);
        let lifetime_s = end - pending.start_s;
        let lifetime_log10_error = pending
            .expected_lifetime_s
            .filter(|e| e.is_finite())
            .map(|expected| expected.max(1.0).log10() - lifetime_s.max(1.0).log10());
        self.resolve(
            pending,
            ResolvedOutcome {
                p_long: 0.0,
                predicted_long: false,
                realized_long: lifetime_s >= self.config.long_threshold_s,
                lifetime_log10_error,
            },
        );
        self.mature();
    }

    /// Moves the clock to `now_s` (never back): VMs still running past the threshold resolve as
    /// long-lived.
    pub fn advance(&mut self, now_s: f64) {
        if !now_s.is_finite() || now_s <= self.clock_s {
            return;
        }
        self.clock_s = now_s;
        while let Some(Reverse((Deadline(due), _))) = self.deadlines.peek() {
            if *due > now_s {
                break;
            }
            let Some(Reverse((Deadline(due), vm))) = self.deadlines.pop() else { break };
            let current = self.pending.get(&*vm).is_some_and(|p| p.start_s + self.config.long_threshold_s == due);
            if current {
                if let Some(pending) = self.pending.remove(&*vm) {
                    let outcome = ResolvedOutcome {
                        p_long: 0.0,
                        predicted_long: false,
                        realized_long: true,
                        lifetime_log10_error: None,
                    };
                    self.resolve(pending, outcome);
                }
            }
        }
        self.mature();
    }

    /// Moves the outcomes whose cohort is complete into their windows.
    fn mature(&mut self) {
        let capacity = self.config.window.max(1);
        while let Some(entry) = self.maturing.first_entry() {
            if entry.key().0 .0 > self.clock_s {
                break;
            }
            let (version, outcome) = entry.remove();
            let order = self.next_seen();
            if let Some(window) = self.window_mut(&version) {
                window.pending = window.pending.saturating_sub(1);
                window.resolved_total += 1;
                window.last_seen = order;
                if window.outcomes.len() == capacity {
                    window.outcomes.pop_front();
                }
                window.outcomes.push_back(outcome);
            }
        }
    }

    /// Forgets the VMs awaiting their outcome (the allocator rebuilds its state and places them
    /// again); resolved outcomes stay.
    pub fn forget_pending(&mut self) {
        self.pending.clear();
        self.deadlines.clear();
        for window in &mut self.versions {
            window.pending =
                self.maturing.values().filter(|(version, _)| Arc::ptr_eq(version, &window.version)).count() as u64;
        }
    }

    fn resolve(&mut self, pending: Pending, mut outcome: ResolvedOutcome) {
        outcome.p_long = pending.p_long;
        outcome.predicted_long = pending.predicted_long;
        let order = self.next_seen();
        let complete = Deadline(pending.start_s + self.config.long_threshold_s);
        self.maturing.insert((complete, order), (pending.version, outcome));
    }

    fn next_seen(&mut self) -> u64 {
        self.seen += 1;
        self.seen
    }

    /// The version's shared name, its window created (evicting the least recently seen) if new.
    fn touch(&mut self, version: &str) -> Arc<str> {
        let order = self.next_seen();
        if let Some(window) = self.versions.iter_mut().find(|w| &*w.version == version) {
            window.last_seen = order;
            return Arc::clone(&window.version);
        }
        if self.versions.len() >= self.config.max_versions.max(1) {
            if let Some(oldest) = self.versions.iter().enumerate().min_by_key(|(_, w)| w.last_seen).map(|(i, _)| i) {
                let dropped = self.versions.swap_remove(oldest);
                // Its pending VMs and outcomes go with it.
                self.pending.retain(|_, p| !Arc::ptr_eq(&p.version, &dropped.version));
                self.maturing.retain(|_, (version, _)| !Arc::ptr_eq(version, &dropped.version));
            }
        }
        let name: Arc<str> = Arc::from(version);
        self.versions.push(VersionWindow {
            version: Arc::clone(&name),
            resolved_total: 0,
            pending: 0,
            outcomes: VecDeque::new(),
            last_seen: order,
        });
        name
    }

    fn window_mut(&mut self, version: &Arc<str>) -> Option<&mut VersionWindow> {
        self.versions.iter_mut().find(|w| Arc::ptr_eq(&w.version, version) || w.version == *version)
    }

    /// The windows' figures, most recently seen version first.
    pub fn report(&self) -> QualityReport {
        let mut versions: Vec<&VersionWindow> = self.versions.iter().collect();
        versions.sort_by_key(|w| Reverse(w.last_seen));
        QualityReport {
            long_threshold_s: self.config.long_threshold_s,
            window: self.config.window as u64,
            clock_s: if self.clock_s.is_finite() { self.clock_s } else { 0.0 },
            versions: versions
                .into_iter()
                .map(|w| {
                    let window = QualityTally::of(&w.outcomes);
                    VersionQuality {
                        version: w.version.to_string(),
                        resolved_total: w.resolved_total,
                        pending: w.pending,
                        figures: window.figures(),
                        window,
                    }
                })
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use domain::PredictionSource;

    fn prediction(version: &str, p_long: f64) -> LifetimePrediction {
        LifetimePrediction {
            p_long,
            class: if p_long >= 0.5 { LifetimeClass::Long } else { LifetimeClass::Short },
            interval_class: None,
            expected_lifetime_s: Some(if p_long >= 0.5 { 36_000.0 } else { 600.0 }),
            model_version: Some(version.to_owned()),
            source: PredictionSource::Model,
        }
    }

    fn tracker() -> OutcomeTracker {
        OutcomeTracker::new(OutcomeConfig { long_threshold_s: 100.0, window: 4, max_versions: 2, max_pending: 10 })
    }

    #[test]
    fn exits_and_vms_outliving_the_threshold_resolve_once_with_the_trainers_label() {
        let mut t = tracker();
        t.placed(&"a".into(), Some(&prediction("v1", 0.9)), 0.0);
        t.placed(&"b".into(), Some(&prediction("v1", 0.2)), 0.0);
        t.placed(&"c".into(), Some(&prediction("v1", 0.8)), 10.0);
        t.released(&"b".into(), Some(30.0));
        // b resolved short, but its cohort (started at 0) is complete only at 100.
        assert_eq!(t.report().versions[0].window.resolved, 0);
        assert_eq!(t.report().versions[0].pending, 3);
        // a runs past its threshold at 100: long-lived, before it exits; the 0 cohort is complete.
        t.advance(100.0);
        let report = t.report();
        assert_eq!((report.versions[0].window.resolved, report.versions[0].window.realized_long), (2, 1));
        // c exits at 105 (its deadline is 110): lived 95 s, short; it enters the window at 110.
        t.released(&"c".into(), Some(105.0));
        t.released(&"a".into(), Some(150.0));
        let figures = t.report().versions[0].figures.clone();
        assert_eq!(figures.resolved, 3, "a resolved once");
        assert_eq!(figures.precision, Some(0.5));
        assert_eq!(figures.recall, Some(1.0));
        assert_eq!((t.pending(), t.report().versions[0].pending), (0, 0));
    }

    #[test]
    fn a_window_holds_complete_cohorts_so_early_exits_do_not_bias_it() {
        // A perfect model: VMs said long live 150 s, VMs said short 20 s. Half a threshold after
        // the start only the short ones have exited; the window must not read precision 0.
        let mut t = OutcomeTracker::new(OutcomeConfig { window: 100, ..tracker().config().clone() });
        for i in 0..10 {
            let long = i % 2 == 0;
            t.placed(&VmId(format!("v{i}")), Some(&prediction("v1", if long { 0.9 } else { 0.1 })), f64::from(i));
        }
        for i in (1..10).step_by(2) {
            t.released(&VmId(format!("v{i}")), Some(f64::from(i) + 20.0));
        }
        assert_eq!(t.report().versions[0].window.resolved, 0, "no cohort complete at 29");
        t.advance(150.0);
        let figures = t.report().versions[0].figures.clone();
        assert_eq!((figures.resolved, figures.precision, figures.recall), (10, Some(1.0), Some(1.0)));
    }

    #[test]
    fn versions_are_judged_apart_and_unversioned_predictions_are_not_tracked() {
        let mut t = tracker();
        t.placed(&"s".into(), Some(&prediction("stable", 0.9)), 0.0);
        t.placed(&"c".into(), Some(&prediction("canary", 0.1)), 0.0);
        t.placed(&"f".into(), Some(&LifetimePrediction::fallback(PredictionSource::FallbackTimeout)), 0.0);
        t.placed(&"n".into(), None, 0.0);
        assert_eq!(t.pending(), 2);
        t.released(&"s".into(), Some(500.0));
        t.released(&"c".into(), Some(500.0));
        let report = t.report();
        assert_eq!(report.version("stable").unwrap().figures.precision, Some(1.0));
        assert_eq!(report.version("canary").unwrap().figures.recall, Some(0.0));
    }

    #[test]
    fn the_window_keeps_the_last_outcomes_and_old_versions_make_room() {
        let mut t = tracker();
        for i in 0..6 {
            let id = VmId(format!("v{i}"));
            t.placed(&id, Some(&prediction("v1", 0.9)), f64::from(i));
            t.released(&id, Some(f64::from(i) + 1.0));
        }
        t.advance(200.0);
        let v1 = t.report().versions[0].clone();
        assert_eq!((v1.resolved_total, v1.window.resolved), (6, 4));
        t.placed(&"x".into(), Some(&prediction("v2", 0.9)), 210.0);
        t.placed(&"y".into(), Some(&prediction("v3", 0.9)), 210.0);
        let names: Vec<_> = t.report().versions.into_iter().map(|v| v.version).collect();
        assert_eq!(names, ["v3", "v2"]);
    }

    #[test]
    fn pending_vms_are_bounded_and_times_never_go_back() {
        let mut t = tracker();
        for i in 0..12 {
            t.placed(&VmId(format!("v{i}")), Some(&prediction("v1", 0.3)), 5.0);
        }
        assert_eq!((t.pending(), t.untracked()), (10, 2));
        // An exit before the start counts as a zero lifetime; a NaN end uses the clock.
        t.released(&"v0".into(), Some(1.0));
        t.released(&"v1".into(), Some(f64::NAN));
        let report = t.report();
        assert_eq!(report.clock_s, 5.0);
        assert_eq!(report.versions[0].pending, 10, "8 running, 2 resolved awaiting their cohort");
        t.forget_pending();
        assert_eq!((t.pending(), t.report().versions[0].pending), (0, 2));
        t.advance(1_000.0);
        let window = t.report().versions[0].window.clone();
        assert_eq!((window.resolved, window.realized_long), (2, 0));
    }

    #[test]
    fn the_lifetime_error_is_in_log10_seconds() {
        let mut t = tracker();
        t.placed(&"a".into(), Some(&prediction("v1", 0.2)), 0.0);
        t.released(&"a".into(), Some(60.0));
        t.advance(100.0);
        let figures = t.report().versions[0].figures.clone();
        // Predicted 600 s, lived 60 s: one decade too long.
        assert!((figures.lifetime_log10_bias.unwrap() - 1.0).abs() < 1e-12);
    }
}
