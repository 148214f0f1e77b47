#!/usr/bin/env python3
"""The lifetime chooser's wasted share against the best model-free chooser's (issue 59), from one
`simulate compare` results.json of a consolidation experiment whose variants are named
`<chooser>-<budget>` (configs/experiments/consolidation-test-3.toml).

For each placing policy and budget: the share of the migrations spent (completed or cancelled)
that were wasted within 1 h and within 6 h of their end (cancelled ones included), pooled over the
seeds, +- the sample standard deviation of the seeds' own shares, with the counts; beside it the
model-free chooser (`fewest-vms`, `least-used`, `age`, `age-batches`) with the smallest pooled
share, and the ratio. Then each chooser's packing density (mean +- sd over seeds), to show what the
waste bought.

Usage: scripts/consolidation-waste.py RESULTS.json
"""
import collections
import json
import statistics
import sys

MODEL_FREE = ["fewest-vms", "least-used", "age", "age-batches"]
CHOOSERS = MODEL_FREE + ["lifetime", "oracle"]


def sd(xs):
    return statistics.stdev(xs) if len(xs) > 1 else 0.0


class Cell:
    """One chooser at one budget under one placing policy, over its seeds."""

    def __init__(self, metrics):
        self.metrics = metrics

    def waste(self, key):
        spent = wasted = 0
        shares = []
        for m in self.metrics:
            run_spent = m.get("migrations", 0) + m.get("migrations_cancelled", 0)
            spent += run_spent
            wasted += m.get(key, 0)
            if run_spent:
                shares.append(100 * m.get(key, 0) / run_spent)
        return (100 * wasted / spent if spent else None), sd(shares), wasted, spent

    def density(self):
        xs = [100 * m["packing_density"] for m in self.metrics]
        return statistics.mean(xs), sd(xs)


def fmt_waste(w):
    share, spread, wasted, spent = w
    return "-" if share is None else f"{share:.1f}% ±{spread:.1f} ({wasted}/{spent})"


def main():
    data = json.load(open(sys.argv[1]))
    cells = collections.defaultdict(list)
    for run in data["runs"]:
        cells[(run["policy"], run["variant"])].append(run["result"]["metrics"])
    # The placing policies that consolidated, in the experiment's order.
    policies = [p for p in dict.fromkeys(r["policy"] for r in data["runs"])
                if any(q == p and v.startswith("lifetime-") for q, v in cells)]
    budgets = sorted({v.rpartition("-")[2] for _, v in cells if v.startswith("lifetime-")}, key=float)
    print("| placing, budget | lifetime, wasted 1 h | best model-free, 1 h | ratio | lifetime, 6 h | "
          "best model-free, 6 h | ratio |")
    print("|---|---|---|---|---|---|---|")
    for policy in policies:
        for budget in budgets:
            row = [f"{policy}, {budget}"]
            for key in ("migrations_wasted", "migrations_wasted_6h"):
                lifetime = Cell(cells[(policy, f"lifetime-{budget}")]).waste(key)
                free = {c: Cell(cells[(policy, f"{c}-{budget}")]).waste(key) for c in MODEL_FREE
                        if (policy, f"{c}-{budget}") in cells}
                spent = {c: w for c, w in free.items() if w[0] is not None}
                best = min(spent, key=lambda c: spent[c][0]) if spent else None
                ratio = "-"
                if best and lifetime[0] is not None and spent[best][0] > 0:
                    ratio = f"{lifetime[0] / spent[best][0]:.2f}x"
                row += [fmt_waste(lifetime), f"`{best}` {fmt_waste(spent[best])}" if best else "-", ratio]
            print("| " + " | ".join(row) + " |")
    print()
    print("| placing | no migrations | budget | " + " | ".join(CHOOSERS) + " |")
    print("|---|---|---|" + "---|" * len(CHOOSERS))
    for policy in policies:
        none = cells.get((policy, "none"))
        base = "%.2f ±%.2f" % Cell(none).density() if none else "-"
        for budget in budgets:
            row = []
            for chooser in CHOOSERS:
                metrics = cells.get((policy, f"{chooser}-{budget}"))
                row.append("%.2f ±%.2f" % Cell(metrics).density() if metrics else "-")
            print(f"| {policy} | {base} | {budget} | " + " | ".join(row) + " |")

if __name__ == "__main__":
    main()
