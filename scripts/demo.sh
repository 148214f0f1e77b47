#!/usr/bin/env bash
# The README's main job. Until the end-to-end allocation stack lands (issue 5) it runs the parts of
# the system that exist, for real, on loopback:
#   1. builds the workspace (installing missing prerequisites first);
#   2. makes sure the default model bundle exists (trains it if models/default is missing);
#   3. generates the 14-day synthetic trace calibrated to the papers that the default model was
#      trained on (seeded, so identical), and prints its statistics;
#   4. starts the inference server on the default bundle, asks it over HTTP about 2,000 VMs of day 10,
#      inside the held-out period the model never saw, prints its answers beside the true
#      lifetimes, and stops the server.
# Generated files go to target/demo/.
set -euo pipefail
cd "$(dirname "$0")/.."

./scripts/setup.sh
cargo build --release --workspace --bins

if [ ! -f models/default/manifest.json ]; then
    echo "== no default model bundle: training one"
    ./scripts/train-default-model.sh
fi

mkdir -p target/demo
trace=target/demo/synthetic-14d.csv.gz
echo "== 14 days of synthetic VM requests (the default model trained on days 0-9)"
target/release/vmtrace generate --out "$trace" --days 14 --seed 42
target/release/vmtrace stats "$trace"

port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
echo
echo "== inference server on 127.0.0.1:$port serving models/default"
RUST_LOG=warn target/release/inference-server --listen "127.0.0.1:$port" --models-dir models \
    > target/demo/inference-server.log 2>&1 &
server=$!
trap 'kill $server 2>/dev/null || true; wait $server 2>/dev/null || true' EXIT
for _ in $(seq 1 100); do
    if curl -fsS "http://127.0.0.1:$port/readyz" > /dev/null 2>&1; then break; fi
    if ! kill -0 $server 2>/dev/null; then cat target/demo/inference-server.log; exit 1; fi
    sleep 0.1
done
curl -fsS "http://127.0.0.1:$port/readyz"; echo

echo "== 2,000 VMs of day 10 (held out), predicted over HTTP in batches of 64"
target/release/inference-client "$trace" --server "http://127.0.0.1:$port" --from-s 864000 --vms 2000 --show 12
