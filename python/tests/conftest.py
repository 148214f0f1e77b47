"""Shared fixtures: the repository, the workspace's release binaries (for CLI and service parity),
a small synthetic trace, and a server started on a free loopback port."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Iterator

import pandas as pd
import pytest

from lifetime_alloc import traces

REPO = Path(__file__).resolve().parents[2]


def binary(name: str) -> Path:
    """A release binary of the workspace: in $LIFETIME_ALLOC_BIN_DIR (scripts/test-python.sh sets it),
    else target/release."""
    directory = Path(os.environ.get("LIFETIME_ALLOC_BIN_DIR", REPO / "target" / "release"))
    path = directory / name
    if not path.exists():
        pytest.fail(f"{path} is missing: run `cargo build --release --workspace` first")
    return path


@pytest.fixture(scope="session")
def repo() -> Path:
    return REPO


@pytest.fixture(scope="session")
def small_trace() -> pd.DataFrame:
    """A day of the seeded synthetic trace at a tenth of the usual rate (about 1,000 VMs)."""
    return traces.generate(seed=7, days=1.0, warmup_days=0.5, requests_per_hour=40.0, tenants=200)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def inference_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The real inference server on a free port, serving a copy of models/default."""
    models = tmp_path_factory.mktemp("models")
    shutil.copytree(REPO / "models" / "default", models / "default")
    port = free_port()
    log = open(models / "server.log", "wb")
    process = subprocess.Popen(
        [str(binary("inference-server")), "--models-dir", str(models), "--listen", f"127.0.0.1:{port}"],
        stdout=log, stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(url + "/readyz", timeout=1):
                    break
            except OSError:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"the inference server did not become ready: {(models / 'server.log').read_text()}")
                time.sleep(0.1)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=10)
        log.close()
