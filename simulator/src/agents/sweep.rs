//! The agent sweep: [`super::run_agents`] over numbers of agents by lags by seeds, run in parallel,
//! with its table (rows: means over seeds with their spread; the packing density lost against
//! one agent paired by seed) and its plot (conflict rate and density lost against the number of
//! agents, one line per lag).
//!
//! One agent sees its own commits at once, whatever the lag, so `N = 1` runs once per seed and
//! is every lag's reference.

use super::{run_agents, AgentsConfig, AgentsResult, Assignment, Avoidance, Lag, OnFailure, RetryMode};
use crate::compare::Spread;
use crate::engine::{SimConfig, SimError};
#[cfg(feature = "plots")]
use crate::plot::{self, Panel, RangedSeries};
use crate::workload::Workload;
use placement::Registry;
use serde::{Deserialize, Serialize};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

/// What a sweep runs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SweepSpec {
    pub agents: Vec<usize>,
    pub lags: Vec<Lag>,
    pub seeds: Vec<u64>,
    pub assignment: Assignment,
    pub max_attempts: u32,
    pub avoidance: Option<Avoidance>,
    pub on_failure: OnFailure,
    pub retry: RetryMode,
}

impl SweepSpec {
    pub fn validate(&self) -> Result<(), SimError> {
        if self.agents.is_empty() || self.agents.contains(&0) {
            return Err(SimError::Invalid { field: "agents", message: "give at least one number >= 1".into() });
        }
        if self.lags.is_empty() {
            return Err(SimError::Invalid { field: "lags", message: "give at least one lag".into() });
        }
        if self.seeds.is_empty() {
            return Err(SimError::Invalid { field: "seeds", message: "give at least one seed".into() });
        }
        Ok(())
    }

    /// The runs, largest first (so that the long ones start early): `N = 1` once per seed.
    pub fn plan(&self) -> Vec<(usize, Lag, u64)> {
        let mut agents = self.agents.clone();
        agents.sort_unstable();
        agents.dedup();
        let mut plan = Vec::new();
        for &n in agents.iter().rev() {
            let lags: &[Lag] = if n == 1 { &[Lag::Commits(0)] } else { &self.lags };
            for &lag in lags {
                for &seed in &self.seeds {
                    plan.push((n, lag, seed));
                }
            }
        }
        plan
    }
}

/// One run of a sweep.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SweepRun {
    pub agents: usize,
    pub lag: Lag,
    pub seed: u64,
    pub result: AgentsResult,
}

/// One (agents, lag) cell: means over seeds and their spread.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SweepRow {
    pub agents: usize,
    pub lag: Lag,
    pub seeds: Vec<u64>,
    pub conflict_rate_pct: Spread,
    pub conflicts: Spread,
    pub retries: Spread,
    pub failed: Spread,
    pub dropped: Spread,
    pub rejected: Spread,
    pub follow_rebuilds: Spread,
    pub packing_density_pct: Spread,
    pub empty_hosts_pct: Spread,
    /// Packing density of one agent with the same seed minus this row's, pp.
    pub density_loss_pp: Spread,
    /// Empty hosts of one agent with the same seed minus this row's, pp.
    pub empty_hosts_loss_pp: Spread,
    pub wall_s: Spread,
}

/// A sweep's outcome.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Sweep {
    pub title: String,
    /// The settings of every run (its seed aside).
    pub base: SimConfig,
    pub spec: SweepSpec,
    pub rows: Vec<SweepRow>,
    pub runs: Vec<SweepRun>,
}

/// Runs `spec` over `base` on `workload`, `jobs` runs at a time; `progress(events)` receives every
/// run's events as they are done (from several threads).
pub fn run_sweep(
    title: &str,
    workload: &Workload,
    base: &SimConfig,
    spec: &SweepSpec,
    registry: &Registry,
    jobs: usize,
    progress: &(dyn Fn(u64) + Sync),
) -> Result<Sweep, SimError> {
    spec.validate()?;
    let plan = spec.plan();
    let next = AtomicUsize::new(0);
    let slots: Vec<Mutex<Option<Result<AgentsResult, SimError>>>> = plan.iter().map(|_| Mutex::new(None)).collect();
    std::thread::scope(|scope| {
        for _ in 0..jobs.clamp(1, plan.len().max(1)) {
            scope.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(&(agents, lag, seed)) = plan.get(i) else { break };
                let config = SimConfig { seed, ..base.clone() };
                let agents = AgentsConfig {
                    agents,
                    lag,
                    assignment: spec.assignment,
                    max_attempts: spec.max_attempts,
                    avoidance: spec.avoidance,
                    on_failure: spec.on_failure,
                    retry: spec.retry,
                    record_placements: false,
                };
                let mut reported = 0;
                let result = run_agents(workload, &config, &agents, registry, |done| {
                    progress(done.saturating_sub(reported));
                    reported = done;
                });
                if let Ok(mut slot) = slots[i].lock() {
                    *slot = Some(result);
                }
            });
        }
    });
    let mut runs = Vec::with_capacity(plan.len());
    for (&(agents, lag, seed), slot) in plan.iter().zip(slots) {
        let result = slot.into_inner().ok().flatten().ok_or_else(|| SimError::Invalid {
            field: "agents",
            message: format!("the run of {agents} agents, lag {lag}, seed {seed} did not finish"),
        })??;
        runs.push(SweepRun { agents, lag, seed, result });
    }
    runs.sort_by_key(|r| (r.agents, r.lag.to_string(), r.seed));
    let rows = rows(spec, &runs);
    Ok(Sweep { title: title.to_owned(), base: base.clone(), spec: spec.clone(), rows, runs })
}

