//! Wire types of the control service's public API: its answer to `POST /allocate` (the allocator's
//! decision plus the predictions it acted on and where the time went) and its `/v1/stats`.

use crate::decision::AllocationDecision;
use crate::ids::{VmId, ZoneId};
use crate::prediction::LifetimePrediction;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The prediction one VM was placed with.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct VmPrediction {
    #[cfg_attr(feature = "openapi", schema(value_type = String))]
    pub vm_id: VmId,
    pub prediction: LifetimePrediction,
}

/// Microseconds spent in each stage of one request, as the control service measured them.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StageLatency {
    /// Parsing and validating the body.
    pub validate_us: u64,
    /// Building feature keys and looking them up in the prediction cache.
    pub cache_us: u64,
    /// Waiting for the inference server (0 when every VM hit the cache or the safeguard was on).
    pub inference_us: u64,
    /// Forwarding to the zone's allocator and reading its decision.
    pub allocator_us: u64,
    /// From the body read to the answer built.
    pub total_us: u64,
}

/// The control service's answer to `POST /allocate`.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ControlDecision {
    /// The zone whose allocator decided.
    pub zone: ZoneId,
    #[serde(flatten)]
    pub decision: AllocationDecision,
    /// The prediction each VM was sent to the allocator with, in request order.
    pub predictions: Vec<VmPrediction>,
    pub latency_us: StageLatency,
}

/// Prediction cache counters.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct CacheStats {
    pub hits: u64,
    pub misses: u64,
    /// hits / (hits + misses); 0 before the first lookup.
    pub hit_rate: f64,
    pub entries: u64,
}

/// State of the long-lived-share safeguard.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SafeguardStatus {
    /// Every request is placed as short-lived until the cooldown ends.
    pub active: bool,
    /// Times the safeguard has tripped since start.
    pub trips: u64,
    /// Share of long-lived model predictions in the current window.
    pub long_share: f64,
    /// Model predictions in the current window.
    pub window_predictions: u64,
    /// Seconds of cooldown left (0 when inactive).
    pub cooldown_remaining_s: f64,
}

/// One inference server as the control service sees it.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct InferenceServerHealth {
    pub url: String,
    pub healthy: bool,
}

/// One zone's allocator and its latest statistics.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ZoneStats {
    pub allocator: String,
    /// The allocator's `/v1/stats` body, when it answered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<Object>))]
    pub stats: Option<serde_json::Value>,
    /// Why there are no statistics, when it did not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// `GET /v1/stats` of the control service.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ControlStats {
    /// Allocation requests that passed validation.
    pub requests: u64,
    pub placed: u64,
    pub rejected: u64,
    /// Requests answered with an error after validation (allocator unreachable, conflicts, ...).
    pub failed: u64,
    pub cache: CacheStats,
    /// VM predictions by source (`model`, `cache`, `fallback_timeout`, ...).
    pub predictions_by_source: BTreeMap<String, u64>,
    /// VM predictions that fell back to short-lived, by reason (`timeout`, `error`, `unavailable`,
    /// `safeguard`).
    pub fallbacks: BTreeMap<String, u64>,
    pub safeguard: SafeguardStatus,
    pub inference_servers: Vec<InferenceServerHealth>,
    pub zones: BTreeMap<String, ZoneStats>,
    /// The realized quality of the models, the quality gate and the last canary decision.
    #[serde(default)]
    pub quality: crate::quality::QualityStatus,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decision::{AllocationOutcome, Placement};
    use crate::ids::{ClusterId, HostId, RackId};
    use crate::prediction::PredictionSource;

    #[test]
    fn a_control_decision_round_trips_with_the_decision_flattened() {
        let prediction = LifetimePrediction::fallback(PredictionSource::FallbackTimeout);
        let decision = ControlDecision {
            zone: ZoneId("z".into()),
            decision: AllocationDecision {
                outcome: AllocationOutcome::Placed {
                    placements: vec![Placement {
                        vm_id: VmId("vm-1".into()),
                        host_id: HostId("h".into()),
                        rack_id: RackId("r".into()),
                        cluster_id: ClusterId("c".into()),
                        prediction: Some(prediction.clone()),
                    }],
                },
                rule_stats: Vec::new(),
                replayed: false,
            },
            predictions: vec![VmPrediction { vm_id: VmId("vm-1".into()), prediction }],
            latency_us: StageLatency { total_us: 7, ..StageLatency::default() },
        };
        let json = serde_json::to_value(&decision).unwrap();
        assert_eq!(json["status"], "placed");
        assert_eq!(json["placements"][0]["host_id"], "h");
        assert_eq!(json["predictions"][0]["prediction"]["source"], "fallback_timeout");
        let back: ControlDecision = serde_json::from_value(json).unwrap();
        assert_eq!(back, decision);
    }
}
