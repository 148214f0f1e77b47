"""Trace-replay simulation: one configuration, or an experiment compared over seeds.

:func:`run` is ``simulate run --config`` and :func:`compare` is ``simulate compare``: the same
library calls, so a result here is the CLI's result for the same configuration, bit for bit
(``docs/evaluation.md``). A configuration is the ``config`` section of a result, as a dict (or a
TOML file): what :func:`default_config` returns, with any part left out taking its default.

>>> from lifetime_alloc import simulation
>>> result = simulation.run(policy="nilas", prediction="oracle",
...                         config={"workload": {"trace": {"kind": "synthetic", "days": 2}}})
>>> result.metrics["packing_density"], result.series.head()
"""

from __future__ import annotations

import copy
import json
import os
from typing import Any, Dict, List, Mapping, Optional, Sequence, Union

import pandas as pd
import pyarrow as pa

from . import _native, _progress
from ._frames import Frame, to_native
from .errors import InvalidInputError, MissingFileError

PathLike = Union[str, "os.PathLike[str]"]
Config = Dict[str, Any]


def default_config() -> Config:
    """Every setting of a run with its default (``simulate run --print-config``, as a dict)."""
    return json.loads(_native.default_config())


def policy_names() -> List[str]:
    """The policy presets (``pbfr``, ``dpbfr``, ``la-binary``, ``la-multiclass``, ``nilas``, ``lava``, ...)."""
    return list(_native.policy_names())


def prediction_source(text: str) -> Config:
    """A prediction source from its short text, as ``--prediction`` reads it: ``oracle``,
    ``binned-oracle``, ``none``, ``model``, ``model:BUNDLE_DIR``, ``accuracy:0.9``, ``pr:0.9,0.8``."""
    return json.loads(_native.parse_prediction(text))


def to_toml(config: Mapping[str, Any]) -> str:
    """A configuration as the TOML file ``simulate run --config`` reads."""
    return _native.config_to_toml(json.dumps(config))


def _read_text(path: PathLike, what: str) -> str:
    try:
        with open(os.fspath(path), encoding="utf-8") as file:
            return file.read()
    except FileNotFoundError:
        raise MissingFileError(f"{what} {os.fspath(path)} does not exist", field=what,
                               fix="check the path (relative paths start at the current directory)") from None


def _merge(base: Config, over: Mapping[str, Any]) -> Config:
    """``over`` laid over ``base``, dict by dict."""
    out = copy.deepcopy(base)
    for key, value in over.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def _policy(policy: Union[str, Mapping[str, Any]]) -> Config:
    if isinstance(policy, str):
        names = policy_names()
        if policy not in names:
            raise InvalidInputError(f"unknown policy `{policy}`", field="policy",
                                    fix=f"use one of {', '.join(names)}, or a policy as a dict (docs/allocator.md)")
        return {"kind": policy}
    return dict(policy)


def _trace(trace: PathLike) -> Config:
    return {"kind": "file", "path": os.fspath(trace)}


def _config(config: Union[Mapping[str, Any], PathLike, None], *, trace: Any, policy: Any, prediction: Any,
            seed: Optional[int], record_placements: Optional[bool]) -> Config:
    if config is None:
        out: Config = {}
    elif isinstance(config, Mapping):
        out = copy.deepcopy(dict(config))
    else:
        out = json.loads(_native.config_from_toml(_read_text(config, "config")))
    if policy is not None:
        out["policy"] = _merge(out.get("policy", {}), _policy(policy))
    if prediction is not None:
        source = prediction_source(prediction) if isinstance(prediction, str) else dict(prediction)
        out.setdefault("prediction", {})["source"] = source
    if seed is not None:
        out["seed"] = int(seed)
    if record_placements is not None:
        out["record_placements"] = bool(record_placements)
    if trace is not None and not isinstance(trace, (pd.DataFrame, pa.Table)):
        out.setdefault("workload", {})["trace"] = _trace(trace)
    return out


def without_timing(result: Mapping[str, Any]) -> Dict[str, Any]:
    """A result (a dict, as ``simulate run --out`` writes it) less its wall-clock times: ``timing``
    and ``prediction.wall_s``."""
    out = {key: value for key, value in result.items() if key != "timing"}
    out["prediction"] = {key: value for key, value in result["prediction"].items() if key != "wall_s"}
    return out


class SimulationResult:
    """One run's outcome: what ``simulate run --out`` writes, with its parts as frames.

    ``raw`` is the whole result (a dict, as the CLI's JSON); ``config`` the configuration that
    reproduces it; ``metrics`` the time averages (packing density, empty hosts, ...); ``counters``
    arrivals, placements, rejections, exits, migrations; ``series`` the metric samples over time;
    ``placements`` every VM's host (``None`` unless ``record_placements``).
    """

    def __init__(self, raw: Dict[str, Any]) -> None:
        self.raw = raw

    @property
    def config(self) -> Config:
        return self.raw["config"]

    @property
    def metrics(self) -> Dict[str, Any]:
        return self.raw["metrics"]

    @property
    def counters(self) -> Dict[str, Any]:
        return self.raw["counters"]

    @property
    def series(self) -> pd.DataFrame:
        """The metric samples: one row per sample, nested figures flattened (``bound.packing_density``)."""
        return pd.json_normalize(self.raw["series"])

    @property
    def placements(self) -> Optional[pd.DataFrame]:
        """``vm_id`` and ``host_id`` (missing: rejected) of every VM, in workload order."""
        placements = self.raw.get("placements")
        return None if placements is None else pd.DataFrame(placements, columns=["vm_id", "host_id"])

    def without_timing(self) -> Dict[str, Any]:
        """The result less its wall-clock times (``timing``, ``prediction.wall_s``): what two runs of
        one configuration share exactly."""
        return without_timing(self.raw)

    def __repr__(self) -> str:
        m = self.metrics
        return (f"SimulationResult({self.raw['final_stats'].get('policy')} / {self.raw['prediction'].get('source')}: "
                f"packing density {100 * m['packing_density']:.2f}%, empty hosts {m['empty_hosts_pct']:.2f}%)")


