#!/usr/bin/env bash
# How well can Azure V1's request-time features order long-lived VMs' exits at all? Issue 29's
# ceiling: the test trace's days are split into even and odd days; a model fitted on the even days
# (the same period, labels from the future included) and one fitted on trace-dev (the honest one)
# are measured on the same odd days. Harrell's C among VMs living >= 2 h, by reading, is printed
# from each bundle's evaluation.md. The trainer refuses an evaluation period that precedes its
# training data, so the odd-to-even fold is not run. Writes to target/azure-exit-ceiling/.
set -euo pipefail
cd "$(dirname "$0")/.."
DATA=${DATA:-../shared/data}
OUT=target/azure-exit-ceiling
TEST=$DATA/azure-v1-tracegen/trace-test.csv.gz
DEV=$DATA/azure-v1-tracegen/trace-dev.csv.gz
END_S=2591400   # the test trace's censoring time
cargo build --release -p lifetime-train --bin lifetime-train
mkdir -p "$OUT"
zcat "$TEST" | awk -F, -v even="$OUT/even.csv" -v odd="$OUT/odd.csv" '
    NR == 1 { print > even; print > odd; next }
    { day = int(($7 - 2099700) / 86400); print > (day % 2 == 0 ? even : odd) }'
gzip -f "$OUT/even.csv" "$OUT/odd.csv"
for source in even dev; do
    train=$OUT/even.csv.gz
    [ "$source" = dev ] && train=$DEV
    [ -f "$OUT/$source-model/manifest.json" ] || target/release/lifetime-train --train "$train" \
        --eval "$OUT/odd.csv.gz" --trace-end-s "$END_S" --out "$OUT/$source-model" \
        --drop weekday,tenant,job > "$OUT/$source-train.log"
    echo "== fitted on $source, measured on the test trace's odd days"
    sed -n '/^| VMs | count/,/^$/p;/^| reading | at request time/,/^$/{p;/^$/q}' \
        "$OUT/$source-model/evaluation.md"
done
