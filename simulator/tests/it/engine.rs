//! The event loop on tiny hand-made traces with known answers: placements, exits before arrivals
//! at equal times, rejections when full (a rejected VM never exits), the warm-up, automatic
//! inventory sizing, LARS drains (a VM that exits before its turn is a migration avoided), the
//! time-averaged metrics, and reproducibility from the seed.

use domain::Priority;
use placement::defrag::MigrationOrder;
use placement::{PolicyConfig, Registry, TieBreak};
use simulator::engine::{run, DrainPlan, SimConfig, SimResult};
use simulator::predict::{PredictionConfig, PredictionSourceConfig};
use simulator::workload::{Inventory, SyntheticSpec, TraceSpec, Workload, WorkloadConfig, CENSORED_LIFETIME_S};
use traces::{ExtraColumns, VmRecord};

fn record(id: &str, cores: f64, start_s: f64, end_s: Option<f64>) -> VmRecord {
    VmRecord {
        vm_id: id.to_owned(),
        tenant_id: "t".to_owned(),
        vm_type: "D".to_owned(),
        cores,
        memory_gib: 2.0 * cores,
        priority: Priority::Regular,
        start_s,
        end_s,
        extra: ExtraColumns::default(),
    }
}

fn provided() -> WorkloadConfig {
    WorkloadConfig { trace: TraceSpec::Provided { name: "hand-made".to_owned() }, ..WorkloadConfig::default() }
}

/// `hosts` hosts of `cores` cores (and twice as many GiB), PBFR, lowest-index ties, oracle.
fn config(hosts: usize, cores: f64) -> SimConfig {
    SimConfig {
        workload: provided(),
        inventory: Inventory::Fixed { hosts, cores, memory_gib: 2.0 * cores, hosts_per_rack: 2 },
        policy: PolicyConfig::preset("pbfr"),
        tie_break: TieBreak::LowestIndex,
        record_placements: true,
        sample_interval_s: 10.0,
        ..SimConfig::default()
    }
}

fn simulate(records: Vec<VmRecord>, config: &SimConfig) -> (Workload, SimResult) {
    let workload = Workload::from_records(records, &config.workload).unwrap();
    let result = run(&workload, config, &Registry::standard(), |_| {}).unwrap();
    (workload, result)
}

fn host_of<'a>(result: &'a SimResult, vm: &str) -> Option<&'a str> {
    let placements = result.placements.as_ref().expect("placements recorded");
    placements.iter().find(|p| p.vm_id == vm).and_then(|p| p.host_id.as_deref())
}

/// Best fit fills a host before opening the next; a VM that left frees its room for a later one.
#[test]
fn places_by_best_fit_and_reuses_room_after_exits() {
    let records = vec![
        record("a", 2.0, 0.0, Some(100.0)),
        record("b", 2.0, 10.0, Some(50.0)),
        record("c", 4.0, 20.0, Some(200.0)),
        record("d", 2.0, 60.0, None),
    ];
    let (_, result) = simulate(records, &config(2, 4.0));
    assert_eq!(host_of(&result, "a"), Some("sim-h0"));
    assert_eq!(host_of(&result, "b"), Some("sim-h0"), "prefer the non-empty host");
    assert_eq!(host_of(&result, "c"), Some("sim-h1"), "sim-h0 is full");
    assert_eq!(host_of(&result, "d"), Some("sim-h0"), "b left sim-h0 at 50");
    let c = &result.counters;
    assert_eq!((c.arrivals, c.placed, c.rejected), (4, 4, 0));
    // The window ends at the last arrival (60): only b has exited by then.
    assert_eq!((c.exits, c.vms_at_end), (1, 3));
    assert_eq!(result.workload.to_s, 60.0);
    assert_eq!(result.final_stats.vms, 3);
    // Samples at 0, 10, ..., 60.
    assert_eq!(result.timing.samples, 7);
    assert_eq!(result.series.last().map(|m| m.time_s), Some(60.0));
    assert!(result.filtering.decisions == 4 && result.filtering.by_rule.len() == 2, "{:?}", result.filtering);
}

