//! Allocation decisions: where each VM went, or why the request was rejected, with the per-rule
//! filtering figures that explain it.

use crate::ids::{ClusterId, HostId, RackId, VmId};
use crate::prediction::LifetimePrediction;
use serde::{Deserialize, Serialize};
use std::borrow::Cow;

/// How many hosts one rule of the rule engine saw and kept (its filtering factor).
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RuleFilterStat {
    /// The rule's registered name (borrowed from the rule as the allocator builds its answer, so a
    /// decision allocates no name).
    #[cfg_attr(feature = "openapi", schema(value_type = String))]
    pub rule: Cow<'static, str>,
    pub hosts_in: usize,
    pub hosts_kept: usize,
}

/// Where one VM was placed.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Placement {
    pub vm_id: VmId,
    pub host_id: HostId,
    pub rack_id: RackId,
    pub cluster_id: ClusterId,
    /// The prediction the placement acted on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prediction: Option<LifetimePrediction>,
}

/// Machine-readable reason of a rejection.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RejectionCode {
    /// Validator rules eliminated every host for some VM of the request.
    NoFeasibleHost,
    /// Each VM fits somewhere, but the gang does not fit all together.
    GangDoesNotFit,
    /// The request names a zone this deployment does not serve.
    UnknownZone,
}

/// Why a request was not placed.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Rejection {
    pub code: RejectionCode,
    pub detail: String,
    /// The VM that could not be placed, when one VM is to blame.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vm_id: Option<VmId>,
    /// For each validator rule, how many hosts it eliminated.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub eliminated_by: Vec<RuleFilterStat>,
}

/// Placed (every VM of the request, in request order) or rejected (nothing placed), told by `status`.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum AllocationOutcome {
    Placed { placements: Vec<Placement> },
    Rejected { rejection: Rejection },
}

/// The allocator's answer to one [`crate::AllocationRequest`].
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AllocationDecision {
    #[serde(flatten)]
    pub outcome: AllocationOutcome,
    /// Filtering factor of every rule, in rule order, for the (last) VM decided.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rule_stats: Vec<RuleFilterStat>,
    /// True when the VMs were already placed by an earlier request with the same VM ids: this is
    /// that request's answer again, and nothing was placed twice.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub replayed: bool,
}

impl AllocationDecision {
    pub fn is_placed(&self) -> bool {
        matches!(self.outcome, AllocationOutcome::Placed { .. })
    }
}
