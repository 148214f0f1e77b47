#!/usr/bin/env bash
# Decision latency and simulation speed of two builds, alternately, in one run (issue 16 compared the
# previous commit 403208c, built in a worktree with its own target/, with this one).
# Usage: OLD=DIR/target/release NEW=target/release OLD_BENCH=... NEW_BENCH=... scripts/bench-compare-commits.sh
# (the bench executables: target/release/deps/decision_latency-HASH, from `cargo bench --no-run`).
set -u
OLD=${OLD:?the old build target/release}
NEW=${NEW:-target/release}
OLD_BENCH=${OLD_BENCH:?the old decision_latency bench executable}
NEW_BENCH=${NEW_BENCH:?the new decision_latency bench executable}
trace=${TRACE:-../shared/data/azure-v1-tracegen/trace-test.csv.gz}
out=${OUT:-/tmp/bench-compare}; rm -rf "$out"; mkdir -p "$out"
for rep in 1 2 3; do
  for p in pbfr la-binary nilas lava; do
    for side in old new; do
      bin=$OLD; [ $side = new ] && bin=$NEW
      $bin/simulate run --trace $trace --hosts 5000 --policy $p --prediction oracle --quiet --out $out/sim-$side-$p-$rep.json >/dev/null 2>&1
      python3 -c "import json,sys; t=json.load(open('$out/sim-$side-$p-$rep.json'))['timing']; print('$rep $p $side', t['wall_s'], t['events_per_s'], t['decisions_per_s'])"
    done
  done
done
for side in old new new2 old2; do
  bench=$OLD_BENCH; case $side in new*) bench=$NEW_BENCH;; esac
  $bench 10000 pbfr la-binary --bench > $out/bench-$side.txt 2>&1
  echo "bench $side done"
done
