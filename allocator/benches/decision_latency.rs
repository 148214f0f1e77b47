//! Decision latency of the allocator at 1k, 10k and 100k hosts: the incremental index against the
//! full-scan reference on the same occupied inventory, for PBFR and LA-binary; plus memory per host
//! and per VM.
//!
//! `cargo bench -p allocator --bench decision_latency [-- HOSTS ...]`
//!
//! Each inventory is filled to about 75% of its cores with a VM mix of 1 to 16 cores (4 or 8 GiB per
//! core; a quarter predicted long-lived with lifetimes of hours to weeks), then measured in steady
//! state: every step releases a random VM and allocates a new one, so occupancy stays put and the
//! index sees the churn it would in production. Only the `allocate` call is timed.

use allocator::{Allocator, AllocatorConfig, Engine, IndexConfig, PolicyConfig, PolicyKind};
use domain::{
    AllocationRequest, InventorySpec, LifetimeClass, LifetimePrediction, PredictionSource, ResourceKind, Resources,
    VmId, VmRequest,
};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// Counts live heap bytes, for the memory figures.
struct Counting;
static LIVE: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size(), Ordering::Relaxed);
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE.fetch_add(new_size, Ordering::Relaxed);
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

const HOST_CORES: f64 = 48.0;
const HOST_MEMORY_GIB: f64 = 384.0;
const FILL: f64 = 0.75;

struct Workload {
    rng: ChaCha8Rng,
    next_vm: u64,
}

impl Workload {
    fn vm(&mut self) -> VmRequest {
        self.next_vm += 1;
        // Core mix after Protean Table 3: mostly small VMs, a few large ones.
        let cores = match self.rng.random_range(0..100) {
            0..=49 => 1.0,
            50..=74 => 2.0,
            75..=89 => 4.0,
            90..=97 => 8.0,
            _ => 16.0,
        };
        let memory = cores * if self.rng.random_bool(0.5) { 4.0 } else { 8.0 };
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
        let tenant = format!("tenant-{}", self.rng.random_range(0..5000));
        let demand = Resources::from_whole(cores, memory, 0.0).expect("valid demand");
        let mut vm = VmRequest::new(&format!("vm-{}", self.next_vm), &tenant, &format!("c{cores}m{memory}"), demand);
        vm.prediction = Some(prediction);
        vm
    }
}

struct Figures {
    p50: Duration,
    p99: Duration,
    mean: Duration,
}

fn summarize(mut samples: Vec<Duration>) -> Figures {
    samples.sort();
    let mean = samples.iter().sum::<Duration>() / samples.len() as u32;
    Figures { p50: samples[samples.len() / 2], p99: samples[samples.len() * 99 / 100], mean }
}

/// Steady-state churn: release a random VM, then time the allocation of a new one.
fn measure(
    allocator: &mut Allocator,
    workload: &mut Workload,
    placed: &mut Vec<VmId>,
    now: &mut f64,
    steps: usize,
) -> Figures {
    let mut samples = Vec::with_capacity(steps);
    for _ in 0..steps {
        *now += 1.0;
        let at = workload.rng.random_range(0..placed.len());
        let gone = placed.swap_remove(at);
        allocator.release(&gone, *now).expect("placed VM");
        let vm = workload.vm();
        let id = vm.vm_id.clone();
        let request = AllocationRequest::Vm(vm);
        let start = Instant::now();
        let decision = allocator.allocate(&request, *now).expect("fresh id");
        samples.push(start.elapsed());
        if decision.is_placed() {
            placed.push(id);
        }
    }
    summarize(samples)
}

