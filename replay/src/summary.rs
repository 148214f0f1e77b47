//! The plain-text [`Summary`] of a run, with the realized prediction quality per model version ([`QualitySummary`]).

use crate::*;
use domain::quality::{CanaryDecision, QualityFigures, QualityStatus};
use domain::ControlStats;
use serde::Serialize;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use traces::stats::format_duration;

/// One model version's realized quality at the end of the run.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct VersionSummary {
    pub version: String,
    /// `stable`, `canary`, or empty for a version no longer deployed.
    pub role: String,
    /// Outcomes resolved since the allocators started, in the window or not (every zone's).
    pub resolved_total: u64,
    /// VMs placed with its predictions whose outcomes are not in the window yet.
    pub pending: u64,
    /// What the zones' windows amount to, added up.
    pub figures: QualityFigures,
}

/// The realized prediction quality at the end of the run (the control service's `/v1/stats`
/// `quality`): the quality gate and, per model version, the figures of every zone's window added
/// up. The windows are the allocators' (outcomes since they started, the last `[quality] window`
/// per version), so they hold this run's VMs only on allocators that started fresh.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct QualitySummary {
    pub gate_enabled: bool,
    pub gated: bool,
    pub gate_reason: Option<String>,
    /// Since the control service started.
    pub gate_trips: u64,
    pub gate_recoveries: u64,
    pub stable_version: Option<String>,
    pub canary_version: Option<String>,
    /// Most recently seen version first, as the service lists them.
    pub versions: Vec<VersionSummary>,
    pub last_canary_decision: Option<CanaryDecision>,
}

impl QualitySummary {
    pub fn of(status: &QualityStatus) -> Self {
        let role = |version: &str| {
            if status.stable_version.as_deref() == Some(version) {
                "stable"
            } else if status.canary_version.as_deref() == Some(version) {
                "canary"
            } else {
                ""
            }
        };
        QualitySummary {
            gate_enabled: status.gate_enabled,
            gated: status.gated,
            gate_reason: status.reason.clone(),
            gate_trips: status.trips,
            gate_recoveries: status.recoveries,
            stable_version: status.stable_version.clone(),
            canary_version: status.canary_version.clone(),
            versions: status
                .versions
                .iter()
                .map(|v| VersionSummary {
                    version: v.version.clone(),
                    role: role(&v.version).to_owned(),
                    resolved_total: v.resolved_total,
                    pending: v.pending,
                    figures: v.figures.clone(),
                })
                .collect(),
            last_canary_decision: status.last_canary_decision.clone(),
        }
    }

    /// The gate's state in words.
    pub(crate) fn gate_state(&self) -> String {
        if !self.gate_enabled {
            "off (measured only)".to_owned()
        } else if self.gated {
            format!("CLOSED: {}", self.gate_reason.as_deref().unwrap_or("no reason given"))
        } else {
            "open".to_owned()
        }
    }
}

/// What was replayed and how.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct RunInfo {
    pub control: String,
    /// The trace file, or `synthetic (D days, seed S)`.
    pub trace: String,
    pub vm_id_prefix: String,
    pub from_s: f64,
    pub to_s: f64,
    pub vms_planned: usize,
    pub releases_planned: usize,
    pub speed: f64,
    pub max_rate: Option<f64>,
    pub concurrency: usize,
    pub keep: bool,
    /// Real seconds from the first request to the end of the last release.
    pub wall_s: f64,
    /// Stopped early by Ctrl-C.
    pub interrupted: bool,
    /// `/v1/stats` samples that failed.
    pub sample_errors: u64,
}

/// Allocation requests and their answers.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct RequestSummary {
    pub total: u64,
    pub placed: u64,
    pub rejected: u64,
    pub rejected_by_code: BTreeMap<String, u64>,
    pub replayed: u64,
    pub errors: u64,
    pub errors_by_kind: BTreeMap<String, u64>,
    pub error_rate: f64,
    pub error_samples: Vec<String>,
    /// Allocation requests per real second over the run.
    pub rate_per_s: f64,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Latencies {
    /// Measured by the client around each `POST /allocate`, body included.
    pub client: LatencySummary,
    /// The control service's `latency_us.total_us`.
    pub server_total: LatencySummary,
}

