#!/usr/bin/env bash
# Runs the three-service stack natively on loopback, with the checked-in configs:
#
#   scripts/stack.sh up [--fresh] [--build] [--agents N [--patroni]]
#                                             start inference-server and allocator, wait for their
#                                             /readyz, then control-service and wait for its /readyz
#   scripts/stack.sh down                     SIGTERM each (control service first), SIGKILL after a
#                                             timeout; safe to repeat
#   scripts/stack.sh status                   pid, running or not, address and /readyz of each;
#                                             exit code 0 only when all three are ready
#   scripts/stack.sh node-up pg1|pg2          (--patroni) start a Patroni node that stopped or was
#                                             killed: it rejoins the cluster as its standby
#
# Options of `up`: --fresh (or STACK_FRESH=1) deletes the allocator's store first; --build runs
# cargo even when the binaries exist (by default they are built only when missing, because the
# README's main command has just built them); --agents N (N >= 2) runs the zone with N allocation
# agents on one PostgreSQL database instead of one allocator on its SQLite file: a PostgreSQL
# cluster of the stack's own in target/stack/postgres (port STACK_PG_PORT, default 5433; run as the
# `postgres` user when root), agent 1 on the config's address, agent i on its port + i - 1, and the
# control service spreading requests over them with failover (docs/allocator.md).
# --patroni (with --agents N): the agents' PostgreSQL is two Patroni nodes with a synchronous
# standby and automatic failover, and an etcd of the stack's own, all on loopback, run with the
# shipped configs/patroni/patroni.yml (docs/operations.md, "PostgreSQL with Patroni"): etcd on
# STACK_ETCD_PORT (default 2381), node pg1 on STACK_PG_PORT and pg2 on the next port, their REST
# APIs on STACK_PATRONI_PORT (default 8018) and the next; the agents name both nodes in one URL and
# find the primary by themselves. Data under target/stack/patroni/; passwords generated once there.
# Service credential: the allocator's and the inference server's data routes require a bearer token,
# which the control service presents. `up` generates a random one once into target/stack/service-token
# (mode 600; delete it to get a new one at the next `up`) and hands that file to all three services
# (*_SERVICE_TOKEN_FILE); a direct call needs it: curl -H "authorization: Bearer $(cat target/stack/service-token)".
# The allocator's admin routes (drains, consolidation, migrations' confirmations) take another one,
# generated the same way into target/stack/admin-token (ALLOCATOR_ADMIN_TOKEN_FILE).
# Environment: RUST_LOG (default info, into the log files), STACK_MODELS_DIR (the bundles the
# inference server serves and the allocators repredict with; default the configs' `models`),
# STACK_CONFIGS (the directory of the three <service>.toml; default configs), STACK_CLOCK (the
# allocators' clock: `wall`, or `request` for a trace replay at compressed time; default the
# config's), STACK_READY_TIMEOUT
# (seconds, default 60), STACK_STOP_TIMEOUT (seconds, default 10), CARGO_TARGET_DIR (where the
# binaries are).
#
# Everything the stack writes is under target/stack/: <service>.log (the previous run's log is kept
# as <service>.log.1), <service>.pid, service-token, admin-token, and the allocator's store allocator.db (+ -wal, -shm); with
# --agents, allocator-<i>.log/.pid for agents 2..N, postgres/ and postgres.log, and `agents`; with
# --patroni, patroni/ (etcd/, pg1/, pg2/, each with its log, the passwords, the agents' config) and
# etcd.pid, patroni-pg1.pid, patroni-pg2.pid.
# The addresses come from the `listen` line of configs/<service>.toml, so this script and the configs
# cannot disagree; docker-compose.yml runs the same topology in containers and
# e2e/tests/it/compose.rs keeps it consistent with the same configs (docs/operations.md).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

SERVICES=(inference-server allocator control-service)
STATE_DIR=target/stack
PG_DIR=$STATE_DIR/postgres
TOKEN_FILE=$STATE_DIR/service-token
ADMIN_TOKEN_FILE=$STATE_DIR/admin-token
PG_PORT="${STACK_PG_PORT:-5433}"
PATRONI_DIR=$STATE_DIR/patroni
# Not etcd's default 2379: a system etcd may hold it.
ETCD_PORT="${STACK_ETCD_PORT:-2381}"
PATRONI_PORT="${STACK_PATRONI_PORT:-8018}"
CONFIG_DIR="${STACK_CONFIGS:-configs}"
BIN_DIR="${CARGO_TARGET_DIR:-target}/release"
READY_TIMEOUT="${STACK_READY_TIMEOUT:-60}"
STOP_TIMEOUT="${STACK_STOP_TIMEOUT:-10}"
export RUST_LOG="${RUST_LOG:-info}"

