//! Heap per running VM in the allocator service (issue 44): what holding one more VM costs.
//!
//! `cargo bench -p allocator --bench vm_memory [-- VMS --hosts N --bundle DIR]`
//!
//! Places `VMS` VMs (default 200,000) through a [`DurableAllocator`] over a SQLite store in a
//! temporary directory, as the service's worker does (batches of 256 allocations, one commit
//! each), under the checked-in configuration's policy (NILAS over exact best fit, 8-hour exit
//! floor) with the bundle's remaining-lifetime model repredicting (`--bundle`, default
//! `models/default`: a survival model, so every VM keeps its survival curve) and the default
//! outcome tracking. Requests as a replay sends them: tenants `t0`..`t2999`, 40 VM types, every VM
//! a model prediction with its version and expected lifetime and its request time, a third an OS,
//! a fifth two extra features.
//!
//! A counting global allocator reads the live heap once the allocator is open with the model set
//! (0 VMs) and once every VM is placed: the bytes asked for, the bytes glibc's `malloc` holds for
//! them (each block's usable size and its 8-byte size word: what the process's memory grows by)
//! and the allocations. The per-VM figures are the differences over the VMs placed: they include
//! the index's classes built on the way and what the hosts' vectors grew by, and exclude SQLite's
//! own page cache (C `malloc`, not Rust's allocator; bounded by its cache size, not by the VMs).

use allocator::durable::{job, Allocate, DurableAllocator};
use domain::{
    AllocationRequest, FeatureValue, InventorySpec, LifetimeClass, LifetimePrediction, PredictionSource, Priority,
    Resources, VmRequest,
};
use lifetime_model::LifetimeModel;
use placement::reprediction::{BundleRepredictor, Repredictor};
use placement::{AllocatorConfig, PolicyConfig, Registry};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::alloc::{GlobalAlloc, Layout, System};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

/// Counts live heap bytes (asked for, and held by glibc's `malloc`) and allocations.
struct Counting;
static BYTES: AtomicUsize = AtomicUsize::new(0);
static HELD: AtomicUsize = AtomicUsize::new(0);
static ALLOCATIONS: AtomicUsize = AtomicUsize::new(0);

