//! Gains over the baseline, paired by seed, and the table's rows: means over seeds with their spread and the kept share of the oracle's gain.

use super::*;

/// Figures of one run against the baseline, in percentage points of the baseline's figures.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Gain {
    pub label: String,
    pub seed: u64,
    pub packing_density_pct: f64,
    pub packing_density_gain_pp: f64,
    /// Relative gain in packing density, percent of the baseline's.
    pub packing_density_gain_rel_pct: f64,
    pub empty_hosts_pct: f64,
    pub empty_hosts_gain_pp: f64,
}

/// The mean of one figure over seeds, and its spread.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Spread {
    pub mean: f64,
    /// Sample standard deviation (0 for one value).
    pub sd: f64,
    pub min: f64,
    pub max: f64,
}

impl Spread {
    /// The spread of `values` (all zero for none).
    pub fn of(values: &[f64]) -> Spread {
        if values.is_empty() {
            return Spread::default();
        }
        let n = values.len() as f64;
        let mean = values.iter().sum::<f64>() / n;
        let sd = if values.len() > 1 {
            (values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (n - 1.0)).sqrt()
        } else {
            0.0
        };
        let min = values.iter().copied().fold(f64::INFINITY, f64::min);
        let max = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        Spread { mean, sd, min, max }
    }
}

/// A share of an oracle's gain that a row keeps: its mean gain over the oracle run's mean gain, in
/// percent (`None` where the oracle gains nothing, so that there is nothing to keep).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Kept {
    pub packing_density_pct: Option<f64>,
    pub empty_hosts_pct: Option<f64>,
}

impl Kept {
    fn of(row: &Row, oracle: &Row) -> Kept {
        let share = |gain: f64, possible: f64| (possible > 0.0).then(|| 100.0 * gain / possible);
        Kept {
            packing_density_pct: share(row.packing_density_gain_pp.mean, oracle.packing_density_gain_pp.mean),
            empty_hosts_pct: share(row.empty_hosts_gain_pp.mean, oracle.empty_hosts_gain_pp.mean),
        }
    }
}

/// The realized quality of a row's runs over seeds (a figure is absent when a run lacks it).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct QualitySpread {
    /// VMs whose outcome resolved.
    pub resolved: Spread,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub precision: Option<Spread>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recall: Option<Spread>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub roc_auc: Option<Spread>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub average_precision: Option<Spread>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub realized_long_share: Option<Spread>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub predicted_long_share: Option<Spread>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mean_p_long: Option<Spread>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lifetime_log10_mae: Option<Spread>,
}

impl QualitySpread {
    /// The spread of the runs' qualities; `None` when a run has none.
    fn of(runs: &[&CompareRun]) -> Option<QualitySpread> {
        let figures: Vec<&QualityFigures> =
            runs.iter().map(|r| r.result.quality.as_ref().map(|q| &q.figures)).collect::<Option<_>>()?;
        if figures.is_empty() {
            return None;
        }
        let of = |f: &dyn Fn(&QualityFigures) -> Option<f64>| {
            figures.iter().map(|q| f(q)).collect::<Option<Vec<f64>>>().map(|v| Spread::of(&v))
        };
        Some(QualitySpread {
            resolved: Spread::of(&figures.iter().map(|q| q.resolved as f64).collect::<Vec<_>>()),
            precision: of(&|q| q.precision),
            recall: of(&|q| q.recall),
            roc_auc: of(&|q| q.roc_auc),
            average_precision: of(&|q| q.average_precision),
            realized_long_share: of(&|q| q.realized_long_share),
            predicted_long_share: of(&|q| q.predicted_long_share),
            mean_p_long: of(&|q| q.mean_p_long),
            lifetime_log10_mae: of(&|q| q.lifetime_log10_mae),
        })
    }
}

