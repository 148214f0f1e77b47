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

// Request numbers are finite (JSON has no NaN, and validation refuses infinities), so equality
// is an equivalence and the bits hash it: requests with equal features share a placement class.
impl Eq for FeatureValue {}

impl std::hash::Hash for FeatureValue {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        match self {
            FeatureValue::Number(n) => (0u8, n.to_bits()).hash(state),
            FeatureValue::Text(text) => (1u8, text).hash(state),
        }
    }
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
///
/// Texts (`vm_type`, `os`, feature names and text values) are limited in UTF-8 bytes; the schema's
/// `maxLength` counts characters, which is the same for ASCII.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VmRequest {
    /// Unique for the VM's whole life; allocation is idempotent by it. The id charset
    /// (`validate::ID_CHARSET`): it is used in URLs.
    #[cfg_attr(feature = "openapi", schema(value_type = String, pattern = "^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$", min_length = 1, max_length = 128, example = "vm-0001"))]
    pub vm_id: VmId,
    /// The tenant (subscription) asking; the id charset.
    #[cfg_attr(feature = "openapi", schema(value_type = String, pattern = "^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$", min_length = 1, max_length = 128, example = "tenant-a"))]
    pub tenant_id: TenantId,
    /// VM type (size family); 1 to 256 bytes, no control characters.
    #[cfg_attr(
        feature = "openapi",
        schema(pattern = "^[^\\u0000-\\u001F\\u007F-\\u009F]*$", min_length = 1, max_length = 256, example = "D4s_v3")
    )]
    pub vm_type: String,
    #[cfg_attr(feature = "openapi", schema(schema_with = crate::resources::demand_schema))]
    pub demand: Resources,
    #[serde(default)]
    pub priority: Priority,
    /// Operating system; 1 to 256 bytes, no control characters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(
        feature = "openapi",
        schema(pattern = "^[^\\u0000-\\u001F\\u007F-\\u009F]*$", min_length = 1, max_length = 256)
    )]
    pub os: Option<String>,
    /// Request time in seconds (Unix time in the services, trace time in simulation). The control
    /// service stamps the arrival time when a client leaves it out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requested_at_s: Option<f64>,
    /// Zone to place the VM in; the control service's default zone when absent. Every VM of a gang
    /// names the same zone (or none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>, pattern = "^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$", min_length = 1, max_length = 128))]
    pub zone: Option<ZoneId>,
    /// Spread: at most this many VMs of the tenant on one rack (fault domain), this one included.
    #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "crate::whole_number::option")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<u64>, minimum = 1, maximum = 4_294_967_295_u64))]
    pub max_per_rack: Option<u32>,
    /// Further request-time features by name: at most 64; names of 1 to 256 bytes without control
    /// characters; a number or a text of at most 256 bytes.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[cfg_attr(feature = "openapi", schema(schema_with = features_schema))]
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

/// Several VMs of one tenant that must all be placed or none. Every VM names the gang's tenant,
/// VM ids are distinct, and the VMs name one zone (or none).
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GangRequest {
    #[cfg_attr(feature = "openapi", schema(value_type = String, pattern = "^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$", min_length = 1, max_length = 128))]
    pub tenant_id: TenantId,
    /// 1 to 100 VMs (the default `max_gang_size`).
    #[cfg_attr(feature = "openapi", schema(min_items = 1, max_items = 100))]
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

/// `VmRequest::features` as the checks of [`crate::validate`] accept it.
#[cfg(feature = "openapi")]
pub(crate) fn features_schema() -> utoipa::openapi::schema::Schema {
    use utoipa::openapi::schema::{AdditionalProperties, ObjectBuilder, OneOfBuilder, Type};
    let name = ObjectBuilder::new()
        .schema_type(Type::String)
        .min_length(Some(1))
        .max_length(Some(256))
        .pattern(Some(TEXT_PATTERN));
    let value = OneOfBuilder::new()
        .item(ObjectBuilder::new().schema_type(Type::Number))
        .item(ObjectBuilder::new().schema_type(Type::String).max_length(Some(256)));
    ObjectBuilder::new()
        .schema_type(Type::Object)
        .description(Some("Further request-time features by name (at most 64): a number or a text."))
        .max_properties(Some(64))
        .property_names(Some(name))
        .additional_properties(Some(AdditionalProperties::RefOr(value.into())))
        .into()
}

/// Exactly one key, `vm` or `gang` (serde's externally tagged form rejects any other key).
#[cfg(feature = "openapi")]
impl utoipa::PartialSchema for AllocationRequest {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        use utoipa::openapi::schema::{AdditionalProperties, ObjectBuilder, OneOfBuilder, Type};
        use utoipa::openapi::Ref;
        let variant = |name: &str, schema: &str, description: &str| {
            ObjectBuilder::new()
                .schema_type(Type::Object)
                .title(Some(name))
                .description(Some(description))
                .property(name, Ref::from_schema_name(schema))
                .required(name)
                .additional_properties(Some(AdditionalProperties::FreeForm(false)))
        };
        OneOfBuilder::new()
            .item(variant("vm", "VmRequest", "One VM."))
            .item(variant("gang", "GangRequest", "A gang: all of its VMs are placed, or none."))
            .description(Some("The body of an allocation request: `{\"vm\": {...}}` or `{\"gang\": {...}}`."))
            .examples([serde_json::json!({"vm": {
                "vm_id": "vm-0001", "tenant_id": "tenant-a", "vm_type": "D4s_v3",
                "demand": {"cores": 4, "memory_gib": 16}
            }})])
            .into()
    }
}

#[cfg(feature = "openapi")]
impl utoipa::ToSchema for AllocationRequest {
    fn schemas(schemas: &mut Vec<(String, utoipa::openapi::RefOr<utoipa::openapi::schema::Schema>)>) {
        use utoipa::PartialSchema;
        schemas.push(("VmRequest".to_owned(), VmRequest::schema()));
        schemas.push(("GangRequest".to_owned(), GangRequest::schema()));
        <VmRequest as utoipa::ToSchema>::schemas(schemas);
    }
}

/// The JSON Schema pattern of a text without control characters (`char::is_control`).
#[cfg(feature = "openapi")]
pub const TEXT_PATTERN: &str = "^[^\\u0000-\\u001F\\u007F-\\u009F]*$";

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
