//! The comparison written out: `results.json`, the Markdown `summary.md` and (with the `plots` feature) the SVG plots.

use super::*;

/// Of the VMs that drains had to move, the share actually migrated (the rest exited first): the
/// figure LARS lowers (paper 000 Table 2), comparable between runs whose drains met different VMs.
fn migrated_share(m: &crate::engine::MigrationCounters) -> String {
    let drained = m.performed + m.avoided + m.cancelled;
    if drained == 0 {
        return "-".to_owned();
    }
    format!("{:.2}%", 100.0 * m.performed as f64 / drained as f64)
}

fn opt(value: Option<f64>) -> String {
    value.map_or_else(|| "-".to_owned(), |v| format!("{v:.2}"))
}

/// `mean ±sd` with two decimals, the mean signed for gains.
fn spread(s: &Spread, signed: bool) -> String {
    if signed {
        format!("{:+.2} ±{:.2}", s.mean, s.sd)
    } else {
        format!("{:.2} ±{:.2}", s.mean, s.sd)
    }
}

fn kept(k: Option<Kept>) -> String {
    let pct = |v: Option<f64>| v.map_or_else(|| "-".to_owned(), |v| format!("{v:.0}%"));
    k.map_or_else(|| "-".to_owned(), |k| format!("{} / {}", pct(k.packing_density_pct), pct(k.empty_hosts_pct)))
}

