//! The prediction cache: model answers by the model version that serves a VM and its feature key,
//! bounded in size and expiring after a time to live, because the model's tenant-history features
//! move with time.
//!
//! The version is part of the key because the inference servers route each VM (by a stable hash
//! of its id) to the stable bundle or to a canary: an answer is only ever served to a VM that the
//! same bundle would have answered, so a canary is judged on its own answers and a swapped-out
//! bundle stops answering as soon as the rollout is seen ([`Serving`], followed every
//! `[cache] rollout_poll_ms`).

use crate::feature_key::FeatureKey;
use crate::quality::RolloutView;
use domain::{CacheStats, LifetimePrediction, PredictionSource};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Which bundle version answers for which VM, as the inference servers list their rollout
/// (`GET /v1/models`): the stable one, and a canary with its share of routing keys.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Serving {
    stable: Option<Arc<str>>,
    canary: Option<(Arc<str>, f64)>,
}

impl From<&RolloutView> for Serving {
    fn from(rollout: &RolloutView) -> Self {
        Serving {
            stable: rollout.stable.as_deref().map(Arc::from),
            canary: rollout.canary.as_ref().map(|canary| (Arc::from(canary.version.as_str()), canary.share)),
        }
    }
}

impl Serving {
    /// Only a stable bundle (tests).
    pub fn stable(version: &str) -> Self {
        Serving { stable: Some(version.into()), canary: None }
    }

    /// The version that answers for `routing_key` (a VM's id), by the inference server's own
    /// routing ([`domain::inference::unit_hash`]); None while the rollout is unknown.
    pub fn version_for(&self, routing_key: &str) -> Option<&Arc<str>> {
        match &self.canary {
            Some((canary, share)) if domain::inference::unit_hash(routing_key) < *share => Some(canary),
            _ => self.stable.as_ref(),
        }
    }
}

/// A cached answer's key: the version that gave it and what the key keeps of the VM.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct CacheKey {
    pub version: Arc<str>,
    pub features: FeatureKey,
}

pub struct PredictionCache {
    /// None when the cache is configured off (`max_entries = 0`).
    entries: Option<moka::sync::Cache<CacheKey, LifetimePrediction>>,
    hits: AtomicU64,
    misses: AtomicU64,
}

impl PredictionCache {
    pub fn new(max_entries: u64, ttl: Duration) -> Self {
        let entries =
            (max_entries > 0).then(|| moka::sync::Cache::builder().max_capacity(max_entries).time_to_live(ttl).build());
        PredictionCache { entries, hits: AtomicU64::new(0), misses: AtomicU64::new(0) }
    }

    /// The cached answer for `key`, marked as coming from the cache. Without a key (the rollout
    /// is not known yet) it is a miss.
    pub fn get(&self, key: Option<&CacheKey>) -> Option<LifetimePrediction> {
        let found = key.and_then(|key| self.entries.as_ref()?.get(key));
        let counter = if found.is_some() { &self.hits } else { &self.misses };
        counter.fetch_add(1, Ordering::Relaxed);
        found.map(|mut prediction| {
            prediction.source = PredictionSource::Cache;
            prediction
        })
    }

    /// Stores a fresh model answer under the version that gave it (which may not be the one
    /// expected, while the rollout changes); an answer without a version is not stored.
    pub fn insert(&self, features: FeatureKey, prediction: LifetimePrediction) {
        let (Some(entries), Some(version)) = (&self.entries, &prediction.model_version) else { return };
        entries.insert(CacheKey { version: version.as_str().into(), features }, prediction);
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

    fn features(tenant: &str) -> FeatureKey {
        let vm = VmRequest::new("v", tenant, "D2", Resources::from_whole(2.0, 8.0, 0.0).unwrap());
        FeatureKey::new(&vm, 0.0, &crate::feature_key::KeySpec::full(0))
    }

    fn key(version: &str, tenant: &str) -> CacheKey {
        CacheKey { version: version.into(), features: features(tenant) }
    }

    fn answer(version: Option<&str>, p_long: f64) -> LifetimePrediction {
        let mut answer = LifetimePrediction::fallback(PredictionSource::Model);
        answer.p_long = p_long;
        answer.model_version = version.map(str::to_owned);
        answer
    }

    #[test]
    fn hits_come_back_marked_as_cached_and_are_counted() {
        let cache = PredictionCache::new(10, Duration::from_secs(60));
        assert!(cache.get(Some(&key("m-1", "a"))).is_none());
        cache.insert(features("a"), answer(Some("m-1"), 0.7));
        let hit = cache.get(Some(&key("m-1", "a"))).unwrap();
        assert_eq!((hit.source, hit.p_long), (PredictionSource::Cache, 0.7));
        let stats = cache.stats();
        assert_eq!((stats.hits, stats.misses, stats.hit_rate), (1, 1, 0.5));
    }

    #[test]
    fn an_answer_serves_only_the_version_that_gave_it() {
        let cache = PredictionCache::new(10, Duration::from_secs(60));
        cache.insert(features("a"), answer(Some("m-1"), 0.7));
        assert!(cache.get(Some(&key("m-2", "a"))).is_none(), "another version's answer");
        assert!(cache.get(None).is_none(), "no rollout known: no hit");
        cache.insert(features("b"), answer(None, 0.7));
        assert_eq!(cache.stats().entries, 1, "an answer without a version is not stored");
    }

    #[test]
    fn entries_expire_after_their_time_to_live() {
        // A second, so that a stall of the shared machine between the insert and the first look
        // cannot expire the entry early; the wait after it only has to be longer.
        let cache = PredictionCache::new(10, Duration::from_secs(1));
        cache.insert(features("a"), answer(Some("m-1"), 0.7));
        assert!(cache.get(Some(&key("m-1", "a"))).is_some());
        std::thread::sleep(Duration::from_millis(1200));
        assert!(cache.get(Some(&key("m-1", "a"))).is_none());
    }

    #[test]
    fn a_cache_of_size_zero_is_off() {
        let cache = PredictionCache::new(0, Duration::from_secs(60));
        cache.insert(features("a"), answer(Some("m-1"), 0.7));
        assert!(cache.get(Some(&key("m-1", "a"))).is_none());
        assert_eq!(cache.stats().misses, 1);
    }

    fn status(state: &str, version: &str, share: Option<f64>) -> crate::quality::ModelStatus {
        crate::quality::ModelStatus {
            version: Some(version.to_owned()),
            state: state.to_owned(),
            canary_share: share,
            auto: None,
        }
    }

    #[test]
    fn serving_routes_keys_as_the_inference_server_does() {
        assert_eq!(Serving::default().version_for("vm-1"), None);
        let serving = Serving::from(&RolloutView::of(vec![
            status("stable", "good-1", None),
            status("canary", "new-1", Some(0.3)),
            status("available", "old-1", None),
        ]));
        let mut canary = 0;
        for i in 0..10_000 {
            let vm = format!("vm-{i}");
            let expected = if domain::inference::unit_hash(&vm) < 0.3 { "new-1" } else { "good-1" };
            let version = serving.version_for(&vm).map(|v| v.to_string());
            assert_eq!(version.as_deref(), Some(expected), "{vm}");
            canary += usize::from(expected == "new-1");
        }
        assert!((2_700..3_300).contains(&canary), "{canary} of 10,000 to the canary");
        assert_eq!(Serving::stable("good-1").version_for("vm-1").map(|v| v.to_string()).as_deref(), Some("good-1"));
    }
}
