//! Where each VM's prediction comes from: the safeguard, the cache, the model within its time
//! budget, or the short-lived fallback with its reason. The model is behind the [`Predictor`] trait,
//! so these rules are tested without a network.

use crate::cache::{CacheKey, PredictionCache, Serving};
use crate::feature_key::{FeatureKey, KeySpec};
use crate::quality::QualityWatch;
use crate::safeguard::Safeguard;
use domain::{LifetimeClass, LifetimePrediction, PredictInstance, PredictRequest, PredictionSource, VmRequest};
use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Why the model gave no answer.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PredictError {
    #[error("no answer within the time budget")]
    Timeout,
    #[error("{0}")]
    Failed(String),
    #[error("no inference server is configured or healthy")]
    Unavailable,
}

impl PredictError {
    /// The fallback source that records this reason.
    pub fn fallback_source(&self) -> PredictionSource {
        match self {
            PredictError::Timeout => PredictionSource::FallbackTimeout,
            PredictError::Failed(_) => PredictionSource::FallbackError,
            PredictError::Unavailable => PredictionSource::FallbackUnavailable,
        }
    }
}

/// Something that answers a batch of prediction requests: the inference servers over HTTP, or a
/// stand-in in tests.
pub trait Predictor: Send + Sync + 'static {
    fn predict(
        &self,
        request: PredictRequest,
        request_id: Option<&str>,
    ) -> impl Future<Output = Result<Vec<LifetimePrediction>, PredictError>> + Send;
}

/// How predictions are resolved.
#[derive(Clone, Debug)]
pub struct ResolverConfig {
    pub budget: Duration,
    /// What the cache key keeps of a VM (`[cache] key` and `time_bucket_s`).
    pub key: KeySpec,
    pub interval_class: bool,
}

/// The predictions of one request and what they cost.
#[derive(Clone, Debug, PartialEq)]
pub struct Resolved {
    /// One per VM, in request order.
    pub predictions: Vec<LifetimePrediction>,
    pub cache_us: u64,
    pub inference_us: u64,
}

/// Every prediction source, for counting by source.
const SOURCES: [PredictionSource; 9] = [
    PredictionSource::Model,
    PredictionSource::Cache,
    PredictionSource::FallbackTimeout,
    PredictionSource::FallbackError,
    PredictionSource::FallbackUnavailable,
    PredictionSource::Safeguard,
    PredictionSource::QualityGate,
    PredictionSource::Oracle,
    PredictionSource::NoisyOracle,
];

/// The snake-case name of a source, as on the wire.
pub fn source_name(source: PredictionSource) -> &'static str {
    match source {
        PredictionSource::Model => "model",
        PredictionSource::Cache => "cache",
        PredictionSource::FallbackTimeout => "fallback_timeout",
        PredictionSource::FallbackError => "fallback_error",
        PredictionSource::FallbackUnavailable => "fallback_unavailable",
        PredictionSource::Safeguard => "safeguard",
        PredictionSource::QualityGate => "quality_gate",
        PredictionSource::Oracle => "oracle",
        PredictionSource::NoisyOracle => "noisy_oracle",
    }
}

/// The fallback reason of a source (`timeout`, `error`, `unavailable`, `safeguard`, `quality_gate`),
/// if it is one.
pub fn fallback_reason(source: PredictionSource) -> Option<&'static str> {
    match source {
        PredictionSource::FallbackTimeout => Some("timeout"),
        PredictionSource::FallbackError => Some("error"),
        PredictionSource::FallbackUnavailable => Some("unavailable"),
        PredictionSource::Safeguard => Some("safeguard"),
        PredictionSource::QualityGate => Some("quality_gate"),
        _ => None,
    }
}

pub struct Resolver<P> {
    predictor: P,
    cache: PredictionCache,
    safeguard: Safeguard,
    quality: Option<Arc<QualityWatch>>,
    config: ResolverConfig,
    by_source: [AtomicU64; SOURCES.len()],
    /// The rollout last seen, which picks the version a cached answer must come from.
    serving: std::sync::RwLock<Arc<Serving>>,
}

