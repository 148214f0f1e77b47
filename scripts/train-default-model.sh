#!/usr/bin/env bash
# Reproduces models/default: a small bundle trained by our trainer on the seeded synthetic trace.
# Deterministic apart from the manifest's creation time.
set -euo pipefail
cd "$(dirname "$0")/.."

cargo build --release -p traces -p lifetime-train --bins
mkdir -p target/default-model
target/release/vmtrace generate --out target/default-model/synthetic-14d.csv.gz --days 14 --seed 42
target/release/lifetime-train \
    --train target/default-model/synthetic-14d.csv.gz \
    --out models/default --name default --version default-1 \
    --iterations 100 --num-leaves 31 --max-remaining-vms 30000
