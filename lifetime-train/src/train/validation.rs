//! The choices made on the training period's validation split: feature groups, each model's
//! rounds (early stopping) and the survival model's served reading.

use super::*;

/// The VMs of the training period replayed for validation: `fit` arrived before `valid_from_s` and
/// carry labels censored there; `valid` arrived from then to the cut-off and carry labels censored
/// at the cut-off. Categories are ranked on the fit part only, so no validation lifetime shapes the
/// encoding either.
pub(super) struct ValidationSplit {
    pub valid_from_s: f64,
    pub schema: FeatureSchema,
    pub replayed: ReplayedTrace,
    pub fit: Vec<usize>,
    pub valid: Vec<usize>,
}

impl ValidationSplit {
    /// `training` must hold only VMs that arrived before `cutoff_s`, sorted by arrival.
    pub fn new(training: &[VmRecord], valid_from_s: f64, cutoff_s: f64, config: &TrainConfig) -> Self {
        debug_assert!(training.iter().all(|r| r.start_s < cutoff_s));
        let fit_count = training.partition_point(|r| r.start_s < valid_from_s);
        let schema = build_schema(&training[..fit_count], valid_from_s, config);
        // Training labels censored at the validation start, full labels at the cut-off.
        let replayed = replay(training, &schema.encoder(), valid_from_s, cutoff_s, valid_from_s);
        let (fit, valid) = (0..replayed.len()).partition(|&i| replayed.start_s[i] < valid_from_s);
        ValidationSplit { valid_from_s, schema, replayed, fit, valid }
    }

    pub(super) fn examples(&self, model: Model, cols: &[usize], config: &TrainConfig) -> (Examples, Examples) {
        let r = &self.replayed;
        (
            examples(model, r, &self.fit, cols, config, |i| r.train_label[i]),
            examples(model, r, &self.valid, cols, config, |i| r.full_label[i]),
        )
    }
}

/// A feature schema from the VMs `records`, with labels censored at `censor_at_s`.
pub(super) fn build_schema(records: &[VmRecord], censor_at_s: f64, config: &TrainConfig) -> FeatureSchema {
    let mut builder = SchemaBuilder::new(config.history_window_s, config.long_threshold_s);
    for record in records {
        let observed = ObservedLifetime::of(record, censor_at_s);
        builder.observe(&RequestFeatures::from(record), Some(observed.seconds.max(1.0).log10()));
    }
    builder.build()
}

/// The best round of a model on validation examples.
pub(super) struct Best {
    /// Rounds (1-based); 0 when there were too few validation examples to tell.
    pub(super) iteration: usize,
    pub(super) value: f64,
    /// Probabilities at the best round (long-lived model only), for the decision threshold.
    pub(super) scores: Vec<f64>,
    /// The validation model, cut to its best round (hazard model only, to read P(long) off it).
    pub(super) ensemble: Option<TreeEnsemble>,
}

/// Trains `model` on `fit` with early stopping on `valid`, and reads its best round off the
/// validation curve (computed here: LightGBM keeps every round when early stopping never fires).
pub(super) fn best_rounds(
    model: Model,
    fit: &Examples,
    valid: &Examples,
    config: &TrainConfig,
) -> Result<Best, TrainError> {
    if fit.labels.len() < 50 {
        return Err(TrainError::NotEnoughData(format!("only {} labelled fitting examples", fit.labels.len())));
    }
    if valid.labels.len() < MIN_VALIDATION_EXAMPLES {
        return Ok(Best { iteration: 0, value: f64::NAN, scores: Vec::new(), ensemble: None });
    }
    let train = fit.dataset(None)?;
    let validation = valid.dataset(Some(&train))?;
    let parameters = params(
        &model.params(config),
        json!({"num_iterations": model.max_rounds(config), "early_stopping_rounds": config.early_stopping_rounds}),
    );
    let booster = Booster::train_with_valid(train, Some(validation), &parameters)?;
    let ensemble = TreeEnsemble::from_lightgbm_text(&booster.save_string()?)?;
    let mut best = validation_curve_best(model, &ensemble, valid);
    if model == Model::Hazard && best.iteration > 0 {
        best.ensemble = Some(ensemble.truncated(best.iteration * ensemble.num_outputs()));
    }
    Ok(best)
}

/// Sums the ensemble's trees round by round over `valid` and keeps the best round.
pub(super) fn validation_curve_best(model: Model, ensemble: &TreeEnsemble, valid: &Examples) -> Best {
    let k = ensemble.num_outputs();
    let rounds = ensemble.num_trees() / k.max(1);
    let mut raw = vec![0.0; valid.labels.len() * k];
    let mut best = Best { iteration: 0, value: f64::NAN, scores: Vec::new(), ensemble: None };
    for round in 0..rounds {
        for class in 0..k {
            let tree = round * k + class;
            for (r, score) in raw.iter_mut().skip(class).step_by(k).enumerate() {
                *score += ensemble.tree_value(tree, valid.row(r));
            }
        }
        let value = model.value(&raw, valid, k);
        if best.iteration == 0 || model.better(value, best.value) {
            best.iteration = round + 1;
            best.value = value;
            if model == Model::Binary {
                let transform: OutputTransform = ensemble.output_transform();
                best.scores = raw.iter().map(|&x| transform.apply(x)).collect();
            }
        }
    }
    best
}

