//! The bundle's report: each model evaluated on the held-out test period (the survival model's
//! exit-time quality, the classifier's, the interval model's and the remaining-lifetime regression's).

use super::*;

/// Fewest VMs at risk in a survival interval for the trainer to keep it.
pub const MIN_AT_RISK: usize = 200;

/// Ages at which the report measures the remaining lifetime (besides the request time).
pub const REPORT_AGES_S: [f64; 2] = [2.0 * HOUR, DAY];

/// Horizons of the calibration of `P(T > age + t | T > age)`.
pub const CALIBRATION_HORIZONS_S: [f64; 3] = [HOUR, DAY, 7.0 * DAY];

/// The survival model on the held-out period: concordance of its reading at request time and at
/// later ages (beside the remaining-lifetime regression on the same VMs), integrated Brier score
/// against a featureless Kaplan-Meier curve of the training period, and calibration.
pub(super) fn evaluate_survival(
    replayed: &ReplayedTrace,
    train_idx: &[usize],
    eval_idx: &[usize],
    hazards: &TreeEnsemble,
    spec: &SurvivalSpec,
    regression: &TreeEnsemble,
    config: &TrainConfig,
) -> SurvivalReport {
    let edges = &spec.edges_s;
    let curves: Vec<Vec<f64>> =
        eval_idx.iter().map(|&i| survival_curve(hazards, replayed.row(i), edges.len())).collect();
    let curve = |k: usize| SurvivalCurve { edges_s: edges, survival: &curves[k] };
    let observed: Vec<f64> = eval_idx.iter().map(|&i| replayed.full_label[i].seconds).collect();
    let completed: Vec<bool> = eval_idx.iter().map(|&i| !replayed.full_label[i].censored).collect();
    let censoring = KaplanMeier::new(&observed, &completed.iter().map(|&c| !c).collect::<Vec<_>>());
    // Uno's weights blow up where hardly any VM is still observed: stop where G falls below 0.1.
    let tau_s = {
        let mut sorted: Vec<f64> = observed.iter().zip(&completed).filter(|(_, &c)| c).map(|(&t, _)| t).collect();
        sorted.sort_by(f64::total_cmp);
        let last = sorted.iter().rev().find(|&&t| censoring.before(t) >= 0.1).copied().unwrap_or(f64::INFINITY);
        last.min(config.remaining_cap_s)
    };
    let cap = config.remaining_cap_s;
    let regression_at = |k: usize, age: f64| {
        let mut row = replayed.row(eval_idx[k]).to_vec();
        row.push(encode_uptime(age));
        10f64.powf(regression.predict(&row)).clamp(1.0, cap)
    };
    let concordance = |members: &[usize], predict: &dyn Fn(usize) -> f64| {
        let predicted: Vec<f64> = members.iter().map(|&k| predict(k)).collect();
        let obs: Vec<f64> = members.iter().map(|&k| observed[k]).collect();
        let done: Vec<bool> = members.iter().map(|&k| completed[k]).collect();
        Concordance {
            vms: members.len(),
            harrell: harrell_c(&predicted, &obs, &done),
            uno: uno_c(&predicted, &obs, &done, tau_s),
        }
    };
    let at_age = |members: &[usize], age: f64| AgeConcordance {
        age_s: age,
        survival: concordance(members, &|k| curve(k).remaining_s(age, spec.reading).min(cap)),
        regression: concordance(members, &|k| regression_at(k, age)),
    };
    let everyone: Vec<usize> = (0..eval_idx.len()).collect();
    let alive_at = |age: f64| everyone.iter().copied().filter(|&k| observed[k] >= age).collect::<Vec<_>>();
    let all = at_age(&everyone, 0.0);
    let long = at_age(&alive_at(config.long_threshold_s), 0.0);
    let by_age = REPORT_AGES_S.iter().map(|&age| at_age(&alive_at(age), age)).collect();

    // P(long) off the distribution, on the VMs whose class is known.
    let (scores, labels): (Vec<f64>, Vec<bool>) = eval_idx
        .iter()
        .enumerate()
        .filter_map(|(k, &i)| {
            replayed.full_label[i]
                .at_least(config.long_threshold_s)
                .map(|long| (curve(k).at(config.long_threshold_s), long))
        })
        .unzip();
    let auc_p_long = Scored::new(&scores, &labels).roc_auc();

    // Integrated Brier score over an even grid of (0, horizon].
    let horizon = tau_s.min(7.0 * DAY);
    let train_observed: Vec<f64> = train_idx.iter().map(|&i| replayed.train_label[i].seconds).collect();
    let train_events: Vec<bool> = train_idx.iter().map(|&i| !replayed.train_label[i].censored).collect();
    let marginal = KaplanMeier::new(&train_observed, &train_events);
    const BRIER_POINTS: usize = 100;
    let (mut model_sum, mut marginal_sum) = (0.0, 0.0);
    let mut predicted = vec![0.0; eval_idx.len()];
    for p in 1..=BRIER_POINTS {
        let t = horizon * p as f64 / BRIER_POINTS as f64;
        for (k, value) in predicted.iter_mut().enumerate() {
            *value = curve(k).at(t);
        }
        model_sum += brier_at(&predicted, &observed, &completed, &censoring, t);
        predicted.fill(marginal.at(t));
        marginal_sum += brier_at(&predicted, &observed, &completed, &censoring, t);
    }

    // Calibration: among the VMs alive at each age, predicted against Kaplan-Meier survival.
    let mut calibration = Vec::new();
    for age in std::iter::once(0.0).chain(REPORT_AGES_S) {
        let members = alive_at(age);
        let residual: Vec<f64> = members.iter().map(|&k| observed[k] - age).collect();
        let events: Vec<bool> = members.iter().map(|&k| completed[k]).collect();
        let km = KaplanMeier::new(&residual, &events);
        for t in CALIBRATION_HORIZONS_S {
            let mean = members
                .iter()
                .map(|&k| {
                    let c = curve(k);
                    let alive = c.at(age);
                    if alive > 0.0 {
                        c.at(age + t) / alive
                    } else {
                        0.0
                    }
                })
                .sum::<f64>()
                / members.len().max(1) as f64;
            calibration.push(CalibrationPoint {
                age_s: age,
                t_s: t,
                vms: members.len(),
                predicted: mean,
                observed: km.at(t),
            });
        }
    }
    let readings = READING_CANDIDATES
        .iter()
        .map(|&reading| reading_candidate(reading, edges, &curves, &observed, &completed, config))
        .collect();
    SurvivalReport {
        readings,
        reading: spec.reading.to_string(),
        intervals: edges.len(),
        auc_p_long,
        p_long_from_survival: spec.p_long_from_survival,
        tau_s,
        all,
        long,
        by_age,
        integrated_brier: model_sum / BRIER_POINTS as f64,
        integrated_brier_marginal: marginal_sum / BRIER_POINTS as f64,
        brier_horizon_s: horizon,
        calibration,
    }
}