/// The Markdown summary of a comparison: the rows over seeds, then every run.
pub fn markdown(comparison: &Comparison) -> String {
    let mut out = String::new();
    let title =
        if comparison.experiment.title.is_empty() { &comparison.experiment.name } else { &comparison.experiment.title };
    let _ = writeln!(out, "### {title}\n");
    if let Some(first) = comparison.runs.first() {
        let w = &first.result.workload;
        let config = &first.plan.config;
        let measured_from = config.measured_from_s(w.from_s);
        let _ = writeln!(
            out,
            "{} VMs ({} warm-up) over {:.1} days, measured over the last {:.1} days; {} hosts of {} cores / {} GiB; \
             baseline `{}`; seeds {:?}; {:?} ties.\n",
            w.vms,
            w.warmup_vms,
            (w.to_s - w.from_s) / 86_400.0,
            (w.to_s - measured_from).max(0.0) / 86_400.0,
            w.hosts,
            w.host_cores,
            w.host_memory_gib,
            comparison.baseline,
            comparison.experiment.seeds(),
            config.tie_break,
        );
    }
    let reference = comparison.experiment.oracle_reference.as_deref();
    let own = comparison.experiment.oracle_prediction.as_deref();
    let _ = write!(
        out,
        "Means over seeds ±1 sample standard deviation; gains are paired with the baseline's run of the same seed."
    );
    if let Some(reference) = reference {
        let _ = write!(
            out,
            " *Kept*: the share of `{reference}`'s mean gain that the row's mean gain is (density / empty hosts)."
        );
    }
    if let Some(own) = own {
        let _ = write!(out, " *Own oracle*: the same for the row's policy with the `{own}` prediction.");
    }
    out.push_str("\n\n| run | packing density % | gain pp | empty hosts % | gain pp |");
    let mut rule = String::from("|---|---:|---:|---:|---:|");
    if reference.is_some() {
        out.push_str(" kept |");
        rule.push_str("---:|");
    }
    if own.is_some() {
        out.push_str(" own oracle |");
        rule.push_str("---:|");
    }
    let with_quality = comparison.rows.iter().any(|row| row.quality.is_some());
    if with_quality {
        out.push_str(" realized precision | recall | ROC AUC | AP |");
        rule.push_str("---:|---:|---:|---:|");
    }
    out.push_str(" rejected |\n");
    rule.push_str("---:|\n");
    out.push_str(&rule);
    for row in &comparison.rows {
        let _ = write!(
            out,
            "| {} | {} | {} | {} | {} |",
            row.cell.label,
            spread(&row.packing_density_pct, false),
            spread(&row.packing_density_gain_pp, true),
            spread(&row.empty_hosts_pct, false),
            spread(&row.empty_hosts_gain_pp, true),
        );
        if reference.is_some() {
            let _ = write!(out, " {} |", kept(row.kept_of_reference));
        }
        if own.is_some() {
            let _ = write!(out, " {} |", kept(row.kept_of_own_oracle));
        }
        if with_quality {
            let q = row.quality.as_ref();
            for figure in [
                q.and_then(|q| q.precision),
                q.and_then(|q| q.recall),
                q.and_then(|q| q.roc_auc),
                q.and_then(|q| q.average_precision),
            ] {
                let _ = write!(
                    out,
                    " {} |",
                    figure.map_or_else(|| "-".to_owned(), |s| format!("{:.3} ±{:.3}", s.mean, s.sd))
                );
            }
        }
        let _ = writeln!(out, " {:.0} |", row.rejected.mean);
    }
    if let Some(first) = comparison.runs.first() {
        let m = &first.result.metrics;
        let _ = writeln!(
            out,
            "| offline bound (seed {}) | {:.2} | | {:.2} | |{}{}{} |",
            first.plan.config.seed,
            100.0 * m.bound_packing_density,
            m.bound_empty_hosts_pct,
            if reference.is_some() { " |" } else { "" },
            if own.is_some() { " |" } else { "" },
            if with_quality { " | | | |" } else { "" },
        );
    }
    if comparison.runs.iter().any(|r| r.result.metrics.migrations_spent() > 0) {
        migrations_markdown(&mut out, comparison);
    }
    if !comparison.crossings.is_empty() {
        crossings_markdown(&mut out, comparison);
    }
    windows_markdown(&mut out, comparison);
    out.push_str("\nEvery run:\n\n");
    out.push_str(
        "| run | seed | packing density % | gain pp (rel %) | empty hosts % | gain pp | empty-to-free | stranded CPU / mem % | \
         rejected | migrations (avoided) | migrated share of drained VMs | prediction accuracy / precision / recall (long) | \
         realized precision / recall / ROC AUC / AP | resolved (unresolved) | decisions/s | wall s |\n",
    );
    out.push_str("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    for run in &comparison.runs {
        let r = &run.result;
        let m = &r.metrics;
        let p = &r.prediction;
        let migrations = &r.counters.migrations;
        let seed = run.plan.config.seed;
        let gain = comparison.gains.iter().find(|g| g.label == run.plan.cell.label && g.seed == seed);
        let gains = gain.map_or_else(
            || "- | - | -".to_owned(),
            |g| {
                format!(
                    "{:+.2} ({:+.2}) | {:.2} | {:+.2}",
                    g.packing_density_gain_pp, g.packing_density_gain_rel_pct, g.empty_hosts_pct, g.empty_hosts_gain_pp
                )
            },
        );
        let (realized, resolved) = r.quality.as_ref().map_or_else(
            || ("-".to_owned(), "-".to_owned()),
            |q| {
                let f = &q.figures;
                let figure = |v: Option<f64>| v.map_or_else(|| "-".to_owned(), |v| format!("{v:.3}"));
                (
                    format!(
                        "{} / {} / {} / {}",
                        figure(f.precision),
                        figure(f.recall),
                        figure(f.roc_auc),
                        figure(f.average_precision)
                    ),
                    format!("{} ({})", f.resolved, q.unresolved),
                )
            },
        );
        let _ = writeln!(
            out,
            "| {} | {} | {:.2} | {} | {:.3} | {} / {} | {} | {} ({}) | {} | {:.3} / {:.3} / {:.3} | {} | {} | {:.0} | {:.1} |",
            run.plan.cell.label,
            seed,
            100.0 * m.packing_density,
            gains,
            m.empty_to_free,
            opt(m.stranded_cpu_pct),
            opt(m.stranded_memory_pct),
            r.counters.rejected,
            migrations.performed,
            migrations.avoided,
            migrated_share(migrations),
            p.accuracy,
            p.precision_long,
            p.recall_long,
            realized,
            resolved,
            r.timing.decisions_per_s,
            r.timing.wall_s,
        );
    }
    out
}

