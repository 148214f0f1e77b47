//! The allocator's boundary types, as its HTTP API answers them and the control service passes
//! them on: a placed VM, a host (summary, detail, page), a host state change, the store's status,
//! the body of a dry-run placement (`POST /v1/explain`), and what a cloud reports: a host added or
//! changed (`PUT /v1/hosts/{host_id}`) and where a VM really is (`PUT /v1/allocations/{vm_id}`).

use crate::validate::{check_id_field, check_text, child, Validate, ValidationError, ValidationLimits};
use crate::ResourceKind;
use crate::{
    ClusterId, HostEntry, HostId, HostState, LifetimePrediction, RackId, Resources, TenantId, VmId, VmRequest,
};
use serde::{Deserialize, Serialize};

/// Most hosts a dry run lists.
pub const MAX_EXPLAIN_TOP: usize = 100;

/// One placed VM as the API shows it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct VmInfo {
    #[cfg_attr(feature = "openapi", schema(value_type = String))]
    pub vm_id: VmId,
    #[cfg_attr(feature = "openapi", schema(value_type = String))]
    pub host_id: HostId,
    #[cfg_attr(feature = "openapi", schema(value_type = String))]
    pub rack_id: RackId,
    #[cfg_attr(feature = "openapi", schema(value_type = String))]
    pub cluster_id: ClusterId,
    #[cfg_attr(feature = "openapi", schema(value_type = String))]
    pub tenant_id: TenantId,
    pub vm_type: String,
    /// `{"cores", "memory_gib", "ssd_gib"}` in whole units.
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub demand: Resources,
    /// When it was placed (allocator clock: Unix seconds).
    pub placed_at_s: f64,
    /// Its lifetime class under the policy (0 = shortest).
    pub lifetime_class: u8,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prediction: Option<LifetimePrediction>,
}

/// What every host view shows.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct HostInfo {
    #[cfg_attr(feature = "openapi", schema(value_type = String))]
    pub host_id: HostId,
    #[cfg_attr(feature = "openapi", schema(value_type = String))]
    pub rack_id: RackId,
    #[cfg_attr(feature = "openapi", schema(value_type = String))]
    pub cluster_id: ClusterId,
    pub hardware: String,
    /// `available`, `unavailable` (drained) or `failed`.
    #[cfg_attr(feature = "openapi", schema(value_type = String))]
    pub state: HostState,
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub capacity: Resources,
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub used: Resources,
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub free: Resources,
    /// The host's lifetime class: that of the longest predicted remaining lifetime of its VMs.
    pub lifetime_class: u8,
    /// When its last VM is predicted to exit (absent when empty or unbounded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub predicted_exit_s: Option<f64>,
    pub vm_count: usize,
    /// Its state under a stateful policy (LAVA: state, class, deadline, residual VMs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy_state: Option<PolicyHostState>,
}

/// A host's state under the stateful policy, as that policy keeps it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PolicyHostState {
    /// The stateful policy (`lava`).
    pub policy: String,
    /// Its state of the host (LAVA: `state`, `class`, `deadline_s`, `residual_vms`).
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub state: serde_json::Value,
}

/// A host in a listing: its VMs by id.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct HostSummary {
    #[serde(flatten)]
    pub host: HostInfo,
    /// Its VMs in placement order.
    #[cfg_attr(feature = "openapi", schema(value_type = Vec<String>))]
    pub vms: Vec<VmId>,
}

/// One host in full: its VMs with their details.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct HostDetail {
    #[serde(flatten)]
    pub host: HostInfo,
    /// Its VMs in placement order.
    pub vms: Vec<VmInfo>,
}

/// A page of hosts.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct HostPage {
    /// Hosts matching the filter, before paging.
    pub total: usize,
    pub offset: usize,
    pub hosts: Vec<HostSummary>,
}

/// The answer to a host state change.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct HostStateChange {
    #[cfg_attr(feature = "openapi", schema(value_type = String))]
    pub host_id: HostId,
    #[cfg_attr(feature = "openapi", schema(value_type = String))]
    pub previous: HostState,
    #[cfg_attr(feature = "openapi", schema(value_type = String))]
    pub state: HostState,
}

/// Whether the durable state is usable.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct StoreStatus {
    pub store: String,
    pub hosts: usize,
    pub vms: usize,
}

/// The body of `POST /v1/explain`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct ExplainRequest {
    /// The VM to place, as in an allocation request.
    pub vm: VmRequest,
    /// A host to explain the verdict on (a host of the inventory, else 422).
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>, min_length = 1, max_length = 256))]
    pub why_not: Option<HostId>,
    /// How many of the best hosts to list (default 5, at most 100).
    #[serde(default, deserialize_with = "crate::whole_number::option")]
    #[cfg_attr(feature = "openapi", schema(minimum = 1, maximum = 100))]
    pub top: Option<usize>,
}

