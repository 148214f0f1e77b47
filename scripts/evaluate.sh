#!/usr/bin/env bash
# Runs the experiments of docs/evaluation.md on the real traces in ../shared/data (and on the
# synthetic trace) and writes their tables and plots under docs/evaluation/<trace>/<experiment>/.
# Each experiment is one `simulate compare` command; this script only trains the models they need
# (once) and calls them in turn. Usage: scripts/evaluate.sh [azure|huawei|synthetic]... (default: all);
# EXPERIMENTS="lars fallback" runs only those.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/eval-common.sh

# Runs the experiments named after the trace name and model dir (those in $EXPERIMENTS only, when
# set), up to `--`; the rest are the workload and inventory flags.
experiments() {
    local name=$1 model=$2; shift 2
    local wanted=()
    while [ "$1" != -- ]; do wanted+=("$1"); shift; done
    shift
    for experiment in "${wanted[@]}"; do
        case " ${EXPERIMENTS:-${wanted[*]}} " in *" $experiment "*) ;; *) continue ;; esac
        target/release/simulate compare "configs/experiments/$experiment.toml" --model "$model" \
            --out-dir "docs/evaluation/$name/$experiment" "$@"
    done
}

AZURE=$DATA/azure-v1-tracegen
[ $# -gt 0 ] || set -- azure huawei synthetic
for trace in "$@"; do
    case $trace in
    azure)
        # Trained on the earlier 3.5 days (trace-dev), replayed on the later 5.7 days (trace-test).
        train azure-v1 --train "$AZURE/trace-dev.csv.gz" --eval "$AZURE/trace-test.csv.gz"
        # The steady-state protocol: dev and test replayed as one timeline (dev warms the cluster
        # up with its long-lived VMs), measured over the test period only; 10% headroom over the
        # peak is enough for PBFR never to reject.
        experiments azure-steady "$MODELS/azure-v1" oracle-and-model reachable consolidation-test consolidation-test-2 consolidation-test-3 -- \
            --trace "$AZURE/trace-dev.csv.gz" --trace "$AZURE/trace-test.csv.gz" --measure-from-s 2099700 \
            --auto-hosts --headroom 0.1 --host-cores 48 --host-memory-gib 384
        # The papers' five experiments on the test trace alone, starting empty (single seed).
        experiments azure "$MODELS/azure-v1" perfect model accuracy-sweep lars fallback -- \
            --trace "$AZURE/trace-test.csv.gz" \
            --auto-hosts --headroom 0.2 --host-cores 48 --host-memory-gib 128 --warmup-s 86400
        ;;
    huawei)
        # Trained on the first half of the month, replayed on the whole month and measured over the
        # second half (the first half warms the cluster up); 30% headroom over the peak is enough
        # for PBFR never to reject.
        train huawei --train "$DATA/huawei-east-1-lt/trace.csv.gz" --train-fraction 0.5
        experiments huawei "$MODELS/huawei" oracle-and-model consolidation-test consolidation-test-3 -- \
            --trace "$DATA/huawei-east-1-lt/trace.csv.gz" --measure-from-s 1339040 --seeds 1,2,3,4,5 \
            --auto-hosts --headroom 0.3 --host-cores 64 --host-memory-gib 128
        # The papers' five experiments from the second half, its running VMs placed first.
        experiments huawei "$MODELS/huawei" perfect model accuracy-sweep lars fallback -- \
            --trace "$DATA/huawei-east-1-lt/trace.csv.gz" --from-s 1339040 \
            --auto-hosts --headroom 0.2 --host-cores 64 --host-memory-gib 128 --warmup-s 86400
        ;;
    synthetic)
        # The default model bundle is trained on the synthetic generator (seed 42); replayed on
        # another seed.
        experiments synthetic models/default perfect model accuracy-sweep lars fallback oracle-and-model -- \
            --synthetic --synthetic-seed 7 --synthetic-days 14 --auto-hosts --headroom 0.2 --warmup-s 86400
        ;;
    *) echo "unknown trace $trace: azure, huawei or synthetic" >&2; exit 2 ;;
    esac
done
