//! Validation of everything a client can send, in one place.
//!
//! [`decode_json`] is the only way a service turns a request body into a domain value: serde rejects
//! syntax errors, wrong types, missing and unknown fields (400); then [`Validate`] checks the domain
//! rules (422). Both kinds of error name the offending field by its path, e.g.
//! `gang.vms[2].demand.cores`.
//!
//! Ids that end up in a URL (VM, tenant and zone ids) are restricted to [`ID_CHARSET`], so that a
//! placed VM can always be looked up and released by its id: `.`, `..`, `/`, `%`, `?` or whitespace in
//! an id would be rewritten or cut by HTTP clients and servers on the way.

use crate::ids::{TenantId, VmId};
use crate::inference::{HistoryEvent, HistoryRequest, PredictInstance, PredictRequest, RemainingRequest};
use crate::prediction::LifetimePrediction;
use crate::request::{AllocationRequest, FeatureValue, GangRequest, RequestDetails, RequestFacts, VmRequest};
use crate::resources::ResourceKind;
use serde::de::DeserializeOwned;
use std::collections::HashSet;

/// The id character set, as documented in the API: a letter or digit, then up to 127 letters,
/// digits, `.`, `_`, `:` or `-`.
pub const ID_CHARSET: &str = "[A-Za-z0-9][A-Za-z0-9._:-]{0,127}";

/// Longest id, in bytes (every allowed character is one byte).
pub const MAX_ID_LEN: usize = 128;

/// Why `id` is not a valid id ([`ID_CHARSET`]), or `None` when it is.
pub fn id_problem(id: &str) -> Option<String> {
    let mut bytes = id.bytes();
    let Some(first) = bytes.next() else {
        return Some("must not be empty".to_owned());
    };
    if id.len() > MAX_ID_LEN {
        return Some(format!("must be at most {MAX_ID_LEN} characters, got {}", id.len()));
    }
    if !first.is_ascii_alphanumeric() {
        return Some(format!("must start with a letter or digit ({ID_CHARSET})"));
    }
    if bytes.any(|b| !(b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'-'))) {
        return Some(format!("may hold only letters, digits, `.`, `_`, `:` and `-` ({ID_CHARSET})"));
    }
    None
}

/// Checks an id that arrived outside a body (a URL path or query); `field` names it in the error.
pub fn check_id(id: &str, field: &str) -> Result<(), ValidationError> {
    match id_problem(id) {
        Some(message) => Err(ValidationError::invalid(field, message)),
        None => Ok(()),
    }
}

pub(crate) fn check_id_field(value: &str, path: &str, name: &str) -> Result<(), ValidationError> {
    check_id(value, &child(path, name))
}

/// Most candidate hosts one VM request may list (`candidates`).
pub const MAX_CANDIDATES: usize = 1000;

/// Limits a deployment may tune.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ValidationLimits {
    /// Most VMs in one gang request.
    pub max_gang_size: usize,
    /// Longest id, VM type or label, in bytes.
    pub max_text_len: usize,
    /// Most extra features on one VM.
    pub max_features: usize,
    /// Most instances in one prediction batch.
    pub max_batch: usize,
}

impl Default for ValidationLimits {
    fn default() -> Self {
        ValidationLimits { max_gang_size: 100, max_text_len: 256, max_features: 64, max_batch: 1024 }
    }
}

/// A rejected request, naming the field at fault.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ValidationError {
    /// The body is not JSON of the expected shape (syntax, type, missing or unknown field).
    #[error("malformed field `{field}`: {message}")]
    Malformed { field: String, message: String },
    /// The body is well-formed but breaks a domain rule.
    #[error("invalid field `{field}`: {message}")]
    Invalid { field: String, message: String },
}

impl ValidationError {
    pub fn invalid(field: impl Into<String>, message: impl Into<String>) -> Self {
        ValidationError::Invalid { field: field.into(), message: message.into() }
    }

    pub fn field(&self) -> &str {
        match self {
            ValidationError::Malformed { field, .. } | ValidationError::Invalid { field, .. } => field,
        }
    }

