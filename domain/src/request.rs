//! VM requests: a single VM or a tenant gang whose VMs are placed all or none.

use crate::ids::{HostId, TenantId, VmId, ZoneId};
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

/// What a request says of the VM it asks for: the one shape of it that the wire form
/// ([`VmRequest`]), the placed VM and the stores (`placement::NewVm`), the lifetime model's input
/// (`lifetime_model::RequestFeatures::of`) and the rules' view (`placement::rules::RequestTraits`)
/// share. Who asks, for what and when are fields of their own (the stores' columns); everything
/// else is in [`RequestDetails`], which the stores keep and export whole, whatever it holds.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RequestFacts {
    pub tenant_id: TenantId,
    pub vm_type: String,
    pub demand: Resources,
    /// Request time in seconds (Unix time in the services, trace time in simulation).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requested_at_s: Option<f64>,
    #[serde(flatten)]
    pub details: RequestDetails,
}

impl RequestFacts {
    /// A regular-priority VM of `tenant_id` and `vm_type` with nothing but its demand set.
    pub fn new(tenant_id: &str, vm_type: &str, demand: Resources) -> Self {
        RequestFacts {
            tenant_id: TenantId(tenant_id.to_owned()),
            vm_type: vm_type.to_owned(),
            demand,
            requested_at_s: None,
            details: RequestDetails::default(),
        }
    }
}

/// The request-time facts of a VM beyond who asks, for what and when: its priority, OS and further
/// features. A typed fact is added here (and to [`VmRequestWire`] and `validate`'s check of the
/// facts); the stores keep it with the rest as one JSON value (none at all when every detail is a
/// default: the common request), the trace export writes it as a column.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RequestDetails {
    /// Written even when regular: the wire's `VmRequest` always names it.
    #[serde(default)]
    pub priority: Priority,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub os: Option<String>,
    #[serde(default, skip_serializing_if = "Features::is_empty")]
    pub features: Features,
}

impl RequestDetails {
    /// Regular priority, no OS, no features.
    pub fn is_default(&self) -> bool {
        *self == RequestDetails::default()
    }

    /// The details' names as they are serialised, in declaration order (read off serde, so a new
    /// detail is named here with no further line): the trace export's columns of the details.
    pub fn names() -> &'static [&'static str] {
        static NAMES: std::sync::OnceLock<&'static [&'static str]> = std::sync::OnceLock::new();
        NAMES.get_or_init(struct_field_names::<RequestDetails>)
    }

    /// The details as the texts of trace columns by name: a text as it is, anything else as
    /// JSON; defaults are left out.
    pub fn columns(&self) -> BTreeMap<String, String> {
        let Ok(serde_json::Value::Object(details)) = serde_json::to_value(self) else { return BTreeMap::new() };
        let text = |value: serde_json::Value| match value {
            serde_json::Value::String(text) => text,
            other => other.to_string(),
        };
        details.into_iter().map(|(name, value)| (name, text(value))).collect()
    }
}

/// The field names a derived `Deserialize` of `T` (a struct) knows: serde hands them to the
/// deserializer, which stops there.
fn struct_field_names<'de, T: Deserialize<'de>>() -> &'static [&'static str] {
    use serde::de::{Error, Visitor};
    struct Names<'a>(&'a mut &'static [&'static str]);
    impl<'de> serde::Deserializer<'de> for Names<'_> {
        type Error = serde::de::value::Error;
        fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Self::Error> {
            Err(Error::custom("not a struct"))
        }
        fn deserialize_struct<V: Visitor<'de>>(
            self,
            _: &'static str,
            fields: &'static [&'static str],
            _: V,
        ) -> Result<V::Value, Self::Error> {
            *self.0 = fields;
            Err(Error::custom("names read"))
        }
        serde::forward_to_deserialize_any! {
            bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf option unit
            unit_struct newtype_struct seq tuple tuple_struct map enum identifier ignored_any
        }
    }
    let mut names: &'static [&'static str] = &[];
    let _ = T::deserialize(Names(&mut names));
    names
}