/// The table of [`crossings`]: where each policy stops beating the baseline and the realized
/// quality there, on the mean gains and seed by seed.
/// The migrations of each row over its seeds, and the empty-host time each bought: against the
/// run of the same policy, prediction and seed with no migrations (consolidation and drains off),
/// the empty-host hours gained per migration.
fn migrations_markdown(out: &mut String, comparison: &Comparison) {
    let _ = writeln!(
        out,
        "\n#### Migrations\n\nWithin the measured span, means over seeds ±1 sd. *Spent*: migrations the budget paid \
         for, completed or *cancelled* (the VM exited while it moved). *Wasted*: of those spent, the cancelled ones and \
         the completed ones whose VM exited within 1 h (6 h) of its move. *Empty-host h per migration*: the \
         empty-host hours the row gained over the same policy and prediction without migrations (same seed), per \
         migration spent.\n\n\
         | run | spent | cancelled | per host-day | per 100 placements | wasted % (1 h) | wasted % (6 h) | GiB moved | \
         empty-host h per migration |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|---:|"
    );
    let without_migrations =
        |run: &CompareRun| run.plan.config.consolidation.is_none() && run.plan.config.drains.is_none();
    for row in &comparison.rows {
        let runs: Vec<&CompareRun> = comparison.runs.iter().filter(|r| r.plan.cell.label == row.cell.label).collect();
        if runs.iter().all(|r| r.result.metrics.migrations_spent() == 0) {
            continue;
        }
        let of = |f: &dyn Fn(&CompareRun) -> f64| Spread::of(&runs.iter().map(|r| f(r)).collect::<Vec<_>>());
        let gained: Vec<f64> = runs
            .iter()
            .filter_map(|r| {
                let reference = comparison.runs.iter().find(|b| {
                    without_migrations(b)
                        && b.plan.cell.policy == r.plan.cell.policy
                        && b.plan.cell.prediction == r.plan.cell.prediction
                        && b.plan.config.seed == r.plan.config.seed
                })?;
                let (m, base) = (&r.result.metrics, &reference.result.metrics);
                let hosts = r.result.workload.hosts as f64;
                let hours = (m.empty_hosts_pct - base.empty_hosts_pct) / 100.0 * hosts * m.span_s / 3600.0;
                (m.migrations_spent() > 0).then(|| hours / m.migrations_spent() as f64)
            })
            .collect();
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            row.cell.label,
            spread(&of(&|r| r.result.metrics.migrations_spent() as f64), false),
            spread(&of(&|r| r.result.metrics.migrations_cancelled as f64), false),
            format_args!("{:.4}", of(&|r| r.result.metrics.migrations_per_host_day).mean),
            spread(&of(&|r| r.result.metrics.migrations_per_100_placements), false),
            spread(&of(&|r| r.result.metrics.wasted_pct().0), false),
            spread(&of(&|r| r.result.metrics.wasted_pct().1), false),
            format_args!("{:.0}", of(&|r| r.result.metrics.migrated_gib).mean),
            if gained.is_empty() { "-".to_owned() } else { spread(&Spread::of(&gained), true) },
        );
    }
    for run in &comparison.runs {
        if let Some(most) = run.result.counters.consolidation_budget_shortfall {
            let _ = writeln!(
                out,
                "\n**{} (seed {}): the budget was not carried out**: {} migrations in flight carry out at most {most:.3} \
                 per host-day.",
                run.plan.cell.label,
                run.plan.config.seed,
                run.result.counters.consolidation_in_flight_limit.unwrap_or_default()
            );
        }
    }
}

