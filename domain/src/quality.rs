//! Realized prediction quality on the wire: a [`QualityTally`] of resolved outcomes (a VM's
//! predicted long-lived probability beside what it turned out to be) that adds up exactly across
//! zones and agents, and the [`QualityFigures`] computed from it: precision and recall of the
//! long-lived class, ROC AUC, average precision, calibration and the lifetime error in log10
//! seconds. The allocator resolves outcomes (`placement::outcomes`); the control service adds up the
//! zones' tallies to gate predictions and judge canaries.
//!
//! Scores are kept in [`SCORE_BINS`] equal bins of `p_long`, so a tally has a bounded size whatever
//! its count. AUC and average precision treat the VMs of one bin as tied: the figures match the exact
//! ones computed on scores rounded to 0.001.

use serde::{Deserialize, Serialize};

/// Number of equal bins of `p_long` in [0, 1] that tallies count scores in.
pub const SCORE_BINS: u16 = 1000;

/// One resolved outcome: the prediction the VM was placed with, and what it turned out to be.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ResolvedOutcome {
    /// The model's probability of long-lived, in [0, 1].
    pub p_long: f64,
    /// The model's class (its decision threshold applied).
    pub predicted_long: bool,
    /// Lived at least the long-lived threshold (an exit after it, or still running past it).
    pub realized_long: bool,
    /// log10(predicted lifetime) - log10(realized lifetime), both at least 1 s, when the prediction
    /// carried a lifetime and the VM exited (a censored VM's lifetime is not known).
    pub lifetime_log10_error: Option<f64>,
}

/// Counts of the long-lived and short-lived VMs whose `p_long` fell in one bin.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScoreBin {
    /// Bin index: `p_long` in [bin / 1000, (bin + 1) / 1000), the last bin closed.
    pub bin: u16,
    pub long: u64,
    pub short: u64,
}

/// Resolved outcomes added up: counts, sums and the score histogram. Two tallies add up exactly
/// ([`QualityTally::merge`]).
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QualityTally {
    pub resolved: u64,
    /// Of them, long-lived.
    pub realized_long: u64,
    /// Of them, predicted long-lived.
    pub predicted_long: u64,
    /// Predicted and realized long-lived.
    pub true_long: u64,
    pub p_long_sum: f64,
    /// Outcomes with a lifetime error, and the sums of the error and of its absolute value.
    pub lifetime_errors: u64,
    pub log10_error_sum: f64,
    pub log10_abs_error_sum: f64,
    /// Non-empty bins only, by bin index.
    pub bins: Vec<ScoreBin>,
}

/// What a tally amounts to. A figure that needs both classes (or a prediction) is absent without.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QualityFigures {
    pub resolved: u64,
    /// Share of the resolved VMs that lived long.
    pub realized_long_share: Option<f64>,
    /// Share predicted long-lived (the class).
    pub predicted_long_share: Option<f64>,
    /// Mean predicted probability of long-lived (calibration: compare with `realized_long_share`).
    pub mean_p_long: Option<f64>,
    /// Of the VMs predicted long-lived, the share that lived long.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub precision: Option<f64>,
    /// Of the long-lived VMs, the share predicted so.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recall: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub roc_auc: Option<f64>,
    /// Average precision of the long-lived class.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub average_precision: Option<f64>,
    /// Mean absolute error of the predicted lifetime, in log10 seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lifetime_log10_mae: Option<f64>,
    /// Mean signed error (positive: predicted too long), in log10 seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lifetime_log10_bias: Option<f64>,
}

