//! What the control service does with realized prediction quality: every zone's allocator resolves
//! the outcomes of the predictions its VMs were placed with (`GET /v1/quality`); this module adds
//! the zones' windows up per model version and acts on them.
//!
//! - **The quality gate**, beside the long-share safeguard: when the stable model's realized
//!   precision, average precision or ROC AUC falls below its floor (over at least `min_resolved`
//!   VMs), its VMs are placed as short-lived (PBFR) while its answers are kept in shadow
//!   (`quality_gate`), so that the allocators keep measuring it. The gate opens again once every
//!   floor is met by `hysteresis` more, or when another bundle becomes stable.
//! - **Canaries judged by evidence**: a canary whose rollout says `auto = true` is promoted once
//!   both it and the stable model have `min_resolved` resolved VMs and its average precision is no
//!   worse than stable's by more than `margin`, and rolled back when it is worse, either beyond two
//!   standard errors ([`judge_canary`]). Each decision is logged with its figures and carried out
//!   through the inference servers' admin API.
//!
//! The decisions ([`QualityWatch::observe`], [`judge_canary`], [`merge_versions`]) are plain
//! functions of their inputs; [`poll`] does the HTTP.

use crate::config::QualityConfig;
use domain::quality::{CanaryDecision, QualityReport, QualityStatus, QualityTally, VersionQuality};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

/// What the inference servers serve: the stable model's version and the canary's, with its
/// criteria when it is to be judged automatically.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RolloutView {
    pub stable: Option<String>,
    pub canary: Option<CanaryView>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct CanaryView {
    pub version: String,
    /// Its share of routing keys.
    pub share: f64,
    /// Set when the rollout says `auto = true`.
    pub auto: Option<AutoCanary>,
}

/// A canary's criteria (`rollout.toml`, `[canary]`).
#[derive(Clone, Copy, Debug, PartialEq, Deserialize)]
pub struct AutoCanary {
    /// Resolved VMs each of the canary and the stable model need first (the `[quality]` default
    /// when absent).
    pub min_resolved: Option<u64>,
    /// How much worse than stable's the canary's average precision may be and still be promoted.
    pub margin: f64,
}

/// One model as an inference server lists it (`GET /v1/models`).
#[derive(Clone, Debug, Deserialize)]
pub struct ModelStatus {
    pub version: Option<String>,
    pub state: String,
    /// The canary's share of routing keys.
    #[serde(default)]
    pub canary_share: Option<f64>,
    #[serde(default)]
    pub auto: Option<AutoCanary>,
}

/// The gate's state and the last figures; see the module documentation.
pub struct QualityWatch {
    config: QualityConfig,
    /// Fast path: false while no version is gated.
    closed: AtomicBool,
    state: Mutex<WatchState>,
}

#[derive(Default)]
struct WatchState {
    /// The version whose answers are overridden.
    gated_version: Option<String>,
    status: QualityStatus,
    /// The canary last decided on, so that it is not decided twice while the rollout catches up.
    decided_canary: Option<String>,
}

impl QualityWatch {
    pub fn new(config: QualityConfig) -> Self {
        let gate_enabled = config.gate
            && config.enabled
            && (config.min_precision.is_some()
                || config.min_average_precision.is_some()
                || config.min_roc_auc.is_some());
        let state =
            WatchState { status: QualityStatus { gate_enabled, ..QualityStatus::default() }, ..Default::default() };
        QualityWatch { config, closed: AtomicBool::new(false), state: Mutex::new(state) }
    }