/// A request's further request-time features ([`VmRequest`]'s `features`), by name in name order,
/// held in one exact-size allocation: a map of one or two entries took a whole tree node, about
/// 540 bytes, for each placed VM that had any (issue 44), and none is allocated when there are
/// none. On the wire and in the stores, a JSON object of the features by name.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Features(Box<[(Box<str>, FeatureValue)]>);

impl Features {
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn get(&self, name: &str) -> Option<&FeatureValue> {
        // Sorted by name, as the map was.
        let at = self.0.binary_search_by(|(n, _)| (**n).cmp(name)).ok()?;
        Some(&self.0[at].1)
    }

    /// Every feature by name, in name order.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = (&str, &FeatureValue)> {
        self.0.iter().map(|(name, value)| (&**name, value))
    }

    /// Sets feature `name` to `value` (rebuilding the list: for building requests, not a hot path).
    pub fn insert(&mut self, name: String, value: FeatureValue) {
        let mut map = self.to_map();
        map.insert(name, value);
        *self = Features::from(map);
    }

    /// The features as a map by name.
    pub fn to_map(&self) -> BTreeMap<String, FeatureValue> {
        self.iter().map(|(name, value)| (name.to_owned(), value.clone())).collect()
    }
}

impl From<BTreeMap<String, FeatureValue>> for Features {
    fn from(features: BTreeMap<String, FeatureValue>) -> Self {
        Features(features.into_iter().map(|(name, value)| (name.into_boxed_str(), value)).collect())
    }
}

/// As a map of the pairs: sorted by name, the last of a repeated name kept.
impl<const N: usize> From<[(String, FeatureValue); N]> for Features {
    fn from(features: [(String, FeatureValue); N]) -> Self {
        Features::from(BTreeMap::from(features))
    }
}

impl Serialize for Features {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_map(self.iter())
    }
}

impl<'de> Deserialize<'de> for Features {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        BTreeMap::<String, FeatureValue>::deserialize(deserializer).map(Features::from)
    }
}

/// One VM to place: its identity, its [`RequestFacts`], where it may go and the lifetime
/// prediction it is placed with. On the wire, one flat object ([`VmRequestWire`]).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(from = "VmRequestWire")]
pub struct VmRequest {
    pub vm_id: VmId,
    #[serde(flatten)]
    pub facts: RequestFacts,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zone: Option<ZoneId>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_per_rack: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prediction: Option<LifetimePrediction>,
    /// The hosts it may go to, when a cloud's own scheduler has narrowed them (its filters'
    /// survivors); any host of the zone when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub candidates: Option<Vec<HostId>>,
}

impl VmRequest {
    /// A regular-priority VM with nothing but its identity and demand set.
    pub fn new(vm_id: &str, tenant_id: &str, vm_type: &str, demand: Resources) -> Self {
        VmRequest::of(VmId(vm_id.to_owned()), RequestFacts::new(tenant_id, vm_type, demand))
    }

    /// VM `vm_id` with `facts`, placed anywhere, with no prediction.
    pub fn of(vm_id: VmId, facts: RequestFacts) -> Self {
        VmRequest { vm_id, facts, zone: None, max_per_rack: None, prediction: None, candidates: None }
    }
}

