//! The prediction cache's key: what the lifetime model reads about a VM at request time, and
//! nothing it does not (the VM id, the zone, spread limits), so that identical VM types of one tenant
//! share one answer.
//!
//! Which request facts make up the key is configurable (`[cache] key`, a [`KeySpec`]): a coarser key
//! hits more often but serves a VM an answer computed for another one. Issue 32 measured what each
//! field costs on the demo trace and on Azure V1 (`cargo bench -p control-service --bench cache_key`,
//! docs/benchmarks.md): a feature that is unique per request (the synthetic trace's `request_id`)
//! keeps the cache from ever hitting while the model reads every unseen value as one category.

use domain::{FeatureValue, Priority, ResourceKind, VmRequest};
use std::collections::BTreeSet;

/// The names a `[cache] key` entry may take, besides `feature.NAME`.
pub const FIELD_NAMES: [&str; 7] = ["tenant", "vm_type", "cores", "memory", "priority", "os", "features"];

/// Which extra request features (`VmRequest::features`) are part of the key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FeatureSelection {
    /// Every feature the request carries (`features`).
    All,
    /// Only these, by name (`feature.NAME` entries); an empty set leaves features out.
    Named(BTreeSet<String>),
}

/// Which of a VM's request facts make up its cache key, and the step its request time is rounded
/// down to. Built from `[cache] key` and `[cache] time_bucket_s` by [`KeySpec::parse`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeySpec {
    tenant: bool,
    vm_type: bool,
    cores: bool,
    memory: bool,
    priority: bool,
    os: bool,
    features: FeatureSelection,
    time_step_s: u64,
}

/// A `[cache] key` entry that cannot be used; `index` is its position in the list.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum KeySpecError {
    #[error(
        "`{entry}` is not a key field: use tenant, vm_type, cores, memory, priority, os, features (every \
         extra feature) or feature.NAME (one extra feature)"
    )]
    Unknown { index: usize, entry: String },
    #[error("`{entry}` is listed twice: list each field once")]
    Duplicate { index: usize, entry: String },
    #[error("`{entry}` is already covered by `features` (every extra feature): list one or the other")]
    Covered { index: usize, entry: String },
    #[error(
        "the key is empty: every VM would share one answer; list at least one field (to turn the cache off, \
         set cache.max_entries = 0)"
    )]
    Empty,
}

impl KeySpecError {
    /// The position of the entry at fault, if one is.
    pub fn index(&self) -> Option<usize> {
        match self {
            KeySpecError::Unknown { index, .. }
            | KeySpecError::Duplicate { index, .. }
            | KeySpecError::Covered { index, .. } => Some(*index),
            KeySpecError::Empty => None,
        }
    }
}

impl KeySpec {
    /// Every field the model can read, time rounded down to `time_step_s` (0: time is not part of
    /// the key): the key before issue 32.
    pub fn full(time_step_s: u64) -> Self {
        KeySpec {
            tenant: true,
            vm_type: true,
            cores: true,
            memory: true,
            priority: true,
            os: true,
            features: FeatureSelection::All,
            time_step_s,
        }
    }

    /// The key of the `[cache] key` entries (see [`FIELD_NAMES`]; `feature.NAME` names one extra
    /// feature), time rounded down to `time_step_s`.
    pub fn parse<S: AsRef<str>>(entries: &[S], time_step_s: u64) -> Result<Self, KeySpecError> {
        let mut spec = KeySpec {
            tenant: false,
            vm_type: false,
            cores: false,
            memory: false,
            priority: false,
            os: false,
            features: FeatureSelection::Named(BTreeSet::new()),
            time_step_s,
        };
        let mut seen = BTreeSet::new();
        for (index, entry) in entries.iter().enumerate() {
            let entry = entry.as_ref();
            if !seen.insert(entry) {
                return Err(KeySpecError::Duplicate { index, entry: entry.to_owned() });
            }
            let flag = match entry {
                "tenant" => &mut spec.tenant,
                "vm_type" => &mut spec.vm_type,
                "cores" => &mut spec.cores,
                "memory" => &mut spec.memory,
                "priority" => &mut spec.priority,
                "os" => &mut spec.os,
                "features" => {
                    if let FeatureSelection::Named(named) = &spec.features {
                        if let Some(first) = named.first() {
                            return Err(KeySpecError::Covered { index, entry: format!("feature.{first}") });
                        }
                    }
                    spec.features = FeatureSelection::All;
                    continue;
                }
                _ => {
                    let name = entry.strip_prefix("feature.").filter(|name| !name.is_empty());
                    let Some(name) = name else {
                        return Err(KeySpecError::Unknown { index, entry: entry.to_owned() });
                    };
                    match &mut spec.features {
                        FeatureSelection::All => {
                            return Err(KeySpecError::Covered { index, entry: entry.to_owned() });
                        }
                        FeatureSelection::Named(named) => named.insert(name.to_owned()),
                    };
                    continue;
                }
            };
            *flag = true;
        }
        if seen.is_empty() {
            return Err(KeySpecError::Empty);
        }
        Ok(spec)
    }

