//! The prediction cache's key: everything the lifetime model reads about a VM at request time, and
//! nothing it does not (the VM id, the zone, spread limits), so that identical VM types of one tenant
//! share one answer.

use domain::{FeatureValue, Priority, ResourceKind, VmRequest};

/// What the model sees of one VM, with the request time rounded down to a step.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct FeatureKey {
    tenant_id: String,
    vm_type: String,
    /// Cores and memory in integer base units (millicores, MiB): exact, hashable.
    cores: u64,
    memory: u64,
    priority: Priority,
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
    /// control service stamped), rounded down to `time_step_s` (0: time is not part of the key).
    pub fn new(vm: &VmRequest, requested_at_s: f64, time_step_s: u64) -> Self {
        let time_step = if time_step_s == 0 { 0 } else { (requested_at_s / time_step_s as f64).floor() as i64 };
        FeatureKey {
            tenant_id: vm.tenant_id.as_str().to_owned(),
            vm_type: vm.vm_type.clone(),
            cores: vm.demand.base(ResourceKind::Cores),
            memory: vm.demand.base(ResourceKind::MemoryGib),
            priority: vm.priority,
            os: vm.os.clone(),
            features: vm
                .features
                .iter()
                .map(|(name, value)| {
                    let value = match value {
                        // +0 and -0 are one value to the model.
                        FeatureValue::Number(n) => KeyValue::Number((n + 0.0).to_bits()),
                        FeatureValue::Text(text) => KeyValue::Text(text.clone()),
                    };
                    (name.clone(), value)
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

    #[test]
    fn vms_differing_only_in_id_zone_or_spread_share_a_key() {
        let a = vm("a");
        let mut b = vm("b");
        b.zone = Some(ZoneId("z2".into()));
        b.max_per_rack = Some(2);
        assert_eq!(FeatureKey::new(&a, 7_200.0, 3_600), FeatureKey::new(&b, 10_799.0, 3_600));
    }

    #[test]
    fn what_the_model_reads_changes_the_key() {
        let base = FeatureKey::new(&vm("a"), 0.0, 3_600);
        let mut other = vm("a");
        other.tenant_id = TenantId("u".into());
        assert_ne!(FeatureKey::new(&other, 0.0, 3_600), base);
        let mut other = vm("a");
        other.demand = Resources::from_whole(4.0, 32.0, 0.0).unwrap();
        assert_ne!(FeatureKey::new(&other, 0.0, 3_600), base);
        let mut other = vm("a");
        other.features.insert("batch_size".into(), FeatureValue::Number(4.0));
        assert_ne!(FeatureKey::new(&other, 0.0, 3_600), base);
        // The next hour is another key; without a time step it is not.
        assert_ne!(FeatureKey::new(&vm("a"), 3_600.0, 3_600), base);
        assert_eq!(FeatureKey::new(&vm("a"), 3_600.0, 0), FeatureKey::new(&vm("a"), 0.0, 0));
    }
}