/// The whole report of a run; `--json` writes it as is.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Summary {
    pub run: RunInfo,
    pub requests: RequestSummary,
    pub releases: ReleaseTally,
    pub latency: Latencies,
    /// Each VM's prediction source, from the answers.
    pub predictions_by_source: BTreeMap<String, u64>,
    /// From the control service's `/v1/stats`; `None` when the end snapshot failed.
    pub control_stats: Option<StatsDelta>,
    /// The realized prediction quality at the end; `None` when the end snapshot failed.
    pub quality: Option<QualitySummary>,
    /// The migrations confirmed as the allocator's orchestrator (`--confirm-migrations`).
    pub migrations: Option<MigrationSummary>,
    /// The SVG files written (`--plot` and its quality plot), named in the text.
    pub plots: Vec<String>,
    pub series: Vec<SeriesPoint>,
}

impl Summary {
    pub fn new(run: RunInfo, tally: Tally, control_stats: Option<StatsDelta>, series: Vec<SeriesPoint>) -> Self {
        let rate_per_s = if run.wall_s > 0.0 { tally.requests as f64 / run.wall_s } else { 0.0 };
        Summary {
            requests: RequestSummary {
                total: tally.requests,
                placed: tally.placed,
                rejected: tally.rejected,
                error_rate: tally.error_rate(),
                rejected_by_code: tally.rejected_by_code,
                replayed: tally.replayed,
                errors: tally.errors,
                errors_by_kind: tally.errors_by_kind,
                error_samples: tally.error_samples,
                rate_per_s,
            },
            releases: tally.releases,
            latency: Latencies {
                client: LatencySummary::from_us(&tally.client_latency_us),
                server_total: LatencySummary::from_us(&tally.server_total_us),
            },
            predictions_by_source: tally.predictions_by_source,
            control_stats,
            quality: None,
            migrations: None,
            plots: Vec::new(),
            series,
            run,
        }
    }

    /// The same summary with the realized quality of `stats` (the end of the run, or later).
    pub fn with_quality(mut self, stats: Option<&ControlStats>) -> Self {
        self.quality = stats.map(|stats| QualitySummary::of(&stats.quality));
        self
    }

    /// The readable plain-text report.
    pub fn render(&self) -> String {
        let mut out = String::new();
        // Writing to a String cannot fail.
        let _ = self.render_into(&mut out);
        out
    }

