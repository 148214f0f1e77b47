//! In-process cost of repredicting a running VM's remaining lifetime (what NILAS and LAVA pay to
//! keep hosts' exit times current), beside the 9 us median paper 000 reports for its model.
//!
//! `cargo bench -p allocator --bench reprediction [-- HOSTS --bundle DIR]`
//!
//! - `HOSTS`: hosts of the allocator refreshed in (b) and (c) (default 10,000, about 141k VMs).
//! - `--bundle DIR`: the model bundle (default `models/default` of the workspace). Without a
//!   loadable bundle only the no-model reference (c) runs.
//!
//! Measured, one thread:
//! - (a) `LifetimeModel::predict_remaining_row(row, uptime)`, a timer around each of 100k calls, on
//!   rows encoded from the bench's VM requests (tenants of the bundle's feature store and new ones)
//!   with uptimes from a minute to a week; and `LifetimeModel::encode`, which the allocator does
//!   once per VM, on its first reprediction.
//! - (b) a whole refresh through the allocator: an allocator (NILAS, periodic refresh off) filled to
//!   75% of its cores with the model set before the fill (so every row is encoded), then
//!   `Allocator::refresh_exits` timed after moving the clock a minute, divided by the VMs
//!   refreshed: the cost per VM including the host loop, the model evaluations (only for the VMs
//!   whose uptime crossed a split threshold of the model since their last one; the increase of
//!   `stats().repredictions` counts them), and the hosts' summaries and index journal.
//! - (c) the same refresh on the same fill with no model: each VM's remaining lifetime is its
//!   initial prediction minus its age, the simple reference, divided by the VMs refreshed.

use domain::{AllocationRequest, InventorySpec, ResourceKind, Resources};
use lifetime_model::{LifetimeModel, RequestFeatures};
use placement::reprediction::{BundleRepredictor, RepredictionConfig};
use placement::{Allocator, AllocatorConfig, PolicyConfig};
use rand::Rng;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};
use test_support::timing::{per_call, Latency};
use workload::{Workload, FILL, HOST_CORES, HOST_MEMORY_GIB, START_S};

mod workload;

const CALLS: usize = 100_000;
/// Whole refreshes timed in (b) and (c).
const REFRESHES: usize = 20;
/// The median paper 000 reports for one reprediction in process.
const PAPER_MEDIAN_US: f64 = 9.0;

/// An allocator of `hosts` hosts (NILAS, no periodic refresh) filled to 75% of its cores, the model
/// (if any) set before the fill.
fn filled(hosts: usize, model: Option<&Arc<LifetimeModel>>) -> (Allocator, f64) {
    let spec = InventorySpec::homogeneous(
        "bench",
        hosts,
        40,
        Resources::from_whole(HOST_CORES, HOST_MEMORY_GIB, 0.0).expect("capacity"),
    );
    let config = AllocatorConfig {
        policy: PolicyConfig::preset("nilas"),
        seed: 1,
        reprediction: RepredictionConfig { refresh_interval_s: 0.0 },
        ..Default::default()
    };
    let mut allocator = Allocator::new(&spec, &config).expect("allocator");
    if let Some(model) = model {
        allocator.set_repredictor(Some(Arc::new(BundleRepredictor(model.clone()))));
    }
    let mut workload = Workload::new(42);
    let mut now = START_S;
    let target = FILL * HOST_CORES * hosts as f64;
    while allocator.state().totals().used.whole(ResourceKind::Cores) < target {
        now += 0.01;
        allocator.allocate(&AllocationRequest::Vm(workload.vm()), now).expect("fresh id");
        allocator.take_changes();
    }
    (allocator, now)
}

/// Times `REFRESHES` whole refreshes, the clock a minute later each time; the cost per VM of each
/// is its time over the VMs it refreshed. Also returns the model evaluations per refresh.
fn refresh_per_vm(allocator: &mut Allocator, mut now: f64) -> (Latency, Duration, u64) {
    let vms = allocator.state().vm_count() as u64;
    let mut samples = Vec::with_capacity(REFRESHES);
    let mut total = Duration::ZERO;
    let mut repredicted = 0;
    for _ in 0..REFRESHES {
        now += 60.0;
        allocator.advance_clock(now);
        let before = allocator.stats().repredictions;
        let start = Instant::now();
        allocator.refresh_exits();
        let elapsed = start.elapsed();
        repredicted += allocator.stats().repredictions - before;
        total += elapsed;
        samples.push(elapsed.as_nanos() as f64 / vms.max(1) as f64);
    }
    (Latency::of(samples), total / REFRESHES as u32, repredicted / REFRESHES as u64)
}