impl<P: Predictor> Resolver<P> {
    pub fn new(predictor: P, cache: PredictionCache, safeguard: Safeguard, config: ResolverConfig) -> Self {
        Resolver {
            predictor,
            cache,
            safeguard,
            quality: None,
            config,
            by_source: Default::default(),
            serving: Default::default(),
        }
    }

    /// Takes in the rollout the inference servers list (followed every `[cache] rollout_poll_ms`):
    /// from now on a VM is served cached answers of the version it routes to only.
    pub fn set_serving(&self, serving: Serving) {
        let mut current = self.serving.write().unwrap_or_else(std::sync::PoisonError::into_inner);
        if **current != serving {
            tracing::info!(?serving, "prediction cache follows the rollout");
            *current = Arc::new(serving);
        }
    }

    fn serving(&self) -> Arc<Serving> {
        Arc::clone(&self.serving.read().unwrap_or_else(std::sync::PoisonError::into_inner))
    }

    /// Overrides the answers of a model the quality gate closed on (see [`crate::quality`]).
    pub fn with_quality(mut self, watch: Arc<QualityWatch>) -> Self {
        self.quality = Some(watch);
        self
    }

    pub fn quality(&self) -> Option<&QualityWatch> {
        self.quality.as_deref()
    }

    pub fn predictor(&self) -> &P {
        &self.predictor
    }

    pub fn cache(&self) -> &PredictionCache {
        &self.cache
    }

    pub fn safeguard(&self) -> &Safeguard {
        &self.safeguard
    }

    /// VM predictions so far by source name.
    pub fn counts_by_source(&self) -> BTreeMap<String, u64> {
        SOURCES
            .iter()
            .zip(&self.by_source)
            .map(|(source, count)| (source_name(*source).to_owned(), count.load(Ordering::Relaxed)))
            .filter(|(_, count)| *count > 0)
            .collect()
    }

    /// VM fallbacks so far by reason.
    pub fn fallbacks_by_reason(&self) -> BTreeMap<String, u64> {
        SOURCES
            .iter()
            .zip(&self.by_source)
            .filter_map(|(source, count)| Some((fallback_reason(*source)?.to_owned(), count.load(Ordering::Relaxed))))
            .filter(|(_, count)| *count > 0)
            .collect()
    }