fn main() {
    let sizes: Vec<usize> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    let sizes = if sizes.is_empty() { vec![1_000, 10_000, 100_000] } else { sizes };
    println!(
        "host: {HOST_CORES} cores, {HOST_MEMORY_GIB} GiB; filled to {:.0}% of cores; steady-state churn",
        FILL * 100.0
    );
    println!();
    println!("| policy | hosts | VMs | engine | p50 | p99 | mean | full scan / incremental (mean) |");
    println!("|---|---:|---:|---|---:|---:|---:|---:|");
    let mut memory_rows = Vec::new();
    let mut growth: Vec<(String, usize, Duration)> = Vec::new();
    for kind in [PolicyKind::Pbfr, PolicyKind::LaBinary] {
        for &hosts in &sizes {
            let before = LIVE.load(Ordering::Relaxed);
            let spec = InventorySpec::homogeneous(
                "bench",
                hosts,
                40,
                Resources::from_whole(HOST_CORES, HOST_MEMORY_GIB, 0.0).expect("capacity"),
            );
            let config = AllocatorConfig { policy: PolicyConfig::of_kind(kind), seed: 1, ..Default::default() };
            let mut allocator = Allocator::new(&spec, &config).expect("allocator");
            drop(spec);
            let inventory_bytes = LIVE.load(Ordering::Relaxed) - before;
            let mut workload = Workload { rng: ChaCha8Rng::seed_from_u64(42), next_vm: 0 };
            let mut placed = Vec::new();
            let mut now = 1.0e9;
            let target = FILL * HOST_CORES * hosts as f64;
            let after_inventory = LIVE.load(Ordering::Relaxed);
            while allocator.state().totals().used.whole(ResourceKind::Cores) < target {
                for _ in 0..1000 {
                    now += 0.01;
                    let vm = workload.vm();
                    let id = vm.vm_id.clone();
                    if allocator.allocate(&AllocationRequest::Vm(vm), now).expect("fresh id").is_placed() {
                        placed.push(id);
                    }
                }
            }
            let vm_bytes = LIVE.load(Ordering::Relaxed) - after_inventory - allocator.index_heap_bytes();
            let vms = allocator.state().vm_count();
            let incremental = measure(&mut allocator, &mut workload, &mut placed, &mut now, 20_000);
            let index_bytes = allocator.index_heap_bytes();
            let classes = allocator.stats().classes_cached;
            allocator.set_engine(Engine::FullScan, &IndexConfig::default());
            let scan_steps = (20_000_000 / hosts).clamp(200, 20_000);
            let full = measure(&mut allocator, &mut workload, &mut placed, &mut now, scan_steps);
            let name = serde_json::to_value(kind).ok().and_then(|v| v.as_str().map(str::to_owned)).unwrap_or_default();
            let us = |d: Duration| d.as_secs_f64() * 1e6;
            let speedup = full.mean.as_secs_f64() / incremental.mean.as_secs_f64();
            for (engine, f, ratio) in
                [("incremental", &incremental, format!("{speedup:.0}x")), ("full scan", &full, String::new())]
            {
                println!(
                    "| {name} | {hosts} | {vms} | {engine} | {:.1} us | {:.1} us | {:.1} us | {ratio} |",
                    us(f.p50),
                    us(f.p99),
                    us(f.mean)
                );
            }
            growth.push((name.clone(), hosts, incremental.mean));
            memory_rows.push(format!(
                "| {name} | {hosts} | {:.0} B | {:.0} B ({classes} classes) | {:.0} B |",
                inventory_bytes as f64 / hosts as f64,
                index_bytes as f64 / hosts as f64,
                vm_bytes as f64 / vms as f64
            ));
        }
    }
    println!();
    println!("| policy | hosts | inventory per host | index per host | per VM |");
    println!("|---|---:|---:|---:|---:|");
    for row in memory_rows {
        println!("{row}");
    }
    println!();
    for kind in ["pbfr", "la-binary"] {
        let of = |n: usize| growth.iter().find(|(k, h, _)| k == kind && *h == n).map(|(_, _, d)| d.as_secs_f64());
        if let (Some(small), Some(large)) = (of(*sizes.first().unwrap_or(&0)), of(*sizes.last().unwrap_or(&0))) {
            println!(
                "{kind}: incremental mean grows {:.2}x from {} to {} hosts",
                large / small,
                sizes.first().unwrap_or(&0),
                sizes.last().unwrap_or(&0)
            );
        }
    }
}
