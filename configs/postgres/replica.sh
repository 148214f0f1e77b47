#!/bin/sh
# Entrypoint of the PostgreSQL services of docker-compose.standby.yml (a primary and a streaming
# standby with synchronous replication; docs/operations.md, "PostgreSQL with a standby: failover").
# Works in the postgres image and in scripts/offline-images.sh's stand-in: both have initdb,
# pg_basebackup and setpriv on PATH and PGDATA set.
#
# Only a first start (an empty data directory) depends on REPLICA_ROLE:
# - primary: a cluster whose superuser is POSTGRES_USER (password POSTGRES_PASSWORD) with the
#   database POSTGRES_DB, password logins from the network for clients and for replication, and
#   `synchronous_standby_names = '*'` set with ALTER SYSTEM (so the runbook can clear it; every
#   commit then waits until a standby has flushed it);
# - standby: a copy of REPLICA_PRIMARY (port REPLICA_PRIMARY_PORT, 5432) by `pg_basebackup -R`,
#   which writes standby.signal and primary_conninfo, retried until the primary answers.
# Later starts run what the directory holds: a promoted standby stays a primary.
set -eu
: "${POSTGRES_PASSWORD:?POSTGRES_PASSWORD must be set}"
user=${POSTGRES_USER:-postgres}
db=${POSTGRES_DB:-$user}
role=${REPLICA_ROLE:-primary}
if [ "$(id -u)" = 0 ]; then
    mkdir -p "$PGDATA" /var/run/postgresql
    chown -R postgres:postgres "$PGDATA" /var/run/postgresql
    chmod 700 "$PGDATA"
    # setpriv execs (runuser would stay as PID 1 and not pass SIGINT on to the server).
    exec setpriv --reuid=postgres --regid=postgres --init-groups -- /bin/sh "$0" "$@"
fi
if [ ! -s "$PGDATA/PG_VERSION" ]; then
    case "$role" in
    standby)
        : "${REPLICA_PRIMARY:?REPLICA_PRIMARY must name the primary}"
        export PGPASSWORD="$POSTGRES_PASSWORD"
        until pg_basebackup -h "$REPLICA_PRIMARY" -p "${REPLICA_PRIMARY_PORT:-5432}" -U "$user" \
            -D "$PGDATA" -R -X stream -c fast; do
            echo "replica.sh: $REPLICA_PRIMARY not ready for a base backup; retrying" >&2
            find "$PGDATA" -mindepth 1 -delete
            sleep 2
        done
        ;;
    primary)
        pwfile=$(mktemp)
        printf '%s\n' "$POSTGRES_PASSWORD" >"$pwfile"
        initdb -D "$PGDATA" -U "$user" --pwfile="$pwfile" --auth-local=trust --auth-host=scram-sha-256
        rm -f "$pwfile"
        printf 'host all all all scram-sha-256\nhost replication all all scram-sha-256\n' >>"$PGDATA/pg_hba.conf"
        pg_ctl -D "$PGDATA" -o "-c listen_addresses=''" -w start
        if [ "$db" != postgres ]; then
            createdb -U "$user" "$db"
        fi
        psql -U "$user" -d postgres -v ON_ERROR_STOP=1 -c "ALTER SYSTEM SET synchronous_standby_names = '*'"
        pg_ctl -D "$PGDATA" -m fast -w stop
        ;;
    *)
        echo "replica.sh: REPLICA_ROLE must be primary or standby, not $role" >&2
        exit 2
        ;;
    esac
fi
# A standby whose primary is gone retries streaming this often; with the default 5 s a promotion
# can wait that long (docs/operations.md).
exec postgres -D "$PGDATA" -c listen_addresses='*' -c wal_retrieve_retry_interval=200ms
