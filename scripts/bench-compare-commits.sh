#!/usr/bin/env bash
# Decision latency and simulation speed of two builds, alternately, in one run (issue 16 compared the
# previous commit 403208c, built in a worktree, with this one).
# Usage: OLD=DIR/target/release NEW=target/release OLD_BENCH=... NEW_BENCH=... scripts/bench-compare-commits.sh
# (the bench executables: target/release/deps/decision_latency-HASH, from `cargo bench --no-run`).
# Three parts:
#   1. wall-clock events/s of `simulate run` on the Azure V1 test trace, 5000 hosts, oracle, alternating
#      old/new three times (on this 2-core machine identical runs differ by up to 15%);
#   2. instructions executed inside the simulator's event loop (`simulator::engine::run`), counted by
#      callgrind on the first 60,000 VMs (2000 hosts): repeatable to the instruction, whatever else the
#      machine does (CALLGRIND=0 skips it);
#   3. the decision-latency bench (10k hosts, PBFR, LA-binary, NILAS, LAVA), old, new, new, old.
set -u
OLD=${OLD:?the old build target/release}
NEW=${NEW:-target/release}
OLD_BENCH=${OLD_BENCH:?the old decision_latency bench executable}
NEW_BENCH=${NEW_BENCH:?the new decision_latency bench executable}
trace=${TRACE:-../shared/data/azure-v1-tracegen/trace-test.csv.gz}
out=${OUT:-/tmp/bench-compare}; rm -rf "$out"; mkdir -p "$out"
bin_of() { if [ "$1" = old ]; then echo "$OLD"; else echo "$NEW"; fi; }
for rep in 1 2 3; do
  for p in pbfr la-binary nilas lava; do
    for side in old new; do
      "$(bin_of $side)"/simulate run --trace "$trace" --hosts 5000 --policy $p --prediction oracle --quiet --out $out/sim-$side-$p-$rep.json >/dev/null 2>&1
      python3 -c "import json,sys; t=json.load(open('$out/sim-$side-$p-$rep.json'))['timing']; print('$rep $p $side', t['wall_s'], t['events_per_s'], t['decisions_per_s'])"
    done
  done
done
if [ "${CALLGRIND:-1}" != 0 ]; then
  for p in pbfr la-binary nilas lava; do
    for side in old new; do
      ir=$(valgrind --tool=callgrind --callgrind-out-file=$out/cg-$side-$p.out --toggle-collect='simulator::engine::run*' \
          "$(bin_of $side)"/simulate run --trace "$trace" --max-vms 60000 --hosts 2000 --policy $p --prediction oracle \
          --quiet --out $out/cg-$side-$p.json 2>&1 | awk '/Collected/ {print $4}')
      echo "instructions $p $side $ir"
    done
  done
fi
for side in old new new2 old2; do
  bench=$OLD_BENCH; case $side in new*) bench=$NEW_BENCH;; esac
  $bench 10000 pbfr la-binary nilas lava --bench > $out/bench-$side.txt 2>&1
  echo "bench $side done"
done
