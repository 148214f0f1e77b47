//! The workload shared by the allocator's benches: hosts of 48 cores and 384 GiB filled to 75% with
//! a VM mix of 1 to 16 cores (4 or 8 GiB per core; a quarter predicted long-lived with lifetimes of
//! hours to weeks, every VM with an expected lifetime), on the clock and tenants of the default
//! model bundle, and the bundle itself.

#![allow(dead_code)]

use domain::{LifetimeClass, LifetimePrediction, PredictionSource, Resources, VmRequest};
use lifetime_model::LifetimeModel;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub const HOST_CORES: f64 = 48.0;
pub const HOST_MEMORY_GIB: f64 = 384.0;
pub const FILL: f64 = 0.75;
/// The clock starts just after the end of the default bundle's training data (its feature store is
/// as of 794,932 s), so that repredictions read the tenants' recent history as in production.
pub const START_S: f64 = 800_000.0;
/// Tenants `t0`..: the default bundle's feature store knows `t0` to `t1493`, so about three in four
/// VMs belong to a tenant with a history and the rest to new tenants.
pub const TENANTS: u32 = 2_000;

/// A seeded stream of VM requests.
pub struct Workload {
    pub rng: ChaCha8Rng,
    next_vm: u64,
}

impl Workload {
    pub fn new(seed: u64) -> Self {
        Workload { rng: ChaCha8Rng::seed_from_u64(seed), next_vm: 0 }
    }

    pub fn vm(&mut self) -> VmRequest {
        self.next_vm += 1;
        // Core mix after Protean Table 3: mostly small VMs, a few large ones.
        let cores = match self.rng.random_range(0..100) {
            0..=49 => 1.0,
            50..=74 => 2.0,
            75..=89 => 4.0,
            90..=97 => 8.0,
            _ => 16.0,
        };
        let per_core = if self.rng.random_bool(0.5) { 4.0 } else { 8.0 };
        let long = self.rng.random_bool(0.25);
        let prediction = LifetimePrediction {
            p_long: if long { 0.8 } else { 0.2 },
            class: if long { LifetimeClass::Long } else { LifetimeClass::Short },
            interval_class: None,
            expected_lifetime_s: Some(if long {
                self.rng.random_range(3.0 * 3600.0..30.0 * 86_400.0)
            } else {
                self.rng.random_range(60.0..7200.0)
            }),
            model_version: Some("bench-1".to_owned()),
            source: PredictionSource::Model,
        };
        let tenant = format!("t{}", self.rng.random_range(0..TENANTS));
        let demand = Resources::from_whole(cores, cores * per_core, 0.0).expect("valid demand");
        // The bundle's VM types: D is 4 GiB per core, E 8 GiB per core.
        let family = if per_core == 4.0 { "D" } else { "E" };
        let mut vm = VmRequest::new(&format!("vm-{}", self.next_vm), &tenant, &format!("{family}{cores}"), demand);
        vm.prediction = Some(prediction);
        vm
    }
}

/// `models/default` of the workspace.
pub fn default_bundle() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../models/default")
}

/// The bundle at `dir`, or `None` with a message saying what is `skipped` without it.
pub fn load_bundle(dir: &Path, skipped: &str) -> Option<Arc<LifetimeModel>> {
    match LifetimeModel::load(dir) {
        Ok(model) => Some(Arc::new(model)),
        Err(error) => {
            println!("no model bundle at {} ({error}): {skipped} (pass --bundle DIR)", dir.display());
            None
        }
    }
}
