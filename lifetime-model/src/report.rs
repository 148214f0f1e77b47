//! The evaluation report written into every bundle manifest and printed by the trainer as Markdown
//! (the trainer, `lifetime-train`, also plots it).

use crate::features::FeatureGroup;
use crate::metrics::Confusion;
use serde::{Deserialize, Serialize};
use std::fmt::Write as _;

/// Recall levels at which precision is reported (paper 003 Table 1).
pub const RECALL_LEVELS: [f64; 4] = [0.70, 0.75, 0.80, 0.85];

/// Held-out quality of the long-lived classifier.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BinaryReport {
    pub examples: usize,
    pub long_share: f64,
    #[serde(with = "crate::nan_json")]
    pub auc: f64,
    #[serde(with = "crate::nan_json")]
    pub average_precision: f64,
    /// Decision threshold on P(long) chosen on the validation split (best F1 there).
    pub decision_threshold: f64,
    pub f1: f64,
    pub precision: f64,
    pub recall: f64,
    /// (recall level, best precision reaching it).
    #[serde(with = "crate::nan_json::pairs")]
    pub precision_at_recall: Vec<(f64, f64)>,
    pub confusion: Confusion,
    /// ROC curve points (false positive rate, true positive rate), thinned.
    pub roc: Vec<(f64, f64)>,
}

/// Held-out quality of the lifetime-interval classifier.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MulticlassReport {
    pub examples: usize,
    pub classes: usize,
    pub accuracy: f64,
    /// Share of examples predicted within one interval of the truth.
    pub within_one_class: f64,
}

/// F1 of "lives beyond the threshold" when the remaining-lifetime model is asked at uptime
/// `k/20` of each VM's true lifetime (paper 000 Fig. 9).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RepredictionCurve {
    pub threshold_s: f64,
    pub positives: usize,
    pub vms: usize,
    /// F1 at uptime quantile k = 0..19.
    #[serde(with = "crate::nan_json::vec")]
    pub f1_by_quantile: Vec<f64>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RemainingReport {
    pub examples: usize,
    /// Mean absolute error of log10 remaining lifetime over the held-out expanded examples.
    pub mae_log10: f64,
    pub curves: Vec<RepredictionCurve>,
}

/// How well the predicted lifetime (the remaining-lifetime model at uptime 0) orders and places
/// VMs' exits on the held-out period: what exit-time policies (NILAS, LAVA) read.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ExitTimeReport {
    pub vms: usize,
    /// Harrell's C over all held-out VMs (censoring-aware, see [`crate::metrics::harrell_c`]).
    #[serde(with = "crate::nan_json")]
    pub c_index: f64,
    /// VMs observed to live at least the long-lived threshold (completed or still running).
    pub long_vms: usize,
    /// Harrell's C among those: does the model order the exits of long-lived VMs?
    #[serde(with = "crate::nan_json")]
    pub c_index_long: f64,
    /// Completed VMs that lived at least the threshold.
    pub completed_long_vms: usize,
    /// Mean absolute error of log10 predicted vs true lifetime over those.
    #[serde(with = "crate::nan_json")]
    pub mae_log10_long: f64,
}

/// Concordance of a lifetime reading with the observed exits, over one set of VMs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Concordance {
    /// VMs in the set (completed or still running).
    pub vms: usize,
    /// Harrell's C, censoring-aware ([`crate::metrics::harrell_c`]).
    #[serde(with = "crate::nan_json")]
    pub harrell: f64,
    /// Uno's C, weighted against censoring, up to the report's `tau_s` ([`crate::metrics::uno_c`]).
    #[serde(with = "crate::nan_json")]
    pub uno: f64,
}

/// Exit-time quality of the VMs of one age: those still alive at `age_s`, ranked by the remaining
/// lifetime predicted at that age (at age 0, the request-time prediction over all VMs).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AgeConcordance {
    pub age_s: f64,
    /// The survival model's reading.
    pub survival: Concordance,
    /// The remaining-lifetime regression of the same bundle, on the same VMs, for comparison.
    pub regression: Concordance,
}