/// The rows: for every lag, every number of agents (one agent's runs in every lag).
pub fn rows(spec: &SweepSpec, runs: &[SweepRun]) -> Vec<SweepRow> {
    let one: Vec<&SweepRun> = runs.iter().filter(|r| r.agents == 1).collect();
    let one_by_seed = |seed: u64| one.iter().find(|r| r.seed == seed);
    let mut agents = spec.agents.clone();
    agents.sort_unstable();
    agents.dedup();
    let mut rows = Vec::new();
    for &lag in &spec.lags {
        for &n in &agents {
            let cell: Vec<&SweepRun> = runs.iter().filter(|r| r.agents == n && (n == 1 || r.lag == lag)).collect();
            if cell.is_empty() {
                continue;
            }
            let of =
                |f: &dyn Fn(&AgentsResult) -> f64| Spread::of(&cell.iter().map(|r| f(&r.result)).collect::<Vec<_>>());
            let paired = |f: &dyn Fn(&AgentsResult) -> f64| {
                let values: Vec<f64> =
                    cell.iter().filter_map(|r| one_by_seed(r.seed).map(|o| f(&o.result) - f(&r.result))).collect();
                Spread::of(&values)
            };
            let density = |r: &AgentsResult| 100.0 * r.metrics.packing_density;
            let empty = |r: &AgentsResult| r.metrics.empty_hosts_pct;
            rows.push(SweepRow {
                agents: n,
                lag,
                seeds: cell.iter().map(|r| r.seed).collect(),
                conflict_rate_pct: of(&|r| r.counters.conflict_rate_pct()),
                conflicts: of(&|r| r.counters.conflicts as f64),
                retries: of(&|r| r.counters.retries as f64),
                failed: of(&|r| r.counters.failed as f64),
                dropped: of(&|r| r.counters.dropped as f64),
                rejected: of(&|r| r.counters.rejected as f64),
                follow_rebuilds: of(&|r| r.counters.follow_rebuilds as f64),
                packing_density_pct: of(&density),
                empty_hosts_pct: of(&empty),
                density_loss_pp: paired(&density),
                empty_hosts_loss_pp: paired(&empty),
                wall_s: of(&|r| r.wall_s),
            });
        }
    }
    rows
}

fn lag_label(lag: Lag) -> String {
    match lag {
        Lag::Commits(1) => "1 commit".to_owned(),
        Lag::Commits(d) => format!("{d} commits"),
        Lag::Seconds(s) => format!("{s} s"),
        Lag::Saturated => "N-1 commits".to_owned(),
    }
}

fn pm(s: &Spread, digits: usize) -> String {
    if s.sd > 0.0 {
        format!("{:.digits$} ±{:.digits$}", s.mean, s.sd)
    } else {
        format!("{:.digits$}", s.mean)
    }
}

