//! The prediction cache: model answers by feature key, bounded in size and expiring after a time to
//! live, because the model's tenant-history features move with time.

use crate::feature_key::FeatureKey;
use domain::{CacheStats, LifetimePrediction, PredictionSource};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

pub struct PredictionCache {
    /// None when the cache is configured off (`max_entries = 0`).
    entries: Option<moka::sync::Cache<FeatureKey, LifetimePrediction>>,
    hits: AtomicU64,
    misses: AtomicU64,
}

impl PredictionCache {
    pub fn new(max_entries: u64, ttl: Duration) -> Self {
        let entries =
            (max_entries > 0).then(|| moka::sync::Cache::builder().max_capacity(max_entries).time_to_live(ttl).build());
        PredictionCache { entries, hits: AtomicU64::new(0), misses: AtomicU64::new(0) }
    }

    /// The cached answer for `key`, marked as coming from the cache.
    pub fn get(&self, key: &FeatureKey) -> Option<LifetimePrediction> {
        let found = self.entries.as_ref().and_then(|entries| entries.get(key));
        let counter = if found.is_some() { &self.hits } else { &self.misses };
        counter.fetch_add(1, Ordering::Relaxed);
        found.map(|mut prediction| {
            prediction.source = PredictionSource::Cache;
            prediction
        })
    }

    /// Stores a fresh model answer.
    pub fn insert(&self, key: FeatureKey, prediction: LifetimePrediction) {
        if let Some(entries) = &self.entries {
            entries.insert(key, prediction);
        }
    }

    pub fn stats(&self) -> CacheStats {
        let hits = self.hits.load(Ordering::Relaxed);
        let misses = self.misses.load(Ordering::Relaxed);
        let lookups = hits + misses;
        CacheStats {
            hits,
            misses,
            hit_rate: if lookups == 0 { 0.0 } else { hits as f64 / lookups as f64 },
            entries: self.entries.as_ref().map_or(0, |entries| {
                // The count is maintained lazily; settle pending inserts first.
                entries.run_pending_tasks();
                entries.entry_count()
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use domain::{Resources, VmRequest};

    fn key(tenant: &str) -> FeatureKey {
        let vm = VmRequest::new("v", tenant, "D2", Resources::from_whole(2.0, 8.0, 0.0).unwrap());
        FeatureKey::new(&vm, 0.0, &crate::feature_key::KeySpec::full(0))
    }

    #[test]
    fn hits_come_back_marked_as_cached_and_are_counted() {
        let cache = PredictionCache::new(10, Duration::from_secs(60));
        assert!(cache.get(&key("a")).is_none());
        let mut answer = LifetimePrediction::fallback(PredictionSource::Model);
        answer.p_long = 0.7;
        cache.insert(key("a"), answer);
        let hit = cache.get(&key("a")).unwrap();
        assert_eq!((hit.source, hit.p_long), (PredictionSource::Cache, 0.7));
        let stats = cache.stats();
        assert_eq!((stats.hits, stats.misses, stats.hit_rate), (1, 1, 0.5));
    }

    #[test]
    fn entries_expire_after_their_time_to_live() {
        let cache = PredictionCache::new(10, Duration::from_millis(30));
        cache.insert(key("a"), LifetimePrediction::fallback(PredictionSource::Model));
        assert!(cache.get(&key("a")).is_some());
        std::thread::sleep(Duration::from_millis(60));
        assert!(cache.get(&key("a")).is_none());
    }

    #[test]
    fn a_cache_of_size_zero_is_off() {
        let cache = PredictionCache::new(0, Duration::from_secs(60));
        cache.insert(key("a"), LifetimePrediction::fallback(PredictionSource::Model));
        assert!(cache.get(&key("a")).is_none());
        assert_eq!(cache.stats().misses, 1);
    }
}