say() { echo "stack: $*"; }
warn() { echo "stack: WARNING: $*" >&2; }
die() { echo "stack: ERROR: $*" >&2; exit 1; }

usage() {
    sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "${BASH_SOURCE[0]}"
}

config_of() { echo "$CONFIG_DIR/${1%%-[0-9]*}.toml"; }
binary_of() { echo "${1%%-[0-9]*}"; }
pidfile_of() { echo "$STATE_DIR/$1.pid"; }
log_of() { echo "$STATE_DIR/$1.log"; }

# The top-level `listen = "host:port"` of a service's config (lines before the first [table] only,
# so a `listen` inside a table cannot be mistaken for it).
listen_of() {
    local config addr
    if [[ "$1" =~ ^allocator-([0-9]+)$ ]]; then
        addr=$(listen_of allocator)
        echo "${addr%:*}:$((${addr##*:} + BASH_REMATCH[1] - 1))"
        return
    fi
    config=$(config_of "$1")
    [ -f "$config" ] || die "$config is missing"
    addr=$(awk '/^[[:space:]]*\[/ { exit } /^[[:space:]]*listen[[:space:]]*=/ {
        sub(/^[^=]*=[[:space:]]*"/, ""); sub(/".*$/, ""); print; exit }' "$config")
    [ -n "$addr" ] || die "$config has no top-level listen = \"host:port\""
    echo "$addr"
}

# Whether process $1 exists and has not exited (a zombie has).
proc_running() {
    local stat
    [[ "$1" =~ ^[0-9]+$ ]] || return 1
    stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
    stat=${stat##*) }                        # the state follows "pid (comm) "
    [ "${stat%% *}" != Z ]
}

# Whether $1 is a running process of the binary $2: a pid file can outlive its process and the pid
# can be reused by something else, which must then not be signalled.
pid_alive() {
    local exe
    proc_running "$1" || return 1
    exe=$(tr '\0' '\n' 2>/dev/null <"/proc/$1/cmdline" | head -n 1) || return 1
    [ "$(basename -- "$exe")" = "$2" ]
}

# The pid of a running service, or nothing (a stale pid file is removed).
running_pid() {
    local svc=$1 pidfile pid
    pidfile=$(pidfile_of "$svc")
    [ -f "$pidfile" ] || return 0
    pid=$(<"$pidfile")
    if pid_alive "$pid" "$(binary_of "$svc")"; then
        echo "$pid"
    else
        rm -f "$pidfile"
    fi
}

# Whether something accepts TCP connections on host:port (bash's /dev/tcp: no extra tool needed).
port_in_use() {
    local host=${1%:*} port=${1##*:}
    [ "$host" != 0.0.0.0 ] || host=127.0.0.1
    (exec 3<>"/dev/tcp/$host/$port") 2>/dev/null
}

# GET /readyz: prints "<http code> <body on one line>"; code 000 when nothing answers.
readyz() {
    local out
    out=$(curl -sS --max-time 2 -w '\n%{http_code}' "http://$1/readyz" 2>&1) || true
    printf '%s %s\n' "${out##*$'\n'}" "$(printf '%s' "${out%$'\n'*}" | tr '\n' ' ' | cut -c1-200)"
}

show_log_tail() {
    local log
    log=$(log_of "$1")
    echo "---- last 30 lines of $log ----" >&2
    if [ -s "$log" ]; then tail -n 30 "$log" >&2; else echo "(empty)" >&2; fi
    echo "----" >&2
}

# The stack's service and admin tokens: each generated once (32 random bytes, hex), kept across
# `up`s so that a client holding it keeps working; only the owner may read it.
ensure_token() {
    local file=$1 what=$2
    [ -s "$file" ] && return 0
    (umask 077 && od -An -tx1 -N32 /dev/urandom | tr -d ' \n' >"$file.tmp") || die "could not write $file"
    mv -f "$file.tmp" "$file"
    say "generated the stack's $what: $file"
}

start_one() {
    local svc=$1 log args
    log=$(log_of "$svc")
    args=(--config "$(config_of "$svc")")
    case "$svc" in
        inference-server | allocator | allocator-*)
            [ -z "${STACK_MODELS_DIR:-}" ] || args+=(--models-dir "$STACK_MODELS_DIR")
            ;;
    esac
    # The allocator's store lives with the rest of the stack's state, not in the working directory
    # (the config's relative "allocator.db"); agents share the stack's PostgreSQL database.
    case "$svc" in
        allocator | allocator-*)
            if [ "$PATRONI" -eq 1 ]; then
                # The store URL carries the password: in a config file only the owner reads, not on
                # the command line, which every local user can see.
                args[1]=$PATRONI_DIR/allocator.toml
                args+=(--listen "$(listen_of "$svc")")
            elif [ "$AGENTS" -gt 1 ]; then
                args+=(--store "$(pg_url)" --listen "$(listen_of "$svc")")
            else
                args+=(--store "$STATE_DIR/allocator.db")
            fi
            [ -z "${STACK_CLOCK:-}" ] || args+=(--clock "$STACK_CLOCK")
            ;;
        control-service)
            if [ "$AGENTS" -gt 1 ]; then
                local urls=() i
                for ((i = 1; i <= AGENTS; i++)); do urls+=("http://$(listen_of "$(agent_name "$i")")"); done
                args+=(--zone "zone-1=$(IFS=,; echo "${urls[*]}")")
            fi
            ;;
    esac
    [ ! -f "$log" ] || mv -f "$log" "$log.1"
    # nohup: the services outlive the terminal that ran `up`. NO_COLOR: the logs are files, and
    # tracing's ANSI colour codes would only clutter them.
    # The service token, by file for all three (each reads its own variables); a token or a
    # rotation's previous token in the caller's environment would override the file, so they go.
    NO_COLOR=1 \
        ALLOCATOR_SERVICE_TOKEN_FILE="$TOKEN_FILE" INFERENCE_SERVICE_TOKEN_FILE="$TOKEN_FILE" \
        ALLOCATOR_ADMIN_TOKEN_FILE="$ADMIN_TOKEN_FILE" \
        CONTROL_ALLOCATOR_SERVICE_TOKEN_FILE="$TOKEN_FILE" CONTROL_INFERENCE_SERVICE_TOKEN_FILE="$TOKEN_FILE" \
        nohup env -u ALLOCATOR_SERVICE_TOKEN -u INFERENCE_SERVICE_TOKEN -u CONTROL_ALLOCATOR_SERVICE_TOKEN -u ALLOCATOR_ADMIN_TOKEN \
        -u CONTROL_INFERENCE_SERVICE_TOKEN -u ALLOCATOR_PREVIOUS_SERVICE_TOKEN -u INFERENCE_PREVIOUS_SERVICE_TOKEN \
        "$BIN_DIR/$(binary_of "$svc")" "${args[@]}" </dev/null >"$log" 2>&1 &
    echo $! >"$(pidfile_of "$svc")"
    STARTED+=("$svc")
    say "$svc started (pid $!, $(listen_of "$svc"), log $log)"
}