impl Validate for ExplainRequest {
    fn validate(&self, limits: &ValidationLimits, _path: &str) -> Result<(), ValidationError> {
        self.vm.validate(limits, "vm")?;
        if let Some(host) = &self.why_not {
            if host.as_str().is_empty() || host.as_str().len() > limits.max_text_len {
                return Err(ValidationError::invalid(
                    "why_not",
                    format!("must be a host id of 1 to {} bytes", limits.max_text_len),
                ));
            }
        }
        if let Some(top) = self.top {
            if top == 0 || top > MAX_EXPLAIN_TOP {
                return Err(ValidationError::invalid("top", format!("must be between 1 and {MAX_EXPLAIN_TOP}")));
            }
        }
        Ok(())
    }
}

/// The body of `PUT /v1/hosts/{host_id}`: a host added to the inventory while the allocator runs,
/// or a change of its capacity, state or place.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct HostUpdate {
    /// What it offers to VMs (for a cloud host: (total - reserved) x allocation ratio); cores and
    /// memory greater than 0. Never below what its VMs use (409).
    #[cfg_attr(feature = "openapi", schema(schema_with = crate::resources::demand_schema))]
    pub capacity: Resources,
    /// Its state (a disabled compute service: `unavailable`); unchanged when absent, `available`
    /// for a new host.
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(inline))]
    pub state: Option<HostState>,
    /// Its cluster (the id charset); unchanged when absent, `cloud` for a new host.
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>, pattern = "^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$"))]
    pub cluster_id: Option<ClusterId>,
    /// Its rack (fault domain; the id charset); unchanged when absent, for a new host the
    /// rack named after its cluster.
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>, pattern = "^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$"))]
    pub rack_id: Option<RackId>,
    /// The hardware generation of a new cluster (`default` when absent); 1 to 256 bytes.
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(min_length = 1, max_length = 256))]
    pub hardware: Option<String>,
}

/// The answer to `PUT /v1/hosts/{host_id}`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct HostUpdated {
    #[cfg_attr(feature = "openapi", schema(value_type = String))]
    pub host_id: HostId,
    /// Whether the host is new to the inventory.
    pub added: bool,
    /// The host as the inventory now has it.
    pub entry: HostEntry,
    #[cfg_attr(feature = "openapi", schema(inline))]
    pub state: HostState,
}

/// The body of `PUT /v1/allocations/{vm_id}`: the VM is on `host_id` (a cloud's scheduler put or
/// moved it there).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct RecordPlacement {
    #[cfg_attr(feature = "openapi", schema(value_type = String, pattern = "^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$"))]
    pub host_id: HostId,
    /// The VM as it was requested (its `vm_id` is the path's); used when it is not placed yet.
    pub request: VmRequest,
}

/// What recording a VM on a host changed.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum RecordOutcome {
    /// It was there already.
    Unchanged,
    /// It was not placed; now it is.
    Placed,
    /// It was on another host (`from_host_id`); now it is on this one.
    Moved,
    /// It was there with another demand or VM type (the cloud resized it); now it has the
    /// request's, with its placement time and prediction kept. Not an exit.
    Resized,
}

/// The answer to `PUT /v1/allocations/{vm_id}`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RecordedPlacement {
    #[cfg_attr(feature = "openapi", schema(value_type = String))]
    pub vm_id: VmId,
    #[cfg_attr(feature = "openapi", schema(value_type = String))]
    pub host_id: HostId,
    pub recorded: RecordOutcome,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>))]
    pub from_host_id: Option<HostId>,
}

impl Validate for HostUpdate {
    fn validate(&self, limits: &ValidationLimits, path: &str) -> Result<(), ValidationError> {
        let capacity = child(path, "capacity");
        for kind in ResourceKind::ALL {
            if kind.required_in_demand() && self.capacity.base(kind) == 0 {
                return Err(ValidationError::invalid(child(&capacity, kind.field_name()), "must be greater than 0"));
            }
        }
        if let Some(cluster) = &self.cluster_id {
            check_id_field(cluster.as_str(), path, "cluster_id")?;
        }
        if let Some(rack) = &self.rack_id {
            check_id_field(rack.as_str(), path, "rack_id")?;
        }
        if let Some(hardware) = &self.hardware {
            check_text(hardware, limits, path, "hardware")?;
        }
        Ok(())
    }
}

impl Validate for RecordPlacement {
    fn validate(&self, limits: &ValidationLimits, path: &str) -> Result<(), ValidationError> {
        check_id_field(self.host_id.as_str(), path, "host_id")?;
        self.request.validate(limits, &child(path, "request"))
    }
}