    pub fn message(&self) -> &str {
        match self {
            ValidationError::Malformed { message, .. } | ValidationError::Invalid { message, .. } => message,
        }
    }
}

/// Domain rules of a value that arrived from outside.
pub trait Validate {
    /// Checks every rule; `path` is where the value sits in the request (empty at the root).
    fn validate(&self, limits: &ValidationLimits, path: &str) -> Result<(), ValidationError>;
}

/// Parses and validates a request body.
pub fn decode_json<T: DeserializeOwned + Validate>(
    body: &[u8],
    limits: &ValidationLimits,
) -> Result<T, ValidationError> {
    let mut deserializer = serde_json::Deserializer::from_slice(body);
    let value: T = serde_path_to_error::deserialize(&mut deserializer).map_err(|err| {
        let mut field = err.path().to_string();
        let message = err.inner().to_string();
        // serde reports an unknown top-level key (`{"vmm": ...}`) at the root; point at the key itself.
        if field == "." {
            if let Some(name) = message.strip_prefix("unknown variant `").and_then(|rest| rest.split('`').next()) {
                field = name.to_owned();
            }
        }
        ValidationError::Malformed { field, message }
    })?;
    deserializer.end().map_err(|err| ValidationError::Malformed { field: ".".to_owned(), message: err.to_string() })?;
    value.validate(limits, "")?;
    Ok(value)
}

pub(crate) fn child(path: &str, name: &str) -> String {
    if path.is_empty() {
        name.to_owned()
    } else {
        format!("{path}.{name}")
    }
}

pub(crate) fn check_text(
    value: &str,
    limits: &ValidationLimits,
    path: &str,
    name: &str,
) -> Result<(), ValidationError> {
    if value.is_empty() {
        return Err(ValidationError::invalid(child(path, name), "must not be empty"));
    }
    if value.len() > limits.max_text_len {
        return Err(ValidationError::invalid(
            child(path, name),
            format!("must be at most {} bytes, got {}", limits.max_text_len, value.len()),
        ));
    }
    if value.chars().any(char::is_control) {
        return Err(ValidationError::invalid(child(path, name), "must not contain control characters"));
    }
    Ok(())
}

fn check_finite(value: f64, path: &str, name: &str) -> Result<(), ValidationError> {
    if value.is_finite() {
        Ok(())
    } else {
        Err(ValidationError::invalid(child(path, name), format!("must be a finite number, got {value}")))
    }
}

/// The facts sit beside the request's other fields on the wire: `path` is the request's.
impl Validate for RequestFacts {
    fn validate(&self, limits: &ValidationLimits, path: &str) -> Result<(), ValidationError> {
        check_id_field(self.tenant_id.as_str(), path, "tenant_id")?;
        check_text(&self.vm_type, limits, path, "vm_type")?;
        let demand_path = child(path, "demand");
        for kind in ResourceKind::ALL {
            if kind.required_in_demand() && self.demand.base(kind) == 0 {
                return Err(ValidationError::invalid(child(&demand_path, kind.field_name()), "must be greater than 0"));
            }
        }
        if let Some(at) = self.requested_at_s {
            check_finite(at, path, "requested_at_s")?;
        }
        self.details.validate(limits, path)
    }
}

/// The details sit beside the request's other fields on the wire: `path` is the request's.
impl Validate for RequestDetails {
    fn validate(&self, limits: &ValidationLimits, path: &str) -> Result<(), ValidationError> {
        if let Some(os) = &self.os {
            check_text(os, limits, path, "os")?;
        }
        check_features(self.features.iter(), limits, path)
    }
}