impl QualityFigures {
    /// The figures by metric name (`precision`, `roc_auc`, ...), as the services' gauges label them.
    pub fn named(&self) -> [(&'static str, Option<f64>); 9] {
        [
            ("window_resolved", Some(self.resolved as f64)),
            ("precision", self.precision),
            ("recall", self.recall),
            ("roc_auc", self.roc_auc),
            ("average_precision", self.average_precision),
            ("realized_long_share", self.realized_long_share),
            ("predicted_long_share", self.predicted_long_share),
            ("mean_p_long", self.mean_p_long),
            ("lifetime_log10_mae", self.lifetime_log10_mae),
        ]
    }
}

/// The realized quality of one model version.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VersionQuality {
    /// The model bundle's version, as its predictions named it.
    pub version: String,
    /// Outcomes resolved since the allocator started, window or not.
    pub resolved_total: u64,
    /// VMs placed with its predictions whose outcomes are not in the window yet: still running, or
    /// resolved with their cohort (the VMs that started with them) not complete.
    pub pending: u64,
    /// The last outcomes (the sliding window).
    pub window: QualityTally,
    /// What the window amounts to.
    pub figures: QualityFigures,
}

/// An allocator's realized prediction quality, per model version (`GET /v1/quality`).
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QualityReport {
    /// Lifetime at and above which a VM is long-lived.
    pub long_threshold_s: f64,
    /// Most outcomes a version's window keeps.
    pub window: u64,
    /// The clock outcomes resolve on (the model's: latest request or exit time seen).
    pub clock_s: f64,
    /// Most recently seen version first.
    pub versions: Vec<VersionQuality>,
}

impl QualityReport {
    /// The quality of `version`, if it was seen.
    pub fn version(&self, version: &str) -> Option<&VersionQuality> {
        self.versions.iter().find(|v| v.version == version)
    }
}

/// What the control service makes of the zones' realized quality (`GET /v1/stats`, `quality`):
/// the quality gate and the last canary decision.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QualityStatus {
    /// The gate acts (floors configured and `[quality] gate` on).
    pub gate_enabled: bool,
    /// True while the stable model's answers are overridden: its VMs are placed as short-lived
    /// (`quality_gate`), its answers kept in shadow.
    pub gated: bool,
    /// Why the gate closed, with the figures; absent while open.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    pub trips: u64,
    pub recoveries: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stable_version: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub canary_version: Option<String>,
    /// Per model version, the windows of every zone added up.
    pub versions: Vec<VersionQuality>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_canary_decision: Option<CanaryDecision>,
}

/// A canary judged by its realized average precision against the stable model's.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CanaryDecision {
    /// `promote` or `rollback`.
    pub verdict: String,
    pub canary_version: String,
    pub stable_version: String,
    pub canary_average_precision: f64,
    pub stable_average_precision: f64,
    pub canary_resolved: u64,
    pub stable_resolved: u64,
    /// How much worse than stable's the canary's may be and still be promoted.
    pub margin: f64,
    /// Standard error of the difference of the two average precisions.
    pub standard_error: f64,
    /// Whether the inference servers carried it out, and what they said if not.
    pub applied: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

/// The bin of a probability (clamped into [0, 1]; NaN counts as 0).
pub fn score_bin(p_long: f64) -> u16 {
    let p = if p_long.is_nan() { 0.0 } else { p_long.clamp(0.0, 1.0) };
    ((p * f64::from(SCORE_BINS)) as u16).min(SCORE_BINS - 1)
}

