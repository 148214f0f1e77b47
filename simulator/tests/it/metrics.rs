//! Known answers of the simulator's metrics on tiny hand-made inventories, and their invariants on
//! random ones.

use domain::{
    ClusterId, ClusterSpec, HostId, HostSpec, HostState, InventorySpec, RackId, RackSpec, RequestFacts, Resources,
    VmId, ZoneId, ZoneSpec,
};
use placement::{HostIndex, InventoryState, NewVm};
use proptest::prelude::*;
use simulator::metrics::{
    inflate, inflation_stranding, instant, offline_bound, InstantMetrics, MetricsRecorder, MixShape, OfflineBound,
    Stranding, VmMix,
};

fn res(cores: f64, memory_gib: f64) -> Resources {
    Resources::from_whole(cores, memory_gib, 0.0).unwrap()
}

/// `hosts` hosts of 10 cores and 40 GiB.
fn inventory(hosts: usize) -> InventoryState {
    InventoryState::from_spec(&InventorySpec::homogeneous("z", hosts, 2, res(10.0, 40.0))).unwrap()
}

/// One host per given capacity, in one rack.
fn mixed_inventory(capacities: &[Resources]) -> InventoryState {
    let spec = InventorySpec {
        zones: vec![ZoneSpec {
            id: ZoneId("z".to_owned()),
            clusters: vec![ClusterSpec {
                id: ClusterId("c".to_owned()),
                hardware: "default".to_owned(),
                host_capacity: res(1.0, 1.0),
                racks: vec![RackSpec {
                    id: RackId("r".to_owned()),
                    hosts: capacities
                        .iter()
                        .enumerate()
                        .map(|(i, c)| HostSpec {
                            id: HostId(format!("h{i}")),
                            capacity: Some(*c),
                            state: HostState::Available,
                        })
                        .collect(),
                }],
            }],
        }],
    };
    InventoryState::from_spec(&spec).unwrap()
}

fn place(state: &mut InventoryState, id: &str, host: u32, demand: Resources) {
    let vm = NewVm {
        id: VmId::from(id),
        facts: RequestFacts {
            tenant_id: domain::TenantId::from("t"),
            vm_type: "test".to_owned(),
            demand,
            requested_at_s: None,
            details: Default::default(),
        },
        placed_at_s: 0.0,
        prediction: None,
    };
    state.place(vm, HostIndex(host)).unwrap();
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-9
}

#[test]
fn instant_figures_of_a_small_inventory() {
    let mut state = inventory(3);
    place(&mut state, "a", 0, res(4.0, 8.0));
    place(&mut state, "b", 0, res(2.0, 2.0));
    place(&mut state, "c", 1, res(3.0, 4.0));
    let m = instant(&state, 42.0);
    assert_eq!((m.time_s, m.vms, m.hosts, m.non_empty_hosts), (42.0, 3, 3, 2));
    assert!(close(m.allocated_cores, 9.0) && close(m.allocated_memory_gib, 14.0));
    assert!(close(m.packing_density, 9.0 / 20.0), "{m:?}");
    assert!(close(m.empty_hosts_pct, 100.0 / 3.0));
    // 21 free cores, 10 of them on the empty host.
    assert!(close(m.empty_to_free, 10.0 / 21.0));
    assert_eq!(m.bound.hosts, 1);
    assert!(close(m.bound.packing_density, 0.9) && close(m.bound.empty_hosts_pct, 200.0 / 3.0));
    assert_eq!(m.stranding, None);
}

#[test]
fn an_empty_inventory_is_all_empty_and_an_inventory_of_nothing_is_all_zero() {
    let m = instant(&inventory(4), 0.0);
    assert_eq!((m.packing_density, m.empty_hosts_pct, m.empty_to_free), (0.0, 100.0, 1.0));
    assert_eq!(m.bound, OfflineBound { hosts: 0, packing_density: 0.0, empty_hosts_pct: 100.0 });
    let m = instant(&InventoryState::default(), 0.0);
    assert_eq!((m.hosts, m.packing_density, m.empty_hosts_pct, m.empty_to_free), (0, 0.0, 0.0, 0.0));
    assert_eq!(m.bound, OfflineBound { hosts: 0, packing_density: 0.0, empty_hosts_pct: 0.0 });
}

