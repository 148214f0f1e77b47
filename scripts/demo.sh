#!/usr/bin/env bash
# The README's main job: the whole stack on loopback, driven by a real trace.
#   1. installs what it runs when missing (scripts/setup.sh --run) and builds the services and the
#      replay client, which link no LightGBM: no CMake, libclang or C++ build;
#   2. makes sure the default model bundle exists (trains it if models/default is missing: only then
#      are the trainer's prerequisites installed and LightGBM built);
#   3. starts the three services natively with the checked-in configs and a fresh embedded allocator
#      store (scripts/stack.sh up --fresh), the allocator on the trace's clock (STACK_CLOCK=request:
#      VMs' ages, NILAS's exit times and consolidation's hourly rounds run in trace time);
#   4. replays day 10 of the seeded 14-day synthetic trace (held out: the default model trained on
#      days 0-9) through POST /allocate, one trace day per real minute, releasing each VM at its end
#      time and confirming each of consolidation's live migrations 20 trace minutes after it started
#      (the orchestrator's part), and prints the summary: outcomes, latency, cache hit rate,
#      fallbacks, migrations, packing density and empty hosts over time;
#   5. stops the stack (also on failure or Ctrl-C), unless DEMO_KEEP=1 asks to keep it up for a look
#      at the operator's console (http://127.0.0.1:8080/dashboard).
# Generated files (trace, summary JSON, plot, service logs) go to target/demo/ and target/stack/.
set -euo pipefail
cd "$(dirname "$0")/.."

./scripts/setup.sh --run
# What the demo runs: the three services (stack.sh), vmtrace and vmreplay.
cargo build --release -p inference-server -p allocator -p control-service -p replay -p traces --bins

if [ ! -f models/default/manifest.json ]; then
    echo "== no default model bundle: training one"
    ./scripts/setup.sh --build-only
    ./scripts/train-default-model.sh
fi

mkdir -p target/demo
trace=target/demo/synthetic-14d.csv.gz
echo "== 14 days of synthetic VM requests (seed 42; the default model trained on days 0-9)"
target/release/vmtrace generate --out "$trace" --days 14 --seed 42

echo
echo "== starting the stack"
trap './scripts/stack.sh down' EXIT
STACK_CLOCK=request ./scripts/stack.sh up --fresh

echo
echo "== replaying day 10 through POST /allocate at 1,440x (one trace day per real minute)"
echo "   watch it in the operator's console: http://127.0.0.1:8080/dashboard"
RUST_BACKTRACE=0 target/release/vmreplay "$trace" \
    --from-s 864000 --duration-s 86400 --speed 1440 --concurrency 8 \
    --confirm-migrations http://127.0.0.1:8082 --admin-token-file target/stack/admin-token --migration-s 1200 \
    --json target/demo/replay.json --plot target/demo/replay.svg
echo
echo "summary: target/demo/replay.json; packing density and empty hosts over time: target/demo/replay.svg"
if [ "${DEMO_KEEP:-0}" = 1 ]; then
    # The stack stays up for a look at the console; stop it with scripts/stack.sh down.
    trap - EXIT
    echo "the stack is still running (DEMO_KEEP=1): http://127.0.0.1:8080/dashboard; stop it with scripts/stack.sh down"
fi