fn crossings_markdown(out: &mut String, comparison: &Comparison) {
    let x_label = comparison.experiment.sweep_label.as_deref().unwrap_or("x");
    let _ = writeln!(
        out,
        "\nWhere each policy stops beating `{}` ({x_label} where its packing-density gain is zero, linear between the \
         bracketing points, scanning down from the highest; the realized quality interpolated the same way). \
         *Mean*: on the mean gains over seeds; *per seed*: on each seed's paired gains.\n",
        comparison.baseline
    );
    out.push_str(
        "| policy | between | at | realized precision | recall | ROC AUC | AP | per seed: at (precision / AP) |\n",
    );
    out.push_str("|---|---:|---:|---:|---:|---:|---:|---|\n");
    let figure = |v: Option<f64>| v.map_or_else(|| "-".to_owned(), |v| format!("{v:.3}"));
    let at = |p: &CrossingPoint| match p.kind {
        CrossingKind::Crosses => figure(p.x),
        CrossingKind::AlwaysAbove => "gains everywhere".to_owned(),
        CrossingKind::NeverAbove => "never gains at the top".to_owned(),
    };
    for c in &comparison.crossings {
        let name = c.variant.as_ref().map_or_else(|| c.policy.clone(), |v| format!("{} / {v}", c.policy));
        let between = c.mean.between.map_or_else(|| "-".to_owned(), |(a, b)| format!("{a} .. {b}"));
        let q = &c.mean.quality;
        let seeds: Vec<String> = c
            .per_seed
            .iter()
            .map(|s| match s.point.kind {
                CrossingKind::Crosses => format!(
                    "{}: {} ({} / {})",
                    s.seed,
                    figure(s.point.x),
                    figure(s.point.quality.precision),
                    figure(s.point.quality.average_precision)
                ),
                _ => format!("{}: {}", s.seed, at(&s.point)),
            })
            .collect();
        let _ = writeln!(
            out,
            "| {name} | {between} | {} | {} | {} | {} | {} | {} |",
            at(&c.mean),
            figure(q.precision),
            figure(q.recall),
            figure(q.roc_auc),
            figure(q.average_precision),
            seeds.join("; ")
        );
    }
}

/// With `quality_window`: how the realized figures of a sliding window (what a quality gate reads)
/// spread over each row's runs, their quantiles averaged over seeds.
fn windows_markdown(out: &mut String, comparison: &Comparison) {
    let windows = |row: &Row| -> Vec<&engine::WindowedQuality> {
        comparison
            .runs
            .iter()
            .filter(|r| r.plan.cell.label == row.cell.label)
            .filter_map(|r| r.result.quality.as_ref().and_then(|q| q.windows.as_ref()))
            .collect()
    };
    let Some(size) = comparison.rows.iter().find_map(|row| windows(row).first().map(|w| w.window)) else { return };
    let _ = writeln!(
        out,
        "\nRealized figures over a sliding window of {size} outcomes (what a quality gate reads), at every metric \
         sample once full: 5th percentile / median / 95th percentile over the samples, averaged over seeds.\n"
    );
    out.push_str("| run | samples | precision | recall | ROC AUC | AP | long-lived share |\n");
    out.push_str("|---|---:|---:|---:|---:|---:|---:|\n");
    for row in &comparison.rows {
        let list = windows(row);
        if list.is_empty() {
            continue;
        }
        let n = list.len() as f64;
        let cell = |f: &dyn Fn(&engine::WindowedQuality) -> Option<engine::Quantiles>| {
            let q: Vec<engine::Quantiles> = list.iter().filter_map(|w| f(w)).collect();
            if q.len() != list.len() {
                return "-".to_owned();
            }
            let mean = |g: &dyn Fn(&engine::Quantiles) -> f64| q.iter().map(g).sum::<f64>() / n;
            format!("{:.3} / {:.3} / {:.3}", mean(&|q| q.p5), mean(&|q| q.p50), mean(&|q| q.p95))
        };
        let samples = list.iter().map(|w| w.samples as f64).sum::<f64>() / n;
        let _ = writeln!(
            out,
            "| {} | {:.0} | {} | {} | {} | {} | {} |",
            row.cell.label,
            samples,
            cell(&|w| w.precision),
            cell(&|w| w.recall),
            cell(&|w| w.roc_auc),
            cell(&|w| w.average_precision),
            cell(&|w| w.realized_long_share),
        );
    }
}

fn write(path: &Path, text: &str) -> Result<(), CompareError> {
    std::fs::write(path, text).map_err(|source| CompareError::Write { path: path.to_owned(), source })
}

/// Writes `results.json`, `summary.md` and (with the `plots` feature) the plots into `dir`; returns
/// the files written.
pub fn write_outputs(comparison: &Comparison, dir: &Path) -> Result<Vec<PathBuf>, CompareError> {
    std::fs::create_dir_all(dir).map_err(|source| CompareError::Write { path: dir.to_owned(), source })?;
    let mut written = Vec::new();
    // The series are in the plots; without them the file stays small enough to keep beside them.
    let mut without_series = comparison.clone();
    for run in &mut without_series.runs {
        run.result.series.clear();
    }
    let json = dir.join("results.json");
    write(&json, &serde_json::to_string_pretty(&without_series)?)?;
    written.push(json);
    let md = dir.join("summary.md");
    write(&md, &markdown(comparison))?;
    written.push(md);
    #[cfg(feature = "plots")]
    write_plots(comparison, dir, &mut written)?;
    Ok(written)
}

