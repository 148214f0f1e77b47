#!/usr/bin/env bash
# Instructions per allocation in the simulator's agents model (`simulate agents`, which runs the
# real follow) as the zone's agents grow (issue 60): each count is one process under callgrind
# (deterministic, whatever else the machine runs), over the whole run; the synthetic day (seed 42,
# 14,233 VMs), la-binary with the oracle's predictions (no model inference in the count), a lag of
# N-1 commits. Prints agents, instructions, instructions per VM, and the ratio to one agent.
# Usage: scripts/agents-instructions.sh [AGENTS...] (default: 1 2 4 8 16 64); needs valgrind.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v valgrind >/dev/null || { echo "agents-instructions: valgrind is needed (apt-get install valgrind)" >&2; exit 2; }
cargo build --release -p simulator --bin simulate
[ $# -gt 0 ] || set -- 1 2 4 8 16 64
out=target/callgrind
mkdir -p "$out"
echo "| agents | instructions | per VM | against 1 agent |"
echo "|---:|---:|---:|---:|"
first=""
for n in "$@"; do
    valgrind --tool=callgrind --callgrind-out-file="$out/agents-$n.out" target/release/simulate agents \
        --agents "$n" --synthetic --synthetic-days 1 --jobs 1 --policy la-binary --prediction oracle \
        --out-dir "$out/agents-$n" >"$out/agents-$n.log" 2>&1
    total=$(awk '/^summary:/ { print $2 }' "$out/agents-$n.out")
    vms=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["runs"][0]["result"]["workload"]["vms"])' "$out/agents-$n/results.json")
    first=${first:-$total}
    python3 -c 'import sys; n, t, v, f = sys.argv[1:]; print("| %s | %s | %.0f | %.2fx |" % (n, t, int(t) / int(v), int(t) / int(f)))' "$n" "$total" "$vms" "$first"
done