    fn render_into(&self, out: &mut String) -> std::fmt::Result {
        let run = &self.run;
        let req = &self.requests;
        let rate = run.max_rate.map_or_else(|| "no rate cap".to_owned(), |r| format!("at most {r} requests/s"));
        writeln!(out, "vmreplay against {}", run.control)?;
        writeln!(
            out,
            "trace     {}: {} VMs starting in trace time [{:.0} s, {:.0} s] ({}), {}",
            run.trace,
            run.vms_planned,
            run.from_s,
            run.to_s,
            format_duration(run.to_s - run.from_s),
            if run.vm_id_prefix.is_empty() {
                "the trace's VM ids".to_owned()
            } else {
                format!("VM ids prefixed `{}-`", run.vm_id_prefix)
            }
        )?;
        writeln!(out, "pacing    speed {}x, {rate}, concurrency {}", run.speed, run.concurrency)?;
        let state = if run.interrupted { "interrupted (Ctrl-C)" } else { "completed" };
        writeln!(out, "run       {state} in {:.1} s real ({:.1} allocations/s)", run.wall_s, req.rate_per_s)?;
        writeln!(out)?;
        writeln!(out, "requests  {:>8}", req.total)?;
        writeln!(out, "  placed  {:>8}", req.placed)?;
        writeln!(out, "  rejected{:>8}{}", req.rejected, breakdown(&req.rejected_by_code))?;
        writeln!(out, "  replayed{:>8}", req.replayed)?;
        writeln!(out, "  errors  {:>8}{}", req.errors, breakdown(&req.errors_by_kind))?;
        for sample in &req.error_samples {
            writeln!(out, "      e.g. {sample}")?;
        }
        let rel = &self.releases;
        writeln!(
            out,
            "releases  {:>8}   released {}, not found {}, errors {}{} (at the end of the run: {}; left placed: {})",
            rel.requests,
            rel.released,
            rel.not_found,
            rel.errors,
            breakdown(&rel.errors_by_kind),
            rel.at_end,
            rel.left_placed
        )?;
        writeln!(out)?;
        writeln!(out, "latency (ms)        p50       p99       max")?;
        for (name, lat) in [("client", &self.latency.client), ("server total", &self.latency.server_total)] {
            writeln!(out, "  {name:<12} {:>9} {:>9} {:>9}", ms(lat.p50_ms), ms(lat.p99_ms), ms(lat.max_ms))?;
        }
        writeln!(out)?;
        match &self.control_stats {
            Some(delta) => {
                let hit_rate = delta.cache_hit_rate.map_or_else(|| "-".to_owned(), |r| format!("{:.1}%", r * 100.0));
                writeln!(
                    out,
                    "cache     hit rate {hit_rate} ({} hits, {} misses)",
                    delta.cache_hits, delta.cache_misses
                )?;
                writeln!(out, "fallbacks {}", list_or_none(&delta.fallbacks))?;
                let active = if delta.safeguard_active_at_end { "active" } else { "inactive" };
                writeln!(out, "safeguard {} trips ({active} at the end)", delta.safeguard_trips)?;
                if delta.counters_reset {
                    writeln!(
                        out,
                        "          (the control service restarted during the run: its figures count from then)"
                    )?;
                }
            }
            None => writeln!(out, "cache, fallbacks, safeguard: unknown (the final /v1/stats failed)")?,
        }
        writeln!(out, "predictions {}", list_or_none(&self.predictions_by_source))?;
        if let Some(migrations) = &self.migrations {
            migrations.render_into(out)?;
        }
        writeln!(out)?;
        self.render_quality(out)?;
        self.render_series(out)?;
        self.render_quality_series(out)?;
        if !self.plots.is_empty() {
            writeln!(out)?;
            writeln!(out, "plots     {}", self.plots.join(", "))?;
        }
        Ok(())
    }

    fn render_quality(&self, out: &mut String) -> std::fmt::Result {
        let Some(quality) = &self.quality else {
            return writeln!(out, "realized quality: unknown (the final /v1/stats failed)\n");
        };
        let trips = self.control_stats.as_ref().map_or(0, |d| d.quality_gate_trips);
        writeln!(
            out,
            "realized quality (each zone's window of resolved outcomes, cohorts complete, added up per model version)"
        )?;
        writeln!(
            out,
            "  gate    {}; {trips} trips during the run ({} trips, {} recoveries since the service started)",
            quality.gate_state(),
            quality.gate_trips,
            quality.gate_recoveries
        )?;
        if let Some(decision) = &quality.last_canary_decision {
            writeln!(
                out,
                "  canary  last decision: {} {} (AP {:.3} vs stable {} {:.3}, {} / {} resolved{})",
                decision.verdict,
                decision.canary_version,
                decision.canary_average_precision,
                decision.stable_version,
                decision.stable_average_precision,
                decision.canary_resolved,
                decision.stable_resolved,
                if decision.applied { "" } else { ", not applied" }
            )?;
        }
        if quality.versions.is_empty() {
            writeln!(out, "  no model version has resolved outcomes yet")?;
            return writeln!(out);
        }
        writeln!(
            out,
            "  {:<20} {:<6} {:>9} {:>8} {:>9} {:>7} {:>7} {:>7} {:>14} {:>7} {:>7}",
            "version",
            "role",
            "resolved",
            "pending",
            "precision",
            "recall",
            "ROC AUC",
            "AP",
            "long realized",
            "pred.",
            "mean p"
        )?;
        for v in &quality.versions {
            let f = &v.figures;
            writeln!(
                out,
                "  {:<20} {:<6} {:>9} {:>8} {:>9} {:>7} {:>7} {:>7} {:>14} {:>7} {:>7}",
                v.version,
                v.role,
                f.resolved,
                v.pending,
                fig(f.precision),
                fig(f.recall),
                fig(f.roc_auc),
                fig(f.average_precision),
                pct(f.realized_long_share),
                pct(f.predicted_long_share),
                fig(f.mean_p_long),
            )?;
        }
        writeln!(out)
    }

