#!/usr/bin/env bash
# The compose stack run for real, end to end (docs/operations.md, "The compose stack, run for real"):
#
#   1. builds the image and starts docker-compose.yml (`up -d --build`) as its own project (below),
#      waits until every service is healthy; reads the generated service token (the `service-token`
#      volume) and checks that the allocators' POST /v1/allocations and the inference server's
#      POST /v1/predict answer 401 without it (or with a wrong one) and normally with it; direct
#      calls below present it;
#   2. places three VMs through the control service's POST /allocate, then replays day 10 of the
#      seeded synthetic trace (12,102 VMs, about a minute) with the image's own vmreplay on the
#      compose network;
#   3. rolls a canary out the way models/README.md says: a second bundle, trained here on another
#      seed (cargo build, vmtrace and lifetime-train on the host: a few minutes, the stack up),
#      copied into the models directory under a hidden name and renamed into place, then
#      rollout.toml; checks that GET /v1/models lists it as the canary and that it served requests;
#      checks the operator's console (/dashboard, its zone views and timeline) and, with chromium
#      installed, saves its screenshot to target/compose-smoke/compose-dashboard.png;
#   4. restarts the allocator and checks that its state came back from the named volume;
#   5. stops the stack and checks that every service exited 0 within Docker's 10 s grace, then
#      `down -v`.
#
# With --agents, the same over docker-compose.agents.yml (two agents on one PostgreSQL store), and
# instead of step 4: both agents see the same VMs, and allocations go on after agent 1 is killed.
#
# Runs on a copy of the committed tree (`git archive HEAD` into target/compose-smoke/src), so the
# canary's files and the stack's state never touch the working tree: commit first.
#
# Runs as a Compose project of its own, $COMPOSE_SMOKE_PROJECT (default
# lifetime-aware-allocation-smoke; never docker-compose.yml's `name:`, the operator's stack), so its
# containers, networks, images and volumes are its own: an operator's stack, its containers and its
# volumes (the allocator's state, the service token) are never touched, and it may be up meanwhile.
# Every compose call goes through "${compose[@]}", which carries `-p "$project"`. Its host ports are
# the stack's plus $COMPOSE_SMOKE_PORT_OFFSET (default 10000: 18080, 18081, 18082, 18083, 19090,
# 13000), through the compose files' LAVA_*_PORT variables. It refuses to start while its own
# project has containers or volumes. e2e/tests/it/compose_smoke.rs runs it against a stand-in `docker`.
# Needs a Docker engine and Compose v2 (`docker compose`); on a machine without an image registry,
# run scripts/offline-images.sh first. NOT IN CI: the image build takes minutes (17 cold, under 3
# with BuildKit's cache warm) and CI has no Docker engine.
#
# KEEP=1 leaves the stack up at the end (and on failure) for a look; `docker compose -p
# lifetime-aware-allocation-smoke down -v` in target/compose-smoke/src removes it.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

AGENTS=0
case "${1:-}" in
    --agents) AGENTS=1 ;;
    "") ;;
    *) echo "usage: $0 [--agents]" >&2; exit 2 ;;
esac
say() { echo "compose-smoke: $*"; }
die() { echo "compose-smoke: FAILED: $*" >&2; exit 1; }

docker compose version >/dev/null 2>&1 || die "'docker compose' (Compose v2) not found"
docker info >/dev/null 2>&1 || die "'docker info' fails: is the Docker engine running?"

root=$PWD
# COMPOSE_SMOKE_WORK: another directory for the copy and the results (e2e/tests/it/compose_smoke.rs).
work=${COMPOSE_SMOKE_WORK:-$root/target/compose-smoke}
src=$work/src

# --- its own project and host ports ---------------------------------------------------------------
stack=$(sed -n 's/^name: *//p' docker-compose.yml)
project=${COMPOSE_SMOKE_PROJECT:-$stack-smoke}
[ "$project" != "$stack" ] ||
    die "COMPOSE_SMOKE_PROJECT=$project is the stack's own project (docker-compose.yml's name:): choose another"
[[ $project =~ ^[a-z0-9][a-z0-9_-]*$ ]] ||
    die "project name '$project': lowercase letters, digits, - and _, the first a letter or a digit"
offset=${COMPOSE_SMOKE_PORT_OFFSET:-10000}
if ! [[ $offset =~ ^[1-9][0-9]{0,4}$ ]] || [ "$offset" -gt 56000 ]; then
    die "COMPOSE_SMOKE_PORT_OFFSET=$offset: a number from 1 to 56000"