/// Predicted against observed survival at one age and horizon: among the VMs alive at `age_s`,
/// the mean predicted `P(T > age + t | T > age)` and the Kaplan-Meier estimate of it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CalibrationPoint {
    pub age_s: f64,
    pub t_s: f64,
    pub vms: usize,
    #[serde(with = "crate::nan_json")]
    pub predicted: f64,
    #[serde(with = "crate::nan_json")]
    pub observed: f64,
}

/// How well the survival model's distribution fits the held-out period.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SurvivalReport {
    /// What the concordances rank by (the bundle's reading).
    pub reading: String,
    pub intervals: usize,
    /// ROC AUC of `P(T >= threshold)` read off the distribution (the classifier's is in `binary`).
    #[serde(with = "crate::nan_json")]
    pub auc_p_long: f64,
    /// Whether the bundle serves P(long) from the distribution (chosen on validation AUC).
    pub p_long_from_survival: bool,
    /// Uno's C counts pairs whose shorter lifetime is below this.
    pub tau_s: f64,
    /// Every held-out VM, ranked by the request-time prediction.
    pub all: AgeConcordance,
    /// The VMs that live at least the long-lived threshold, ranked by the request-time prediction.
    pub long: AgeConcordance,
    /// The VMs alive at each age, ranked by the remaining lifetime predicted at that age.
    pub by_age: Vec<AgeConcordance>,
    /// The IPCW integrated Brier score over `(0, brier_horizon_s]` (lower is better).
    #[serde(with = "crate::nan_json")]
    pub integrated_brier: f64,
    /// The same for the training period's Kaplan-Meier curve given to every VM (no features).
    #[serde(with = "crate::nan_json")]
    pub integrated_brier_marginal: f64,
    pub brier_horizon_s: f64,
    pub calibration: Vec<CalibrationPoint>,
    /// How each candidate reading orders the long-lived VMs' exits on the held-out period.
    #[serde(default)]
    pub readings: Vec<ReadingCandidate>,
}

/// One feature set tried on the validation split.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FeatureCandidate {
    pub dropped: Vec<FeatureGroup>,
    pub features: usize,
    /// Validation ROC AUC of the long-lived classifier at its best round.
    #[serde(with = "crate::nan_json")]
    pub auc: f64,
    pub best_iteration: usize,
}

/// Which feature groups the bundle keeps, and why.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FeatureSelection {
    /// The groups were given by the user, not chosen (then there is one candidate).
    pub forced: bool,
    pub candidates: Vec<FeatureCandidate>,
    /// The dropped groups of the chosen candidate.
    pub dropped: Vec<FeatureGroup>,
}

/// Boosting rounds of one model: chosen on the validation split, then used for the refit.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ModelRounds {
    /// The validation metric: `auc` (higher is better), `multi_logloss` or `l2` (lower is better).
    pub metric: String,
    pub validation_examples: usize,
    /// Rounds with the best validation metric; 0 when the split had too few examples to tell.
    pub best_iteration: usize,
    #[serde(with = "crate::nan_json")]
    pub best_value: f64,
    /// Rounds trained on the whole training period.
    pub rounds: usize,
}

/// The choices made on the validation split: the last part of the training period, never the
/// evaluation period.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ValidationReport {
    /// VMs that arrived from here to the training cut-off validate; earlier ones fit, with labels
    /// censored here.
    pub valid_from_s: f64,
    pub fit_vms: usize,
    pub validation_vms: usize,
    pub features: FeatureSelection,
    pub binary: ModelRounds,
    pub multiclass: ModelRounds,
    pub remaining: ModelRounds,
    /// The survival model's hazards (binary log loss per person-period row).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hazard: Option<ModelRounds>,
    /// Validation AUC of P(long) read off the survival model, against the classifier's
    /// (`binary.best_value`): the better one serves P(long).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub survival_auc: Option<f64>,
    /// How each candidate reading of the distribution orders the long-lived VMs' exits.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub readings: Vec<ReadingCandidate>,
}

/// One reading of the lifetime distribution on the validation split: Harrell's C among the VMs
/// that live past the long-lived threshold, of the lifetime read at request time and of the
/// remaining lifetime read at that age.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ReadingCandidate {
    pub reading: String,
    pub long_vms: usize,
    #[serde(with = "crate::nan_json")]
    pub c_long_at_request: f64,
    #[serde(with = "crate::nan_json")]
    pub c_long_at_threshold: f64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EvaluationReport {
    pub binary: BinaryReport,
    pub multiclass: MulticlassReport,
    pub remaining: RemainingReport,
    /// Absent from bundles written before exit-time quality was measured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_time: Option<ExitTimeReport>,
    /// Absent from bundles written before rounds and features were chosen on validation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub validation: Option<ValidationReport>,
    /// Bundles with a survival model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub survival: Option<SurvivalReport>,
}

