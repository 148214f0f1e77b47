//! Wire types of the inference server's `/v1` API.

use crate::prediction::LifetimePrediction;
use crate::request::{Features, Priority, RequestFacts, VmRequest};
use serde::{Deserialize, Serialize};

/// What the lifetime model needs to know about one VM at request time: a VM's [`RequestFacts`]
/// as the inference API takes them from any client, sizes as plain numbers of cores and GiB (as
/// traces have them, unrounded) and the tenant possibly unknown.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PredictInstance {
    /// Stable routing key for canary traffic (the VM id, say); defaults to tenant and VM type.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(
        feature = "openapi",
        schema(pattern = "^[^\\u0000-\\u001F\\u007F-\\u009F]*$", min_length = 1, max_length = 256)
    )]
    pub key: Option<String>,
    /// The tenant; empty when unknown (traces without one). At most 256 bytes.
    #[cfg_attr(feature = "openapi", schema(max_length = 256))]
    pub tenant_id: String,
    /// 1 to 256 bytes, no control characters.
    #[cfg_attr(
        feature = "openapi",
        schema(pattern = "^[^\\u0000-\\u001F\\u007F-\\u009F]*$", min_length = 1, max_length = 256)
    )]
    pub vm_type: String,
    #[cfg_attr(feature = "openapi", schema(exclusive_minimum = 0.0))]
    pub cores: f64,
    #[cfg_attr(feature = "openapi", schema(exclusive_minimum = 0.0))]
    pub memory_gib: f64,
    #[serde(default)]
    pub priority: Priority,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(
        feature = "openapi",
        schema(pattern = "^[^\\u0000-\\u001F\\u007F-\\u009F]*$", min_length = 1, max_length = 256)
    )]
    pub os: Option<String>,
    /// Request time in seconds on the model's clock; the server's clock when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requested_at_s: Option<f64>,
    #[serde(default, skip_serializing_if = "Features::is_empty")]
    #[cfg_attr(feature = "openapi", schema(schema_with = crate::request::features_schema))]
    pub features: Features,
}

impl PredictInstance {
    /// The model input of a VM request.
    pub fn from_vm(vm: &VmRequest) -> Self {
        PredictInstance::of(Some(vm.vm_id.to_string()), &vm.facts)
    }

    /// The model input of `facts`, routed by `key`.
    pub fn of(key: Option<String>, facts: &RequestFacts) -> Self {
        PredictInstance {
            key,
            tenant_id: facts.tenant_id.to_string(),
            vm_type: facts.vm_type.clone(),
            cores: facts.demand.cores(),
            memory_gib: facts.demand.memory_gib(),
            priority: facts.details.priority,
            os: facts.details.os.clone(),
            requested_at_s: facts.requested_at_s,
            features: facts.details.features.clone(),
        }
    }

    /// The canary routing key: an inference server sends it to the canary when its
    /// [`unit_hash`] is below the canary's share.
    pub fn routing_key(&self) -> String {
        self.key.clone().unwrap_or_else(|| format!("{}/{}", self.tenant_id, self.vm_type))
    }
}

/// FNV-1a of `key`, mapped onto [0, 1): the same key always lands on the same side.
pub fn unit_hash(key: &str) -> f64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in key.bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    // Finalise (splitmix64) so that keys differing only at the end still spread evenly.
    hash ^= hash >> 30;
    hash = hash.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    hash ^= hash >> 27;
    hash = hash.wrapping_mul(0x94d0_49bb_1331_11eb);
    hash ^= hash >> 31;
    (hash >> 11) as f64 / (1u64 << 53) as f64
}

/// `POST /v1/predict`.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PredictRequest {
    /// 1 to `max_batch` instances (1024 by default).
    #[cfg_attr(feature = "openapi", schema(min_items = 1, max_items = 1024))]
    pub instances: Vec<PredictInstance>,
    /// Also predict the lifetime interval (the multi-class model, for LA-multiclass). It costs about
    /// ten times the long-lived prediction, so it is off unless asked for.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub interval_class: bool,
    /// Events of the tenants' history to apply before predicting: the control service sends with
    /// each request what this server has not had yet, so a prediction always sees every arrival
    /// and exit the control service acknowledged before it. At most 1,000.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[cfg_attr(feature = "openapi", schema(max_items = 1000))]
    pub history: Vec<HistoryEvent>,
}

/// Something that happened to a VM, from which the inference servers keep their tenants' history
/// current (issue 18). Times are on the model's clock: a VM's request time when it started, the
/// release's time when it ended.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case", deny_unknown_fields)]
pub enum HistoryEvent {
    /// A VM of `tenant_id` and `vm_type` started (was placed) at `at_s`.
    Started {
        #[cfg_attr(feature = "openapi", schema(min_length = 1, max_length = 256))]
        vm_id: String,
        #[cfg_attr(feature = "openapi", schema(max_length = 256))]
        tenant_id: String,
        /// The VM's type: with the tenant, the job identity whose history the model may read.
        /// Optional for senders older than the job features.
        #[serde(default)]
        #[cfg_attr(feature = "openapi", schema(max_length = 256))]
        vm_type: String,
        at_s: f64,
    },
    /// A VM ended (was released) at `at_s`.
    Ended {
        #[cfg_attr(feature = "openapi", schema(min_length = 1, max_length = 256))]
        vm_id: String,
        at_s: f64,
    },
}

impl HistoryEvent {
    pub fn vm_id(&self) -> &str {
        match self {
            HistoryEvent::Started { vm_id, .. } | HistoryEvent::Ended { vm_id, .. } => vm_id,
        }
    }

    pub fn at_s(&self) -> f64 {
        match self {
            HistoryEvent::Started { at_s, .. } | HistoryEvent::Ended { at_s, .. } => *at_s,
        }
    }
}

/// `POST /v1/history`: events of the tenants' history, in the order they happened.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HistoryRequest {
    /// 1 to 1,000 events (a request of the most events with the longest ids stays under 1 MiB).
    #[cfg_attr(feature = "openapi", schema(min_items = 1, max_items = 1000))]
    pub events: Vec<HistoryEvent>,
}

/// One answer per instance, in order.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PredictResponse {
    pub predictions: Vec<LifetimePrediction>,
}

/// One VM and how long it has been running.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RemainingInstance {
    pub vm: PredictInstance,
    /// Seconds the VM has been running.
    #[cfg_attr(feature = "openapi", schema(minimum = 0.0))]
    pub uptime_s: f64,
}

/// `POST /v1/remaining-lifetime`.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RemainingRequest {
    /// 1 to `max_batch` instances (1024 by default).
    #[cfg_attr(feature = "openapi", schema(min_items = 1, max_items = 1024))]
    pub instances: Vec<RemainingInstance>,
}

#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RemainingPrediction {
    /// Predicted remaining lifetime in seconds (capped like the model's labels).
    pub remaining_lifetime_s: f64,
    pub model_version: String,
}

#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RemainingResponse {
    pub predictions: Vec<RemainingPrediction>,
}

#[cfg(test)]
mod tests {
    use super::unit_hash;

    #[test]
    fn unit_hash_is_stable_and_spreads_evenly() {
        assert_eq!(unit_hash("vm-1"), unit_hash("vm-1"));
        let share = (0..20_000).filter(|i| unit_hash(&format!("vm-{i}")) < 0.1).count() as f64 / 20_000.0;
        assert!((share - 0.1).abs() < 0.01, "{share}");
    }
}
