//! Repredicting the remaining lifetime of running VMs, for the hosts' exit times that NILAS and LAVA
//! read (paper 000 s4.2: "LAS repredicts the remaining lifetime ... using their uptime so far").
//!
//! A host's exit time is the latest predicted exit of its VMs, `now + E(remaining | uptime)` each.
//! With a [`Repredictor`] (the model bundle's remaining-lifetime model, in process), every VM's row
//! of features is encoded once, from its record (shared with the inventory, [`NewVm::features`]),
//! when it is first repredicted under the model, and a reprediction is one tree-ensemble
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

use crate::state::NewVm;
use domain::VmId;
use lifetime_model::curve_cache::CurveCache;
use lifetime_model::features::encode_uptime;
use lifetime_model::gbdt::ConstantRange;
use lifetime_model::{LifetimeModel, RequestFeatures};
use serde::{Deserialize, Serialize};
use std::fmt::Debug;
use std::sync::Arc;

/// A model of the remaining lifetime of a running VM.
pub trait Repredictor: Debug + Send + Sync {
    /// Identifies the model: rows encoded under another version are encoded again.
    fn version(&self) -> &str;
    /// What the model reads of a VM, encoded once when it is placed (the id is for predictors that
    /// know VMs by name, such as the simulator's oracle; a model reads only the features).
    fn encode(&self, id: &VmId, features: &RequestFeatures) -> Vec<f64>;
    /// [`Repredictor::encode`], the same, with `cache` to remember what is costly to compute
    /// (a cache kept for this repredictor alone; by default unused).
    fn encode_cached(&self, id: &VmId, features: &RequestFeatures, cache: &mut CurveCache) -> Vec<f64> {
        let _ = cache;
        self.encode(id, features)
    }
    /// Expected remaining lifetime in seconds of a VM with this row after `uptime_s` seconds.
    fn remaining_s(&self, row: &[f64], uptime_s: f64) -> f64;
    /// The chances that a VM with this row, alive after `uptime_s`, is still alive `after_s[k]`
    /// seconds later, into `out[k]`. By default a certainty read off [`Repredictor::remaining_s`]
    /// (alive until then, gone after); a model with a lifetime distribution reads it.
    fn survival(&self, row: &[f64], uptime_s: f64, after_s: &[f64], out: &mut [f64]) {
        step_survival(self.remaining_s(row, uptime_s), after_s, out);
    }
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

/// With a survival model, what is encoded of a VM is its survival curve, computed once when it
/// is placed: every reprediction then reads the curve conditioned on the VM's age, with no model
/// evaluation (the request-time features do not change as the VM ages, so that is exactly the
/// model's remaining-lifetime distribution at that age).
impl Repredictor for BundleRepredictor {
    fn version(&self) -> &str {
        self.0.version()
    }
    fn encode(&self, _id: &VmId, features: &RequestFeatures) -> Vec<f64> {
        let row = self.0.encode(features);
        self.0.survival_curve(&row).unwrap_or(row)
    }
    fn encode_cached(&self, _id: &VmId, features: &RequestFeatures, cache: &mut CurveCache) -> Vec<f64> {
        let row = self.0.encode(features);
        self.0.survival_curve_cached(&row, cache).unwrap_or(row)
    }
    fn remaining_s(&self, row: &[f64], uptime_s: f64) -> f64 {
        if self.0.reading().is_some() {
            self.0.remaining_from_curve(row, uptime_s)
        } else {
            self.0.predict_remaining_row(row, uptime_s)
        }
    }
    fn survival(&self, row: &[f64], uptime_s: f64, after_s: &[f64], out: &mut [f64]) {
        if !self.0.conditional_survival_from_curve(row, uptime_s, after_s, out) {
            step_survival(self.remaining_s(row, uptime_s), after_s, out);
        }
    }
    fn uptime_key(&self, uptime_s: f64) -> f64 {
        encode_uptime(uptime_s)
    }
    fn constant_range(&self, key: f64) -> Option<ConstantRange> {
        self.0.remaining_constant_range(key)
    }
}

/// A remaining lifetime known for certain as chances of being alive: 1 until it ends, 0 from then.
pub fn step_survival(remaining_s: f64, after_s: &[f64], out: &mut [f64]) {
    for (o, &t) in out.iter_mut().zip(after_s) {
        *o = if remaining_s > t { 1.0 } else { 0.0 };
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

/// What the model read of one VM: its encoded row, made when the VM is first repredicted under
/// the current model (from its record, [`NewVm::features`]).
#[derive(Debug)]
struct VmRow {
    encoded: Box<[f64]>,
    /// The last evaluation of the model for this row, and the uptime keys it holds for.
    last: Option<(ConstantRange, f64)>,
}

/// One placed VM as its host's exit time reads it.
#[derive(Debug)]
struct VmExit {
    /// Its record, shared with the inventory (its id, and what the model reads of it).
    vm: Arc<NewVm>,
    placed_at_s: f64,
    /// Its lifetime as the policy read its prediction when it was placed.
    lifetime_s: f64,
    /// Its last predicted exit time (policies that read exit times), until the next reprediction.
    exit_s: Option<f64>,
    /// Its row under the current model, once encoded. Boxed: a host's VMs are one vector, which
    /// grows when the host takes more VMs than it ever held, and with the rows in line a grown
    /// vector was kilobytes, an allocation for which the allocator first consolidates its free
    /// lists (most of what placing a VM on such a host cost, issue 32).
    row: Option<Box<VmRow>>,
}

/// The most VMs a host's vector holds in a block glibc's `malloc` serves from its small bins
/// (chunks below 1 KiB, with its 8-byte header rounded to 16).
const SMALL_BLOCK_VMS: usize = (1024 - 16 - 8) / std::mem::size_of::<VmExit>();

/// The capacity a full vector of a host's VMs grows to: doubling, as `Vec` does, but to
/// [`SMALL_BLOCK_VMS`] before the first block of 1 KiB or more. glibc serves a request of that
/// size only after consolidating every freed small block it keeps in its fast bins (one was a
/// few hundred microseconds in a placement's tail at 100k hosts), and a host rarely holds more
/// VMs than that; `Vec`'s doubling went from 16 VMs (768 bytes) to 32 (1,536).
fn grown_capacity(capacity: usize) -> usize {
    match capacity {
        0 => 4,
        c if c < SMALL_BLOCK_VMS => (2 * c).min(SMALL_BLOCK_VMS),
        c => 2 * c,
    }
}

/// How [`Repredictions::host_exit_s`] gets each VM's exit time.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum ExitTimes {
    /// Placement time plus the lifetime read from the prediction (policies that do not read exit
    /// times: their hosts' classes follow the initial predictions).
    Initial,
    /// The VM's last predicted exit, a VM never predicted is predicted now (arrivals and exits).
    Reuse,
    /// Every VM is predicted again now (the periodic refresh).
    Repredict,
}

/// The repredictor, if any, and every host's VMs as its exit time reads them.
///
/// The VMs are kept host by host, in the order of the host's VMs in the state, so that a host's
/// exit time reads one short list instead of looking each of its VMs up by id in maps of every
/// placed VM (a periodic refresh does that for every VM).
#[derive(Debug)]
pub struct Repredictions {
    model: Option<Arc<dyn Repredictor>>,
    /// By host index.
    hosts: Vec<Vec<VmExit>>,
    /// Model evaluations made (for the figures of the bench and `/metrics`): a reprediction answered
    /// from a VM's last evaluation (its uptime still in the evaluation's constant range) is not one.
    pub count: u64,
    /// The current model's recent survival curves (cleared with the model).
    curves: CurveCache,
}

impl Repredictions {
    /// No model and no VM on `hosts` hosts.
    pub fn new(hosts: usize) -> Self {
        Repredictions {
            model: None,
            hosts: (0..hosts).map(|_| Vec::new()).collect(),
            count: 0,
            curves: CurveCache::default(),
        }
    }

    /// Uses `model` from now on (`None`: initial predictions minus age); every VM's row is encoded
    /// again, when it is next repredicted.
    pub fn set_model(&mut self, model: Option<Arc<dyn Repredictor>>) {
        self.model = model;
        self.curves.clear();
        for vm in self.hosts.iter_mut().flatten() {
            vm.row = None;
        }
    }

    /// Survival curves of placed VMs answered from the recent ones and computed
    /// ([`lifetime_model::curve_cache`]).
    pub fn curves_reused_and_computed(&self) -> (u64, u64) {
        (self.curves.hits, self.curves.misses)
    }

    pub fn model_version(&self) -> Option<&str> {
        self.model.as_deref().map(|model| model.version())
    }

    /// A VM placed on `host`, with the lifetime the policy reads from its prediction.
    pub fn add(&mut self, host: usize, vm: &Arc<NewVm>, lifetime_s: f64) {
        if let Some(vms) = self.hosts.get_mut(host) {
            if vms.len() == vms.capacity() {
                vms.reserve_exact(grown_capacity(vms.capacity()) - vms.len());
            }
            let placed_at_s = vm.placed_at_s;
            vms.push(VmExit { vm: Arc::clone(vm), placed_at_s, lifetime_s, exit_s: None, row: None });
        }
    }

    /// The VM left `host`.
    pub fn remove(&mut self, host: usize, vm: &VmId) {
        self.take(host, vm);
    }

    /// The VM moved from `source` to `target` (a completed migration), with its row and last exit.
    pub fn move_vm(&mut self, vm: &VmId, source: usize, target: usize) {
        if let (Some(moved), Some(vms)) = (self.take(source, vm), self.hosts.get_mut(target)) {
            vms.push(moved);
        }
    }

    fn take(&mut self, host: usize, vm: &VmId) -> Option<VmExit> {
        let vms = self.hosts.get_mut(host)?;
        let at = vms.iter().position(|v| v.vm.id == *vm)?;
        // `remove`, not `swap_remove`: the host's order stays the state's.
        Some(vms.remove(at))
    }

    /// The expected remaining lifetime, at `now_s`, of a VM on `host` (see [`remaining`]; a VM
    /// this does not know gets its initial lifetime minus its age).
    pub fn remaining_s(&mut self, host: usize, vm: &VmId, initial_lifetime_s: f64, uptime_s: f64) -> f64 {
        match (self.model.as_deref(), find(&mut self.hosts, host, vm)) {
            (Some(model), Some(found)) => remaining(model, &mut self.count, &mut self.curves, found, uptime_s),
            _ => (initial_lifetime_s - uptime_s).max(0.0),
        }
    }

    /// The chances, for a VM on `host` with `uptime_s`, of being alive `after_s[k]` later, into
    /// `out` ([`Repredictor::survival`]; a VM this does not know, or no model, reads its initial
    /// lifetime minus its age as certain).
    pub fn survival(
        &mut self,
        host: usize,
        vm: &VmId,
        initial_lifetime_s: f64,
        uptime_s: f64,
        after_s: &[f64],
        out: &mut [f64],
    ) {
        match (self.model.as_deref(), find(&mut self.hosts, host, vm)) {
            (Some(model), Some(found)) => {
                model.survival(&row(model, &mut self.curves, found).encoded, uptime_s.max(0.0), after_s, out)
            }
            _ => step_survival((initial_lifetime_s - uptime_s).max(0.0), after_s, out),
        }
    }

    /// The latest exit time, at `now_s`, of the VMs on `host` (minus infinity without VMs), each
    /// VM's exit time got as `mode` says.
    pub fn host_exit_s(&mut self, host: usize, now_s: f64, mode: ExitTimes) -> f64 {
        let Some(vms) = self.hosts.get_mut(host) else { return f64::NEG_INFINITY };
        let mut exit_s = f64::NEG_INFINITY;
        for vm in vms.iter_mut() {
            let exit = match (mode, vm.exit_s) {
                (ExitTimes::Initial, _) => vm.placed_at_s + vm.lifetime_s,
                (ExitTimes::Reuse, Some(exit)) => exit,
                _ => {
                    let uptime_s = now_s - vm.placed_at_s;
                    let remaining = match self.model.as_deref() {
                        Some(model) => remaining(model, &mut self.count, &mut self.curves, vm, uptime_s),
                        None => (vm.lifetime_s - uptime_s).max(0.0),
                    };
                    let exit = now_s + remaining;
                    vm.exit_s = Some(exit);
                    exit
                }
            };
            exit_s = exit_s.max(exit);
        }
        exit_s
    }
}

/// The VM `vm` among the VMs of `host`.
fn find<'a>(hosts: &'a mut [Vec<VmExit>], host: usize, vm: &VmId) -> Option<&'a mut VmExit> {
    hosts.get_mut(host)?.iter_mut().find(|v| v.vm.id == *vm)
}