    pub fn time_step_s(&self) -> u64 {
        self.time_step_s
    }

    /// The same fields with time rounded down to another step.
    pub fn with_time_step(mut self, time_step_s: u64) -> Self {
        self.time_step_s = time_step_s;
        self
    }

    /// The entries that give this key back through [`KeySpec::parse`].
    pub fn entries(&self) -> Vec<String> {
        let flags = [self.tenant, self.vm_type, self.cores, self.memory, self.priority, self.os];
        let mut entries: Vec<String> =
            FIELD_NAMES.iter().zip(flags).filter(|(_, on)| *on).map(|(name, _)| (*name).to_owned()).collect();
        match &self.features {
            FeatureSelection::All => entries.push("features".to_owned()),
            FeatureSelection::Named(named) => entries.extend(named.iter().map(|name| format!("feature.{name}"))),
        }
        entries
    }

    fn keeps_feature(&self, name: &str) -> bool {
        match &self.features {
            FeatureSelection::All => true,
            FeatureSelection::Named(named) => named.contains(name),
        }
    }
}

/// What the key keeps of one VM (fields left out of the [`KeySpec`] are blank), with the request
/// time rounded down to a step.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct FeatureKey {
    tenant_id: String,
    vm_type: String,
    /// Cores and memory in integer base units (millicores, MiB): exact, hashable.
    cores: u64,
    memory: u64,
    priority: Option<Priority>,
    os: Option<String>,
    /// Extra features in name order; numbers by their bits so that the key is exact.
    features: Vec<(String, KeyValue)>,
    /// `floor(request time / step)`, or 0 when time is left out of the key.
    time_step: i64,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum KeyValue {
    Number(u64),
    Text(String),
}

