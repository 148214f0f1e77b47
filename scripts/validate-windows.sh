#!/usr/bin/env bash
# Issue 29's validation protocol: every choice (the reading of the lifetime distribution, the
# policy and its settings, the recommended default) is made on three windows at the end of each
# trace's training period, each replayed in the steady-state way (from the period's start, the
# earlier VMs warming the inventory up) and measured over the window only, with a model trained on
# what precedes the window. The test period is never read. Results go to
# docs/evaluation/<trace>-validation-w<k>/<experiment>/ and scripts/combine-windows.py sums them up.
# Usage: scripts/validate-windows.sh [azure|huawei]... (default: both); EXPERIMENT=name picks
# another experiment file (default survival-validation).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/eval-common.sh
EXPERIMENT=${EXPERIMENT:-survival-validation}

manifest() { python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["training"][sys.argv[2]])' "$1" "$2"; }
last_start() { zcat -f "$1" | awk -F, 'NR > 1 && $7 > m { m = $7 } END { printf "%.3f\n", m }'; }

# window NAME TRACE FROM TO SIMULATE-FLAGS...: the model trains on the trace's arrivals before
# fraction FROM of its arrival span; the window is [FROM, TO) of that span.
window() {
    local name=$1 trace=$2 from=$3 to=$4; shift 4
    train "$name" --train "$trace" --train-fraction "$from"
    local first cutoff last duration
    first=$(manifest "$MODELS/$name/manifest.json" first_start_s)
    cutoff=$(manifest "$MODELS/$name/manifest.json" cutoff_s)
    last=$(last_start "$trace")
    duration=$(python3 -c "print($to * ($last - $first))")
    target/release/simulate compare "configs/experiments/$EXPERIMENT.toml" --model "$MODELS/$name" \
        --out-dir "docs/evaluation/$name/$EXPERIMENT" --trace "$trace" --duration-s "$duration" \
        --measure-from-s "$cutoff" "$@"
}

[ $# -gt 0 ] || set -- azure huawei
for trace in "$@"; do
    case $trace in
    azure)
        dev=$DATA/azure-v1-tracegen/trace-dev.csv.gz
        for k in 1 2 3; do
            from=$(python3 -c "print(0.2 + 0.2 * $k)")
            window "azure-validation-w$k" "$dev" "$from" "$(python3 -c "print($from + 0.2)")" \
                --auto-hosts --headroom 0.1 --host-cores 48 --host-memory-gib 384
        done
        ;;
    huawei)
        # The training period is the first half of the month (the second half is the test period).
        half=target/val-data/huawei-first-half.csv.gz
        mkdir -p target/val-data
        zcat "$DATA/huawei-east-1-lt/trace.csv.gz" | awk -F, 'NR == 1 || $7 < 1339040' | gzip >"$half"
        for k in 1 2 3; do
            from=$(python3 -c "print(0.2 + 0.2 * $k)")
            window "huawei-validation-w$k" "$half" "$from" "$(python3 -c "print($from + 0.2)")" --seeds 1,2,3,4,5 \
                --auto-hosts --headroom 0.3 --host-cores 64 --host-memory-gib 128
        done
        ;;
    *) echo "unknown trace $trace: azure or huawei" >&2; exit 2 ;;
    esac
done
