//! The prediction sources: noisy oracles hit their targets, fallbacks replace the asked share, the
//! model sees only the past and repredicts in process for NILAS, and every draw follows the seed.

use domain::{LifetimeClass, PredictionSource};
use placement::{Policy, PolicyConfig, Registry};
use simulator::engine::{run, SimConfig};
use simulator::predict::{PredictError, PredictionConfig, PredictionSourceConfig, Predictions};
use simulator::workload::{Inventory, SyntheticSpec, TraceSpec, Workload, WorkloadConfig, CENSORED_LIFETIME_S};
use std::path::PathBuf;

fn synthetic(max_vms: usize) -> WorkloadConfig {
    WorkloadConfig {
        trace: TraceSpec::Synthetic(SyntheticSpec { days: 2.0, warmup_days: 0.5, ..SyntheticSpec::default() }),
        max_vms: Some(max_vms),
        ..WorkloadConfig::default()
    }
}

fn source(source: PredictionSourceConfig) -> PredictionConfig {
    PredictionConfig { source, ..PredictionConfig::default() }
}

/// The predictions of `workload` for a run of `policy`, a preset of the standard registry.
fn predict(
    workload: &Workload,
    config: &PredictionConfig,
    policy: &PolicyConfig,
    seed: u64,
) -> Result<Predictions, PredictError> {
    let built = Policy::from_config(policy, &Default::default(), &Registry::standard()).unwrap();
    simulator::predict::predict(workload, config, policy, &built, seed)
}

fn bundle() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../models/default")
}

#[test]
fn the_oracle_knows_every_lifetime_from_placement() {
    let workload = Workload::load(&synthetic(2000)).unwrap();
    let policy = PolicyConfig::preset("la-binary");
    let p = predict(&workload, &source(PredictionSourceConfig::Oracle), &policy, 1).unwrap();
    for (vm, prediction) in workload.vms.iter().zip(&p.per_vm) {
        let prediction = prediction.as_ref().unwrap();
        assert_eq!(prediction.expected_lifetime_s, Some(workload.lifetime_s(vm)));
        assert_eq!(prediction.source, PredictionSource::Oracle);
    }
    assert_eq!((p.report.precision_long, p.report.recall_long, p.report.accuracy), (1.0, 1.0, 1.0));
    let none = predict(&workload, &source(PredictionSourceConfig::None), &policy, 1).unwrap();
    assert!(none.per_vm.iter().all(Option::is_none));
    assert_eq!(none.report.predicted_long, 0);
}

/// VMs still running at the trace's end are censored: their true exits are unknown, so the
/// oracle gives them all one exit, far after the end, and invents no order among them.
#[test]
fn censored_vms_share_one_oracle_exit() {
    let workload = Workload::load(&synthetic(3000)).unwrap();
    let policy = PolicyConfig::preset("nilas");
    let p = predict(&workload, &source(PredictionSourceConfig::Oracle), &policy, 1).unwrap();
    let exits: Vec<f64> = workload
        .vms
        .iter()
        .zip(&p.per_vm)
        .filter(|(vm, _)| vm.end_s.is_none())
        .map(|(vm, prediction)| vm.arrival_s + prediction.as_ref().unwrap().expected_lifetime_s.unwrap())
        .collect();
    let arrivals: Vec<f64> = workload.vms.iter().filter(|vm| vm.end_s.is_none()).map(|vm| vm.arrival_s).collect();
    assert!(exits.len() > 20, "the window has censored VMs: {}", exits.len());
    assert!(arrivals.windows(2).any(|w| w[0] != w[1]), "they arrived at different times");
    let common = workload.censored_exit_s();
    assert_eq!(common, workload.trace_end_s + CENSORED_LIFETIME_S);
    for exit in exits {
        assert!((exit - common).abs() < 1e-6, "a censored VM exits at {exit}, not at the common {common}");
    }
}