/// The candidate feature sets (as dropped groups): every subset of the groups the schema has,
/// dropping none first.
pub(super) fn candidates(schema: &FeatureSchema, choice: &FeatureChoice) -> Vec<Vec<FeatureGroup>> {
    match choice {
        FeatureChoice::Auto => {
            let present = schema.groups();
            (0..1u32 << present.len())
                .map(|mask| present.iter().enumerate().filter(|(i, _)| mask >> i & 1 == 1).map(|(_, g)| *g).collect())
                .collect()
        }
        FeatureChoice::Drop(groups) => {
            let mut groups = groups.clone();
            groups.sort();
            groups.dedup();
            vec![groups]
        }
    }
}

/// Index of the chosen candidate: the fewest features among those within [`AUC_TIE`] of the best
/// validation AUC (higher AUC first among equally small ones); the first candidate when no AUC is
/// known.
pub(super) fn choose_candidate(candidates: &[FeatureCandidate]) -> usize {
    let best = candidates.iter().map(|c| c.auc).filter(|a| a.is_finite()).fold(f64::NEG_INFINITY, f64::max);
    if !best.is_finite() {
        return 0;
    }
    candidates
        .iter()
        .enumerate()
        .filter(|(_, c)| c.auc >= best - AUC_TIE)
        .min_by(|a, b| a.1.features.cmp(&b.1.features).then(b.1.auc.total_cmp(&a.1.auc)))
        .map_or(0, |(i, _)| i)
}

/// What the validation split decided.
pub(super) struct Validated {
    pub(super) report: ValidationReport,
    pub(super) decision_threshold: f64,
}

/// Chooses the feature groups and the three models' rounds on the validation split.
pub(super) fn validate(
    split: &ValidationSplit,
    config: &TrainConfig,
    progress: &dyn Progress,
) -> Result<Validated, TrainError> {
    let sets = candidates(&split.schema, &config.features);
    let mut tried = Vec::new();
    let mut bests = Vec::new();
    for (k, dropped) in sets.iter().enumerate() {
        progress.stage(&format!("validation: feature set {} of {} (long-lived classifier)", k + 1, sets.len()));
        let cols = split.schema.kept_indices(dropped);
        let (fit, valid) = split.examples(Model::Binary, &cols, config);
        let best = best_rounds(Model::Binary, &fit, &valid, config)?;
        tried.push(FeatureCandidate {
            dropped: dropped.clone(),
            features: cols.len(),
            auc: best.value,
            best_iteration: best.iteration,
        });
        bests.push((best, valid));
    }
    let chosen = choose_candidate(&tried);
    let dropped = tried[chosen].dropped.clone();
    let cols = split.schema.kept_indices(&dropped);
    let (binary_best, binary_valid) = bests.swap_remove(chosen);
    let decision_threshold = if binary_best.scores.is_empty() {
        0.5
    } else {
        let labels: Vec<bool> = binary_valid.labels.iter().map(|&y| y > 0.5).collect();
        Scored::new(&binary_best.scores, &labels).best_f1_threshold().0
    };
    let rounds = |model: Model, best: &Best, examples: usize| ModelRounds {
        metric: model.metric().to_owned(),
        validation_examples: examples,
        best_iteration: best.iteration,
        best_value: best.value,
        rounds: if best.iteration == 0 {
            model.max_rounds(config)
        } else {
            best.iteration.max(config.min_rounds).min(model.max_rounds(config))
        },
    };
    let binary = rounds(Model::Binary, &binary_best, binary_valid.labels.len());
    let mut others = Vec::new();
    for (model, what) in
        [(Model::Multiclass, "lifetime-interval classifier"), (Model::Remaining, "remaining-lifetime model")]
    {
        progress.stage(&format!("validation: rounds of the {what}"));
        let (fit, valid) = split.examples(model, &cols, config);
        let best = best_rounds(model, &fit, &valid, config)?;
        others.push(rounds(model, &best, valid.labels.len()));
    }
    let remaining = others.pop().unwrap_or_else(|| unreachable!("two models were validated"));
    let multiclass = others.pop().unwrap_or_else(|| unreachable!("two models were validated"));
    let (mut hazard, mut survival_auc, mut readings) = (None, None, Vec::new());
    if !config.survival_edges_s.is_empty() {
        progress.stage("validation: rounds of the survival model");
        let (fit, valid) = split.examples(Model::Hazard, &cols, config);
        let best = best_rounds(Model::Hazard, &fit, &valid, config)?;
        hazard = Some(rounds(Model::Hazard, &best, valid.labels.len()));
        if let Some(ensemble) = &best.ensemble {
            let edges = &config.survival_edges_s;
            let r = &split.replayed;
            let curves: Vec<Vec<f64>> = split
                .valid
                .iter()
                .map(|&i| {
                    let row: Vec<f64> = cols.iter().map(|&c| r.row(i)[c]).collect();
                    survival_curve(ensemble, &row, edges.len())
                })
                .collect();
            // P(long) read off the curves, on the validation VMs whose class is known (the
            // classifier's validation examples).
            let (scores, labels): (Vec<f64>, Vec<bool>) = split
                .valid
                .iter()
                .zip(&curves)
                .filter_map(|(&i, curve)| {
                    let threshold = config.long_threshold_s;
                    let long = r.full_label[i].at_least(threshold)?;
                    Some((SurvivalCurve { edges_s: edges, survival: curve }.at(threshold), long))
                })
                .unzip();
            survival_auc = Some(Scored::new(&scores, &labels).roc_auc());
            let observed: Vec<f64> = split.valid.iter().map(|&i| r.full_label[i].seconds).collect();
            let completed: Vec<bool> = split.valid.iter().map(|&i| !r.full_label[i].censored).collect();
            readings = READING_CANDIDATES
                .iter()
                .map(|&reading| reading_candidate(reading, edges, &curves, &observed, &completed, config))
                .collect();
        }
    }
    Ok(Validated {
        report: ValidationReport {
            valid_from_s: split.valid_from_s,
            fit_vms: split.fit.len(),
            validation_vms: split.valid.len(),
            features: FeatureSelection {
                forced: matches!(config.features, FeatureChoice::Drop(_)),
                candidates: tried,
                dropped,
            },
            binary,
            multiclass,
            remaining,
            hazard,
            survival_auc,
            readings,
        },
        decision_threshold,
    })
}

