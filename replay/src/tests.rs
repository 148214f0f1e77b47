//! Unit tests of the replay client's logic.

use super::*;
use crate::plots::quality_lines;
use domain::quality::{QualityFigures, QualityStatus, VersionQuality};
use domain::{CacheStats, ControlStats, LifetimeClass, LifetimePrediction, SafeguardStatus, ZoneStats};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use traces::window::WindowError;
use traces::ExtraColumns;
use traces::{TraceError, VmRecord};

fn record(id: &str, start_s: f64, end_s: Option<f64>) -> VmRecord {
    VmRecord {
        vm_id: id.to_owned(),
        tenant_id: "t1".to_owned(),
        vm_type: "D2".to_owned(),
        cores: 2.0,
        memory_gib: 8.0,
        priority: domain::Priority::Regular,
        start_s,
        end_s,
        extra: ExtraColumns::default(),
    }
}

fn model_prediction(p_long: f64) -> LifetimePrediction {
    LifetimePrediction {
        p_long,
        class: if p_long >= 0.5 { LifetimeClass::Long } else { LifetimeClass::Short },
        interval_class: None,
        expected_lifetime_s: None,
        model_version: Some("m-1".into()),
        source: domain::PredictionSource::Model,
    }
}

fn ok(records: Vec<VmRecord>) -> impl Iterator<Item = Result<VmRecord, TraceError>> {
    records.into_iter().map(Ok)
}

fn window(from_s: Option<f64>, duration_s: Option<f64>, max_vms: Option<usize>) -> WindowSpec {
    WindowSpec { from_s, duration_s, max_vms }
}

#[test]
fn the_plan_keeps_the_window_in_start_order() {
    let records = vec![
        record("late", 500.0, None),
        record("b", 20.0, Some(30.0)),
        record("before", 5.0, Some(8.0)),
        record("a", 10.0, Some(400.0)),
        record("a2", 10.0, None),
    ];
    let plan = plan(ok(records), 10.0, &window(Some(10.0), Some(100.0), None), "run").unwrap();
    let ids: Vec<&str> = plan.vms.iter().map(|v| v.request.vm_id.as_str()).collect();
    assert_eq!(ids, ["run-a", "run-a2", "run-b"]);
    assert_eq!(plan.vms[0].trace_vm_id, "a", "the trace's own id is kept beside the prefixed one");
    assert_eq!((plan.from_s, plan.to_s, plan.records_read), (10.0, 110.0, 5));
    assert!(plan.releases_in_window(&plan.vms[2]));
    assert!(!plan.releases_in_window(&plan.vms[0]), "ends after the window");
    assert!(!plan.releases_in_window(&plan.vms[1]), "no end");
}

#[test]
fn max_vms_keeps_the_earliest_and_ends_the_window_at_the_last_of_them() {
    let records = (0..10).rev().map(|i| record(&format!("v{i}"), f64::from(i) * 10.0, None)).collect();
    let plan = plan(ok(records), 0.0, &window(None, Some(1000.0), Some(3)), "").unwrap();
    let ids: Vec<&str> = plan.vms.iter().map(|v| v.request.vm_id.as_str()).collect();
    assert_eq!(ids, ["v0", "v1", "v2"]);
    assert_eq!(plan.to_s, 20.0);
}

#[test]
fn first_start_is_the_minimum_and_an_empty_window_says_where_the_trace_is() {
    let records = || ok(vec![record("a", 50.0, None), record("b", -20.0, None)]);
    assert_eq!(first_start(records()).unwrap(), -20.0);
    let err = plan(records(), 1000.0, &window(Some(1000.0), None, None), "p").unwrap_err();
    let message = err.to_string();
    assert!(message.contains("from 1000 s on") && message.contains("between -20 s and 50 s"), "{message}");
    let err = plan(records(), 60.0, &window(None, Some(10.0), None), "p").unwrap_err();
    assert!(err.to_string().contains("window [60 s, 70 s)"), "{err}");
    assert!(err.to_string().ends_with(": change --from-s or --duration-s"), "{err}");
    assert!(matches!(first_start(ok(Vec::new())), Err(WindowError::EmptyTrace)));
    let err = plan(ok(Vec::new()), 0.0, &window(None, None, None), "p").unwrap_err();
    assert!(matches!(err, ReplayError::Window(WindowError::EmptyTrace)), "{err:?}");
    assert_eq!(err.to_string(), "the trace holds no VM");
}