/// The sweep as Markdown: the settings, then one table row per (lag, agents).
pub fn markdown(sweep: &Sweep) -> String {
    let mut out = String::new();
    let base = &sweep.base;
    let first = sweep.runs.first().map(|r| &r.result);
    let _ = writeln!(out, "# {}\n", sweep.title);
    if let Some(r) = first {
        let w = &r.workload;
        let _ = writeln!(
            out,
            "- workload: {} VMs ({} warm-up), {:.0} s .. {:.0} s ({:.2} days); averages from {:.0} s",
            w.vms,
            w.warmup_vms,
            w.from_s,
            w.to_s,
            (w.to_s - w.from_s) / 86_400.0,
            base.measured_from_s(w.from_s)
        );
        let _ = writeln!(out, "- inventory: {} hosts of {} cores / {} GiB", w.hosts, w.host_cores, w.host_memory_gib);
    }
    let _ = writeln!(
        out,
        "- policy `{}` (buckets {:?}), prediction {}, tie-break {:?}",
        base.policy.kind,
        base.policy.buckets,
        base.prediction.label(),
        base.tie_break
    );
    let _ = match sweep.spec.avoidance {
        Some(a) if a.share => writeln!(
            out,
            "- conflict avoidance with shares: with other agents, the best of the agent's own share of the hosts among the top {}, or else among the top {} per agent",
            a.top, a.top
        ),
        Some(a) => writeln!(
            out,
            "- conflict avoidance: a random draw among the top {} hosts, {} x the refused share of the last {} commit attempts",
            a.top, a.gain, a.window
        ),
        None => writeln!(out, "- no conflict avoidance"),
    };
    let _ = writeln!(
        out,
        "- arrivals to agents: {:?}; a refused VM decided again {:?}, {} attempts at one agent, then 503 and {:?}; seeds {:?}\n",
        sweep.spec.assignment, sweep.spec.retry, sweep.spec.max_attempts, sweep.spec.on_failure, sweep.spec.seeds
    );
    let drop = sweep.spec.on_failure == OnFailure::Drop;
    out.push_str("| lag | agents | conflicts % | retries | 503s |");
    if drop {
        out.push_str(" dropped |");
    }
    out.push_str(" rejected | view rebuilds | packing density % | loss pp | empty hosts % | loss pp |\n");
    out.push_str(if drop {
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n"
    } else {
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n"
    });
    for row in &sweep.rows {
        let _ = write!(
            out,
            "| {} | {} | {} | {} | {} |",
            lag_label(row.lag),
            row.agents,
            pm(&row.conflict_rate_pct, 3),
            pm(&row.retries, 0),
            pm(&row.failed, 0),
        );
        if drop {
            let _ = write!(out, " {} |", pm(&row.dropped, 0));
        }
        let _ = writeln!(
            out,
            " {} | {} | {} | {} | {} | {} |",
            pm(&row.rejected, 0),
            pm(&row.follow_rebuilds, 0),
            pm(&row.packing_density_pct, 2),
            pm(&row.density_loss_pp, 2),
            pm(&row.empty_hosts_pct, 2),
            pm(&row.empty_hosts_loss_pp, 2),
        );
    }
    out
}

#[cfg(feature = "plots")]
/// The plot: conflict rate and packing density lost against the number of agents, one line per
/// lag, whiskers over the seeds' range.
pub fn plot(sweep: &Sweep, path: &Path) -> Result<(), plot::PlotError> {
    plot_many(&[("", sweep)], &sweep.title, path)
}

#[cfg(feature = "plots")]
/// [`plot`] of several sweeps in one figure (e.g. with and without conflict avoidance): one line
/// per sweep and lag, named by the sweep's label and the lag.
pub fn plot_many(sweeps: &[(&str, &Sweep)], title: &str, path: &Path) -> Result<(), plot::PlotError> {
    let lines = |f: &dyn Fn(&SweepRow) -> &Spread| -> Vec<RangedSeries> {
        let mut lines = Vec::new();
        for (label, sweep) in sweeps {
            for &lag in &sweep.spec.lags {
                let points = sweep
                    .rows
                    .iter()
                    .filter(|r| r.lag == lag)
                    .map(|r| {
                        let s = f(r);
                        (r.agents as f64, s.mean, Some((s.min, s.max)))
                    })
                    .collect();
                let name = if label.is_empty() {
                    format!("lag {}", lag_label(lag))
                } else {
                    format!("{label}, lag {}", lag_label(lag))
                };
                lines.push(RangedSeries { name, points });
            }
        }
        lines
    };
    let panels = [
        Panel {
            caption: "conflicts".into(),
            y_label: "% of placement commits".into(),
            series: lines(&|r| &r.conflict_rate_pct),
        },
        Panel {
            caption: "packing density lost against one agent".into(),
            y_label: "pp".into(),
            series: lines(&|r| &r.density_loss_pp),
        },
    ];
    plot::panels_log2_svg(path, title, "agents (N)", &panels)
}

/// Writes `results.json`, `summary.md` and (with the `plots` feature) `agents.svg` into `dir`.
pub fn write_outputs(sweep: &Sweep, dir: &Path) -> Result<Vec<PathBuf>, String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    let json = dir.join("results.json");
    let text = serde_json::to_string_pretty(sweep).map_err(|e| format!("encoding the results: {e}"))?;
    std::fs::write(&json, text).map_err(|e| format!("writing {}: {e}", json.display()))?;
    let summary = dir.join("summary.md");
    std::fs::write(&summary, markdown(sweep)).map_err(|e| format!("writing {}: {e}", summary.display()))?;
    #[cfg_attr(not(feature = "plots"), allow(unused_mut))]
    let mut written = vec![json, summary];
    #[cfg(feature = "plots")]
    {
        let svg = dir.join("agents.svg");
        plot(sweep, &svg).map_err(|e| e.to_string())?;
        written.push(svg);
    }
    Ok(written)
}
