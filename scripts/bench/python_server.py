"""Reference server for the inference benchmark: the same bundle's LightGBM model file served the way
a Python user would, with LightGBM and FastAPI/uvicorn, answering our POST /v1/predict body.

It encodes instances exactly like lifetime-model's FeatureEncoder, from the schema in the bundle's
manifest. Tenant features take the unknown-tenant values: the benchmark only sends tenants that the
feature store does not know. Start: BUNDLE_DIR=models/default uvicorn --app-dir scripts/bench
python_server:app --port 8090
"""

import json
import math
import os
import time

import lightgbm
import numpy as np
from fastapi import FastAPI, Request

BUNDLE_DIR = os.environ.get("BUNDLE_DIR", "models/default")
with open(os.path.join(BUNDLE_DIR, "manifest.json")) as f:
    MANIFEST = json.load(f)
BOOSTER = lightgbm.Booster(model_file=os.path.join(BUNDLE_DIR, "long_lived.lgbm.txt"))
VERSION = MANIFEST["version"]
THRESHOLD = MANIFEST["decision_threshold"]
NAN = float("nan")

# The unknown-tenant summary (TenantSummary::unknown in lifetime-model/src/history.rs).
TENANT_UNKNOWN = {
    "tenant_vms_in_window": 0.0,
    "tenant_long_known": 0.0,
    "tenant_long_share": NAN,
    "tenant_log10_lifetime_p25": NAN,
    "tenant_log10_lifetime_p50": NAN,
    "tenant_log10_lifetime_p75": NAN,
    "tenant_running": 0.0,
}


def _number(text):
    try:
        value = float(text)
    except (TypeError, ValueError):
        return NAN
    return value if math.isfinite(value) else NAN


def _extra(instance, column):
    if column == "os":
        return instance.get("os")
    value = instance.get("features", {}).get(column)
    return None if value is None else str(value)


def _make_encoder(schema):
    """One closure per feature, in model column order."""
    columns = []
    for feature in schema["features"]:
        kind = feature["kind"]
        if "numeric" in kind:
            source = kind["numeric"]["source"]
            column = kind["numeric"].get("column")
            if source == "cores":
                columns.append(lambda i, t: float(i["cores"]))
            elif source == "memory_gib":
                columns.append(lambda i, t: float(i["memory_gib"]))
            elif source == "memory_per_core":
                columns.append(lambda i, t: i["memory_gib"] / i["cores"] if i["cores"] > 0 else NAN)
            elif source == "low_priority":
                columns.append(lambda i, t: 1.0 if i.get("priority") == "low" else 0.0)
            elif source == "hour_of_day":
                columns.append(lambda i, t: (t % 86400.0) / 3600.0)
            elif source == "weekday":
                columns.append(lambda i, t: float((t // 86400.0) % 7.0))
            elif source == "extra":
                columns.append(lambda i, t, c=column: _number(_extra(i, c)))
            elif feature["name"] in TENANT_UNKNOWN:
                columns.append(lambda i, t, v=TENANT_UNKNOWN[feature["name"]]: v)
            else:
                raise ValueError(f"unsupported numeric source {source}")
        else:
            categorical = kind["categorical"]
            codes = {category: code for category, code in categorical["codes"]}
            other = codes.get("other", NAN)
            source = categorical["source"]
            if source["source"] == "vm_type":
                columns.append(lambda i, t, codes=codes, other=other: codes.get(i["vm_type"], other))
            else:
                columns.append(
                    lambda i, t, codes=codes, other=other, c=source["column"]: codes.get(_extra(i, c), other)
                )
    return columns


ENCODER = _make_encoder(MANIFEST["schema"])


def encode(instance, now):
    t = instance.get("requested_at_s")
    t = now if t is None else float(t)
    return [column(instance, t) for column in ENCODER]


app = FastAPI()


@app.get("/healthz")
def healthz():
    return "ok"


@app.post("/v1/predict")
async def predict(request: Request):
    body = await request.json()
    now = time.time()
    rows = np.array([encode(instance, now) for instance in body["instances"]], dtype=np.float64)
    p_long = BOOSTER.predict(rows, num_threads=1)
    return {
        "predictions": [
            {"p_long": float(p), "class": "long" if p >= THRESHOLD else "short", "model_version": VERSION, "source": "model"}
            for p in p_long
        ]
    }
