#!/usr/bin/env python3
"""Sums up the validation windows of scripts/validate-windows.sh (issue 29).

For each row (policy / prediction) of the windows' results.json: its paired gain over the
baseline in packing density and empty hosts, per window (mean over seeds) and over all windows
(the mean of the windows' means, +- the sample standard deviation of every window-and-seed gain),
and the share of the reference oracle row's gain it keeps. Rows are sorted by that mean packing
density gain. Usage: scripts/combine-windows.py TITLE OUT.md WINDOW... where a WINDOW is one
results.json, or several joined by `+` (experiments run on the same window): every row is then named
`policy / prediction` (the baseline keeps its name) and a run present in several is counted once.
"""
import json
import statistics
import sys


def main():
    title, out, paths = sys.argv[1], sys.argv[2], sys.argv[3:]
    windows = [[json.load(open(p)) for p in window.split("+")] for window in paths]
    first = windows[0][0]
    reference = first["experiment"].get("oracle_reference")
    baseline = first["baseline"]
    gains = {}  # label -> [[(density, empty) per seed] per window]
    for w, experiments in enumerate(windows):
        seen = set()
        for results in experiments:
            names = {row["label"]: f"{row['policy']} / {row['prediction']}" for row in results["rows"]}
            for g in results["gains"]:
                label = g["label"] if g["label"] == baseline else names.get(g["label"], g["label"])
                if (label, g["seed"]) in seen:
                    continue
                seen.add((label, g["seed"]))
                per_window = gains.setdefault(label, [[] for _ in windows])
                per_window[w].append((g["packing_density_gain_pp"], g["empty_hosts_gain_pp"]))

    def summary(per_window):
        means = [statistics.mean(x[i] for x in seeds) if seeds else float("nan") for i in (0, 1) for seeds in per_window]
        n = len(per_window)
        density = means[:n]
        empty = means[n:]
        every = [x for seeds in per_window for x in seeds]
        sd = [statistics.stdev(x[i] for x in every) if len(every) > 1 else 0.0 for i in (0, 1)]
        return statistics.mean(density), sd[0], statistics.mean(empty), sd[1], density

    rows = {label: summary(pw) for label, pw in gains.items() if all(pw)}
    ref = rows.get(reference)
    lines = [
        f"### {title}",
        "",
        f"{len(windows)} windows; gains in pp over `{baseline}` (paired by seed), the mean of the windows' "
        "means ± the sample sd of every window-and-seed gain; *kept*: the share of "
        f"`{reference}`'s mean gain (packing density / empty hosts).",
        "",
        "| run | packing density gain | per window | empty hosts gain | kept |",
        "|---|---:|---|---:|---:|",
    ]
    for label, (d, dsd, e, esd, per) in sorted(rows.items(), key=lambda kv: -kv[1][0]):
        kept = f"{100 * d / ref[0]:.0f}% / {100 * e / ref[2]:.0f}%" if ref and ref[0] and ref[2] else ""
        per_window = " / ".join(f"{x:+.2f}" for x in per)
        lines.append(f"| {label} | {d:+.2f} ±{dsd:.2f} | {per_window} | {e:+.2f} ±{esd:.2f} | {kept} |")
    text = "\n".join(lines) + "\n"
    with open(out, "w") as f:
        f.write(text)
    print(text)


if __name__ == "__main__":
    main()
