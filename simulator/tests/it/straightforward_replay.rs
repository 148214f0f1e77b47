//! The simulator against an independent, straightforward replay of the same small traces: a plain
//! loop that places each VM by exact best fit (non-empty hosts first, lowest index on ties) and
//! integrates the metrics by scanning every VM in every interval between events. The two must
//! agree on every placement and, to rounding, on the time-averaged metrics; and for any policy,
//! the simulator's exact averages must equal the brute-force integral of its own placements.

use domain::Priority;
use placement::rules::Buckets;
use placement::{PolicyConfig, Registry, TieBreak};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use simulator::engine::{run, SimConfig, SimResult};
use simulator::predict::{PredictionConfig, PredictionSourceConfig};
use simulator::workload::{Inventory, TraceSpec, Workload, WorkloadConfig};
use traces::{ExtraColumns, VmRecord};

const HOSTS: usize = 4;
const HOST_CORES: f64 = 8.0;
const HOST_MEMORY_GIB: f64 = 16.0;
const WINDOW_S: f64 = 600.0;
const MEASURE_FROM_S: f64 = 100.0;

/// `n` VMs with whole-second starts in [0, 500), lifetimes of 1 to 300 s or censored (one in
/// ten), 1 to 4 cores and 1 to 8 GiB; each its own tenant.
fn random_trace(seed: u64, n: usize) -> Vec<VmRecord> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    (0..n)
        .map(|i| {
            let start_s = f64::from(rng.random_range(0..500u32));
            let end_s = (!rng.random_bool(0.1)).then(|| start_s + f64::from(rng.random_range(1..=300u32)));
            VmRecord {
                vm_id: format!("vm{i}"),
                tenant_id: format!("t{i}"),
                vm_type: "D".to_owned(),
                cores: f64::from(rng.random_range(1..=4u32)),
                memory_gib: f64::from(1u32 << rng.random_range(0..4u32)),
                priority: Priority::Regular,
                start_s,
                end_s,
                extra: ExtraColumns::default(),
            }
        })
        .collect()
}

fn config(policy: PolicyConfig, prediction: PredictionSourceConfig) -> SimConfig {
    SimConfig {
        workload: WorkloadConfig {
            trace: TraceSpec::Provided { name: "random".to_owned() },
            from_s: Some(0.0),
            duration_s: Some(WINDOW_S),
            ..WorkloadConfig::default()
        },
        inventory: Inventory::Fixed { hosts: HOSTS, cores: HOST_CORES, memory_gib: HOST_MEMORY_GIB, hosts_per_rack: 2 },
        policy,
        tie_break: TieBreak::LowestIndex,
        prediction: PredictionConfig { source: prediction, ..PredictionConfig::default() },
        record_placements: true,
        measure_from_s: Some(MEASURE_FROM_S),
        // Coarse samples: the averages must not depend on them.
        sample_interval_s: 170.0,
        inflation_every: 0,
        ..SimConfig::default()
    }
}

/// One VM of the straightforward replay: where it went (None: rejected).
#[derive(Clone, Debug)]
struct Placed {
    cores: f64,
    memory_gib: f64,
    arrival_s: f64,
    end_s: Option<f64>,
    host: Option<usize>,
}

/// Exact best fit, non-empty hosts first, lowest index on ties: the weighted leftover share
/// (cores weigh 2, memory 1) after placing the VM, scaled to 1e9 steps as the exact buckets are.
fn straightforward_best_fit(workload: &Workload) -> Vec<Placed> {
    let mut free = [(HOST_CORES, HOST_MEMORY_GIB); HOSTS];
    let mut vms_on = [0usize; HOSTS];
    let mut placed: Vec<Placed> = Vec::new();
    let mut released: Vec<bool> = Vec::new();
    for vm in &workload.vms {
        let now = vm.arrival_s;
        // Every VM that ended by now has left (exits come before arrivals at equal times).
        for (p, gone) in placed.iter().zip(released.iter_mut()) {
            if let (Some(host), Some(end), false) = (p.host, p.end_s, *gone) {
                if end <= now {
                    free[host].0 += p.cores;
                    free[host].1 += p.memory_gib;
                    vms_on[host] -= 1;
                    *gone = true;
                }
            }
        }
        let (cores, memory_gib) = (vm.request.facts.demand.cores(), vm.request.facts.demand.memory_gib());
        let best = (0..HOSTS).filter(|&h| free[h].0 >= cores && free[h].1 >= memory_gib).min_by_key(|&h| {
            let left = (2.0 * (free[h].0 - cores) / HOST_CORES + (free[h].1 - memory_gib) / HOST_MEMORY_GIB) / 3.0;
            (vms_on[h] == 0, (left * 1e9).round() as u64, h)
        });
        if let Some(h) = best {
            free[h].0 -= cores;
            free[h].1 -= memory_gib;
            vms_on[h] += 1;
        }
        placed.push(Placed { cores, memory_gib, arrival_s: now, end_s: vm.end_s, host: best });
        released.push(false);
    }
    placed
}

