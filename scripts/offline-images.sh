#!/usr/bin/env bash
# ONLY FOR MACHINES WITHOUT AN IMAGE REGISTRY. Anywhere Docker can pull images, do not run this:
# `docker compose up -d --build` pulls the real `rust:1-bookworm` and `debian:bookworm-slim`.
#
# Builds local stand-ins for the two base images the Dockerfile names, from Debian's packages,
# tagged with those names, so that the unchanged Dockerfile and docker-compose.yml build on a
# machine whose Docker engine reaches no image registry (this project's own machines reach Debian's
# package mirror, crates.io and PyPI, but no registry of images; docs/operations.md, "The compose
# stack, run for real"):
#
#   debian:bookworm-slim  debootstrap --variant=minbase of Debian bookworm into a directory, with
#                         the mirror's bookworm, bookworm-updates and bookworm-security in its apt
#                         sources, imported with `docker import`. Like the real slim image it has
#                         apt, bash and useradd; unlike it, it keeps the man pages and docs (no
#                         dpkg path excludes), so it is larger. It also carries THIS MACHINE'S
#                         LOCALLY ADDED CA CERTIFICATES (/usr/local/share/ca-certificates/*.crt):
#                         where HTTPS to the package registries goes through a proxy whose CA only
#                         this machine trusts, pip and cargo inside the build need it too. They are
#                         taken up by update-ca-certificates whenever an image installs
#                         ca-certificates (both stand-ins and the Dockerfile's runtime stage do).
#   rust:1-bookworm       that image, plus the C toolchain and tools of the real image's base
#                         (gcc, g++, make, git, curl, pkg-config, python3), plus THIS MACHINE'S
#                         OWN RUST TOOLCHAIN, copied from $RUSTUP_HOME (the rustup toolchain that
#                         `rustc` runs here, without its HTML docs) and rustup itself: no toolchain
#                         can be downloaded here. The real image installs the latest stable Rust
#                         with rustup; this one is whatever this machine has. Same layout and
#                         environment as the real one: RUSTUP_HOME=/usr/local/rustup,
#                         CARGO_HOME=/usr/local/cargo, /usr/local/cargo/bin on PATH.
#   postgres:16-bookworm  for docker-compose.agents.yml only. NOT POSTGRESQL 16: Debian bookworm
#                         ships PostgreSQL 15, and that is what this image runs (the allocator's
#                         PostgreSQL store works on both; scripts/stack.sh --agents uses Debian's 15
#                         too). It imitates the part of the real image's interface that the compose
#                         file uses: POSTGRES_USER, POSTGRES_PASSWORD and POSTGRES_DB create the role
#                         (the cluster's superuser, password auth over the network) and the database
#                         on first start, the data lives in /var/lib/postgresql/data, pg_isready is
#                         on PATH, and SIGINT stops it (a fast shutdown, as the real image's
#                         STOPSIGNAL). None of the real entrypoint's other variables or init scripts.
#
# Usage (as root, or a user who may run debootstrap and docker):
#
#   scripts/offline-images.sh          # build all three, unless an image of that name already exists
#   scripts/offline-images.sh --force  # rebuild all three
#
# Environment: DOCKER (the client; default `docker`), DEBIAN_MIRROR (default
# http://deb.debian.org/debian), OFFLINE_IMAGES_DIR (work directory; default
# target/offline-images, which .dockerignore keeps out of build contexts). Needs debootstrap
# (`apt-get install debootstrap`). Takes about 3 minutes here.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

DOCKER=${DOCKER:-docker}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
WORK=${OFFLINE_IMAGES_DIR:-target/offline-images}
FORCE=0
case "${1:-}" in
    --force) FORCE=1 ;;
    "") ;;
    *) echo "usage: $0 [--force]" >&2; exit 2 ;;
esac
say() { echo "offline-images: $*"; }
die() { echo "offline-images: ERROR: $*" >&2; exit 1; }
have_image() { [ "$FORCE" -eq 0 ] && "$DOCKER" image inspect "$1" >/dev/null 2>&1; }

command -v debootstrap >/dev/null || die "debootstrap missing: apt-get install debootstrap"
"$DOCKER" info >/dev/null 2>&1 || die "'$DOCKER info' fails: is the Docker engine running?"
mkdir -p "$WORK"
WORK=$(cd "$WORK" && pwd)