pub(super) fn evaluate_binary(
    replayed: &ReplayedTrace,
    eval_idx: &[usize],
    model: &TreeEnsemble,
    threshold_s: f64,
    decision_threshold: f64,
) -> BinaryReport {
    let (scores, labels): (Vec<f64>, Vec<bool>) = eval_idx
        .iter()
        .filter_map(|&i| {
            replayed.full_label[i].at_least(threshold_s).map(|long| (model.predict(replayed.row(i)), long))
        })
        .unzip();
    let scored = Scored::new(&scores, &labels);
    let confusion = scored.confusion_at(decision_threshold);
    BinaryReport {
        examples: scored.len(),
        long_share: scored.positives() as f64 / scored.len().max(1) as f64,
        auc: scored.roc_auc(),
        average_precision: scored.average_precision(),
        decision_threshold,
        f1: confusion.f1(),
        precision: confusion.precision(),
        recall: confusion.recall(),
        precision_at_recall: RECALL_LEVELS.iter().map(|&r| (r, scored.precision_at_recall(r))).collect(),
        confusion,
        roc: scored.roc_curve(200),
    }
}

pub(super) fn evaluate_multiclass(
    replayed: &ReplayedTrace,
    eval_idx: &[usize],
    model: &TreeEnsemble,
    cutoffs: &[f64],
) -> MulticlassReport {
    let mut probabilities = vec![0.0; model.num_outputs()];
    let (mut examples, mut exact, mut near) = (0usize, 0usize, 0usize);
    for &i in eval_idx {
        let Some(truth) = replayed.full_label[i].interval_class(cutoffs) else { continue };
        model.predict_into(replayed.row(i), &mut probabilities);
        let predicted = lifetime_model::argmax(&probabilities);
        examples += 1;
        exact += usize::from(predicted == truth);
        near += usize::from(predicted.abs_diff(truth) <= 1);
    }
    MulticlassReport {
        examples,
        classes: cutoffs.len() + 1,
        accuracy: exact as f64 / examples.max(1) as f64,
        within_one_class: near as f64 / examples.max(1) as f64,
    }
}