#[test]
fn the_request_carries_prefix_features_os_and_start_time() {
    let names: Arc<[String]> = ["os", "batch_size", "pool", "empty"].map(str::to_owned).into();
    let mut rec = record("vm7", 123.5, Some(200.0));
    rec.tenant_id = String::new();
    rec.extra = ExtraColumns::new(names, ["linux", "3", "gpu-a", ""].map(str::to_owned).to_vec());
    let vm = rec.to_request("r1").unwrap();
    let json = serde_json::to_value(domain::AllocationRequest::Vm(vm)).unwrap();
    assert_eq!(
        json,
        serde_json::json!({"vm": {
            "vm_id": "r1-vm7", "tenant_id": NO_TENANT, "vm_type": "D2",
            "demand": {"cores": 2.0, "memory_gib": 8.0, "ssd_gib": 0.0},
            "priority": "regular", "os": "linux", "requested_at_s": 123.5,
            "features": {"batch_size": 3.0, "pool": "gpu-a"}
        }})
    );
    // What we send passes the service's own validation.
    let body = serde_json::to_vec(&json).unwrap();
    domain::decode_json::<domain::AllocationRequest>(&body, &domain::ValidationLimits::default()).unwrap();
}

#[test]
fn flags_are_checked_with_their_names() {
    assert!(Pacing::new(0.0, None).unwrap_err().to_string().starts_with("--speed must be > 0"));
    assert!(Pacing::new(1.0, Some(-1.0)).unwrap_err().to_string().starts_with("--max-rate must be > 0"));
    let flag_error = |window: WindowSpec| check_window(&window).unwrap_err().to_string();
    assert!(flag_error(window(None, Some(0.0), None)).starts_with("--duration-s must be > 0"));
    assert!(flag_error(window(None, None, Some(0))).starts_with("--max-vms must be at least 1"));
    assert!(flag_error(window(Some(f64::NAN), None, None)).starts_with("--from-s must be a finite number"));
    assert!(check_window(&window(Some(-3.0), Some(1.0), Some(1))).is_ok());
    // plan checks them too, in the same terms.
    let err = plan(ok(vec![record("a", 0.0, None)]), 0.0, &window(None, None, Some(0)), "p").unwrap_err();
    assert!(err.to_string().starts_with("--max-vms must be at least 1"), "{err}");
}

fn plan_of(vms: &[(f64, Option<f64>)], from_s: f64, to_s: f64) -> Plan {
    let vms = vms
        .iter()
        .enumerate()
        .map(|(i, &(start_s, end_s))| PlannedVm {
            request: record(&format!("v{i}"), start_s, end_s).to_request("").unwrap(),
            start_s,
            end_s,
            trace_vm_id: format!("v{i}"),
        })
        .collect();
    Plan { vms, from_s, to_s, records_read: 0 }
}

fn times(events: &[Event]) -> Vec<(f64, EventKind, usize)> {
    events.iter().map(|e| ((e.at_s * 1e6).round() / 1e6, e.kind, e.vm)).collect()
}

#[test]
fn compression_maps_trace_time_and_releases_come_at_end_times() {
    use EventKind::{Allocate as A, Release as R};
    // speed 10: 10 trace seconds per real second, from trace time 100.
    let plan =
        plan_of(&[(100.0, Some(150.0)), (120.0, None), (130.0, Some(150.0)), (140.0, Some(900.0))], 100.0, 200.0);
    let events = schedule(&plan, &Pacing::new(10.0, None).unwrap());
    assert_eq!(
        times(&events),
        [(0.0, A, 0), (2.0, A, 1), (3.0, A, 2), (4.0, A, 3), (5.0, R, 0), (5.0, R, 2)],
        "no release for the VM without an end nor for the one ending after the window"
    );
    assert_eq!(events[4].trace_s, 150.0);
}