/// The comparison's SVG plots (time series of the first seed, gains, sweeps) into `dir`.
#[cfg(feature = "plots")]
fn write_plots(comparison: &Comparison, dir: &Path, written: &mut Vec<PathBuf>) -> Result<(), CompareError> {
    let hours = |run: &CompareRun, f: &dyn Fn(&crate::metrics::InstantMetrics) -> f64| {
        let from = run.result.workload.from_s;
        run.result.series.iter().map(|m| ((m.time_s - from) / 3600.0, f(m))).collect::<Vec<_>>()
    };
    // Time series of the first seed's runs: one line per row.
    let first_seed = comparison.runs.first().map(|r| r.plan.config.seed);
    let shown: Vec<&CompareRun> = comparison.runs.iter().filter(|r| Some(r.plan.config.seed) == first_seed).collect();
    let mut density: Vec<Series> = shown
        .iter()
        .map(|r| Series::new(r.plan.cell.label.clone(), hours(r, &|m| 100.0 * m.packing_density)))
        .collect();
    if let Some(first) = comparison.runs.first() {
        density.push(Series::new("offline bound", hours(first, &|m| 100.0 * m.bound.packing_density)));
    }
    let path = dir.join("packing_density.svg");
    plot::time_series_svg(&path, "Packing density over time", "packing density (%)", &density)?;
    written.push(path);
    let mut empty: Vec<Series> =
        shown.iter().map(|r| Series::new(r.plan.cell.label.clone(), hours(r, &|m| m.empty_hosts_pct))).collect();
    if let Some(first) = comparison.runs.first() {
        empty.push(Series::new("offline bound", hours(first, &|m| m.bound.empty_hosts_pct)));
    }
    let path = dir.join("empty_hosts.svg");
    plot::time_series_svg(&path, "Empty hosts over time", "empty hosts (%)", &empty)?;
    written.push(path);
    // Mean gains over seeds, with their range as whiskers.
    let bars = |f: &dyn Fn(&Row) -> Spread| -> Vec<Bar> {
        comparison
            .rows
            .iter()
            .filter(|row| row.cell.label != comparison.baseline)
            .map(|row| {
                let s = f(row);
                Bar::new(row.cell.label.clone(), s.mean).with_range(s.min, s.max)
            })
            .collect()
    };
    let path = dir.join("gains_packing_density.svg");
    let title = format!("Packing density gain over {} (pp; mean, range over seeds)", comparison.baseline);
    plot::bars_svg(&path, &title, "pp", &bars(&|r| r.packing_density_gain_pp))?;
    written.push(path);
    let path = dir.join("gains_empty_hosts.svg");
    let title = format!("Empty hosts gain over {} (pp; mean, range over seeds)", comparison.baseline);
    plot::bars_svg(&path, &title, "pp", &bars(&|r| r.empty_hosts_gain_pp))?;
    written.push(path);
    if comparison.runs.iter().any(|r| r.plan.config.consolidation.is_some()) {
        for (name, title, y_label, f) in [
            (
                "consolidation_empty_hosts.svg",
                "Empty hosts against the migrations spent, per chooser (means over seeds)",
                "empty hosts (%)",
                &(|m: &crate::metrics::MetricsSummary| m.empty_hosts_pct)
                    as &dyn Fn(&crate::metrics::MetricsSummary) -> f64,
            ),
            (
                "consolidation_packing_density.svg",
                "Packing density against the migrations spent, per chooser (means over seeds)",
                "packing density (%)",
                &|m: &crate::metrics::MetricsSummary| 100.0 * m.packing_density,
            ),
        ] {
            let path = dir.join(name);
            plot::sweep_svg(&path, title, "migrations per host-day", y_label, &consolidation_curves(comparison, f))?;
            written.push(path);
        }
    }
    if let Some(x_label) = &comparison.experiment.sweep_label {
        let sweep = |f: &dyn Fn(&Row) -> f64| {
            let mut series: Vec<Series> = Vec::new();
            for row in comparison.rows.iter().filter(|r| r.cell.x.is_some()) {
                let point = (row.cell.x.unwrap_or_default(), f(row));
                match series.iter_mut().find(|s| s.name == row.cell.policy) {
                    Some(s) => s.points.push(point),
                    None => series.push(Series::new(row.cell.policy.clone(), vec![point])),
                }
            }
            series
        };
        let path = dir.join("sweep_packing_density.svg");
        let series = sweep(&|r| r.packing_density_pct.mean);
        plot::sweep_svg(&path, "Packing density by prediction accuracy", x_label, "packing density (%)", &series)?;
        written.push(path);
        let path = dir.join("sweep_empty_hosts.svg");
        let series = sweep(&|r| r.empty_hosts_pct.mean);
        plot::sweep_svg(&path, "Empty hosts by prediction accuracy", x_label, "empty hosts (%)", &series)?;
        written.push(path);
        // The gain against the realized quality the allocator would measure: where a safeguard's
        // floor belongs.
        let by_quality = |f: &dyn Fn(&QualitySpread) -> Option<Spread>| {
            let mut series: Vec<Series> = Vec::new();
            for row in comparison.rows.iter().filter(|r| r.cell.x.is_some()) {
                let Some(figure) = row.quality.as_ref().and_then(f) else { continue };
                let point = (figure.mean, row.packing_density_gain_pp.mean);
                match series.iter_mut().find(|s| s.name == row.cell.policy) {
                    Some(s) => s.points.push(point),
                    None => series.push(Series::new(row.cell.policy.clone(), vec![point])),
                }
            }
            for s in &mut series {
                s.points.sort_by(|a, b| a.0.total_cmp(&b.0));
            }
            series
        };
        for (name, figure, title, f) in [
            (
                "sweep_gain_by_precision.svg",
                "realized precision (long-lived)",
                "Packing density gain by realized precision",
                (&|q: &QualitySpread| q.precision) as &dyn Fn(&QualitySpread) -> Option<Spread>,
            ),
            (
                "sweep_gain_by_average_precision.svg",
                "realized average precision",
                "Packing density gain by realized average precision",
                &|q: &QualitySpread| q.average_precision,
            ),
        ] {
            let series = by_quality(f);
            if series.is_empty() {
                continue;
            }
            let path = dir.join(name);
            let y_label = format!("gain over {} (pp)", comparison.baseline);
            plot::sweep_svg(&path, title, figure, &y_label, &series)?;
            written.push(path);
        }
    }
    Ok(())
}

