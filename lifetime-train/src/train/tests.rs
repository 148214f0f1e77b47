//! The trainer's tests: bundles trained on synthetic traces, and the choices made on validation.

use super::*;
use domain::Priority;
use lifetime_model::features::{FeatureKind, OTHER};
use traces::record::ExtraColumns;

fn vm(vm_type: &str, start_s: f64, end_s: Option<f64>) -> VmRecord {
    VmRecord {
        vm_id: format!("{vm_type}-{start_s}"),
        tenant_id: "t".to_owned(),
        vm_type: vm_type.to_owned(),
        cores: 2.0,
        memory_gib: 8.0,
        priority: Priority::Regular,
        start_s,
        end_s,
        extra: ExtraColumns::default(),
    }
}

fn vm_type_codes(schema: &FeatureSchema) -> Vec<String> {
    let spec = schema.features.iter().find(|f| f.name == "vm_type").expect("a vm_type feature");
    let FeatureKind::Categorical { codes, .. } = &spec.kind else { panic!("vm_type is categorical") };
    codes.iter().map(|(c, _)| c.clone()).collect()
}

#[test]
fn the_validation_split_censors_the_fit_part_at_the_validation_start() {
    let (valid_from, cutoff) = (10_000.0, 20_000.0);
    let mut training = Vec::new();
    for k in 0..20 {
        let start = f64::from(k) * 100.0;
        // Ends after the validation start (known only later), ends before it, never ends.
        training.push(vm("a", start, Some(valid_from + 5_000.0)));
        training.push(vm("b", start + 1.0, Some(start + 60.0)));
        training.push(vm("c", start + 2.0, None));
    }
    for k in 0..20 {
        let start = valid_from + f64::from(k) * 100.0;
        // "late" exists only in the validation part; its VMs end after the cut-off.
        training.push(vm("late", start, Some(cutoff + 50_000.0)));
        training.push(vm("b", start + 1.0, Some(start + 60.0)));
    }
    training.sort_by(|a, b| a.start_s.total_cmp(&b.start_s));
    let config = TrainConfig::default();
    let split = ValidationSplit::new(&training, valid_from, cutoff, &config);
    let r = &split.replayed;
    assert_eq!((split.fit.len(), split.valid.len()), (60, 40));
    for &i in &split.fit {
        assert!(r.start_s[i] < valid_from);
        let label = r.train_label[i];
        // Nothing that happens from the validation start on is known to the fit part.
        assert!(r.start_s[i] + label.seconds <= valid_from);
        if label.censored {
            assert_eq!(label.seconds, valid_from - r.start_s[i]);
        }
    }
    let a = split.fit.iter().find(|&&i| r.start_s[i] == 0.0).copied().expect("the first VM");
    assert_eq!(r.train_label[a], ObservedLifetime { seconds: valid_from, censored: true });
    for &i in &split.valid {
        assert!(r.start_s[i] >= valid_from && r.start_s[i] < cutoff);
        let label = r.full_label[i];
        assert!(r.start_s[i] + label.seconds <= cutoff, "validation labels stop at the cut-off");
    }
    // Categories are ranked on the fit part: the validation-only type is "other".
    let codes = vm_type_codes(&split.schema);
    assert!(!codes.contains(&"late".to_owned()) && codes.contains(&OTHER.to_owned()), "{codes:?}");
    // Each model's examples: fit labels from the censored view, validation from the cut-off.
    let cols = split.schema.kept_indices(&[]);
    let (fit, valid) = split.examples(Model::Binary, &cols, &config);
    // a: censored after >= 2 h, long; b: short; c: censored >= 2 h before the validation start.
    assert_eq!(fit.labels.len(), 60);
    assert_eq!(valid.labels.len(), 40);
    assert_eq!(valid.labels.iter().filter(|&&y| y > 0.5).count(), 20);
}

fn candidate(dropped: &[FeatureGroup], features: usize, auc: f64) -> FeatureCandidate {
    FeatureCandidate { dropped: dropped.to_vec(), features, auc, best_iteration: 10 }
}

#[test]
fn the_smallest_feature_set_within_the_tie_wins() {
    use FeatureGroup::{Tenant, Weekday};
    let all = candidate(&[], 15, 0.800);
    let no_weekday = candidate(&[Weekday], 14, 0.830);
    let no_tenant = candidate(&[Tenant], 8, 0.8285);
    let neither = candidate(&[Weekday, Tenant], 7, 0.8100);
    assert_eq!(choose_candidate(&[all.clone(), no_weekday.clone(), no_tenant.clone(), neither.clone()]), 2);
    // Beyond the tie, the better AUC wins even with more features.
    let no_tenant_worse = candidate(&[Tenant], 8, 0.8270);
    assert_eq!(choose_candidate(&[all.clone(), no_weekday, no_tenant_worse, neither]), 1);
    // Without any AUC (a validation split with one class), nothing is dropped.
    let unknown = [candidate(&[], 15, f64::NAN), candidate(&[Weekday], 14, f64::NAN)];
    assert_eq!(choose_candidate(&unknown), 0);
}