impl FeatureKey {
    /// The key of `vm`, whose request time is `requested_at_s` (the VM's own, or the arrival time the
    /// control service stamped), with the fields of `spec`.
    pub fn new(vm: &VmRequest, requested_at_s: f64, spec: &KeySpec) -> Self {
        let time_step = match spec.time_step_s {
            0 => 0,
            step => (requested_at_s / step as f64).floor() as i64,
        };
        FeatureKey {
            tenant_id: if spec.tenant { vm.facts.tenant_id.as_str().to_owned() } else { String::new() },
            vm_type: if spec.vm_type { vm.facts.vm_type.clone() } else { String::new() },
            cores: if spec.cores { vm.facts.demand.base(ResourceKind::Cores) } else { 0 },
            memory: if spec.memory { vm.facts.demand.base(ResourceKind::MemoryGib) } else { 0 },
            priority: spec.priority.then_some(vm.facts.details.priority),
            os: if spec.os { vm.facts.details.os.clone() } else { None },
            features: vm
                .facts
                .details
                .features
                .iter()
                .filter(|(name, _)| spec.keeps_feature(name))
                .map(|(name, value)| {
                    let value = match value {
                        // +0 and -0 are one value to the model.
                        FeatureValue::Number(n) => KeyValue::Number((n + 0.0).to_bits()),
                        FeatureValue::Text(text) => KeyValue::Text(text.clone()),
                    };
                    (name.to_owned(), value)
                })
                .collect(),
            time_step,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use domain::{Resources, TenantId, ZoneId};

    fn vm(id: &str) -> VmRequest {
        VmRequest::new(id, "t", "D4", Resources::from_whole(4.0, 16.0, 0.0).unwrap())
    }

    fn spec(entries: &[&str]) -> KeySpec {
        KeySpec::parse(entries, 3_600).unwrap()
    }

    #[test]
    fn vms_differing_only_in_id_zone_or_spread_share_a_key() {
        let a = vm("a");
        let mut b = vm("b");
        b.zone = Some(ZoneId("z2".into()));
        b.max_per_rack = Some(2);
        let full = KeySpec::full(3_600);
        assert_eq!(FeatureKey::new(&a, 7_200.0, &full), FeatureKey::new(&b, 10_799.0, &full));
    }

    #[test]
    fn what_the_model_reads_changes_the_full_key() {
        let full = KeySpec::full(3_600);
        let base = FeatureKey::new(&vm("a"), 0.0, &full);
        let mut other = vm("a");
        other.facts.tenant_id = TenantId("u".into());
        assert_ne!(FeatureKey::new(&other, 0.0, &full), base);
        let mut other = vm("a");
        other.facts.demand = Resources::from_whole(4.0, 32.0, 0.0).unwrap();
        assert_ne!(FeatureKey::new(&other, 0.0, &full), base);
        let mut other = vm("a");
        other.facts.details.features.insert("batch_size".into(), FeatureValue::Number(4.0));
        assert_ne!(FeatureKey::new(&other, 0.0, &full), base);
        // The next hour is another key; without a time step it is not.
        assert_ne!(FeatureKey::new(&vm("a"), 3_600.0, &full), base);
        let timeless = KeySpec::full(0);
        assert_eq!(FeatureKey::new(&vm("a"), 3_600.0, &timeless), FeatureKey::new(&vm("a"), 0.0, &timeless));
    }

    #[test]
    fn fields_left_out_of_the_key_do_not_change_it() {
        let no_tenant = spec(&["vm_type", "cores", "memory", "priority", "os", "features"]);
        let mut other = vm("a");
        other.facts.tenant_id = TenantId("u".into());
        assert_eq!(FeatureKey::new(&other, 0.0, &no_tenant), FeatureKey::new(&vm("a"), 0.0, &no_tenant));
        other.facts.vm_type = "E4".into();
        assert_ne!(FeatureKey::new(&other, 0.0, &no_tenant), FeatureKey::new(&vm("a"), 0.0, &no_tenant));

        let no_memory = spec(&["tenant", "vm_type", "cores"]);
        let mut other = vm("a");
        other.facts.demand = Resources::from_whole(4.0, 32.0, 0.0).unwrap();
        assert_eq!(FeatureKey::new(&other, 0.0, &no_memory), FeatureKey::new(&vm("a"), 0.0, &no_memory));
    }

    #[test]
    fn named_features_keep_only_those() {
        let batch_only = spec(&["tenant", "vm_type", "feature.batch_size"]);
        let with = |batch: f64, request: &str| {
            let mut vm = vm("a");
            vm.facts.details.features.insert("batch_size".into(), FeatureValue::Number(batch));
            vm.facts.details.features.insert("request_id".into(), FeatureValue::Text(request.into()));
            FeatureKey::new(&vm, 0.0, &batch_only)
        };
        assert_eq!(with(2.0, "r1"), with(2.0, "r2"), "request_id is not part of the key");
        assert_ne!(with(2.0, "r1"), with(3.0, "r1"));
        // +0 and -0 are one value.
        assert_eq!(with(0.0, "r1"), with(-0.0, "r1"));
    }

    #[test]
    fn entries_round_trip() {
        for entries in [
            vec!["tenant", "vm_type", "cores", "memory", "priority", "os", "features"],
            vec!["vm_type", "feature.batch_size", "feature.os_image"],
            vec!["cores"],
        ] {
            let parsed = spec(&entries);
            assert_eq!(KeySpec::parse(&parsed.entries(), 3_600).unwrap(), parsed);
        }
        assert_eq!(spec(&FIELD_NAMES), KeySpec::full(3_600));
    }

    #[test]
    fn bad_entries_are_refused_by_position() {
        let unknown = KeySpec::parse(&["tenant", "mem"], 0).unwrap_err();
        assert_eq!(unknown.index(), Some(1));
        assert!(unknown.to_string().contains("`mem` is not a key field"), "{unknown}");
        assert!(matches!(KeySpec::parse(&["feature."], 0), Err(KeySpecError::Unknown { index: 0, .. })));
        assert!(matches!(KeySpec::parse(&["cores", "cores"], 0), Err(KeySpecError::Duplicate { index: 1, .. })));
        assert!(matches!(
            KeySpec::parse(&["features", "feature.batch_size"], 0),
            Err(KeySpecError::Covered { index: 1, .. })
        ));
        assert!(matches!(
            KeySpec::parse(&["feature.batch_size", "features"], 0),
            Err(KeySpecError::Covered { index: 1, .. })
        ));
        let empty: [&str; 0] = [];
        assert_eq!(KeySpec::parse(&empty, 0), Err(KeySpecError::Empty));
    }
}