    /// The prediction of every VM of a request (all of one tenant, as validation ensures).
    /// `arrival_s` stands in for a missing request time (Unix seconds); `clock_s` is the monotonic
    /// clock of the safeguard.
    pub async fn resolve(&self, vms: &[VmRequest], arrival_s: f64, clock_s: f64, request_id: Option<&str>) -> Resolved {
        let started = Instant::now();
        let Some(tenant) = vms.first().map(|vm| &vm.facts.tenant_id) else {
            return Resolved { predictions: Vec::new(), cache_us: 0, inference_us: 0 };
        };
        if self.safeguard.blocks(tenant, clock_s) {
            let predictions = vec![LifetimePrediction::fallback(PredictionSource::Safeguard); vms.len()];
            self.count(&predictions);
            return Resolved { predictions, cache_us: micros(started.elapsed()), inference_us: 0 };
        }
        let mut predictions: Vec<Option<LifetimePrediction>> = Vec::with_capacity(vms.len());
        // Misses by key, each with the VMs that share it: one instance per distinct key (and
        // version: VMs routed to different bundles are asked for separately). While the rollout is
        // unknown every VM is its own instance.
        let mut misses: Vec<(FeatureKey, Vec<usize>)> = Vec::new();
        let mut miss_index: HashMap<CacheKey, usize> = HashMap::new();
        let serving = self.serving();
        for (i, vm) in vms.iter().enumerate() {
            let features = FeatureKey::new(vm, vm.facts.requested_at_s.unwrap_or(arrival_s), &self.config.key);
            let Some(version) = serving.version_for(vm.vm_id.as_str()) else {
                predictions.push(self.cache.get(None));
                misses.push((features, vec![i]));
                continue;
            };
            let key = CacheKey { version: Arc::clone(version), features };
            if let Some(&at) = miss_index.get(&key) {
                misses[at].1.push(i);
                predictions.push(None);
                continue;
            }
            let hit = self.cache.get(Some(&key));
            if hit.is_none() {
                misses.push((key.features.clone(), vec![i]));
                miss_index.insert(key, misses.len() - 1);
            }
            predictions.push(hit);
        }
        let cache_us = micros(started.elapsed());

        let mut inference_us = 0;
        if !misses.is_empty() {
            let instances = misses
                .iter()
                .map(|(_, at)| {
                    let mut instance = PredictInstance::from_vm(&vms[at[0]]);
                    instance.requested_at_s.get_or_insert(arrival_s);
                    instance
                })
                .collect();
            let request = PredictRequest { instances, interval_class: self.config.interval_class, history: Vec::new() };
            let asked = Instant::now();
            let answer = match tokio::time::timeout(self.config.budget, self.predictor.predict(request, request_id))
                .await
            {
                Ok(Ok(answers)) if answers.len() == misses.len() => Ok(answers),
                Ok(Ok(answers)) => {
                    Err(PredictError::Failed(format!("asked for {} predictions, got {}", misses.len(), answers.len())))
                }
                Ok(Err(error)) => Err(error),
                Err(_) => Err(PredictError::Timeout),
            };
            inference_us = micros(asked.elapsed());
            match answer {
                Ok(answers) => {
                    for ((key, at), answer) in misses.into_iter().zip(answers) {
                        for &i in &at {
                            predictions[i] = Some(answer.clone());
                        }
                        self.cache.insert(key, answer);
                    }
                }
                Err(error) => {
                    tracing::debug!(%error, vms = vms.len(), "no model answer; placing as short-lived");
                    let fallback = LifetimePrediction::fallback(error.fallback_source());
                    for (_, at) in misses {
                        for i in at {
                            predictions[i] = Some(fallback.clone());
                        }
                    }
                }
            }
        }
        let mut predictions: Vec<LifetimePrediction> = predictions
            .into_iter()
            .map(|p| p.unwrap_or_else(|| LifetimePrediction::fallback(PredictionSource::FallbackError)))
            .collect();
        if let Some(watch) = &self.quality {
            // The gated model's answers stay as they are (shadow, measured by the allocators), but
            // place as short-lived.
            for prediction in &mut predictions {
                if !prediction.source.is_fallback() && watch.gates(prediction.model_version.as_deref()) {
                    prediction.source = PredictionSource::QualityGate;
                }
            }
        }
        let (long, total) = predictions
            .iter()
            .filter(|p| !p.source.is_fallback())
            .fold((0, 0), |(long, total), p| (long + u64::from(p.class == LifetimeClass::Long), total + 1));
        if self.safeguard.observe(clock_s, tenant, long, total) {
            metrics::counter!("control_safeguard_trips_total").increment(1);
        }
        self.count(&predictions);
        Resolved { predictions, cache_us, inference_us }
    }

    fn count(&self, predictions: &[LifetimePrediction]) {
        for prediction in predictions {
            if let Some(slot) = SOURCES.iter().position(|s| *s == prediction.source) {
                self.by_source[slot].fetch_add(1, Ordering::Relaxed);
            }
            metrics::counter!("control_predictions_total", "source" => source_name(prediction.source)).increment(1);
            if let Some(reason) = fallback_reason(prediction.source) {
                metrics::counter!("control_fallbacks_total", "reason" => reason).increment(1);
            }
        }
    }
}

