"""Models: predictions through Python equal the inference server's for the same rows; bad input
raises the package's exceptions."""

from __future__ import annotations

import pandas as pd
import pytest

from conftest import REPO
from lifetime_alloc import models
from lifetime_alloc.client import InferenceClient
from lifetime_alloc.errors import InvalidInputError, MissingFileError

BUNDLE = REPO / "models" / "default"


@pytest.fixture(scope="module")
def model() -> models.Model:
    return models.load(BUNDLE)


def test_predictions_equal_the_inference_server(model: models.Model, small_trace: pd.DataFrame,
                                                inference_server: str) -> None:
    rows = small_trace.iloc[:600]
    ours = model.predict(rows, interval=True)
    served = InferenceClient(inference_server).predict(models.predict_instances(rows), interval_class=True)
    assert len(served) == len(rows)
    assert list(ours["p_long"]) == [p["p_long"] for p in served]
    assert list(ours["expected_lifetime_s"]) == [p["expected_lifetime_s"] for p in served]
    assert list(ours["long"]) == [p["class"] == "long" for p in served]
    assert list(ours["interval_class"]) == [p["interval_class"] for p in served]
    assert {p["model_version"] for p in served} == {model.version}


def test_predict_keeps_the_index_and_needs_few_columns(model: models.Model, small_trace: pd.DataFrame) -> None:
    # vm_id, priority and end_s may be left out (the extra columns are features: they stay).
    rows = small_trace.iloc[10:20].drop(columns=["vm_id", "priority", "end_s"])
    out = model.predict(rows)
    assert list(out.index) == list(rows.index)
    assert list(out.columns) == ["p_long", "long", "expected_lifetime_s"]
    assert out["p_long"].between(0, 1).all()
    full = model.predict(small_trace.iloc[10:20])
    assert list(full["p_long"]) == list(out["p_long"])


def test_remaining_lifetime(model: models.Model, small_trace: pd.DataFrame) -> None:
    remaining = model.predict_remaining(small_trace.iloc[:50], 3600.0)
    assert len(remaining) == 50 and (remaining >= 0).all()
    with pytest.raises(InvalidInputError) as error:
        model.predict_remaining(small_trace.iloc[:50], [1.0, 2.0])
    assert error.value.field == "uptime_s"


def test_manifest_and_version(model: models.Model) -> None:
    assert model.manifest["version"] == model.version == "default-1"


def test_missing_column(model: models.Model, small_trace: pd.DataFrame) -> None:
    with pytest.raises(InvalidInputError) as error:
        model.predict(small_trace.drop(columns=["vm_type"]))
    assert error.value.field == "vm_type"


def test_wrong_type(model: models.Model, small_trace: pd.DataFrame) -> None:
    with pytest.raises(InvalidInputError) as error:
        model.predict(small_trace.assign(vm_type=range(len(small_trace))))
    assert error.value.field == "vm_type"
    assert "astype(str)" in error.value.fix


def test_missing_bundle(tmp_path) -> None:
    with pytest.raises(FileNotFoundError) as error:
        models.load(tmp_path / "nothing")
    assert isinstance(error.value, MissingFileError)
    assert error.value.field == "path"