/// [`VmRequest`] as it is read off the wire: one flat object whose unknown keys are refused and
/// whose errors name the field (serde's `flatten` would lose both).
///
/// Texts (`vm_type`, `os`, feature names and text values) are limited in UTF-8 bytes; the schema's
/// `maxLength` counts characters, which is the same for ASCII.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema), schema(as = VmRequest))]
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct VmRequestWire {
    /// Unique for the VM's whole life; allocation is idempotent by it. The id charset
    /// (`validate::ID_CHARSET`): it is used in URLs.
    #[cfg_attr(feature = "openapi", schema(value_type = String, pattern = "^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$", min_length = 1, max_length = 128, example = "vm-0001"))]
    vm_id: VmId,
    /// The tenant (subscription) asking; the id charset.
    #[cfg_attr(feature = "openapi", schema(value_type = String, pattern = "^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$", min_length = 1, max_length = 128, example = "tenant-a"))]
    tenant_id: TenantId,
    /// VM type (size family); 1 to 256 bytes, no control characters.
    #[cfg_attr(
        feature = "openapi",
        schema(pattern = "^[^\\u0000-\\u001F\\u007F-\\u009F]*$", min_length = 1, max_length = 256, example = "D4s_v3")
    )]
    vm_type: String,
    #[cfg_attr(feature = "openapi", schema(schema_with = crate::resources::demand_schema))]
    demand: Resources,
    #[serde(default)]
    priority: Priority,
    /// Operating system; 1 to 256 bytes, no control characters.
    #[serde(default)]
    #[cfg_attr(
        feature = "openapi",
        schema(pattern = "^[^\\u0000-\\u001F\\u007F-\\u009F]*$", min_length = 1, max_length = 256)
    )]
    os: Option<String>,
    /// Request time in seconds (Unix time in the services, trace time in simulation). The control
    /// service stamps the arrival time when a client leaves it out.
    #[serde(default)]
    requested_at_s: Option<f64>,
    /// Zone to place the VM in; the control service's default zone when absent. Every VM of a gang
    /// names the same zone (or none).
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>, pattern = "^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$", min_length = 1, max_length = 128))]
    zone: Option<ZoneId>,
    /// Spread: at most this many VMs of the tenant on one rack (fault domain), this one included.
    #[serde(default, deserialize_with = "crate::whole_number::option")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<u64>, minimum = 1, maximum = 4_294_967_295_u64))]
    max_per_rack: Option<u32>,
    /// Further request-time features by name: at most 64; names of 1 to 256 bytes without control
    /// characters; a number or a text of at most 256 bytes.
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(schema_with = features_schema))]
    features: Features,
    /// The lifetime prediction the allocator acts on. The control service fills it in; none means
    /// short-lived.
    #[serde(default)]
    prediction: Option<LifetimePrediction>,
    /// The hosts the VM may go to (1 to 1000 ids), when a cloud's scheduler has narrowed them:
    /// the allocator's policy chooses among these alone, and ids it does not know are passed over.
    /// Any host of the zone when absent.
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<Vec<String>>, min_items = 1, max_items = 1000))]
    candidates: Option<Vec<HostId>>,
}

impl From<VmRequestWire> for VmRequest {
    fn from(wire: VmRequestWire) -> Self {
        let VmRequestWire {
            vm_id,
            tenant_id,
            vm_type,
            demand,
            priority,
            os,
            requested_at_s,
            zone,
            max_per_rack,
            features,
            prediction,
            candidates,
        } = wire;
        let details = RequestDetails { priority, os, features };
        let facts = RequestFacts { tenant_id, vm_type, demand, requested_at_s, details };
        VmRequest { vm_id, facts, zone, max_per_rack, prediction, candidates }
    }
}

/// The schema of the wire form, under the name `VmRequest`.
#[cfg(feature = "openapi")]
impl utoipa::PartialSchema for VmRequest {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        <VmRequestWire as utoipa::PartialSchema>::schema()
    }
}

#[cfg(feature = "openapi")]
impl utoipa::ToSchema for VmRequest {
    fn name() -> std::borrow::Cow<'static, str> {
        <VmRequestWire as utoipa::ToSchema>::name()
    }

    fn schemas(schemas: &mut Vec<(String, utoipa::openapi::RefOr<utoipa::openapi::schema::Schema>)>) {
        <VmRequestWire as utoipa::ToSchema>::schemas(schemas);
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
            AllocationRequest::Vm(vm) => &vm.facts.tenant_id,
            AllocationRequest::Gang(gang) => &gang.tenant_id,
        }
    }
}
