//! Per-tenant rate limits: a token bucket per tenant (`burst` tokens, refilled at `per_second`),
//! so one tenant's flood cannot crowd out the others. Only tenant keys are limited; the operator
//! and open mode are not (trace replays send whole bursts of a tenant at once).
//!
//! Memory stays bounded: a bucket that has refilled to full is exactly a new bucket, so idle tenants
//! are forgotten without changing any answer; and only configured tenant keys reach the limiter.
//! Time is whatever monotonic seconds the caller passes, so the rules are tested without sleeping.

use crate::config::RateLimitConfig;
use domain::TenantId;
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

/// One tenant's bucket.
#[derive(Clone, Copy, Debug)]
struct Bucket {
    tokens: f64,
    updated_s: f64,
}

pub struct RateLimiter {
    config: RateLimitConfig,
    buckets: Mutex<HashMap<TenantId, Bucket>>,
}

/// Tenants tracked before idle ones are swept out.
const SWEEP_AT: usize = 1_024;

impl RateLimiter {
    pub fn new(config: RateLimitConfig) -> Self {
        RateLimiter { config, buckets: Mutex::new(HashMap::new()) }
    }

    fn burst(&self) -> f64 {
        f64::from(self.config.burst.max(1))
    }

    fn refilled(&self, bucket: Bucket, now_s: f64) -> f64 {
        let elapsed = (now_s - bucket.updated_s).max(0.0);
        (bucket.tokens + elapsed * self.config.per_second).min(self.burst())
    }

    /// Takes one token of `tenant`'s bucket; when it is empty, says how long until the next token.
    pub fn check(&self, tenant: &TenantId, now_s: f64) -> Result<(), Duration> {
        if !self.config.enabled {
            return Ok(());
        }
        // A panic elsewhere leaves at worst one bucket a token off: still good to use.
        let mut buckets = self.buckets.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if buckets.len() >= SWEEP_AT && !buckets.contains_key(tenant) {
            let burst = self.burst();
            buckets.retain(|_, bucket| self.refilled(*bucket, now_s) < burst);
        }
        let bucket = buckets.entry(tenant.clone()).or_insert(Bucket { tokens: self.burst(), updated_s: now_s });
        let tokens = self.refilled(*bucket, now_s);
        *bucket = Bucket { tokens, updated_s: now_s.max(bucket.updated_s) };
        if tokens >= 1.0 {
            bucket.tokens -= 1.0;
            Ok(())
        } else {
            Err(Duration::from_secs_f64((1.0 - tokens) / self.config.per_second))
        }
    }

    /// Tenants with a bucket now.
    pub fn tracked(&self) -> usize {
        self.buckets.lock().unwrap_or_else(std::sync::PoisonError::into_inner).len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limiter(per_second: f64, burst: u32) -> RateLimiter {
        RateLimiter::new(RateLimitConfig { enabled: true, per_second, burst })
    }

    #[test]
    fn a_burst_then_the_refill_rate() {
        let limiter = limiter(2.0, 3);
        let t = TenantId::from("t");
        for _ in 0..3 {
            assert_eq!(limiter.check(&t, 0.0), Ok(()));
        }
        // Empty: the next token comes in half a second.
        assert_eq!(limiter.check(&t, 0.0), Err(Duration::from_millis(500)));
        assert_eq!(limiter.check(&t, 0.25), Err(Duration::from_millis(250)));
        assert_eq!(limiter.check(&t, 0.5), Ok(()));
        assert!(limiter.check(&t, 0.5).is_err());
        // Long idle refills to the burst, never beyond it.
        for _ in 0..3 {
            assert_eq!(limiter.check(&t, 100.0), Ok(()));
        }
        assert!(limiter.check(&t, 100.0).is_err());
    }

    #[test]
    fn tenants_have_buckets_of_their_own() {
        let limiter = limiter(1.0, 1);
        assert!(limiter.check(&TenantId::from("a"), 0.0).is_ok());
        assert!(limiter.check(&TenantId::from("a"), 0.0).is_err());
        assert!(limiter.check(&TenantId::from("b"), 0.0).is_ok());
    }

    #[test]
    fn idle_tenants_are_forgotten() {
        let limiter = limiter(10.0, 5);
        for i in 0..SWEEP_AT {
            assert!(limiter.check(&TenantId::from(format!("t{i}").as_str()), 0.0).is_ok());
        }
        assert_eq!(limiter.tracked(), SWEEP_AT);
        // A second later every bucket is full again: forgetting them changes nothing.
        assert!(limiter.check(&TenantId::from("late"), 1.0).is_ok());
        assert_eq!(limiter.tracked(), 1);
    }

    #[test]
    fn disabled_never_limits() {
        let limiter = RateLimiter::new(RateLimitConfig { enabled: false, per_second: 1.0, burst: 1 });
        for _ in 0..10 {
            assert!(limiter.check(&TenantId::from("t"), 0.0).is_ok());
        }
    }
}
