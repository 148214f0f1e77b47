#!/usr/bin/env bash
# The README's main job. Until the end-to-end stack lands (issue 5) it does the part of the system
# that exists: builds the workspace, generates a week of synthetic VM requests calibrated to the
# papers, and prints the trace's statistics. Generated files go to target/demo/.
set -euo pipefail
cd "$(dirname "$0")/.."

./scripts/setup.sh
cargo build --release --workspace --bins

mkdir -p target/demo
trace=target/demo/synthetic-7d.csv.gz
target/release/vmtrace generate --out "$trace" --days 7 --seed 42
echo
target/release/vmtrace stats "$trace"
