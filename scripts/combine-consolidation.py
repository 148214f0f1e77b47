#!/usr/bin/env python3
"""Sums up consolidation runs over windows (issue 43): for each `policy / variant`, its paired gain
over the same policy without migrations (variant `none`) in packing density and empty hosts (mean
over every window-and-seed run, +- their sample standard deviation), the realized migrations per
host-day (mean), and the wasted share: all runs' wasted migrations over all their migrations
(+- the sample standard deviation of each run's own share).

Usage: scripts/combine-consolidation.py OUT.md WINDOW... where a WINDOW is one results.json, or
several joined by `+` (experiments run on the same window and seeds: a run found in an earlier one
is taken from it). Rows keep the order of the first file's rows. Beside OUT.md, OUT.svg plots each
chooser's empty-host gain against the migrations it spent, one panel per placement policy.
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


COLOURS = ["#0072B2", "#E69F00", "#009E73", "#CC79A7", "#D55E00", "#000000", "#56B4E9"]


def plot(curves, path):
    """curves: {policy: {chooser: [(migrations per host-day, empty-host gain pp)]}} as an SVG."""
    width, height, pad = 420, 300, 50
    panels = sorted(curves)
    points = [p for c in curves.values() for line in c.values() for p in line]
    x_max = max([x for x, _ in points] + [0.01]) * 1.05
    y_min = min([y for _, y in points] + [0.0])
    y_max = max([y for _, y in points] + [0.1]) * 1.1
    svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width * len(panels)}" height="{height + 70}" '
           'font-family="sans-serif" font-size="11">']
    for k, policy in enumerate(panels):
        left = k * width + pad
        sx = lambda x: left + x / x_max * (width - pad - 10)
        sy = lambda y: 20 + (y_max - y) / (y_max - y_min) * (height - 40)
        svg.append(f'<text x="{left}" y="14" font-weight="bold">{policy} placing</text>')
        svg.append(f'<line x1="{left}" y1="{sy(y_min)}" x2="{left}" y2="{sy(y_max)}" stroke="#444"/>')
        svg.append(f'<line x1="{left}" y1="{sy(0)}" x2="{sx(x_max)}" y2="{sy(0)}" stroke="#444"/>')
        for t in range(5):
            y = y_min + (y_max - y_min) * t / 4
            svg.append(f'<text x="{left - 4}" y="{sy(y) + 4}" text-anchor="end">{y:.1f}</text>')
            x = x_max * t / 4
            svg.append(f'<text x="{sx(x)}" y="{sy(y_min) + 14}" text-anchor="middle">{x:.2f}</text>')
        svg.append(f'<text x="{left + (width - pad) / 2}" y="{sy(y_min) + 28}" text-anchor="middle">'
                   'migrations per host-day</text>')
        svg.append(f'<text x="{left - 36}" y="{sy((y_min + y_max) / 2)}" '
                   f'transform="rotate(-90 {left - 36} {sy((y_min + y_max) / 2)})" text-anchor="middle">'
                   'empty hosts gain pp</text>')
        for c, (chooser, line) in enumerate(sorted(curves[policy].items())):
            colour = COLOURS[c % len(COLOURS)]
            line = [(0.0, 0.0)] + sorted(line)
            path_points = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in line)
            svg.append(f'<polyline points="{path_points}" fill="none" stroke="{colour}" stroke-width="1.5"/>')
            for x, y in line[1:]:
                svg.append(f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="2.5" fill="{colour}"/>')
            svg.append(f'<text x="{left + 8}" y="{height + 26 + 12 * (c % 3)}" fill="{colour}" '
                       f'dx="{(c // 3) * 130}">{chooser}</text>')
    svg.append("</svg>")
    open(path, "w").write("\n".join(svg) + "\n")


def main():
    out, windows = sys.argv[1], sys.argv[2:]
    per_window = [runs_of(w) for w in windows]
    order = []
    for _, o in per_window:
        order += [k for k in o if k not in order]
    lines = [
        "| run | density gain pp | empty hosts gain pp | migrations per host-day | cancelled | wasted 1 h | wasted 6 h |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    curves = {}
    for policy, variant in order:
        density, empty, rate, spent, cancelled, wasted, wasted_6h = [], [], [], 0, 0, 0, 0
        shares, shares_6h = [], []
        for runs, _ in per_window:
            for (p, v, seed), m in runs.items():
                base = runs.get((p, "none", seed))
                if (p, v) != (policy, variant) or base is None:
                    continue
                density.append(100 * (m["packing_density"] - base["packing_density"]))
                empty.append(m["empty_hosts_pct"] - base["empty_hosts_pct"])
                rate.append(m.get("migrations_per_host_day", 0.0))
                # Spent: completed or cancelled (the VM exited while it moved); both wasted counts
                # include the cancelled ones (results from before issue 59 have none).
                run_spent = m.get("migrations", 0) + m.get("migrations_cancelled", 0)
                spent += run_spent
                if run_spent:
                    shares.append(100 * m.get("migrations_wasted", 0) / run_spent)
                    shares_6h.append(100 * m.get("migrations_wasted_6h", 0) / run_spent)
                cancelled += m.get("migrations_cancelled", 0)
                wasted += m.get("migrations_wasted", 0)
                wasted_6h += m.get("migrations_wasted_6h", 0)
        if not density:
            continue
        sd = lambda xs: statistics.stdev(xs) if len(xs) > 1 else 0.0
        share = lambda n: f"{100 * n / spent:.0f}% ({n}/{spent})" if spent else "-"
        # The pooled share, the runs' spread of their own shares, and the counts.
        spread = lambda n, xs: f"{100 * n / spent:.1f}% ±{sd(xs):.1f} ({n}/{spent})" if spent else "-"
        chooser, _, budget = variant.rpartition("-")
        if chooser:
            curves.setdefault(policy, {}).setdefault(chooser, []).append((statistics.mean(rate), statistics.mean(empty)))
        lines.append(
            f"| {policy} / {variant} | {statistics.mean(density):+.2f} ±{sd(density):.2f} "
            f"| {statistics.mean(empty):+.2f} ±{sd(empty):.2f} | {statistics.mean(rate):.3f} "
            f"| {share(cancelled)} | {spread(wasted, shares)} | {spread(wasted_6h, shares_6h)} |"
        )
    open(out, "w").write("\n".join(lines) + "\n")
    plot(curves, out.rsplit(".", 1)[0] + ".svg")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