/// The VM's row under `model`, encoded now if it was not yet.
fn row<'a>(model: &dyn Repredictor, curves: &mut CurveCache, vm: &'a mut VmExit) -> &'a mut VmRow {
    vm.row.get_or_insert_with(|| {
        let encoded = model.encode_cached(&vm.vm.id, &vm.vm.features(), curves);
        Box::new(VmRow { encoded: encoded.into_boxed_slice(), last: None })
    })
}

/// A VM's expected remaining lifetime under `model` after `uptime_s`, never below 0. The model is
/// evaluated (and counted) only when the uptime left the constant range of the row's last
/// evaluation.
fn remaining(model: &dyn Repredictor, count: &mut u64, curves: &mut CurveCache, vm: &mut VmExit, uptime_s: f64) -> f64 {
    let row = row(model, curves, vm);
    let uptime_s = uptime_s.max(0.0);
    let key = model.uptime_key(uptime_s);
    if let Some((range, remaining)) = row.last {
        if range.contains(key) {
            return remaining;
        }
    }
    *count += 1;
    let remaining = model.remaining_s(&row.encoded, uptime_s).max(0.0);
    row.last = model.constant_range(key).map(|range| (range, remaining));
    remaining
}

#[cfg(test)]
mod tests {
    use super::*;
    use domain::{RequestFacts, Resources, TenantId};

