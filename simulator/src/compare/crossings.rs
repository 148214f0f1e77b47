//! Where a sweep's gain over the baseline falls to zero as the prediction quality goes down, and the realized quality there.

use super::*;

/// The realized quality figures a crossing is read at.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct QualityPoint {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub precision: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recall: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub roc_auc: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub average_precision: Option<f64>,
}

impl QualityPoint {
    fn of(figures: &QualityFigures) -> QualityPoint {
        QualityPoint {
            precision: figures.precision,
            recall: figures.recall,
            roc_auc: figures.roc_auc,
            average_precision: figures.average_precision,
        }
    }

    fn mean_of(quality: Option<&QualitySpread>) -> QualityPoint {
        let mean = |s: Option<Spread>| s.map(|s| s.mean);
        quality.map_or_else(QualityPoint::default, |q| QualityPoint {
            precision: mean(q.precision),
            recall: mean(q.recall),
            roc_auc: mean(q.roc_auc),
            average_precision: mean(q.average_precision),
        })
    }

    /// The point a share `t` of the way from `self` to `other`.
    fn lerp(&self, other: &QualityPoint, t: f64) -> QualityPoint {
        let at = |a: Option<f64>, b: Option<f64>| Some(a? + t * (b? - a?));
        QualityPoint {
            precision: at(self.precision, other.precision),
            recall: at(self.recall, other.recall),
            roc_auc: at(self.roc_auc, other.roc_auc),
            average_precision: at(self.average_precision, other.average_precision),
        }
    }
}

/// Where a policy's packing-density gain over the baseline falls to zero along a sweep.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CrossingKind {
    /// It gains at the highest `x` and not at a lower one: the crossing is interpolated between
    /// the highest `x` where it does not gain and the next one up.
    Crosses,
    /// It gains at every `x` of the sweep: it never stops beating the baseline within it.
    AlwaysAbove,
    /// It does not gain even at the highest `x`.
    NeverAbove,
}

/// A crossing: the `x` where the gain is zero (linear between the bracketing points) and the
/// realized quality there (each figure interpolated between the same points).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CrossingPoint {
    pub kind: CrossingKind,
    /// The bracketing `x` values (gain <= 0 at the first, > 0 at the second).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub between: Option<(f64, f64)>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub x: Option<f64>,
    pub quality: QualityPoint,
}

/// One seed's crossing.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SeedCrossing {
    pub seed: u64,
    #[serde(flatten)]
    pub point: CrossingPoint,
}

/// Where one policy (and variant) of a sweep stops beating the baseline: on the mean gains over
/// seeds, and for each seed on its own paired gains.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Crossing {
    pub policy: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub variant: Option<String>,
    #[serde(flatten)]
    pub mean: CrossingPoint,
    pub per_seed: Vec<SeedCrossing>,
}

/// The crossing of points `(x, gain, quality)` sorted by `x`: scanning down from the highest `x`,
/// the first point where the gain is not positive, and the point above it.
pub(super) fn crossing_of(points: &[(f64, f64, QualityPoint)]) -> CrossingPoint {
    let none = |kind| CrossingPoint { kind, between: None, x: None, quality: QualityPoint::default() };
    let Some(&(_, top_gain, _)) = points.last() else { return none(CrossingKind::NeverAbove) };
    if top_gain <= 0.0 {
        return none(CrossingKind::NeverAbove);
    }
    let Some(below) = points.iter().rposition(|&(_, gain, _)| gain <= 0.0) else {
        return none(CrossingKind::AlwaysAbove);
    };
    let ((x0, g0, q0), (x1, g1, q1)) = (points[below], points[below + 1]);
    // g0 <= 0 < g1, so the share is in [0, 1).
    let t = -g0 / (g1 - g0);
    CrossingPoint {
        kind: CrossingKind::Crosses,
        between: Some((x0, x1)),
        x: Some(x0 + t * (x1 - x0)),
        quality: q0.lerp(&q1, t),
    }
}

/// Where each policy of a sweep stops beating the baseline (rows with an `x` only; none without).
pub fn crossings(rows: &[Row], runs: &[CompareRun], gains: &[Gain]) -> Vec<Crossing> {
    let mut out: Vec<Crossing> = Vec::new();
    for row in rows.iter().filter(|r| r.cell.x.is_some()) {
        if out.iter().any(|c| c.policy == row.cell.policy && c.variant == row.cell.variant) {
            continue;
        }
        let mut mine: Vec<&Row> = rows
            .iter()
            .filter(|r| r.cell.x.is_some() && r.cell.policy == row.cell.policy && r.cell.variant == row.cell.variant)
            .collect();
        mine.sort_by(|a, b| a.cell.x.unwrap_or_default().total_cmp(&b.cell.x.unwrap_or_default()));
        let mean: Vec<(f64, f64, QualityPoint)> = mine
            .iter()
            .map(|r| {
                (
                    r.cell.x.unwrap_or_default(),
                    r.packing_density_gain_pp.mean,
                    QualityPoint::mean_of(r.quality.as_ref()),
                )
            })
            .collect();
        let per_seed = row
            .seeds
            .iter()
            .map(|&seed| {
                let points: Vec<(f64, f64, QualityPoint)> = mine
                    .iter()
                    .filter_map(|r| {
                        let gain = gains.iter().find(|g| g.label == r.cell.label && g.seed == seed)?;
                        let run = runs
                            .iter()
                            .find(|run| run.plan.cell.label == r.cell.label && run.plan.config.seed == seed)?;
                        let quality = run
                            .result
                            .quality
                            .as_ref()
                            .map_or_else(QualityPoint::default, |q| QualityPoint::of(&q.figures));
                        Some((r.cell.x.unwrap_or_default(), gain.packing_density_gain_pp, quality))
                    })
                    .collect();
                SeedCrossing { seed, point: crossing_of(&points) }
            })
            .collect();
        out.push(Crossing {
            policy: row.cell.policy.clone(),
            variant: row.cell.variant.clone(),
            mean: crossing_of(&mean),
            per_seed,
        });
    }
    out
}
