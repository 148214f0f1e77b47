//! Decision latency of the allocator at 1k, 10k and 100k hosts: the incremental index against the
//! full-scan reference on the same occupied inventory, for PBFR and LA-binary; NILAS and LAVA with
//! the model bundle's repredictions, beside PBFR measured in the same run, with the per-host
//! exit-time cache on and off; plus memory per host and per VM.
//!
//! `cargo bench -p allocator --bench decision_latency [-- HOSTS ... POLICY ... --bundle DIR]`
//!
//! - `HOSTS`: inventory sizes. Default 1,000, 10,000 and 100,000 for PBFR and LA-binary, and 1,000
//!   and 10,000 for NILAS and LAVA (at 100k hosts their fill alone makes tens of millions of
//!   repredictions); sizes given on the command line apply to every policy.
//! - `POLICY`: any of `pbfr`, `la-binary`, `nilas`, `lava` (default: all four). The NILAS and LAVA
//!   rows are compared with the PBFR rows of the same run, so keep `pbfr` in the list.
//! - `--bundle DIR`: the model bundle whose remaining-lifetime model repredicts (default:
//!   `models/default` of the workspace). Without a loadable bundle the NILAS and LAVA rows are
//!   skipped with a message.
//! - `--refresh-interval S`: `reprediction.refresh_interval_s` of NILAS and LAVA (default: the
//!   allocator's, 900 s; 0 turns the periodic refresh off).
//! - `--cpu-time`: time each call by its thread's CPU time instead of the wall clock. On a loaded
//!   machine a timed call that is preempted counts the wait in wall time; with 4 runnable
//!   processes per core that is about one call in a hundred, which is then the p99.
//! - `--no-cache-off`: skip NILAS's and LAVA's cache-off rows (at 100k hosts each of their
//!   decisions repredicts 1.4 million VMs, minutes per policy).
//! - `--malloc-fast-bins`: keep glibc's fast bins on. By default the bench turns them off first
//!   (`mallopt(M_MXFAST, 0)`), as the allocator service does at its start
//!   (`service_common::server::tune_malloc_for_churn`, which says why).
//!
//! Each inventory is filled to about 75% of its cores with a VM mix of 1 to 16 cores (4 or 8 GiB per
//! core; a quarter predicted long-lived with lifetimes of hours to weeks; every VM carries an
//! expected lifetime), then measured in steady state: every step moves the clock 1 s, releases a
//! random VM and allocates a new one, so occupancy stays put and the index sees the churn it would
//! in production. Only the `allocate` call is timed.
//!
//! NILAS and LAVA get the bundle's remaining-lifetime model before the fill
//! (`Allocator::set_repredictor`), with the 900 s periodic refresh by default, and are measured twice
//! on the same inventory:
//! - **cache on**: the allocator's per-host exit times, recomputed only for the host a VM joins or
//!   leaves and when a host's refresh interval has passed. The release before each timed call moves
//!   the clock, so the periodic refreshes that fall due are applied there, untimed; their count is
//!   printed beside the row.
//! - **cache off**: `Allocator::refresh_exits` (every non-empty host's exit time recomputed from
//!   repredictions, what a scheduler without the per-host cache must do) before every decision, in
//!   the timed section. Each decision then repredicts every VM, so fewer decisions are timed
//!   (2,000,000 / hosts, between 50 and 1,000).

use domain::{AllocationRequest, InventorySpec, ResourceKind, Resources, VmId};
use placement::reprediction::{BundleRepredictor, RepredictionConfig};
use placement::{Allocator, AllocatorConfig, Engine, IndexConfig, PolicyConfig};
use rand::Rng;
use std::alloc::{GlobalAlloc, Layout, System};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use workload::{Workload, FILL, HOST_CORES, HOST_MEMORY_GIB, START_S};

mod workload;

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

/// Timed decisions in steady state with the incremental index (and the cache on).
const STEPS: usize = 20_000;

/// How timed calls are timed.
#[derive(Copy, Clone)]
enum Clock {
    Wall,
    /// The calling thread's CPU time.
    ThreadCpu,
}

impl Clock {
    /// The time on this clock since an arbitrary origin.
    fn now(self) -> Duration {
        match self {
            Clock::Wall => {
                static ORIGIN: std::sync::LazyLock<Instant> = std::sync::LazyLock::new(Instant::now);
                ORIGIN.elapsed()
            }
            Clock::ThreadCpu => {
                let mut t = libc::timespec { tv_sec: 0, tv_nsec: 0 };
                // SAFETY: `t` is a valid timespec for the call to write into.
                unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut t) };
                Duration::new(t.tv_sec as u64, t.tv_nsec as u32)
            }
        }
    }
}

