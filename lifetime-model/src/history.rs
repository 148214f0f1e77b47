//! History computed only from the past: what a tenant's VMs, and a job identity's VMs, did before a
//! given instant.
//!
//! Two kinds of history ([`HistoryKey`]) are kept alike: a tenant's, and a job identity's (one
//! tenant's VMs of one type: a recurring job, such as Google Borg's logical job name). The trainer
//! replays a trace through [`TenantHistory`] values so that every training example sees exactly what
//! was known when its VM arrived; the same values, snapshotted at the end of training, form the
//! bundle's feature store that the server consults. One code path, no train/serve skew.

use serde::{Deserialize, Serialize};
use std::collections::{HashMap, VecDeque};

/// Most recent starts and completions kept per tenant. Counts in the look-back window saturate here,
/// and lifetime quantiles are over at most this many recent completions.
pub const MAX_EVENTS_PER_TENANT: usize = 128;

/// Most running VMs remembered per tenant (the oldest are forgotten first): what one tenant's
/// history holds stays bounded however many VMs it runs. Training and serving forget alike.
pub const MAX_RUNNING_PER_TENANT: usize = 4_096;

/// What is known about one tenant's past.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct TenantHistory {
    /// Start times of recent VMs, oldest first.
    starts: VecDeque<f64>,
    /// (end time, lifetime) of recently ended VMs, in order of end.
    completed: VecDeque<(f64, f64)>,
    /// Start times of VMs still running, sorted.
    running: Vec<f64>,
}

/// A tenant's past as features, at one instant.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct TenantSummary {
    /// VMs started in the look-back window.
    pub vms_in_window: f64,
    /// VMs known to be long-lived: ended in the window after living at least the threshold, or
    /// still running for at least the threshold.
    pub long_known: f64,
    /// `long_known` over the VMs whose class is known; NaN when none is.
    pub long_share: f64,
    /// Quartiles of log10 lifetime of the VMs that ended in the window; NaN when none did.
    pub log10_lifetime_p25: f64,
    pub log10_lifetime_p50: f64,
    pub log10_lifetime_p75: f64,
    /// VMs running now.
    pub running: f64,
}

/// The past of a request: its tenant's and its job identity's history, as features.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Past {
    pub tenant: TenantSummary,
    pub job: TenantSummary,
}

impl Past {
    /// The past of a request whose tenant and job were never seen before.
    pub fn unknown() -> Self {
        Past { tenant: TenantSummary::unknown(), job: TenantSummary::unknown() }
    }
}

/// Whose past a history holds.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum HistoryKey {
    /// A tenant's VMs.
    Tenant(String),
    /// One tenant's VMs of one type ([`job_id`]).
    Job(String),
}

/// Separates the tenant from the VM type in a job id: tenant ids carry no control characters, so
/// no two (tenant, type) pairs share an id.
const JOB_ID_SEPARATOR: char = '\u{1f}';

/// The id of a job identity: the tenant's VMs of type `vm_type`.
pub fn job_id(tenant_id: &str, vm_type: &str) -> String {
    format!("{tenant_id}{JOB_ID_SEPARATOR}{vm_type}")
}

impl HistoryKey {
    /// The histories a VM counts in: its tenant's (when it has one) and its job identity's (when it
    /// has a type).
    pub fn of(tenant_id: &str, vm_type: &str) -> [Option<HistoryKey>; 2] {
        [
            (!tenant_id.is_empty()).then(|| HistoryKey::Tenant(tenant_id.to_owned())),
            (!vm_type.is_empty()).then(|| HistoryKey::Job(job_id(tenant_id, vm_type))),
        ]
    }

    /// The tenant id, or the job id.
    pub fn id(&self) -> &str {
        let (HistoryKey::Tenant(id) | HistoryKey::Job(id)) = self;
        id
    }
}

/// Where histories are looked up: the bundle's frozen store or a live one.
pub trait Histories {
    fn get(&self, key: &HistoryKey) -> Option<&TenantHistory>;