/// What glibc holds for the block at `ptr`: its usable size and the 8-byte size word before it.
fn held(ptr: *mut u8) -> usize {
    // SAFETY: `ptr` is a live block of the system allocator (glibc's `malloc` on Linux).
    unsafe { libc::malloc_usable_size(ptr.cast()) + 8 }
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let ptr = unsafe { System.alloc(layout) };
        if !ptr.is_null() {
            BYTES.fetch_add(layout.size(), Ordering::Relaxed);
            HELD.fetch_add(held(ptr), Ordering::Relaxed);
            ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        }
        ptr
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        BYTES.fetch_sub(layout.size(), Ordering::Relaxed);
        HELD.fetch_sub(held(ptr), Ordering::Relaxed);
        ALLOCATIONS.fetch_sub(1, Ordering::Relaxed);
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let before = held(ptr);
        let moved = unsafe { System.realloc(ptr, layout, new_size) };
        if !moved.is_null() {
            BYTES.fetch_add(new_size, Ordering::Relaxed);
            BYTES.fetch_sub(layout.size(), Ordering::Relaxed);
            HELD.fetch_add(held(moved), Ordering::Relaxed);
            HELD.fetch_sub(before, Ordering::Relaxed);
        }
        moved
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// The live heap now.
#[derive(Clone, Copy)]
struct Heap {
    bytes: usize,
    held: usize,
    allocations: usize,
}

fn heap() -> Heap {
    Heap {
        bytes: BYTES.load(Ordering::Relaxed),
        held: HELD.load(Ordering::Relaxed),
        allocations: ALLOCATIONS.load(Ordering::Relaxed),
    }
}

/// The model's clock at the first VM: just after the default bundle's training data, so that the
/// tenants' histories are recent (as in `placement`'s decision bench).
const START_S: f64 = 800_000.0;
/// Tenants `t0`..: the default bundle's feature store knows `t0` to `t1493`.
const TENANTS: u32 = 3_000;
/// The service's largest batch (`max_batch` of `configs/allocator.toml`).
const BATCH: usize = 256;
/// Seconds of the clock between two VMs.
const STEP_S: f64 = 0.05;

/// A seeded stream of requests as a replay sends them.
struct Requests {
    rng: ChaCha8Rng,
    next: u64,
}

impl Requests {
    fn vm(&mut self, now_s: f64) -> VmRequest {
        self.next += 1;
        let rng = &mut self.rng;
        let cores: u32 = match rng.random_range(0..100) {
            0..=49 => 1,
            50..=74 => 2,
            75..=89 => 4,
            90..=97 => 8,
            _ => 16,
        };
        // 40 types: D and E (the bundle's, 4 and 8 GiB per core), each size in four generations.
        let (family, per_core) = if rng.random_bool(0.5) { ("D", 4.0) } else { ("E", 8.0) };
        let generation = ["", "s_v3", "s_v4", "s_v5"][rng.random_range(0..4)];
        let demand = Resources::from_whole(f64::from(cores), f64::from(cores) * per_core, 0.0).expect("valid demand");
        let tenant = format!("t{}", rng.random_range(0..TENANTS));
        let mut vm =
            VmRequest::new(&format!("vm-{:08}", self.next), &tenant, &format!("{family}{cores}{generation}"), demand);
        let long = rng.random_bool(0.25);
        vm.prediction = Some(LifetimePrediction {
            p_long: if long { 0.8 } else { 0.2 },
            class: if long { LifetimeClass::Long } else { LifetimeClass::Short },
            interval_class: None,
            expected_lifetime_s: Some(if long {
                rng.random_range(3.0 * 3600.0..30.0 * 86_400.0)
            } else {
                rng.random_range(60.0..7200.0)
            }),
            model_version: Some("default-1".to_owned()),
            source: PredictionSource::Model,
        });
        vm.facts.requested_at_s = Some(now_s);
        if rng.random_bool(0.1) {
            vm.facts.details.priority = Priority::Low;
        }
        if rng.random_bool(1.0 / 3.0) {
            vm.facts.details.os = Some(if rng.random_bool(0.7) { "linux" } else { "windows" }.to_owned());
        }
        if rng.random_bool(0.2) {
            vm.facts
                .details
                .features
                .insert("batch_size".to_owned(), FeatureValue::Number(f64::from(rng.random_range(1..64))));
            let region = ["eu-west", "us-east", "ap-south"][rng.random_range(0..3)];
            vm.facts.details.features.insert("region".to_owned(), FeatureValue::Text(region.to_owned()));
        }
        vm
    }
}

fn main() {
    let mut vms = 200_000usize;
    let mut hosts = 16_000usize;
    let mut bundle = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../models/default");
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--bundle" => bundle = PathBuf::from(args.next().expect("--bundle DIR")),
            "--hosts" => hosts = args.next().and_then(|n| n.parse().ok()).expect("--hosts N"),
            // `cargo bench` passes `--bench`.
            "--bench" => {}
            n => vms = n.parse().unwrap_or_else(|_| panic!("unknown argument `{n}`")),
        }
    }
    let model = LifetimeModel::load(&bundle).unwrap_or_else(|e| panic!("bundle {}: {e}", bundle.display()));
    let repredictor: Arc<dyn Repredictor> = Arc::new(BundleRepredictor(Arc::new(model)));
    let capacity = Resources::from_whole(48.0, 384.0, 0.0).expect("valid capacity");
    let spec = InventorySpec::homogeneous("zone-1", hosts, 20, capacity);
    let policy: PolicyConfig = toml::from_str(
        "kind = \"nilas\"\nbuckets = \"exact\"\nlong_threshold_s = 7200.0\nprefer_non_empty = true\nexit_floor_s = 28800.0",
    )
    .expect("the checked-in policy");
    let config = AllocatorConfig { policy, seed: 42, ..AllocatorConfig::default() };
    let dir = tempfile::tempdir().expect("a temporary directory");
    let mut durable =
        DurableAllocator::open(&spec, &config, &Registry::standard(), dir.path().join("allocator.db"), START_S)
            .expect("allocator opened");
    durable.set_repredictor(Some(repredictor));

    let empty = heap();
    let mut requests = Requests { rng: ChaCha8Rng::seed_from_u64(44), next: 0 };
    let started = Instant::now();
    let mut placed = 0usize;
    let mut now_s = START_S;
    while placed < vms {
        let mut answers = Vec::with_capacity(BATCH);
        let mut jobs = Vec::with_capacity(BATCH);
        for _ in 0..BATCH.min(vms - placed) {
            now_s += STEP_S;
            let (job, answer) = job(Allocate(AllocationRequest::Vm(requests.vm(now_s))));
            jobs.push(job);
            answers.push(answer);
            placed += 1;
        }
        durable.execute(jobs, now_s);
        for answer in answers {
            let decision = answer.ready().expect("an answer");
            assert!(decision.is_placed(), "every VM fits: {decision:?}");
        }
    }
    let elapsed = started.elapsed();
    let full = heap();
    let allocator = durable.allocator().expect("a live allocator");
    let running = allocator.state().vm_count();
    let index = allocator.index_heap_bytes();
    assert_eq!(running, vms, "every VM is running");
    let per_vm = |field: fn(&Heap) -> usize| (field(&full) as f64 - field(&empty) as f64) / running as f64;
    println!("{running} VMs on {hosts} hosts placed in {:.1} s", elapsed.as_secs_f64());
    println!("| VMs | heap bytes asked for | held by malloc | allocations |");
    println!("|---:|---:|---:|---:|");
    for (vms, heap) in [(0, empty), (running, full)] {
        println!("| {vms} | {} | {} | {} |", heap.bytes, heap.held, heap.allocations);
    }
    println!(
        "| per running VM | {:.0} B | {:.0} B | {:.2} |",
        per_vm(|h| h.bytes),
        per_vm(|h| h.held),
        per_vm(|h| h.allocations)
    );
    println!(
        "of which the index's request classes (a cost per host and class, not per VM): {:.0} B per VM",
        index as f64 / running as f64
    );
}