pub(super) fn evaluate_remaining(
    replayed: &ReplayedTrace,
    eval_idx: &[usize],
    model: &TreeEnsemble,
    config: &TrainConfig,
) -> RemainingReport {
    let all_cols: Vec<usize> = (0..replayed.n_features).collect();
    let Examples { rows, labels, n_features: n, .. } =
        remaining_examples(replayed, eval_idx, &all_cols, config, |i| replayed.full_label[i]);
    let mae = rows.chunks(n).zip(&labels).map(|(row, &y)| (model.predict(row) - f64::from(y)).abs()).sum::<f64>()
        / labels.len().max(1) as f64;

    // Reprediction curve over completed VMs: at uptime k/20 of its lifetime, does the VM live beyond
    // the threshold (uptime + predicted remaining >= threshold)?
    let completed: Vec<(usize, f64)> = eval_idx
        .iter()
        .filter(|&&i| !replayed.full_label[i].censored)
        .map(|&i| (i, replayed.full_label[i].seconds))
        .collect();
    let mut curves = Vec::new();
    for threshold in [config.long_threshold_s, config.remaining_cap_s] {
        let positives = completed.iter().filter(|(_, life)| *life >= threshold).count();
        if positives == 0 {
            continue; // the data cannot tell (e.g. no VM lives a week within the trace)
        }
        let mut row = Vec::with_capacity(n);
        let f1_by_quantile = (0..REPREDICTION_QUANTILES)
            .map(|k| {
                let fraction = k as f64 / REPREDICTION_QUANTILES as f64;
                let pairs = completed.iter().map(|&(i, life)| {
                    let uptime = fraction * life;
                    row.clear();
                    row.extend_from_slice(replayed.row(i));
                    row.push((1.0 + uptime).log10());
                    let predicted_total = uptime + 10f64.powf(model.predict(&row));
                    (predicted_total >= threshold, life >= threshold)
                });
                lifetime_model::metrics::Confusion::from_pairs(pairs.collect::<Vec<_>>()).f1()
            })
            .collect();
        curves.push(RepredictionCurve { threshold_s: threshold, positives, vms: completed.len(), f1_by_quantile });
    }
    RemainingReport { examples: labels.len(), mae_log10: mae, curves }
}

/// Exit-time quality of the predicted lifetime (remaining lifetime at uptime 0, capped as served)
/// over the held-out VMs, with their full labels.
pub(super) fn evaluate_exit_time(
    replayed: &ReplayedTrace,
    eval_idx: &[usize],
    model: &TreeEnsemble,
    config: &TrainConfig,
) -> ExitTimeReport {
    let max_log10 = config.remaining_cap_s.log10();
    let mut row = Vec::with_capacity(replayed.n_features + 1);
    let mut predicted = Vec::with_capacity(eval_idx.len());
    let mut observed = Vec::with_capacity(eval_idx.len());
    let mut completed = Vec::with_capacity(eval_idx.len());
    for &i in eval_idx {
        row.clear();
        row.extend_from_slice(replayed.row(i));
        row.push(encode_uptime(0.0));
        predicted.push(model.predict(&row).clamp(0.0, max_log10));
        let label = replayed.full_label[i];
        observed.push(label.seconds);
        completed.push(!label.censored);
    }
    exit_time_report(&predicted, &observed, &completed, config.long_threshold_s)
}

/// [`ExitTimeReport`] of predicted log10 lifetimes against observed lifetimes in seconds.
pub(super) fn exit_time_report(
    predicted_log10: &[f64],
    observed: &[f64],
    completed: &[bool],
    threshold_s: f64,
) -> ExitTimeReport {
    let long: Vec<usize> = (0..observed.len()).filter(|&i| observed[i] >= threshold_s).collect();
    let pick = |values: &[f64]| long.iter().map(|&i| values[i]).collect::<Vec<_>>();
    let long_completed: Vec<bool> = long.iter().map(|&i| completed[i]).collect();
    let errors: Vec<f64> = long
        .iter()
        .filter(|&&i| completed[i])
        .map(|&i| (predicted_log10[i] - observed[i].max(1.0).log10()).abs())
        .collect();
    ExitTimeReport {
        vms: observed.len(),
        c_index: harrell_c(predicted_log10, observed, completed),
        long_vms: long.len(),
        c_index_long: harrell_c(&pick(predicted_log10), &pick(observed), &long_completed),
        completed_long_vms: errors.len(),
        mae_log10_long: if errors.is_empty() { f64::NAN } else { errors.iter().sum::<f64>() / errors.len() as f64 },
    }
}