#[test]
fn releases_free_capacity_before_arrivals_at_one_instant_but_never_before_their_own_allocation() {
    use EventKind::{Allocate as A, Release as R};
    let plan = plan_of(&[(0.0, Some(10.0)), (10.0, Some(10.0)), (10.0, Some(20.0))], 0.0, 20.0);
    let events = schedule(&plan, &Pacing::new(1.0, None).unwrap());
    assert_eq!(times(&events), [(0.0, A, 0), (10.0, R, 0), (10.0, A, 1), (10.0, A, 2), (10.0, R, 1), (20.0, R, 2)]);
}

#[test]
fn the_rate_cap_spaces_every_request_and_never_bursts() {
    use EventKind::{Allocate as A, Release as R};
    // Five VMs at the same instant, then one much later; 2 requests/s at most.
    let plan =
        plan_of(&[(0.0, Some(1.0)), (0.0, None), (0.0, None), (0.0, None), (0.0, None), (100.0, None)], 0.0, 100.0);
    let events = schedule(&plan, &Pacing::new(1.0, Some(2.0)).unwrap());
    assert_eq!(
        times(&events),
        [(0.0, A, 0), (0.5, A, 1), (1.0, A, 2), (1.5, A, 3), (2.0, A, 4), (2.5, R, 0), (100.0, A, 5)],
        "the release waits for its slot; the late VM keeps its own time"
    );
    for pair in events.windows(2) {
        assert!(pair[1].at_s - pair[0].at_s >= 0.5 - 1e-9);
    }
}

#[test]
fn the_pacer_never_hands_out_two_slots_closer_than_the_interval() {
    let mut pacer = Pacer::new(Some(4.0));
    assert_eq!(pacer.reserve(1.0), 1.0);
    assert_eq!(pacer.reserve(1.0), 1.25);
    assert_eq!(pacer.reserve(1.3), 1.5);
    assert_eq!(pacer.reserve(9.0), 9.0);
    let mut free = Pacer::new(None);
    assert_eq!((free.reserve(3.0), free.reserve(3.0)), (3.0, 3.0));
}

#[test]
fn percentiles_are_nearest_rank() {
    let values: Vec<f64> = (1..=100).map(f64::from).collect();
    assert_eq!(percentile(&values, 0.5), Some(50.0));
    assert_eq!(percentile(&values, 0.99), Some(99.0));
    assert_eq!(percentile(&values, 1.0), Some(100.0));
    assert_eq!(percentile(&values, 0.0), Some(1.0));
    assert_eq!(percentile(&[7.0], 0.99), Some(7.0));
    assert_eq!(percentile(&[], 0.5), None);
    let lat = LatencySummary::from_us(&[3000, 1000, 2000]);
    assert_eq!((lat.count, lat.p50_ms, lat.p99_ms, lat.max_ms), (3, Some(2.0), Some(3.0), Some(3.0)));
}

fn stats(hits: u64, misses: u64, fallbacks: &[(&str, u64)], trips: u64) -> ControlStats {
    ControlStats {
        requests: hits + misses,
        cache: CacheStats { hits, misses, hit_rate: 0.0, entries: 0 },
        fallbacks: fallbacks.iter().map(|(k, v)| ((*k).to_owned(), *v)).collect(),
        safeguard: SafeguardStatus { trips, ..SafeguardStatus::default() },
        ..ControlStats::default()
    }
}

#[test]
fn the_stats_delta_counts_only_this_run() {
    let start = stats(100, 50, &[("timeout", 4)], 1);
    let end = stats(180, 70, &[("timeout", 9), ("error", 2)], 3);
    let delta = stats_delta(&start, &end);
    assert_eq!((delta.cache_hits, delta.cache_misses), (80, 20));
    assert_eq!(delta.cache_hit_rate, Some(0.8));
    assert_eq!(delta.fallbacks, BTreeMap::from([("error".to_owned(), 2), ("timeout".to_owned(), 5)]));
    assert_eq!((delta.safeguard_trips, delta.requests, delta.counters_reset), (2, 100, false));
    assert_eq!(stats_delta(&end, &end).cache_hit_rate, None);
    // A restart in between: the counters start over and the end values are what counted.
    let after_restart = stats_delta(&end, &stats(5, 5, &[], 0));
    assert!(after_restart.counters_reset);
    assert_eq!((after_restart.cache_hits, after_restart.cache_hit_rate), (5, Some(0.5)));
}