#[test]
fn candidates_skip_groups_the_schema_lacks() {
    let mut builder = SchemaBuilder::new(DAY, 2.0 * HOUR);
    let with_tenant = RequestFeatures { tenant_id: "t".into(), vm_type: "a".into(), ..RequestFeatures::default() };
    builder.observe(&with_tenant, Some(2.0));
    let schema = builder.build();
    assert_eq!(candidates(&schema, &FeatureChoice::Auto).len(), 8);
    let no_tenant = schema.without(&[FeatureGroup::Tenant, FeatureGroup::Job]);
    assert_eq!(
        candidates(&no_tenant, &FeatureChoice::Auto),
        [vec![], vec![FeatureGroup::Weekday]],
        "an absent group is never a candidate to drop"
    );
    let forced = FeatureChoice::Drop(vec![FeatureGroup::Tenant, FeatureGroup::Weekday, FeatureGroup::Tenant]);
    assert_eq!(candidates(&schema, &forced), [vec![FeatureGroup::Weekday, FeatureGroup::Tenant]]);
}

#[test]
fn validation_metrics_of_raw_scores() {
    // Multiclass log loss: uniform scores over 4 classes cost ln 4 whatever the label.
    let labelled = |labels: &[f32]| Examples { labels: labels.to_vec(), ..Examples::new(1) };
    let loss = Model::Multiclass.value(&[0.0; 8], &labelled(&[1.0, 3.0]), 4);
    assert!((loss - 4f64.ln()).abs() < 1e-12);
    assert_eq!(Model::Remaining.value(&[1.0, 3.0], &labelled(&[2.0, 2.0]), 1), 1.0);
    assert_eq!(Model::Binary.value(&[0.2, -1.0, 3.0], &labelled(&[0.0, 0.0, 1.0]), 1), 1.0);
    // Weighted: the second example counts three times.
    let weighted = Examples { weights: vec![1.0, 3.0], ..labelled(&[2.0, 2.0]) };
    assert_eq!(Model::Remaining.value(&[1.0, 4.0], &weighted, 1), (1.0 + 3.0 * 4.0) / 4.0);
    assert!(Model::Binary.better(0.8, 0.7) && Model::Remaining.better(0.7, 0.8));
    assert!(Model::Binary.better(0.5, f64::NAN) && !Model::Binary.better(f64::NAN, 0.5));
}

#[test]
fn hazard_rows_follow_each_vm_until_it_ends_or_is_censored() {
    let records = vec![
        vm("a", 0.0, Some(250.0)),   // ends in interval 2 ([200, 400))
        vm("b", 1.0, None),          // still running at the cut-off: censored after 299 s, in interval 2
        vm("c", 2.0, Some(5_000.0)), // outlives every edge
    ];
    let config = TrainConfig { survival_edges_s: vec![100.0, 200.0, 400.0], ..TrainConfig::default() };
    let schema = build_schema(&records, 300.0, &config);
    let replayed = replay(&records, &schema.encoder(), 300.0, 10_000.0, 300.0);
    let cols: Vec<usize> = (0..replayed.n_features).collect();
    let idx: Vec<usize> = (0..replayed.len()).collect();
    let full = hazard_examples(&replayed, &idx, &cols, &config, |i| replayed.full_label[i]);
    let interval = |e: &Examples, k: usize| e.row(k)[cols.len()];
    // a: survived 0 and 1, ended in 2; b (full data: never ends, censored at 9999 s): 3 survivals;
    // c: 3 survivals, and nothing past the last edge.
    assert_eq!(full.labels, [0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]);
    assert_eq!((0..9).map(|k| interval(&full, k)).collect::<Vec<_>>(), [0.0, 1.0, 2.0, 0.0, 1.0, 2.0, 0.0, 1.0, 2.0]);
    // As the training side sees it at 300 s: a ended (250 s); b and c are censored after about
    // 300 s: they count as alive through intervals 0 and 1, and say nothing of interval 2.
    let train = hazard_examples(&replayed, &idx, &cols, &config, |i| replayed.train_label[i]);
    assert_eq!(train.labels, [0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0]);
}

