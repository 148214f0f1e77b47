#!/usr/bin/env bash
# Runs the five experiments of docs/evaluation.md on the real traces in ../shared/data (and on
# the synthetic trace) and writes their tables and plots under docs/evaluation/<trace>/<experiment>/.
# Each experiment is one `simulate compare` command; this script only trains the models they need
# (once) and calls them in turn. Usage: scripts/evaluate.sh [azure|huawei|synthetic]... (default: all);
# EXPERIMENTS="lars fallback" runs only those.
set -euo pipefail
cd "$(dirname "$0")/.."
DATA=${DATA:-../shared/data}
MODELS=target/eval-models
cargo build --release -p simulator -p lifetime-model -p traces --bins

train() { # name, then lifetime-train arguments
    local name=$1; shift
    if [ ! -f "$MODELS/$name/manifest.json" ]; then
        target/release/lifetime-train --out "$MODELS/$name" --name "$name" --version "$name-1" \
            --iterations 200 "$@"
    fi
}

experiments() { # trace name, model dir, then the workload and inventory flags
    local name=$1 model=$2; shift 2
    for experiment in ${EXPERIMENTS:-perfect model accuracy-sweep lars fallback}; do
        target/release/simulate compare "configs/experiments/$experiment.toml" --model "$model" \
            --out-dir "docs/evaluation/$name/$experiment" "$@"
    done
}

[ $# -gt 0 ] || set -- azure huawei synthetic
for trace in "$@"; do
    case $trace in
    azure)
        # Trained on the earlier 3.5 days (trace-dev), replayed on the later 5.7 days (trace-test).
        train azure-v1 --train "$DATA/azure-v1-tracegen/trace-dev.csv.gz" \
            --eval "$DATA/azure-v1-tracegen/trace-test.csv.gz"
        experiments azure "$MODELS/azure-v1" --trace "$DATA/azure-v1-tracegen/trace-test.csv.gz" \
            --auto-hosts --headroom 0.2 --host-cores 48 --host-memory-gib 128 --warmup-s 86400
        ;;
    huawei)
        # Trained on the first half of the month, replayed on the second half (the VMs running at
        # its start are placed first).
        train huawei --train "$DATA/huawei-east-1-lt/trace.csv.gz" --train-fraction 0.5
        experiments huawei "$MODELS/huawei" --trace "$DATA/huawei-east-1-lt/trace.csv.gz" --from-s 1339040 \
            --auto-hosts --headroom 0.2 --host-cores 64 --host-memory-gib 128 --warmup-s 86400
        ;;
    synthetic)
        # The default model bundle is trained on the synthetic generator (seed 42); replayed on
        # another seed.
        experiments synthetic models/default --synthetic --synthetic-seed 7 --synthetic-days 14 \
            --auto-hosts --headroom 0.2 --warmup-s 86400
        ;;
    *) echo "unknown trace $trace: azure, huawei or synthetic" >&2; exit 2 ;;
    esac
done
