#!/usr/bin/env python3
"""Sums up consolidation runs over windows (issue 43): for each `policy / variant`, its paired gain
over the same policy without migrations (variant `none`) in packing density and empty hosts (mean
over every window-and-seed run, +- their sample standard deviation), the realized migrations per
host-day (mean), and the wasted share: all runs' wasted migrations over all their migrations.

Usage: scripts/combine-consolidation.py OUT.md WINDOW... where a WINDOW is one results.json, or
several joined by `+` (experiments run on the same window and seeds: a run found in an earlier one
is taken from it). Rows keep the order of the first file's rows.
"""
import json
import statistics
import sys


def runs_of(window):
    """(policy, variant, seed) -> metrics, the first experiment of the window winning."""
    runs = {}
    order = []
    for path in window.split("+"):
        for run in json.load(open(path))["runs"]:
            key = (run["policy"], run["variant"], run["config"]["seed"])
            if key not in runs:
                runs[key] = run["result"]["metrics"]
                if (run["policy"], run["variant"]) not in order:
                    order.append((run["policy"], run["variant"]))
    return runs, order


def main():
    out, windows = sys.argv[1], sys.argv[2:]
    per_window = [runs_of(w) for w in windows]
    order = []
    for _, o in per_window:
        order += [k for k in o if k not in order]
    lines = [
        "| run | density gain pp | empty hosts gain pp | migrations per host-day | wasted |",
        "|---|---:|---:|---:|---:|",
    ]
    for policy, variant in order:
        density, empty, rate, moved, wasted = [], [], [], 0, 0
        for runs, _ in per_window:
            for (p, v, seed), m in runs.items():
                base = runs.get((p, "none", seed))
                if (p, v) != (policy, variant) or base is None:
                    continue
                density.append(100 * (m["packing_density"] - base["packing_density"]))
                empty.append(m["empty_hosts_pct"] - base["empty_hosts_pct"])
                rate.append(m.get("migrations_per_host_day", 0.0))
                moved += m.get("migrations", 0)
                wasted += m.get("migrations_wasted", 0)
        if not density:
            continue
        sd = lambda xs: statistics.stdev(xs) if len(xs) > 1 else 0.0
        share = f"{100 * wasted / moved:.0f}% ({wasted}/{moved})" if moved else "-"
        lines.append(
            f"| {policy} / {variant} | {statistics.mean(density):+.2f} ±{sd(density):.2f} "
            f"| {statistics.mean(empty):+.2f} ±{sd(empty):.2f} | {statistics.mean(rate):.3f} | {share} |"
        )
    open(out, "w").write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
