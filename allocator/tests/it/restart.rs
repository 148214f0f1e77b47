//! A restart changes nothing NILAS and LAVA decide by: the allocator is stopped and reopened from
//! its embedded store (SQLite) and the default model is set again, as the binary does at startup.
//! Every host's repredicted exit time (and LAVA's state) afterwards equals the one before (both
//! repredicted at the same instant), and the next decisions equal those of an allocator that never
//! stopped. The VMs carry what the model
//! reads beyond their shape: low and regular priority, an OS, extra features and request times.

use allocator::durable::{Allocate, DurableAllocator, Release};
use domain::{
    AllocationOutcome, AllocationRequest, FeatureValue, InventorySpec, LifetimeClass, LifetimePrediction,
    PredictionSource, Priority, Resources, VmId, VmRequest,
};
use placement::reprediction::{BundleRepredictor, Repredictor};
use placement::state::HostIndex;
use placement::{AllocatorConfig, PolicyConfig, Registry, TieBreak};
use std::sync::Arc;

const HOUR: f64 = 3600.0;

fn model() -> Arc<dyn Repredictor> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../models/default");
    Arc::new(BundleRepredictor(Arc::new(lifetime_model::LifetimeModel::load(&dir).expect("models/default loads"))))
}

/// The `i`-th request: sizes, priorities, OSes, features and lifetimes varied, so that the model's
/// repredictions differ from VM to VM.
fn request(i: usize, now_s: f64) -> VmRequest {
    let cores = [1.0, 2.0, 4.0, 8.0][i % 4];
    let mut vm = VmRequest::new(
        &format!("vm-{i}"),
        &format!("tenant-{}", i % 5),
        &format!("D{cores}"),
        Resources::from_whole(cores, cores * 4.0, 0.0).unwrap(),
    );
    vm.facts.details.priority = if i % 3 == 0 { Priority::Low } else { Priority::Regular };
    vm.facts.details.os = Some(if i % 2 == 0 { "linux" } else { "windows" }.to_owned());
    vm.facts.details.features.insert("batch_size".to_owned(), FeatureValue::Number((i % 7 + 1) as f64));
    vm.facts.requested_at_s = Some(now_s - 1.0);
    let lifetime_s = [0.5, 3.0, 30.0, 200.0][i % 4] * HOUR;
    vm.prediction = Some(LifetimePrediction {
        p_long: if lifetime_s >= 2.0 * HOUR { 0.9 } else { 0.1 },
        class: if lifetime_s >= 2.0 * HOUR { LifetimeClass::Long } else { LifetimeClass::Short },
        interval_class: None,
        expected_lifetime_s: Some(lifetime_s),
        model_version: Some("default-1".into()),
        source: PredictionSource::Model,
    });
    vm
}

fn allocate(durable: &mut DurableAllocator, i: usize, now_s: f64) -> String {
    match durable.execute_one(Allocate(AllocationRequest::Vm(request(i, now_s))), now_s) {
        Ok(decision) => match decision.outcome {
            AllocationOutcome::Placed { placements } => placements[0].host_id.to_string(),
            AllocationOutcome::Rejected { rejection } => format!("rejected: {:?}", rejection.code),
        },
        other => panic!("allocate vm-{i}: {other:?}"),
    }
}

/// Every host's repredicted exit time and policy state.
fn hosts(durable: &DurableAllocator) -> Vec<(f64, Option<String>)> {
    let allocator = durable.allocator().expect("the store is usable");
    (0..allocator.state().hosts().len())
        .map(|i| {
            let host = HostIndex(i as u32);
            let state = allocator.host_state().and_then(|state| state.snapshot(host));
            (allocator.host_lifetime(host).exit_s, state)
        })
        .collect()
}

fn open(spec: &InventorySpec, config: &AllocatorConfig, path: &std::path::Path, now_s: f64) -> DurableAllocator {
    let mut durable =
        DurableAllocator::open(spec, config, &Registry::standard(), path, now_s).expect("the store opens");
    durable.set_repredictor(Some(model()));
    durable
}

fn restart_changes_nothing(policy: &str) {
    let spec = InventorySpec::homogeneous("z", 12, 4, Resources::from_whole(16.0, 64.0, 0.0).unwrap());
    let config = AllocatorConfig {
        policy: PolicyConfig::preset(policy),
        tie_break: TieBreak::LowestIndex,
        ..Default::default()
    };
    let dir = tempfile::tempdir().unwrap();
    let (stopped, never_stopped) = (dir.path().join("stopped.db"), dir.path().join("never.db"));
    let mut a = open(&spec, &config, &stopped, 0.0);
    let mut b = open(&spec, &config, &never_stopped, 0.0);
    // 40 VMs over 40 minutes, every fourth one released: hosts with mixed exits and states.
    let mut now_s = 0.0;
    for i in 0..40 {
        now_s = 60.0 * (i + 1) as f64;
        assert_eq!(allocate(&mut a, i, now_s), allocate(&mut b, i, now_s), "vm-{i} before the restart");
        if i % 4 == 3 {
            for durable in [&mut a, &mut b] {
                durable.execute_one(Release::vm(VmId::from(format!("vm-{}", i - 2).as_str())), now_s).unwrap();
            }
        }
    }
    // Exit times are repredicted on events and timers, so each host's is as of its own last
    // event; a restart repredicts every host at once. Compare like with like: both allocators
    // repredict every host now (setting the model does), before the stop and after it.
    a.set_repredictor(Some(model()));
    b.set_repredictor(Some(model()));
    let before = hosts(&a);
    assert!(before.iter().filter(|(exit, _)| exit.is_finite()).count() >= 4, "hosts with VMs: {before:?}");
    if policy == "lava" {
        assert!(before.iter().any(|(_, state)| state.is_some()), "LAVA keeps host states");
    }
    drop(a);
    let mut a = open(&spec, &config, &stopped, now_s);
    assert_eq!(hosts(&a), before, "{policy}: every host's exit time and state after the restart");
    assert_eq!(hosts(&b), before, "{policy}: and in the allocator that never stopped");
    for i in 40..70 {
        now_s += 60.0;
        assert_eq!(allocate(&mut a, i, now_s), allocate(&mut b, i, now_s), "{policy}: vm-{i} after the restart");
    }
    assert_eq!(hosts(&a), hosts(&b));
}

#[test]
fn a_restart_changes_no_exit_time_and_no_decision_under_nilas() {
    restart_changes_nothing("nilas");
}

#[test]
fn a_restart_changes_no_exit_time_and_no_decision_under_lava() {
    restart_changes_nothing("lava");
}
