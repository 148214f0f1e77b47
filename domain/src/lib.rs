//! Shared domain and wire types of the lifetime-aware VM allocation system.
//!
//! Everything that crosses a crate or process boundary lives here: resource vectors, the
//! zone > cluster > rack > host inventory, VM requests (single VMs and tenant gangs), lifetime
//! predictions with their source, allocation decisions and rejections, and the problem-details body
//! that every service returns on error. The JSON form of these types is the `/v1` wire format.
//!
//! Validation lives in one place, [`validate`]: [`decode_json`] parses a request body, rejects unknown
//! fields and bad types, then checks every domain rule and names the offending field.
//!
//! This crate knows nothing about HTTP servers, databases or models.

pub mod control;
pub mod decision;
pub mod hosts;
pub mod ids;
pub mod inference;
pub mod inventory;
#[cfg(feature = "openapi")]
pub mod openapi;
pub mod prediction;
pub mod problem;
pub mod quality;
pub mod request;
pub mod resources;
pub mod validate;
pub mod whole_number;

pub use control::{
    CacheStats, ControlDecision, ControlStats, InferenceServerHealth, SafeguardStatus, StageLatency, VmPrediction,
    ZoneStats,
};
pub use decision::{AllocationDecision, AllocationOutcome, Placement, Rejection, RejectionCode, RuleFilterStat};
pub use hosts::{
    ExplainRequest, HostDetail, HostInfo, HostPage, HostStateChange, HostSummary, HostUpdate, HostUpdated,
    PolicyHostState, RecordOutcome, RecordPlacement, RecordedPlacement, StoreStatus, VmInfo,
};
pub use ids::{ClusterId, HostId, RackId, TenantId, VmId, ZoneId};
pub use inference::{
    HistoryEvent, HistoryRequest, PredictInstance, PredictRequest, PredictResponse, RemainingInstance,
    RemainingPrediction, RemainingRequest, RemainingResponse,
};
pub use inventory::{ClusterSpec, HostEntry, HostSpec, HostState, InventorySpec, RackSpec, ZoneSpec};
pub use prediction::{LifetimeClass, LifetimePrediction, PredictionSource};
pub use problem::{Problem, ProblemKind, PROBLEM_CONTENT_TYPE};
pub use quality::{
    CanaryDecision, QualityFigures, QualityReport, QualityStatus, QualityTally, ResolvedOutcome, VersionQuality,
};
pub use request::{
    AllocationRequest, FeatureValue, Features, GangRequest, Priority, RequestDetails, RequestFacts, VmRequest,
};
pub use resources::{ResourceKind, Resources, RESOURCE_DIMS};
pub use validate::{decode_json, Validate, ValidationError, ValidationLimits};

/// Version segment of every HTTP path of the wire format (`/v1/...`).
pub const API_VERSION: &str = "v1";