/// One row of the table: a cell of the matrix over all the seeds.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Row {
    #[serde(flatten)]
    pub cell: Cell,
    pub seeds: Vec<u64>,
    pub packing_density_pct: Spread,
    pub empty_hosts_pct: Spread,
    /// Paired gains: each seed's run against the baseline's run with the same seed.
    pub packing_density_gain_pp: Spread,
    pub packing_density_gain_rel_pct: Spread,
    pub empty_hosts_gain_pp: Spread,
    pub rejected: Spread,
    /// The share of the `oracle_reference` run's gain that this row keeps.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kept_of_reference: Option<Kept>,
    /// The share of the gain of the same policy with the `oracle_prediction`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kept_of_own_oracle: Option<Kept>,
    /// The realized quality of the predictions its VMs were placed with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quality: Option<QualitySpread>,
}

/// Gains of every run over the baseline's run with the same seed (runs whose seed the baseline
/// did not run with are left out).
pub fn gains(runs: &[CompareRun], baseline: &str) -> Vec<Gain> {
    runs.iter()
        .filter_map(|r| {
            let base =
                runs.iter().find(|b| b.plan.cell.label == baseline && b.plan.config.seed == r.plan.config.seed)?;
            let base_density = 100.0 * base.result.metrics.packing_density;
            let base_empty = base.result.metrics.empty_hosts_pct;
            let density = 100.0 * r.result.metrics.packing_density;
            let empty = r.result.metrics.empty_hosts_pct;
            Some(Gain {
                label: r.plan.cell.label.clone(),
                seed: r.plan.config.seed,
                packing_density_pct: density,
                packing_density_gain_pp: density - base_density,
                packing_density_gain_rel_pct: if base_density > 0.0 {
                    100.0 * (density - base_density) / base_density
                } else {
                    0.0
                },
                empty_hosts_pct: empty,
                empty_hosts_gain_pp: empty - base_empty,
            })
        })
        .collect()
}

/// The rows of the table: each label's runs over the seeds, in plan order, with the kept shares.
pub fn rows(experiment: &Experiment, runs: &[CompareRun], gains: &[Gain]) -> Vec<Row> {
    let mut rows: Vec<Row> = Vec::new();
    for run in runs {
        if rows.iter().any(|row| row.cell.label == run.plan.cell.label) {
            continue;
        }
        let mine: Vec<&Gain> = gains.iter().filter(|g| g.label == run.plan.cell.label).collect();
        let of = |f: &dyn Fn(&Gain) -> f64| Spread::of(&mine.iter().map(|g| f(g)).collect::<Vec<_>>());
        let same: Vec<&CompareRun> = runs.iter().filter(|r| r.plan.cell.label == run.plan.cell.label).collect();
        let rejected: Vec<f64> = same.iter().map(|r| r.result.counters.rejected as f64).collect();
        rows.push(Row {
            cell: run.plan.cell.clone(),
            seeds: mine.iter().map(|g| g.seed).collect(),
            packing_density_pct: of(&|g| g.packing_density_pct),
            empty_hosts_pct: of(&|g| g.empty_hosts_pct),
            packing_density_gain_pp: of(&|g| g.packing_density_gain_pp),
            packing_density_gain_rel_pct: of(&|g| g.packing_density_gain_rel_pct),
            empty_hosts_gain_pp: of(&|g| g.empty_hosts_gain_pp),
            rejected: Spread::of(&rejected),
            kept_of_reference: None,
            kept_of_own_oracle: None,
            quality: QualitySpread::of(&same),
        });
    }
    // Computed from all rows first: each row's oracle is another row.
    let reference = experiment.oracle_reference.as_ref().and_then(|label| rows.iter().find(|r| &r.cell.label == label));
    let kept: Vec<(Option<Kept>, Option<Kept>)> = rows
        .iter()
        .map(|row| {
            let own = experiment.oracle_prediction.as_ref().and_then(|name| {
                rows.iter().find(|o| {
                    &o.cell.prediction == name && o.cell.policy == row.cell.policy && o.cell.variant == row.cell.variant
                })
            });
            (reference.map(|oracle| Kept::of(row, oracle)), own.map(|oracle| Kept::of(row, oracle)))
        })
        .collect();
    for (row, (reference, own)) in rows.iter_mut().zip(kept) {
        row.kept_of_reference = reference;
        row.kept_of_own_oracle = own;
    }
    rows
}
