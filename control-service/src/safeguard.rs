//! The long-lived-share safeguard (paper 003 s4.3): when more than a threshold share of the model's
//! predictions over the last T minutes say long-lived, the model is presumed broken (a bad bundle, a
//! shift in the workload) and every request is placed as short-lived for a cooldown. Calling a short
//! VM long strands a host for hours; calling a long VM short costs only some packing.
//!
//! Left as a plain fleet-wide share, any one client could switch the model off for everyone: the
//! model calls tenants it has never seen long-lived (it has no history of theirs), so a burst of
//! requests from brand-new tenants, or from one busy tenant, looks exactly like a broken model. Two
//! rules keep the signal about the model:
//! - each tenant contributes at most `max_per_tenant` predictions to a window, so tripping takes
//!   many tenants agreeing, never one;
//! - tenants first seen less than `established_after_s` ago count in a window of their own (the
//!   newcomers'), whose trip places only new tenants as short-lived. A broken model shows in the
//!   established tenants' window, which still stops predictions for everyone.
//!
//! Time is whatever monotonic seconds the caller passes, so the rules are tested without sleeping.

use crate::config::SafeguardConfig;
use domain::{SafeguardStatus, TenantId};
use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

/// Buckets per window: the window slides in steps of `window / BUCKETS`.
const BUCKETS: u64 = 60;

#[derive(Clone, Copy, Debug)]
struct Bucket {
    index: i64,
    long: u64,
    total: u64,
}

#[derive(Debug, Default)]
struct Window {
    buckets: VecDeque<Bucket>,
    long: u64,
    total: u64,
    /// Set while tripped: every request of the window's tenants is short-lived until then.
    active_until_s: Option<f64>,
    trips: u64,
}

/// What the safeguard remembers of one tenant.
#[derive(Clone, Copy, Debug)]
struct TenantSeen {
    first_seen_s: f64,
    last_seen_s: f64,
    /// Predictions counted since `counted_since_s` (at most `max_per_tenant` per window).
    counted: u64,
    counted_since_s: f64,
}

#[derive(Debug, Default)]
struct State {
    /// Established tenants: a trip here stops the model for everyone.
    fleet: Window,
    /// New tenants: a trip here places only new tenants as short-lived.
    newcomers: Window,
    tenants: HashMap<TenantId, TenantSeen>,
}

/// Which window a tenant's predictions count in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cohort {
    Established,
    New,
}

pub struct Safeguard {
    config: SafeguardConfig,
    bucket_s: f64,
    state: Mutex<State>,
}

impl Window {
    fn clear(&mut self) {
        self.buckets.clear();
        self.long = 0;
        self.total = 0;
    }

    /// Drops the buckets that slid out of the window ending at bucket `index`.
    fn evict(&mut self, index: i64) {
        while let Some(front) = self.buckets.front() {
            if front.index > index - BUCKETS as i64 {
                break;
            }
            self.long -= front.long;
            self.total -= front.total;
            self.buckets.pop_front();
        }
    }

    /// Ends a cooldown that is over; the window restarts empty.
    fn expire(&mut self, now_s: f64) {
        if self.active_until_s.is_some_and(|until| now_s >= until) {
            self.active_until_s = None;
            self.clear();
        }
    }

    /// Adds predictions at bucket `index`; true when this trips the window.
    fn add(&mut self, config: &SafeguardConfig, now_s: f64, index: i64, long: u64, total: u64) -> bool {
        if self.active_until_s.is_some() || total == 0 {
            return false;
        }
        self.evict(index);
        match self.buckets.back_mut() {
            Some(bucket) if bucket.index >= index => {
                bucket.long += long;
                bucket.total += total;
            }
            _ => self.buckets.push_back(Bucket { index, long, total }),
        }
        self.long += long;
        self.total += total;
        let share = self.long as f64 / self.total as f64;
        if self.total >= config.min_predictions.max(1) && share > config.threshold {
            self.active_until_s = Some(now_s + config.cooldown_s as f64);
            self.trips += 1;
            self.clear();
            return true;
        }
        false
    }

    fn status(&mut self, now_s: f64, index: i64) -> SafeguardStatus {
        self.expire(now_s);
        self.evict(index);
        SafeguardStatus {
            active: self.active_until_s.is_some(),
            trips: self.trips,
            long_share: if self.total == 0 { 0.0 } else { self.long as f64 / self.total as f64 },
            window_predictions: self.total,
            cooldown_remaining_s: self.active_until_s.map_or(0.0, |until| (until - now_s).max(0.0)),
        }
    }
}