impl QualityTally {
    /// The tally of `outcomes`.
    pub fn of<'a>(outcomes: impl IntoIterator<Item = &'a ResolvedOutcome>) -> Self {
        let mut bins = vec![(0u64, 0u64); usize::from(SCORE_BINS)];
        let mut tally = QualityTally::default();
        for outcome in outcomes {
            tally.resolved += 1;
            tally.realized_long += u64::from(outcome.realized_long);
            tally.predicted_long += u64::from(outcome.predicted_long);
            tally.true_long += u64::from(outcome.predicted_long && outcome.realized_long);
            tally.p_long_sum += if outcome.p_long.is_nan() { 0.0 } else { outcome.p_long.clamp(0.0, 1.0) };
            if let Some(error) = outcome.lifetime_log10_error.filter(|e| e.is_finite()) {
                tally.lifetime_errors += 1;
                tally.log10_error_sum += error;
                tally.log10_abs_error_sum += error.abs();
            }
            let slot = &mut bins[usize::from(score_bin(outcome.p_long))];
            if outcome.realized_long {
                slot.0 += 1;
            } else {
                slot.1 += 1;
            }
        }
        tally.bins = sparse(&bins);
        tally
    }

    /// Adds `other` in: the tally of both sets of outcomes.
    pub fn merge(&mut self, other: &QualityTally) {
        self.resolved += other.resolved;
        self.realized_long += other.realized_long;
        self.predicted_long += other.predicted_long;
        self.true_long += other.true_long;
        self.p_long_sum += other.p_long_sum;
        self.lifetime_errors += other.lifetime_errors;
        self.log10_error_sum += other.log10_error_sum;
        self.log10_abs_error_sum += other.log10_abs_error_sum;
        let mut bins = self.dense();
        for bin in &other.bins {
            if let Some(slot) = bins.get_mut(usize::from(bin.bin)) {
                slot.0 += bin.long;
                slot.1 += bin.short;
            }
        }
        self.bins = sparse(&bins);
    }

    fn dense(&self) -> Vec<(u64, u64)> {
        let mut bins = vec![(0u64, 0u64); usize::from(SCORE_BINS)];
        for bin in &self.bins {
            if let Some(slot) = bins.get_mut(usize::from(bin.bin)) {
                *slot = (bin.long, bin.short);
            }
        }
        bins
    }

    /// The figures of this tally.
    pub fn figures(&self) -> QualityFigures {
        let share = |part: u64, whole: u64| (whole > 0).then(|| part as f64 / whole as f64);
        let resolved = self.resolved;
        let realized_short = resolved.saturating_sub(self.realized_long);
        let (roc_auc, average_precision) = self.ranking(realized_short);
        QualityFigures {
            resolved,
            realized_long_share: share(self.realized_long, resolved),
            predicted_long_share: share(self.predicted_long, resolved),
            mean_p_long: (resolved > 0).then(|| self.p_long_sum / resolved as f64),
            precision: share(self.true_long, self.predicted_long),
            recall: share(self.true_long, self.realized_long),
            roc_auc,
            average_precision,
            lifetime_log10_mae: (self.lifetime_errors > 0)
                .then(|| self.log10_abs_error_sum / self.lifetime_errors as f64),
            lifetime_log10_bias: (self.lifetime_errors > 0).then(|| self.log10_error_sum / self.lifetime_errors as f64),
        }
    }

    /// ROC AUC (ties count half) and average precision, walking the bins from the highest score
    /// down; a bin is one step (its VMs tied).
    fn ranking(&self, negatives: u64) -> (Option<f64>, Option<f64>) {
        let positives = self.realized_long;
        let (mut area, mut ap_sum, mut tp, mut fp) = (0.0_f64, 0.0_f64, 0u64, 0u64);
        for bin in self.bins.iter().rev() {
            let (prev_tp, prev_fp) = (tp, fp);
            tp += bin.long;
            fp += bin.short;
            area += (fp - prev_fp) as f64 * (tp + prev_tp) as f64 / 2.0;
            if tp + fp > 0 {
                ap_sum += (tp - prev_tp) as f64 * tp as f64 / (tp + fp) as f64;
            }
        }
        let auc = (positives > 0 && negatives > 0).then(|| area / (positives as f64 * negatives as f64));
        let ap = (positives > 0).then(|| ap_sum / positives as f64);
        (auc, ap)
    }
}