#[test]
fn series_points_read_and_combine_the_zones_stats() {
    let zone = |stats: serde_json::Value| ZoneStats { allocator: "http://a".into(), stats: Some(stats), error: None };
    let mut control = ControlStats::default();
    control.zones.insert(
        "z1".into(),
        zone(serde_json::json!({"packing_density": 0.9, "empty_hosts_pct": 50.0, "vms": 10, "empty_hosts": 5, "hosts": 10})),
    );
    let one = series_point(1.0, 2.0, 3, &control);
    assert_eq!(
        (one.packing_density, one.empty_hosts_pct, one.allocator_vms, one.vms_alive),
        (Some(0.9), Some(50.0), Some(10), 3)
    );
    control.zones.insert(
        "z2".into(),
        zone(serde_json::json!({"packing_density": 0.6, "empty_hosts_pct": 0.0, "vms": 30, "empty_hosts": 0, "hosts": 10})),
    );
    control.zones.insert("down".into(), ZoneStats { allocator: "x".into(), stats: None, error: Some("no".into()) });
    let two = series_point(1.0, 2.0, 3, &control);
    // Density weighted by non-empty hosts: (0.9 * 5 + 0.6 * 10) / 15.
    assert!((two.packing_density.unwrap() - 0.7).abs() < 1e-12);
    assert_eq!((two.empty_hosts_pct, two.allocator_vms, two.hosts), (Some(25.0), Some(40), Some(20)));
    assert_eq!(series_point(0.0, 0.0, 0, &ControlStats::default()).packing_density, None);
}

#[test]
fn thinning_spreads_rows_evenly_and_keeps_both_ends() {
    assert_eq!(thin_indices(5, 15), [0, 1, 2, 3, 4]);
    assert_eq!(thin_indices(100, 5), [0, 25, 50, 74, 99]);
    let many = thin_indices(1000, 15);
    assert_eq!((many.len(), many[0], many[14]), (15, 0, 999));
    assert_eq!(thin_indices(16, 15).len(), 15);
    assert_eq!(thin_indices(10, 1), [9]);
    assert!(thin_indices(10, 0).is_empty());
}

#[test]
fn answers_are_classified_by_status_and_body() {
    let placed =
        br#"{"zone":"z","status":"placed","placements":[{"vm_id":"v","host_id":"h","rack_id":"r","cluster_id":"c"}],
        "predictions":[{"vm_id":"v","prediction":{"p_long":0.1,"class":"short","source":"cache"}}],
        "latency_us":{"validate_us":1,"cache_us":1,"inference_us":0,"allocator_us":5,"total_us":9}}"#;
    let answer = classify_answer(201, placed);
    assert_eq!(answer.outcome, Outcome::Placed);
    assert_eq!((answer.server_total_us, answer.prediction_sources()), (Some(9), vec!["cache".to_owned()]));
    assert!(answer.is_placed());

    let rejected = br#"{"zone":"z","status":"rejected","rejection":{"code":"no_feasible_host","detail":"full"},
        "predictions":[],"latency_us":{"validate_us":1,"cache_us":1,"inference_us":0,"allocator_us":5,"total_us":7}}"#;
    let answer = classify_answer(200, rejected);
    assert_eq!(answer.outcome, Outcome::Rejected { code: "no_feasible_host".into() });
    assert!(!answer.is_placed());

    let replayed =
        String::from_utf8(placed.to_vec()).unwrap().replace(r#""zone":"z","#, r#""zone":"z","replayed":true,"#);
    let answer = classify_answer(200, replayed.as_bytes());
    assert_eq!(answer.outcome, Outcome::Replayed { placed: true });
    assert!(answer.is_placed());

    let problem = br#"{"type":"urn:problem:allocator-unavailable","title":"Allocator unavailable","status":503,"detail":"zone-1 down"}"#;
    let answer = classify_answer(503, problem);
    assert_eq!(
        answer.outcome,
        Outcome::Failed {
            kind: "HTTP 503".into(),
            detail: "Allocator unavailable: zone-1 down (urn:problem:allocator-unavailable)".into()
        }
    );
    assert!(matches!(classify_answer(500, b"oops").outcome, Outcome::Failed { ref detail, .. } if detail == "oops"));
    assert!(
        matches!(classify_answer(201, b"{}").outcome, Outcome::Failed { ref kind, .. } if kind.contains("unreadable"))
    );
}