/// The simulator's own placements, in the same form.
fn simulated(workload: &Workload, result: &SimResult) -> Vec<Placed> {
    let placements = result.placements.as_ref().expect("placements recorded");
    workload
        .vms
        .iter()
        .zip(placements)
        .map(|(vm, p)| Placed {
            cores: vm.request.facts.demand.cores(),
            memory_gib: vm.request.facts.demand.memory_gib(),
            arrival_s: vm.arrival_s,
            end_s: vm.end_s,
            host: p.host_id.as_deref().map(|id| id.trim_start_matches("sim-h").parse().expect("a sim host id")),
        })
        .collect()
}

/// Packing density, empty hosts % and empty-to-free, averaged over [from, to) by scanning every VM
/// in every interval between two consecutive event times.
fn brute_force_averages(placed: &[Placed], from_s: f64, to_s: f64) -> (f64, f64, f64) {
    let mut times: Vec<f64> = vec![from_s, to_s];
    for p in placed.iter().filter(|p| p.host.is_some()) {
        times.push(p.arrival_s);
        times.extend(p.end_s);
    }
    times.retain(|t| (from_s..=to_s).contains(t));
    times.sort_by(f64::total_cmp);
    times.dedup();
    let (mut density, mut empty, mut empty_to_free, mut span) = (0.0, 0.0, 0.0, 0.0);
    for pair in times.windows(2) {
        let (t, next) = (pair[0], pair[1]);
        let mut used = [0.0; HOSTS];
        let mut count = [0usize; HOSTS];
        for p in placed {
            let running = p.arrival_s <= t && p.end_s.is_none_or(|end| end > t);
            if let (Some(h), true) = (p.host, running) {
                used[h] += p.cores;
                count[h] += 1;
            }
        }
        let non_empty = count.iter().filter(|&&c| c > 0).count();
        let used_total: f64 = used.iter().sum();
        let free_total = HOSTS as f64 * HOST_CORES - used_total;
        let empty_cores = (HOSTS - non_empty) as f64 * HOST_CORES;
        let dt = next - t;
        density += dt * if non_empty > 0 { used_total / (non_empty as f64 * HOST_CORES) } else { 0.0 };
        empty += dt * 100.0 * (HOSTS - non_empty) as f64 / HOSTS as f64;
        empty_to_free += dt * if free_total > 0.0 { empty_cores / free_total } else { 0.0 };
        span += dt;
    }
    (density / span, empty / span, empty_to_free / span)
}

fn assert_averages(result: &SimResult, placed: &[Placed], what: &str) {
    let (density, empty, empty_to_free) = brute_force_averages(placed, MEASURE_FROM_S, WINDOW_S);
    let m = &result.metrics;
    let close = |got: f64, want: f64, name: &str| {
        assert!((got - want).abs() < 1e-9, "{what}: {name} {got} != brute force {want}");
    };
    close(m.span_s, WINDOW_S - MEASURE_FROM_S, "span");
    close(m.packing_density, density, "packing density");
    close(m.empty_hosts_pct, empty, "empty hosts %");
    close(m.empty_to_free, empty_to_free, "empty-to-free");
}

#[test]
fn exact_best_fit_places_and_measures_like_a_straightforward_replay() {
    for seed in 1..=20 {
        let records = random_trace(seed, 60);
        let policy = PolicyConfig { buckets: Buckets::Exact, ..PolicyConfig::preset("pbfr") };
        let config = config(policy, PredictionSourceConfig::None);
        let workload = Workload::from_records(records, &config.workload).unwrap();
        let result = run(&workload, &config, &Registry::standard(), |_| {}).unwrap();
        let expected = straightforward_best_fit(&workload);
        let got = simulated(&workload, &result);
        for ((want, have), vm) in expected.iter().zip(&got).zip(&workload.vms) {
            assert_eq!(want.host, have.host, "seed {seed}: {} placed differently", vm.request.vm_id);
        }
        let rejected = expected.iter().filter(|p| p.host.is_none()).count() as u64;
        assert_eq!(result.counters.rejected, rejected, "seed {seed}");
        assert_averages(&result, &expected, &format!("seed {seed}"));
    }
}

#[test]
fn every_policy_averages_its_own_placements_exactly() {
    let records = random_trace(99, 80);
    for kind in ["la-binary", "nilas", "lava"] {
        let config = config(PolicyConfig::preset(kind), PredictionSourceConfig::Oracle);
        let workload = Workload::from_records(records.clone(), &config.workload).unwrap();
        let result = run(&workload, &config, &Registry::standard(), |_| {}).unwrap();
        assert!(result.counters.placed > 40, "{kind:?}: {:?}", result.counters);
        assert_averages(&result, &simulated(&workload, &result), &format!("{kind:?}"));
    }
}