wait_ready() {
    local svc=$1 pid addr deadline answer code
    pid=$(<"$(pidfile_of "$svc")")
    addr=$(listen_of "$svc")
    deadline=$((SECONDS + READY_TIMEOUT))
    while :; do
        # Our own child: whether it still runs is enough (and `wait` below must not block).
        if ! proc_running "$pid"; then
            code=0
            wait "$pid" 2>/dev/null || code=$?
            echo "stack: ERROR: $svc exited (status $code) before it was ready" >&2
            show_log_tail "$svc"
            exit 1
        fi
        answer=$(readyz "$addr")
        if [ "${answer%% *}" = 200 ]; then
            say "$svc ready on $addr"
            return 0
        fi
        if [ "$SECONDS" -ge "$deadline" ]; then
            echo "stack: ERROR: $svc not ready after ${READY_TIMEOUT} s: GET http://$addr/readyz answered ${answer}" >&2
            show_log_tail "$svc"
            exit 1
        fi
        sleep 0.2
    done
}

# SIGTERM (graceful: requests in flight finish), then SIGKILL after STOP_TIMEOUT seconds.
stop_one() {
    local svc=$1 pid pidfile i
    pidfile=$(pidfile_of "$svc")
    if [ ! -f "$pidfile" ]; then
        say "$svc not running"
        return 0
    fi
    pid=$(running_pid "$svc")
    if [ -z "$pid" ]; then
        say "$svc not running (stale pid file removed)"
        return 0
    fi
    kill -TERM "$pid" 2>/dev/null || true
    for ((i = 0; i < STOP_TIMEOUT * 10; i++)); do
        pid_alive "$pid" "$(binary_of "$svc")" || break
        sleep 0.1
    done
    if pid_alive "$pid" "$(binary_of "$svc")"; then
        warn "$svc (pid $pid) still running ${STOP_TIMEOUT} s after SIGTERM; sending SIGKILL"
        kill -KILL "$pid" 2>/dev/null || true
        while pid_alive "$pid" "$(binary_of "$svc")"; do sleep 0.1; done
    fi
    # Reap it if `up` started it in this very shell (rollback), so no zombie is left behind.
    proc_running "$pid" || wait "$pid" 2>/dev/null || true
    rm -f "$pidfile"
    say "$svc stopped (pid $pid)"
}