struct Figures {
    p50: Duration,
    p99: Duration,
    mean: Duration,
    steps: usize,
}

fn summarize(mut samples: Vec<Duration>) -> Figures {
    samples.sort();
    let mean = samples.iter().sum::<Duration>() / samples.len() as u32;
    Figures { p50: samples[samples.len() / 2], p99: samples[samples.len() * 99 / 100], mean, steps: samples.len() }
}

/// A steady-state measurement, with the repredictions it made (counted as model evaluations: a
/// reprediction answered from the VM's last evaluation costs none).
struct Measured {
    figures: Figures,
    /// Repredictions inside the timed section, per decision.
    timed_repredictions: f64,
    /// Repredictions outside it (the release before each decision and the periodic refreshes that
    /// fell due with it), per step.
    untimed_repredictions: f64,
    /// Mean time of that release, the refreshes that fell due with it included: the work the
    /// timed figures leave out.
    untimed_mean: Duration,
    /// Share of the placed VMs' survival curves answered from the repredictor's recent curves
    /// (`lifetime_model::curve_cache`) instead of computed.
    curves_reused: f64,
}

/// Steady-state churn: release a random VM, then time the allocation of a new one; with
/// `refresh_first`, time `refresh_exits` and the allocation together (the cache-off variant).
fn measure(
    allocator: &mut Allocator,
    workload: &mut Workload,
    placed: &mut Vec<VmId>,
    now: &mut f64,
    steps: usize,
    refresh_first: bool,
    clock: Clock,
) -> Measured {
    let before = allocator.repredictions_made();
    let curves_before = allocator.curves_reused_and_computed();
    let mut timed = 0u64;
    let mut samples = Vec::with_capacity(steps);
    let mut untimed = Duration::ZERO;
    for _ in 0..steps {
        *now += 1.0;
        let at = workload.rng.random_range(0..placed.len());
        let gone = placed.swap_remove(at);
        let released = clock.now();
        allocator.release(&gone, *now).expect("placed VM");
        untimed += clock.now() - released;
        // What the service writes and the simulator follows: taken after every operation (untimed).
        allocator.take_changes();
        let vm = workload.vm();
        let id = vm.vm_id.clone();
        let request = AllocationRequest::Vm(vm);
        let counted = allocator.repredictions_made();
        let start = clock.now();
        if refresh_first {
            allocator.refresh_exits();
        }
        let decision = allocator.allocate(&request, *now).expect("fresh id");
        samples.push(clock.now() - start);
        timed += allocator.repredictions_made() - counted;
        if decision.is_placed() {
            placed.push(id);
        }
        allocator.take_changes();
    }
    let total = allocator.repredictions_made() - before;
    let curves = allocator.curves_reused_and_computed();
    let (reused, computed) = (curves.0 - curves_before.0, curves.1 - curves_before.1);
    Measured {
        figures: summarize(samples),
        timed_repredictions: timed as f64 / steps as f64,
        untimed_repredictions: (total as f64 - timed as f64) / steps as f64,
        untimed_mean: untimed / steps as u32,
        curves_reused: reused as f64 / (reused + computed).max(1) as f64,
    }
}

struct Args {
    sizes: Option<Vec<usize>>,
    policies: Vec<&'static str>,
    bundle: PathBuf,
    refresh_interval_s: Option<f64>,
    cache_off: bool,
    clock: Clock,
    fast_bins: bool,
}

fn parse_args() -> Args {
    let mut sizes = Vec::new();
    let mut policies = Vec::new();
    let mut bundle = workload::default_bundle();
    let mut refresh_interval_s = None;
    let mut cache_off = true;
    let mut clock = Clock::Wall;
    let mut fast_bins = false;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        if arg == "--cpu-time" {
            clock = Clock::ThreadCpu;
        } else if arg == "--no-cache-off" {
            cache_off = false;
        } else if arg == "--malloc-fast-bins" {
            fast_bins = true;
        } else if arg == "--refresh-interval" {
            refresh_interval_s = args.next().and_then(|s| s.parse().ok());
        } else if let Some(s) = arg.strip_prefix("--refresh-interval=") {
            refresh_interval_s = s.parse().ok();
        } else if arg == "--bundle" {
            if let Some(dir) = args.next() {
                bundle = PathBuf::from(dir);
            }
        } else if let Some(dir) = arg.strip_prefix("--bundle=") {
            bundle = PathBuf::from(dir);
        } else if let Ok(hosts) = arg.parse::<usize>() {
            sizes.push(hosts);
        } else if let Some(kind) = placement::Registry::standard().preset_names().into_iter().find(|name| *name == arg)
        {
            policies.push(kind);
        }
        // Anything else (cargo passes `--bench`) is ignored.
    }
    if policies.is_empty() {
        policies = vec!["pbfr", "la-binary", "nilas", "lava"];
    }
    Args {
        sizes: (!sizes.is_empty()).then_some(sizes),
        policies,
        bundle,
        refresh_interval_s,
        cache_off,
        clock,
        fast_bins,
    }
}