    /// The history of tenant `tenant_id` (not empty). By default through a [`HistoryKey`]; a store
    /// that can look a tenant up by `&str` does so without building the key (the allocator
    /// encodes every VM it places, issue 32).
    fn tenant(&self, tenant_id: &str) -> Option<&TenantHistory> {
        self.get(&HistoryKey::Tenant(tenant_id.to_owned()))
    }

    /// The history of the job identity of `tenant_id` and `vm_type` (not empty), as
    /// [`Histories::tenant`] for jobs.
    fn job(&self, tenant_id: &str, vm_type: &str) -> Option<&TenantHistory> {
        self.get(&HistoryKey::Job(job_id(tenant_id, vm_type)))
    }

    /// The histories a VM of `tenant_id` and `vm_type` counts in, those [`HistoryKey::of`] names
    /// (none for an empty tenant or type): looked up once, they give the past of every request of
    /// the same tenant and type ([`PastHistories::past`]).
    fn histories(&self, tenant_id: &str, vm_type: &str) -> PastHistories<'_> {
        PastHistories {
            tenant: if tenant_id.is_empty() { None } else { self.tenant(tenant_id) },
            job: if vm_type.is_empty() { None } else { self.job(tenant_id, vm_type) },
        }
    }

    /// The past of a VM of `tenant_id` and `vm_type` as of `now_s`, over a look-back window of
    /// `window_s`, counting VMs of at least `long_threshold_s` as long-lived: the summaries of
    /// [`Histories::histories`].
    fn past(&self, tenant_id: &str, vm_type: &str, now_s: f64, window_s: f64, long_threshold_s: f64) -> Past {
        self.histories(tenant_id, vm_type).past(now_s, window_s, long_threshold_s)
    }
}

/// The tenant's and the job's histories of a VM ([`Histories::histories`]), `None` when unknown.
#[derive(Clone, Copy, Debug)]
pub struct PastHistories<'a> {
    pub tenant: Option<&'a TenantHistory>,
    pub job: Option<&'a TenantHistory>,
}

impl PastHistories<'_> {
    /// The past as of `now_s`, over a look-back window of `window_s`, counting VMs of at least
    /// `long_threshold_s` as long-lived (an unknown history: [`TenantSummary::unknown`]).
    pub fn past(&self, now_s: f64, window_s: f64, long_threshold_s: f64) -> Past {
        let summary = |history: Option<&TenantHistory>| {
            history.map_or(TenantSummary::unknown(), |history| history.summary(now_s, window_s, long_threshold_s))
        };
        Past { tenant: summary(self.tenant), job: summary(self.job) }
    }
}

/// Calls `f` with the job id of `tenant_id` and `vm_type` ([`job_id`]), built on the stack when it
/// fits: looking a job up by `&str` then allocates nothing.
fn with_job_id<R>(tenant_id: &str, vm_type: &str, f: impl FnOnce(&str) -> R) -> R {
    let mut buffer = [0u8; 256];
    let mut separator = [0u8; 4];
    let separator = JOB_ID_SEPARATOR.encode_utf8(&mut separator).as_bytes();
    let len = tenant_id.len() + separator.len() + vm_type.len();
    if let Some(id) = buffer.get_mut(..len) {
        let (tenant, rest) = id.split_at_mut(tenant_id.len());
        let (sep, vm_type_bytes) = rest.split_at_mut(separator.len());
        tenant.copy_from_slice(tenant_id.as_bytes());
        sep.copy_from_slice(separator);
        vm_type_bytes.copy_from_slice(vm_type.as_bytes());
        // Three UTF-8 strings end to end are UTF-8.
        if let Ok(id) = std::str::from_utf8(id) {
            return f(id);
        }
    }
    f(&job_id(tenant_id, vm_type))
}

