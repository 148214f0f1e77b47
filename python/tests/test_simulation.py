"""Simulation: a run through Python equals `simulate run --config` for the same configuration, bit
for bit (all but the wall-clock timing); comparisons give the evaluation's table; bad settings raise
the package's exceptions naming the setting."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pandas as pd
import pytest

from conftest import REPO, binary
from lifetime_alloc import simulation, traces
from lifetime_alloc.errors import InvalidInputError, MissingFileError

SYNTHETIC = {"kind": "synthetic", "seed": 5, "days": 1.0, "warmup_days": 0.5, "requests_per_hour": 60.0,
             "tenants": 300}
BASE = {"workload": {"trace": SYNTHETIC}, "seed": 3}


def cli_result(config: dict, tmp_path: Path) -> dict:
    path = tmp_path / "run.toml"
    path.write_text(simulation.to_toml(config))
    out = tmp_path / "result.json"
    subprocess.run([str(binary("simulate")), "run", "--config", str(path), "--out", str(out), "--quiet"],
                   check=True, capture_output=True, cwd=REPO)
    return simulation.without_timing(json.loads(out.read_text()))


@pytest.mark.parametrize("policy,prediction", [
    ("nilas", "oracle"),
    ("la-binary", "pr:0.9,0.8"),
    ("lava", f"model:{REPO / 'models' / 'default'}"),
])
def test_a_run_equals_the_cli_bit_for_bit(policy: str, prediction: str, tmp_path: Path) -> None:
    result = simulation.run(BASE, policy=policy, prediction=prediction, record_placements=True, progress=False)
    assert result.without_timing() == cli_result(result.config, tmp_path)
    assert result.counters["placed"] > 0
    placements = result.placements
    assert placements is not None and len(placements) == result.raw["workload"]["vms"]


def test_series_and_metrics(small_trace: pd.DataFrame) -> None:
    result = simulation.run(trace=small_trace, policy="pbfr", progress=False)
    series = result.series
    assert {"time_s", "packing_density", "empty_hosts_pct"} <= set(series.columns)
    assert len(series) >= 24
    assert 0 < result.metrics["packing_density"] <= 1
    assert result.placements is None


def test_a_frame_replays_as_its_file(small_trace: pd.DataFrame, tmp_path: Path) -> None:
    path = tmp_path / "trace.csv.gz"
    traces.write(small_trace, path)
    from_file = simulation.run(trace=path, policy="nilas", progress=False)
    from_frame = simulation.run(trace=small_trace, policy="nilas", progress=False)
    assert from_file.metrics == from_frame.metrics
    assert from_file.raw["series"] == from_frame.raw["series"]


def test_a_toml_config_file(tmp_path: Path) -> None:
    path = tmp_path / "run.toml"
    path.write_text(simulation.to_toml(simulation.run(BASE, policy="pbfr", progress=False).config))
    assert simulation.run(path, progress=False).metrics == simulation.run(BASE, policy="pbfr", progress=False).metrics


def test_compare_gives_the_evaluation_table(tmp_path: Path) -> None:
    comparison = simulation.compare(REPO / "configs" / "experiments" / "perfect.toml", base=BASE, seeds=[1, 2],
                                    jobs=2, progress=False)
    table = comparison.table
    # One prediction: the rows are labelled by policy alone.
    assert list(table["label"]) == ["best-fit-exact", "la-binary", "la-multiclass", "nilas", "lava"]
    for column in ["packing_density_pct.mean", "packing_density_pct.sd", "packing_density_gain_pp.mean",
                   "empty_hosts_pct.mean", "seeds"]:
        assert column in table.columns
    assert len(comparison.runs) == 10
    assert "| " in comparison.markdown


EXPERIMENT = """
name = "small"
baseline = "pbfr"
seeds = [1, 2]

[[policies]]
name = "pbfr"
policy = { kind = "pbfr" }

[[policies]]
name = "nilas"
policy = { kind = "nilas" }

[[predictions]]
name = "oracle"
prediction = { source = { kind = "oracle" } }
"""


def test_compare_equals_the_cli(tmp_path: Path) -> None:
    path = tmp_path / "small.toml"
    path.write_text(EXPERIMENT)
    comparison = simulation.compare(path, base=BASE, jobs=2, progress=False)
    out = tmp_path / "out"
    flags = ["--synthetic", "--synthetic-seed", "5", "--synthetic-days", "1", "--synthetic-warmup-days", "0.5",
             "--synthetic-requests-per-hour", "60", "--synthetic-tenants", "300", "--seed", "3"]
    subprocess.run([str(binary("simulate")), "compare", str(path), "--out-dir", str(out), "--jobs", "2", "--quiet",
                    *flags], check=True, capture_output=True, cwd=REPO)
    cli = json.loads((out / "results.json").read_text())
    assert cli["rows"] == comparison.raw["rows"]
    assert cli["gains"] == comparison.raw["gains"]
    assert len(comparison.raw["runs"]) == len(cli["runs"]) == 4
    for ours, theirs in zip(comparison.raw["runs"], cli["runs"]):
        assert {k: v for k, v in ours.items() if k != "result"} == {k: v for k, v in theirs.items() if k != "result"}
        # results.json leaves each run's series out (the runs' results are in the table).
        assert theirs["result"]["series"] == []
        ours["result"]["series"] = []
        assert simulation.without_timing(ours["result"]) == simulation.without_timing(theirs["result"])


def test_unknown_policy_names_the_field() -> None:
    with pytest.raises(InvalidInputError) as error:
        simulation.run(BASE, policy="best-ever", progress=False)
    assert error.value.field == "policy"
    assert "nilas" in error.value.fix


def test_unknown_prediction_names_the_field() -> None:
    with pytest.raises(ValueError) as error:
        simulation.run(BASE, prediction="psychic", progress=False)
    assert error.value.field == "prediction"
    assert "oracle" in str(error.value)


def test_bad_setting_names_the_key() -> None:
    with pytest.raises(InvalidInputError) as error:
        simulation.run({**BASE, "sample_interval_s": -5}, progress=False)
    assert error.value.field == "sample_interval_s"
    with pytest.raises(InvalidInputError) as error:
        simulation.run({**BASE, "no_such_setting": 1}, progress=False)
    assert "no_such_setting" in str(error.value)
    with pytest.raises(InvalidInputError) as error:
        simulation.run({**BASE, "seed": "three"}, progress=False)
    assert error.value.field == "config"


def test_a_missing_trace_file(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError) as error:
        simulation.run(trace=tmp_path / "none.csv", progress=False)
    assert isinstance(error.value, MissingFileError)


def test_a_missing_bundle_names_the_setting(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError) as error:
        simulation.run(BASE, policy="nilas", prediction=f"model:{tmp_path / 'none'}", progress=False)
    assert error.value.field == "prediction.source.bundle"


def test_progress_bar_reports(capsys: pytest.CaptureFixture[str]) -> None:
    simulation.run(BASE, policy="pbfr", progress=True)