fn policy_name(kind: &str) -> String {
    kind.to_owned()
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

/// The NILAS / LAVA table's rows, printed at the end beside PBFR's.
struct ExitRow {
    name: String,
    hosts: usize,
    vms: usize,
    exit_times: &'static str,
    measured: Measured,
}

fn main() {
    let args = parse_args();
    if !args.fast_bins {
        // SAFETY: mallopt changes glibc's own settings under its lock and takes no pointer; no
        // other thread runs yet.
        unsafe {
            libc::mallopt(libc::M_MXFAST, 0);
        }
    }
    println!(
        "malloc: glibc's fast bins {}",
        if args.fast_bins { "on (--malloc-fast-bins)" } else { "off, as the allocator service runs" }
    );
    let reads_exits = |kind: &str| {
        placement::Policy::from_config(&PolicyConfig::preset(kind), &HashMap::new(), &placement::Registry::standard())
            .is_ok_and(|p| p.reads_exit_times())
    };
    let model = if args.policies.iter().any(|&k| reads_exits(k)) {
        workload::load_bundle(&args.bundle, "skipping the NILAS and LAVA rows")
    } else {
        None
    };
    println!(
        "host: {HOST_CORES} cores, {HOST_MEMORY_GIB} GiB; filled to {:.0}% of cores; steady-state churn",
        FILL * 100.0
    );
    if let Clock::ThreadCpu = args.clock {
        println!("timed by the thread's CPU time (--cpu-time), not the wall clock");
    }
    if let Some(model) = &model {
        let interval = args.refresh_interval_s.unwrap_or(RepredictionConfig::default().refresh_interval_s);
        println!(
            "repredictions (NILAS, LAVA): bundle {} from {}; periodic refresh every {interval} s (0: off)",
            model.version(),
            args.bundle.display()
        );
    }
    let classic = args.policies.iter().any(|&k| !reads_exits(k));
    if classic {
        println!();
        println!("| policy | hosts | VMs | engine | p50 | p99 | mean | full scan / incremental (mean) |");
        println!("|---|---:|---:|---|---:|---:|---:|---:|");
    }
    let mut memory_rows = Vec::new();
    let mut growth: Vec<(String, usize, Duration)> = Vec::new();
    let mut exit_rows: Vec<ExitRow> = Vec::new();
    for &kind in &args.policies {
        let with_model = reads_exits(kind);
        if with_model && model.is_none() {
            continue;
        }
        let sizes = match &args.sizes {
            Some(sizes) => sizes.clone(),
            None if with_model => vec![1_000, 10_000],
            None => vec![1_000, 10_000, 100_000],
        };
        let name = policy_name(kind);
        for &hosts in &sizes {
            let started = Instant::now();
            let before = LIVE.load(Ordering::Relaxed);
            let spec = InventorySpec::homogeneous(
                "bench",
                hosts,
                40,
                Resources::from_whole(HOST_CORES, HOST_MEMORY_GIB, 0.0).expect("capacity"),
            );
            let mut config = AllocatorConfig { policy: PolicyConfig::preset(kind), seed: 1, ..Default::default() };
            if let Some(interval) = args.refresh_interval_s {
                config.reprediction.refresh_interval_s = interval;
            }
            let mut allocator = Allocator::new(&spec, &config).expect("allocator");
            drop(spec);
            let inventory_bytes = LIVE.load(Ordering::Relaxed) - before;
            if let (true, Some(model)) = (with_model, &model) {
                allocator.set_repredictor(Some(Arc::new(BundleRepredictor(model.clone()))));
            }
            let mut workload = Workload::new(42);
            let mut placed = Vec::new();
            let mut now = START_S;
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
                    allocator.take_changes();
                }
            }
            let vm_bytes = LIVE.load(Ordering::Relaxed) - after_inventory - allocator.index_heap_bytes();
            let vms = allocator.state().vm_count();
            eprintln!("{name}, {hosts} hosts: filled with {vms} VMs in {:.1} s", started.elapsed().as_secs_f64());
            let incremental = measure(&mut allocator, &mut workload, &mut placed, &mut now, STEPS, false, args.clock);
            let index_bytes = allocator.index_heap_bytes();
            let classes = allocator.stats().classes_cached;
            growth.push((name.clone(), hosts, incremental.figures.mean));
            memory_rows.push(format!(
                "| {name} | {hosts} | {:.0} B | {:.0} B ({classes} classes) | {:.0} B |",
                inventory_bytes as f64 / hosts as f64,
                index_bytes as f64 / hosts as f64,
                vm_bytes as f64 / vms as f64
            ));
            if with_model {
                exit_rows.push(ExitRow {
                    name: name.clone(),
                    hosts,
                    vms,
                    exit_times: "cached per host",
                    measured: incremental,
                });
                if args.cache_off {
                    let steps = (2_000_000 / hosts).clamp(50, 1_000);
                    let cache_off =
                        measure(&mut allocator, &mut workload, &mut placed, &mut now, steps, true, args.clock);
                    exit_rows.push(ExitRow {
                        name: name.clone(),
                        hosts,
                        vms,
                        exit_times: "cache off: `refresh_exits` every decision",
                        measured: cache_off,
                    });
                }
            } else {
                allocator.set_engine(Engine::FullScan, &IndexConfig::default());
                let scan_steps = (20_000_000 / hosts).clamp(200, 20_000);
                let full = measure(&mut allocator, &mut workload, &mut placed, &mut now, scan_steps, false, args.clock);
                let speedup = full.figures.mean.as_secs_f64() / incremental.figures.mean.as_secs_f64();
                for (engine, f, ratio) in [
                    ("incremental", &incremental.figures, format!("{speedup:.0}x")),
                    ("full scan", &full.figures, String::new()),
                ] {
                    println!(
                        "| {name} | {hosts} | {vms} | {engine} | {:.1} us | {:.1} us | {:.1} us | {ratio} |",
                        us(f.p50),
                        us(f.p99),
                        us(f.mean)
                    );
                }
                if kind == "pbfr" {
                    exit_rows.push(ExitRow {
                        name: name.clone(),
                        hosts,
                        vms,
                        exit_times: "none (reference)",
                        measured: incremental,
                    });
                }
            }
            eprintln!("{name}, {hosts} hosts: done in {:.1} s", started.elapsed().as_secs_f64());
        }
    }
    if exit_rows.iter().any(|r| r.name != "pbfr") {
        print_exit_rows(&exit_rows);
    }
    println!();
    println!("| policy | hosts | inventory per host | index per host | per VM |");
    println!("|---|---:|---:|---:|---:|");
    for row in memory_rows {
        println!("{row}");
    }
    println!();
    for &kind in &args.policies {
        let kind = policy_name(kind);
        let mut runs: Vec<&(String, usize, Duration)> = growth.iter().filter(|(k, _, _)| *k == kind).collect();
        runs.sort_by_key(|(_, hosts, _)| *hosts);
        if let (Some(small), Some(large)) = (runs.first(), runs.last()) {
            if large.1 > small.1 {
                println!(
                    "{kind}: incremental mean grows {:.2}x from {} to {} hosts",
                    large.2.as_secs_f64() / small.2.as_secs_f64(),
                    small.1,
                    large.1
                );
            }
        }
    }
}