#[cfg(feature = "plots")]
/// One curve per policy and chooser: each row's mean `figure` over seeds against its mean
/// migrations per host-day, starting from the policy's row without migrations.
fn consolidation_curves(
    comparison: &Comparison,
    figure: &dyn Fn(&crate::metrics::MetricsSummary) -> f64,
) -> Vec<Series> {
    let mut series: Vec<Series> = Vec::new();
    for row in &comparison.rows {
        let runs: Vec<&CompareRun> = comparison.runs.iter().filter(|r| r.plan.cell.label == row.cell.label).collect();
        let Some(first) = runs.first() else { continue };
        let n = runs.len() as f64;
        let point = (
            runs.iter().map(|r| r.result.metrics.migrations_per_host_day).sum::<f64>() / n,
            runs.iter().map(|r| figure(&r.result.metrics)).sum::<f64>() / n,
        );
        let choosers: Vec<&'static str> = match &first.plan.config.consolidation {
            Some(c) => vec![c.chooser.name()],
            // The row without migrations starts every chooser's curve of its policy.
            None if first.plan.config.drains.is_none() => placement::consolidation::ChooserKind::NAMES.to_vec(),
            None => continue,
        };
        for chooser in choosers {
            let name = format!("{} / {chooser}", row.cell.policy);
            match series.iter_mut().find(|s| s.name == name) {
                Some(s) => s.points.push(point),
                None => series.push(Series::new(name, vec![point])),
            }
        }
    }
    // A curve is a policy's row without migrations alone when no chooser ran with it.
    series.retain(|s| s.points.len() > 1);
    for s in &mut series {
        s.points.sort_by(|a, b| a.0.total_cmp(&b.0));
    }
    series
}