/// At equal times the exit comes first, so a VM can take the room of one leaving that instant.
#[test]
fn exits_come_before_arrivals_at_equal_times() {
    let records = vec![record("a", 4.0, 0.0, Some(10.0)), record("b", 4.0, 10.0, Some(20.0))];
    let (_, result) = simulate(records, &config(1, 4.0));
    assert_eq!(host_of(&result, "b"), Some("sim-h0"));
    assert_eq!(result.counters.rejected, 0);
    assert_eq!(result.counters.exits, 1);
}

/// A full inventory rejects (no feasible host); the rejected VM never exits.
#[test]
fn rejects_when_full_and_rejected_vms_never_exit() {
    let records = vec![
        record("a", 3.0, 0.0, Some(100.0)),
        record("b", 2.0, 1.0, Some(5.0)),
        record("c", 1.0, 2.0, Some(6.0)),
        record("d", 1.0, 100.0, None),
    ];
    let mut config = config(1, 4.0);
    config.workload.duration_s = Some(200.0);
    let (_, result) = simulate(records, &config);
    assert_eq!(host_of(&result, "b"), None, "3 + 2 > 4 cores");
    assert_eq!(host_of(&result, "c"), Some("sim-h0"));
    assert_eq!(host_of(&result, "d"), Some("sim-h0"), "a left at 100, before d arrived (exits first)");
    let c = &result.counters;
    assert_eq!((c.arrivals, c.placed, c.rejected), (4, 3, 1));
    assert_eq!(c.rejected_by_reason.get("no_feasible_host"), Some(&1));
    assert_eq!(c.exits, 2, "a and c; b was never placed");
    assert_eq!(result.workload.to_s, 200.0, "a window with a duration runs to its end");
}

/// VMs running at the window start (negative starts) are placed first, at the start; VMs that
/// ended before it are not part of the run; the oracle predicts the lifetime from placement.
#[test]
fn the_warm_up_is_placed_first_at_the_window_start() {
    let records = vec![
        record("late", 1.0, 5.0, Some(30.0)),
        record("running", 2.0, -100.0, Some(50.0)),
        record("gone", 2.0, -100.0, Some(-10.0)),
        record("forever", 1.0, -50.0, None),
    ];
    let config = config(2, 4.0);
    let (workload, result) = simulate(records, &config);
    assert_eq!(workload.from_s, 0.0, "a trace with negative starts starts at 0");
    assert_eq!(workload.warmup_vms, 2);
    let order: Vec<&str> = workload.vms.iter().map(|vm| vm.request.vm_id.as_str()).collect();
    assert_eq!(order, ["running", "forever", "late"], "warm-up in start order, then the window");
    assert!(workload.vms[..2].iter().all(|vm| vm.arrival_s == 0.0));
    assert_eq!(workload.lifetime_s(&workload.vms[0]), 50.0);
    assert!(workload.lifetime_s(&workload.vms[1]) >= CENSORED_LIFETIME_S);
    assert_eq!(result.counters.arrivals, 3);
    assert_eq!(result.series[0].time_s, 0.0);
    assert_eq!(result.series[0].vms, 2, "the first sample sees the warm-up");
    // A window that starts later: `late` is then warm-up too.
    let mut later = config.clone();
    later.workload.from_s = Some(10.0);
    let (workload, _) = simulate(vec![record("late", 1.0, 5.0, Some(30.0)), record("next", 1.0, 12.0, None)], &later);
    assert_eq!((workload.warmup_vms, workload.vms[0].arrival_s), (1, 10.0));
}

/// Auto sizing: the peak concurrent demand (exits first at equal times) over host capacity, plus
/// headroom.
#[test]
fn auto_inventory_fits_the_peak_with_headroom() {
    let records = vec![
        record("a", 4.0, 0.0, Some(10.0)),
        record("b", 4.0, 5.0, Some(15.0)),
        record("c", 4.0, 10.0, Some(20.0)),
        record("d", 1.0, 30.0, None),
    ];
    let workload = Workload::from_records(records, &provided()).unwrap();
    let peak = workload.peak_demand();
    assert_eq!((peak.cores, peak.memory_gib, peak.cores_at_s), (8.0, 16.0, 5.0));
    let auto = Inventory::Auto { cores: 4.0, memory_gib: 64.0, headroom: 0.5, hosts_per_rack: 2 };
    let sized = auto.size(&workload).unwrap();
    assert_eq!(sized.hosts, 3, "ceil(8 / 4 * 1.5)");
    let mut config = config(1, 4.0);
    config.inventory = auto;
    let result = run(&workload, &config, &Registry::standard(), |_| {}).unwrap();
    assert_eq!((result.workload.hosts, result.counters.rejected), (3, 0));
}