#[test]
fn the_tally_counts_outcomes_releases_and_the_error_rate() {
    let mut tally = Tally::default();
    let answer = |outcome| Answer { outcome, server_total_us: Some(5), predictions: vec![model_prediction(0.7)] };
    tally.record_allocation(&answer(Outcome::Placed), 10);
    tally.record_allocation(&answer(Outcome::Rejected { code: "no_feasible_host".into() }), 10);
    tally.record_allocation(&answer(Outcome::Replayed { placed: false }), 10);
    tally.record_allocation(&Answer::transport_error("connect", "refused"), 10);
    assert_eq!((tally.requests, tally.placed, tally.rejected, tally.replayed, tally.errors), (4, 1, 1, 1, 1));
    assert_eq!(tally.error_rate(), 0.25);
    assert_eq!(tally.predictions_by_source["model"], 3);
    assert_eq!(tally.server_total_us.len(), 3);
    assert_eq!(tally.error_samples, ["POST /allocate: transport: connect: refused"]);
    tally.record_release(Ok(204), false);
    tally.record_release(Ok(404), true);
    tally.record_release(Ok(503), true);
    tally.record_release(Err(("timeout".into(), "slow".into())), false);
    let r = &tally.releases;
    assert_eq!((r.requests, r.released, r.not_found, r.errors, r.at_end), (4, 1, 1, 2, 2));
    assert_eq!(r.errors_by_kind.len(), 2);
}

#[test]
fn the_summary_renders_every_section_and_serializes() {
    let mut tally = Tally::default();
    tally.record_allocation(
        &Answer { outcome: Outcome::Placed, server_total_us: Some(1500), predictions: vec![model_prediction(0.2)] },
        2345,
    );
    let series: Vec<SeriesPoint> = (0..40)
        .map(|i| SeriesPoint { elapsed_s: f64::from(i), packing_density: Some(0.5), ..SeriesPoint::default() })
        .collect();
    let run = RunInfo { control: "http://c".into(), wall_s: 2.0, vm_id_prefix: "r1".into(), ..RunInfo::default() };
    let delta = stats_delta(&stats(0, 0, &[], 0), &stats(3, 1, &[("timeout", 1)], 0));
    let summary = Summary::new(run, tally, Some(delta), series);
    let text = summary.render();
    for needle in
        ["placed         1", "2.35", "1.50", "hit rate 75.0%", "timeout 1", "model 1", "15 of 40 samples", "50.0%"]
    {
        assert!(text.contains(needle), "missing {needle:?} in\n{text}");
    }
    assert_eq!(text.lines().filter(|l| l.trim_start().starts_with("39.0")).count(), 1, "the last sample is shown");
    let json = serde_json::to_value(&summary).unwrap();
    assert_eq!(json["requests"]["placed"], 1);
    assert_eq!(json["latency"]["client"]["p50_ms"], 2.345);
    assert_eq!(json["series"].as_array().unwrap().len(), 40);
}

#[test]
fn the_plot_is_an_svg() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("replay.svg");
    let series: Vec<SeriesPoint> = (0..5)
        .map(|i| SeriesPoint {
            trace_s: f64::from(i) * 3600.0,
            packing_density: Some(0.8),
            empty_hosts_pct: Some(f64::from(i) * 10.0),
            ..SeriesPoint::default()
        })
        .collect();
    write_plot(&series, &path).unwrap();
    let svg = std::fs::read_to_string(&path).unwrap();
    assert!(svg.contains("<svg") && svg.contains("empty hosts"));
    write_plot(&[], &dir.path().join("empty.svg")).unwrap();
    let err = write_plot(&series, &dir.path().join("missing/dir/x.svg")).unwrap_err();
    assert!(err.to_string().contains("missing/dir/x.svg"), "{err}");
}

fn version_quality(version: &str, resolved: u64, auc: Option<f64>) -> VersionQuality {
    VersionQuality {
        version: version.into(),
        resolved_total: resolved + 5,
        pending: 3,
        window: domain::quality::QualityTally::default(),
        figures: QualityFigures {
            resolved,
            realized_long_share: Some(0.25),
            predicted_long_share: Some(0.2),
            mean_p_long: Some(0.3),
            precision: Some(0.6),
            recall: Some(0.55),
            roc_auc: auc,
            average_precision: auc.map(|a| a - 0.1),
            ..QualityFigures::default()
        },
    }
}