/// The binned oracle knows each completed lifetime only to its recorded bin: it reads the bin's
/// middle, so VMs of one bin are alike to it; censored VMs keep the common far exit.
#[test]
fn the_binned_oracle_reads_the_middle_of_each_lifetime_bin() {
    let workload = Workload::load(&synthetic(3000)).unwrap();
    let policy = PolicyConfig::preset("nilas");
    let edges = vec![600.0, 3_600.0, 86_400.0];
    let config = source(PredictionSourceConfig::BinnedOracle { edges_s: edges });
    let p = predict(&workload, &config, &policy, 1).unwrap();
    let mut seen_bins = [false; 4];
    for (vm, prediction) in workload.vms.iter().zip(&p.per_vm) {
        let read = prediction.as_ref().unwrap().expected_lifetime_s.unwrap();
        let truth = workload.lifetime_s(vm);
        if vm.end_s.is_none() {
            assert_eq!(read, truth, "a censored VM keeps the oracle's common far exit");
            continue;
        }
        let (bin, middle) = match truth {
            t if t < 600.0 => (0, 300.0),
            t if t < 3_600.0 => (1, 2_100.0),
            t if t < 86_400.0 => (2, 45_000.0),
            _ => (3, 86_400.0),
        };
        seen_bins[bin] = true;
        assert_eq!(read, middle, "lifetime {truth} s is read as its bin's middle");
    }
    assert_eq!(seen_bins, [true; 4], "the trace has lifetimes in every bin");
    // The Azure V1 bins by default; bad edges are refused.
    let azure = predict(&workload, &source(PredictionSourceConfig::BinnedOracle { edges_s: vec![] }), &policy, 1);
    assert_eq!(azure.unwrap().report.source, "binned-oracle");
    let bad = source(PredictionSourceConfig::BinnedOracle { edges_s: vec![3_600.0, 600.0] });
    assert!(matches!(predict(&workload, &bad, &policy, 1), Err(PredictError::Invalid { .. })));
}

/// Paper 003 B.6: exactly round(recall x long) long VMs are predicted long, and the precision is the
/// target; each prediction's lifetime agrees with its class.
#[test]
fn noisy_precision_recall_hits_its_targets() {
    let workload = Workload::load(&synthetic(5000)).unwrap();
    let policy = PolicyConfig::preset("la-binary");
    let config = source(PredictionSourceConfig::NoisyPrecisionRecall { precision: 0.9, recall: 0.8 });
    let p = predict(&workload, &config, &policy, 3).unwrap();
    let r = &p.report;
    assert!(r.true_long > 500, "{r:?}");
    assert!((r.recall_long - 0.8).abs() < 0.002, "{r:?}");
    assert!((r.precision_long - 0.9).abs() < 0.002, "{r:?}");
    for prediction in p.per_vm.iter().flatten() {
        let long = prediction.expected_lifetime_s.unwrap() >= policy.long_threshold_s;
        assert_eq!(long, prediction.class == LifetimeClass::Long, "{prediction:?}");
        assert_eq!(prediction.source, PredictionSource::NoisyOracle);
    }
    let again = predict(&workload, &config, &policy, 3).unwrap();
    assert_eq!(again.per_vm, p.per_vm, "same seed, same draws");
    let other = predict(&workload, &config, &policy, 4).unwrap();
    assert_ne!(other.per_vm, p.per_vm);
    // A precision the workload cannot reach: too few short VMs to be wrong about.
    let impossible = source(PredictionSourceConfig::NoisyPrecisionRecall { precision: 0.01, recall: 1.0 });
    let err = predict(&workload, &impossible, &policy, 3).err().unwrap();
    assert!(matches!(err, PredictError::Unreachable { .. }), "{err}");
}

/// Paper 002 G.1: accuracy 1 keeps the true lifetime (sigma 0.001 in log10), accuracy 0 scatters
/// it (sigma 3); lifetimes stay within [1 s, 14 days].
#[test]
fn noisy_accuracy_follows_the_gaussian_noise_model() {
    let workload = Workload::load(&synthetic(3000)).unwrap();
    let policy = PolicyConfig::preset("la-binary");
    let exact =
        predict(&workload, &source(PredictionSourceConfig::NoisyAccuracy { accuracy: 1.0 }), &policy, 1).unwrap();
    assert!(exact.report.accuracy > 0.99, "{:?}", exact.report);
    let noisy =
        predict(&workload, &source(PredictionSourceConfig::NoisyAccuracy { accuracy: 0.0 }), &policy, 1).unwrap();
    assert!(noisy.report.accuracy < 0.8, "{:?}", noisy.report);
    for p in exact.per_vm.iter().chain(&noisy.per_vm).flatten() {
        let lifetime = p.expected_lifetime_s.unwrap();
        assert!((1.0..=CENSORED_LIFETIME_S * 1.000_001).contains(&lifetime), "{lifetime}");
    }
}