/// Three VMs on one host, drained one migration at a time (20 minutes each): the short VM placed
/// first exits at 1,500 s. LARS moves the two long ones first (100-1,300 s, 1,300-2,500 s) and the
/// short one exits before its turn: one migration avoided. The arrival-order baseline moves the
/// short one first and all three are migrated.
#[test]
fn lars_drains_avoid_migrating_vms_that_exit_before_their_turn() {
    let records = vec![
        record("short", 2.0, 0.0, Some(1500.0)),
        record("long-1", 2.0, 1.0, Some(400_000.0)),
        record("long-2", 2.0, 2.0, Some(200_000.0)),
        record("late", 1.0, 10_000.0, None),
    ];
    let drained = |order| {
        let mut config = config(3, 16.0);
        config.drains = Some(DrainPlan {
            every_s: 1e9,
            first_after_s: Some(100.0),
            hosts_per_drain: 1,
            rolling: false,
            order,
            max_in_flight: 1,
            migration_s: 1200.0,
        });
        let (_, result) = simulate(records.clone(), &config);
        result
    };
    let lars = drained(MigrationOrder::LongestRemainingFirst);
    let m = &lars.counters.migrations;
    assert_eq!((m.drains_started, m.drains_completed), (1, 1));
    assert_eq!((m.performed, m.avoided, m.cancelled), (2, 1, 0), "{m:?}");
    assert_eq!(host_of(&lars, "short"), Some("sim-h0"));
    // The drained host is available again once empty; the late VM goes where the long VMs moved
    // (prefer non-empty), not to the emptied host.
    assert_eq!(lars.final_stats.available_hosts, 3, "the drained host is available again");
    assert_eq!(host_of(&lars, "late"), Some("sim-h1"), "the long VMs moved to sim-h1");
    let baseline = drained(MigrationOrder::Arrival);
    let m = &baseline.counters.migrations;
    assert_eq!((m.performed, m.avoided), (3, 0), "{m:?}");
    assert!(lars.counters.migrations.performed < baseline.counters.migrations.performed);
}

/// Rolling drains take the hosts in inventory order whatever their VMs (a fixed sequence, the same
/// in every run), where the allocator's pick follows the VMs: one VM on three hosts is migrated
/// at every picked drain, but only when the rolling drain reaches its host.
#[test]
fn rolling_drains_take_a_fixed_sequence_of_hosts() {
    let records = vec![record("a", 2.0, 0.0, None), record("late", 1.0, 35_000.0, None)];
    let drained = |rolling| {
        let mut config = config(3, 16.0);
        config.drains = Some(DrainPlan {
            every_s: 10_000.0,
            first_after_s: Some(100.0),
            hosts_per_drain: 1,
            rolling,
            order: MigrationOrder::LongestRemainingFirst,
            max_in_flight: 1,
            migration_s: 1200.0,
        });
        simulate(records.clone(), &config).1.counters.migrations
    };
    // Drains at 100, 10,100, 20,100 and 30,100 s: sim-h0 (a -> sim-h1), sim-h1 (a -> sim-h0),
    // sim-h2 (empty), sim-h0 (a -> sim-h1).
    let rolling = drained(true);
    assert_eq!((rolling.drains_started, rolling.performed), (4, 3), "{rolling:?}");
    let picked = drained(false);
    assert_eq!((picked.drains_started, picked.performed), (4, 4), "{picked:?}");
}