    fn render_quality_series(&self, out: &mut String) -> std::fmt::Result {
        let sampled: Vec<&SeriesPoint> = self.series.iter().filter(|p| !p.quality.is_empty()).collect();
        if sampled.is_empty() {
            return Ok(());
        }
        let rows = thin_indices(sampled.len(), TABLE_ROWS);
        writeln!(out)?;
        writeln!(out, "realized quality over time ({} of {} samples)", rows.len(), sampled.len())?;
        writeln!(
            out,
            "  {:>8}  {:>14}  {:<20} {:>9} {:>7} {:>7} {:>9} {:>7}",
            "real s", "trace s", "version", "resolved", "ROC AUC", "AP", "precision", "recall"
        )?;
        for i in rows {
            let p = sampled[i];
            for q in &p.quality {
                writeln!(
                    out,
                    "  {:>8.1}  {:>14.0}  {:<20} {:>9} {:>7} {:>7} {:>9} {:>7}",
                    p.elapsed_s,
                    p.trace_s,
                    q.version,
                    q.resolved,
                    fig(q.roc_auc),
                    fig(q.average_precision),
                    fig(q.precision),
                    fig(q.recall)
                )?;
            }
        }
        Ok(())
    }

    fn render_series(&self, out: &mut String) -> std::fmt::Result {
        if self.series.is_empty() {
            return writeln!(out, "time series: no /v1/stats sample");
        }
        let rows = thin_indices(self.series.len(), TABLE_ROWS);
        writeln!(out, "time series ({} of {} samples)", rows.len(), self.series.len())?;
        writeln!(
            out,
            "  {:>8}  {:>14}  {:>9}  {:>13}  {:>7}  {:>11}",
            "real s", "trace s", "VMs alive", "allocator VMs", "density", "empty hosts"
        )?;
        for i in rows {
            let p = &self.series[i];
            writeln!(
                out,
                "  {:>8.1}  {:>14.0}  {:>9}  {:>13}  {:>7}  {:>11}",
                p.elapsed_s,
                p.trace_s,
                p.vms_alive,
                p.allocator_vms.map_or_else(|| "-".to_owned(), |v| v.to_string()),
                p.packing_density.map_or_else(|| "-".to_owned(), |d| format!("{:.1}%", d * 100.0)),
                p.empty_hosts_pct.map_or_else(|| "-".to_owned(), |e| format!("{e:.1}%")),
            )?;
        }
        Ok(())
    }
}

/// A figure in [0, 1] to three decimals, `-` when absent.
fn fig(value: Option<f64>) -> String {
    value.map_or_else(|| "-".to_owned(), |v| format!("{v:.3}"))
}

/// A share as a percentage, `-` when absent.
fn pct(value: Option<f64>) -> String {
    value.map_or_else(|| "-".to_owned(), |v| format!("{:.1}%", v * 100.0))
}

fn ms(value: Option<f64>) -> String {
    value.map_or_else(|| "-".to_owned(), |v| format!("{v:.2}"))
}

fn list_or_none(counts: &BTreeMap<String, u64>) -> String {
    if counts.is_empty() {
        "none".to_owned()
    } else {
        counts.iter().map(|(name, n)| format!("{name} {n}")).collect::<Vec<_>>().join(", ")
    }
}

fn breakdown(counts: &BTreeMap<String, u64>) -> String {
    if counts.is_empty() {
        String::new()
    } else {
        format!("   ({})", list_or_none(counts))
    }
}
