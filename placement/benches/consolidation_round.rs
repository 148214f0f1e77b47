//! How long planning one consolidation round takes (`Allocator::consolidation_plan`, the dry run a
//! round makes before it starts anything) at 10,000 and 100,000 hosts, per chooser, beside a bare
//! reference in the same run: one pass over the hosts that collects and sorts them by VM count (the
//! least any chooser that ranks hosts must do).
//!
//! `cargo bench -p placement --bench consolidation_round [-- HOSTS ... --bundle DIR]`
//!
//! Each inventory is filled to 75% of its cores with the benches' VM mix (`workload`), by PBFR with
//! the default bundle's model repredicting (so that the `lifetime` chooser reads the model's
//! survival curves), then a third of the VMs leave, so hosts hold from none to dozens of VMs.
//! Consolidation is set at a budget of 0.25 migrations per host-day a day before the plans, so its
//! bucket is full (25,000 migrations at 100,000 hosts): the round reads as many hosts as it ever
//! would. Each chooser's plan is timed 5 times (wall clock; median and max printed).

use domain::{AllocationRequest, InventorySpec, Resources, VmId};
use placement::consolidation::{ChooserKind, ConsolidationConfig};
use placement::reprediction::BundleRepredictor;
use placement::{Allocator, AllocatorConfig, PolicyConfig};
use rand::Rng;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};
use workload::{Workload, FILL, HOST_CORES, HOST_MEMORY_GIB, START_S};

mod workload;

const DAY: f64 = 86_400.0;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).filter(|a| a != "--bench").collect();
    let mut sizes = Vec::new();
    let mut bundle = workload::default_bundle();
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--bundle" => bundle = PathBuf::from(it.next().expect("--bundle DIR")),
            size => sizes.push(size.parse::<usize>().unwrap_or_else(|_| panic!("unknown argument {size}"))),
        }
    }
    if sizes.is_empty() {
        sizes = vec![10_000, 100_000];
    }
    let model = workload::load_bundle(&bundle, "the lifetime chooser reads initial predictions");
    println!(
        "| hosts | VMs | chooser | plan median ms | plan max ms | hosts chosen | migrations | ratio to the scan |"
    );
    println!("|---:|---:|---|---:|---:|---:|---:|---:|");
    for hosts in sizes {
        let (mut allocator, now) = filled(hosts, model.clone());
        let scan = median(&time(5, || {
            let mut ranked: Vec<(usize, u32)> = allocator
                .state()
                .hosts()
                .iter()
                .enumerate()
                .filter(|(_, h)| !h.vms.is_empty())
                .map(|(i, h)| (h.vms.len(), i as u32))
                .collect();
            ranked.sort_unstable();
            std::hint::black_box(ranked.len());
        }));
        let vms = allocator.state().vm_count();
        println!("| {hosts} | {vms} | (scan and sort by VM count) | {:.2} | | | | 1.00 |", ms(scan));
        // Each chooser is set a day before its plans (the clock only goes forward).
        let mut at = now;
        for chooser in [
            ChooserKind::FewestVms,
            ChooserKind::LeastUsed,
            ChooserKind::Age,
            ChooserKind::AgeBatches,
            ChooserKind::Lifetime,
        ] {
            let config = ConsolidationConfig { budget_per_host_day: 0.25, chooser, ..ConsolidationConfig::default() };
            allocator.set_consolidation(None, at).expect("nothing in flight");
            allocator.set_consolidation(Some(config), at).expect("valid settings");
            at += DAY;
            let mut chosen = (0, 0);
            let times = time(5, || {
                let plan = allocator.consolidation_plan(at).expect("consolidation is on");
                chosen = (plan.len(), plan.iter().map(|p| p.moves.len()).sum::<usize>());
            });
            let (median, max) = (median(&times), times.iter().copied().max().unwrap_or_default());
            println!(
                "| {hosts} | {vms} | {} | {:.2} | {:.2} | {} | {} | {:.2} |",
                chooser.name(),
                ms(median),
                ms(max),
                chosen.0,
                chosen.1,
                median.as_secs_f64() / scan.as_secs_f64().max(1e-9)
            );
        }
    }
}

/// An inventory of `hosts` filled to 75% by PBFR, then with a third of its VMs gone; and the clock.
fn filled(hosts: usize, model: Option<Arc<lifetime_model::LifetimeModel>>) -> (Allocator, f64) {
    let capacity = Resources::from_whole(HOST_CORES, HOST_MEMORY_GIB, 0.0).expect("valid capacity");
    let spec = InventorySpec::homogeneous("bench", hosts, 40, capacity);
    let config = AllocatorConfig { policy: PolicyConfig::preset("pbfr"), ..AllocatorConfig::default() };
    let mut allocator = Allocator::new(&spec, &config).expect("a valid inventory");
    allocator.set_repredictor(
        model.map(|m| Arc::new(BundleRepredictor(m)) as Arc<dyn placement::reprediction::Repredictor>),
    );
    let mut workload = Workload::new(7);
    let target = FILL * HOST_CORES * hosts as f64;
    let (mut used, mut now) = (0.0, START_S);
    let mut placed: Vec<VmId> = Vec::new();
    let started = Instant::now();
    while used < target {
        let vm = workload.vm();
        let cores = vm.facts.demand.cores();
        now += 0.01;
        let id = vm.vm_id.clone();
        if allocator.allocate(&AllocationRequest::Vm(vm), now).is_ok_and(|d| d.is_placed()) {
            used += cores;
            placed.push(id);
        }
        allocator.take_changes().for_each(drop);
    }
    for id in &placed {
        if workload.rng.random_bool(1.0 / 3.0) {
            now += 0.01;
            let _ = allocator.release(id, now);
        }
    }
    allocator.take_changes().for_each(drop);
    eprintln!("filled {hosts} hosts in {:.1} s", started.elapsed().as_secs_f64());
    (allocator, now)
}

fn time(runs: usize, mut f: impl FnMut()) -> Vec<Duration> {
    (0..runs)
        .map(|_| {
            let started = Instant::now();
            f();
            started.elapsed()
        })
        .collect()
}

fn median(times: &[Duration]) -> Duration {
    let mut sorted = times.to_vec();
    sorted.sort_unstable();
    sorted[sorted.len() / 2]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}
