//! Unit tests of the comparison.

use super::crossings::crossing_of;
use super::*;

const MATRIX: &str = r#"
    name = "t"
    baseline = "pbfr"
    [[policies]]
    name = "pbfr"
    policy = { kind = "pbfr" }
    [[policies]]
    name = "la-binary"
    policy = { kind = "la-binary" }
    [[predictions]]
    name = "a0.5"
    prediction = { source = { kind = "noisy-accuracy", accuracy = 0.5 } }
    x = 0.5
    [[predictions]]
    name = "oracle"
    prediction = { source = { kind = "oracle" } }
    x = 1.0
"#;

#[test]
fn a_policy_that_reads_no_lifetime_runs_once() {
    let plan = Experiment::from_toml(MATRIX).unwrap().plan(&Registry::standard()).unwrap();
    let labels: Vec<&str> = plan.iter().map(|r| r.cell.label.as_str()).collect();
    assert_eq!(labels, ["pbfr", "la-binary / a0.5", "la-binary / oracle"]);
    assert_eq!(plan[2].cell.x, Some(1.0));
    assert_eq!(plan[0].cell.x, None, "a run made once is not a point of the sweep");
    let single = MATRIX.split("[[predictions]]").take(2).collect::<Vec<_>>().join("[[predictions]]");
    let plan = Experiment::from_toml(&single).unwrap().plan(&Registry::standard()).unwrap();
    let labels: Vec<&str> = plan.iter().map(|r| r.cell.label.as_str()).collect();
    assert_eq!(labels, ["pbfr", "la-binary"], "one prediction: labels are the policies");
}

#[test]
fn bad_experiments_say_what_is_wrong() {
    let no_baseline = MATRIX.replace("baseline = \"pbfr\"", "baseline = \"nope\"");
    let err = Experiment::from_toml(&no_baseline).unwrap().plan(&Registry::standard()).unwrap_err().to_string();
    assert!(err.contains("baseline `nope`") && err.contains("la-binary / oracle"), "{err}");
    let twice = MATRIX.replace("name = \"la-binary\"", "name = \"pbfr\"");
    let err = Experiment::from_toml(&twice).unwrap().plan(&Registry::standard()).unwrap_err().to_string();
    assert!(err.contains("named `pbfr`"), "{err}");
    let typo = MATRIX.replace("baseline", "basline");
    assert!(Experiment::from_toml(&typo).is_err());
    let with = |line: &str| MATRIX.replace("baseline = \"pbfr\"", &format!("baseline = \"pbfr\"\n{line}"));
    let twice = with("seeds = [1, 2, 1]");
    let err = Experiment::from_toml(&twice).unwrap().plan(&Registry::standard()).unwrap_err().to_string();
    assert!(err.contains("seed twice"), "{err}");
    let reference = with("oracle_reference = \"nilas / oracle\"");
    let err = Experiment::from_toml(&reference).unwrap().plan(&Registry::standard()).unwrap_err().to_string();
    assert!(err.contains("oracle_reference `nilas / oracle`"), "{err}");
    let own = with("oracle_prediction = \"perfect\"");
    let err = Experiment::from_toml(&own).unwrap().plan(&Registry::standard()).unwrap_err().to_string();
    assert!(err.contains("oracle_prediction `perfect`"), "{err}");
}