#[test]
fn crowded_intervals_are_sampled_and_weighted_and_sparse_ones_kept_whole() {
    // 2,000 VMs: all at risk in interval 0, half of them (those ending after 150 s) in 1.
    let records: Vec<VmRecord> =
        (0..2_000).map(|i| vm("D", f64::from(i), Some(f64::from(i) + 50.0 + f64::from(i % 2) * 200.0))).collect();
    let config = TrainConfig {
        survival_edges_s: vec![100.0, 200.0, 400.0],
        max_hazard_rows_per_interval: 500,
        ..TrainConfig::default()
    };
    let schema = build_schema(&records, 10_000.0, &config);
    let replayed = replay(&records, &schema.encoder(), 10_000.0, 10_000.0, 10_000.0);
    let cols: Vec<usize> = (0..replayed.n_features).collect();
    let idx: Vec<usize> = (0..replayed.len()).collect();
    let sampled = hazard_examples(&replayed, &idx, &cols, &config, |i| replayed.full_label[i]);
    let interval_input = cols.len();
    let sampled = &sampled;
    let in_interval = |j: usize| (0..sampled.labels.len()).filter(move |&k| sampled.row(k)[interval_input] == j as f64);
    // Interval 0: 2,000 at risk, rate 1/4; interval 1: 1,000 at risk, rate 1/2; interval 2: 1,000 at risk.
    for (j, at_risk) in [(0, 2_000.0), (1, 1_000.0), (2, 1_000.0)] {
        let kept = in_interval(j).count() as f64;
        let weight = sampled.weight(in_interval(j).next().unwrap());
        assert!((weight - at_risk / 500.0).abs() < 1e-6, "interval {j}: weight {weight}");
        assert!((kept * weight - at_risk).abs() < 0.15 * at_risk, "interval {j}: {kept} rows of weight {weight}");
    }
    // The weighted event rate of each interval is the full data's (half of the VMs end in 0, all
    // the rest in 2), within the sampling's noise.
    let rate = |j: usize| {
        let (events, total) = in_interval(j).fold((0.0, 0.0), |(e, t), k| {
            (e + sampled.weight(k) * f64::from(sampled.labels[k]), t + sampled.weight(k))
        });
        events / total
    };
    assert!((rate(0) - 0.5).abs() < 0.06 && rate(1) == 0.0 && rate(2) == 1.0, "{} {} {}", rate(0), rate(1), rate(2));
    // Without a cap in the way, every row is kept with weight 1.
    let whole =
        hazard_examples(&replayed, &idx, &cols, &TrainConfig { max_hazard_rows_per_interval: 10_000, ..config }, |i| {
            replayed.full_label[i]
        });
    assert_eq!(whole.labels.len(), 2_000 + 1_000 + 1_000);
    assert!(whole.weights.iter().all(|&w| w == 1.0));
}

#[test]
fn auto_serves_the_reading_that_ranks_the_long_lived_exits_best() {
    let candidate = |k: usize, request: f64, threshold: f64| ReadingCandidate {
        reading: READING_CANDIDATES[k].to_string(),
        long_vms: 10,
        c_long_at_request: request,
        c_long_at_threshold: threshold,
    };
    // The mean of the two columns decides: the third candidate's 0.65 beats the second's 0.6.
    let readings =
        [candidate(0, 0.5, 0.5), candidate(1, 0.55, 0.65), candidate(2, 0.6, 0.7), candidate(3, f64::NAN, 0.9)];
    assert_eq!(best_ranked_reading(&readings), READING_CANDIDATES[2]);
    assert_eq!(best_ranked_reading(&[]), LifetimeReading::default(), "nothing measured: the median");
    assert_eq!("auto".parse::<ServedReading>(), Ok(ServedReading::BestRanked));
    assert_eq!("geomean".parse::<ServedReading>(), Ok(ServedReading::Fixed(LifetimeReading::GeometricMean)));
    assert!("mode".parse::<ServedReading>().unwrap_err().contains("or auto"));
}

#[test]
fn exit_time_report_by_hand() {
    let hour = HOUR;
    // Lifetimes 1 h, 3 h, 5 h (censored), 10 h; predicted log10 lifetimes.
    let observed = [hour, 3.0 * hour, 5.0 * hour, 10.0 * hour];
    let completed = [true, true, false, true];
    let predicted = [(2.0 * hour).log10(), (3.0 * hour).log10(), (20.0 * hour).log10(), (4.0 * hour).log10()];
    let report = exit_time_report(&predicted, &observed, &completed, 2.0 * hour);
    assert_eq!(report.vms, 4);
    // All: comparable pairs (1,3) (1,5) (1,10) (3,5) (3,10) = 5, all concordant.
    assert_eq!(report.c_index, 1.0);
    // Long (>= 2 h): 3 h, 5 h (censored), 10 h: pairs (3,5) (3,10), concordant.
    assert_eq!((report.long_vms, report.c_index_long), (3, 1.0));
    // Completed long: 3 h (exact) and 10 h (predicted 4 h).
    assert_eq!(report.completed_long_vms, 2);
    assert!((report.mae_log10_long - (10f64 / 4.0).log10() / 2.0).abs() < 1e-12);
}
