"""Training from Python: a bundle from a DataFrame that loads and predicts."""

from __future__ import annotations

import pandas as pd
import pytest

from lifetime_alloc import models, traces, training
from lifetime_alloc.errors import InvalidInputError


def test_train_from_a_frame(tmp_path) -> None:
    trace = traces.generate(seed=11, days=4.0, warmup_days=1.0, requests_per_hour=60.0, tenants=200)
    bundle = training.train(trace, tmp_path / "bundle", name="py", version="py-1", iterations=20, survival=False,
                            progress=False)
    assert bundle.manifest["version"] == "py-1"
    assert (tmp_path / "bundle" / "evaluation.md").read_text() == bundle.report
    model = bundle.load()
    assert isinstance(model, models.Model)
    predictions = model.predict(trace.iloc[:100])
    assert predictions["p_long"].between(0, 1).all()


def test_bad_settings(tmp_path) -> None:
    trace = traces.generate(seed=11, days=1.0, requests_per_hour=20.0, tenants=50)
    with pytest.raises(InvalidInputError) as error:
        training.train(trace, tmp_path / "b", train_fraction=1.5, progress=False)
    assert error.value.field == "config"