/// NILAS and LAVA, cache on and off, beside PBFR's incremental rows of the same run.
fn print_exit_rows(rows: &[ExitRow]) {
    let pbfr: HashMap<usize, &Figures> =
        rows.iter().filter(|r| r.name == "pbfr").map(|r| (r.hosts, &r.measured.figures)).collect();
    println!();
    println!(
        "| policy | hosts | VMs | exit times | decisions | p50 | p99 | mean | p50 / PBFR | p99 / PBFR | mean / PBFR \
         | model evaluations per decision (timed) | model evaluations per step (untimed) | release and refreshes per step (untimed, mean) | survival curves reused |"
    );
    println!("|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    let mut sorted: Vec<&ExitRow> = rows.iter().collect();
    sorted.sort_by_key(|r| r.hosts);
    for row in sorted {
        let f = &row.measured.figures;
        let ratio = |ours: Duration, theirs: fn(&Figures) -> Duration| {
            pbfr.get(&row.hosts)
                .map_or(String::new(), |p| format!("{:.2}x", ours.as_secs_f64() / theirs(p).as_secs_f64()))
        };
        println!(
            "| {} | {} | {} | {} | {} | {:.1} us | {:.1} us | {:.1} us | {} | {} | {} | {:.1} | {:.1} | {:.1} us | {:.0}% |",
            row.name,
            row.hosts,
            row.vms,
            row.exit_times,
            f.steps,
            us(f.p50),
            us(f.p99),
            us(f.mean),
            ratio(f.p50, |p| p.p50),
            ratio(f.p99, |p| p.p99),
            ratio(f.mean, |p| p.mean),
            row.measured.timed_repredictions,
            row.measured.untimed_repredictions,
            us(row.measured.untimed_mean),
            100.0 * row.measured.curves_reused,
        );
    }
}