fi
export LAVA_CONTROL_PORT=$((8080 + offset)) LAVA_INFERENCE_PORT=$((8081 + offset))
export LAVA_ALLOCATOR_PORT=$((8082 + offset)) LAVA_ALLOCATOR_2_PORT=$((8083 + offset))
export LAVA_PROMETHEUS_PORT=$((9090 + offset)) LAVA_GRAFANA_PORT=$((3000 + offset))
control=127.0.0.1:$LAVA_CONTROL_PORT
inference=127.0.0.1:$LAVA_INFERENCE_PORT
allocators=("127.0.0.1:$LAVA_ALLOCATOR_PORT")
[ "$AGENTS" -eq 1 ] && allocators+=("127.0.0.1:$LAVA_ALLOCATOR_2_PORT")
allocator=${allocators[0]}

compose=(docker compose -p "$project" -f docker-compose.yml)
[ "$AGENTS" -eq 1 ] && compose+=(-f docker-compose.agents.yml)
say "project $project (the stack's own, $stack, is left alone); control service on $control"
label="label=com.docker.compose.project=$project"
[ -z "$(docker ps -aq --filter "$label")" ] ||
    die "project $project has containers already (cd $src && ${compose[*]} down -v)"
[ -z "$(docker volume ls -q --filter "$label")" ] ||
    die "project $project has volumes left (cd $src && ${compose[*]} down -v)"

# --- a copy of the committed tree ------------------------------------------------------------
rm -rf "$src"
mkdir -p "$src"
git archive HEAD | tar -x -C "$src"
say "running on $(git rev-parse --short HEAD) (a copy in $src)"
cd "$src"

finish() {
    local rc=$?
    if [ "$rc" -ne 0 ]; then
        "${compose[@]}" ps -a || true
        "${compose[@]}" logs --no-color --tail 20 || true
    fi
    if [ "${KEEP:-0}" = 1 ]; then
        say "KEEP=1: the stack is left as it is (cd $src && ${compose[*]} down -v)"
    else
        "${compose[@]}" down -v >/dev/null 2>&1 || true
    fi
}
trap finish EXIT