impl TenantSummary {
    /// The summary of a tenant never seen before.
    pub fn unknown() -> Self {
        TenantSummary {
            vms_in_window: 0.0,
            long_known: 0.0,
            long_share: f64::NAN,
            log10_lifetime_p25: f64::NAN,
            log10_lifetime_p50: f64::NAN,
            log10_lifetime_p75: f64::NAN,
            running: 0.0,
        }
    }
}

impl TenantHistory {
    /// Records a VM start. Times are kept to the second: finer adds nothing to the features and
    /// would only bloat the feature store.
    pub fn record_start(&mut self, start_s: f64) {
        let start_s = start_s.round();
        if self.starts.len() == MAX_EVENTS_PER_TENANT {
            self.starts.pop_front();
        }
        self.starts.push_back(start_s);
        if self.running.len() == MAX_RUNNING_PER_TENANT {
            self.running.remove(0);
        }
        let at = self.running.partition_point(|&s| s <= start_s);
        self.running.insert(at, start_s);
    }

    /// Records that a VM started at `start_s` ended at `end_s`.
    pub fn record_end(&mut self, start_s: f64, end_s: f64) {
        let (start_s, end_s) = (start_s.round(), end_s.round());
        if let Some(at) = self.running.iter().position(|&s| s == start_s) {
            self.running.remove(at);
        }
        if self.completed.len() == MAX_EVENTS_PER_TENANT {
            self.completed.pop_front();
        }
        self.completed.push_back((end_s, end_s - start_s));
    }

    /// The tenant's past as seen at `now_s`, over a look-back window of `window_s`, counting VMs of
    /// at least `long_threshold_s` as long-lived.
    pub fn summary(&self, now_s: f64, window_s: f64, long_threshold_s: f64) -> TenantSummary {
        let since = now_s - window_s;
        let vms_in_window = self.starts.iter().filter(|&&s| s > since && s <= now_s).count() as f64;
        // The lifetimes ended in the window, on the stack when they fit (a history keeps at most
        // `MAX_EVENTS_PER_TENANT`; one read from a file may hold more): the allocator takes a
        // summary for every VM it places (issue 32).
        let mut stack = [0.0; MAX_EVENTS_PER_TENANT];
        let mut heap = Vec::new();
        let in_window = self.completed.iter().filter(|&&(end, _)| end > since && end <= now_s).map(|&(_, life)| life);
        let lifetimes: &mut [f64] = if self.completed.len() <= stack.len() {
            let mut len = 0;
            for (slot, life) in stack.iter_mut().zip(in_window) {
                *slot = life;
                len += 1;
            }
            &mut stack[..len]
        } else {
            heap.extend(in_window);
            &mut heap
        };
        let running_long = self.running.iter().filter(|&&s| s <= now_s - long_threshold_s).count() as f64;
        let completed_long = lifetimes.iter().filter(|&&l| l >= long_threshold_s).count() as f64;
        let known = lifetimes.len() as f64 + running_long;
        let long_known = completed_long + running_long;
        // The quartiles are the lifetimes of three ranks in sorted order. Each is put in place by a
        // selection, no sort needed: the median's, then the lower quartile's among the lifetimes
        // left of it (all at most the median), the upper's among those right of it. Values equal
        // under `total_cmp` have the same bits, so any order of equal values reads the same.
        let rank = |q: f64| ((q * lifetimes.len() as f64).ceil() as usize).clamp(1, lifetimes.len().max(1)) - 1;
        let (r25, r50, r75) = (rank(0.25), rank(0.50), rank(0.75));
        if !lifetimes.is_empty() {
            lifetimes.select_nth_unstable_by(r50, f64::total_cmp);
            if r25 < r50 {
                lifetimes[..r50].select_nth_unstable_by(r25, f64::total_cmp);
            }
            if r75 > r50 {
                lifetimes[r50 + 1..].select_nth_unstable_by(r75 - r50 - 1, f64::total_cmp);
            }
        }
        let log_quantile = |index: usize| -> f64 {
            if lifetimes.is_empty() {
                return f64::NAN;
            }
            lifetimes[index].max(1.0).log10()
        };
        TenantSummary {
            vms_in_window,
            long_known,
            long_share: if known > 0.0 { long_known / known } else { f64::NAN },
            log10_lifetime_p25: log_quantile(r25),
            log10_lifetime_p50: log_quantile(r50),
            log10_lifetime_p75: log_quantile(r75),
            running: self.running.iter().filter(|&&s| s <= now_s).count() as f64,
        }
    }