    const HOST: usize = 1;

    /// A VM of 4 cores placed at `placed_at_s`.
    fn vm(id: &str, placed_at_s: f64) -> Arc<NewVm> {
        Arc::new(NewVm {
            id: VmId::from(id),
            facts: RequestFacts {
                tenant_id: TenantId::from("t"),
                vm_type: "D".to_owned(),
                demand: Resources::from_whole(4.0, 8.0, 0.0).unwrap(),
                requested_at_s: None,
                details: Default::default(),
            },
            placed_at_s,
            prediction: None,
        })
    }

    #[test]
    fn a_host_grows_to_a_small_block_before_a_large_one() {
        assert_eq!(std::mem::size_of::<VmExit>(), 48);
        assert_eq!(SMALL_BLOCK_VMS, 20);
        let mut capacity = 0;
        let mut grown = Vec::new();
        while capacity < 100 {
            capacity = grown_capacity(capacity);
            grown.push(capacity);
        }
        assert_eq!(grown, [4, 8, 16, 20, 40, 80, 160]);
        let mut repredictions = Repredictions::new(HOST + 1);
        for i in 0..21 {
            add(&mut repredictions, &vm(&format!("v{i}"), 1.0));
            assert!(repredictions.hosts[HOST].capacity() <= if i < 20 { 20 } else { 40 });
        }
    }