# --- 1. up ------------------------------------------------------------------------------------
t0=$(date +%s)
"${compose[@]}" up -d --build 2>&1 | tail -n 20
# Every service with a health check (not the one-shot service-token, which exits 0 once done).
services=$("${compose[@]}" config --format json | python3 -c '
import json, sys
print(sum(1 for s in json.load(sys.stdin)["services"].values() if "healthcheck" in s))')
for _ in $(seq 1 120); do
    healthy=$("${compose[@]}" ps --format '{{.Health}}' | grep -c '^healthy$' || true)
    [ "$healthy" -eq "$services" ] && break
    sleep 1
done
"${compose[@]}" ps --format 'table {{.Service}}\t{{.Status}}\t{{.Ports}}'
[ "$healthy" -eq "$services" ] || die "$healthy of $services services healthy after 120 s"
say "all $services services healthy $(( $(date +%s) - t0 )) s after up (build included)"

# --- the service credential -----------------------------------------------------------------------
# The allocators' and the inference server's data routes require the token that the one-shot
# service-token service generated into its volume (docs/operations.md, "Service credentials"); the
# control service presents it. Direct calls below present it too.
token=$("${compose[@]}" run --rm --no-deps -T --entrypoint cat service-token /run/lava-secrets/service-token)
[ "${#token}" -ge 32 ] || die "the generated service token is ${#token} characters long"
auth=(-H "authorization: Bearer $token")
# The HTTP status, 000 when nothing answers.
status() { curl -s -o /dev/null -w '%{http_code}' "$@" || true; }
vm_body='{"vm": {"vm_id": "cred-vm-1", "tenant_id": "t-cred", "vm_type": "D2", "demand": {"cores": 2, "memory_gib": 8}}}'
predict_body='{"instances": [{"tenant_id": "t-cred", "vm_type": "D2", "cores": 2, "memory_gib": 8}]}'
for agent in "${allocators[@]}"; do
    s=$(status -XPOST "$agent/v1/allocations" -H 'content-type: application/json' -d "$vm_body")
    [ "$s" = 401 ] || die "POST $agent/v1/allocations without the token answered $s, not 401"
    s=$(status -XPOST "$agent/v1/allocations" -H 'content-type: application/json' \
        -H 'authorization: Bearer wrong' -d "$vm_body")
    [ "$s" = 401 ] || die "POST $agent/v1/allocations with a wrong token answered $s, not 401"
done
s=$(status -XPOST "$inference/v1/predict" -H 'content-type: application/json' -d "$predict_body")
[ "$s" = 401 ] || die "POST $inference/v1/predict without the token answered $s, not 401"
s=$(status -XPOST "$inference/v1/predict" -H 'content-type: application/json' "${auth[@]}" -d "$predict_body")
[ "$s" = 200 ] || die "POST $inference/v1/predict with the token answered $s, not 200"
s=$(status -XPOST "$allocator/v1/allocations" -H 'content-type: application/json' "${auth[@]}" -d "$vm_body")
[ "$s" = 201 ] || die "POST $allocator/v1/allocations with the token answered $s, not 201"
s=$(status -XDELETE "$allocator/v1/allocations/cred-vm-1" "${auth[@]}")
[ "$s" = 204 ] || die "DELETE $allocator/v1/allocations/cred-vm-1 with the token answered $s, not 204"
say "credentials: the data routes answer 401 without the token (or with a wrong one), 200/201/204 with it"

# --- 2. allocations ---------------------------------------------------------------------------
allocate() {
    curl -s -XPOST "$control/allocate" -H 'content-type: application/json' \
        -d "{\"vm\": {\"vm_id\": \"$1\", \"tenant_id\": \"t-$1\", \"vm_type\": \"D2\", \"demand\": {\"cores\": 2, \"memory_gib\": 8}}}"
}
for i in 1 2 3; do
    allocate "smoke-vm-$i" | python3 -c '
import json, sys
r = json.load(sys.stdin)
assert r.get("status") == "placed", r
p = r["placements"][0]
print("placed", p["vm_id"], "on", p["host_id"], "model", p["prediction"]["model_version"])' ||
        die "POST /allocate did not place smoke-vm-$i"
done

# --- 3. the canary ----------------------------------------------------------------------------
# A bundle trained on the host from another seed than the default bundle (after the stack's checks:
# the stand-in `docker` of e2e/tests/it/compose_smoke.rs never gets this far).
if [ ! -x "$root/target/release/lifetime-train" ] || [ ! -x "$root/target/release/vmtrace" ]; then
    say "building vmtrace and lifetime-train"
    (cd "$root" && cargo build --release -p traces -p lifetime-train --bins)
fi
canary="canary-smoke"
say "training the canary bundle $canary (seed 43)"
"$root/target/release/vmtrace" generate --out "$work/seed43.csv.gz" --days 14 --seed 43 >/dev/null
rm -rf "${work:?}/$canary"
"$root/target/release/lifetime-train" --train "$work/seed43.csv.gz" --out "$work/$canary" --name "$canary" \
    --version "$canary-1" --iterations 50 --num-leaves 31 --max-remaining-vms 30000 >"$work/train.log" 2>&1 ||
    die "training the canary failed: $work/train.log"
[ ! -e models/rollout.toml ] || die "the committed models/ has a rollout.toml; this script writes its own"
cp -r "$work/$canary" "models/.$canary.tmp"
mv "models/.$canary.tmp" "models/$canary"
printf 'stable = "default"\n\n[canary]\nbundle = "%s"\nshare = 0.5\n' "$canary" >models/.rollout.toml.tmp
mv models/.rollout.toml.tmp models/rollout.toml
state=
for _ in $(seq 1 30); do
    state=$(curl -s "${auth[@]}" "$inference/v1/models" | python3 -c "
import json, sys
print(next((b['state'] for b in json.load(sys.stdin) if b['bundle'] == '$canary'), 'absent'))")
    [ "$state" = canary ] && break
    sleep 1
done
[ "$state" = canary ] || die "the inference server lists $canary as '$state', not canary, after 30 s"
curl -s "${auth[@]}" "$inference/v1/models"
echo
"${compose[@]}" logs --no-color inference-server | grep -E "bundle=$canary|canary=Some" ||
    die "no log line about the canary"

say "replaying day 10 of the synthetic trace through the control service (about a minute)"
"${compose[@]}" run --rm --no-deps -T control-service vmreplay --synthetic-days 14 --seed 42 \
    --from-s 864000 --duration-s 86400 --speed 1440 --concurrency 8 --control http://control-service:8080 \
    | tee "$work/replay.txt" | sed -n '/^requests/,/^predictions/p'
grep -qE '^ +errors +0$' "$work/replay.txt" || die "the replay had errors: $work/replay.txt"
grep -qE '^ +rejected +0$' "$work/replay.txt" || die "the replay had rejections: $work/replay.txt"
served=$(curl -s "$inference/metrics" | sed -n "s/^inference_predictions_total{model_version=\"$canary-1\"} //p")
[ "${served:-0}" -gt 0 ] || die "the canary served no prediction"
say "the canary served $served predictions"

# --- the operator's console, served by the control service in its container -------------------
curl -sf -o /dev/null -w '%{content_type}\n' "$control/dashboard" | grep -q '^text/html' ||
    die "GET /dashboard is not the console's page"
curl -s "$control/v1/zones" | python3 -c '
import json, sys
zones = json.load(sys.stdin)["zones"]
assert [z["zone"] for z in zones] == ["zone-1"] and all(a["ready"] for a in zones[0]["agents"]), zones
print("console zones:", ", ".join("%s (%d agents ready)" % (z["zone"], len(z["agents"])) for z in zones))' ||
    die "GET /v1/zones does not show zone-1 ready"
shown=$(curl -s "$control/v1/zones/zone-1/hosts?limit=10000" | python3 -c 'import json,sys; print(json.load(sys.stdin)["total"])')
own=$(curl -s "${auth[@]}" "$allocator/v1/hosts?limit=10000" | python3 -c 'import json,sys; print(json.load(sys.stdin)["total"])')
[ "$shown" = "$own" ] || die "the console shows $shown hosts, the allocator has $own"
samples=$(curl -s "$control/v1/stats/history" | python3 -c 'import json,sys; print(len(json.load(sys.stdin)["samples"]))')
[ "$samples" -gt 0 ] || die "the console's timeline has no sample"
say "the console: /dashboard served, $shown hosts as the allocator has them, $samples timeline samples"
if command -v chromium >/dev/null; then
    timeout 60 chromium --headless --no-sandbox --disable-gpu --disable-quic --no-first-run \
        --disable-background-networking --disable-component-update --disable-sync \
        --user-data-dir="$work/chromium" --window-size=1440,1000 --virtual-time-budget=5000 \
        --screenshot="$work/compose-dashboard.png" "http://$control/dashboard" >/dev/null 2>&1 &&
        say "the console's screenshot: $work/compose-dashboard.png"
fi

# --- 4. state across a restart, or two agents on one store ------------------------------------
vms() { curl -s "${auth[@]}" "$1/v1/stats" | python3 -c 'import json,sys; print(json.load(sys.stdin)["vms"])'; }
if [ "$AGENTS" -eq 0 ]; then
    "${compose[@]}" restart allocator
    for _ in $(seq 1 30); do curl -sf -o /dev/null "$allocator/readyz" && break; sleep 1; done
    [ "$(vms "$allocator")" -eq 3 ] || die "the allocator has $(vms "$allocator") VMs after a restart, not 3"
    "${compose[@]}" logs --no-color allocator | grep 'state recovered'
else
    a1=${allocators[0]} a2=${allocators[1]}
    [ "$(vms "$a1")" -eq "$(vms "$a2")" ] || die "the agents disagree: $(vms "$a1") against $(vms "$a2") VMs"
    say "both agents see $(vms "$a1") VMs"
    "${compose[@]}" kill -s SIGKILL allocator
    for i in 4 5 6; do
        allocate "smoke-vm-$i" | grep -q '"status":"placed"' || die "no placement with agent 1 killed"
    done
    say "3 more VMs placed with agent 1 killed; agent 2 sees $(vms "$a2")"
    "${compose[@]}" start allocator
fi

# --- 5. shutdown ------------------------------------------------------------------------------
t0=$(date +%s)
"${compose[@]}" stop
took=$(( $(date +%s) - t0 ))
"${compose[@]}" ps -a --format 'table {{.Service}}\t{{.Status}}'
bad=$("${compose[@]}" ps -a --format '{{.Service}} {{.Status}}' | grep -v 'Exited (0)' || true)
[ -z "$bad" ] || die "not every service exited 0: $bad"
[ "$took" -lt 10 ] || die "stop took $took s: some service waited out Docker's 10 s grace"
say "stopped in $took s, every service exited 0"
"${compose[@]}" down -v
trap - EXIT
say "OK"