#[test]
fn seeds_repeat_every_run_and_rows_pair_gains_by_seed() {
    let header = "baseline = \"pbfr\"\nseeds = [3, 4]\noracle_reference = \"la-binary / oracle\"\n\
                  oracle_prediction = \"oracle\"\n[base.workload]\nmax_vms = 300\n\
                  [base.workload.trace]\nkind = \"synthetic\"\ndays = 1.0\nwarmup_days = 0.5";
    let text = MATRIX.replace("baseline = \"pbfr\"", header);
    let experiment = Experiment::from_toml(&text).unwrap();
    let plan = experiment.plan(&Registry::standard()).unwrap();
    let seeds: Vec<(&str, u64)> = plan.iter().map(|r| (r.cell.label.as_str(), r.config.seed)).collect();
    assert_eq!(
        seeds,
        [
            ("pbfr", 3),
            ("pbfr", 4),
            ("la-binary / a0.5", 3),
            ("la-binary / a0.5", 4),
            ("la-binary / oracle", 3),
            ("la-binary / oracle", 4)
        ]
    );
    let workload = Workload::load(&experiment.base.workload).unwrap();
    let runs = run_all(&workload, plan, &Registry::standard(), 2, &|_| {}).unwrap();
    let comparison = Comparison::new(experiment, runs);
    assert_eq!(comparison.rows.len(), 3);
    let density = |label: &str, seed: u64| {
        let run = comparison.runs.iter().find(|r| r.plan.cell.label == label && r.plan.config.seed == seed).unwrap();
        100.0 * run.result.metrics.packing_density
    };
    let gain = |label: &str, seed: u64| density(label, seed) - density("pbfr", seed);
    let noisy = &comparison.rows[1];
    assert_eq!(noisy.seeds, [3, 4]);
    let want = (gain("la-binary / a0.5", 3) + gain("la-binary / a0.5", 4)) / 2.0;
    assert!((noisy.packing_density_gain_pp.mean - want).abs() < 1e-9);
    let spread = (gain("la-binary / a0.5", 3) - gain("la-binary / a0.5", 4)).abs();
    assert!((noisy.packing_density_gain_pp.max - noisy.packing_density_gain_pp.min - spread).abs() < 1e-9);
    let possible = (gain("la-binary / oracle", 3) + gain("la-binary / oracle", 4)) / 2.0;
    let kept = noisy.kept_of_reference.unwrap().packing_density_pct;
    if possible > 0.0 {
        assert!((kept.unwrap() - 100.0 * want / possible).abs() < 1e-6);
        assert_eq!(noisy.kept_of_own_oracle.unwrap().packing_density_pct, kept, "its own oracle is the reference");
    } else {
        assert_eq!(kept, None, "nothing to keep when the oracle gains nothing");
    }
    assert_eq!(comparison.rows[0].packing_density_gain_pp, Spread::default(), "the baseline gains nothing");
    let md = markdown(&comparison);
    assert!(md.contains("| kept |") && md.contains("seeds [3, 4]"), "{md}");
}

#[test]
fn a_crossing_is_where_the_gain_last_falls_to_zero_going_down() {
    let q = |p: f64| QualityPoint { precision: Some(p), recall: Some(p), roc_auc: None, average_precision: Some(p) };
    // Not monotonic: it gains at 0.5, loses at 0.6 and 0.7, gains from 0.8 on. Scanning down
    // from the top, it stops gaining between 0.7 and 0.8.
    let points = [(0.5, 0.1, q(0.5)), (0.6, -0.2, q(0.6)), (0.7, -0.3, q(0.7)), (0.8, 0.1, q(0.8)), (1.0, 1.0, q(1.0))];
    let c = crossing_of(&points);
    assert_eq!((c.kind, c.between), (CrossingKind::Crosses, Some((0.7, 0.8))));
    // 0.3 of the 0.4 pp step: three quarters of the way.
    assert!((c.x.unwrap() - 0.775).abs() < 1e-12);
    assert!((c.quality.precision.unwrap() - 0.775).abs() < 1e-12);
    assert_eq!(c.quality.roc_auc, None, "a figure missing at either end is missing");
    // A gain of exactly zero is where it stops.
    let c = crossing_of(&[(0.5, -1.0, q(0.5)), (0.6, 0.0, q(0.6)), (0.7, 1.0, q(0.7))]);
    assert_eq!((c.between, c.x), (Some((0.6, 0.7)), Some(0.6)));
    assert_eq!(crossing_of(&[(0.5, 0.2, q(0.5)), (1.0, 1.0, q(1.0))]).kind, CrossingKind::AlwaysAbove);
    assert_eq!(crossing_of(&[(0.5, 0.2, q(0.5)), (1.0, -0.1, q(1.0))]).kind, CrossingKind::NeverAbove);
    assert_eq!(crossing_of(&[]).kind, CrossingKind::NeverAbove);
}

#[test]
fn spreads_are_means_with_sample_deviations() {
    let s = Spread::of(&[1.0, 2.0, 6.0]);
    assert_eq!((s.mean, s.min, s.max), (3.0, 1.0, 6.0));
    assert!((s.sd - 7f64.sqrt()).abs() < 1e-12);
    assert_eq!(Spread::of(&[5.0]).sd, 0.0);
    assert_eq!(Spread::of(&[]), Spread::default());
}

#[test]
fn the_checked_in_experiments_plan() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../configs/experiments");
    let mut seen = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let text = std::fs::read_to_string(&path).unwrap();
        let plan = Experiment::from_toml(&text).and_then(|e| e.plan(&Registry::standard()));
        assert!(plan.is_ok(), "{}: {}", path.display(), plan.unwrap_err());
        seen += 1;
    }
    assert_eq!(
        seen, 21,
        "the experiments of the evaluation, the validation sweeps, the survival test and consolidation (validation rounds, the test readings, the hybrid decomposition)"
    );
}
