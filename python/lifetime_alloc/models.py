"""Lifetime model bundles: load one and predict on a DataFrame with the native evaluator.

Each row is predicted exactly as the inference server predicts the same VM (``POST /v1/predict``):
the row becomes the allocation request the replay client sends, the server's instance and its
features, with the tenant and job history of the bundle's feature store. Rows are shared out over
the cores, with the interpreter free.

>>> from lifetime_alloc import models, traces
>>> model = models.load("models/default")
>>> model.predict(traces.generate(days=1)).head()
"""

from __future__ import annotations

import json
import os
from typing import Any, Dict, Sequence, Union

import numpy as np
import pandas as pd

from . import _native
from ._frames import Frame, frame_from_native, to_native
from .errors import InvalidInputError

PathLike = Union[str, "os.PathLike[str]"]

#: What a prediction needs of a row beyond ``tenant_id``, ``vm_type``, ``cores``, ``memory_gib``
#: and ``start_s`` (the request time on the model's clock): filled in when the frame lacks them.
_ROW_DEFAULTS: Dict[str, Any] = {"vm_id": "vm", "priority": "", "end_s": None}


class Model:
    """A loaded and validated model bundle (checksums and probe predictions checked)."""

    def __init__(self, path: PathLike) -> None:
        self._native = _native.Model(os.fspath(path))
        self.path = os.fspath(path)

    @property
    def version(self) -> str:
        """The bundle's version (as ``GET /v1/models`` lists it)."""
        return self._native.version

    @property
    def manifest(self) -> Dict[str, Any]:
        """The bundle's ``manifest.json``: schema, thresholds, training window, evaluation report."""
        return json.loads(self._native.manifest_json())

    def predict(self, frame: Frame, *, interval: bool = False, lifetime: bool = True) -> pd.DataFrame:
        """Predicts every row of a trace frame; the index is the frame's.

        Columns: ``p_long`` (P(lifetime >= the long-lived threshold)), ``long`` (the class at the
        bundle's decision threshold), with ``lifetime`` ``expected_lifetime_s`` (the
        remaining-lifetime model at uptime 0; ``lifetime=False`` skips it and halves the work when
        only the class is wanted) and, with ``interval``, ``interval_class`` (the lifetime
        interval, the costly multi-class model). The frame needs ``tenant_id, vm_type, cores,
        memory_gib, start_s``; extra columns are features.
        """
        rows, columns = to_native(frame, _ROW_DEFAULTS)
        out = frame_from_native(rows, self._native.predict(rows, columns, interval, lifetime))
        out["long"] = out["long"].astype(bool)
        if interval:
            out["interval_class"] = out["interval_class"].astype("Int64")
        if isinstance(frame, pd.DataFrame):
            out.index = frame.index
        return out

    def encode(self, frame: Frame) -> np.ndarray:
        """The rows as the models' input matrix (rows x features, float64, NaN for missing), as the
        long-lived and interval models read them: for checking another evaluator of the bundle's
        model files (LightGBM's own, say) on the same rows."""
        rows, columns = to_native(frame, _ROW_DEFAULTS)
        width, data = self._native.encode(rows, columns)
        return np.frombuffer(data, dtype="<f8").reshape(rows, width)

    def predict_encoded(self, matrix: np.ndarray, *, lifetime: bool = True) -> pd.DataFrame:
        """``p_long`` and, with ``lifetime``, ``expected_lifetime_s`` of rows already encoded
        (:meth:`encode`'s matrix): the native evaluator alone, to compare with another evaluator on
        the same input."""
        matrix = np.ascontiguousarray(matrix, dtype="<f8")
        if matrix.ndim != 2:
            raise InvalidInputError(f"expected a 2-d matrix, got {matrix.ndim} dimensions", field="matrix",
                                    fix="pass Model.encode()'s matrix")
        return frame_from_native(matrix.shape[0],
                                 self._native.predict_encoded(matrix.shape[1], matrix.tobytes(), lifetime))

    def predict_remaining(self, frame: Frame, uptime_s: Union[float, Sequence[float], np.ndarray]) -> pd.Series:
        """Remaining lifetime in seconds of each row's VM after ``uptime_s`` of running (one number
        for every row, or one per row), as ``POST /v1/remaining-lifetime`` answers."""
        rows, columns = to_native(frame, _ROW_DEFAULTS)
        uptimes = np.broadcast_to(np.asarray(uptime_s, dtype=np.float64), (rows,)) if np.ndim(uptime_s) == 0 \
            else np.asarray(uptime_s, dtype=np.float64)
        if uptimes.shape != (rows,):
            raise InvalidInputError(f"{uptimes.shape[0]} uptimes for {rows} rows", field="uptime_s",
                                    fix="give one uptime, or one per row")
        out = frame_from_native(rows, self._native.predict_remaining(rows, columns, uptimes.tolist()))
        series = out["remaining_lifetime_s"]
        if isinstance(frame, pd.DataFrame):
            series.index = frame.index
        return series

    def __repr__(self) -> str:
        return f"Model({self.path!r}, version={self.version!r})"


def load(path: PathLike) -> Model:
    """Loads and validates the bundle in ``path`` (a directory holding ``manifest.json``)."""
    return Model(path)


def predict_instances(frame: Frame) -> list:
    """The rows as the ``instances`` of a ``POST /v1/predict`` body, built as :meth:`Model.predict`
    builds them (for :meth:`lifetime_alloc.client.InferenceClient.predict`)."""
    rows, columns = to_native(frame, _ROW_DEFAULTS)
    return json.loads(_native.predict_instances(rows, columns))


__all__ = ["Model", "load", "predict_instances"]