#[test]
fn a_full_inventory_has_nothing_free() {
    let mut state = inventory(2);
    place(&mut state, "a", 0, res(10.0, 40.0));
    place(&mut state, "b", 1, res(10.0, 20.0));
    let m = instant(&state, 0.0);
    assert_eq!((m.packing_density, m.empty_hosts_pct, m.empty_to_free), (1.0, 0.0, 0.0));
    assert_eq!(m.bound.hosts, 2);
}

#[test]
fn a_migrating_vm_is_counted_once_its_target_is_not_empty_and_unavailable_empty_hosts_are() {
    let mut state = inventory(3);
    place(&mut state, "a", 0, res(4.0, 8.0));
    state.reserve(&VmId::from("a"), HostIndex(1), true).unwrap();
    state.set_host_state(HostIndex(2), HostState::Unavailable).unwrap();
    let m = instant(&state, 0.0);
    assert_eq!(m.non_empty_hosts, 2, "the reservation makes its target non-empty");
    assert!(close(m.allocated_cores, 4.0), "a migrating VM is counted once, on its source");
    assert!(close(m.packing_density, 4.0 / 20.0));
    assert_eq!(m.bound.hosts, 1, "the bound holds the VM once");
    assert!(close(m.empty_to_free, 10.0 / 22.0), "its reservation is not free: 22 cores free, 10 on the empty host");
    assert!(close(m.empty_hosts_pct, 100.0 / 3.0), "the unavailable empty host is empty");
}

#[test]
fn offline_bound_is_the_largest_dimension_rounded_up() {
    let host = res(10.0, 40.0);
    let b = offline_bound(res(12.0, 10.0), host, 3);
    assert_eq!(b.hosts, 2);
    assert!(close(b.packing_density, 0.6) && close(b.empty_hosts_pct, 100.0 / 3.0));
    // Memory binds: 100 GiB needs 3 hosts of 40 GiB although 5 cores fit on one.
    let b = offline_bound(res(5.0, 100.0), host, 4);
    assert_eq!(b.hosts, 3);
    assert!(close(b.packing_density, 5.0 / 30.0) && close(b.empty_hosts_pct, 25.0));
    // Exactly full hosts need no extra one.
    assert_eq!(offline_bound(res(20.0, 80.0), host, 3).hosts, 2);
    assert_eq!(
        offline_bound(Resources::ZERO, host, 3),
        OfflineBound { hosts: 0, packing_density: 0.0, empty_hosts_pct: 100.0 }
    );
    // More demand than the inventory holds: the bound says so, and no host is empty.
    let b = offline_bound(res(50.0, 10.0), host, 3);
    assert_eq!((b.hosts, b.empty_hosts_pct), (5, 0.0));
    // Hosts with no capacity at all, or no hosts: no dimension constrains, nothing divides by zero.
    assert_eq!(offline_bound(res(5.0, 5.0), Resources::ZERO, 3).hosts, 0);
    assert_eq!(
        offline_bound(res(5.0, 5.0), host, 0),
        OfflineBound { hosts: 0, packing_density: 0.0, empty_hosts_pct: 0.0 }
    );
}

#[test]
fn a_mixed_inventory_is_bounded_with_its_mean_host() {
    let mut state = mixed_inventory(&[res(10.0, 40.0), res(30.0, 40.0)]);
    place(&mut state, "a", 1, res(25.0, 10.0));
    // Mean host: 20 cores; 25 cores need ceil(25 * 2 / 40) = 2 mean hosts.
    let m = instant(&state, 0.0);
    assert_eq!(m.bound.hosts, 2);
    assert!(close(m.bound.packing_density, 25.0 / 40.0));
    assert!(close(m.packing_density, 25.0 / 30.0));
}

#[test]
fn inflation_strands_what_no_shape_of_the_mix_fits() {
    let mut state = inventory(1);
    place(&mut state, "a", 0, res(7.0, 8.0));
    let before = state.clone();
    let mix = VmMix::new([MixShape { demand: res(2.0, 1.0), weight: 1 }]);
    let s = inflation_stranding(&state, &mix);
    assert_eq!(s.fitted_vms, 1);
    assert!(close(s.cpu_pct, 10.0), "1 of 10 cores: {s:?}");
    assert!(close(s.memory_pct, 100.0 * 31.0 / 40.0));
    assert_eq!(state, before, "inflation works on a copy");
}

#[test]
fn memory_without_cores_is_stranded() {
    let mut state = inventory(2);
    place(&mut state, "a", 0, res(10.0, 8.0));
    let mix = VmMix::new([MixShape { demand: res(1.0, 4.0), weight: 1 }]);
    let s = inflation_stranding(&state, &mix);
    // Host 1 takes 10 VMs of 1 core / 4 GiB exactly; host 0's 32 GiB have no core to go with.
    assert_eq!(s.fitted_vms, 10);
    assert!(close(s.cpu_pct, 0.0) && close(s.memory_pct, 100.0 * 32.0 / 80.0), "{s:?}");
}