# Undo a failed or interrupted `up`, so that no half-started stack blocks the next one.
rollback() {
    local i
    [ "$UP_DONE" -eq 0 ] || return 0
    [ "${#STARTED[@]}" -gt 0 ] || return 0
    echo "stack: stopping what this run started" >&2
    for ((i = ${#STARTED[@]} - 1; i >= 0; i--)); do stop_one "${STARTED[i]}" >&2; done
    [ "${PG_STARTED:-0}" -eq 0 ] || pg_down >&2
    [ "${PATRONI_STARTED:-0}" -eq 0 ] || patroni_down >&2
}

# How many agents the running (or last) stack has.
recorded_agents() { local n; n=$(cat "$STATE_DIR/agents" 2>/dev/null || echo 1); [[ "$n" =~ ^[0-9]+$ ]] && echo "$n" || echo 1; }

# Whether the running (or last) stack runs its PostgreSQL under Patroni.
recorded_patroni() { [ "$(cat "$STATE_DIR/patroni-mode" 2>/dev/null || echo 0)" = 1 ] && echo 1 || echo 0; }

# Agent i's service name: `allocator` for the first, `allocator-<i>` for the others.
agent_name() { if [ "$1" -eq 1 ]; then echo allocator; else echo "allocator-$1"; fi; }

# The stack's services in start order (agents after the inference server).
stack_services() {
    local i
    echo inference-server
    for ((i = 1; i <= AGENTS; i++)); do agent_name "$i"; done
    echo control-service
}

pg_url() { echo "postgres://alloc@127.0.0.1:$PG_PORT/allocator"; }

pg_bin() {
    local dir
    dir=$(compgen -G '/usr/lib/postgresql/*/bin' | sort -V | tail -n 1)
    [ -n "$dir" ] && [ -x "$dir/pg_ctl" ] || die "PostgreSQL is not installed (pg_ctl not under /usr/lib/postgresql/*/bin): run scripts/setup.sh"
    echo "$dir"
}

# PostgreSQL refuses to run as root: as root, its commands run as the `postgres` user.
as_pg() { if [ "$(id -u)" -eq 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi; }

pg_running() { [ -f "$PG_DIR/postmaster.pid" ] && as_pg "$(pg_bin)/pg_ctl" -D "$PG_DIR" status >/dev/null 2>&1; }

pg_up() {
    local bin
    bin=$(pg_bin)
    if [ "$FRESH" -eq 1 ] && [ -d "$PG_DIR" ]; then
        pg_running && as_pg "$bin/pg_ctl" -D "$PG_DIR" -m fast -w stop >/dev/null
        rm -rf "$PG_DIR"
        say "fresh start: deleted $PG_DIR"
    fi
    if [ ! -d "$PG_DIR" ]; then
        mkdir -p "$PG_DIR"
        [ "$(id -u)" -ne 0 ] || chown postgres:postgres "$PG_DIR"
        as_pg "$bin/initdb" -D "$PG_DIR" -A trust -U alloc -E UTF8 >"$STATE_DIR/postgres-init.log" 2>&1 ||
            die "initdb failed (see $STATE_DIR/postgres-init.log)"
    fi
    if ! pg_running; then
        ! port_in_use "127.0.0.1:$PG_PORT" ||
            die "port $PG_PORT (PostgreSQL, STACK_PG_PORT) is already in use by another process"
        touch "$STATE_DIR/postgres.log"
        [ "$(id -u)" -ne 0 ] || chown postgres:postgres "$STATE_DIR/postgres.log"
        as_pg "$bin/pg_ctl" -D "$PG_DIR" -l "$STATE_DIR/postgres.log" -w -t "$READY_TIMEOUT" \
            -o "-p $PG_PORT -k $(realpath "$PG_DIR") -c listen_addresses=127.0.0.1" start >/dev/null ||
            die "PostgreSQL did not start (see $STATE_DIR/postgres.log)"
        PG_STARTED=1
    fi
    "$bin/psql" -h 127.0.0.1 -p "$PG_PORT" -U alloc -d postgres -tAc "SELECT 1 FROM pg_database WHERE datname = 'allocator'" |
        grep -q 1 || "$bin/psql" -h 127.0.0.1 -p "$PG_PORT" -U alloc -d postgres -qc "CREATE DATABASE allocator" ||
        die "cannot create the database allocator"
    say "PostgreSQL ready on 127.0.0.1:$PG_PORT ($(pg_url), data in $PG_DIR)"
}

pg_down() {
    [ -d "$PG_DIR" ] || return 0
    if pg_running; then
        as_pg "$(pg_bin)/pg_ctl" -D "$PG_DIR" -m fast -w stop >/dev/null && say "PostgreSQL stopped"
    fi
}

# --- Patroni (--patroni) -------------------------------------------------------------------------
# Node i (1 or 2): PostgreSQL on PG_PORT + i - 1, Patroni's REST API on PATRONI_PORT + i - 1.
node_pg_port() { echo $((PG_PORT + $1 - 1)); }
node_api_port() { echo $((PATRONI_PORT + $1 - 1)); }

# The prefix that runs a program as the `postgres` user when root (PostgreSQL refuses root; etcd and
# Patroni run as it too). setpriv execs, so the pid nohup leaves in $! is the program's.
as_pg_prefix() { if [ "$(id -u)" -eq 0 ]; then AS_PG=(setpriv --reuid=postgres --regid=postgres --init-groups --); else AS_PG=(); fi; }

# Whether the process of pid file $1 runs and its command line holds $2 (Patroni's is python3's).
pidfile_runs() {
    local pid
    [ -f "$1" ] || return 1
    pid=$(<"$1")
    proc_running "$pid" && tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q -- "$2"
}

patroni_url() {
    echo "postgres://allocator:$(<"$PATRONI_DIR/allocator-password")@127.0.0.1:$(node_pg_port 1),127.0.0.1:$(node_pg_port 2)/allocator?target_session_attrs=read-write&connect_timeout=1&tcp_user_timeout=5"
}

# GET on node i's REST API: the body, or nothing.
patroni_get() { curl -sS --max-time 2 "http://127.0.0.1:$(node_api_port "$1")$2" 2>/dev/null || true; }

# The node whose Patroni says it runs the primary (1 or 2), or nothing.
patroni_leader() {
    local i
    for i in 1 2; do
        patroni_get "$i" /patroni | grep -Eq '"role": "(master|primary)"' && { echo "$i"; return; }
    done
}

wait_for() {
    local what=$1 deadline=$((SECONDS + $2))
    shift 2
    until "$@"; do
        [ "$SECONDS" -lt "$deadline" ] || die "$what: not after $((SECONDS - deadline + $2)) s (logs in $PATRONI_DIR)"
        sleep 0.5
    done
}

start_patroni_node() {
    local i=$1 dir=$PATRONI_DIR/pg$1
    pidfile_runs "$STATE_DIR/patroni-pg$i.pid" patroni && return 0
    ! port_in_use "127.0.0.1:$(node_pg_port "$i")" ||
        die "port $(node_pg_port "$i") (PostgreSQL node pg$i, STACK_PG_PORT) is already in use by another process"
    [ ! -f "$dir/patroni.log" ] || mv -f "$dir/patroni.log" "$dir/patroni.log.1"
    as_pg_prefix
    (
        config=$PWD/configs/patroni/patroni.yml
        cd "$dir"
        HOME=$PWD PATRONI_NAME=pg$i \
            PATRONI_RESTAPI_LISTEN=127.0.0.1:$(node_api_port "$i") PATRONI_RESTAPI_CONNECT_ADDRESS=127.0.0.1:$(node_api_port "$i") \
            PATRONI_POSTGRESQL_LISTEN=127.0.0.1:$(node_pg_port "$i") PATRONI_POSTGRESQL_CONNECT_ADDRESS=127.0.0.1:$(node_pg_port "$i") \
            PATRONI_POSTGRESQL_DATA_DIR=$PWD/data PATRONI_POSTGRESQL_BIN_DIR=$(pg_bin) \
            PATRONI_POSTGRESQL_PGPASS=$PWD/pgpass PATRONI_ETCD3_HOSTS=127.0.0.1:$ETCD_PORT \
            PATRONI_SUPERUSER_PASSWORD=$(<../superuser-password) PATRONI_REPLICATION_PASSWORD=$(<../replication-password) \
            nohup "${AS_PG[@]}" patroni "$config" </dev/null >patroni.log 2>&1 &
        echo $! >"../../patroni-pg$i.pid"
    )
    PATRONI_STARTED=1
    say "Patroni node pg$i started (pid $(<"$STATE_DIR/patroni-pg$i.pid"), PostgreSQL 127.0.0.1:$(node_pg_port "$i"), REST API 127.0.0.1:$(node_api_port "$i"), log $PATRONI_DIR/pg$i/patroni.log)"
}

patroni_up() {
    local i leader bin
    command -v patroni >/dev/null && command -v etcd >/dev/null ||
        die "Patroni or etcd is not installed: run scripts/setup.sh (Debian's patroni and etcd-server)"
    bin=$(pg_bin)
    if [ "$FRESH" -eq 1 ] && [ -d "$PATRONI_DIR" ]; then
        patroni_down
        rm -rf "$PATRONI_DIR"
        say "fresh start: deleted $PATRONI_DIR"
    fi
    mkdir -p "$PATRONI_DIR/etcd" "$PATRONI_DIR/pg1" "$PATRONI_DIR/pg2"
    ensure_token "$PATRONI_DIR/superuser-password" "PostgreSQL superuser password"
    ensure_token "$PATRONI_DIR/replication-password" "PostgreSQL replication password"
    ensure_token "$PATRONI_DIR/allocator-password" "PostgreSQL password of the agents' role"
    # The nodes run as `postgres`, which reads the passwords through Patroni's environment only.
    [ "$(id -u)" -ne 0 ] || chown -R postgres:postgres "$PATRONI_DIR/etcd" "$PATRONI_DIR/pg1" "$PATRONI_DIR/pg2"
    if ! pidfile_runs "$STATE_DIR/etcd.pid" etcd; then
        ! port_in_use "127.0.0.1:$ETCD_PORT" || die "port $ETCD_PORT (etcd, STACK_ETCD_PORT) is already in use by another process"
        as_pg_prefix
        nohup "${AS_PG[@]}" etcd --name stack --data-dir "$PATRONI_DIR/etcd/data" \
            --listen-client-urls "http://127.0.0.1:$ETCD_PORT" --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
            --listen-peer-urls "http://127.0.0.1:$((ETCD_PORT + 1))" \
            --initial-advertise-peer-urls "http://127.0.0.1:$((ETCD_PORT + 1))" \
            --initial-cluster "stack=http://127.0.0.1:$((ETCD_PORT + 1))" </dev/null >"$PATRONI_DIR/etcd/etcd.log" 2>&1 &
        echo $! >"$STATE_DIR/etcd.pid"
        PATRONI_STARTED=1
        say "etcd started (pid $!, 127.0.0.1:$ETCD_PORT, log $PATRONI_DIR/etcd/etcd.log)"
    fi
    wait_for "etcd healthy" "$READY_TIMEOUT" eval 'curl -sf --max-time 2 "http://127.0.0.1:$ETCD_PORT/health" | grep -q true'
    # pg1 first: with an empty directory it bootstraps the cluster; pg2 then copies it.
    start_patroni_node 1
    wait_for "a Patroni leader" "$READY_TIMEOUT" eval '[ -n "$(patroni_leader)" ]'
    start_patroni_node 2
    leader=$(patroni_leader)
    export PGPASSWORD
    PGPASSWORD=$(<"$PATRONI_DIR/superuser-password")
    "$bin/psql" -h 127.0.0.1 -p "$(node_pg_port "$leader")" -U postgres -d postgres -tAc \
        "SELECT 1 FROM pg_roles WHERE rolname = 'allocator'" | grep -q 1 ||
        "$bin/psql" -h 127.0.0.1 -p "$(node_pg_port "$leader")" -U postgres -d postgres -qc \
            "CREATE ROLE allocator LOGIN PASSWORD '$(<"$PATRONI_DIR/allocator-password")'" ||
        die "cannot create the role allocator"
    "$bin/psql" -h 127.0.0.1 -p "$(node_pg_port "$leader")" -U postgres -d postgres -tAc \
        "SELECT 1 FROM pg_database WHERE datname = 'allocator'" | grep -q 1 ||
        "$bin/psql" -h 127.0.0.1 -p "$(node_pg_port "$leader")" -U postgres -d postgres -qc \
            "CREATE DATABASE allocator OWNER allocator" || die "cannot create the database allocator"
    unset PGPASSWORD
    # Agents start once the standby is synchronous: before that, no commit would be durable twice.
    wait_for "a synchronous standby" $((READY_TIMEOUT * 2)) eval 'patroni_get "$leader" /cluster | grep -q sync_standby'
    # The agents' config: the checked-in one with the store URL (and its password), owner-only.
    (
        umask 077
        { printf 'store = "%s"\n' "$(patroni_url)"; grep -v '^store[[:space:]]*=' "$(config_of allocator)"; } \
            >"$PATRONI_DIR/allocator.toml"
    )
    say "Patroni ready: leader pg$leader, synchronous standby pg$((3 - leader)); agents' store postgres://allocator:***@127.0.0.1:$(node_pg_port 1),127.0.0.1:$(node_pg_port 2)/allocator?target_session_attrs=read-write&..."
}

patroni_down() {
    local f pid i
    # Both nodes at once (SIGTERM: Patroni stops its PostgreSQL, fast), so that neither takes over
    # from the other on the way down; etcd last.
    for f in "$STATE_DIR/patroni-pg1.pid" "$STATE_DIR/patroni-pg2.pid"; do
        pidfile_runs "$f" patroni && kill -TERM "$(<"$f")" 2>/dev/null
    done
    for ((i = 0; i < STOP_TIMEOUT * 30; i++)); do
        pidfile_runs "$STATE_DIR/patroni-pg1.pid" patroni || pidfile_runs "$STATE_DIR/patroni-pg2.pid" patroni || break
        sleep 0.1
    done
    for f in "$STATE_DIR/patroni-pg1.pid" "$STATE_DIR/patroni-pg2.pid" "$STATE_DIR/etcd.pid"; do
        case "$f" in *etcd.pid) pidfile_runs "$f" etcd && kill -TERM "$(<"$f")" 2>/dev/null && sleep 1 ;; esac
        if pidfile_runs "$f" patroni || pidfile_runs "$f" etcd; then
            pid=$(<"$f")
            warn "$(basename "$f" .pid) (pid $pid) still running; sending SIGKILL"
            kill -KILL "$pid" 2>/dev/null || true
        fi
        [ ! -f "$f" ] || { rm -f "$f"; say "$(basename "$f" .pid) stopped"; }
    done
}

patroni_status() {
    local i role
    printf '%-17s %-8s %-8s %-16s %s\n' etcd "$(cat "$STATE_DIR/etcd.pid" 2>/dev/null || echo -)" \
        "$(pidfile_runs "$STATE_DIR/etcd.pid" etcd && echo running || echo stopped)" "127.0.0.1:$ETCD_PORT" \
        "$(curl -s --max-time 2 "http://127.0.0.1:$ETCD_PORT/health" 2>/dev/null || echo -)"
    for i in 1 2; do
        role=$(patroni_get "$i" /patroni | grep -Eo '"role": "[a-z_]+"' | cut -d'"' -f4)
        printf '%-17s %-8s %-8s %-16s %s\n' "patroni-pg$i" "$(cat "$STATE_DIR/patroni-pg$i.pid" 2>/dev/null || echo -)" \
            "$(pidfile_runs "$STATE_DIR/patroni-pg$i.pid" patroni && echo running || echo stopped)" \
            "127.0.0.1:$(node_pg_port "$i")" "${role:--}"
    done
}

cmd_up() {
    local svc pid addr running=() missing=() services
    mkdir -p "$STATE_DIR"
    mapfile -t services < <(AGENTS=$(recorded_agents) stack_services)
    for svc in "${services[@]}"; do
        pid=$(running_pid "$svc")
        [ -z "$pid" ] || running+=("$svc (pid $pid)")
    done
    [ "${#running[@]}" -eq 0 ] ||
        die "a stack is already running: ${running[*]}; stop it first with scripts/stack.sh down"
    mapfile -t services < <(stack_services)
    for svc in "${services[@]}"; do
        addr=$(listen_of "$svc")
        ! port_in_use "$addr" ||
            die "port ${addr##*:} ($svc, listen = \"$addr\" in $(config_of "$svc")) is already in use by another process (see: ss -ltnp 'sport = :${addr##*:}')"
    done

    for svc in "${SERVICES[@]}"; do [ -x "$BIN_DIR/$svc" ] || missing+=("$svc"); done
    if [ "$BUILD" -eq 1 ] || [ "${#missing[@]}" -gt 0 ]; then
        [ "${#missing[@]}" -eq 0 ] || say "building (missing from $BIN_DIR: ${missing[*]})"
        # -p replay: the trace replay client vmreplay, which drives the stack (README).
        cargo build --release --bins -p inference-server -p allocator -p control-service -p replay
    fi
    for svc in "${SERVICES[@]}"; do [ -x "$BIN_DIR/$svc" ] || die "$BIN_DIR/$svc is missing after the build"; done

    if [ "$FRESH" -eq 1 ]; then
        # The WAL and shared-memory files belong to the store: a leftover WAL would replay into a new one.
        rm -f "$STATE_DIR/allocator.db" "$STATE_DIR/allocator.db-wal" "$STATE_DIR/allocator.db-shm"
        say "fresh start: deleted $STATE_DIR/allocator.db"
    fi

    STARTED=()
    UP_DONE=0
    PG_STARTED=0
    trap rollback EXIT
    trap 'exit 130' INT
    trap 'exit 143' TERM
    echo "$AGENTS" >"$STATE_DIR/agents"
    echo "$PATRONI" >"$STATE_DIR/patroni-mode"
    ensure_token "$TOKEN_FILE" "service token"
    ensure_token "$ADMIN_TOKEN_FILE" "allocator admin token"
    if [ "$PATRONI" -eq 1 ]; then patroni_up; elif [ "$AGENTS" -gt 1 ]; then pg_up; fi
    # The control service's readiness depends on the others, so they go first.
    start_one inference-server
    for ((i = 1; i <= AGENTS; i++)); do
        start_one "$(agent_name "$i")"
        # One agent at a time on a new database: the first creates the schema.
        [ "$i" -gt 1 ] || [ "$AGENTS" -eq 1 ] || wait_ready allocator
    done
    wait_ready inference-server
    for ((i = 1; i <= AGENTS; i++)); do wait_ready "$(agent_name "$i")"; done
    start_one control-service
    wait_ready control-service
    UP_DONE=1
    trap - EXIT INT TERM
    say "stack up; logs and pids in $STATE_DIR/; stop it with scripts/stack.sh down"
    # The checked-in control config has no API keys: say so here too, not only in its log.
    if grep -q "OPEN MODE" "$STATE_DIR/control-service.log" 2>/dev/null; then
        warn "the control service is in OPEN MODE (no API keys; any caller may act for any tenant): for local use only; docs/control-service.md#authentication"
    fi
}

cmd_down() {
    local svc services i
    AGENTS=$(recorded_agents)
    mapfile -t services < <(stack_services)
    # The front door first, so no new request reaches the backends while they stop.
    for ((i = ${#services[@]} - 1; i >= 0; i--)); do stop_one "${services[i]}"; done
    pg_down
    [ "$(recorded_patroni)" -eq 0 ] || patroni_down
}

cmd_status() {
    local svc pid addr answer ready=0 state services
    AGENTS=$(recorded_agents)
    mapfile -t services < <(stack_services)
    printf '%-17s %-8s %-8s %-16s %s\n' SERVICE PID STATE ADDRESS READYZ
    for svc in "${services[@]}"; do
        addr=$(listen_of "$svc")
        pid=$(running_pid "$svc")
        if [ -z "$pid" ]; then
            printf '%-17s %-8s %-8s %-16s %s\n' "$svc" - stopped "$addr" -
            continue
        fi
        answer=$(readyz "$addr")
        state=running
        [ "${answer%% *}" != 200 ] || ready=$((ready + 1))
        printf '%-17s %-8s %-8s %-16s %s\n' "$svc" "$pid" "$state" "$addr" "$answer"
    done
    [ "$(recorded_patroni)" -eq 0 ] || patroni_status
    [ "$ready" -eq "${#services[@]}" ]
}

[ $# -ge 1 ] || { usage >&2; exit 2; }
COMMAND=$1
shift
FRESH="${STACK_FRESH:-0}"
[ "$FRESH" = 1 ] || FRESH=0
BUILD=0
AGENTS=1
PATRONI=0
while [ $# -gt 0 ]; do
    case "$1" in
        --fresh) [ "$COMMAND" = up ] || die "--fresh only applies to up"; FRESH=1 ;;
        --build) [ "$COMMAND" = up ] || die "--build only applies to up"; BUILD=1 ;;
        --agents)
            [ "$COMMAND" = up ] || die "--agents only applies to up"
            [[ "${2:-}" =~ ^[1-9][0-9]?$ ]] || die "--agents needs a number of agents from 1 to 99, e.g. --agents 2"
            AGENTS=$2
            shift
            ;;
        --patroni) [ "$COMMAND" = up ] || die "--patroni only applies to up"; PATRONI=1 ;;
        pg1 | pg2) [ "$COMMAND" = node-up ] || die "unknown option '$1' (see scripts/stack.sh --help)"; NODE=$1 ;;
        -h | --help) usage; exit 0 ;;
        *) die "unknown option '$1' (see scripts/stack.sh --help)" ;;
    esac
    shift
done
if [ "$COMMAND" = node-up ]; then
    [ "$(recorded_patroni)" -eq 1 ] || die "node-up: the stack does not run Patroni (scripts/stack.sh up --agents N --patroni)"
    [[ "${NODE:-}" =~ ^pg[12]$ ]] || die "node-up needs the node: pg1 or pg2"
    start_patroni_node "${NODE#pg}"
    exit 0
fi
[ "$PATRONI" -eq 0 ] || [ "$AGENTS" -gt 1 ] || die "--patroni needs --agents N (N >= 2): the agents share the Patroni cluster's database"
case "$COMMAND" in
    up) cmd_up ;;
    down) cmd_down ;;
    status) cmd_status ;;
    -h | --help | help) usage ;;
    *) echo "stack: ERROR: unknown command '$COMMAND'" >&2; usage >&2; exit 2 ;;
esac
