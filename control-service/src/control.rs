//! The control service's state and what it does with a request, without HTTP: [`Control`] holds
//! the prediction resolver, the zones' allocator clients, the keys, the rate limiter, the counters
//! and the console's timeline; [`Control::allocate`] predicts every VM of a validated request,
//! forwards it to its zone's allocator and feeds the placed VMs to the tenant history;
//! [`Control::poll_quality`] runs one round of the quality gate. The axum layer ([`crate::api`],
//! [`crate::dashboard`]) authenticates, decodes and answers; the upstream calls are the clients'
//! ([`crate::inference`], [`crate::upstream`]).

use crate::auth::ApiKeys;
use crate::cache::Serving;
use crate::inference::InferenceClient;
use crate::predictions::Resolver;
use crate::quality::{merge_versions, record_metrics, RolloutView};
use crate::rate_limit::RateLimiter;
use crate::upstream::{AllocateFailure, Allocators, BadAnswer, Decided, Read};
use domain::quality::QualityReport;
use domain::{
    AllocationOutcome, AllocationRequest, ControlDecision, ControlStats, HistoryEvent, StageLatency, ValidationLimits,
    VmPrediction, ZoneId, ZoneStats,
};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Everything the handlers share.
pub struct Control {
    pub resolver: Resolver<InferenceClient>,
    pub allocators: Allocators,
    pub default_zone: ZoneId,
    pub limits: ValidationLimits,
    /// Origin of the safeguard's and the rate limiter's monotonic clock.
    pub started: Instant,
    pub counters: Counters,
    pub keys: ApiKeys,
    pub rate_limiter: RateLimiter,
    /// How far a tenant's `requested_at_s` may be from the server's clock, in seconds.
    pub max_skew_s: f64,
    /// The console's figures over time.
    pub timeline: crate::timeline::Timeline,
}

/// Request outcomes since start.
#[derive(Debug, Default)]
pub struct Counters {
    pub requests: AtomicU64,
    pub placed: AtomicU64,
    pub rejected: AtomicU64,
    pub failed: AtomicU64,
}

/// A request placed or rejected by its zone's allocator, with its predictions and stage latencies.
#[derive(Debug)]
pub struct Allocated {
    /// Placed by this very request; otherwise rejected, or replayed from an earlier request.
    pub created: bool,
    pub decision: ControlDecision,
    /// The allocator's own stages (its `Server-Timing`), when it reported them.
    pub allocator_timing: Option<String>,
}

/// Seconds since the Unix epoch: the model's clock (request times).
pub fn unix_now_s() -> f64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64())
}

/// Whole microseconds, for the per-stage latencies.
pub fn micros(duration: Duration) -> u64 {
    u64::try_from(duration.as_micros()).unwrap_or(u64::MAX)
}

fn record_stage(stage: &'static str, us: u64) {
    metrics::histogram!("control_stage_duration_seconds", "stage" => stage).record(us as f64 / 1e6);
}

impl Control {
    /// Feeds an arrival or an exit to the inference servers' tenant history, if they are fed.
    pub fn record_history(&self, event: HistoryEvent) {
        if let Some(feed) = self.resolver.predictor().history() {
            feed.record(event);
        }
    }

    /// Takes a sample of the counters and the zones' occupancy for the console's timeline.
    pub async fn sample_timeline(&self) {
        let stats = self.stats(None).await;
        self.timeline.push(crate::timeline::sample(&stats, unix_now_s()));
    }

    /// The control service's counters and each zone's allocator statistics.
    pub async fn stats(&self, request_id: Option<&str>) -> ControlStats {
        let mut zones = std::collections::BTreeMap::new();
        for (zone, agents) in self.allocators.zones() {
            let all = agents.iter().map(|a| a.base.as_str()).collect::<Vec<_>>().join(", ");
            let (allocator, stats, error) = match self.allocators.stats(zone, request_id).await {
                Ok(Read { agent, value: Ok(stats) }) => (agent, Some(stats), None),
                Ok(Read { agent, value: Err(error) }) => (agent, None, Some(error.to_string())),
                Err(error) => (all, None, Some(error.to_string())),
            };
            zones.insert(zone.to_string(), ZoneStats { allocator, stats, error });
        }
        let clock_s = self.started.elapsed().as_secs_f64();
        ControlStats {
            requests: self.counters.requests.load(Ordering::Relaxed),
            placed: self.counters.placed.load(Ordering::Relaxed),
            rejected: self.counters.rejected.load(Ordering::Relaxed),
            failed: self.counters.failed.load(Ordering::Relaxed),
            cache: self.resolver.cache().stats(),
            predictions_by_source: self.resolver.counts_by_source(),
            fallbacks: self.resolver.fallbacks_by_reason(),
            safeguard: self.resolver.safeguard().status(clock_s),
            inference_servers: self.resolver.predictor().health(),
            zones,
            quality: self.resolver.quality().map(|watch| watch.status()).unwrap_or_default(),
        }
    }

