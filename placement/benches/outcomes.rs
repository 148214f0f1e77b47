//! The cost of tracking realized outcomes (issue 18) beside the decision it follows: per VM,
//! `OutcomeTracker::placed` + `released` (with the clock moving and the window filling), against
//! one PBFR `allocate` + `release` on a 1,000-host inventory at about 75% full, in the same run.
//!
//! `cargo bench -p placement --bench outcomes`

use domain::{
    AllocationRequest, InventorySpec, LifetimeClass, LifetimePrediction, PredictionSource, Resources, VmId, VmRequest,
};
use placement::outcomes::{OutcomeConfig, OutcomeTracker};
use placement::{Allocator, AllocatorConfig, PolicyConfig};
use std::collections::VecDeque;
use std::time::Instant;

const VMS: usize = 1_000_000;
const DECISIONS: usize = 200_000;
const RUNNING: usize = 12_000;

fn prediction(i: usize) -> LifetimePrediction {
    let p_long = (i % 100) as f64 / 100.0;
    LifetimePrediction {
        p_long,
        class: if p_long >= 0.5 { LifetimeClass::Long } else { LifetimeClass::Short },
        interval_class: None,
        expected_lifetime_s: Some(600.0 + (i % 50) as f64 * 600.0),
        model_version: Some(if i % 10 == 0 { "canary" } else { "stable" }.to_owned()),
        source: PredictionSource::Model,
    }
}

/// ns per VM of the tracker: RUNNING VMs in flight, one start and one exit per step.
fn tracker_ns() -> f64 {
    let mut tracker = OutcomeTracker::new(OutcomeConfig::default());
    let ids: Vec<VmId> = (0..VMS).map(|i| VmId(format!("vm-{i}"))).collect();
    let predictions: Vec<LifetimePrediction> = (0..VMS).map(prediction).collect();
    let mut running = VecDeque::new();
    let started = Instant::now();
    for (i, (id, prediction)) in ids.iter().zip(&predictions).enumerate() {
        let at = i as f64 * 2.0;
        tracker.placed(id, Some(prediction), at);
        running.push_back(i);
        if running.len() > RUNNING {
            let j = running.pop_front().unwrap_or_default();
            tracker.released(&ids[j], Some(at));
        }
    }
    let ns = started.elapsed().as_nanos() as f64 / VMS as f64;
    let report = tracker.report();
    assert!(report.versions.iter().all(|v| v.window.resolved > 0));
    ns
}

/// ns per VM of a PBFR decision and its release.
fn decision_ns() -> f64 {
    let spec = InventorySpec::homogeneous("z", 1_000, 20, Resources::from_whole(48.0, 192.0, 0.0).expect("capacity"));
    let config = AllocatorConfig { policy: PolicyConfig::preset("pbfr"), ..AllocatorConfig::default() };
    let mut allocator = Allocator::new(&spec, &config).expect("allocator");
    let requests: Vec<AllocationRequest> = (0..RUNNING + DECISIONS)
        .map(|i| {
            let cores = [1.0, 2.0, 4.0, 8.0][i % 4];
            let mut vm = VmRequest::new(
                &format!("vm-{i}"),
                "t",
                "D",
                Resources::from_whole(cores, cores * 4.0, 0.0).expect("demand"),
            );
            vm.prediction = Some(prediction(i));
            AllocationRequest::Vm(vm)
        })
        .collect();
    for (i, request) in requests.iter().take(RUNNING).enumerate() {
        allocator.allocate(request, i as f64).expect("fill");
    }
    let started = Instant::now();
    for (i, request) in requests.iter().enumerate().skip(RUNNING) {
        allocator.allocate(request, i as f64).expect("allocate");
        let _ = allocator.release(&VmId(format!("vm-{}", i - RUNNING)), i as f64);
    }
    started.elapsed().as_nanos() as f64 / DECISIONS as f64
}

fn main() {
    let decision = decision_ns();
    let tracker = tracker_ns();
    println!("| per VM | ns | share of the decision |");
    println!("|---|---:|---:|");
    println!("| PBFR allocate + release, 1,000 hosts (reference) | {decision:.0} | 1.00 |");
    println!("| OutcomeTracker placed + released, {RUNNING} in flight | {tracker:.0} | {:.3} |", tracker / decision);
}
