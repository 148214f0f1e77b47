#!/usr/bin/env bash
# Inference latency, side by side in one run (docs/benchmarks.md):
#   1. in process: our native evaluator and LifetimeModel against LightGBM's fast single-row C API;
#   2. over HTTP on loopback, one client for both: our inference server and the same bundle's model
#      file served by Python LightGBM behind FastAPI/uvicorn (what a user would otherwise pick).
# Usage: scripts/bench-inference.sh [BUNDLE_DIR]   (default: models/default)
set -euo pipefail
cd "$(dirname "$0")/.."
bundle=$(realpath "${1:-models/default}")

./scripts/setup.sh > /dev/null
cargo build --release -p inference-server --bins --benches -q
cargo build --release -p lifetime-train --benches -q

venv=target/bench-venv
if [ ! -x "$venv/bin/uvicorn" ]; then
    echo "== creating the Python reference environment in $venv"
    python3 -m venv "$venv"
    "$venv/bin/pip" install -q --disable-pip-version-check -r scripts/bench/requirements.txt
fi

free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
ours_port=$(free_port)
python_port=$(free_port)
models=$(mktemp -d)
# A copy, not a symlink: the server refuses bundle files that resolve outside its models directory.
cp -R "$bundle" "$models/$(basename "$bundle")"
pids=()
cleanup() { for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done; rm -rf "$models"; }
trap cleanup EXIT

RUST_LOG=warn target/release/inference-server --listen "127.0.0.1:$ours_port" --models-dir "$models" &
pids+=($!)
BUNDLE_DIR="$bundle" "$venv/bin/uvicorn" --app-dir scripts/bench python_server:app \
    --host 127.0.0.1 --port "$python_port" --log-level warning &
pids+=($!)
for port in "$ours_port" "$python_port"; do
    for _ in $(seq 1 200); do
        curl -fsS "http://127.0.0.1:$port/healthz" > /dev/null 2>&1 && break
        sleep 0.1
    done
done

echo "== in process"
cargo bench -q -p lifetime-train --bench bundle_predict -- "$bundle" 2>/dev/null
echo
echo "== over HTTP on loopback"
cargo bench -q -p inference-server --bench http_latency -- \
    "ours=http://127.0.0.1:$ours_port" "python-fastapi=http://127.0.0.1:$python_port" 2>/dev/null