impl Safeguard {
    pub fn new(config: SafeguardConfig) -> Self {
        let bucket_s = (config.window_s as f64 / BUCKETS as f64).max(1e-3);
        Safeguard { config, bucket_s, state: Mutex::new(State::default()) }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // A panic elsewhere cannot leave the counters inconsistent (every update is a few additions),
        // so a poisoned lock is still good to use.
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn index(&self, now_s: f64) -> i64 {
        (now_s / self.bucket_s).floor() as i64
    }

    /// True while the established tenants' window is tripped: the model is presumed broken, place
    /// everything as short-lived without asking it.
    pub fn is_active(&self, now_s: f64) -> bool {
        if !self.config.enabled {
            return false;
        }
        let mut state = self.lock();
        state.fleet.expire(now_s);
        state.fleet.active_until_s.is_some()
    }

    /// True when `tenant`'s VMs must be placed as short-lived now: the fleet-wide window is tripped,
    /// or the tenant is new and the newcomers' window is. Remembers the tenant from its first call.
    pub fn blocks(&self, tenant: &TenantId, now_s: f64) -> bool {
        if !self.config.enabled {
            return false;
        }
        let mut state = self.lock();
        state.fleet.expire(now_s);
        if state.fleet.active_until_s.is_some() {
            return true;
        }
        let cohort = self.see(&mut state, tenant, now_s).0;
        state.newcomers.expire(now_s);
        cohort == Cohort::New && state.newcomers.active_until_s.is_some()
    }

    /// The tenant's cohort now, remembering it (first seen now when unknown), and its record.
    fn see<'a>(&self, state: &'a mut State, tenant: &TenantId, now_s: f64) -> (Cohort, &'a mut TenantSeen) {
        if !state.tenants.contains_key(tenant) && state.tenants.len() >= self.config.max_tenants {
            self.forget_least_recent(state);
        }
        let seen = state.tenants.entry(tenant.clone()).or_insert(TenantSeen {
            first_seen_s: now_s,
            last_seen_s: now_s,
            counted: 0,
            counted_since_s: now_s,
        });
        seen.last_seen_s = seen.last_seen_s.max(now_s);
        let cohort = if now_s - seen.first_seen_s >= self.config.established_after_s as f64 {
            Cohort::Established
        } else {
            Cohort::New
        };
        (cohort, seen)
    }

    /// Makes room: forgets the least recently seen half of the tenants (they count as new when they
    /// come back, the cautious side). Amortised: one sort per `max_tenants / 2` new tenants.
    fn forget_least_recent(&self, state: &mut State) {
        let mut last_seen: Vec<f64> = state.tenants.values().map(|seen| seen.last_seen_s).collect();
        let middle = last_seen.len() / 2;
        let (_, cut, _) = last_seen.select_nth_unstable_by(middle, f64::total_cmp);
        let cut = *cut;
        state.tenants.retain(|_, seen| seen.last_seen_s > cut);
    }

    /// Records `total` model predictions of `tenant`, of which `long` said long-lived, counting at
    /// most `max_per_tenant` of the tenant's per window; true when this tripped a window.
    pub fn observe(&self, now_s: f64, tenant: &TenantId, long: u64, total: u64) -> bool {
        if !self.config.enabled || total == 0 {
            return false;
        }
        let index = self.index(now_s);
        let window_s = self.config.window_s as f64;
        let cap = self.config.max_per_tenant;
        let mut guard = self.lock();
        let state = &mut *guard;
        state.fleet.expire(now_s);
        state.newcomers.expire(now_s);
        let (cohort, seen) = self.see(state, tenant, now_s);
        if now_s - seen.counted_since_s >= window_s {
            seen.counted = 0;
            seen.counted_since_s = now_s;
        }
        let counted = total.min(cap.saturating_sub(seen.counted));
        seen.counted += counted;
        if counted == 0 {
            return false;
        }
        // A request over the cap counts its long share, scaled down to what is counted.
        let long = if counted == total { long } else { long * counted / total };
        let (window, which) = match cohort {
            Cohort::Established => (&mut state.fleet, "everyone"),
            Cohort::New => (&mut state.newcomers, "new tenants"),
        };
        let tripped = window.add(&self.config, now_s, index, long, counted);
        if tripped {
            tracing::warn!(
                threshold = self.config.threshold,
                cooldown_s = self.config.cooldown_s,
                placed_short = which,
                "safeguard tripped: too many long-lived predictions; placing VMs as short-lived"
            );
        }
        tripped
    }

    /// The fleet-wide (established tenants') window.
    pub fn status(&self, now_s: f64) -> SafeguardStatus {
        let index = self.index(now_s);
        self.lock().fleet.status(now_s, index)
    }

    /// The newcomers' window.
    pub fn newcomer_status(&self, now_s: f64) -> SafeguardStatus {
        let index = self.index(now_s);
        self.lock().newcomers.status(now_s, index)
    }