#[test]
fn inflation_follows_the_weights_and_then_fills_with_what_still_fits() {
    // 100 cores, 1000 GiB: the mix would run out of cores first.
    let mut state = mixed_inventory(&[res(100.0, 1000.0)]);
    let small = res(1.0, 1.0);
    let big = res(1.0, 2.0);
    let mix = VmMix::new([MixShape { demand: small, weight: 3 }, MixShape { demand: big, weight: 1 }]);
    let s = inflation_stranding(&state, &mix);
    assert_eq!(s.fitted_vms, 100);
    // 75 small and 25 big: 125 GiB used.
    assert!(close(s.cpu_pct, 0.0) && close(s.memory_pct, 100.0 * 875.0 / 1000.0), "{s:?}");
    // 21 GiB free: 12 small and 4 big take 20 GiB, then only the small one fits, once.
    place(&mut state, "a", 0, res(10.0, 979.0));
    let s = inflation_stranding(&state, &mix);
    assert_eq!(s.fitted_vms, 17, "{s:?}");
    assert!(close(s.cpu_pct, 73.0) && close(s.memory_pct, 0.0));
}

#[test]
fn unavailable_hosts_take_no_inflation_and_strand_nothing() {
    let mut state = inventory(2);
    state.set_host_state(HostIndex(1), HostState::Unavailable).unwrap();
    let mix = VmMix::new([MixShape { demand: res(3.0, 1.0), weight: 1 }]);
    let s = inflation_stranding(&state, &mix);
    assert_eq!(s.fitted_vms, 3);
    assert!(close(s.cpu_pct, 5.0) && close(s.memory_pct, 100.0 * 37.0 / 80.0), "{s:?}");
}

#[test]
fn an_empty_mix_strands_all_free_capacity() {
    let mut state = inventory(2);
    place(&mut state, "a", 0, res(5.0, 10.0));
    let s = inflation_stranding(&state, &VmMix::default());
    assert_eq!(s, Stranding { cpu_pct: 75.0, memory_pct: 87.5, fitted_vms: 0 });
    let s = inflation_stranding(&InventoryState::default(), &VmMix::from_demands([res(1.0, 1.0)], 3));
    assert_eq!(s, Stranding { cpu_pct: 0.0, memory_pct: 0.0, fitted_vms: 0 });
}

#[test]
fn the_mix_keeps_the_most_frequent_shapes_heaviest_first() {
    let (a, b, c) = (res(2.0, 8.0), res(4.0, 16.0), res(1.0, 2.0));
    let demands = [a, b, a, c, b, a, Resources::ZERO, Resources::ZERO, Resources::ZERO, Resources::ZERO];
    let mix = VmMix::from_demands(demands, 2);
    assert_eq!(mix.shapes(), [MixShape { demand: a, weight: 3 }, MixShape { demand: b, weight: 2 }]);
    // Ties are ordered by size, never by hash order; duplicates merge.
    let mix = VmMix::new([
        MixShape { demand: b, weight: 1 },
        MixShape { demand: c, weight: 1 },
        MixShape { demand: b, weight: 1 },
        MixShape { demand: a, weight: 2 },
        MixShape { demand: c, weight: 0 },
    ]);
    assert_eq!(
        mix.shapes(),
        [MixShape { demand: a, weight: 2 }, MixShape { demand: b, weight: 2 }, MixShape { demand: c, weight: 1 }]
    );
    assert!(VmMix::from_demands([a], 0).is_empty());
}

fn sample(time_s: f64, packing_density: f64, stranding: Option<f64>) -> InstantMetrics {
    InstantMetrics {
        time_s,
        vms: 1,
        allocated_cores: 1.0,
        allocated_memory_gib: 1.0,
        non_empty_hosts: 1,
        hosts: 2,
        packing_density,
        empty_hosts_pct: 100.0 * packing_density,
        empty_to_free: packing_density / 2.0,
        bound: OfflineBound { hosts: 1, packing_density: 1.0 - packing_density, empty_hosts_pct: 50.0 },
        stranding: stranding.map(|cpu_pct| Stranding { cpu_pct, memory_pct: 2.0 * cpu_pct, fitted_vms: 0 }),
    }
}