fn micros(duration: Duration) -> u64 {
    u64::try_from(duration.as_micros()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::SafeguardConfig;
    use domain::Resources;
    use std::sync::atomic::AtomicUsize;
    use std::sync::Arc;

    /// Answers every instance with p_long 0.9 (long) after `delay`, or fails; counts calls.
    #[derive(Clone)]
    struct FakeModel {
        delay: Duration,
        fail: bool,
        calls: Arc<AtomicUsize>,
        instances: Arc<AtomicUsize>,
    }

    impl Predictor for FakeModel {
        async fn predict(
            &self,
            request: PredictRequest,
            _: Option<&str>,
        ) -> Result<Vec<LifetimePrediction>, PredictError> {
            self.calls.fetch_add(1, Ordering::SeqCst);
            self.instances.fetch_add(request.instances.len(), Ordering::SeqCst);
            tokio::time::sleep(self.delay).await;
            if self.fail {
                return Err(PredictError::Failed("HTTP 500".into()));
            }
            Ok(request
                .instances
                .iter()
                .map(|_| LifetimePrediction {
                    p_long: 0.9,
                    class: LifetimeClass::Long,
                    interval_class: None,
                    expected_lifetime_s: None,
                    model_version: Some("m-1".into()),
                    source: PredictionSource::Model,
                })
                .collect())
        }
    }

    fn model(delay_ms: u64, fail: bool) -> FakeModel {
        FakeModel { delay: Duration::from_millis(delay_ms), fail, calls: Arc::default(), instances: Arc::default() }
    }

    fn resolver(model: FakeModel, min_predictions: u64) -> Resolver<FakeModel> {
        let resolver = Resolver::new(
            model,
            PredictionCache::new(100, Duration::from_secs(60)),
            Safeguard::new(SafeguardConfig {
                enabled: true,
                window_s: 600,
                threshold: 0.5,
                min_predictions,
                cooldown_s: 60,
                max_per_tenant: 1_000,
                established_after_s: 0,
                ..SafeguardConfig::default()
            }),
            ResolverConfig { budget: Duration::from_millis(50), key: KeySpec::full(3_600), interval_class: false },
        );
        resolver.set_serving(Serving::stable("m-1"));
        resolver
    }

    fn vm(id: &str, vm_type: &str) -> VmRequest {
        VmRequest::new(id, "t", vm_type, Resources::from_whole(2.0, 8.0, 0.0).unwrap())
    }

    fn sources(resolved: &Resolved) -> Vec<PredictionSource> {
        resolved.predictions.iter().map(|p| p.source).collect()
    }

    #[tokio::test]
    async fn repeated_features_hit_the_cache_and_one_call_serves_a_gang() {
        let fake = model(0, false);
        let resolver = resolver(fake.clone(), 1_000);
        let gang = [vm("a", "D2"), vm("b", "D2"), vm("c", "D4")];
        let first = resolver.resolve(&gang, 100.0, 0.0, None).await;
        assert_eq!(sources(&first), [PredictionSource::Model; 3]);
        // Two distinct keys went to the model in one call.
        assert_eq!((fake.calls.load(Ordering::SeqCst), fake.instances.load(Ordering::SeqCst)), (1, 2));
        let again = resolver.resolve(&[vm("d", "D4")], 200.0, 1.0, None).await;
        assert_eq!(sources(&again), [PredictionSource::Cache]);
        assert_eq!(fake.calls.load(Ordering::SeqCst), 1);
        assert_eq!(resolver.counts_by_source(), BTreeMap::from([("cache".into(), 1), ("model".into(), 3)]));
    }

    #[tokio::test]
    async fn nothing_is_cached_while_the_rollout_is_unknown() {
        let fake = model(0, false);
        let resolver = resolver(fake.clone(), 1_000);
        resolver.set_serving(Serving::default());
        let gang = [vm("a", "D2"), vm("b", "D2")];
        assert_eq!(sources(&resolver.resolve(&gang, 100.0, 0.0, None).await), [PredictionSource::Model; 2]);
        assert_eq!(sources(&resolver.resolve(&gang, 100.0, 1.0, None).await), [PredictionSource::Model; 2]);
        // Each VM was its own instance: with the routing unknown, two VMs may go to two bundles.
        assert_eq!(fake.instances.load(Ordering::SeqCst), 4);
    }

    #[tokio::test]
    async fn a_vm_routed_to_the_canary_is_never_served_the_stable_models_answer() {
        let fake = model(0, false);
        let resolver = resolver(fake.clone(), 1_000_000);
        let models = [("stable", "m-1", None), ("canary", "m-2", Some(0.5))].map(|(state, version, share)| {
            crate::quality::ModelStatus {
                version: Some(version.to_owned()),
                state: state.to_owned(),
                canary_share: share,
                auto: None,
            }
        });
        resolver.set_serving(Serving::from(&crate::quality::RolloutView::of(models.to_vec())));
        // The fake answers as m-1 whatever it is asked: the canary's VMs find no m-2 answer.
        let (mut canary, mut hits) = (0, 0);
        for i in 0..200 {
            let id = format!("vm-{i}");
            let resolved = resolver.resolve(&[vm(&id, "D2")], 100.0, i as f64, None).await;
            let to_canary = domain::inference::unit_hash(&id) < 0.5;
            canary += usize::from(to_canary);
            match resolved.predictions[0].source {
                PredictionSource::Cache => {
                    assert!(!to_canary, "{id} routes to the canary but was served m-1's answer");
                    hits += 1;
                }
                source => assert_eq!(source, PredictionSource::Model, "{id}"),
            }
        }
        assert!(canary > 50 && hits > 50, "{canary} routed to the canary, {hits} hits");
    }

    #[tokio::test]
    async fn a_slow_model_falls_back_within_the_budget() {
        let resolver = resolver(model(500, false), 1_000);
        let started = Instant::now();
        let resolved = resolver.resolve(&[vm("a", "D2")], 0.0, 0.0, None).await;
        assert!(started.elapsed() < Duration::from_millis(400), "took {:?}", started.elapsed());
        assert_eq!(sources(&resolved), [PredictionSource::FallbackTimeout]);
        assert_eq!(resolved.predictions[0].class, LifetimeClass::Short);
        assert_eq!(resolver.fallbacks_by_reason(), BTreeMap::from([("timeout".into(), 1)]));
        // A fallback is not cached: the next request asks the model again.
        assert_eq!(resolver.cache().stats().entries, 0);
    }

    #[tokio::test]
    async fn a_failing_model_falls_back_with_the_error_reason() {
        let resolver = resolver(model(0, true), 1_000);
        let resolved = resolver.resolve(&[vm("a", "D2")], 0.0, 0.0, None).await;
        assert_eq!(sources(&resolved), [PredictionSource::FallbackError]);
    }

    #[tokio::test]
    async fn an_all_long_model_trips_the_safeguard_which_then_skips_the_model() {
        let fake = model(0, false);
        let resolver = resolver(fake.clone(), 3);
        for (i, vm_type) in ["A", "B", "C"].iter().enumerate() {
            let resolved = resolver.resolve(&[vm(&i.to_string(), vm_type)], 0.0, i as f64, None).await;
            assert_eq!(sources(&resolved), [PredictionSource::Model]);
        }
        assert!(resolver.safeguard().status(3.0).active);
        let calls = fake.calls.load(Ordering::SeqCst);
        let resolved = resolver.resolve(&[vm("x", "D")], 0.0, 4.0, None).await;
        assert_eq!(sources(&resolved), [PredictionSource::Safeguard]);
        assert_eq!(fake.calls.load(Ordering::SeqCst), calls);
        // After the 60 s cooldown the model is asked again.
        let resolved = resolver.resolve(&[vm("y", "E")], 0.0, 65.0, None).await;
        assert_eq!(sources(&resolved), [PredictionSource::Model]);
    }
}
