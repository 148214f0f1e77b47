"""Speed of the Python package against its references, side by side in one run (docs/benchmarks.md,
"The Python package"):

- a simulation through Python (``simulation.run``) against the CLI (``simulate run --config``) on the
  same configuration, whole process for the CLI, the whole call for Python (both load the trace);
- predicting 100,000 rows of a DataFrame (``Model.predict(frame, lifetime=False)``: encoding, P(long)
  and the class) against LightGBM's own Python package (``Booster.predict`` of the bundle's long-lived
  model file on the rows already encoded, so LightGBM is timed on less work); then with the expected
  lifetime (``Model.predict(frame)``, a second model), and the evaluator alone on the encoded rows;
- reading the Azure V1 test trace into a DataFrame (``traces.read``) against ``pandas.read_csv``.

    python python/benchmarks/bench.py [--trace ../shared/data/azure-v1-tracegen/trace-test.csv.gz]

Each figure is the median of ``--repeat`` runs, the two sides alternating: the wall time, and the CPU
time of all the threads (and child processes) of each side, which on a machine shared with other
work says more than the wall time does. Needs the installed package, the workspace's release
``simulate`` binary and ``pip install lightgbm``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Callable, List, Tuple

import numpy as np
import pandas as pd

from lifetime_alloc import models, simulation, traces

REPO = Path(__file__).resolve().parents[2]


def cpu_seconds() -> float:
    """CPU time so far of this process's threads and of its finished child processes."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def timed(f: Callable[[], object]) -> Tuple[float, float]:
    """Wall and CPU seconds of one call."""
    started, cpu = time.perf_counter(), cpu_seconds()
    f()
    return time.perf_counter() - started, cpu_seconds() - cpu


# The CPU medians of the last side_by_side, for report().
CPU: List[float] = [float("nan"), float("nan")]


def side_by_side(ours: Callable[[], object], reference: Callable[[], object], repeat: int) -> Tuple[float, float]:
    a: List[Tuple[float, float]] = []
    b: List[Tuple[float, float]] = []
    for _ in range(repeat):
        a.append(timed(ours))
        b.append(timed(reference))
    CPU[:] = [statistics.median(cpu for _, cpu in a), statistics.median(cpu for _, cpu in b)]
    return statistics.median(wall for wall, _ in a), statistics.median(wall for wall, _ in b)


def report(what: str, ours: float, reference: float, reference_name: str, goal: str) -> None:
    print(f"| {what} | {ours:.3f} s (CPU {CPU[0]:.3f} s) | {reference_name} {reference:.3f} s (CPU {CPU[1]:.3f} s) "
          f"| {ours / reference:.2f}x (CPU {CPU[0] / CPU[1]:.2f}x) | {goal} |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trace", default=str(REPO.parent / "shared" / "data" / "azure-v1-tracegen" / "trace-test.csv.gz"))
    parser.add_argument("--bin-dir", default=os.environ.get("CARGO_TARGET_DIR", str(REPO / "target")) + "/release")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--policy", default="nilas")
    args = parser.parse_args()
    import lightgbm  # type: ignore[import-untyped]

    print(f"trace {args.trace}; {os.cpu_count()} cores; lightgbm {lightgbm.__version__}, pandas {pd.__version__}")
    print("| what | Python package: wall (CPU) | reference: wall (CPU) | ratio: wall (CPU) | goal |")
    print("|---|---:|---:|---:|---|")

    # 1. Reading the trace into a DataFrame.
    ours, reference = side_by_side(lambda: traces.read(args.trace), lambda: pd.read_csv(args.trace), args.repeat)
    report("read the trace into a DataFrame", ours, reference, "pandas.read_csv", "<= 1.0x")

    # 2. Predicting 100,000 rows: P(long) and the class (what Booster.predict computes, from the
    # long-lived model), then with the expected lifetime too (a second model, the remaining-lifetime
    # regression, which LightGBM is not asked for).
    frame = traces.read(args.trace).iloc[:100_000].reset_index(drop=True)
    model = models.load(REPO / "models" / "default")
    booster = lightgbm.Booster(model_file=str(REPO / "models" / "default" / "long_lived.lgbm.txt"))
    encoded = model.encode(frame)
    theirs_p = np.clip(booster.predict(encoded), 0.0, 1.0)
    same = (np.array_equal(model.predict(frame, lifetime=False)["p_long"].to_numpy(), theirs_p)
            and np.array_equal(model.predict(frame)["p_long"].to_numpy(), theirs_p)
            and np.array_equal(model.predict_encoded(encoded, lifetime=False)["p_long"].to_numpy(), theirs_p))
    identical = "bit-identical to" if same else "DIFFERS from"
    ours, reference = side_by_side(lambda: model.predict(frame, lifetime=False), lambda: booster.predict(encoded),
                                   args.repeat)
    report(f"predict {len(frame):,} rows from the DataFrame, P(long) and class (`Model.predict(frame, "
           f"lifetime=False)`; P(long) {identical} LightGBM's)", ours, reference, "Booster.predict (encoded rows)",
           "<= 1.0x")
    ours, reference = side_by_side(lambda: model.predict(frame), lambda: booster.predict(encoded), args.repeat)
    report(f"predict {len(frame):,} rows from the DataFrame, with the expected lifetime (`Model.predict(frame)`: "
           "two models)", ours, reference, "Booster.predict (encoded rows, one model)", "-")
    ours, reference = side_by_side(lambda: model.predict_encoded(encoded, lifetime=False),
                                   lambda: booster.predict(encoded), args.repeat)
    report(f"predict {len(frame):,} encoded rows, the long-lived model alone (`Model.predict_encoded(m, "
           "lifetime=False)`)", ours, reference, "Booster.predict", "-")
    encode, _ = side_by_side(lambda: model.encode(frame), lambda: None, args.repeat)
    print(f"| encode {len(frame):,} rows alone (the features, each VM's tenant and job history) | {encode:.3f} s "
          f"(CPU {CPU[0]:.3f} s) | | | |")

    # 3. A simulation: Python against the CLI.
    config = {"workload": {"trace": {"kind": "file", "path": str(Path(args.trace).resolve())}},
              "policy": {"kind": args.policy}, "prediction": {"source": {"kind": "oracle"}}}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "run.toml"
        path.write_text(simulation.to_toml(simulation.run(config, progress=False).config))
        out = Path(tmp) / "result.json"
        cli = [str(Path(args.bin_dir) / "simulate"), "run", "--config", str(path), "--quiet", "--out", str(out)]
        python_result = {}

        def ours_run() -> None:
            python_result["r"] = simulation.run(config, progress=False)

        ours, reference = side_by_side(ours_run, lambda: subprocess.run(cli, check=True, capture_output=True), args.repeat)
        same = python_result["r"].without_timing() == simulation.without_timing(json.loads(out.read_text()))
    report(f"simulate the trace, {args.policy} / oracle (result {'identical to' if same else 'DIFFERS from'} the CLI's)",
           ours, reference, "simulate run", "<= 1.1x")


if __name__ == "__main__":
    main()