    /// `vm` on `HOST` with an initial lifetime of an hour.
    fn add(repredictions: &mut Repredictions, vm: &Arc<NewVm>) {
        repredictions.add(HOST, vm, 3_600.0);
    }

    /// A model that predicts the remaining lifetime as twice the uptime plus the cores.
    #[derive(Debug)]
    struct Doubling;

    impl Repredictor for Doubling {
        fn version(&self) -> &str {
            "doubling"
        }
        fn encode(&self, _id: &VmId, features: &RequestFeatures) -> Vec<f64> {
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
        fn encode(&self, _id: &VmId, features: &RequestFeatures) -> Vec<f64> {
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
        let mut repredictions = Repredictions::new(2);
        repredictions.set_model(Some(Arc::new(Steps)));
        let a = vm("a", 0.0);
        add(&mut repredictions, &a);
        let answers: Vec<f64> = [0.0, 500.0, 999.0, 1_000.0, 1_900.0, 500.0, 5_000.0]
            .iter()
            .map(|&u| repredictions.remaining_s(HOST, &a.id, 0.0, u))
            .collect();
        assert_eq!(answers, [4.0, 4.0, 4.0, 5.0, 5.0, 4.0, 9.0]);
        assert_eq!(repredictions.count, 4, "evaluations: at 0, 1,000, 500 (back before the range) and 5,000");
        // A model set again answers for itself, even of the same version.
        repredictions.set_model(Some(Arc::new(Steps)));
        assert_eq!(repredictions.remaining_s(HOST, &a.id, 0.0, 5_001.0), 9.0);
        assert_eq!(repredictions.count, 5);
    }

    #[test]
    fn without_a_model_the_remaining_lifetime_is_the_prediction_minus_age() {
        let mut repredictions = Repredictions::new(2);
        let a = vm("a", 0.0);
        add(&mut repredictions, &a);
        assert_eq!(repredictions.remaining_s(HOST, &a.id, 3_600.0, 600.0), 3_000.0);
        assert_eq!(repredictions.remaining_s(HOST, &a.id, 3_600.0, 7_200.0), 0.0, "outlived: 0, not negative");
        assert_eq!(repredictions.count, 0);
    }

    #[test]
    fn with_a_model_rows_are_encoded_once_and_repredicted_with_the_uptime() {
        let mut repredictions = Repredictions::new(2);
        repredictions.set_model(Some(Arc::new(Doubling)));
        let a = vm("a", 0.0);
        add(&mut repredictions, &a);
        assert_eq!(repredictions.remaining_s(HOST, &a.id, 3_600.0, 100.0), 204.0);
        assert_eq!(repredictions.remaining_s(HOST, &a.id, 3_600.0, 1_000.0), 2_004.0);
        assert_eq!(repredictions.count, 2);
        repredictions.remove(HOST, &a.id);
        assert_eq!(repredictions.remaining_s(HOST, &a.id, 3_600.0, 600.0), 3_000.0, "an unknown VM falls back");
    }

    #[test]
    fn host_exit_times_reuse_last_exits_until_repredicted_and_follow_moves() {
        let mut repredictions = Repredictions::new(2);
        repredictions.set_model(Some(Arc::new(Doubling)));
        let (a, b) = (vm("a", 0.0), vm("b", 200.0));
        add(&mut repredictions, &a);
        assert_eq!(repredictions.host_exit_s(HOST, 100.0, ExitTimes::Initial), 3_600.0);
        // a at uptime 100: 204 s left.
        assert_eq!(repredictions.host_exit_s(HOST, 100.0, ExitTimes::Reuse), 304.0);
        repredictions.add(HOST, &b, 60.0);
        // a's exit is kept; b is predicted on arrival: 4 s left.
        assert_eq!(repredictions.host_exit_s(HOST, 200.0, ExitTimes::Reuse), 304.0);
        // a at uptime 300: 604 s left; b at uptime 100: 204 s left.
        assert_eq!(repredictions.host_exit_s(HOST, 300.0, ExitTimes::Repredict), 904.0);
        assert_eq!(repredictions.count, 4);
        repredictions.move_vm(&a.id, HOST, 0);
        assert_eq!(repredictions.host_exit_s(0, 400.0, ExitTimes::Reuse), 904.0, "its last exit moved with it");
        // b's exit from the reprediction at 300 s.
        assert_eq!(repredictions.host_exit_s(HOST, 400.0, ExitTimes::Reuse), 504.0);
        repredictions.remove(HOST, &b.id);
        assert_eq!(repredictions.host_exit_s(HOST, 400.0, ExitTimes::Repredict), f64::NEG_INFINITY);
        repredictions.set_model(None);
        assert_eq!(repredictions.host_exit_s(0, 400.0, ExitTimes::Repredict), 400.0 + 3_200.0, "no model: age");
    }
}
