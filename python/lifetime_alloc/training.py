"""Training a model bundle from a trace file or a DataFrame: ``lifetime-train``.

>>> from lifetime_alloc import training, traces
>>> bundle = training.train(traces.generate(days=7), "models/my-model", iterations=100)
>>> print(bundle.report)                     # evaluation.md
"""

from __future__ import annotations

import json
import os
import warnings
from typing import Any, Dict, Optional, Union

import pandas as pd
import pyarrow as pa

from . import _native
from ._frames import Frame, to_native

PathLike = Union[str, "os.PathLike[str]"]


class TrainedBundle:
    """A bundle the trainer wrote: its directory, manifest and evaluation report (Markdown)."""

    def __init__(self, path: str, manifest: Dict[str, Any], report: str) -> None:
        self.path = path
        self.manifest = manifest
        self.report = report

    def load(self) -> "Any":
        """The bundle as a :class:`lifetime_alloc.models.Model`."""
        from .models import Model

        return Model(self.path)

    def _repr_markdown_(self) -> str:
        return self.report


def train(train: Union[PathLike, Frame], out: PathLike, *, eval: Optional[PathLike] = None,
          name: str = "lifetime", version: Optional[str] = None, train_fraction: float = 0.7,
          long_threshold_hours: float = 2.0, iterations: int = 300, num_leaves: int = 63,
          survival: bool = True, threads: int = 2, seed: int = 7, trace_end_s: Optional[float] = None,
          progress: bool = True) -> TrainedBundle:
    """Trains the lifetime models and writes a bundle to ``out``: ``lifetime-train --train ... --out ...``.

    ``train``: a trace file or a trace frame; ``eval``: a later trace to evaluate on (else the
    training trace is split in time, ``train_fraction`` first). The other settings are the CLI's
    flags of the same names (``survival=False`` is ``--no-survival``). Returns the bundle with its
    manifest and its report.
    """
    rows = columns = None
    path = None
    if isinstance(train, (pd.DataFrame, pa.Table)):
        rows, columns = to_native(train)
    else:
        path = os.fspath(train)

    def stage(name: str) -> None:
        if progress:
            print(f"lifetime-train: {name}", flush=True)

    manifest, report, warning = _native.train(
        os.fspath(out), path, rows, columns, None if eval is None else os.fspath(eval), name, version,
        train_fraction, long_threshold_hours, iterations, num_leaves, survival, threads, seed, trace_end_s, stage)
    if warning:
        warnings.warn(warning, stacklevel=2)
    return TrainedBundle(os.fspath(out), json.loads(manifest), report)


__all__ = ["train", "TrainedBundle"]
