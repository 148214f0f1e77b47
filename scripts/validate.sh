#!/usr/bin/env bash
# Chooses the robust policies' settings honestly (issue 14): trains validation models on the first
# 75% of each trace's training period and runs configs/experiments/validation.toml over the last
# 25%, never touching the test period. Results go to docs/evaluation/<trace>-validation/.
# Usage: scripts/validate.sh [azure|huawei]... (default: both).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/eval-common.sh

# The validation split starts where the validation model's training stops.
cutoff() { python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["training"]["cutoff_s"])' "$1"; }

[ $# -gt 0 ] || set -- azure huawei
for trace in "$@"; do
    case $trace in
    azure)
        # The training period is trace-dev (the test period, trace-test, is not read).
        dev=$DATA/azure-v1-tracegen/trace-dev.csv.gz
        train azure-v1-val --train-fraction 0.75 --train "$dev"
        target/release/simulate compare configs/experiments/validation.toml --model "$MODELS/azure-v1-val" \
            --out-dir docs/evaluation/azure-validation --trace "$dev" \
            --measure-from-s "$(cutoff "$MODELS/azure-v1-val/manifest.json")" \
            --auto-hosts --headroom 0.1 --host-cores 48 --host-memory-gib 384
        ;;
    huawei)
        # The training period is the first half of the month (the second half is the test period).
        half=target/val-data/huawei-first-half.csv.gz
        mkdir -p target/val-data
        zcat "$DATA/huawei-east-1-lt/trace.csv.gz" | awk -F, 'NR == 1 || $7 < 1339040' | gzip >"$half"
        train huawei-val --train-fraction 0.75 --train "$half"
        target/release/simulate compare configs/experiments/validation.toml --model "$MODELS/huawei-val" \
            --out-dir docs/evaluation/huawei-validation --trace "$half" --seeds 1,2,3,4,5 \
            --measure-from-s "$(cutoff "$MODELS/huawei-val/manifest.json")" \
            --auto-hosts --headroom 0.2 --host-cores 64 --host-memory-gib 128
        ;;
    *) echo "unknown trace $trace: azure or huawei" >&2; exit 2 ;;
    esac
done
