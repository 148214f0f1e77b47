//! The human-readable summary `simulate run` prints of one result: one aligned line per subject
//! (window, hosts, outcomes, density, prediction quality, migrations, speed).

use crate::engine::SimResult;

/// Prints the summary of `r` to standard output.
pub(super) fn print_summary(r: &SimResult) {
    let c = &r.counters;
    let m = &r.metrics;
    let pct = |x: f64| format!("{:.2}%", 100.0 * x);
    let mut rows: Vec<(&str, String)> = vec![
        ("policy", r.final_stats.policy.clone()),
        ("prediction", r.prediction.source.clone()),
        (
            "window",
            format!(
                "{:.0} s .. {:.0} s ({:.2} days), {} VMs ({} warm-up)",
                r.workload.from_s,
                r.workload.to_s,
                (r.workload.to_s - r.workload.from_s) / 86_400.0,
                r.workload.vms,
                r.workload.warmup_vms
            ),
        ),
        (
            "hosts",
            format!(
                "{} x {} cores / {} GiB (peak demand {:.0} cores, {:.0} GiB)",
                r.workload.hosts,
                r.workload.host_cores,
                r.workload.host_memory_gib,
                r.workload.peak.cores,
                r.workload.peak.memory_gib
            ),
        ),
        ("arrivals", c.arrivals.to_string()),
        ("placed", c.placed.to_string()),
        (
            "rejected",
            if c.rejected == 0 {
                "0".to_owned()
            } else {
                let reasons: Vec<String> = c.rejected_by_reason.iter().map(|(k, v)| format!("{k} {v}")).collect();
                format!(
                    "{} ({:.3}%: {})",
                    c.rejected,
                    100.0 * c.rejected as f64 / c.arrivals.max(1) as f64,
                    reasons.join(", ")
                )
            },
        ),
        ("exits", c.exits.to_string()),
        ("packing density", format!("{} (offline bound {})", pct(m.packing_density), pct(m.bound_packing_density))),
        ("empty hosts", format!("{:.2}% (offline bound {:.2}%)", m.empty_hosts_pct, m.bound_empty_hosts_pct)),
        ("empty-to-free", format!("{:.3}", m.empty_to_free)),
    ];
    if let (Some(cpu), Some(mem)) = (m.stranded_cpu_pct, m.stranded_memory_pct) {
        rows.push(("stranded", format!("{cpu:.2}% CPU, {mem:.2}% memory")));
    }
    rows.push(("filtering factor", format!("{:.2}% of hosts", r.filtering.mean_pct)));
    if r.prediction.source != "none" {
        rows.push((
            "long class",
            format!(
                "precision {:.3}, recall {:.3}, accuracy {:.3} ({} fallbacks)",
                r.prediction.precision_long, r.prediction.recall_long, r.prediction.accuracy, r.prediction.fallbacks
            ),
        ));
    }
    if let Some(q) = &r.quality {
        let f = &q.figures;
        let figure = |v: Option<f64>| v.map_or_else(|| "-".to_owned(), |v| format!("{v:.3}"));
        rows.push((
            "realized quality",
            format!(
                "precision {}, recall {}, ROC AUC {}, AP {}, log10 MAE {} ({} resolved, {} unresolved, `{}`)",
                figure(f.precision),
                figure(f.recall),
                figure(f.roc_auc),
                figure(f.average_precision),
                figure(f.lifetime_log10_mae),
                f.resolved,
                q.unresolved,
                q.version
            ),
        ));
    }
    if r.config.drains.is_some() {
        let g = &c.migrations;
        rows.push((
            "LARS drains",
            format!(
                "{} started, {} done; migrations {} performed, {} avoided, {} cancelled, {} without target",
                g.drains_started, g.drains_completed, g.performed, g.avoided, g.cancelled, g.no_target
            ),
        ));
    }
    if let Some(g) = &c.consolidation {
        rows.push((
            "consolidation",
            format!(
                "{} hosts emptied of {} started ({} given back); {} migrations ({} avoided, {} cancelled); {} in \
                 flight at most",
                g.hosts_emptied,
                g.hosts_started,
                g.hosts_abandoned,
                g.migrations_completed,
                g.avoided,
                g.cancelled,
                c.consolidation_in_flight_limit.unwrap_or_default()
            ),
        ));
    }
    if let Some(most) = c.consolidation_budget_shortfall {
        rows.push((
            "BUDGET NOT CARRIED OUT",
            format!(
                "{} migrations in flight carry out at most {most:.3} per host-day, below the budget; use \
                 in-flight=auto or raise it",
                c.consolidation_in_flight_limit.unwrap_or_default()
            ),
        ));
    }
    if m.migrations_spent() > 0 {
        let (wasted_pct, wasted_6h_pct) = m.wasted_pct();
        rows.push((
            "migrations (measured)",
            format!(
                "{} spent ({:.4} per host-day, {:.2} per 100 placements): {} completed, {} cancelled; wasted {}                  within 1 h ({:.1}%), {} within 6 h ({:.1}%), cancelled ones included; {:.0} GiB moved",
                m.migrations_spent(),
                m.migrations_per_host_day,
                m.migrations_per_100_placements,
                m.migrations,
                m.migrations_cancelled,
                m.migrations_wasted,
                wasted_pct,
                m.migrations_wasted_6h,
                wasted_6h_pct,
                m.migrated_gib
            ),
        ));
    }
    let t = &r.timing;
    rows.push((
        "speed",
        format!(
            "{:.2} s for {} events ({:.0} events/s), {:.0} decisions/s in allocate, predictions {:.2} s",
            t.wall_s, t.events, t.events_per_s, t.decisions_per_s, t.prediction_s
        ),
    ));
    let width = rows.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
    for (key, value) in rows {
        println!("{key:<width$}  {value}");
    }
}
