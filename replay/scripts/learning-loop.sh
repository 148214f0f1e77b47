#!/usr/bin/env bash
# One replay of the learning-loop evaluation (docs/evaluation/learning-loop.md): starts an inference
# server on one bundle, an allocator and a control service natively on loopback (configs written
# to a fresh work directory, the allocator's store on tmpfs), replays a window of a trace through
# them with vmreplay, saves what the services report, and stops the services it started.
#
#   replay/scripts/learning-loop.sh MODE BUNDLE TRACE FROM_S DURATION_S OUT_DIR [VMREPLAY_ARGS...]
#
# MODE: `live` (the control service feeds every placement and release to the inference server,
# which keeps the bundle's tenant history current) or `frozen` (`[inference] history = false`,
# `[history] live = false`: the bundle's feature store as of its cut-off). Both: no prediction
# cache (every VM asks the model with its tenant's history as of its request), no safeguard (every
# tenant is new to a control service that starts with the replay: the newcomers' long-share window
# would override the model), the quality gate off (measure only), a 200 ms inference budget (no
# fallbacks), the allocator's outcome window large enough for the whole window (QUALITY_WINDOW,
# default 200,000 outcomes per version). DURATION_S `-`: up to the trace's last VM.
# Inventory: 1,626 hosts of 48 cores / 128 GiB (docs/evaluation.md, the Azure V1 test trace), LA-binary.
#
# OUT_DIR receives: vmreplay.txt (the summary), vmreplay.json, replay.svg, replay-quality.svg,
# quality.json (the allocator's GET /v1/quality at the end), stats.json (the control service's
# GET /v1/stats at the end). The per-VM predictions (trace data: not for the repository) go to
# $WORK/predictions.csv, and WORK (default /dev/shm/learning-loop-MODE) keeps the logs.
# Environment: PORT_BASE (default 18180: control, +1 inference, +2 allocator), BIN_DIR
# (default target/release), WORK, QUALITY_WINDOW, CONCURRENCY (requests in flight, default 1: each
# request sees the history events of the one before, in trace order, as the trainer's replay does).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."

[ $# -ge 6 ] || { sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "${BASH_SOURCE[0]}"; exit 2; }
MODE=$1 BUNDLE=$2 TRACE=$3 FROM_S=$4 DURATION_S=$5 OUT=$6
shift 6
case "$MODE" in
    live) HISTORY=true ;;
    frozen) HISTORY=false ;;
    *) echo "MODE must be live or frozen, got $MODE" >&2; exit 2 ;;
esac
[ -f "$BUNDLE/manifest.json" ] || { echo "$BUNDLE is not a model bundle (no manifest.json)" >&2; exit 2; }
BIN_DIR=${BIN_DIR:-target/release}
PORT_BASE=${PORT_BASE:-18180}
CONTROL=127.0.0.1:$PORT_BASE INFERENCE=127.0.0.1:$((PORT_BASE + 1)) ALLOCATOR=127.0.0.1:$((PORT_BASE + 2))
WORK=${WORK:-/dev/shm/learning-loop-$MODE}
rm -rf "$WORK"
mkdir -p "$WORK/models" "$OUT"
cp -r "$BUNDLE" "$WORK/models/$(basename "$BUNDLE")"

cat >"$WORK/inference-server.toml" <<TOML
listen = "$INFERENCE"
models_dir = "$WORK/models"
runtime_threads = 1
[history]
live = $HISTORY
TOML
cat >"$WORK/allocator.toml" <<TOML
listen = "$ALLOCATOR"
store = "$WORK/allocator.db"
max_batch = 256
[generate]
zone = "zone-1"
hosts = 1626
hosts_per_rack = 20
cores = 48
memory_gib = 128
[allocator]
tie_break = "random"
seed = 42
engine = "incremental"
[allocator.policy]
kind = "la-binary"
buckets = 3
long_threshold_s = 7200.0
prefer_non_empty = true
[quality]
window = ${QUALITY_WINDOW:-200000}
TOML
cat >"$WORK/control-service.toml" <<TOML
listen = "$CONTROL"
default_zone = "zone-1"
runtime_threads = 2
[zones.zone-1]
allocator = "http://$ALLOCATOR"
[inference]
servers = ["http://$INFERENCE"]
timeout_ms = 200
history = $HISTORY
[cache]
max_entries = 0
[safeguard]
enabled = false
[quality]
gate = false
poll_ms = 1000
TOML

PIDS=()
stop() {
    local pid
    for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
    for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
}
trap stop EXIT
start() {
    NO_COLOR=1 RUST_LOG=${RUST_LOG:-warn} "$BIN_DIR/$1" --config "$WORK/$1.toml" >"$WORK/$1.log" 2>&1 &
    PIDS+=($!)
}
wait_ready() {
    local i
    for i in $(seq 1 120); do
        curl -sf "http://$1/readyz" >/dev/null 2>&1 && return 0
        sleep 0.5
    done
    echo "$1 did not become ready; see $WORK/*.log" >&2
    exit 1
}
start inference-server
start allocator
wait_ready "$INFERENCE"
wait_ready "$ALLOCATOR"
start control-service
wait_ready "$CONTROL"

WINDOW=(--from-s "$FROM_S")
[ "$DURATION_S" = - ] || WINDOW+=(--duration-s "$DURATION_S")
"$BIN_DIR/vmreplay" "$TRACE" --control "http://$CONTROL" "${WINDOW[@]}" \
    --speed 1e9 --concurrency "${CONCURRENCY:-1}" --sample-every-s 2 --settle-s 3 --vm-id-prefix "$MODE" \
    --json "$OUT/vmreplay.json" --plot "$OUT/replay.svg" --predictions "$WORK/predictions.csv" "$@" \
    | tee "$OUT/vmreplay.txt"
curl -sf "http://$ALLOCATOR/v1/quality" >"$OUT/quality.json"
curl -sf "http://$CONTROL/v1/stats" >"$OUT/stats.json"
curl -sf "http://$INFERENCE/v1/history" >"$OUT/history.json" || true
echo "learning-loop: $MODE done; predictions in $WORK/predictions.csv, logs in $WORK"