impl Validate for VmRequest {
    fn validate(&self, limits: &ValidationLimits, path: &str) -> Result<(), ValidationError> {
        check_id_field(self.vm_id.as_str(), path, "vm_id")?;
        self.facts.validate(limits, path)?;
        if let Some(zone) = &self.zone {
            check_id_field(zone.as_str(), path, "zone")?;
        }
        if self.max_per_rack == Some(0) {
            return Err(ValidationError::invalid(child(path, "max_per_rack"), "must be at least 1 when given"));
        }
        if let Some(prediction) = &self.prediction {
            prediction.validate(limits, &child(path, "prediction"))?;
        }
        if let Some(candidates) = &self.candidates {
            let field = child(path, "candidates");
            if candidates.is_empty() || candidates.len() > MAX_CANDIDATES {
                let message = format!("must list 1 to {MAX_CANDIDATES} host ids, got {}", candidates.len());
                return Err(ValidationError::invalid(field, message));
            }
            for (position, host) in candidates.iter().enumerate() {
                check_id(host.as_str(), &format!("{field}[{position}]"))?;
            }
        }
        Ok(())
    }
}

impl Validate for LifetimePrediction {
    fn validate(&self, limits: &ValidationLimits, path: &str) -> Result<(), ValidationError> {
        if !(0.0..=1.0).contains(&self.p_long) {
            return Err(ValidationError::invalid(
                child(path, "p_long"),
                format!("must be in [0, 1], got {}", self.p_long),
            ));
        }
        if let Some(expected) = self.expected_lifetime_s {
            if !expected.is_finite() || expected < 0.0 {
                return Err(ValidationError::invalid(
                    child(path, "expected_lifetime_s"),
                    format!("must be a finite non-negative number of seconds, got {expected}"),
                ));
            }
        }
        if let Some(version) = &self.model_version {
            check_text(version, limits, path, "model_version")?;
        }
        Ok(())
    }
}

impl Validate for GangRequest {
    fn validate(&self, limits: &ValidationLimits, path: &str) -> Result<(), ValidationError> {
        check_id_field(self.tenant_id.as_str(), path, "tenant_id")?;
        if self.vms.is_empty() {
            return Err(ValidationError::invalid(child(path, "vms"), "a gang needs at least one VM"));
        }
        if self.vms.len() > limits.max_gang_size {
            return Err(ValidationError::invalid(
                child(path, "vms"),
                format!("a gang may hold at most {} VMs, got {}", limits.max_gang_size, self.vms.len()),
            ));
        }
        let mut seen: HashSet<&VmId> = HashSet::with_capacity(self.vms.len());
        let gang_zone = self.vms.iter().find_map(|vm| vm.zone.as_ref());
        for (i, vm) in self.vms.iter().enumerate() {
            let vm_path = format!("{}[{i}]", child(path, "vms"));
            vm.validate(limits, &vm_path)?;
            if vm.facts.tenant_id != self.tenant_id {
                return Err(ValidationError::invalid(
                    child(&vm_path, "tenant_id"),
                    format!("must equal the gang's tenant `{}`, got `{}`", self.tenant_id, vm.facts.tenant_id),
                ));
            }
            if let (Some(zone), Some(gang_zone)) = (&vm.zone, gang_zone) {
                if zone != gang_zone {
                    return Err(ValidationError::invalid(
                        child(&vm_path, "zone"),
                        format!("every VM of a gang must be in one zone: `{gang_zone}` named first, got `{zone}`"),
                    ));
                }
            }
            if !seen.insert(&vm.vm_id) {
                return Err(ValidationError::invalid(
                    child(&vm_path, "vm_id"),
                    format!("`{}` appears twice in the gang", vm.vm_id),
                ));
            }
        }
        Ok(())
    }
}

impl Validate for AllocationRequest {
    fn validate(&self, limits: &ValidationLimits, path: &str) -> Result<(), ValidationError> {
        match self {
            AllocationRequest::Vm(vm) => vm.validate(limits, &child(path, "vm")),
            AllocationRequest::Gang(gang) => gang.validate(limits, &child(path, "gang")),
        }
    }
}

fn check_features<'a>(
    features: impl ExactSizeIterator<Item = (&'a str, &'a FeatureValue)>,
    limits: &ValidationLimits,
    path: &str,
) -> Result<(), ValidationError> {
    if features.len() > limits.max_features {
        return Err(ValidationError::invalid(
            child(path, "features"),
            format!("at most {} features are allowed, got {}", limits.max_features, features.len()),
        ));
    }
    let features_path = child(path, "features");
    for (name, value) in features {
        check_text(name, limits, &features_path, "<name>")?;
        match value {
            FeatureValue::Number(n) => check_finite(*n, &features_path, name)?,
            FeatureValue::Text(text) if text.len() > limits.max_text_len => {
                return Err(ValidationError::invalid(
                    child(&features_path, name),
                    format!("must be at most {} bytes", limits.max_text_len),
                ))
            }
            FeatureValue::Text(_) => {}
        }
    }
    Ok(())
}