    /// Latest event time, to drop tenants idle for longer than the window from a snapshot.
    pub fn last_activity(&self) -> f64 {
        let last_start = self.starts.back().copied().unwrap_or(f64::NEG_INFINITY);
        let last_end = self.completed.back().map_or(f64::NEG_INFINITY, |&(end, _)| end);
        let running = if self.running.is_empty() { f64::NEG_INFINITY } else { f64::INFINITY };
        last_start.max(last_end).max(running)
    }
}

/// Histories by tenant id and by job id: the feature store of a model bundle.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct FeatureStore {
    /// Instant the store was snapshotted at (end of the training data).
    pub as_of_s: f64,
    pub tenants: HashMap<String, TenantHistory>,
    /// Job identities by [`job_id`] (none in bundles older than the job features).
    #[serde(default, skip_serializing_if = "HashMap::is_empty")]
    pub jobs: HashMap<String, TenantHistory>,
}

impl Histories for FeatureStore {
    fn get(&self, key: &HistoryKey) -> Option<&TenantHistory> {
        match key {
            HistoryKey::Tenant(id) => self.tenants.get(id),
            HistoryKey::Job(id) => self.jobs.get(id),
        }
    }

    fn tenant(&self, tenant_id: &str) -> Option<&TenantHistory> {
        self.tenants.get(tenant_id)
    }

    fn job(&self, tenant_id: &str, vm_type: &str) -> Option<&TenantHistory> {
        if self.jobs.is_empty() {
            return None;
        }
        with_job_id(tenant_id, vm_type, |id| self.jobs.get(id))
    }
}

impl FeatureStore {
    /// An empty store as of `as_of_s`.
    pub fn empty(as_of_s: f64) -> Self {
        FeatureStore { as_of_s, ..FeatureStore::default() }
    }

    /// Every history, tenants first.
    pub fn iter(&self) -> impl Iterator<Item = (HistoryKey, &TenantHistory)> {
        let tenants = self.tenants.iter().map(|(id, h)| (HistoryKey::Tenant(id.clone()), h));
        tenants.chain(self.jobs.iter().map(|(id, h)| (HistoryKey::Job(id.clone()), h)))
    }

    /// The map that holds histories of `key`'s kind.
    fn of_kind(&mut self, key: &HistoryKey) -> &mut HashMap<String, TenantHistory> {
        match key {
            HistoryKey::Tenant(_) => &mut self.tenants,
            HistoryKey::Job(_) => &mut self.jobs,
        }
    }

    /// Records that a VM of `tenant_id` and `vm_type` started at `start_s`.
    pub fn record_start(&mut self, tenant_id: &str, vm_type: &str, start_s: f64) {
        for key in HistoryKey::of(tenant_id, vm_type).into_iter().flatten() {
            self.of_kind(&key).entry(key.id().to_owned()).or_default().record_start(start_s);
        }
    }

    /// Records that a VM of `tenant_id` and `vm_type` started at `start_s` ended at `end_s`.
    pub fn record_end(&mut self, tenant_id: &str, vm_type: &str, start_s: f64, end_s: f64) {
        for key in HistoryKey::of(tenant_id, vm_type).into_iter().flatten() {
            if let Some(history) = self.of_kind(&key).get_mut(key.id()) {
                history.record_end(start_s, end_s);
            }
        }
    }