fn main() {
    let mut hosts = 10_000;
    let mut bundle = workload::default_bundle();
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        if arg == "--bundle" {
            if let Some(dir) = args.next() {
                bundle = PathBuf::from(dir);
            }
        } else if let Some(dir) = arg.strip_prefix("--bundle=") {
            bundle = PathBuf::from(dir);
        } else if let Ok(n) = arg.parse() {
            hosts = n;
        }
    }
    let model = workload::load_bundle(&bundle, "only the no-model reference runs");
    let mut rows: Vec<(String, Latency, String)> = Vec::new();
    let mut notes = Vec::new();
    if let Some(model) = &model {
        println!("bundle {} from {}", model.version(), bundle.display());
        let mut workload = Workload::new(7);
        let features: Vec<RequestFeatures> =
            (0..4_096).map(|n| RequestFeatures::of(&workload.vm().facts, START_S + n as f64)).collect();
        let rng = &mut workload.rng;
        let inputs: Vec<(Vec<f64>, f64)> = features
            .iter()
            .map(|f| (model.encode(f), 10f64.powf(rng.random_range(60f64.log10()..604_800f64.log10()))))
            .collect();
        rows.push((
            "(a) `LifetimeModel::predict_remaining_row`, per call".to_owned(),
            per_call(&inputs, CALLS, |(row, uptime)| model.predict_remaining_row(row, *uptime)),
            format!("{PAPER_MEDIAN_US:.0} us"),
        ));
        rows.push((
            "`LifetimeModel::encode` (once per VM, on its first reprediction)".to_owned(),
            per_call(&features, CALLS, |f| model.encode(f)[0]),
            String::new(),
        ));
        let started = Instant::now();
        let (mut allocator, now) = filled(hosts, Some(model));
        eprintln!("filled {hosts} hosts with a model in {:.1} s", started.elapsed().as_secs_f64());
        let (per_vm, whole, made) = refresh_per_vm(&mut allocator, now);
        notes.push(format!(
            "(b) {} VMs on {hosts} hosts: a whole refresh takes {:.1} ms on average and makes {made} model evaluations",
            allocator.state().vm_count(),
            whole.as_secs_f64() * 1e3
        ));
        rows.push((
            format!("(b) `Allocator::refresh_exits` with the model, per VM ({REFRESHES} refreshes)"),
            per_vm,
            format!("{PAPER_MEDIAN_US:.0} us"),
        ));
    }
    let started = Instant::now();
    let (mut allocator, now) = filled(hosts, None);
    eprintln!("filled {hosts} hosts without a model in {:.1} s", started.elapsed().as_secs_f64());
    let (per_vm, whole, _) = refresh_per_vm(&mut allocator, now);
    notes.push(format!(
        "(c) {} VMs on {hosts} hosts: a whole refresh without a model takes {:.1} ms on average",
        allocator.state().vm_count(),
        whole.as_secs_f64() * 1e3
    ));
    rows.push((
        format!(
            "(c) reference: `refresh_exits` without a model (prediction minus age), per VM ({REFRESHES} refreshes)"
        ),
        per_vm,
        String::new(),
    ));
    println!();
    println!("| what | median | p99 | mean | paper 000 (median) |");
    println!("|---|---:|---:|---:|---:|");
    for (name, s, paper) in &rows {
        println!(
            "| {name} | {:.2} us | {:.2} us | {:.2} us | {paper} |",
            s.median_ns / 1e3,
            s.p99_ns / 1e3,
            s.mean_ns / 1e3
        );
    }
    println!();
    for note in notes {
        println!("{note}");
    }
    if rows.len() == 4 {
        println!(
            "per VM in a refresh: with the model / without: {:.1}x (median); ours / paper's 9 us median: {:.2}x",
            rows[2].1.median_ns / rows[3].1.median_ns,
            rows[2].1.median_ns / 1e3 / PAPER_MEDIAN_US
        );
    }
}