fn sparse(bins: &[(u64, u64)]) -> Vec<ScoreBin> {
    bins.iter()
        .enumerate()
        .filter(|(_, &(long, short))| long + short > 0)
        .map(|(bin, &(long, short))| ScoreBin { bin: bin as u16, long, short })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn outcome(p_long: f64, realized_long: bool) -> ResolvedOutcome {
        ResolvedOutcome { p_long, predicted_long: p_long >= 0.5, realized_long, lifetime_log10_error: None }
    }

    #[test]
    fn a_perfect_ranking_scores_one_and_a_reversed_one_zero() {
        let perfect: Vec<_> = [(0.9, true), (0.8, true), (0.2, false), (0.1, false)]
            .into_iter()
            .map(|(p, long)| outcome(p, long))
            .collect();
        let figures = QualityTally::of(&perfect).figures();
        assert_eq!(figures.roc_auc, Some(1.0));
        assert_eq!(figures.average_precision, Some(1.0));
        assert_eq!((figures.precision, figures.recall), (Some(1.0), Some(1.0)));
        let reversed: Vec<_> = perfect.iter().map(|o| outcome(o.p_long, !o.realized_long)).collect();
        let figures = QualityTally::of(&reversed).figures();
        assert_eq!(figures.roc_auc, Some(0.0));
        assert_eq!(figures.precision, Some(0.0));
    }

    #[test]
    fn figures_match_the_exact_definitions_on_a_small_case() {
        // Scores 0.9 L, 0.7 S, 0.6 L, 0.3 S, 0.3 L (tied with a short), 0.1 S.
        let outcomes: Vec<_> = [(0.9, true), (0.7, false), (0.6, true), (0.3, false), (0.3, true), (0.1, false)]
            .into_iter()
            .map(|(p, long)| outcome(p, long))
            .collect();
        let figures = QualityTally::of(&outcomes).figures();
        // Pairs (long, short) ranked right: 0.9 beats 3, 0.6 beats 2, 0.3 beats 1 and ties 1: 6.5 / 9.
        assert!((figures.roc_auc.unwrap() - 6.5 / 9.0).abs() < 1e-12);
        // AP: at 0.9 precision 1; at 0.6 2/3; at the 0.3 step 3/5: (1 + 2/3 + 3/5) / 3.
        assert!((figures.average_precision.unwrap() - (1.0 + 2.0 / 3.0 + 0.6) / 3.0).abs() < 1e-12);
        assert_eq!(figures.precision, Some(2.0 / 3.0));
        assert_eq!(figures.recall, Some(2.0 / 3.0));
        assert_eq!(figures.realized_long_share, Some(0.5));
        assert!((figures.mean_p_long.unwrap() - 2.9 / 6.0).abs() < 1e-12);
    }

    #[test]
    fn merged_tallies_equal_the_tally_of_all_outcomes() {
        let all: Vec<_> = (0..200).map(|i| outcome(f64::from(i) / 199.0, (i * 7919) % 3 == 0)).collect();
        let mut merged = QualityTally::of(&all[..73]);
        merged.merge(&QualityTally::of(&all[73..]));
        let whole = QualityTally::of(&all);
        assert_eq!(merged.bins, whole.bins);
        assert_eq!(merged.figures().roc_auc, whole.figures().roc_auc);
        assert_eq!(
            (merged.resolved, merged.realized_long, merged.true_long),
            (200, whole.realized_long, whole.true_long)
        );
    }

    #[test]
    fn one_class_only_leaves_the_ranking_figures_out_and_bad_scores_stay_in_range() {
        let figures = QualityTally::of(&[outcome(f64::NAN, false), outcome(7.0, false)]).figures();
        assert_eq!((figures.roc_auc, figures.average_precision, figures.recall), (None, None, None));
        assert_eq!(figures.mean_p_long, Some(0.5));
        assert_eq!(score_bin(1.0), SCORE_BINS - 1);
        assert_eq!(score_bin(-3.0), 0);
        assert_eq!(QualityTally::default().figures().resolved, 0);
    }

    #[test]
    fn lifetime_errors_average_in_log10_seconds() {
        let mut a = outcome(0.9, true);
        a.lifetime_log10_error = Some(1.0);
        let mut b = outcome(0.1, false);
        b.lifetime_log10_error = Some(-0.5);
        let figures = QualityTally::of(&[a, b, outcome(0.5, true)]).figures();
        assert_eq!(figures.lifetime_log10_mae, Some(0.75));
        assert_eq!(figures.lifetime_log10_bias, Some(0.25));
    }
}
