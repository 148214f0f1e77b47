//! Repredicting the remaining lifetime of running VMs, for the hosts' exit times that NILAS and LAVA
//! read (paper 000 s4.2: "LAS repredicts the remaining lifetime ... using their uptime so far").
//!
//! A host's exit time is the latest predicted exit of its VMs, `now + E(remaining | uptime)` each.
//! With a [`Repredictor`] (the model bundle's remaining-lifetime model, in process), every VM's row
//! of features is encoded once when it is placed, and a reprediction is one tree-ensemble
//! evaluation with the uptime appended. Without one, the remaining lifetime is the initial
//! prediction minus the VM's age, never below zero.
//!
//! The allocator caches each host's exit time and recomputes it when a VM is added or removed and,
//! when configured, every refresh interval ([`RepredictionConfig`]).

use domain::VmId;
use lifetime_model::{LifetimeModel, RequestFeatures};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::fmt::Debug;
use std::sync::Arc;

/// A model of the remaining lifetime of a running VM.
pub trait Repredictor: Debug + Send + Sync {
    /// Identifies the model: rows encoded under another version are encoded again.
    fn version(&self) -> &str;
    /// What the model reads of a VM, encoded once when it is placed.
    fn encode(&self, features: &RequestFeatures) -> Vec<f64>;
    /// Expected remaining lifetime in seconds of a VM with this row after `uptime_s` seconds.
    fn remaining_s(&self, row: &[f64], uptime_s: f64) -> f64;
}

/// The remaining-lifetime model of a model bundle.
#[derive(Clone)]
pub struct BundleRepredictor(pub Arc<LifetimeModel>);

impl Debug for BundleRepredictor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("BundleRepredictor").field(&self.0.version()).finish()
    }
}

impl Repredictor for BundleRepredictor {
    fn version(&self) -> &str {
        self.0.version()
    }
    fn encode(&self, features: &RequestFeatures) -> Vec<f64> {
        self.0.encode(features)
    }
    fn remaining_s(&self, row: &[f64], uptime_s: f64) -> f64 {
        self.0.predict_remaining_row(row, uptime_s)
    }
}

/// The `[reprediction]` settings.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RepredictionConfig {
    /// Recompute every host's exit time this often, in seconds, besides whenever a VM is added or
    /// removed; 0 turns the periodic refresh off. The paper's settings are 60 and 900.
    pub refresh_interval_s: f64,
}

impl Default for RepredictionConfig {
    fn default() -> Self {
        RepredictionConfig { refresh_interval_s: 900.0 }
    }
}

impl RepredictionConfig {
    /// The refresh interval, if the periodic refresh is on.
    pub fn interval_s(&self) -> Option<f64> {
        (self.refresh_interval_s.is_finite() && self.refresh_interval_s > 0.0).then_some(self.refresh_interval_s)
    }
}

/// One VM as repredictions see it.
#[derive(Debug)]
struct VmRow {
    features: RequestFeatures,
    /// The encoded row and the model version it was encoded for.
    encoded: Option<(Arc<str>, Vec<f64>)>,
}

/// The repredictor, if any, and the rows of the placed VMs.
#[derive(Debug, Default)]
pub struct Repredictions {
    model: Option<Arc<dyn Repredictor>>,
    version: Option<Arc<str>>,
    rows: HashMap<VmId, VmRow>,
    /// Repredictions made (for the figures of the bench and `/metrics`).
    pub count: u64,
}

impl Repredictions {
    /// Uses `model` from now on (`None`: initial predictions minus age). Rows are encoded again
    /// lazily for a new version.
    pub fn set_model(&mut self, model: Option<Arc<dyn Repredictor>>) {
        if model.is_none() {
            // Rows are only read with a model.
            self.rows.clear();
        }
        self.version = model.as_ref().map(|m| Arc::from(m.version()));
        self.model = model;
    }

    pub fn model_version(&self) -> Option<&str> {
        self.version.as_deref()
    }

    pub fn has_model(&self) -> bool {
        self.model.is_some()
    }

    /// Remembers what the model reads of a placed VM.
    pub fn add(&mut self, vm: &VmId, features: RequestFeatures) {
        if self.model.is_some() {
            self.rows.insert(vm.clone(), VmRow { features, encoded: None });
        }
    }

    pub fn remove(&mut self, vm: &VmId) {
        self.rows.remove(vm);
    }

    /// The VM's expected remaining lifetime after `uptime_s`: the model's when it has the VM's row,
    /// else `initial_lifetime_s - uptime_s`, never below 0.
    pub fn remaining_s(&mut self, vm: &VmId, initial_lifetime_s: f64, uptime_s: f64) -> f64 {
        let fallback = (initial_lifetime_s - uptime_s).max(0.0);
        let (Some(model), Some(version)) = (&self.model, &self.version) else { return fallback };
        let Some(row) = self.rows.get_mut(vm) else { return fallback };
        if row.encoded.as_ref().is_none_or(|(v, _)| v != version) {
            row.encoded = Some((version.clone(), model.encode(&row.features)));
        }
        self.count += 1;
        match &row.encoded {
            Some((_, encoded)) => model.remaining_s(encoded, uptime_s.max(0.0)).max(0.0),
            None => fallback,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use domain::{Resources, VmRequest};

    fn add(repredictions: &mut Repredictions, vm: &VmRequest) {
        repredictions.add(&vm.vm_id, RequestFeatures::from_request(vm, 0.0));
    }

    /// A model that predicts the remaining lifetime as twice the uptime plus the cores.
    #[derive(Debug)]
    struct Doubling;

    impl Repredictor for Doubling {
        fn version(&self) -> &str {
            "doubling"
        }
        fn encode(&self, features: &RequestFeatures) -> Vec<f64> {
            vec![features.cores]
        }
        fn remaining_s(&self, row: &[f64], uptime_s: f64) -> f64 {
            2.0 * uptime_s + row[0]
        }
    }

    #[test]
    fn without_a_model_the_remaining_lifetime_is_the_prediction_minus_age() {
        let mut repredictions = Repredictions::default();
        let vm = VmRequest::new("a", "t", "D", Resources::from_whole(4.0, 8.0, 0.0).unwrap());
        add(&mut repredictions, &vm);
        assert_eq!(repredictions.remaining_s(&vm.vm_id, 3_600.0, 600.0), 3_000.0);
        assert_eq!(repredictions.remaining_s(&vm.vm_id, 3_600.0, 7_200.0), 0.0, "outlived: 0, not negative");
        assert_eq!(repredictions.count, 0);
    }

    #[test]
    fn with_a_model_rows_are_encoded_once_and_repredicted_with_the_uptime() {
        let mut repredictions = Repredictions::default();
        repredictions.set_model(Some(Arc::new(Doubling)));
        let vm = VmRequest::new("a", "t", "D", Resources::from_whole(4.0, 8.0, 0.0).unwrap());
        add(&mut repredictions, &vm);
        assert_eq!(repredictions.remaining_s(&vm.vm_id, 3_600.0, 100.0), 204.0);
        assert_eq!(repredictions.remaining_s(&vm.vm_id, 3_600.0, 1_000.0), 2_004.0);
        assert_eq!(repredictions.count, 2);
        repredictions.remove(&vm.vm_id);
        assert_eq!(repredictions.remaining_s(&vm.vm_id, 3_600.0, 600.0), 3_000.0, "an unknown VM falls back");
    }
}