/// The time-averaged metrics of a hand-made trace, worked out by hand. Two hosts of 4 cores /
/// 8 GiB, best fit with lowest-index ties: a (2 cores) and b (1) go to host 0, c (3) to host 1.
/// - [0, 50): 6 of 8 cores used, no empty host; the bound needs 2 hosts (density 0.75).
/// - [50, 80), a gone: 4 of 8 cores; the bound needs 1 host (density 1.0, 50% empty).
/// - [80, 100), c gone: 1 core on host 0, host 1 empty (50%); 4 of the 7 free cores are on it.
///
/// z arrives at 100 and ends the window. Every free core fits the 1-core shape (memory is 2 GiB
/// per core throughout), so inflation strands nothing.
#[test]
fn time_averaged_metrics_of_a_hand_made_trace() {
    let records = vec![
        record("a", 2.0, 0.0, Some(50.0)),
        record("b", 1.0, 0.0, None),
        record("c", 3.0, 0.0, Some(80.0)),
        record("z", 1.0, 100.0, None),
    ];
    let mut config = config(2, 4.0);
    config.inflation_every = 1;
    let (_, result) = simulate(records, &config);
    assert_eq!(host_of(&result, "a"), Some("sim-h0"));
    assert_eq!(host_of(&result, "c"), Some("sim-h1"));
    let m = &result.metrics;
    let close = |got: f64, want: f64, what: &str| assert!((got - want).abs() < 1e-9, "{what}: {got} != {want}");
    close(m.span_s, 100.0, "span");
    close(m.packing_density, 0.5 * 0.75 + 0.3 * 0.5 + 0.2 * 0.25, "packing density");
    close(m.empty_hosts_pct, 0.2 * 50.0, "empty hosts %");
    close(m.empty_to_free, 0.2 * 4.0 / 7.0, "empty-to-free");
    close(m.bound_packing_density, 0.5 * 0.75 + 0.3 * 1.0 + 0.2 * 0.25, "bound packing density");
    close(m.bound_empty_hosts_pct, 0.3 * 50.0 + 0.2 * 50.0, "bound empty hosts %");
    close(m.stranded_cpu_pct.unwrap(), 0.0, "stranded CPU");
    close(m.stranded_memory_pct.unwrap(), 0.0, "stranded memory");
}

/// The same configuration gives the same run; the seed drives tie-breaking and the noisy draws.
#[test]
fn runs_are_reproducible_from_their_configuration() {
    let config = SimConfig {
        workload: WorkloadConfig {
            trace: TraceSpec::Synthetic(SyntheticSpec { days: 1.0, warmup_days: 0.5, ..SyntheticSpec::default() }),
            max_vms: Some(3000),
            ..WorkloadConfig::default()
        },
        inventory: Inventory::Auto { cores: 48.0, memory_gib: 384.0, headroom: 0.3, hosts_per_rack: 40 },
        policy: PolicyConfig::preset("la-binary"),
        prediction: PredictionConfig {
            source: PredictionSourceConfig::NoisyAccuracy { accuracy: 0.7 },
            fallback_fraction: 0.1,
            ..PredictionConfig::default()
        },
        record_placements: true,
        seed: 7,
        ..SimConfig::default()
    };
    let workload = Workload::load(&config.workload).unwrap();
    let first = run(&workload, &config, &Registry::standard(), |_| {}).unwrap();
    let second = run(&workload, &config, &Registry::standard(), |_| {}).unwrap();
    assert_eq!(first.placements, second.placements);
    assert_eq!(first.metrics, second.metrics);
    assert_eq!(first.counters, second.counters);
    assert!(first.counters.placed > 2000);
    // The configuration in the result reproduces the run through TOML.
    let text = toml::to_string(&first.config).unwrap();
    let reread: SimConfig = toml::from_str(&text).unwrap();
    assert_eq!(reread, config);
    let third = run(&Workload::load(&reread.workload).unwrap(), &reread, &Registry::standard(), |_| {}).unwrap();
    assert_eq!(third.placements, first.placements);
    // Another seed draws other ties and other noise.
    let other = run(&workload, &SimConfig { seed: 8, ..config.clone() }, &Registry::standard(), |_| {}).unwrap();
    assert_ne!(hosts(other.placements), hosts(first.placements));
}