#[test]
fn the_recorder_weights_each_sample_by_the_time_to_the_next_after_the_warm_up() {
    let mut recorder = MetricsRecorder::new(5.0);
    recorder.record(sample(0.0, 0.2, None));
    recorder.record(sample(10.0, 0.5, None));
    recorder.record(sample(40.0, 0.8, None));
    let s = recorder.summary();
    // The first sample stands over [5, 10) after the warm-up, the second over [10, 40), the last over nothing.
    assert!(close(s.packing_density, (5.0 * 0.2 + 30.0 * 0.5) / 35.0), "{s:?}");
    assert!(close(s.empty_hosts_pct, 100.0 * (5.0 * 0.2 + 30.0 * 0.5) / 35.0));
    assert!(close(s.empty_to_free, (5.0 * 0.1 + 30.0 * 0.25) / 35.0));
    assert!(close(s.bound_packing_density, (5.0 * 0.8 + 30.0 * 0.5) / 35.0));
    assert!(close(s.bound_empty_hosts_pct, 50.0) && close(s.non_empty_hosts, 1.0) && close(s.bound_hosts, 1.0));
    assert_eq!((s.samples, s.span_s, s.stranded_cpu_pct), (3, 35.0, None));
    assert_eq!(recorder.series().len(), 3, "the series keeps the warm-up");

    let mut recorder = MetricsRecorder::new(0.0);
    recorder.record(sample(0.0, 0.2, None));
    recorder.record(sample(10.0, 0.5, None));
    recorder.record(sample(40.0, 0.8, None));
    assert!(close(recorder.summary().packing_density, (10.0 * 0.2 + 30.0 * 0.5) / 40.0));
}

#[test]
fn samples_wholly_inside_the_warm_up_do_not_count() {
    let mut recorder = MetricsRecorder::new(100.0);
    recorder.record(sample(0.0, 0.9, Some(50.0)));
    recorder.record(sample(100.0, 0.5, None));
    recorder.record(sample(110.0, 0.7, None));
    let s = recorder.summary();
    assert!(close(s.packing_density, 0.5));
    assert_eq!((s.samples, s.span_s), (2, 10.0));
    // The warm-up's stranding sample is the latest one: it stands over the counted time.
    assert_eq!((s.stranded_cpu_pct, s.stranded_memory_pct), (Some(50.0), Some(100.0)));
    let mut recorder = MetricsRecorder::new(1000.0);
    recorder.record(sample(0.0, 0.9, Some(50.0)));
    recorder.record(sample(10.0, 0.9, None));
    let s = recorder.summary();
    assert_eq!((s.samples, s.span_s, s.packing_density, s.stranded_cpu_pct), (0, 0.0, 0.0, None));
}

#[test]
fn stranding_is_averaged_over_the_samples_that_carry_it() {
    let mut recorder = MetricsRecorder::new(0.0);
    recorder.record(sample(0.0, 0.5, Some(10.0)));
    recorder.record(sample(10.0, 0.5, None));
    recorder.record(sample(20.0, 0.5, Some(20.0)));
    recorder.record(sample(30.0, 0.5, None));
    let s = recorder.summary();
    // 10 % over [0, 20), 20 % over [20, 30).
    let cpu = (20.0 * 10.0 + 10.0 * 20.0) / 30.0;
    assert!(close(s.stranded_cpu_pct.unwrap(), cpu) && close(s.stranded_memory_pct.unwrap(), 2.0 * cpu), "{s:?}");
}

#[test]
fn without_elapsed_time_the_summary_is_the_plain_mean() {
    let s = MetricsRecorder::new(0.0).summary();
    assert_eq!((s.samples, s.span_s, s.packing_density, s.stranded_cpu_pct), (0, 0.0, 0.0, None));
    let mut recorder = MetricsRecorder::new(0.0).without_series();
    recorder.record(sample(5.0, 0.4, Some(3.0)));
    recorder.record(sample(5.0, 0.6, Some(5.0)));
    let s = recorder.summary();
    assert!(close(s.packing_density, 0.5) && close(s.stranded_cpu_pct.unwrap(), 4.0), "{s:?}");
    assert_eq!((s.samples, s.span_s), (2, 0.0));
    assert!(recorder.series().is_empty());
}

