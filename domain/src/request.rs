//! VM requests: a single VM or a tenant gang whose VMs are placed all or none.

use crate::ids::{TenantId, VmId, ZoneId};
use crate::prediction::LifetimePrediction;
use crate::resources::Resources;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;

/// Scheduling priority of a VM.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Priority {
    #[default]
    Regular,
    /// Evictable / spot capacity.
    Low,
}

impl Priority {
    pub fn as_str(self) -> &'static str {
        match self {
            Priority::Regular => "regular",
            Priority::Low => "low",
        }
    }
}

impl fmt::Display for Priority {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Priority {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "regular" => Ok(Priority::Regular),
            "low" => Ok(Priority::Low),
            other => Err(format!("unknown priority `{other}`, expected `regular` or `low`")),
        }
    }
}

/// An extra request-time feature (for example a trace's `batch_size` column): a number or a label.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum FeatureValue {
    Number(f64),
    Text(String),
}

impl fmt::Display for FeatureValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FeatureValue::Number(n) => write!(f, "{n}"),
            FeatureValue::Text(s) => f.write_str(s),
        }
    }
}

/// One VM to place.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VmRequest {
    pub vm_id: VmId,
    pub tenant_id: TenantId,
    pub vm_type: String,
    pub demand: Resources,
    #[serde(default)]
    pub priority: Priority,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub os: Option<String>,
    /// Request time in seconds (Unix time in the services, trace time in simulation). The control
    /// service stamps the arrival time when a client leaves it out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requested_at_s: Option<f64>,
    /// Zone to place the VM in; the control service's default zone when absent. Every VM of a gang
    /// names the same zone (or none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zone: Option<ZoneId>,
    /// Spread: at most this many VMs of the tenant on one rack (fault domain), this one included.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_per_rack: Option<u32>,
    /// Further request-time features by name.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub features: BTreeMap<String, FeatureValue>,
    /// The lifetime prediction the allocator acts on. The control service fills it in; none means
    /// short-lived.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prediction: Option<LifetimePrediction>,
}

impl VmRequest {
    /// A regular-priority VM with nothing but its identity and demand set.
    pub fn new(vm_id: &str, tenant_id: &str, vm_type: &str, demand: Resources) -> Self {
        VmRequest {
            vm_id: VmId(vm_id.to_owned()),
            tenant_id: TenantId(tenant_id.to_owned()),
            vm_type: vm_type.to_owned(),
            demand,
            priority: Priority::Regular,
            os: None,
            requested_at_s: None,
            zone: None,
            max_per_rack: None,
            features: BTreeMap::new(),
            prediction: None,
        }
    }
}

/// Several VMs of one tenant that must all be placed or none.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GangRequest {
    pub tenant_id: TenantId,
    pub vms: Vec<VmRequest>,
}

/// The body of an allocation request: `{"vm": {...}}` or `{"gang": {...}}`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
// A request is a short-lived value, one per call, and the single VM is the common case: boxing it to
// shrink the enum would cost an allocation per request and save nothing.
#[allow(clippy::large_enum_variant)]
pub enum AllocationRequest {
    Vm(VmRequest),
    Gang(GangRequest),
}

impl AllocationRequest {
    /// The VMs of the request, one for a single VM.
    pub fn vms(&self) -> &[VmRequest] {
        match self {
            AllocationRequest::Vm(vm) => std::slice::from_ref(vm),
            AllocationRequest::Gang(gang) => &gang.vms,
        }
    }

    /// Mutable access, for the control service to inject predictions.
    pub fn vms_mut(&mut self) -> &mut [VmRequest] {
        match self {
            AllocationRequest::Vm(vm) => std::slice::from_mut(vm),
            AllocationRequest::Gang(gang) => &mut gang.vms,
        }
    }

    /// The zone the request names, if any (validation makes every VM of a gang agree).
    pub fn zone(&self) -> Option<&ZoneId> {
        self.vms().iter().find_map(|vm| vm.zone.as_ref())
    }

    pub fn tenant_id(&self) -> &TenantId {
        match self {
            AllocationRequest::Vm(vm) => &vm.tenant_id,
            AllocationRequest::Gang(gang) => &gang.tenant_id,
        }
    }
}
