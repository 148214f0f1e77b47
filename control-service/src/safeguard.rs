//! The long-lived-share safeguard (paper 003 s4.3): when more than a threshold share of the model's
//! predictions over the last T minutes say long-lived, the model is presumed broken (a bad bundle, a
//! shift in the workload) and every request is placed as short-lived for a cooldown. Calling a short
//! VM long strands a host for hours; calling a long VM short costs only some packing.
//!
//! Time is whatever monotonic seconds the caller passes, so the rules are tested without sleeping.

use crate::config::SafeguardConfig;
use domain::SafeguardStatus;
use std::collections::VecDeque;
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
    /// Set while tripped: every request is short-lived until then.
    active_until_s: Option<f64>,
    trips: u64,
}

pub struct Safeguard {
    config: SafeguardConfig,
    bucket_s: f64,
    window: Mutex<Window>,
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
}

impl Safeguard {
    pub fn new(config: SafeguardConfig) -> Self {
        let bucket_s = (config.window_s as f64 / BUCKETS as f64).max(1e-3);
        Safeguard { config, bucket_s, window: Mutex::new(Window::default()) }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Window> {
        // A panic elsewhere cannot leave the counters inconsistent (every update is a few additions),
        // so a poisoned lock is still good to use.
        self.window.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// True while tripped: place everything as short-lived without asking the model.
    pub fn is_active(&self, now_s: f64) -> bool {
        if !self.config.enabled {
            return false;
        }
        let mut window = self.lock();
        window.expire(now_s);
        window.active_until_s.is_some()
    }

    /// Records `total` model predictions of which `long` said long-lived; true when this tripped the
    /// safeguard.
    pub fn observe(&self, now_s: f64, long: u64, total: u64) -> bool {
        if !self.config.enabled || total == 0 {
            return false;
        }
        let mut window = self.lock();
        window.expire(now_s);
        if window.active_until_s.is_some() {
            return false;
        }
        let index = (now_s / self.bucket_s).floor() as i64;
        window.evict(index);
        match window.buckets.back_mut() {
            Some(bucket) if bucket.index >= index => {
                bucket.long += long;
                bucket.total += total;
            }
            _ => window.buckets.push_back(Bucket { index, long, total }),
        }
        window.long += long;
        window.total += total;
        let share = window.long as f64 / window.total as f64;
        if window.total >= self.config.min_predictions.max(1) && share > self.config.threshold {
            window.active_until_s = Some(now_s + self.config.cooldown_s as f64);
            window.trips += 1;
            window.clear();
            tracing::warn!(
                long_share = share,
                threshold = self.config.threshold,
                cooldown_s = self.config.cooldown_s,
                "safeguard tripped: too many long-lived predictions; placing everything as short-lived"
            );
            return true;
        }
        false
    }

    pub fn status(&self, now_s: f64) -> SafeguardStatus {
        let mut window = self.lock();
        window.expire(now_s);
        let index = (now_s / self.bucket_s).floor() as i64;
        window.evict(index);
        SafeguardStatus {
            active: window.active_until_s.is_some(),
            trips: window.trips,
            long_share: if window.total == 0 { 0.0 } else { window.long as f64 / window.total as f64 },
            window_predictions: window.total,
            cooldown_remaining_s: window.active_until_s.map_or(0.0, |until| (until - now_s).max(0.0)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn safeguard() -> Safeguard {
        Safeguard::new(SafeguardConfig {
            enabled: true,
            window_s: 600,
            threshold: 0.5,
            min_predictions: 10,
            cooldown_s: 60,
        })
    }

    #[test]
    fn trips_above_the_threshold_and_recovers_after_the_cooldown() {
        let guard = safeguard();
        // 5 long of 10: exactly the threshold, not above it.
        assert!(!guard.observe(0.0, 5, 10));
        assert!(!guard.is_active(1.0));
        assert!(guard.observe(2.0, 2, 2));
        assert!(guard.is_active(2.0));
        assert!(guard.is_active(61.9));
        // Predictions during the cooldown do not count.
        assert!(!guard.observe(30.0, 100, 100));
        let status = guard.status(30.0);
        assert!(status.active);
        assert_eq!((status.trips, status.cooldown_remaining_s), (1, 32.0));
        assert!(!guard.is_active(62.0));
        // The window restarted empty: one long prediction alone cannot trip it again.
        assert!(!guard.observe(63.0, 1, 1));
        assert_eq!(guard.status(63.0).window_predictions, 1);
    }

    #[test]
    fn never_trips_on_fewer_than_the_minimum_predictions() {
        let guard = safeguard();
        assert!(!guard.observe(0.0, 9, 9));
        assert!(guard.observe(0.0, 1, 1));
    }

    #[test]
    fn old_predictions_slide_out_of_the_window() {
        let guard = safeguard();
        assert!(!guard.observe(0.0, 8, 8));
        // Ten minutes later those eight are gone; 2 long of 12 is far below the threshold.
        assert!(!guard.observe(601.0, 2, 12));
        let status = guard.status(601.0);
        assert_eq!(status.window_predictions, 12);
        assert!((status.long_share - 2.0 / 12.0).abs() < 1e-12);
        assert_eq!(guard.status(1_300.0).window_predictions, 0);
    }

    #[test]
    fn a_disabled_safeguard_never_trips() {
        let guard = Safeguard::new(SafeguardConfig { enabled: false, ..SafeguardConfig::default() });
        assert!(!guard.observe(0.0, 1_000, 1_000));
        assert!(!guard.is_active(0.0));
    }
}