fn quality_stats(versions: Vec<VersionQuality>, gated: bool, trips: u64) -> ControlStats {
    ControlStats {
        quality: QualityStatus {
            gate_enabled: true,
            gated,
            reason: gated.then(|| "precision 0.300 < 0.5 over 250 VMs".to_owned()),
            trips,
            recoveries: 0,
            stable_version: Some("m-1".into()),
            canary_version: Some("m-2".into()),
            versions,
            last_canary_decision: None,
        },
        ..ControlStats::default()
    }
}

#[test]
fn series_points_carry_each_versions_realized_quality() {
    let stats = quality_stats(vec![version_quality("m-2", 40, None), version_quality("m-1", 900, Some(0.8))], false, 0);
    let point = series_point(3.0, 7_200.0, 1, &stats);
    assert_eq!(point.quality.len(), 2);
    assert_eq!(
        point.quality[1],
        QualitySample {
            version: "m-1".into(),
            resolved: 900,
            roc_auc: Some(0.8),
            average_precision: Some(0.8 - 0.1),
            precision: Some(0.6),
            recall: Some(0.55)
        }
    );
    assert_eq!(point.quality[0].roc_auc, None, "a figure the window cannot tell stays absent");
    assert!(series_point(0.0, 0.0, 0, &ControlStats::default()).quality.is_empty());
    // Without quality the sample's JSON is as before.
    let json = serde_json::to_value(series_point(0.0, 0.0, 0, &ControlStats::default())).unwrap();
    assert!(json.get("quality").is_none());
}

#[test]
fn the_quality_summary_names_roles_and_the_gate_and_counts_trips_of_the_run() {
    let start = quality_stats(Vec::new(), false, 1);
    let end = quality_stats(vec![version_quality("m-1", 900, Some(0.8)), version_quality("old", 10, None)], true, 3);
    assert_eq!(stats_delta(&start, &end).quality_gate_trips, 2);
    let quality = QualitySummary::of(&end.quality);
    let roles: Vec<(&str, &str)> = quality.versions.iter().map(|v| (v.version.as_str(), v.role.as_str())).collect();
    assert_eq!(roles, [("m-1", "stable"), ("old", "")]);
    assert_eq!((quality.versions[0].resolved_total, quality.versions[0].pending), (905, 3));
    assert!(quality.gate_state().starts_with("CLOSED: precision 0.300"));
    let off = QualitySummary::of(&QualityStatus::default());
    assert_eq!(off.gate_state(), "off (measured only)");
    assert_eq!(QualitySummary::of(&quality_stats(Vec::new(), false, 0).quality).gate_state(), "open");
}

#[test]
fn the_summary_renders_the_quality_table_and_its_series() {
    let series: Vec<SeriesPoint> = (0..30)
        .map(|i| SeriesPoint {
            elapsed_s: f64::from(i),
            trace_s: f64::from(i) * 600.0,
            quality: if i < 5 {
                Vec::new()
            } else {
                vec![QualitySample {
                    version: "m-1".into(),
                    resolved: i as u64 * 10,
                    roc_auc: Some(0.8),
                    ..QualitySample::default()
                }]
            },
            ..SeriesPoint::default()
        })
        .collect();
    let end = quality_stats(vec![version_quality("m-1", 900, Some(0.812))], false, 0);
    let delta = stats_delta(&end, &end);
    let mut summary = Summary::new(RunInfo::default(), Tally::default(), Some(delta), series).with_quality(Some(&end));
    summary.plots = vec!["r.svg".into(), "r-quality.svg".into()];
    let text = summary.render();
    for needle in [
        "realized quality (each zone's window",
        "gate    open; 0 trips during the run",
        "ROC AUC",
        "long realized",
        "0.812",
        "0.712",
        "25.0%",
        "20.0%",
        "realized quality over time (15 of 25 samples)",
        "plots     r.svg, r-quality.svg",
    ] {
        assert!(text.contains(needle), "missing {needle:?} in\n{text}");
    }
    let row = text.lines().find(|l| l.trim_start().starts_with("m-1")).unwrap();
    assert!(row.contains("stable") && row.contains("900") && row.contains("0.600") && row.contains("0.550"), "{row}");
    let json = serde_json::to_value(&summary).unwrap();
    assert_eq!(json["quality"]["versions"][0]["figures"]["roc_auc"], 0.812);
    assert_eq!(json["quality"]["stable_version"], "m-1");
    // No end snapshot: said so, and no quality table.
    let unknown = Summary::new(RunInfo::default(), Tally::default(), None, Vec::new()).with_quality(None);
    assert!(unknown.render().contains("realized quality: unknown"));
    // No version yet.
    let empty = Summary::new(RunInfo::default(), Tally::default(), None, Vec::new())
        .with_quality(Some(&quality_stats(Vec::new(), false, 0)));
    assert!(empty.render().contains("no model version has resolved outcomes yet"));
}