# --- debian:bookworm-slim ------------------------------------------------------------------
if have_image debian:bookworm-slim; then
    say "debian:bookworm-slim present (--force rebuilds it)"
else
    rootfs=$WORK/bookworm-rootfs
    rm -rf "$rootfs"
    say "debootstrap --variant=minbase bookworm from $MIRROR"
    debootstrap --variant=minbase bookworm "$rootfs" "$MIRROR" >"$WORK/debootstrap.log" 2>&1 ||
        die "debootstrap failed; see $WORK/debootstrap.log"
    cat >"$rootfs/etc/apt/sources.list" <<EOF
deb $MIRROR bookworm main
deb $MIRROR bookworm-updates main
deb ${MIRROR%/debian}/debian-security bookworm-security main
EOF
    # As in the real image: apt keeps no downloaded packages, so layers that install some stay small.
    cat >"$rootfs/etc/apt/apt.conf.d/docker-clean" <<'EOF'
DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
APT::Update::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
Dir::Cache::pkgcache ""; Dir::Cache::srcpkgcache "";
EOF
    if compgen -G '/usr/local/share/ca-certificates/*.crt' >/dev/null; then
        say "adding this machine's local CA certificates: $(cd /usr/local/share/ca-certificates && echo *.crt)"
        mkdir -p "$rootfs/usr/local/share/ca-certificates"
        cp /usr/local/share/ca-certificates/*.crt "$rootfs/usr/local/share/ca-certificates/"
    fi
    rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/log/*.log
    say "docker import -> debian:bookworm-slim"
    tar -C "$rootfs" --numeric-owner -c . | "$DOCKER" import \
        --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        --change 'CMD ["bash"]' \
        --message "offline stand-in for debian:bookworm-slim (scripts/offline-images.sh)" \
        - debian:bookworm-slim >/dev/null
    rm -rf "$rootfs"
fi

# --- rust:1-bookworm -----------------------------------------------------------------------
if have_image rust:1-bookworm; then
    say "rust:1-bookworm present (--force rebuilds it)"
else
    command -v rustc >/dev/null || die "no rustc on this machine to copy into rust:1-bookworm"
    host_rustup=${RUSTUP_HOME:-$HOME/.rustup}
    toolchain=$(rustup show active-toolchain | awk '{print $1}')
    toolchain_dir=$(readlink -f "$host_rustup/toolchains/$toolchain")
    [ -x "$toolchain_dir/bin/cargo" ] || die "toolchain $toolchain not found at $toolchain_dir"
    ctx=$WORK/rust-context
    rm -rf "$ctx"
    mkdir -p "$ctx/rustup/toolchains" "$ctx/cargo/bin"
    say "copying this machine's Rust toolchain $toolchain ($(rustc --version)) without its docs"
    cp -a "$toolchain_dir" "$ctx/rustup/toolchains/$toolchain"
    rm -rf "$ctx/rustup/toolchains/$toolchain/share/doc"
    printf 'version = "12"\ndefault_toolchain = "%s"\nprofile = "minimal"\nauto_self_update = "disable"\n' \
        "$toolchain" >"$ctx/rustup/settings.toml"
    cp "$(command -v rustup)" "$ctx/cargo/bin/rustup"
    for proxy in cargo rustc rustdoc rustfmt cargo-fmt cargo-clippy clippy-driver rust-gdb rust-lldb; do
        ln -s rustup "$ctx/cargo/bin/$proxy"
    done
    cat >"$ctx/Dockerfile" <<'EOF'
FROM debian:bookworm-slim
# The real rust:1-bookworm is built on buildpack-deps:bookworm; these are the parts of it a Rust
# build with C dependencies uses.
RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
       ca-certificates curl git gcc g++ make libc6-dev pkg-config python3 procps xz-utils \
    && rm -rf /var/lib/apt/lists/*
ENV RUSTUP_HOME=/usr/local/rustup CARGO_HOME=/usr/local/cargo \
    PATH=/usr/local/cargo/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
COPY rustup /usr/local/rustup
COPY cargo /usr/local/cargo
RUN cargo --version && rustc --version && cargo fmt --version && cargo clippy --version
EOF
    say "docker build -> rust:1-bookworm"
    "$DOCKER" build -t rust:1-bookworm \
        --label "org.opencontainers.image.description=offline stand-in for rust:1-bookworm (scripts/offline-images.sh)" \
        "$ctx"
    rm -rf "$ctx"
fi

# --- postgres:16-bookworm (PostgreSQL 15, see the header) ----------------------------------
if have_image postgres:16-bookworm; then
    say "postgres:16-bookworm present (--force rebuilds it)"
else
    ctx=$WORK/postgres-context
    rm -rf "$ctx"
    mkdir -p "$ctx"
    cat >"$ctx/entrypoint.sh" <<'EOF'
#!/bin/sh
# Stand-in for the real postgres image's entrypoint (scripts/offline-images.sh): first start
# creates the cluster with POSTGRES_USER as its superuser (password POSTGRES_PASSWORD) and the
# database POSTGRES_DB (default: the user's name); every start runs the server in the foreground.
set -eu
: "${POSTGRES_PASSWORD:?POSTGRES_PASSWORD must be set}"
user=${POSTGRES_USER:-postgres}
db=${POSTGRES_DB:-$user}
if [ "$(id -u)" = 0 ]; then
    mkdir -p "$PGDATA" /var/run/postgresql
    chown -R postgres:postgres "$PGDATA" /var/run/postgresql
    chmod 700 "$PGDATA"
    # setpriv execs (runuser would stay as PID 1 and not pass SIGINT on to the server).
    exec setpriv --reuid=postgres --regid=postgres --init-groups -- "$0" "$@"
fi
if [ ! -s "$PGDATA/PG_VERSION" ]; then
    pwfile=$(mktemp)
    printf '%s\n' "$POSTGRES_PASSWORD" >"$pwfile"
    initdb -D "$PGDATA" -U "$user" --pwfile="$pwfile" --auth-local=trust --auth-host=scram-sha-256
    rm -f "$pwfile"
    echo "host all all all scram-sha-256" >>"$PGDATA/pg_hba.conf"
    if [ "$db" != postgres ]; then
        pg_ctl -D "$PGDATA" -o "-c listen_addresses=''" -w start
        createdb -U "$user" "$db"
        pg_ctl -D "$PGDATA" -m fast -w stop
    fi
fi
exec postgres -D "$PGDATA" -c listen_addresses='*'
EOF
    cat >"$ctx/Dockerfile" <<'EOF'
FROM debian:bookworm-slim
RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends postgresql-common \
    && sed -i 's/^#\?\s*create_main_cluster.*/create_main_cluster = false/' /etc/postgresql-common/createcluster.conf \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends postgresql-15 \
    && rm -rf /var/lib/apt/lists/* \
    && mkdir -p /var/lib/postgresql/data && chown postgres:postgres /var/lib/postgresql/data \
    && chmod 700 /var/lib/postgresql/data
ENV PATH=/usr/lib/postgresql/15/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    PGDATA=/var/lib/postgresql/data
COPY entrypoint.sh /usr/local/bin/docker-entrypoint.sh
RUN chmod 755 /usr/local/bin/docker-entrypoint.sh
VOLUME /var/lib/postgresql/data
STOPSIGNAL SIGINT
EXPOSE 5432
ENTRYPOINT ["docker-entrypoint.sh"]
EOF
    say "docker build -> postgres:16-bookworm (PostgreSQL 15 from Debian bookworm: not 16)"
    "$DOCKER" build -t postgres:16-bookworm \
        --label "org.opencontainers.image.description=offline stand-in for postgres:16-bookworm running Debian bookworm's PostgreSQL 15 (scripts/offline-images.sh)" \
        "$ctx"
    rm -rf "$ctx"
fi

"$DOCKER" image ls --format '{{.Repository}}:{{.Tag}}  {{.ID}}  {{.Size}}' |
    grep -E '^(debian:bookworm-slim|rust:1-bookworm|postgres:16-bookworm) '
say "done: the images docker-compose.yml and docker-compose.agents.yml need are local (tagged as the real ones: do not push them)"
