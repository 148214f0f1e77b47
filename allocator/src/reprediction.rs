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
//!
//! A tree ensemble's answer moves with the uptime only when the uptime crosses one of the split
//! thresholds on it, and a periodic refresh mostly finds VMs between two thresholds (the default
//! bundle has none past 2.6 days of uptime). So each VM keeps its last evaluation with the range of
//! uptimes it holds for ([`Repredictor::constant_range`]), and a reprediction evaluates the model
//! only when the uptime left that range: the answer is the same, bit for bit, only cheaper. The
//! exit time `now + remaining` still moves with the clock.

use domain::VmId;
use lifetime_model::features::encode_uptime;
use lifetime_model::gbdt::ConstantRange;
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
    /// The uptime as [`Repredictor::constant_range`] measures it (the model's own encoding of it,
    /// so that ranges are exact; by default the uptime itself).
    fn uptime_key(&self, uptime_s: f64) -> f64 {
        uptime_s
    }
    /// A range of uptime keys ([`Repredictor::uptime_key`]), containing `key`, over which
    /// [`Repredictor::remaining_s`] gives every row the same answer, bit for bit, as at `key`. `None`
    /// (the default) when unknown: every reprediction then evaluates the model.
    fn constant_range(&self, key: f64) -> Option<ConstantRange> {
        let _ = key;
        None
    }
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
    fn uptime_key(&self, uptime_s: f64) -> f64 {
        encode_uptime(uptime_s)
    }
    fn constant_range(&self, key: f64) -> Option<ConstantRange> {
        self.0.remaining_constant_range(key)
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
    /// The last evaluation of the model for this row, and the uptime keys it holds for.
    last: Option<(ConstantRange, f64)>,
}

/// The repredictor, if any, and the rows of the placed VMs.
#[derive(Debug, Default)]
pub struct Repredictions {
    model: Option<Arc<dyn Repredictor>>,
    version: Option<Arc<str>>,
    rows: HashMap<VmId, VmRow>,
    /// Model evaluations made (for the figures of the bench and `/metrics`): a reprediction answered
    /// from a VM's last evaluation (its uptime still in the evaluation's constant range) is not one.
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
        for row in self.rows.values_mut() {
            // Another model (even of the same version) answers for itself.
            row.last = None;
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
            self.rows.insert(vm.clone(), VmRow { features, encoded: None, last: None });
        }
    }

    pub fn remove(&mut self, vm: &VmId) {
        self.rows.remove(vm);
    }

    /// The VM's expected remaining lifetime after `uptime_s`: the model's when it has the VM's row,
    /// else `initial_lifetime_s - uptime_s`, never below 0. The model is evaluated only when the
    /// uptime left the constant range of the VM's last evaluation.
    pub fn remaining_s(&mut self, vm: &VmId, initial_lifetime_s: f64, uptime_s: f64) -> f64 {
        let fallback = (initial_lifetime_s - uptime_s).max(0.0);
        let (Some(model), Some(version)) = (&self.model, &self.version) else { return fallback };
        let Some(row) = self.rows.get_mut(vm) else { return fallback };
        if row.encoded.as_ref().is_none_or(|(v, _)| v != version) {
            row.encoded = Some((version.clone(), model.encode(&row.features)));
            row.last = None;
        }
        let Some((_, encoded)) = &row.encoded else { return fallback };
        let uptime_s = uptime_s.max(0.0);
        let key = model.uptime_key(uptime_s);
        if let Some((range, remaining)) = row.last {
            if range.contains(key) {
                return remaining;
            }
        }
        self.count += 1;
        let remaining = model.remaining_s(encoded, uptime_s).max(0.0);
        row.last = model.constant_range(key).map(|range| (range, remaining));
        remaining
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

    /// A model whose answer steps every 1,000 s of uptime, and says so.
    #[derive(Debug)]
    struct Steps;

    impl Repredictor for Steps {
        fn version(&self) -> &str {
            "steps"
        }
        fn encode(&self, features: &RequestFeatures) -> Vec<f64> {
            vec![features.cores]
        }
        fn remaining_s(&self, row: &[f64], uptime_s: f64) -> f64 {
            row[0] + (uptime_s / 1_000.0).floor()
        }
        fn constant_range(&self, key: f64) -> Option<ConstantRange> {
            let step = (key / 1_000.0).floor() * 1_000.0;
            // The keys of the test are whole seconds.
            Some(ConstantRange { above: step - 0.5, up_to: step + 999.5 })
        }
    }

    #[test]
    fn the_model_is_evaluated_again_only_when_the_uptime_leaves_the_last_range() {
        let mut repredictions = Repredictions::default();
        repredictions.set_model(Some(Arc::new(Steps)));
        let vm = VmRequest::new("a", "t", "D", Resources::from_whole(4.0, 8.0, 0.0).unwrap());
        add(&mut repredictions, &vm);
        let answers: Vec<f64> = [0.0, 500.0, 999.0, 1_000.0, 1_900.0, 500.0, 5_000.0]
            .iter()
            .map(|&u| repredictions.remaining_s(&vm.vm_id, 0.0, u))
            .collect();
        assert_eq!(answers, [4.0, 4.0, 4.0, 5.0, 5.0, 4.0, 9.0]);
        assert_eq!(repredictions.count, 4, "evaluations: at 0, 1,000, 500 (back before the range) and 5,000");
        // A model set again answers for itself, even of the same version.
        repredictions.set_model(Some(Arc::new(Steps)));
        assert_eq!(repredictions.remaining_s(&vm.vm_id, 0.0, 5_001.0), 9.0);
        assert_eq!(repredictions.count, 5);
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