    /// Predicts every VM of `request` (validated, its caller's rules applied), forwards it to
    /// `zone`'s allocator and, when placed, feeds its VMs to the tenant history. `started` is when
    /// the request came in, `validate_us` what checking it took.
    pub async fn allocate(
        &self,
        zone: ZoneId,
        mut request: AllocationRequest,
        arrival_s: f64,
        request_id: Option<&str>,
        started: Instant,
        validate_us: u64,
    ) -> Result<Allocated, AllocateFailure> {
        self.counters.requests.fetch_add(1, Ordering::Relaxed);

        let clock_s = self.started.elapsed().as_secs_f64();
        let resolved = self.resolver.resolve(request.vms(), arrival_s, clock_s, request_id).await;
        for (vm, prediction) in request.vms_mut().iter_mut().zip(&resolved.predictions) {
            vm.prediction = Some(prediction.clone());
        }

        let forwarded = Instant::now();
        let answer = self.allocators.allocate(&zone, &request, request_id).await;
        let allocator_us = micros(forwarded.elapsed());
        record_stage("validate", validate_us);
        record_stage("cache", resolved.cache_us);
        if resolved.inference_us > 0 {
            record_stage("inference", resolved.inference_us);
        }
        record_stage("allocator", allocator_us);

        let Decided { decision, created, server_timing, .. } = match answer {
            Ok(decided) => decided,
            Err(failure) => {
                self.counters.failed.fetch_add(1, Ordering::Relaxed);
                match &failure {
                    AllocateFailure::Unreadable { error, .. } => {
                        tracing::error!(%error, "unreadable decision from the allocator")
                    }
                    AllocateFailure::Upstream(_) | AllocateFailure::Refused(_) => {
                        metrics::counter!("control_requests_total", "outcome" => "error").increment(1)
                    }
                }
                return Err(failure);
            }
        };
        if let AllocationOutcome::Placed { placements } = &decision.outcome {
            if !decision.replayed {
                for (vm, placement) in request.vms().iter().zip(placements) {
                    self.record_history(HistoryEvent::Started {
                        vm_id: placement.vm_id.to_string(),
                        tenant_id: vm.facts.tenant_id.to_string(),
                        vm_type: vm.facts.vm_type.to_string(),
                        at_s: vm.facts.requested_at_s.unwrap_or(arrival_s),
                    });
                }
            }
        }
        let (counter, outcome) = if decision.is_placed() {
            (&self.counters.placed, "placed")
        } else {
            (&self.counters.rejected, "rejected")
        };
        counter.fetch_add(1, Ordering::Relaxed);
        metrics::counter!("control_requests_total", "outcome" => outcome).increment(1);

        let predictions = request
            .vms()
            .iter()
            .zip(resolved.predictions)
            .map(|(vm, prediction)| VmPrediction { vm_id: vm.vm_id.clone(), prediction })
            .collect();
        let total_us = micros(started.elapsed());
        record_stage("total", total_us);
        let latency_us = StageLatency {
            validate_us,
            cache_us: resolved.cache_us,
            inference_us: resolved.inference_us,
            allocator_us,
            total_us,
        };
        Ok(Allocated {
            created,
            decision: ControlDecision { zone, decision, predictions, latency_us },
            allocator_timing: server_timing,
        })
    }

    /// Reads the rollout from the inference servers for the prediction cache (a failed read keeps
    /// the last one).
    pub async fn follow_rollout(&self, timeout: Duration) {
        if let Some(models) = self.resolver.predictor().models(timeout).await {
            self.resolver.set_serving(Serving::from(&RolloutView::of(models)));
        }
    }

    /// One round of the quality gate: the rollout, the zones' quality, the gate, and a canary
    /// decision carried out if one is due.
    pub async fn poll_quality(&self, timeout: Duration) {
        let Some(watch) = self.resolver.quality() else { return };
        let Some(models) = self.resolver.predictor().models(timeout).await else { return };
        let view = RolloutView::of(models);
        // The rollout the cache follows too: taken in here at no cost.
        self.resolver.set_serving(Serving::from(&view));
        let versions = merge_versions(&self.zone_quality_reports().await);
        record_metrics(&view, &versions);
        if let Some(mut decision) = watch.observe(&view, versions) {
            match watch.config().inference_admin_token.clone() {
                None => {
                    decision.detail =
                        Some("no `quality.inference_admin_token` configured: decided, not carried out".to_owned());
                }
                Some(token) => {
                    let servers = self.resolver.predictor().servers().len();
                    let failures = self.resolver.predictor().carry_out(&decision.verdict, &token, timeout).await;
                    decision.applied = failures.len() < servers;
                    if !failures.is_empty() {
                        decision.detail = Some(failures.join("; "));
                    }
                }
            }
            tracing::info!(
                verdict = %decision.verdict, canary = %decision.canary_version, stable = %decision.stable_version,
                canary_average_precision = decision.canary_average_precision,
                stable_average_precision = decision.stable_average_precision,
                canary_resolved = decision.canary_resolved, stable_resolved = decision.stable_resolved,
                margin = decision.margin, applied = decision.applied, detail = ?decision.detail,
                "canary judged by its realized quality"
            );
            watch.record_decision(decision);
        }
    }

    /// Every zone's quality report (zones that do not answer are left out).
    async fn zone_quality_reports(&self) -> Vec<QualityReport> {
        let mut reports = Vec::new();
        for (zone, _) in self.allocators.zones() {
            match self.allocators.quality(zone).await {
                Ok(Read { value: Ok(report), .. }) => reports.push(report),
                Ok(Read { value: Err(error @ BadAnswer::Unreadable { .. }), .. }) => {
                    tracing::warn!(%zone, %error, "unreadable quality report")
                }
                Ok(Read { value: Err(error), .. }) => tracing::debug!(%zone, %error, "no quality report"),
                Err(error) => tracing::debug!(%zone, %error, "no quality report"),
            }
        }
        reports
    }
}