def run(config: Union[Mapping[str, Any], PathLike, None] = None, *, trace: Union[PathLike, Frame, None] = None,
        policy: Union[str, Mapping[str, Any], None] = None, prediction: Union[str, Mapping[str, Any], None] = None,
        seed: Optional[int] = None, record_placements: Optional[bool] = None,
        progress: bool = True) -> SimulationResult:
    """Replays a trace through the allocator's policy code: ``simulate run``.

    ``config``: a configuration dict (:func:`default_config`'s shape, any part left out takes its
    default) or the path of a TOML file (``simulate run --config``). The keywords override it:
    ``trace`` (a trace file, or a trace frame replayed as it is), ``policy`` (a preset name from
    :func:`policy_names`, or a policy as a dict), ``prediction`` (``"oracle"``, ``"pr:0.9,0.8"``,
    ``"model:models/default"``, ... or a source dict), ``seed``, ``record_placements``.
    ``progress``: a progress bar (tqdm when installed); the interpreter is free meanwhile.

    Raises :class:`~lifetime_alloc.errors.InvalidInputError` naming the setting and the fix.
    """
    settings = _config(config, trace=trace, policy=policy, prediction=prediction, seed=seed,
                       record_placements=record_placements)
    rows = columns = None
    if isinstance(trace, (pd.DataFrame, pa.Table)):
        rows, columns = to_native(trace)
    bar = _progress.bar(progress, "simulate")
    try:
        text = _native.simulate(json.dumps(settings), rows, columns, bar)
    finally:
        _progress.close(bar)
    return SimulationResult(json.loads(text))


class Comparison:
    """An experiment's outcome: what ``simulate compare`` writes.

    ``table``: one row per policy x prediction (x variant) over the seeds: means, spread (sd, min,
    max), paired gains over the baseline and the share of the oracle's gain kept; ``markdown``: the
    summary the CLI prints; ``runs``: every run's :class:`SimulationResult`; ``raw``: the whole
    ``results.json``.
    """

    def __init__(self, raw: Dict[str, Any], markdown: str) -> None:
        self.raw = raw
        self.markdown = markdown

    @property
    def table(self) -> pd.DataFrame:
        return pd.json_normalize(self.raw["rows"])

    @property
    def runs(self) -> List[SimulationResult]:
        return [SimulationResult(run["result"]) for run in self.raw["runs"]]

    def _repr_markdown_(self) -> str:
        return self.markdown


def compare(experiment: Union[Mapping[str, Any], PathLike], *, trace: Union[PathLike, Frame, None] = None,
            base: Optional[Mapping[str, Any]] = None, seeds: Optional[Sequence[int]] = None,
            model: Optional[PathLike] = None, jobs: Optional[int] = None, progress: bool = True) -> Comparison:
    """Runs an experiment: its policies by its predictions (by its variants) over its seeds.

    ``experiment``: an experiment file (``configs/experiments/*.toml``) or the same as a dict.
    ``trace``, ``base`` (settings laid over the experiment's base), ``seeds`` and ``model`` (the
    bundle of every model prediction) are ``simulate compare``'s ``--trace``, flags, ``--seeds``
    and ``--model``; ``jobs`` runs at a time (default: the machine's cores).
    """
    if isinstance(experiment, Mapping):
        spec: Config = json.loads(json.dumps(dict(experiment)))
    else:
        spec = json.loads(_native.experiment_from_toml(_read_text(experiment, "experiment")))
    if base is not None:
        spec["base"] = _merge(spec.get("base", {}), base)
    if trace is not None and not isinstance(trace, (pd.DataFrame, pa.Table)):
        spec.setdefault("base", {}).setdefault("workload", {})["trace"] = _trace(trace)
    if seeds is not None:
        spec["seeds"] = [int(s) for s in seeds]
    if model is not None:
        for variant in spec.get("predictions", []):
            source = variant.get("prediction", {}).get("source", {})
            if source.get("kind") in ("model", "hybrid"):
                source["bundle"] = os.fspath(model)
    rows = columns = None
    if isinstance(trace, (pd.DataFrame, pa.Table)):
        rows, columns = to_native(trace)
    jobs = jobs or os.cpu_count() or 1
    bar = _progress.bar(progress, "compare")
    try:
        text, markdown = _native.compare_runs(json.dumps(spec), jobs, rows, columns, bar)
    finally:
        _progress.close(bar)
    return Comparison(json.loads(text), markdown)


__all__ = ["run", "compare", "default_config", "policy_names", "prediction_source", "to_toml",
           "without_timing", "SimulationResult", "Comparison"]