/// The asked share of VMs, drawn with the seed, gets the short-lived fallback with its source.
#[test]
fn fallbacks_replace_the_asked_share() {
    let workload = Workload::load(&synthetic(2000)).unwrap();
    let policy = PolicyConfig::preset("la-binary");
    let config = PredictionConfig {
        fallback_fraction: 0.25,
        fallback_source: PredictionSource::Safeguard,
        ..PredictionConfig::default()
    };
    let p = predict(&workload, &config, &policy, 5).unwrap();
    let expected = (0.25 * workload.vms.len() as f64).round() as usize;
    let fallbacks = p.per_vm.iter().flatten().filter(|p| p.source == PredictionSource::Safeguard).count();
    assert_eq!((fallbacks, p.report.fallbacks), (expected, expected));
    assert!(p.report.recall_long < 0.85, "fallbacks are short-lived: {:?}", p.report);
    let bad = PredictionConfig { fallback_source: PredictionSource::Model, ..config };
    assert!(predict(&workload, &bad, &policy, 5).is_err(), "a fallback needs a fallback source");
}

/// The model's prediction of a VM depends only on the trace before it: cutting the trace after it
/// changes nothing. NILAS repredicts with the bundle in process.
#[test]
fn the_model_sees_only_the_past_and_repredicts_in_process() {
    let policy = PolicyConfig::preset("nilas");
    let config = source(PredictionSourceConfig::Model { bundle: bundle(), reading: None });
    let short = Workload::load(&synthetic(600)).unwrap();
    let long = Workload::load(&synthetic(1500)).unwrap();
    let a = predict(&short, &config, &policy, 1).unwrap();
    let b = predict(&long, &config, &policy, 1).unwrap();
    assert_eq!(a.per_vm[..], b.per_vm[..a.per_vm.len()]);
    assert!(a.repredictor.is_some());
    assert_eq!(a.report.model_version.as_deref(), Some("default-1"));
    assert!(a.per_vm.iter().flatten().all(|p| p.source == PredictionSource::Model && p.interval_class.is_none()));
    // LA-multiclass reads interval classes: they are predicted for it only.
    let multiclass = PolicyConfig::preset("la-multiclass");
    let m = predict(&short, &config, &multiclass, 1).unwrap();
    assert!(m.per_vm.iter().flatten().all(|p| p.interval_class.is_some()));

    let sim = SimConfig {
        workload: synthetic(1500),
        inventory: Inventory::Auto { cores: 48.0, memory_gib: 384.0, headroom: 0.3, hosts_per_rack: 40 },
        policy,
        prediction: config,
        ..SimConfig::default()
    };
    let result = run(&long, &sim, &Registry::standard(), |_| {}).unwrap();
    assert_eq!(result.final_stats.reprediction_model.as_deref(), Some("default-1"));
    assert!(result.final_stats.repredictions > 0);
    assert_eq!(result.counters.rejected, 0);
}

/// With `bundle_history` the model's tenant history starts from the bundle's feature store, as the
/// inference server's does: a VM's first prediction is then the bundle's own for its request, and
/// differs from the one on an empty history for tenants the bundle knows. A run keeps each VM's
/// prediction with its host (`record_placements`), to compare with the service's.
#[test]
fn the_bundles_history_predicts_as_the_inference_server_starts() {
    let policy = PolicyConfig::preset("nilas");
    let workload = Workload::load(&synthetic(300)).unwrap();
    let empty = source(PredictionSourceConfig::Model { bundle: bundle(), reading: None });
    let from_bundle = PredictionConfig { bundle_history: true, ..empty.clone() };
    let on_empty = predict(&workload, &empty, &policy, 1).unwrap();
    let on_bundle = predict(&workload, &from_bundle, &policy, 1).unwrap();

    let model = lifetime_model::LifetimeModel::load(bundle()).unwrap();
    let first = &workload.vms[0];
    let features = lifetime_model::RequestFeatures::of(&first.request.facts, first.start_s);
    let served = model.to_wire(&model.predict(&features, false), PredictionSource::Model);
    assert_eq!(on_bundle.per_vm[0].as_ref(), Some(&served));
    let differing = on_empty.per_vm.iter().zip(&on_bundle.per_vm).filter(|(a, b)| a != b).count();
    assert!(differing > 100, "only {differing} of 300 predictions read the bundle's history");

    let sim = SimConfig {
        workload: synthetic(300),
        inventory: Inventory::Auto { cores: 48.0, memory_gib: 384.0, headroom: 0.3, hosts_per_rack: 40 },
        policy,
        prediction: from_bundle,
        record_placements: true,
        ..SimConfig::default()
    };
    let result = run(&workload, &sim, &Registry::standard(), |_| {}).unwrap();
    let placements = result.placements.expect("recorded");
    for (placement, prediction) in placements.iter().zip(&on_bundle.per_vm) {
        let prediction = prediction.as_ref().unwrap();
        assert_eq!(placement.p_long, Some(prediction.p_long));
        assert_eq!(placement.expected_lifetime_s, prediction.expected_lifetime_s);
    }
}