fn group_list(groups: &[FeatureGroup]) -> String {
    if groups.is_empty() {
        "none".to_owned()
    } else {
        groups.iter().map(|g| g.name()).collect::<Vec<_>>().join(", ")
    }
}

impl EvaluationReport {
    pub fn to_markdown(&self) -> String {
        let b = &self.binary;
        let mut s = String::new();
        let _ =
            writeln!(s, "### Long-lived classifier ({} held-out VMs, {:.1}% long)\n", b.examples, b.long_share * 100.0);
        let _ = writeln!(s, "| metric | value |\n|---|---:|");
        let _ = writeln!(s, "| ROC AUC | {:.3} |", b.auc);
        let _ = writeln!(s, "| average precision | {:.3} |", b.average_precision);
        let _ = writeln!(
            s,
            "| F1 / precision / recall at P(long) >= {:.3} | {:.3} / {:.3} / {:.3} |",
            b.decision_threshold, b.f1, b.precision, b.recall
        );
        for (recall, precision) in &b.precision_at_recall {
            let _ = writeln!(s, "| precision at recall {recall:.2} | {precision:.3} |");
        }
        let c = &b.confusion;
        let _ = writeln!(s, "\nConfusion matrix at the decision threshold:\n");
        let _ = writeln!(s, "| | predicted long | predicted short |\n|---|---:|---:|");
        let _ = writeln!(s, "| long | {} | {} |", c.true_positive, c.false_negative);
        let _ = writeln!(s, "| short | {} | {} |", c.false_positive, c.true_negative);
        let m = &self.multiclass;
        let _ = writeln!(
            s,
            "\n### Lifetime intervals ({} classes, {} held-out VMs)\n\naccuracy {:.3}, within one interval {:.3}",
            m.classes, m.examples, m.accuracy, m.within_one_class
        );
        let r = &self.remaining;
        let _ = writeln!(
            s,
            "\n### Remaining lifetime ({} held-out examples, MAE {:.3} in log10 seconds)\n",
            r.examples, r.mae_log10
        );
        if !r.curves.is_empty() {
            let header: Vec<String> = r.curves.iter().map(|c| format!("F1 beyond {}", hours(c.threshold_s))).collect();
            let _ = writeln!(s, "| uptime quantile | {} |", header.join(" | "));
            let _ = writeln!(s, "|---|{}", "---:|".repeat(r.curves.len()));
            for k in 0..20 {
                let cells: Vec<String> = r.curves.iter().map(|c| format!("{:.3}", c.f1_by_quantile[k])).collect();
                let _ = writeln!(s, "| {k} | {} |", cells.join(" | "));
            }
        }
        if let Some(e) = &self.exit_time {
            let _ = writeln!(
                s,
                "\n### Exit times (predicted lifetime at uptime 0)\n\n| metric | value |\n|---|---:|\n\
                 | Harrell's C, all {} held-out VMs | {:.3} |\n| Harrell's C, {} VMs living >= threshold | {:.3} |\n\
                 | MAE log10 lifetime, {} completed VMs >= threshold | {:.3} |",
                e.vms, e.c_index, e.long_vms, e.c_index_long, e.completed_long_vms, e.mae_log10_long
            );
        }
        if let Some(r) = &self.survival {
            let _ = writeln!(
                s,
                "\n### Lifetime distribution (survival model, {} intervals, reading: {})\n\n                 P(long) read off it: ROC AUC {:.3} ({} P(long)). Integrated Brier score up to {}: {:.4}                  (the training period's Kaplan-Meier curve for every VM: {:.4}). Uno's C up to {}.\n",
                r.intervals,
                r.reading,
                r.auc_p_long,
                if r.p_long_from_survival { "it serves" } else { "the classifier serves" },
                hours(r.brier_horizon_s),
                r.integrated_brier,
                r.integrated_brier_marginal,
                hours(r.tau_s)
            );
            let _ = writeln!(
                s,
                "| VMs | count | Harrell's C | Uno's C | regression: Harrell's C | Uno's C |\n|---|---:|---:|---:|---:|---:|"
            );
            let rows = [
                ("all, at request time".to_owned(), &r.all),
                ("living >= threshold, at request time".to_owned(), &r.long),
            ];
            let aged = r.by_age.iter().map(|a| (format!("alive at {}, repredicted then", hours(a.age_s)), a));
            for (name, a) in rows.iter().map(|(n, a)| (n.clone(), *a)).chain(aged) {
                let _ = writeln!(
                    s,
                    "| {name} | {} | {:.3} | {:.3} | {:.3} | {:.3} |",
                    a.survival.vms, a.survival.harrell, a.survival.uno, a.regression.harrell, a.regression.uno
                );
            }
            let _ = writeln!(
                s,
                "\nHarrell's C among the VMs living >= threshold, by reading:\n\n| reading | at request time | repredicted at the threshold |\n|---|---:|---:|"
            );
            for c in &r.readings {
                let _ = writeln!(s, "| {} | {:.4} | {:.4} |", c.reading, c.c_long_at_request, c.c_long_at_threshold);
            }
            let _ = writeln!(s, "\n| alive at | P(T > age + t) for t | VMs | predicted | observed (Kaplan-Meier) |\n|---|---|---:|---:|---:|");
            for c in &r.calibration {
                let _ = writeln!(
                    s,
                    "| {} | {} | {} | {:.3} | {:.3} |",
                    hours(c.age_s),
                    hours(c.t_s),
                    c.vms,
                    c.predicted,
                    c.observed
                );
            }
        }
        if let Some(v) = &self.validation {
            let f = &v.features;
            let _ = writeln!(
                s,
                "\n### Validation split (choices; {} VMs fit before t = {:.0} s, {} validate up to the cut-off)\n",
                v.fit_vms, v.valid_from_s, v.validation_vms
            );
            let _ = writeln!(
                s,
                "Feature groups {}: dropped {}\n",
                if f.forced { "forced" } else { "chosen by validation AUC" },
                group_list(&f.dropped)
            );
            let _ = writeln!(s, "| dropped | features | validation AUC | best round |\n|---|---:|---:|---:|");
            for c in &f.candidates {
                let _ = writeln!(
                    s,
                    "| {} | {} | {:.4} | {} |",
                    group_list(&c.dropped),
                    c.features,
                    c.auc,
                    c.best_iteration
                );
            }
            let _ = writeln!(s, "\n| model | metric | validation examples | best round | best value | refit rounds |");
            let _ = writeln!(s, "|---|---|---:|---:|---:|---:|");
            for (name, m) in [("long-lived", &v.binary), ("intervals", &v.multiclass), ("remaining", &v.remaining)]
                .into_iter()
                .chain(v.hazard.as_ref().map(|m| ("survival hazards", m)))
            {
                let _ = writeln!(
                    s,
                    "| {name} | {} | {} | {} | {:.4} | {} |",
                    m.metric, m.validation_examples, m.best_iteration, m.best_value, m.rounds
                );
            }
        }
        if let Some(v) = self.validation.as_ref().filter(|v| !v.readings.is_empty()) {
            let _ = writeln!(
                s,
                "\nReadings of the lifetime distribution on the validation split (P(long) off it: AUC {:.4});                  Harrell's C among the {} VMs living >= threshold:\n\n| reading | at request time | repredicted at the threshold |\n|---|---:|---:|",
                v.survival_auc.unwrap_or(f64::NAN),
                v.readings[0].long_vms
            );
            for r in &v.readings {
                let _ = writeln!(s, "| {} | {:.4} | {:.4} |", r.reading, r.c_long_at_request, r.c_long_at_threshold);
            }
        }
        s
    }
}

/// A duration as a short label: `0`, `N h` or `N d`.
pub fn hours(seconds: f64) -> String {
    if seconds == 0.0 {
        "0".to_owned()
    } else if seconds >= 86_400.0 {
        format!("{:.0} d", seconds / 86_400.0)
    } else {
        format!("{:.0} h", seconds / 3_600.0)
    }
}