#[test]
fn prediction_rows_are_csv_with_every_field() {
    let mut rec = record("vm,7", 100.5, Some(7300.0));
    rec.tenant_id = "t\"1".into();
    let vm = PlannedVm {
        request: rec.to_request("r1").unwrap(),
        start_s: 100.5,
        end_s: Some(7300.0),
        trace_vm_id: "vm,7".into(),
    };
    let mut prediction = model_prediction(0.123456789);
    prediction.expected_lifetime_s = Some(3600.0);
    let placed = Answer { outcome: Outcome::Placed, server_total_us: Some(1), predictions: vec![prediction] };
    let line = PredictionRow::new(&vm, &placed).csv_line();
    assert_eq!(line, r#""vm,7","r1-vm,7","t""1",100.5,7300,placed,0.123456789,short,m-1,model,3600"#);
    assert_eq!(line.matches(',').count() - 2, PREDICTION_CSV_HEADER.matches(',').count(), "two commas quoted");
    let mut open_ended = vm.clone();
    open_ended.end_s = None;
    let failed = PredictionRow::new(&open_ended, &Answer::transport_error("timeout", "slow")).csv_line();
    assert!(failed.ends_with(",100.5,,failed,,,,,"), "{failed}");
}

#[test]
fn the_quality_plot_sits_beside_the_plot_and_draws_gaps_for_missing_figures() {
    assert_eq!(quality_plot_path(Path::new("out/replay.svg")), Path::new("out/replay-quality.svg"));
    assert_eq!(quality_plot_path(Path::new("plot")), Path::new("plot-quality.svg"));
    let sample = |version: &str, auc: Option<f64>| QualitySample {
        version: version.into(),
        roc_auc: auc,
        ..QualitySample::default()
    };
    let series: Vec<SeriesPoint> = [
        vec![],
        vec![sample("a", Some(0.7))],
        vec![sample("a", Some(0.8)), sample("b", None)],
        vec![sample("a", None), sample("b", Some(0.6))],
        vec![sample("a", Some(0.9)), sample("b", Some(0.65))],
    ]
    .into_iter()
    .enumerate()
    .map(|(i, quality)| SeriesPoint { trace_s: i as f64 * 3_600.0, quality, ..SeriesPoint::default() })
    .collect();
    assert!(has_quality(&series) && !has_quality(&series[..1]));
    let lines = quality_lines(&series, |q| q.roc_auc);
    assert_eq!(
        lines,
        [
            ("a".to_owned(), vec![vec![(1.0, 0.7), (2.0, 0.8)], vec![(4.0, 0.9)]]),
            ("b".to_owned(), vec![vec![(3.0, 0.6), (4.0, 0.65)]]),
        ]
    );
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("q.svg");
    write_quality_plot(&series, &path).unwrap();
    let svg = std::fs::read_to_string(&path).unwrap();
    for needle in ["<svg", "ROC AUC", "average precision", "recall (long-lived)"] {
        assert!(svg.contains(needle), "missing {needle:?}");
    }
    for version in ["a", "b"] {
        assert!(svg.lines().any(|line| line.trim() == version), "no legend entry for {version}");
    }
    write_quality_plot(&[], &dir.path().join("empty.svg")).unwrap();
    assert!(write_quality_plot(&series, &dir.path().join("no/dir/q.svg")).is_err());
}