#[test]
fn samples_out_of_order_or_at_no_time_get_no_weight() {
    let mut recorder = MetricsRecorder::new(0.0);
    recorder.record(sample(10.0, 0.9, None));
    recorder.record(sample(0.0, 0.1, None));
    recorder.record(sample(f64::NAN, 0.1, None));
    recorder.record(sample(20.0, 0.3, None));
    recorder.record(sample(30.0, 0.5, None));
    let s = recorder.summary();
    // Taken as 10 (0.9), 10 (0.1), 10 (0.1), 20 (0.3), 30 (0.5).
    assert!(close(s.packing_density, 0.2) && s.span_s == 20.0, "{s:?}");
    assert_eq!(recorder.series()[1].time_s, 0.0, "the series keeps the times as given");
}

#[test]
fn the_summary_round_trips_through_json() {
    let mut recorder = MetricsRecorder::new(0.0);
    recorder.record(sample(0.0, 0.5, Some(1.0)));
    recorder.record(sample(1.0, 0.5, None));
    let json = serde_json::to_string(&recorder.summary()).unwrap();
    assert_eq!(serde_json::from_str::<simulator::metrics::MetricsSummary>(&json).unwrap(), recorder.summary());
    let json = serde_json::to_string(&recorder.series()[0]).unwrap();
    assert_eq!(serde_json::from_str::<InstantMetrics>(&json).unwrap(), recorder.series()[0]);
}

proptest! {
    #[test]
    fn metrics_stay_within_their_bounds(
        vms in prop::collection::vec((0u32..6, 1u8..=10, 1u8..=40), 0..40),
        unavailable in prop::collection::vec(any::<bool>(), 6),
        shapes in prop::collection::vec((1u8..=8, 1u8..=32, 1u64..5), 0..4),
    ) {
        let mut state = inventory(6);
        for (i, (host, cores, memory)) in vms.into_iter().enumerate() {
            let vm = NewVm { id: VmId::from(format!("v{i}").as_str()), facts: RequestFacts { tenant_id: domain::TenantId::from("t"), vm_type: "test".to_owned(), demand: res(f64::from(cores), f64::from(memory)), requested_at_s: None, details: Default::default() }, placed_at_s: 0.0, prediction: None };
            // What does not fit is simply not placed.
            let _ = state.place(vm, HostIndex(host));
        }
        for (host, down) in unavailable.into_iter().enumerate() {
            if down {
                state.set_host_state(HostIndex(host as u32), HostState::Unavailable).unwrap();
            }
        }
        let m = instant(&state, 0.0);
        prop_assert!(m.bound.hosts <= m.non_empty_hosts);
        prop_assert!((0.0..=1.0).contains(&m.packing_density));
        prop_assert!(m.bound.packing_density + 1e-12 >= m.packing_density);
        prop_assert!(m.bound.empty_hosts_pct + 1e-12 >= m.empty_hosts_pct);
        prop_assert!((0.0..=1.0).contains(&m.empty_to_free));
        prop_assert!((0.0..=100.0).contains(&m.empty_hosts_pct));

        let mix = VmMix::new(shapes.into_iter().map(|(c, g, w)| MixShape { demand: res(f64::from(c), f64::from(g)), weight: w }));
        let before = state.clone();
        let s = inflation_stranding(&state, &mix);
        prop_assert_eq!(&state, &before);
        let totals = state.totals();
        let free_cpu_pct = 100.0 * (totals.capacity.cores() - totals.used.cores()) / totals.capacity.cores();
        let free_memory_pct = 100.0 * (totals.capacity.memory_gib() - totals.used.memory_gib()) / totals.capacity.memory_gib();
        prop_assert!(s.cpu_pct >= 0.0 && s.cpu_pct <= free_cpu_pct + 1e-9, "{:?} vs {}", s, free_cpu_pct);
        prop_assert!(s.memory_pct >= 0.0 && s.memory_pct <= free_memory_pct + 1e-9);
        // The same inflation by hand: nothing of the mix fits in what is left, and what is left
        // is what `inflation_stranding` reports.
        let mut free: Vec<Resources> =
            state.hosts().iter().filter(|h| h.state == HostState::Available).map(|h| h.free()).collect();
        let original = free.clone();
        prop_assert_eq!(inflate(&mut free, &mix), s.fitted_vms);
        for (left, was) in free.iter().zip(&original) {
            prop_assert!(left.fits_within(was));
            prop_assert!(mix.shapes().iter().all(|shape| !shape.demand.fits_within(left)));
        }
        let left_cores: f64 = free.iter().map(Resources::cores).sum();
        prop_assert!((100.0 * left_cores / totals.capacity.cores() - s.cpu_pct).abs() < 1e-9);
    }
}
