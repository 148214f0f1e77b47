#!/usr/bin/env bash
# Fingerprints the placement decisions of the published policies on the Azure V1 test trace, so that
# a refactoring of the placement core can show it changed no decision (issue 16): oracle
# predictions, lowest-index ties, every VM's host recorded. Prints, per policy, the SHA-256 of the
# placements and the run's averages; compare the output before and after a change (`diff`).
# Usage: scripts/decision-parity.sh [OUT_FILE] (needs ../shared/data; not part of the tests).
set -euo pipefail
cd "$(dirname "$0")/.."
DATA=${DATA:-../shared/data}
trace=$DATA/azure-v1-tracegen/trace-test.csv.gz
[ -f "$trace" ] || { echo "decision-parity: $trace is missing (set DATA=)" >&2; exit 2; }
cargo build --release -q -p simulator --bins
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
out=${1:-/dev/stdout}
for policy in pbfr la-binary nilas lava; do
    target/release/simulate run --trace "$trace" --hosts 1626 --host-cores 48 --host-memory-gib 128 \
        --policy "$policy" --prediction oracle --tie-break lowest-index --record-placements --quiet \
        --out "$work/$policy.json" >/dev/null
    python3 - "$work/$policy.json" "$policy" <<'PY'
import hashlib, json, sys
result = json.load(open(sys.argv[1]))
placements = json.dumps(result["placements"], sort_keys=True, separators=(",", ":")).encode()
figures = {"metrics": result["metrics"], "counters": result["counters"]}
print(sys.argv[2], hashlib.sha256(placements).hexdigest(), json.dumps(figures, sort_keys=True))
PY
done >"$out"