/// Which reading a bundle serves.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ServedReading {
    Fixed(LifetimeReading),
    /// The candidate ([`READING_CANDIDATES`]) that orders the validation split's long-lived VMs'
    /// exits best: the highest mean of Harrell's C at request time and at the threshold.
    BestRanked,
}

impl ServedReading {
    /// The reading, when it is not chosen on validation.
    pub fn fixed(self) -> Option<LifetimeReading> {
        match self {
            ServedReading::Fixed(reading) => Some(reading),
            ServedReading::BestRanked => None,
        }
    }
}

/// `auto` ([`ServedReading::BestRanked`]) or a reading ([`LifetimeReading`]'s syntax).
impl std::str::FromStr for ServedReading {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        if text.trim() == "auto" {
            return Ok(ServedReading::BestRanked);
        }
        text.parse().map(ServedReading::Fixed).map_err(|e| format!("{e}, or auto"))
    }
}

/// The candidate reading whose validation C (mean of request time and the threshold) is highest;
/// the median when none could be measured.
pub(super) fn best_ranked_reading(readings: &[ReadingCandidate]) -> LifetimeReading {
    let score = |r: &ReadingCandidate| (r.c_long_at_request + r.c_long_at_threshold) / 2.0;
    readings
        .iter()
        .zip(READING_CANDIDATES)
        .filter(|(r, _)| score(r).is_finite())
        .max_by(|a, b| score(a.0).total_cmp(&score(b.0)))
        .map_or(LifetimeReading::default(), |(_, reading)| reading)
}

/// The readings of the lifetime distribution the validation split compares.
pub const READING_CANDIDATES: [LifetimeReading; 8] = [
    LifetimeReading::Quantile { q: 0.25 },
    LifetimeReading::Quantile { q: 0.5 },
    LifetimeReading::Quantile { q: 0.75 },
    LifetimeReading::Quantile { q: 0.9 },
    LifetimeReading::TruncatedMean { horizon_s: DAY },
    LifetimeReading::TruncatedMean { horizon_s: 3.0 * DAY },
    LifetimeReading::TruncatedMean { horizon_s: 7.0 * DAY },
    LifetimeReading::GeometricMean,
];

/// How well `reading` of the `curves` orders the exits of the VMs that live past the long-lived
/// threshold: at request time, and repredicted at that age.
pub(super) fn reading_candidate(
    reading: LifetimeReading,
    edges: &[f64],
    curves: &[Vec<f64>],
    observed: &[f64],
    completed: &[bool],
    config: &TrainConfig,
) -> ReadingCandidate {
    let age = config.long_threshold_s;
    let long: Vec<usize> = (0..observed.len()).filter(|&k| observed[k] >= age).collect();
    let c_at = |at: f64| {
        let predicted: Vec<f64> = long
            .iter()
            .map(|&k| {
                SurvivalCurve { edges_s: edges, survival: &curves[k] }
                    .remaining_s(at, reading)
                    .min(config.remaining_cap_s)
            })
            .collect();
        let obs: Vec<f64> = long.iter().map(|&k| observed[k]).collect();
        let done: Vec<bool> = long.iter().map(|&k| completed[k]).collect();
        harrell_c(&predicted, &obs, &done)
    };
    ReadingCandidate {
        reading: reading.to_string(),
        long_vms: long.len(),
        c_long_at_request: c_at(0.0),
        c_long_at_threshold: c_at(age),
    }
}