    /// This store as of `as_of_s`, keeping only histories active within `window_s` of it (or with
    /// VMs still running), the others contributing nothing but empty windows; and only the tenants'
    /// or the jobs' when the model reads them.
    pub fn snapshot(self, as_of_s: f64, window_s: f64, tenants: bool, jobs: bool) -> Self {
        let keep = |keep: bool, histories: HashMap<String, TenantHistory>| -> HashMap<String, TenantHistory> {
            if !keep {
                return HashMap::new();
            }
            histories.into_iter().filter(|(_, h)| h.last_activity() > as_of_s - window_s).collect()
        };
        FeatureStore { as_of_s, tenants: keep(tenants, self.tenants), jobs: keep(jobs, self.jobs) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOUR: f64 = 3_600.0;

    #[test]
    fn summary_sees_only_the_past_and_the_window() {
        // Events are recorded as they happen, so summaries are taken in time order.
        let mut h = TenantHistory::default();
        h.record_start(0.0);
        h.record_start(10.0);
        h.record_start(20.0);
        let early = h.summary(100.0, 24.0 * HOUR, 2.0 * HOUR);
        assert_eq!((early.vms_in_window, early.running), (3.0, 3.0));
        assert!(early.long_share.is_nan() && early.log10_lifetime_p50.is_nan());

        h.record_end(10.0, 10.0 + 600.0); // short-lived, ended at 610 s
        let at = |t| h.summary(t, 24.0 * HOUR, 2.0 * HOUR);
        let later = at(3.0 * HOUR);
        assert_eq!(later.running, 2.0);
        assert_eq!(later.long_known, 2.0); // the two running for over 2 h
        assert_eq!(later.long_share, 2.0 / 3.0);
        assert!((later.log10_lifetime_p50 - 600f64.log10()).abs() < 1e-12);

        let much_later = at(30.0 * HOUR);
        assert_eq!(much_later.vms_in_window, 0.0);
        assert!(much_later.log10_lifetime_p50.is_nan()); // the completion left the window
        assert_eq!(much_later.long_share, 1.0);
    }

    #[test]
    fn a_summary_of_more_completions_than_a_history_keeps_is_the_same_as_of_its_latest() {
        // A history read from a file may hold more completions than one recorded here keeps.
        let completed: Vec<(f64, f64)> =
            (0..300).map(|i| (1_000.0 + f64::from(i), f64::from((i * 37) % 500))).collect();
        let long: TenantHistory =
            serde_json::from_value(serde_json::json!({"starts": [], "completed": completed, "running": []})).unwrap();
        let recent: TenantHistory = serde_json::from_value(
            serde_json::json!({"starts": [], "completed": completed[300 - MAX_EVENTS_PER_TENANT..], "running": []}),
        )
        .unwrap();
        // A window that sees only the latest completions reads the same from both.
        let window = (MAX_EVENTS_PER_TENANT as f64) - 0.5;
        let (a, b) = (long.summary(1_299.0, window, 200.0), recent.summary(1_299.0, window, 200.0));
        assert_eq!(format!("{a:?}"), format!("{b:?}"));
        assert!(a.log10_lifetime_p50.is_finite());
        // And the whole window counts every completion.
        assert_eq!(
            long.summary(1_299.0, 1e6, 200.0).long_known,
            completed.iter().filter(|c| c.1 >= 200.0).count() as f64
        );
    }

    #[test]
    fn quartiles_are_those_of_the_sorted_lifetimes() {
        // Every count from 1 to 40, with ties, zeros and subsecond lifetimes.
        for n in 1..=40u32 {
            let completed: Vec<(f64, f64)> =
                (0..n).map(|i| (100.0 + f64::from(i), f64::from((i * 7919) % 13) * 0.5)).collect();
            let history: TenantHistory =
                serde_json::from_value(serde_json::json!({"starts": [], "completed": completed, "running": []}))
                    .unwrap();
            let summary = history.summary(200.0, 1_000.0, 1e9);
            let mut sorted: Vec<f64> = completed.iter().map(|c| c.1).collect();
            sorted.sort_by(f64::total_cmp);
            let quartile = |q: f64| {
                let index = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len()) - 1;
                sorted[index].max(1.0).log10()
            };
            assert_eq!(
                [summary.log10_lifetime_p25, summary.log10_lifetime_p50, summary.log10_lifetime_p75].map(f64::to_bits),
                [quartile(0.25), quartile(0.5), quartile(0.75)].map(f64::to_bits),
                "{n} lifetimes"
            );
        }
    }

    #[test]
    fn tenants_and_jobs_are_found_by_their_ids_without_keys() {
        let mut store = FeatureStore::empty(0.0);
        let long_type = "x".repeat(300);
        for (tenant, vm_type) in [("t", "nightly"), ("t", long_type.as_str()), ("", "nightly")] {
            store.record_start(tenant, vm_type, 0.0);
        }
        for (tenant, vm_type) in [("t", "nightly"), ("t", long_type.as_str()), ("", "nightly"), ("t", "web")] {
            let key = HistoryKey::Job(job_id(tenant, vm_type));
            assert_eq!(store.job(tenant, vm_type), store.get(&key), "{tenant}/{vm_type}");
        }
        assert!(store.job("t", &long_type).is_some(), "an id longer than the stack buffer");
        assert_eq!(store.tenant("t"), store.get(&HistoryKey::Tenant("t".to_owned())));
        assert!(store.tenant("u").is_none());
        // Without a tenant or a type, no history of that kind, as `HistoryKey::of` says.
        let past = store.past("", "nightly", HOUR, 24.0 * HOUR, 2.0 * HOUR);
        assert_eq!((past.tenant.running, past.job.running), (0.0, 1.0));
    }

    #[test]
    fn snapshot_drops_idle_tenants_but_keeps_running_ones() {
        let mut idle = TenantHistory::default();
        idle.record_start(0.0);
        idle.record_end(0.0, 10.0);
        let mut running = TenantHistory::default();
        running.record_start(0.0);
        let tenants = HashMap::from([("idle".to_owned(), idle), ("running".to_owned(), running)]);
        let store =
            FeatureStore { tenants, ..FeatureStore::empty(0.0) }.snapshot(100.0 * HOUR, 24.0 * HOUR, true, true);
        assert!(store.get(&HistoryKey::Tenant("idle".into())).is_none());
        assert!(store.get(&HistoryKey::Tenant("running".into())).is_some());
    }

    #[test]
    fn a_vm_counts_in_its_tenants_history_and_its_jobs() {
        let mut store = FeatureStore::empty(0.0);
        store.record_start("t", "nightly", 0.0);
        store.record_start("t", "web", 0.0);
        store.record_start("u", "nightly", 0.0);
        store.record_end("t", "nightly", 0.0, 600.0);
        let past = store.past("t", "nightly", HOUR, 24.0 * HOUR, 2.0 * HOUR);
        assert_eq!((past.tenant.vms_in_window, past.tenant.running), (2.0, 1.0));
        assert_eq!((past.job.vms_in_window, past.job.running), (1.0, 0.0));
        assert!((past.job.log10_lifetime_p50 - 600f64.log10()).abs() < 1e-12);
        // Another tenant's job of the same name is another job; a VM without a tenant or type has
        // no history of that kind.
        assert_eq!(store.past("u", "nightly", HOUR, 24.0 * HOUR, 2.0 * HOUR).job.running, 1.0);
        assert_eq!(HistoryKey::of("", ""), [None, None]);
        // Tenants-only snapshots (a model without the job features) drop the jobs.
        let tenants_only = store.snapshot(HOUR, 24.0 * HOUR, true, false);
        assert!(tenants_only.jobs.is_empty() && tenants_only.tenants.len() == 2);
    }
}