fn check_positive(value: f64, path: &str, name: &str) -> Result<(), ValidationError> {
    check_finite(value, path, name)?;
    if value > 0.0 {
        Ok(())
    } else {
        Err(ValidationError::invalid(child(path, name), format!("must be greater than 0, got {value}")))
    }
}

fn check_batch(len: usize, limits: &ValidationLimits, path: &str) -> Result<(), ValidationError> {
    if len == 0 {
        return Err(ValidationError::invalid(child(path, "instances"), "needs at least one instance"));
    }
    if len > limits.max_batch {
        return Err(ValidationError::invalid(
            child(path, "instances"),
            format!("at most {} instances per request, got {len}", limits.max_batch),
        ));
    }
    Ok(())
}

impl Validate for PredictInstance {
    fn validate(&self, limits: &ValidationLimits, path: &str) -> Result<(), ValidationError> {
        if let Some(key) = &self.key {
            check_text(key, limits, path, "key")?;
        }
        // An empty tenant means "unknown tenant" (traces without one); it only needs to be short.
        if self.tenant_id.len() > limits.max_text_len {
            return Err(ValidationError::invalid(
                child(path, "tenant_id"),
                format!("must be at most {} bytes", limits.max_text_len),
            ));
        }
        check_text(&self.vm_type, limits, path, "vm_type")?;
        check_positive(self.cores, path, "cores")?;
        check_positive(self.memory_gib, path, "memory_gib")?;
        if let Some(os) = &self.os {
            check_text(os, limits, path, "os")?;
        }
        if let Some(at) = self.requested_at_s {
            check_finite(at, path, "requested_at_s")?;
        }
        check_features(self.features.iter(), limits, path)
    }
}

impl Validate for PredictRequest {
    fn validate(&self, limits: &ValidationLimits, path: &str) -> Result<(), ValidationError> {
        check_batch(self.instances.len(), limits, path)?;
        for (i, instance) in self.instances.iter().enumerate() {
            instance.validate(limits, &format!("{}[{i}]", child(path, "instances")))?;
        }
        check_history(&self.history, limits, &child(path, "history"), 0)
    }
}

/// Most history events in one request.
pub const MAX_HISTORY_EVENTS: usize = 1_000;

/// Checks `events` (at least `min` of them) at `path`: ids and tenants short and printable, times
/// finite.
fn check_history(
    events: &[HistoryEvent],
    limits: &ValidationLimits,
    path: &str,
    min: usize,
) -> Result<(), ValidationError> {
    if events.len() < min || events.len() > MAX_HISTORY_EVENTS {
        return Err(ValidationError::invalid(
            path,
            format!("{min} to {MAX_HISTORY_EVENTS} events per request, got {}", events.len()),
        ));
    }
    for (i, event) in events.iter().enumerate() {
        let at = format!("{path}[{i}]");
        check_text(event.vm_id(), limits, &at, "vm_id")?;
        check_finite(event.at_s(), &at, "at_s")?;
        if let HistoryEvent::Started { tenant_id, vm_type, .. } = event {
            for (field, value) in [("tenant_id", tenant_id), ("vm_type", vm_type)] {
                if value.len() > limits.max_text_len || value.chars().any(char::is_control) {
                    return Err(ValidationError::invalid(
                        child(&at, field),
                        format!("must be at most {} bytes, without control characters", limits.max_text_len),
                    ));
                }
            }
        }
    }
    Ok(())
}

impl Validate for HistoryRequest {
    fn validate(&self, limits: &ValidationLimits, path: &str) -> Result<(), ValidationError> {
        check_history(&self.events, limits, &child(path, "events"), 1)
    }
}