    pub fn config(&self) -> &QualityConfig {
        &self.config
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, WatchState> {
        // Every update leaves the state whole, so a poisoned lock is still good to use.
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// True when the answers of `version` are to be overridden now (placed as short-lived).
    pub fn gates(&self, version: Option<&str>) -> bool {
        if !self.closed.load(Ordering::Relaxed) {
            return false;
        }
        let state = self.lock();
        version.is_some() && state.gated_version.as_deref() == version
    }

    pub fn status(&self) -> QualityStatus {
        self.lock().status.clone()
    }

    /// Takes in the rollout and the zones' quality: closes or opens the gate, and answers the
    /// canary decision to carry out, if one is due.
    pub fn observe(&self, rollout: &RolloutView, versions: Vec<VersionQuality>) -> Option<CanaryDecision> {
        let mut state = self.lock();
        let find = |version: &Option<String>| {
            version.as_ref().and_then(|v| versions.iter().find(|q| &q.version == v)).cloned()
        };
        let stable = find(&rollout.stable);
        // A new stable bundle starts trusted: the gate judged the previous one.
        if state.gated_version.is_some() && state.gated_version != rollout.stable {
            let previous = state.gated_version.take();
            state.status.gated = false;
            state.status.reason = None;
            tracing::info!(gated = ?previous, stable = ?rollout.stable, "quality gate open: another bundle is stable");
        }
        if state.status.gate_enabled {
            if let Some(stable) = &stable {
                self.judge_gate(&mut state, stable);
            }
        }
        self.closed.store(state.gated_version.is_some(), Ordering::Relaxed);
        metrics::gauge!("control_quality_gate_closed").set(if state.gated_version.is_some() { 1.0 } else { 0.0 });
        state.status.stable_version = rollout.stable.clone();
        state.status.canary_version = rollout.canary.as_ref().map(|c| c.version.clone());
        let decision = match (&rollout.canary, &stable) {
            (Some(CanaryView { version, auto: Some(auto), .. }), Some(stable))
                if state.decided_canary.as_deref() != Some(version.as_str()) =>
            {
                let min_resolved = auto.min_resolved.unwrap_or(self.config.min_resolved);
                find(&Some(version.clone())).and_then(|canary| judge_canary(stable, &canary, min_resolved, auto.margin))
            }
            _ => None,
        };
        if let Some(decision) = &decision {
            state.decided_canary = Some(decision.canary_version.clone());
        }
        state.status.versions = versions;
        decision
    }

    fn judge_gate(&self, state: &mut WatchState, stable: &VersionQuality) {
        let figures = &stable.figures;
        if figures.resolved < self.config.min_resolved {
            return;
        }
        let floors = [
            ("precision", self.config.min_precision, figures.precision),
            ("average precision", self.config.min_average_precision, figures.average_precision),
            ("ROC AUC", self.config.min_roc_auc, figures.roc_auc),
        ];
        if state.gated_version.is_none() {
            let breach = floors.iter().find_map(|&(name, floor, value)| match (floor, value) {
                (Some(floor), Some(value)) if value < floor => Some(format!(
                    "realized {name} {value:.3} of model {} is below its floor {floor:.3} over {} resolved VMs",
                    stable.version, figures.resolved
                )),
                _ => None,
            });
            if let Some(reason) = breach {
                tracing::warn!(%reason, "quality gate closed: the stable model's VMs are placed as short-lived");
                metrics::counter!("control_quality_gate_trips_total").increment(1);
                state.gated_version = Some(stable.version.clone());
                state.status.gated = true;
                state.status.reason = Some(reason);
                state.status.trips += 1;
            }
        } else {
            // Every floor met with room to spare (a figure not known yet holds the gate closed).
            let recovered = floors.iter().all(|&(_, floor, value)| match floor {
                Some(floor) => value.is_some_and(|value| value >= floor + self.config.hysteresis),
                None => true,
            });
            if recovered {
                tracing::info!(
                    version = %stable.version, resolved = figures.resolved, precision = ?figures.precision,
                    average_precision = ?figures.average_precision, roc_auc = ?figures.roc_auc,
                    "quality gate open: the stable model's realized quality recovered"
                );
                state.gated_version = None;
                state.status.gated = false;
                state.status.reason = None;
                state.status.recoveries += 1;
            }
        }
    }

    /// Records what came of a canary decision.
    pub fn record_decision(&self, decision: CanaryDecision) {
        metrics::counter!("control_canary_decisions_total", "verdict" => decision.verdict.clone()).increment(1);
        let mut state = self.lock();
        if !decision.applied {
            // Not carried out: decide again at the next poll.
            state.decided_canary = None;
        }
        state.status.last_canary_decision = Some(decision);
    }
}

/// How many standard errors a difference of average precision must clear to count as evidence.
pub const EVIDENCE_Z: f64 = 2.0;

/// Promote or roll back a canary on evidence, once each side has `min_resolved` resolved VMs and an
/// average precision. With d = canary's AP - stable's and se its standard error (each side's AP
/// taken as a proportion over its long-lived VMs, sqrt(AP (1 - AP) / long)): promoted when
/// d - 2 se >= -margin (no worse than `margin`, beyond noise), rolled back when d + 2 se < -margin
/// (worse beyond noise); undecided in between, until more outcomes resolve. A hundred outcomes
/// hold some 25 long-lived VMs, whose AP moves by 0.1 from one sample to the next: deciding on
/// the point estimates alone rolled a much better canary back in the end-to-end test.
pub fn judge_canary(
    stable: &VersionQuality,
    canary: &VersionQuality,
    min_resolved: u64,
    margin: f64,
) -> Option<CanaryDecision> {
    let (s, c) = (&stable.figures, &canary.figures);
    if s.resolved < min_resolved || c.resolved < min_resolved {
        return None;
    }
    let (stable_ap, canary_ap) = (s.average_precision?, c.average_precision?);
    let variance = |ap: f64, long: u64| ap * (1.0 - ap) / long.max(1) as f64;
    let se =
        (variance(stable_ap, stable.window.realized_long) + variance(canary_ap, canary.window.realized_long)).sqrt();
    let d = canary_ap - stable_ap;
    let verdict = if d - EVIDENCE_Z * se >= -margin {
        "promote"
    } else if d + EVIDENCE_Z * se < -margin {
        "rollback"
    } else {
        return None;
    };
    Some(CanaryDecision {
        verdict: verdict.to_owned(),
        canary_version: canary.version.clone(),
        stable_version: stable.version.clone(),
        canary_average_precision: canary_ap,
        stable_average_precision: stable_ap,
        canary_resolved: c.resolved,
        stable_resolved: s.resolved,
        margin,
        standard_error: se,
        applied: false,
        detail: None,
    })
}

/// The zones' reports added up per version: windows merged, figures of the sums.
pub fn merge_versions(reports: &[QualityReport]) -> Vec<VersionQuality> {
    let mut merged: BTreeMap<&str, (u64, u64, QualityTally)> = BTreeMap::new();
    for version in reports.iter().flat_map(|r| &r.versions) {
        let entry = merged.entry(&version.version).or_default();
        entry.0 += version.resolved_total;
        entry.1 += version.pending;
        entry.2.merge(&version.window);
    }
    merged
        .into_iter()
        .map(|(version, (resolved_total, pending, window))| VersionQuality {
            version: version.to_owned(),
            resolved_total,
            pending,
            figures: window.figures(),
            window,
        })
        .collect()
}

impl RolloutView {
    /// The rollout an inference server lists (`GET /v1/models`).
    pub fn of(models: Vec<ModelStatus>) -> Self {
        let mut view = RolloutView::default();
        for model in models {
            match (model.state.as_str(), model.version) {
                ("stable", Some(version)) => view.stable = Some(version),
                ("canary", Some(version)) => {
                    view.canary =
                        Some(CanaryView { version, share: model.canary_share.unwrap_or(0.0), auto: model.auto })
                }
                _ => {}
            }
        }
        view
    }
}

/// Records the quality figures of the stable and the canary model as gauges.
pub fn record_metrics(view: &RolloutView, versions: &[VersionQuality]) {
    for version in versions {
        let role = if view.stable.as_deref() == Some(version.version.as_str()) {
            "stable"
        } else if view.canary.as_ref().is_some_and(|c| c.version == version.version) {
            "canary"
        } else {
            continue;
        };
        for (figure, value) in version.figures.named() {
            if let Some(value) = value {
                metrics::gauge!("control_model_quality", "role" => role, "figure" => figure).set(value);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use domain::quality::ResolvedOutcome;

    /// A version whose window holds `n` outcomes: `right` of every 10 ranked and classed right.
    fn version(name: &str, n: usize, right: usize) -> VersionQuality {
        let outcomes: Vec<ResolvedOutcome> = (0..n)
            .map(|i| {
                let long = i % 2 == 0;
                let correct = i % 10 < right;
                let says_long = long == correct;
                ResolvedOutcome {
                    p_long: if says_long { 0.9 } else { 0.1 },
                    predicted_long: says_long,
                    realized_long: long,
                    lifetime_log10_error: None,
                }
            })
            .collect();
        let window = QualityTally::of(&outcomes);
        VersionQuality {
            version: name.to_owned(),
            resolved_total: n as u64,
            pending: 0,
            figures: window.figures(),
            window,
        }
    }

    fn config() -> QualityConfig {
        QualityConfig {
            min_resolved: 100,
            min_precision: Some(0.6),
            min_average_precision: None,
            min_roc_auc: None,
            hysteresis: 0.02,
            ..QualityConfig::default()
        }
    }

    fn stable(version: &str) -> RolloutView {
        RolloutView { stable: Some(version.to_owned()), canary: None }
    }

    #[test]
    fn the_gate_closes_below_a_floor_and_opens_with_hysteresis_or_a_new_bundle() {
        let watch = QualityWatch::new(config());
        // Too few resolved VMs: not judged.
        watch.observe(&stable("bad"), vec![version("bad", 50, 2)]);
        assert!(!watch.gates(Some("bad")));
        watch.observe(&stable("bad"), vec![version("bad", 200, 2)]);
        assert!(watch.gates(Some("bad")) && !watch.gates(Some("other")) && !watch.gates(None));
        let status = watch.status();
        assert!(status.gated && status.reason.as_deref().unwrap().contains("precision 0.200"), "{status:?}");
        // 0.6 is the floor but not floor + hysteresis: still closed.
        watch.observe(&stable("bad"), vec![version("bad", 200, 6)]);
        assert!(watch.gates(Some("bad")));
        watch.observe(&stable("bad"), vec![version("bad", 200, 7)]);
        assert!(!watch.gates(Some("bad")));
        assert_eq!((watch.status().trips, watch.status().recoveries), (1, 1));
        // Closed again, then a good bundle becomes stable: open for it.
        watch.observe(&stable("bad"), vec![version("bad", 200, 1)]);
        assert!(watch.gates(Some("bad")));
        watch.observe(&stable("good"), vec![version("bad", 200, 1)]);
        assert!(!watch.gates(Some("bad")) && !watch.status().gated);
    }

    #[test]
    fn a_gate_without_floors_never_closes() {
        let watch = QualityWatch::new(QualityConfig { min_precision: None, ..config() });
        watch.observe(&stable("bad"), vec![version("bad", 500, 0)]);
        assert!(!watch.gates(Some("bad")) && !watch.status().gate_enabled);
    }

    #[test]
    fn canaries_are_promoted_or_rolled_back_on_evidence_once() {
        let auto = Some(AutoCanary { min_resolved: Some(100), margin: 0.01 });
        let view = |canary: &str| RolloutView {
            stable: Some("s".to_owned()),
            canary: Some(CanaryView { version: canary.to_owned(), share: 0.5, auto }),
        };
        let watch = QualityWatch::new(config());
        assert_eq!(watch.observe(&view("better"), vec![version("s", 200, 7), version("better", 50, 9)]), None);
        // Enough VMs, but a difference within the noise of 75 long-lived VMs a side: undecided.
        assert_eq!(watch.observe(&view("better"), vec![version("s", 150, 8), version("better", 150, 9)]), None);
        let decision =
            watch.observe(&view("better"), vec![version("s", 1_000, 7), version("better", 1_000, 9)]).unwrap();
        assert_eq!(decision.verdict, "promote");
        assert!(decision.canary_average_precision > decision.stable_average_precision);
        // Decided: not again while the rollout catches up.
        assert_eq!(watch.observe(&view("better"), vec![version("s", 1_000, 7), version("better", 1_000, 9)]), None);
        let decision = watch.observe(&view("worse"), vec![version("s", 1_000, 8), version("worse", 1_000, 6)]).unwrap();
        assert_eq!(decision.verdict, "rollback");
        // Not carried out: decided again next time.
        watch.record_decision(decision);
        assert!(watch.observe(&view("worse"), vec![version("s", 1_000, 8), version("worse", 1_000, 6)]).is_some());
        // Without `auto`, nothing is decided.
        let manual = RolloutView {
            stable: Some("s".into()),
            canary: Some(CanaryView { version: "m".into(), share: 0.5, auto: None }),
        };
        assert_eq!(watch.observe(&manual, vec![version("s", 200, 8), version("m", 150, 1)]), None);
    }

    #[test]
    fn zones_add_up_per_version() {
        let a = QualityReport { versions: vec![version("v", 100, 8), version("w", 10, 5)], ..QualityReport::default() };
        let b = QualityReport { versions: vec![version("v", 100, 8)], ..QualityReport::default() };
        let merged = merge_versions(&[a, b]);
        let v = merged.iter().find(|q| q.version == "v").unwrap();
        assert_eq!((v.resolved_total, v.window.resolved), (200, 200));
        assert_eq!(v.figures.precision, version("v", 200, 8).figures.precision);
        assert_eq!(merged.len(), 2);
    }
}