/// A hybrid source takes each part of the prediction from where it says: with every part from
/// the model it is the model, with every part from the oracle it places exactly as the oracle, and
/// its oracle repredictor answers each VM's true remaining lifetime.
#[test]
fn a_hybrid_takes_each_part_from_where_it_says() {
    use simulator::predict::PredictionPart::{Model as M, Oracle as O};
    let workload = Workload::load(&synthetic(1500)).unwrap();
    let policy = PolicyConfig::preset("nilas");
    let hybrid = |class, exit, reprediction| {
        source(PredictionSourceConfig::Hybrid { bundle: bundle(), reading: None, class, exit, reprediction })
    };
    let run_with = |prediction: &PredictionConfig| predict(&workload, prediction, &policy, 1).unwrap();
    let model = run_with(&source(PredictionSourceConfig::Model { bundle: bundle(), reading: None }));
    let oracle = run_with(&source(PredictionSourceConfig::Oracle));
    assert_eq!(run_with(&hybrid(M, M, M)).per_vm, model.per_vm);
    let class_from_oracle = run_with(&hybrid(O, M, M));
    let exit_from_oracle = run_with(&hybrid(M, O, O));
    for k in 0..workload.vms.len() {
        let (m, o) = (model.per_vm[k].as_ref().unwrap(), oracle.per_vm[k].as_ref().unwrap());
        let (c, e) = (class_from_oracle.per_vm[k].as_ref().unwrap(), exit_from_oracle.per_vm[k].as_ref().unwrap());
        assert_eq!((c.p_long, c.class, c.expected_lifetime_s), (o.p_long, o.class, m.expected_lifetime_s));
        assert_eq!((e.p_long, e.class, e.expected_lifetime_s), (m.p_long, m.class, o.expected_lifetime_s));
    }
    assert_eq!(hybrid(O, M, M).label(), "hybrid:classO-exitM-repredictM");

    let repredictor = run_with(&hybrid(M, M, O)).repredictor.expect("an oracle repredictor");
    for vm in workload.vms.iter().take(50) {
        let features = lifetime_model::RequestFeatures::of(&vm.request.facts, vm.arrival_s);
        let row = repredictor.encode(&vm.request.vm_id, &features);
        let lifetime = workload.lifetime_s(vm);
        assert_eq!(repredictor.remaining_s(&row, 600.0), (lifetime - 600.0).max(0.0));
    }

    // Every part from the oracle places as the oracle does.
    let sim = |prediction| SimConfig {
        workload: synthetic(1500),
        inventory: Inventory::Auto { cores: 48.0, memory_gib: 384.0, headroom: 0.3, hosts_per_rack: 40 },
        policy: policy.clone(),
        prediction,
        ..SimConfig::default()
    };
    let all_oracle = run(&workload, &sim(hybrid(O, O, O)), &Registry::standard(), |_| {}).unwrap();
    let plain_oracle =
        run(&workload, &sim(source(PredictionSourceConfig::Oracle)), &Registry::standard(), |_| {}).unwrap();
    assert_eq!(all_oracle.metrics.packing_density, plain_oracle.metrics.packing_density);
    assert_eq!(all_oracle.metrics.empty_hosts_pct, plain_oracle.metrics.empty_hosts_pct);
}