    /// Tenants remembered now.
    pub fn tenants_remembered(&self) -> usize {
        self.lock().tenants.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> SafeguardConfig {
        SafeguardConfig {
            enabled: true,
            window_s: 600,
            threshold: 0.5,
            min_predictions: 10,
            cooldown_s: 60,
            max_per_tenant: 1_000,
            established_after_s: 0,
            max_tenants: 1_000,
        }
    }

    fn safeguard() -> Safeguard {
        Safeguard::new(config())
    }

    fn t(name: &str) -> TenantId {
        TenantId::from(name)
    }

    #[test]
    fn trips_above_the_threshold_and_recovers_after_the_cooldown() {
        let guard = safeguard();
        // 5 long of 10: exactly the threshold, not above it.
        assert!(!guard.observe(0.0, &t("a"), 5, 10));
        assert!(!guard.is_active(1.0));
        assert!(guard.observe(2.0, &t("a"), 2, 2));
        assert!(guard.is_active(2.0));
        assert!(guard.blocks(&t("someone-else"), 2.0));
        assert!(guard.is_active(61.9));
        // Predictions during the cooldown do not count.
        assert!(!guard.observe(30.0, &t("a"), 100, 100));
        let status = guard.status(30.0);
        assert!(status.active);
        assert_eq!((status.trips, status.cooldown_remaining_s), (1, 32.0));
        assert!(!guard.is_active(62.0));
        // The window restarted empty: one long prediction alone cannot trip it again.
        assert!(!guard.observe(63.0, &t("a"), 1, 1));
        assert_eq!(guard.status(63.0).window_predictions, 1);
    }

    #[test]
    fn never_trips_on_fewer_than_the_minimum_predictions() {
        let guard = safeguard();
        assert!(!guard.observe(0.0, &t("a"), 9, 9));
        assert!(guard.observe(0.0, &t("a"), 1, 1));
    }

    #[test]
    fn old_predictions_slide_out_of_the_window() {
        let guard = safeguard();
        assert!(!guard.observe(0.0, &t("a"), 8, 8));
        // Ten minutes later those eight are gone; 2 long of 12 is far below the threshold.
        assert!(!guard.observe(601.0, &t("a"), 2, 12));
        let status = guard.status(601.0);
        assert_eq!(status.window_predictions, 12);
        assert!((status.long_share - 2.0 / 12.0).abs() < 1e-12);
        assert_eq!(guard.status(1_300.0).window_predictions, 0);
    }

    #[test]
    fn a_disabled_safeguard_never_trips() {
        let guard = Safeguard::new(SafeguardConfig { enabled: false, ..SafeguardConfig::default() });
        assert!(!guard.observe(0.0, &t("a"), 1_000, 1_000));
        assert!(!guard.is_active(0.0));
        assert!(!guard.blocks(&t("a"), 0.0));
    }

    #[test]
    fn one_tenant_alone_cannot_trip_it() {
        let guard = Safeguard::new(SafeguardConfig { max_per_tenant: 3, ..config() });
        for i in 0..100 {
            assert!(!guard.observe(f64::from(i), &t("busy"), 1, 1), "request {i}");
        }
        assert_eq!(guard.status(100.0).window_predictions, 3, "only the first three counted");
        assert!(!guard.blocks(&t("other"), 100.0));
        // A window later the tenant counts again, still at most three.
        assert!(!guard.observe(700.0, &t("busy"), 5, 5));
        assert_eq!(guard.status(700.0).window_predictions, 3);
        // A gang over the cap counts its long share scaled down: 1 long of 4 -> 0 of 3 counted.
        let guard = Safeguard::new(SafeguardConfig { max_per_tenant: 3, ..config() });
        assert!(!guard.observe(0.0, &t("g"), 1, 4));
        let status = guard.status(0.0);
        assert_eq!((status.window_predictions, status.long_share), (3, 0.0));
    }

    #[test]
    fn new_tenants_trip_only_their_own_window() {
        let guard = Safeguard::new(SafeguardConfig { established_after_s: 100, ..config() });
        // An established tenant, first seen long ago.
        assert!(!guard.blocks(&t("old"), 0.0));
        assert!(!guard.observe(150.0, &t("old"), 0, 1));
        // Sixty brand-new tenants, all predicted long.
        let tripped = (0..60).filter(|i| guard.observe(200.0, &t(&format!("new{i}")), 1, 1)).count();
        assert_eq!(tripped, 1, "the newcomers' window trips once");
        assert!(guard.newcomer_status(200.0).active);
        assert!(!guard.is_active(200.0), "the fleet-wide window is untouched");
        assert!(!guard.blocks(&t("old"), 200.0), "the established tenant keeps its predictions");
        assert!(guard.blocks(&t("new1"), 200.0));
        assert!(guard.blocks(&t("newest"), 200.0), "a tenant first seen now is new too");
        assert_eq!(guard.status(200.0).window_predictions, 1);
        // A new tenant becomes established with time.
        assert!(!guard.blocks(&t("new1"), 300.0));
    }

    #[test]
    fn tenant_memory_is_bounded() {
        let guard = Safeguard::new(SafeguardConfig { max_tenants: 10, established_after_s: 50, ..config() });
        for i in 0..100 {
            guard.blocks(&t(&format!("t{i}")), f64::from(i));
            assert!(guard.tenants_remembered() <= 10);
        }
    }
}