/// PBFR reads no lifetime: whatever the predictions, with random ties, it places every VM alike
/// (lifetime classes dropping as time passes are no change of a host to its index).
#[test]
fn pbfr_does_not_depend_on_the_predictions() {
    let config = SimConfig {
        workload: WorkloadConfig {
            trace: TraceSpec::Synthetic(SyntheticSpec { days: 1.0, warmup_days: 0.5, ..SyntheticSpec::default() }),
            max_vms: Some(3000),
            ..WorkloadConfig::default()
        },
        inventory: Inventory::Auto { cores: 48.0, memory_gib: 384.0, headroom: 0.2, hosts_per_rack: 40 },
        policy: PolicyConfig::preset("pbfr"),
        tie_break: TieBreak::Random,
        record_placements: true,
        ..SimConfig::default()
    };
    let workload = Workload::load(&config.workload).unwrap();
    let with = |source| {
        let config =
            SimConfig { prediction: PredictionConfig { source, ..PredictionConfig::default() }, ..config.clone() };
        run(&workload, &config, &Registry::standard(), |_| {}).unwrap()
    };
    let none = with(PredictionSourceConfig::None);
    let oracle = with(PredictionSourceConfig::Oracle);
    assert_eq!(hosts(none.placements.clone()), hosts(oracle.placements.clone()));
    assert_eq!(none.metrics, oracle.metrics);
    // LA-binary reads them, and places differently.
    let la = |source| {
        let policy = PolicyConfig::preset("la-binary");
        let config = SimConfig {
            policy,
            prediction: PredictionConfig { source, ..PredictionConfig::default() },
            ..config.clone()
        };
        hosts(run(&workload, &config, &Registry::standard(), |_| {}).unwrap().placements)
    };
    assert_ne!(la(PredictionSourceConfig::None), la(PredictionSourceConfig::Oracle));
}

/// Where each VM went (recorded placements also keep the prediction each was placed with).
fn hosts(placements: Option<Vec<simulator::engine::VmPlacement>>) -> Vec<(String, Option<String>)> {
    placements.expect("placements recorded").into_iter().map(|p| (p.vm_id, p.host_id)).collect()
}

/// Unknown fields and bad values are refused, naming the field.
#[test]
fn bad_configurations_name_the_field() {
    let err = toml::from_str::<SimConfig>("sample_interval = 5").unwrap_err().to_string();
    assert!(err.contains("sample_interval"), "{err}");
    let workload = Workload::from_records(vec![record("a", 1.0, 0.0, None)], &provided()).unwrap();
    let bad = SimConfig { sample_interval_s: 0.0, ..config(1, 4.0) };
    let err = run(&workload, &bad, &Registry::standard(), |_| {}).unwrap_err().to_string();
    assert!(err.contains("sample_interval_s"), "{err}");
    let bad = SimConfig {
        prediction: PredictionConfig { fallback_fraction: 2.0, ..PredictionConfig::default() },
        ..config(1, 4.0)
    };
    let err = run(&workload, &bad, &Registry::standard(), |_| {}).unwrap_err().to_string();
    assert!(err.contains("fallback_fraction"), "{err}");
    let err = Workload::from_records(vec![record("a", 1.0, 0.0, None), record("a", 1.0, 1.0, None)], &provided())
        .unwrap_err()
        .to_string();
    assert!(err.contains("`a` appears twice"), "{err}");
}

/// A VM that exits while it migrates cancels the migration; its drain ends then, and the
/// completion event that was scheduled for it later changes nothing and is not counted again.
#[test]
fn a_vm_exiting_during_its_migration_ends_the_drain_once() {
    let records = vec![record("only", 2.0, 0.0, Some(500.0)), record("late", 1.0, 10_000.0, None)];
    let mut config = config(2, 16.0);
    config.drains = Some(DrainPlan {
        every_s: 1e9,
        first_after_s: Some(100.0),
        hosts_per_drain: 1,
        rolling: false,
        order: MigrationOrder::LongestRemainingFirst,
        max_in_flight: 3,
        migration_s: 1200.0,
    });
    let (_, result) = simulate(records, &config);
    let m = &result.counters.migrations;
    assert_eq!((m.drains_started, m.drains_completed), (1, 1), "{m:?}");
    assert_eq!((m.performed, m.avoided, m.cancelled), (0, 0, 1), "{m:?}");
    assert_eq!(result.final_stats.available_hosts, 2);
    assert_eq!(host_of(&result, "late"), Some("sim-h0"), "the drained host is back, lowest index");
}