impl Validate for RemainingRequest {
    fn validate(&self, limits: &ValidationLimits, path: &str) -> Result<(), ValidationError> {
        check_batch(self.instances.len(), limits, path)?;
        for (i, instance) in self.instances.iter().enumerate() {
            let instance_path = format!("{}[{i}]", child(path, "instances"));
            instance.vm.validate(limits, &child(&instance_path, "vm"))?;
            check_finite(instance.uptime_s, &instance_path, "uptime_s")?;
            if instance.uptime_s < 0.0 {
                return Err(ValidationError::invalid(child(&instance_path, "uptime_s"), "must not be negative"));
            }
        }
        Ok(())
    }
}

impl Validate for TenantId {
    fn validate(&self, _limits: &ValidationLimits, path: &str) -> Result<(), ValidationError> {
        check_id_field(self.as_str(), path, "tenant_id")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode(body: &str) -> Result<AllocationRequest, ValidationError> {
        decode_json(body.as_bytes(), &ValidationLimits { max_gang_size: 3, ..ValidationLimits::default() })
    }

    const VM: &str = r#"{"vm_id":"vm-1","tenant_id":"t1","vm_type":"D2","demand":{"cores":2,"memory_gib":8}}"#;

    #[test]
    fn accepts_a_single_vm_with_defaults() {
        let req = decode(&format!(r#"{{"vm":{VM}}}"#)).unwrap();
        let vm = &req.vms()[0];
        assert_eq!(vm.vm_id.as_str(), "vm-1");
        assert_eq!(vm.facts.demand.cores(), 2.0);
        assert_eq!(vm.facts.details.priority, crate::Priority::Regular);
        assert!(vm.prediction.is_none());
    }

    fn field_of(body: &str) -> (String, bool) {
        match decode(body).unwrap_err() {
            ValidationError::Malformed { field, .. } => (field, false),
            ValidationError::Invalid { field, .. } => (field, true),
        }
    }

    #[test]
    fn errors_name_the_field() {
        let cases = [
            (
                r#"{"vm":{"vm_id":"","tenant_id":"t","vm_type":"a","demand":{"cores":1,"memory_gib":1}}}"#,
                "vm.vm_id",
                true,
            ),
            (
                r#"{"vm":{"vm_id":"v","tenant_id":"t","vm_type":"a","demand":{"cores":0,"memory_gib":1}}}"#,
                "vm.demand.cores",
                true,
            ),
            (
                r#"{"vm":{"vm_id":"v","tenant_id":"t","vm_type":"a","demand":{"cores":1,"memory_gib":-1}}}"#,
                "vm.demand.memory_gib",
                false,
            ),
            (
                r#"{"vm":{"vm_id":"v","tenant_id":"t","vm_type":"a","demand":{"cores":1e999,"memory_gib":1}}}"#,
                "vm.demand.cores",
                false,
            ),
            (
                r#"{"vm":{"vm_id":"v","tenant_id":"t","vm_type":"a","demand":{"cores":1,"memory_gib":1},"colour":"red"}}"#,
                "vm.colour",
                false,
            ),
            (
                r#"{"vm":{"vm_id":"v","tenant_id":"t","vm_type":"a","zone":"","demand":{"cores":1,"memory_gib":1}}}"#,
                "vm.zone",
                true,
            ),
            (
                r#"{"gang":{"tenant_id":"t","vms":[
                    {"vm_id":"a","tenant_id":"t","vm_type":"a","demand":{"cores":1,"memory_gib":1}},
                    {"vm_id":"b","tenant_id":"t","vm_type":"a","zone":"z1","demand":{"cores":1,"memory_gib":1}},
                    {"vm_id":"c","tenant_id":"t","vm_type":"a","zone":"z2","demand":{"cores":1,"memory_gib":1}}]}}"#,
                "gang.vms[2].zone",
                true,
            ),
            (
                r#"{"vm":{"vm_id":"v","tenant_id":"t","vm_type":"a","demand":{"cores":"two","memory_gib":1}}}"#,
                "vm.demand.cores",
                false,
            ),
            (
                r#"{"vm":{"vm_id":"v","tenant_id":"t","vm_type":"a","demand":{"cores":1,"memory_gib":1},"prediction":{"p_long":1.5,"class":"long","source":"model"}}}"#,
                "vm.prediction.p_long",
                true,
            ),
            (r#"{"gang":{"tenant_id":"t","vms":[]}}"#, "gang.vms", true),
            (r#"{"bogus":{}}"#, "bogus", false),
            (
                r#"{"vm":{"vm_id":"v","tenant_id":"t","vm_type":"a","demand":{"cores":1,"memory_gib":1},"priority":"urgent"}}"#,
                "vm.priority",
                false,
            ),
        ];
        for (body, field, invalid) in cases {
            assert_eq!(field_of(body), (field.to_owned(), invalid), "{body}");
        }
    }

    #[test]
    fn gangs_are_bounded_single_tenant_and_free_of_duplicates() {
        let vm = |id: &str, tenant: &str| {
            format!(r#"{{"vm_id":"{id}","tenant_id":"{tenant}","vm_type":"a","demand":{{"cores":1,"memory_gib":1}}}}"#)
        };
        let gang = |vms: &[String]| format!(r#"{{"gang":{{"tenant_id":"t","vms":[{}]}}}}"#, vms.join(","));
        assert!(decode(&gang(&[vm("a", "t"), vm("b", "t")])).is_ok());
        let too_big = gang(&[vm("a", "t"), vm("b", "t"), vm("c", "t"), vm("d", "t")]);
        assert_eq!(field_of(&too_big), ("gang.vms".to_owned(), true));
        assert_eq!(field_of(&gang(&[vm("a", "t"), vm("b", "u")])), ("gang.vms[1].tenant_id".to_owned(), true));
        assert_eq!(field_of(&gang(&[vm("a", "t"), vm("a", "t")])), ("gang.vms[1].vm_id".to_owned(), true));
    }

    #[test]
    fn ids_are_restricted_to_the_url_safe_charset() {
        for good in ["vm-1", "a", "0", "r1-vm.7", "t:1_x", &"a".repeat(MAX_ID_LEN)] {
            assert_eq!(id_problem(good), None, "{good:?}");
        }
        for bad in
            ["", ".", "..", "a/b", "%2e", "a b", "a?b", "a#b", "-a", "_a", "é", "a\u{0}", &"a".repeat(MAX_ID_LEN + 1)]
        {
            assert!(id_problem(bad).is_some(), "{bad:?} was accepted");
        }
        for (id, field) in [("..", "vm.vm_id"), ("a/b", "vm.vm_id")] {
            let body = format!(
                r#"{{"vm":{{"vm_id":"{id}","tenant_id":"t","vm_type":"a","demand":{{"cores":1,"memory_gib":1}}}}}}"#
            );
            assert_eq!(field_of(&body), (field.to_owned(), true));
        }
        let body = r#"{"vm":{"vm_id":"v","tenant_id":"t 1","vm_type":"a","demand":{"cores":1,"memory_gib":1}}}"#;
        assert_eq!(field_of(body), ("vm.tenant_id".to_owned(), true));
        let gang = r#"{"gang":{"tenant_id":"%2e","vms":[{"vm_id":"v","tenant_id":"%2e","vm_type":"a","demand":{"cores":1,"memory_gib":1}}]}}"#;
        assert_eq!(field_of(gang), ("gang.tenant_id".to_owned(), true));
        assert_eq!(check_id(".", "vm_id").unwrap_err().field(), "vm_id");
    }

    #[test]
    fn trailing_garbage_is_malformed() {
        assert!(matches!(decode(&format!(r#"{{"vm":{VM}}} x"#)), Err(ValidationError::Malformed { .. })));
    }

    #[test]
    fn problem_bodies_carry_status_and_field() {
        let err = decode(r#"{"gang":{"tenant_id":"t","vms":[]}}"#).unwrap_err();
        let problem = crate::Problem::from(&err);
        assert_eq!(problem.status, 422);
        assert_eq!(problem.errors[0].field, "gang.vms");
        let json = serde_json::to_value(&problem).unwrap();
        assert_eq!(json["type"], "urn:problem:invalid-request");
    }
}
